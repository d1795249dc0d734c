"""Export a trained model for TF Serving (SavedModel) or for reloading (.keras).

``savedmodel`` writes a TensorFlow SavedModel with Keras 3's ``model.export``:
its ``serve`` endpoint (and ``serving_default`` signature) takes uint8 images
``[batch, height, width, channels]``, prepared as :mod:`chute.fit.predict`
prepares them, and returns class probabilities (output ``output_0``); a
multi-label model returns its per-label sigmoid scores there, and the label
decision stays with the reader: a label is predicted where its score is at or
above its threshold in ``chute.json``'s ``thresholds`` (the single-label export
returns no class either, only scores). ``keras`` copies the bundle's
``model.keras``. Either way ``chute.json`` (class names, image spec, and a
multi-label model's thresholds) lands beside the model, last.

Example:
    >>> export("runs/kn", "serving/kn/1")  # doctest: +SKIP
    'serving/kn/1'
    >>> tf.saved_model.load("serving/kn/1").serve(uint8_batch)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os

from chute import checks
from chute.errors import ChuteError
from chute.fit import multilabel
from chute.format import storage
from chute.format.bundle import META_NAME, MODEL_NAME, Bundle, load_bundle
from chute.lazy import installed, tensorflow_builds, tf

log = logging.getLogger(__name__)

FORMATS = ("savedmodel", "keras")
INPUT_NAME = "images"
ENDPOINT = "serve"


def export(
    run_or_bundle: str | os.PathLike | Bundle,
    output: str | os.PathLike,
    *,
    format: str = "savedmodel",
    overwrite: bool = False,
) -> str:
    """Writes a trained model where serving or reloading expects it.

    Args:
        run_or_bundle: a training run folder, a bundle folder or its
            ``chute.json``, or a loaded :class:`~chute.format.bundle.Bundle`.
        output: the folder to write (local or a TF filesystem path).
        format: ``"savedmodel"`` (TF Serving) or ``"keras"`` (a bundle:
            ``model.keras`` plus ``chute.json``).
        overwrite: replace ``output`` when it holds an earlier chute export
            (its ``chute.json``); a folder of other files is never replaced.

    Returns:
        The output folder.

    Raises:
        ChuteError: a bad format, no bundle found, or an output folder that
            is not empty (unless it holds an earlier export and ``overwrite`` is
            set) or holds the bundle itself.

    Example:
        >>> export("runs/kn/bundle", "kn-keras", format="keras")  # doctest: +SKIP
        'kn-keras'
    """
    checks.one_of("format", format, FORMATS)
    storage.check_locations(run_or_bundle=run_or_bundle)
    output = storage.check_location(output, "output")
    if format == "savedmodel" and not installed("tensorflow"):  # before any work or writing
        raise ChuteError(
            "A SavedModel export (format='savedmodel', the default) is TensorFlow's format "
            f"and needs TensorFlow, not installed here: {tensorflow_builds()}; or pass "
            "format='keras' (--format keras), which needs no TensorFlow"
        )
    bundle = load_bundle(run_or_bundle)
    # Before any writing: a refused folder is left exactly as it was.
    _prepare_output(output, bundle.location, overwrite)
    if format == "keras":
        storage.copy(bundle.model_path, storage.join(output, MODEL_NAME))
        meta = bundle.to_json()
    else:
        _export_saved_model(bundle, output)
        meta = _saved_model_meta(bundle)
    # chute.json last, as in a bundle: its presence means the export is complete.
    storage.write_atomic(storage.join(output, META_NAME), meta.encode("utf-8"))
    log.info("exported %s as %s to %s", bundle.location, format, output)
    return output


def _export_saved_model(bundle: Bundle, output: str) -> None:
    if bundle.multi_label:
        multilabel.register_serializables()  # a bundle loaded with compile=True needs the loss
    # uint8 in: the served model rescales itself, as the bundle's model does.
    spec = tf.TensorSpec([None, *bundle.image.shape], tf.uint8, name=INPUT_NAME)
    # No device scope: the traced graph pins no device, so a server runs it
    # on whatever it has (saved variables carry no device either).
    bundle.model.export(output, format="tf_saved_model", input_signature=[spec], verbose=False)


def _saved_model_meta(bundle: Bundle) -> str:
    meaning = "class probabilities in label order"
    if bundle.multi_label:
        meaning = (
            "per-label scores (sigmoid) in label order; a label is predicted where its "
            "score is at or above its threshold in thresholds"
        )
    return bundle.to_json(
        export={
            "format": "savedmodel",
            "endpoint": ENDPOINT,
            "signature": "serving_default",
            "input": {"name": INPUT_NAME, "dtype": "uint8"},
            "output": {"name": "output_0", "meaning": meaning},
        },
    )


def _prepare_output(output: str, source: str, overwrite: bool) -> None:
    """Makes ``output`` an empty folder; never deletes the bundle being exported.

    An export replaces a whole folder, so ``overwrite`` applies only to a
    folder holding an earlier chute export (its ``chute.json``).
    """
    if _contains(output, source):
        raise ChuteError(
            f"`output` must not be the bundle's folder or a folder above it ({source!r}). "
            f"Received: output={output!r}"
        )
    if storage.check_output(output, "output") and storage.listdir(output):
        earlier = storage.exists(storage.join(output, META_NAME))
        if not overwrite and earlier:
            raise ChuteError(
                f"`output` holds an earlier chute export. Received: output={output!r}; pass "
                "overwrite=True (--overwrite) to replace it, or choose a new or empty folder"
            )
        if not earlier:  # with or without overwrite: it is refused, so never advised
            raise ChuteError(
                "`output` is a non-empty folder that holds no earlier chute export (no "
                "chute.json): choose a new or empty folder (overwrite=True, --overwrite, "
                f"only replaces an earlier chute export). Received: output={output!r}"
            )
        storage.rmtree(output)
    storage.makedirs(output)


def _contains(outer: str, inner: str) -> bool:
    """True when ``inner`` is ``outer`` or lies below it."""
    if storage.is_local(outer) and storage.is_local(inner):
        # realpath on both: a symlink must not hide that the output holds the bundle.
        outer = os.path.realpath(storage.local_path(outer))
        inner = os.path.realpath(storage.local_path(inner))
        return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)
    outer, inner = outer.rstrip("/"), inner.rstrip("/")
    return inner == outer or inner.startswith(outer + "/")
