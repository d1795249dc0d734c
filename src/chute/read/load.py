"""``chute.load``: a converted split as a dataset that outruns the accelerator.

``load`` checks its :class:`~chute.read.options.LoadOptions`, reads the manifest and
hands both to the engine the options name (:class:`~chute.read.engine.Engine`): the
tf.data engine (:mod:`chute.read.tf`) or the Grain engine (:mod:`chute.read.grain`),
which plans, builds, and says what it built as one :class:`LoadInfo` (``ds.chute``).
Under a ``tf.distribute`` strategy the tf.data engine runs once per worker
(``distribute_datasets_from_function``). The README's *chute.load* tells the whole story.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.lazy import installed, tensorflow_builds, tf
from chute.read import cache as shard_cache
from chute.read import share
from chute.read.engine import Engine, LoadInfo, info_of
from chute.read.mixture import Mixture, mixture_of
from chute.read.options import LoadOptions, resolve

__all__ = ["LoadInfo", "engine_named", "info_of", "load"]


def engine_named(name: str) -> Engine:
    """The engine ``LoadOptions.engine`` names (imported when first used: Grain's and
    TensorFlow's modules load only for the engine that reads)."""
    if name == "grain":
        from chute.read.grain.engine import GrainEngine

        return GrainEngine()
    from chute.read.tf.engine import TfEngine

    return TfEngine()


def load(
    path: str | os.PathLike | manifest_lib.Manifest | Sequence[str | os.PathLike],
    split: str = "train",
    options: LoadOptions | Mapping[str, Any] | None = None,
    *,
    input_context: Any = None,
    strategy: Any = None,
    version: int | Sequence[int | None] | None = None,
    weights: Sequence[float] | None = None,
    steps: int | None = None,
    **overrides: Any,
):
    """Reads a converted split as batches of ``(images, labels)`` with static shapes.

    Args:
        path: a directory written by ``chute convert`` (local, ``gs://``,
            ``ram://``), its ``manifest.json``, or the ``Manifest`` read from it.
        split: ``"train"``, ``"val"`` or ``"test"``.
        options: a :class:`~chute.read.options.LoadOptions` (or a mapping of its
            fields); default: every default.
        input_context: a ``tf.distribute.InputContext``: read this input
            pipeline's part (by shard when there are enough shards, else by record).
        strategy: a ``tf.distribute.Strategy``: return
            ``strategy.distribute_datasets_from_function`` over this function; or a
            ``keras.distribution.DataParallel`` (JAX, what ``chute.auto_strategy()``
            gives there): batches of ``batch_size`` per device for this process's
            devices, which Keras's ``fit`` lays out over them.
        version: read the dataset as it was at this version (``chute convert --append``
            adds one; ``chute inspect`` lists them); default: the latest. A mixture:
            a version (or None) per dataset.
        weights: with a list of datasets as ``path``, each one's share of every
            training batch (positive numbers, made to sum to 1; default: equal). The
            datasets are read as one: their classes joined by name (the first
            dataset's keep their labels; ``ds.chute.class_names`` gives them all),
            images brought to the first one's size and channels, each batch
            composed in these proportions (exactly, where ``weight * batch_size``
            is whole), each dataset's own draws a new shuffle every pass over it.
            ``ds.chute.mixture`` says what an epoch reads of each.
        steps: a mixture's batches in an epoch; default: as many as show the first
            dataset's images once.
        **overrides: ``LoadOptions`` fields replacing those of ``options``
            (``batch_size=256``, ``augment="crop,flip"``, ``cache=None``, ...).

    Returns:
        A ``tf.data.Dataset`` (or distributed dataset) of ``(images, labels)``
        (``(images, labels, weights)`` with ``pad_final_batch``; images alone
        with ``label_mode=None``), with its :class:`LoadInfo` as ``ds.chute``.
        ``len(ds)`` is the exact number of batches of an epoch (unless
        ``skip_corrupt`` or ``repeat``); of a distributed dataset, its global
        batches (also its ``cardinality``, which Keras's ``fit`` counts).

    Raises:
        ChuteError: a bad option (named), an unknown one, a path that is not a
            chute dataset, or a shard that exists but cannot be read (unless
            ``skip_corrupt``).
        tf.errors.InvalidArgumentError: while iterating, naming the shard, when
            a shard is corrupt, truncated or missing, or an image does not
            match the manifest (unless ``skip_corrupt``).

    Example:
        >>> train = chute.load("./kn-shards", "train", batch_size=256)  # doctest: +SKIP
        >>> model.fit(train, validation_data=chute.load("./kn-shards", "val"))  # doctest: +SKIP
        >>> train.chute.steps, train.chute.global_batch_size  # doctest: +SKIP
        (101, 256)
    """
    options = resolve(options, overrides)  # every value checked before any work
    if isinstance(path, (list, tuple, Mixture)):
        mixture = path
        if not isinstance(path, Mixture):
            mixture = mixture_of(path, weights, versions=version, steps=steps)
        return _mixed(mixture, split, options, input_context=input_context, strategy=strategy)
    if weights is not None or steps is not None:
        raise ChuteError(
            "`weights` and `steps` mix several datasets: pass a list of them as `path`. "
            f"Received: path={path!r}, weights={weights!r}, steps={steps!r}"
        )
    manifest = manifest_lib.load(path)
    if version is not None:
        manifest = manifest.at_version(version)
    _check_engine_reaches(manifest.location, options)
    engine = engine_named(options.engine)
    if _keras_distribution(strategy):
        return _data_parallel(manifest, split, options, strategy)
    if strategy is not None and options.engine == "tf":
        return _distributed(manifest, split, options, strategy)
    plan = engine.plan(manifest, split, options, input_context=input_context, strategy=strategy)
    dataset, info = engine.build(plan, manifest, options)
    dataset.chute = info
    return dataset


def _mixed(mixture: Mixture, split: str, options: LoadOptions, *, input_context, strategy):
    """``load`` of several datasets as one (see :mod:`chute.read.mixture`)."""
    for manifest in mixture.manifests:
        _check_engine_reaches(manifest.location, options)
    if _keras_distribution(strategy):
        return _data_parallel(mixture, split, options, strategy)
    if strategy is not None and options.engine == "tf":
        return _distributed(mixture, split, options, strategy)
    engine = engine_named(options.engine)
    dataset, info = engine.mixed(
        mixture, split, options, input_context=input_context, strategy=strategy
    )
    dataset.chute = info
    return dataset


def _check_engine_reaches(location: str, options: LoadOptions) -> None:
    """tf.data opens shards through TensorFlow's filesystems, which have no ``s3://``: say
    so before any work (unless a shard cache makes them local copies first), and name
    the engine that reads through chute's storage layer."""
    if options.engine == "tf" and not installed("tensorflow"):
        raise ChuteError(
            "The tf.data engine (engine='tf', the default) needs TensorFlow, not installed "
            "here. Pass engine='grain' (--engine grain), which needs none, or install it: "
            f"{tensorflow_builds()}"
        )
    if options.engine == "tf" and not storage.tensorflow_opens(location):
        if shard_cache.applies(location, options):
            return
        raise ChuteError(
            f"The tf.data engine (engine='tf', the default) cannot read {location!r}: "
            "TensorFlow has no filesystem for it. Pass engine='grain' (--engine grain), "
            "or cache_dir=FOLDER (--cache-dir) to read local copies of its shards, "
            "or copy the dataset to a local folder"
        )


def _distributed(manifest, split: str, options: LoadOptions, strategy):
    """``strategy.distribute_datasets_from_function`` over ``load``, one input pipeline per
    worker, with the :class:`LoadInfo` of the whole: its steps are global batches."""
    built: list[tuple[Any, LoadInfo]] = []

    def dataset_fn(input_context):
        dataset = load(manifest, split, options, input_context=input_context)
        built.append((input_context, info_of(dataset)))
        return dataset

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    # The strategies chute runs under build the local pipelines at once. A global batch
    # takes a batch from each replica an input pipeline feeds.
    context, first = built[0]
    feeds = share.Share.of(context).feeds
    distributed.chute = dataclasses.replace(
        first,
        num_examples=(
            manifest.num_examples(split)
            if first.mixture is None
            else sum(info.num_examples for _, info in built)
        ),
        steps=share.global_steps(first.steps, feeds, training=first.training),
        counters=tuple(counters for _, info in built for counters in info.counters),
    )
    distributed.__class__ = _sized(type(distributed))
    return distributed


def _keras_distribution(strategy: Any) -> bool:
    """Whether ``strategy`` is a ``keras.distribution.DataParallel`` (Keras imported: a
    user holding one has imported it)."""
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(strategy, keras.distribution.DataParallel)


def _data_parallel(manifest, split: str, options: LoadOptions, distribution):
    """Under Keras's ``DataParallel`` (JAX): one pipeline per process, of the batches of
    its devices; ``batch_size`` is per device, as under a ``tf.distribute`` strategy."""
    import jax

    replicas = int(distribution.device_mesh.devices.size)
    processes = jax.process_count()
    context = None
    if processes > 1 and not getattr(distribution, "auto_shard_dataset", True):
        # Each process feeds its own devices; Keras assembles the global batch.
        context = tf.distribute.InputContext(
            num_input_pipelines=processes,
            input_pipeline_id=jax.process_index(),
            num_replicas_in_sync=processes,
        )
        feeds = replicas // processes
    else:
        feeds = replicas  # global batches: Keras splits each (and shards them by process)
    dataset = load(
        manifest, split, options, input_context=context, batch_size=options.batch_size * feeds
    )
    dataset.chute = dataclasses.replace(
        dataset.chute,
        per_replica_batch_size=options.batch_size,
        global_batch_size=options.batch_size * replicas,
    )
    return dataset


_SIZED: dict[type, type] = {}


def _sized(distributed_type: type) -> type:
    """A subclass of the strategy's distributed dataset type that has ``len()`` and a
    ``cardinality`` in global steps (``ds.chute.steps``), as ``len(ds)`` of a
    ``tf.data.Dataset``.

    TensorFlow's distributed datasets have no ``len()``, and their ``cardinality`` is one
    input pipeline's batches: under MirroredStrategy each step takes a batch per
    replica, so Keras's ``fit`` counted twice the steps over 2 replicas and warned
    "Your input ran out of data". A subclass of the very type (not a wrapper) keeps
    everything else as it is: iteration, ``element_spec``, and Keras's check of what
    a ``tf.distribute`` dataset is.
    """
    sized = _SIZED.get(distributed_type)
    if sized is None:

        def __len__(self) -> int:
            steps = self.cardinality
            if steps < 0:  # -1 infinite (repeat), -2 unknown (skip_corrupt): as tf.data says
                raise TypeError(
                    "The dataset is infinite." if steps == -1 else "The dataset length is unknown."
                )
            return int(steps)

        def cardinality(self):
            local = super(sized, self).cardinality  # one input pipeline's batches
            return local if local < 0 else type(local)(self.chute.steps)

        sized = type(
            distributed_type.__name__,
            (distributed_type,),
            {
                "__len__": __len__,
                "cardinality": property(cardinality),
                "__module__": __name__,
                "__doc__": _sized.__doc__,
            },
        )
        _SIZED[distributed_type] = sized
    return sized
