"""The model bundle: a trained model plus everything ``predict`` needs to use it.

A bundle is a folder holding ``model.keras`` and ``chute.json``. The JSON file
(format ``chute.bundle``, version 2) holds the class names in label order, the
dataset's :class:`~chute.format.spec.ImageSpec` (how ``convert`` stored the
training images: size or shorter side, channels, encoding, resize mode,
interpolation), the ``input`` the model takes (height, width) with the
``crop_fraction`` of evaluation's centre crop, free-form ``info`` (who
trained it, how well), and for a multi-label model its per-label ``thresholds``
(tuned on validation: a label is predicted when its score reaches its threshold;
their presence is what marks the model multi-label, and makes the file version 3),
and ``"tta": "flip"`` where the model was trained on flipped images: ``evaluate``
and ``predict`` then average the probabilities of each image and its mirror
(:meth:`Bundle.scores`).
``predict`` prepares a file as ``convert`` did, then as
evaluation did, so it gets the pixels its record gets. ``chute.json`` is written
last, so its presence means the model file is complete. Paths may be local or
on any TF filesystem (``gs://``, ``ram://``).

Example:
    >>> save_bundle(model, "runs/kn/bundle", class_names=names, image=spec)  # doctest: +SKIP
    >>> load_bundle("runs/kn").class_names[:3]  # doctest: +SKIP
    ['a', 'aa', 'i']
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.format import storage
from chute.format.spec import MAX_SIDE, ImageSpec
from chute.lazy import keras

log = logging.getLogger(__name__)

FORMAT = "chute.bundle"
VERSION = 3  # 3: "thresholds" of a multi-label model (written as 2 without them);
# 2: the dataset's "image" spec and the model's "input" (1: size, preprocessing)
MODEL_NAME = "model.keras"
META_NAME = "chute.json"
RUN_SUBDIR = "bundle"  # where a training run keeps its bundle
TTA = (None, "flip")  # test-time augmentations a bundle may ask for


@dataclasses.dataclass
class Bundle:
    """A loaded model bundle. The model itself is read on first use of :attr:`model`.

    Attributes:
        class_names: class names in label order (index ``i`` is label ``i``).
        image: how the training images were stored (how to prepare a new one).
        input_size: ``(height, width)`` of the model's input.
        crop_fraction: evaluation's centre crop (1: the whole image).
        thresholds: a multi-label model's per-label decision thresholds (sigmoid
            scores at or above are predicted); None for a single-label (softmax) model.
        info: free-form facts saved with the model (accuracy, run options, ...).
        location: the bundle folder.
        tta: ``"flip"``: test-time augmentation, each image's probabilities
            averaged with its horizontal mirror's (see :meth:`scores`); None: the
            image alone.

    Example:
        >>> bundle = load_bundle("runs/kn/bundle")  # doctest: +SKIP
        >>> bundle.input_size, bundle.model.output_shape  # doctest: +SKIP
        ((75, 75), (None, 657))
    """

    class_names: list[str]
    image: ImageSpec
    info: dict[str, Any]
    location: str
    input_size: tuple[int, int] | None = None
    crop_fraction: float = 1.0
    compile: bool = False
    thresholds: list[float] | None = None
    tta: str | None = None
    _model: Any = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.input_size is None:
            if not self.image.fixed_size:
                raise ChuteError(
                    "`input_size` must be given for images stored at their own sizes. "
                    f"Received: input_size=None, image={self.image!r}"
                )
            self.input_size = self.image.size
        self.input_size = (int(self.input_size[0]), int(self.input_size[1]))
        if self.thresholds is not None:
            self.thresholds = _thresholds(self.thresholds, len(self.class_names))
        if self.tta not in TTA:
            raise checks.bad_value("tta", self.tta, "None or 'flip'")

    def scores(self, images: Any, *, tta: bool | None = None) -> Any:
        """The model's probabilities (a multi-label model's scores) for a batch of uint8
        images as a NumPy float32 array; with the bundle's ``tta="flip"``, the mean
        of the images' and their horizontal mirrors' (a flip-symmetric image scores
        as without it).

        Args:
            images: ``(batch, height, width, channels)`` uint8 pixels.
            tta: False: the images alone, whatever the bundle says; None: as the
                bundle says.

        Example:
            >>> load_bundle("runs/kn").scores(pixels).shape  # doctest: +SKIP
            (32, 657)
        """
        import numpy as np

        images = np.asarray(images)
        # NumPy in and out: the model may run on JAX or torch (on a GPU), not TensorFlow
        out = keras.ops.convert_to_numpy(self.model(images, training=False))
        out = np.asarray(out, np.float32)
        if self.tta == "flip" and tta is not False:
            mirrored = np.ascontiguousarray(images[:, :, ::-1])
            other = keras.ops.convert_to_numpy(self.model(mirrored, training=False))
            out = (out + np.asarray(other, np.float32)) / 2
        return out

    @property
    def multi_label(self) -> bool:
        """Whether the model scores each label on its own (sigmoid), with thresholds."""
        return self.thresholds is not None

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(height, width, channels)`` of the model's input."""
        return (*self.input_size, self.image.channels)

    @property
    def num_classes(self) -> int:
        """How many classes the model tells apart."""
        return len(self.class_names)

    @property
    def model_path(self) -> str:
        """The path of ``model.keras``."""
        return storage.join(self.location, MODEL_NAME)

    @property
    def model(self) -> Any:
        """The Keras model, loaded (in Keras safe mode) on first access.

        Raises:
            ChuteError: ``model.keras`` is missing or cannot be loaded.
        """
        # Loaded lazily: reading the class names must not import Keras or read a large model.
        if self._model is None:
            self._model = load_model(self.model_path, compile=self.compile)
        return self._model

    def to_json(self, **extra: Any) -> str:
        """The ``chute.json`` text of this bundle, with ``extra`` top-level keys."""
        body = {
            "class_names": self.class_names,
            "image": self.image.to_dict(),
            "input": {
                "height": self.input_size[0],
                "width": self.input_size[1],
                "crop_fraction": self.crop_fraction,
            },
            "info": self.info,
        }
        if self.thresholds is not None:
            extra = {"thresholds": self.thresholds, **extra}
        if self.tta is not None:
            extra = {"tta": self.tta, **extra}
        return _meta_json(body, **extra)


def save_bundle(
    model: Any,
    directory: str | os.PathLike,
    *,
    class_names: list[str],
    image: ImageSpec,
    crop_fraction: float = 1.0,
    info: dict[str, Any] | None = None,
    thresholds: list[float] | None = None,
    tta: str | None = None,
) -> Bundle:
    """Writes ``model.keras`` and then ``chute.json`` into ``directory``.

    Args:
        model: a Keras model whose output has one unit per class.
        directory: the bundle folder (created; local or a TF filesystem path).
        class_names: class names in label order.
        image: the dataset's image spec.
        crop_fraction: evaluation's centre crop, which ``predict`` repeats.
        info: JSON-serialisable facts to keep with the model.
        thresholds: a multi-label model's per-label thresholds (one per class name).
        tta: ``"flip"`` where the model learned from flipped images: evaluation and
            prediction average each image's and its mirror's probabilities.

    The model's input size is read off the model.

    Returns:
        The saved :class:`Bundle`, holding ``model``.

    Raises:
        ChuteError: an argument is invalid or does not match the model.

    Example:
        >>> spec = ImageSpec(height=8, width=8, channels=1)
        >>> save_bundle(model, "ram://b", class_names=["a", "b"], image=spec)  # doctest: +SKIP
    """
    directory = os.fspath(directory)
    if not isinstance(image, ImageSpec):
        raise ChuteError(f"`image` must be an ImageSpec. Received: image={image!r}")
    shape = _input_shape(model)
    input_size = image.size
    # A model that accepts any size (None) keeps the images' stored size as its input.
    if shape is not None and None not in shape[1:3]:
        input_size = (int(shape[1]), int(shape[2]))
    bundle = Bundle(
        class_names=class_names,
        image=image,
        info={} if info is None else info,
        location=directory,
        input_size=input_size,
        crop_fraction=crop_fraction,
        thresholds=thresholds,
        tta=tta,
        _model=model,
    )
    # Validated before anything is written: a bad argument leaves the folder as it was.
    text = bundle.to_json()
    _check_model(model, len(class_names), bundle.input_shape)
    storage.makedirs(directory)
    meta = storage.join(directory, META_NAME)
    storage.remove_if_exists(meta)  # until the new chute.json lands, the folder is not a bundle
    _save_model(model, storage.join(directory, MODEL_NAME))
    storage.write_atomic(meta, text.encode("utf-8"))
    log.info("saved model bundle to %s (%d classes)", directory, len(class_names))
    return bundle


def load_bundle(path: str | os.PathLike | Bundle, *, compile: bool = False) -> Bundle:
    """Reads a model bundle's ``chute.json``; the model loads on first use.

    Args:
        path: the bundle folder, its ``chute.json`` or ``model.keras``, or a
            training run folder holding ``bundle/``; a loaded :class:`Bundle`
            is returned as it is.
        compile: restore the training configuration (optimizer, loss,
            metrics) too; prediction does not need it.

    Raises:
        ChuteError: there is no bundle at ``path``, or its ``chute.json`` is invalid.

    Example:
        >>> load_bundle("runs/kn").num_classes  # doctest: +SKIP
        657
    """
    if isinstance(path, Bundle):
        return path
    directory = _find(storage.check_location(path, "path"))
    meta = storage.join(directory, META_NAME)
    body = _parse_meta(storage.read_bytes(meta), meta)
    # An export (SavedModel) shares the chute.json name: refused with where to load it instead.
    if "export" in body:
        kind = body["export"].get("format") if isinstance(body["export"], dict) else None
        if kind != "keras":
            raise ChuteError(
                f"{directory!r} is a {kind} export, not a model bundle: load it with "
                "tf.saved_model.load (or serve it with TF Serving). "
                f"Received: path={os.fspath(path)!r}"
            )
    if not storage.exists(storage.join(directory, MODEL_NAME)):
        raise ChuteError(
            f"The bundle {directory!r} has {META_NAME} but no {MODEL_NAME}. "
            f"Received: path={os.fspath(path)!r}"
        )
    return Bundle(
        class_names=body["class_names"],
        image=body["image"],
        info=body["info"],
        location=directory,
        input_size=(body["input"]["height"], body["input"]["width"]),
        crop_fraction=body["input"]["crop_fraction"],
        compile=compile,
        thresholds=body.get("thresholds"),
        tta=body.get("tta"),
    )


def _thresholds(values: Any, num_classes: int) -> list[float]:
    """Validated per-label thresholds: one number in [0, 1] per class."""
    if (
        not isinstance(values, list | tuple)
        or len(values) != num_classes
        or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= float(v) <= 1.0
            for v in values
        )
    ):
        raise ChuteError(
            f"`thresholds` must be {num_classes} numbers in [0, 1], one per class name. "
            f"Received: thresholds={values!r}"
        )
    return [float(v) for v in values]


def _find(path: str) -> str:
    """The bundle folder for any of the paths ``load_bundle`` accepts."""
    allowed = (
        f"a model bundle folder (holding {META_NAME} and {MODEL_NAME}), its {META_NAME}, "
        f"or a training run folder holding {RUN_SUBDIR}/"
    )
    if not storage.exists(path):
        raise ChuteError(f"`path` does not exist; it must be {allowed}. Received: path={path!r}")
    if not storage.isdir(path):
        if storage.basename(path) in (META_NAME, MODEL_NAME):
            path = storage.dirname(path)
        else:
            raise ChuteError(f"`path` must be {allowed}. Received: path={path!r}")
    # The folder itself first, then a training run's bundle/ inside it.
    for candidate in (path, storage.join(path, RUN_SUBDIR)):
        if storage.exists(storage.join(candidate, META_NAME)):
            return candidate
    hint = ""
    if storage.exists(storage.join(path, MODEL_NAME)):
        hint = f" (it holds {MODEL_NAME} but no {META_NAME}: the save did not finish)"
    raise ChuteError(
        f"No {META_NAME} in {path!r} nor in its {RUN_SUBDIR}/ folder{hint}; `path` must be "
        f"{allowed}. Received: path={path!r}"
    )


def _meta_json(body: dict[str, Any], **extra: Any) -> str:
    """Validates the bundle's description (``class_names``, ``image``, ``input``, ``info``)
    and returns its JSON text."""
    class_names, info, given = body["class_names"], body["info"], body["input"]
    if (
        not isinstance(class_names, list | tuple)
        or not class_names
        or not all(isinstance(c, str) and c for c in class_names)
    ):
        raise ChuteError(
            "`class_names` must be a non-empty list of non-empty strings. "
            f"Received: class_names={class_names!r}"
        )
    # A repeated name would make two labels read as one class.
    if len(set(class_names)) != len(class_names):
        duplicates = sorted({c for c in class_names if list(class_names).count(c) > 1})
        raise ChuteError(f"`class_names` must be unique. Received duplicates: {duplicates!r}")
    if not isinstance(given, dict):
        raise ChuteError(f"`input` must be a dict. Received: input={given!r}")
    for key in ("height", "width"):
        checks.int_in(f"input['{key}']", given.get(key), 1, MAX_SIDE)
    fraction = checks.number_in("crop_fraction", given.get("crop_fraction"), 0.0, 1.0)
    if fraction == 0:
        raise checks.bad_value("crop_fraction", fraction, "a number in (0, 1]")
    if not isinstance(info, dict):
        raise ChuteError(f"`info` must be a dict. Received: info={info!r}")
    body = {
        "format": FORMAT,
        "version": VERSION if "thresholds" in extra else 2,
        "class_names": list(class_names),
        "image": body["image"],
        "input": given,
        "info": info,
        **extra,
    }
    try:
        # allow_nan=False: NaN is not JSON, and other readers refuse it.
        return json.dumps(body, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    except (TypeError, ValueError) as error:
        raise ChuteError(
            f"`info` must be JSON-serialisable: {error}. Received: info={info!r}"
        ) from None


def _parse_meta(raw: bytes, where: str) -> dict[str, Any]:
    """Parses and checks ``chute.json``."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except ValueError as error:
        raise ChuteError(f"{where} is not valid JSON: {error}") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ChuteError(f"{where} is not a chute model bundle (format {FORMAT!r} expected)")
    version = body.get("version")
    # bool is an int in Python: true would otherwise pass as version 1.
    if isinstance(version, bool) or not isinstance(version, int):
        raise ChuteError(f"{where} has no valid version. Received: version={version!r}")
    if version > VERSION:
        raise ChuteError(
            f"{where} was written by a newer chute (bundle version {version}, this chute "
            f"reads up to {VERSION}); upgrade chute"
        )
    image = body.get("image")
    if version < 2 and isinstance(image, dict):  # the preprocessing and input were implied
        body["input"] = {
            "height": image.get("height"),
            "width": image.get("width"),
            "crop_fraction": 1.0,
        }
        image = {**image, **(body.get("preprocessing") or {})}
    body.setdefault("info", {})
    try:
        body["image"] = ImageSpec.from_dict(image)
        _meta_json({**body, "image": body["image"].to_dict(), "input": body.get("input")})
    except ChuteError as error:
        raise ChuteError(f"{where} is not a valid chute model bundle: {error}") from None
    return body


def _input_shape(model: Any) -> tuple | None:
    try:
        shape = tuple(model.inputs[0].shape)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    # Only (batch, height, width, channels) says the image size; anything else is not checked.
    return shape if len(shape) == 4 else None


def _check_model(model: Any, num_classes: int, expected: tuple[int, int, int]) -> None:
    """Rejects a model whose input or output does not match the description."""
    shape = _input_shape(model)
    if shape is not None and any(
        got is not None and got != want for got, want in zip(shape[1:], expected, strict=True)
    ):
        raise ChuteError(
            f"`image` must match the model's input shape {shape}. Received: input shape "
            f"{expected} (the images' channels and the model's input size)"
        )
    try:
        units = model.outputs[0].shape[-1]
    # A model whose output shape is unknown until called cannot be checked here.
    except (AttributeError, IndexError, TypeError, ValueError):
        return
    if units is not None and units != num_classes:
        raise ChuteError(
            f"`class_names` must have one name per model output ({units}). "
            f"Received: {num_classes} class names"
        )


def _save_model(model: Any, path: str) -> None:
    """Saves under a temporary name, then renames: a reader never sees half a file."""
    if storage.is_local(path):
        local = storage.local_path(path)
        # In the same folder, so the rename is atomic; the name must still end in .keras for Keras.
        partial = os.path.join(os.path.dirname(local), ".partial." + MODEL_NAME)
        model.save(partial)
        os.replace(partial, local)
        return
    with tempfile.TemporaryDirectory(prefix="chute-bundle-") as tmp:
        local = os.path.join(tmp, MODEL_NAME)
        model.save(local)
        # Copied under .tmp, then renamed: on a bucket too, no reader sees half a file.
        storage.copy(local, path + ".tmp")
    storage.rename(path + ".tmp", path)


def load_model(path: str, *, compile: bool = False) -> Any:
    """Loads a ``.keras`` file in safe mode; a non-local file is copied to a local one."""
    if not storage.exists(path):
        raise ChuteError(f"The model file {path!r} does not exist")
    tmp = None
    try:
        if storage.is_local(path):
            local = storage.local_path(path)
        else:
            tmp = tempfile.mkdtemp(prefix="chute-bundle-")
            local = os.path.join(tmp, MODEL_NAME)
            storage.copy(path, local)
        try:
            return keras.models.load_model(local, compile=compile, safe_mode=True)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ChuteError(f"Cannot load the model {path!r}: {error}") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
