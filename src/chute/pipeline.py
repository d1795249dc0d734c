"""``chute.load``: a converted split as a ``tf.data.Dataset`` that outruns the accelerator.

The order of the pipeline, and why:

1. **Shard order reshuffled every epoch** (training): files are the unit of
   parallel reading; a fresh order per epoch varies what is read together.
2. **Parallel interleave** of up to ``max(4, cores)`` shards at a time (up to
   16 read by parallel calls), ``deterministic=False`` unless a seed,
   evaluation or sharding by record asks for a fixed order (then 16 at a time
   on any machine): a slow file never stalls the rest. A missing shard reads
   as empty (and is reported as below) rather than being retried; one that
   exists but cannot be read is found (opened) when the dataset is built.
3. **Parse and decode where the records are read**: each shard is read in
   blocks of 128-256 records (in training a new block size per shard and
   epoch, so block boundaries move); one function call per block parses it
   with one vectorised ``parse_example``, checks it (record count at the
   shard's end, image length or signature) and, for raw images, decodes it
   with one ``decode_raw``. PNG/JPEG images are then decoded one per call, a
   call per core. From here on the data are dense pixels: regrouping them is
   a memory copy, not work per record. (Per-record and per-small-block steps
   on serialized records cost more than parsing them: see benchmarks/README.md.)
4. **Cache** (``cache="auto"``): when the decoded split fits the memory budget
   the decoded blocks are kept in RAM after the first epoch, so later epochs
   skip the files. Cached blocks come back in the first epoch's order, so in
   training they go through a shuffle buffer of about a window's worth of
   blocks (so does a fixed read order, when input pipelines share records),
   with a prefetch after it so that the reader still starts with the iterator.
5. **Shuffle** (training): blocks are regrouped into windows of
   ``shuffle_buffer`` records (at most 128 MB of pixels), which hold blocks
   from several shards; each window is permuted with one gather and cut into
   full batches. Shards were written in random order, so each block is
   already a random sample. Evaluation regroups blocks into batches in a
   fixed order instead.
6. Per batch: resize (only if another size is asked for), cast, **augment**
   (training only, batched, seeded), labels; then **prefetch**, started when
   the iterator is made (``experimental_warm_start``), so reading the first
   shards overlaps with the rest of setting up. Every stage is sized here, so
   tf.data's autotuning model is off (it cost ~3% of a pass).

Building the pipeline is part of every first epoch, so it is kept lean: no
AutoGraph, plain ``Assert`` ops, the three tf.data constructors of
``chute.lean`` that skip the public wrappers' extra functions, and the two
largest functions traced once per process, then shared by every dataset built
after: the shard reader per kind of image (not with ``skip_corrupt``), the
window cutter per batch size, image shape and labels. A
pipeline whose options (its ``_Plan``) were built before is built by one call
of a traced function (~2.5 ms instead of ~25-35: TensorFlow instantiates
every eagerly created dataset op anew); the shards, their counts and the epoch's
steps are its arguments. Datasets with their own state (``skip_corrupt``
counters, augmentation layers), and those without a seed under a global
``tf.random.set_seed`` (TensorFlow gives each one new op seeds), are always
built eagerly.

Training batches drop the remainder (static shapes for TPU/XLA); evaluation
(``training=False``) sees every example exactly once: in order, no shuffle,
with a final smaller batch, or, with ``pad_final_batch=True``, a full batch
padded with zeros and a third element of per-example weights (1 real, 0 pad)
that Keras's ``evaluate`` uses as ``sample_weight``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import numbers
import os
from typing import Any

from chute import lean, records, storage
from chute import manifest as manifest_lib
from chute.errors import ChuteError
from chute.options import bad_value, one_of, parse_image_size
from chute.workers import default_workers

log = logging.getLogger(__name__)

LABEL_MODES = ("int", "categorical", "binary", None)
DTYPES = ("uint8", "float32", "bfloat16")
_BLOCK = 256  # records read, checked and decoded together from one shard
_CYCLE = 16  # shards read at a time when the order must be reproducible
_WINDOW_BYTES = 128 << 20  # the most decoded pixels one shuffle window holds
_COUNTED = {"corrupt": 1, "started": 1, "decoded": -1}  # skipped = corrupt + started - decoded


def _plain(tf, function):
    """``function`` traced as written: it has no Python control flow on tensors,
    and skipping AutoGraph's source conversion makes building a dataset faster."""
    return tf.autograph.experimental.do_not_convert(function)


def _global_seed(tf) -> int | None:
    """The seed of ``tf.random.set_seed``, read where TensorFlow reads it: from
    the eager context when executing eagerly, else from the graph."""
    if tf.executing_eagerly():
        try:
            from tensorflow.python.eager import context
        except ImportError:
            context = None
        if context is not None and callable(getattr(context, "global_seed", None)):
            return context.global_seed()
    return tf.compat.v1.get_default_graph().seed


def _memory_budget() -> int:
    """A quarter of physical memory: what ``cache="auto"`` may keep decoded."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return 2 << 30


def load(
    path: str | os.PathLike | manifest_lib.Manifest,
    split: str = "train",
    *,
    batch_size: int = 128,
    training: bool | None = None,
    image_size: Any = None,
    dtype: str = "uint8",
    label_mode: str | None = "int",
    augment: list | tuple | None = None,
    cache: str | None = "auto",
    seed: int | None = None,
    shuffle_buffer: int = 8192,
    pad_final_batch: bool = False,
    repeat: bool = False,
    skip_corrupt: bool = False,
    input_context: Any = None,
    strategy: Any = None,
):
    """Reads a converted split as batches of ``(images, labels)`` with static shapes.

    Args:
        path: a directory written by ``chute convert`` (local, ``gs://``,
            ``ram://``), its ``manifest.json``, or the ``Manifest`` read from it.
        split: ``"train"``, ``"val"`` or ``"test"``.
        batch_size: examples per batch **per replica**; the global batch is
            ``batch_size * replicas`` (see ``input_context`` and ``strategy``).
        training: shuffle, drop the remainder and augment; default: ``split == "train"``.
        image_size: ``(height, width)`` to resize to; default: as stored.
        dtype: ``"uint8"`` (0-255, the default: models rescale inside), or
            ``"float32"``/``"bfloat16"`` scaled to [0, 1].
        label_mode: ``"int"``, ``"categorical"`` (one-hot), ``"binary"`` (two
            classes, float 0/1) or ``None`` (images only), as in Keras.
        augment: names from ``flip``, ``rotation``, ``zoom``, ``translation``,
            ``contrast``, ``brightness``, or Keras layers; training only.
        cache: ``"auto"`` (keep decoded images in RAM when the split fits a
            quarter of physical memory), ``"memory"``, ``"disk:PATH"`` or ``None``.
        seed: makes shuffling, interleave order and augmentation reproducible
            (with a seed, augmentation runs one batch at a time).
        shuffle_buffer: records mixed together (training): batches are drawn
            from windows of this many records read from several shards, at
            most 128 MB of pixels each (about four windows are held at once).
        pad_final_batch: evaluation only: pad the last batch to full size and
            yield ``(images, labels, weights)`` with weight 0 on the padding.
        repeat: repeat forever (training); ``len()`` is then infinite.
        skip_corrupt: instead of raising, skip what is damaged and count it in
            ``ds.corrupt_count()`` (exact after a full pass): a missing shard,
            the rest of a shard after a record that fails its CRC or is
            truncated, images of the wrong length or that do not decode. A
            record with a valid CRC that is not a ``tf.train.Example`` still
            raises. ``len(ds)`` is then unknown. Input pipelines that share
            records (fewer shards than pipelines) each count every shard's.
        input_context: a ``tf.distribute.InputContext``: read this input
            pipeline's part (by shard when there are enough shards, else by record).
        strategy: a ``tf.distribute.Strategy``: return
            ``strategy.distribute_datasets_from_function`` over this function.

    Returns:
        A ``tf.data.Dataset`` with ``class_names``, ``num_examples``,
        ``per_replica_batch_size``, ``global_batch_size`` and ``corrupt_count()``;
        ``len(ds)`` is the exact number of batches of an epoch (unless
        ``skip_corrupt`` or ``repeat``).

    Raises:
        ChuteError: for a bad argument, a path that is not a chute dataset, or
            a shard that exists but cannot be read (unless ``skip_corrupt``).
        tf.errors.InvalidArgumentError: while iterating, naming the shard, when
            a shard is corrupt, truncated or missing, or an image does not
            match the manifest (unless ``skip_corrupt``).

    Example:
        >>> train = chute.load("./kn-shards", "train", batch_size=256)  # doctest: +SKIP
        >>> model.fit(train, validation_data=chute.load("./kn-shards", "val"))  # doctest: +SKIP
    """
    if strategy is not None:
        return _distributed(path, split, strategy, locals())
    import tensorflow as tf

    manifest = manifest_lib.load(path)
    spec = manifest.image
    training = (split == "train") if training is None else bool(training)
    _check_args(batch_size, dtype, label_mode, shuffle_buffer, manifest, training, pad_final_batch)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise bad_value("seed", seed, "an integer or None")
    seed = None if seed is None else int(seed)
    size = parse_image_size(image_size)
    if size is None and spec["height"] is None:
        raise ChuteError(
            f"{manifest.location} stores images at their own sizes; pass image_size=(H, W). "
            "Received: image_size=None"
        )
    height, width = size or (spec["height"], spec["width"])
    channels, encoding = spec["channels"], spec["encoding"]
    augmenter = _augmenter(augment, seed)  # checked in evaluation too
    if not training:
        augmenter = None  # never applied in evaluation
    cache_target = _cache_target(cache, manifest, split, spec)

    files = manifest.shard_paths(split)
    counts = [s["num_records"] for s in manifest.splits[split]["shards"]]
    pipelines, index = 1, 0
    if input_context is not None:
        pipelines, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    by_file = pipelines > 1 and len(files) >= pipelines
    if by_file:  # enough shards: each input pipeline reads its own files
        files, counts = files[index::pipelines], counts[index::pipelines]
    num_examples = pipeline_sizes(manifest, split, pipelines)[index]
    if num_examples == 0:
        raise ChuteError(f"split {split!r} of {manifest.location} has no examples to read here")

    record_sharded = pipelines > 1 and not by_file
    resize = encoding == "raw" and (spec["height"], spec["width"]) != (height, width)
    window = None
    if training:  # a window holds decoded uint8 pixels: as stored (raw) or as decoded
        per_record = channels * (
            height * width if encoding != "raw" else spec["height"] * spec["width"]
        )
        window = min(shuffle_buffer, max(batch_size, _WINDOW_BYTES // per_record))
        if window < shuffle_buffer:
            log.info("shuffle window: %d records (%d MB of pixels)", window, _WINDOW_BYTES >> 20)
    plan = _Plan(
        stored=(encoding, spec["height"], spec["width"], channels),
        shape=(height, width, channels),
        num_classes=manifest.num_classes,
        training=training,
        # Evaluation, a seed, or sharding by record (every pipeline must see one
        # order) fix the order; otherwise a slow file must not hold the others up.
        deterministic=not training or seed is not None or record_sharded,
        # a new shard order and new block boundaries each epoch
        moving=training and not record_sharded,
        shared_records=(pipelines, index) if record_sharded else None,
        cores=default_workers(),
        cache=cache_target,
        batch_size=batch_size,
        seed=seed,
        # tf.random.set_seed: op seeds derive from it, and a trace keeps the one it saw
        global_seed=_global_seed(tf),
        dtype=dtype,
        label_mode=label_mode,
        resize=resize,
        # Without resize, augmentation or a float dtype, finishing is only labels
        # and shapes: done per shuffle window, which saves a pipeline stage.
        light=not resize and augmenter is None and dtype == "uint8",
        seeded_augment=augmenter is not None and seed is not None,
        window=window,
        shuffle_buffer=shuffle_buffer,
        repeat=repeat and training,
        pad=pad_final_batch,
        counted=skip_corrupt,
    )
    files, counts, lost = _readable(files, counts, skip_corrupt)
    names, expected = tf.constant(files, tf.string), tf.constant(counts, tf.int64)
    # the manifest knows the size: Keras shows real step counts
    steps = num_examples // batch_size if training else -(-num_examples // batch_size)
    # Counts of skipped records (only skip_corrupt skips: otherwise they raise)
    counters = {
        name: tf.Variable(
            lost if name == "corrupt" else 0, dtype=tf.int64, trainable=False, name=f"chute_{name}"
        )
        for name in (("corrupt", "started", "decoded") if skip_corrupt else ())
    }
    # Built here: state of this dataset's own, or op seeds that TensorFlow draws
    # anew for each dataset (a global seed and no seed), where a trace would
    # give every dataset the same ones.
    own = counters or augmenter is not None or (seed is None and plan.global_seed is not None)
    if own:
        batched = _build(tf, plan, names, expected, steps, counters, augmenter)
    elif plan in _BUILT:  # built before, so likely again: trace it once, then reuse
        batched = _shared_build(plan)(names, expected, steps)
    else:  # tracing costs more than one eager build: not for a plan built once
        _BUILT.add(plan)
        batched = _build(tf, plan, names, expected, steps, counters, augmenter)
    batched.class_names = list(manifest.class_names)
    batched.num_examples = num_examples
    batched.per_replica_batch_size = batch_size
    replicas = input_context.num_replicas_in_sync if input_context is not None else 1
    batched.global_batch_size = batch_size * replicas
    batched.corrupt_count = lambda: int(
        sum(counters[name].numpy() * sign for name, sign in _COUNTED.items() if name in counters)
    )
    return batched


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything about a pipeline except which shards it reads: two datasets
    with equal plans are built by the same code with the same constants."""

    stored: tuple  # (encoding, height, width, channels) as in the shards
    shape: tuple  # (height, width, channels) of the images yielded
    num_classes: int
    training: bool
    deterministic: bool
    moving: bool
    shared_records: tuple | None  # (pipelines, index) when pipelines share records
    cores: int
    cache: str | None
    batch_size: int
    seed: int | None
    global_seed: int | None
    dtype: str
    label_mode: str | None
    resize: bool
    light: bool
    seeded_augment: bool
    window: int | None
    shuffle_buffer: int
    repeat: bool
    pad: bool
    counted: bool


_BUILT: set[_Plan] = set()  # plans built eagerly once in this process


@functools.lru_cache(maxsize=64)  # a traced pipeline each: a sweep of options stays bounded
def _shared_build(plan: _Plan):
    """``(shard paths, record counts, steps) -> dataset``: ``_build`` as a
    ``tf.function`` traced once per plan and shared by the datasets built
    after it.

    TensorFlow runs each dataset op created eagerly as a function of its own,
    instantiated anew every time (dataset ops are kept out of its kernel
    cache): about 0.4 ms per op, ~12 ms for a training pipeline, plus ~10 ms
    of tracing the functions not shared otherwise. Built by a traced function,
    a pipeline costs one call (~2.5 ms), but tracing and instantiating it
    costs ~10-20 ms more than one eager build: ``load`` uses it from a plan's
    second build on.
    """
    import tensorflow as tf

    def build(names, expected, steps):
        return _build(tf, plan, names, expected, steps, {}, None)

    specs = [tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64)]
    return tf.function(
        build, input_signature=[*specs, tf.TensorSpec([], tf.int64)], autograph=False
    )


def _build(tf, plan: _Plan, names, expected, steps, counters, augmenter):
    """The pipeline of ``plan`` (see the module docstring) over the shards
    ``names`` holding ``expected`` records each, with ``steps`` batches an epoch."""
    encoding = plan.stored[0]
    count = names.shape[0]  # known when built eagerly: no ops for it then
    if count is None:
        count = tf.size(names, out_type=tf.int64)
    file_ids = tf.data.Dataset.range(count)
    if plan.moving:
        file_ids = file_ids.shuffle(count, seed=plan.seed, reshuffle_each_iteration=True)
        # a random block size per shard and epoch (see the reader): boundaries move
        draws = tf.data.Dataset.random(seed=plan.seed, rerandomize_each_iteration=True)
    else:
        draws = tf.data.Dataset.from_tensors(tf.constant(-1, tf.int64)).repeat()
    reader = _shard_reader(tf, plan.stored, names, expected, counters.get("corrupt"))
    # A fixed width where the order must not depend on the machine (a seed,
    # evaluation, pipelines sharing records); else enough shards for the cores.
    width = _CYCLE if plan.deterministic else max(4, plan.cores)
    blocks = tf.data.Dataset.zip(file_ids, draws).interleave(
        _plain(tf, reader),
        cycle_length=max(1, min(count, width))
        if isinstance(count, int)
        else tf.minimum(count, width),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=plan.deterministic,
    )
    if plan.shared_records is not None:
        pipelines, index = plan.shared_records
        blocks = lean.split(tf, blocks).shard(pipelines, index).batch(_BLOCK)
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": plan.deterministic}
    if encoding != "raw":  # one image per call, on every core (a decoded image each)
        per_image = dict(parallel, num_parallel_calls=plan.cores)
        blocks = _decoded(tf, blocks, plan, counters, per_image)
    if plan.cache is not None:
        blocks = blocks.cache(plan.cache)  # decoded pixels: later epochs skip the files
    finish = _finisher(tf, plan, augmenter)
    if plan.training and (plan.cache is not None or not plan.moving):
        # Blocks replayed from the cache, or read in a fixed order, would fill the
        # same windows every epoch: shuffle the blocks (about a window's worth).
        # A shuffle makes its input's iterator at its first element; the prefetch
        # (started with the iterator: warm start) asks for it at once, so the
        # reader below starts while the stages above are still being set up.
        blocks = blocks.shuffle(max(2, plan.shuffle_buffer // _BLOCK), seed=plan.seed)
        blocks = blocks.prefetch(1)
    if plan.training:
        batched = _mixed_batches(tf, blocks, plan, parallel)
    else:
        batched = lean.regroup(tf, blocks, plan.batch_size)
    if not (plan.training and plan.light):  # per batch: resize, cast, augment, labels
        # Keras's random layers draw from a seed generator: with a seed, batches
        # take their draws in order, or the same seed would augment differently.
        batched = batched.map(_plain(tf, finish), **({} if plan.seeded_augment else parallel))
    if not plan.counted:  # skipping makes the size unknown
        batched = batched.apply(tf.data.experimental.assert_cardinality(steps))
    if plan.repeat:
        batched = batched.repeat()
    if plan.pad:
        batched = _padded(tf, batched, plan.batch_size)
    options = tf.data.Options()
    options.experimental_optimization.parallel_batch = True  # batches copied in parallel
    # Start reading when the iterator is made, not at the first next(): the rest
    # of setting up (Keras's, or the caller's) overlaps with the first shards.
    options.experimental_warm_start = True
    # No autotuning model: every stage is sized here (AUTOTUNE then means
    # min(16, cores): shards read at once, batches finished at once), and the
    # model cost ~3% of a pass and could hold up deleting an iterator.
    options.autotune.enabled = False
    return batched.prefetch(tf.data.AUTOTUNE).with_options(options)


def _readable(files, counts, skip_corrupt):
    """``files`` and ``counts`` without the shards that exist but cannot be read,
    and the records those hold. Such a shard is an error naming it, or, with
    ``skip_corrupt``, skipped and counted: read under ``ignore_errors``,
    TensorFlow would retry opening it forever. (Missing shards are handled
    while reading, where they read as empty.)"""
    bad = storage.unreadable(files)
    if not bad:
        return files, counts, 0
    if not skip_corrupt:
        path, error = next(iter(bad.items()))
        raise ChuteError(
            f"shard {path} cannot be read ({error}). Check its permissions, "
            "run `chute verify`, or pass skip_corrupt=True"
        )
    lost = sum(n for path, n in zip(files, counts, strict=True) if path in bad)
    log.warning("skipping %d unreadable shard(s) (%d records): %s", len(bad), lost, sorted(bad))
    kept = [(path, n) for path, n in zip(files, counts, strict=True) if path not in bad]
    return [path for path, _ in kept], [n for _, n in kept], lost


def pipeline_sizes(manifest: manifest_lib.Manifest, split: str, pipelines: int) -> list[int]:
    """Examples each of ``pipelines`` input pipelines reads of ``split``.

    With at least as many shards as pipelines each reads its own shards;
    otherwise every pipeline keeps every ``pipelines``-th record.

    Example:
        >>> pipeline_sizes(manifest, "train", 2)  # doctest: +SKIP
        [13008, 13009]
    """
    counts = [s["num_records"] for s in manifest.splits[split]["shards"]]
    if pipelines > 1 and len(counts) >= pipelines:
        return [sum(counts[i::pipelines]) for i in range(pipelines)]
    return [len(range(i, sum(counts), pipelines)) for i in range(pipelines)]


def _check_args(batch_size, dtype, label_mode, shuffle_buffer, manifest, training, pad):
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise bad_value("batch_size", batch_size, "a positive integer (per replica)")
    one_of("dtype", dtype, DTYPES)
    if label_mode not in LABEL_MODES:
        raise bad_value("label_mode", label_mode, "one of 'int', 'categorical', 'binary', None")
    if label_mode == "binary" and manifest.num_classes != 2:
        raise ChuteError(
            "`label_mode='binary'` needs exactly 2 classes. Received: "
            f"{manifest.num_classes} classes in {manifest.location}"
        )
    if (
        isinstance(shuffle_buffer, bool)
        or not isinstance(shuffle_buffer, int)
        or shuffle_buffer < 1
    ):
        raise bad_value("shuffle_buffer", shuffle_buffer, "a positive integer")
    if pad and training:
        raise ChuteError("`pad_final_batch` applies to evaluation (training=False) only")
    if pad and label_mode is None:
        raise ChuteError(
            "`pad_final_batch` yields (images, labels, weights): it needs labels. "
            "Received: label_mode=None"
        )


def _cache_target(cache, manifest, split, spec) -> str | None:
    if cache is None:
        return None
    if cache == "memory":
        return ""
    if isinstance(cache, str) and cache.startswith("disk:") and len(cache) > 5:
        return cache[5:]
    if cache != "auto":
        raise bad_value("cache", cache, "'auto', 'memory', 'disk:PATH' or None")
    if spec["height"] is None:
        return None
    decoded = manifest.num_examples(split) * spec["height"] * spec["width"] * spec["channels"]
    fits = decoded <= _memory_budget()
    log.info(
        "cache=auto: %s split decodes to %.0f MB: %s",
        split,
        decoded / 1e6,
        "kept in memory" if fits else "read from the shards each epoch",
    )
    return "" if fits else None


_SIGNATURES = {"png": b"\x89PNG\r\n\x1a\n", "jpeg": b"\xff\xd8"}
_GLOB = r"([*?\[\]\\])"  # characters tf.io.matching_files treats as a pattern


def _shard_reader(tf, stored, names, expected, corrupt):
    """``(file index, draw) -> blocks of (images, labels)`` read from one shard.

    The shard's path and expected count are looked up here; the blocks come
    from ``_blocks_of``, traced once per kind of image (``stored``) and reused
    by every dataset built later in the process.
    """

    def read(file_index, draw):
        path, want = tf.gather(names, file_index), tf.gather(expected, file_index)
        # blocks of _BLOCK records, or with a random draw of 128-256 records
        size = tf.where(
            draw < 0, tf.constant(_BLOCK, tf.int64), _BLOCK // 2 + draw % (_BLOCK // 2 + 1)
        )
        return _blocks_of(*stored, counted=corrupt is not None)(path, want, size, corrupt)

    return read


@functools.cache
def _blocks_of(encoding: str, height: int | None, width: int | None, channels: int, counted: bool):
    """``(path, expected count, block size, corrupt counter or None) -> blocks``:
    one shard read as blocks of ``(images, labels)``.

    Each block is parsed in one vectorised ``parse_example`` and checked: raw
    images must have the manifest's length (and are decoded with one
    ``decode_raw``), PNG/JPEG ones its signature (they come out as bytes, for
    the per-image decoder). A shard that fails its CRC, is truncated or
    missing ends early; an empty block marks each shard's end, where the
    records read are compared with the expected count. Both kinds of problem
    raise an error naming the shard, or, given a ``corrupt`` counter
    (``skip_corrupt``), are dropped and counted. One function call per block:
    per-record (or per-small-block) steps cost more than the parsing itself.

    Everything that differs between datasets is an argument, so it is a
    ``tf.function`` traced once and shared: tracing it was a third of the time
    it takes to build a dataset. Not when ``counted``: a traced function would
    keep using the first dataset's counter variable, so it is traced anew with
    each dataset.
    """
    import tensorflow as tf

    features = {
        records.IMAGE: tf.io.FixedLenFeature([], tf.string),
        records.CLASS: tf.io.FixedLenFeature([], tf.int64),
    }
    if encoding == "raw":
        shape = [-1, height, width, channels]
        problem = "have raw images of the wrong length"
    else:
        signature = _SIGNATURES[encoding]
        problem = f"are not {encoding.upper()} images"

    def blocks_of(path, want, size, corrupt):
        def step(seen, block):
            read_now = tf.size(block, out_type=tf.int64)
            parsed = tf.io.parse_example(block, features)
            data, labels = parsed[records.IMAGE], parsed[records.CLASS]
            if encoding == "raw":
                ok = tf.equal(tf.strings.length(data), shape[1] * shape[2] * shape[3])
            else:
                ok = tf.equal(tf.strings.substr(data, 0, len(signature)), signature)
            at_end = tf.equal(read_now, 0)
            if corrupt is not None:
                lost = tf.where(at_end, tf.maximum(want - seen, 0), tf.constant(0, tf.int64))
                bad = tf.reduce_sum(tf.cast(tf.logical_not(ok), tf.int64))
                checks = [corrupt.assign_add(lost + bad)]
                data, labels = tf.boolean_mask(data, ok), tf.boolean_mask(labels, ok)
            else:
                checks = [
                    _check(tf, tf.logical_or(tf.logical_not(at_end), tf.equal(seen, want)),
                           ["chute: shard", path, "is corrupt, truncated or missing: read", seen,
                            "of", want, "records. Run `chute verify`, or pass skip_corrupt=True"]),
                    _check(tf, tf.reduce_all(ok),
                           ["chute: records in shard", path, problem,
                            "(run `chute verify`, or pass skip_corrupt=True)"]),
                ]  # fmt: skip
            with tf.control_dependencies(checks):
                if encoding == "raw":
                    data = tf.reshape(tf.io.decode_raw(data, tf.uint8), shape)
                return seen + read_now, (tf.identity(data), labels)

        # A missing shard reads as empty: TensorFlow's reader would retry opening it
        # forever under ignore_errors. (A glob pattern matching exactly the path.)
        exists = tf.size(tf.io.matching_files(tf.strings.regex_replace(path, _GLOB, r"\\\1")))
        found = lean.tfrecords(tf, path).take(tf.where(exists > 0, tf.constant(-1, tf.int64), 0))
        # A bad record ends the shard (ignore_errors); the count at the end tells.
        blocks = found.ignore_errors().batch(size)
        blocks = blocks.concatenate(tf.data.Dataset.from_tensors(tf.constant([], tf.string)))
        return blocks.scan(tf.constant(0, tf.int64), _plain(tf, step))

    return blocks_of if counted else tf.function(blocks_of, autograph=False)


def _check(tf, condition, message):
    """An assertion that raises InvalidArgumentError with ``message`` when ``condition`` is false.

    The plain op: ``tf.debugging.Assert`` wraps string messages in a ``tf.cond``,
    which costs tracing time on every dataset built.
    """
    return tf.raw_ops.Assert(condition=condition, data=message, summarize=3)


def _decoded(tf, blocks, plan, counters, parallel):
    """Blocks of PNG/JPEG bytes -> blocks of uint8 images, one image per parallel call.

    Decoders take one image at a time. With ``skip_corrupt`` an image that does
    not decode is dropped; ``started - decoded`` counts the drops.
    """
    encoding, stored = plan.stored[0], plan.stored[1:3]
    height, width, channels = size = plan.shape

    def decode_one(data, label):
        if encoding == "png":
            image = tf.io.decode_png(data, channels=channels)
        else:
            image = tf.io.decode_jpeg(data, channels=channels)
        if stored != (height, width):  # stored at another size, or each at its own
            image = tf.cast(tf.round(tf.image.resize(image, (height, width))), tf.uint8)
        return tf.ensure_shape(image, size), label

    def count(name):
        def add(data, label):
            with tf.control_dependencies([counters[name].assign_add(1)]):
                return tf.identity(data), label

        return _plain(tf, add)

    records_ds = lean.split(tf, blocks)
    if plan.counted:
        records_ds = records_ds.map(count("started")).map(_plain(tf, decode_one), **parallel)
        records_ds = records_ds.ignore_errors().map(count("decoded"))
    else:
        records_ds = records_ds.map(_plain(tf, decode_one), **parallel)
    return records_ds.batch(_BLOCK)


def _mixed_batches(tf, blocks, plan, parallel):
    """Training batches, all full: blocks regrouped into windows of about
    ``plan.window`` records, each window permuted (and finished, when the
    finish is light) and cut into batches (see ``_cutter``).
    """
    batch_size, seed = plan.batch_size, plan.seed
    window = batch_size * max(1, plan.window // batch_size)
    keys = tf.data.Dataset.random(  # not the stream of block sizes
        seed=None if seed is None else seed + 1, rerandomize_each_iteration=True
    )
    # a light finish (labels and shapes) is known by these, and shared with the cutter
    finish = (plan.num_classes, plan.label_mode, plan.shape) if plan.light else None
    cutter = _cutter(batch_size, tuple(blocks.element_spec[0].shape[1:]), finish)

    def cut(block, key):
        return cutter(*block, key)

    windows = tf.data.Dataset.zip(lean.regroup(tf, blocks, window), keys)
    # Two windows cut at a time (a memory copy each): with the one being filled
    # and the one being handed out, about four windows are held at the most.
    cutting = dict(parallel, num_parallel_calls=2)
    return lean.split(tf, windows.map(_plain(tf, cut), **cutting))


@functools.cache
def _cutter(batch_size: int, image_shape: tuple, finish: tuple | None):
    """``(images, labels, key) -> batches``: a ``tf.function`` (traced once per
    batch size, image shape and finish, and shared like ``_blocks_of``) that permutes a
    window of records with one gather, gives it labels and shapes if ``finish``
    (``(num_classes, label_mode, shape)``) is given, and cuts it into whole batches,
    whose static shape says they are full (TPU/XLA).

    Blocks come from several shards at once, and shards were written in random
    order, so a permuted window mixes records from several shards. The
    permutation is one gather on decoded pixels, a cost per window rather than
    per record. Only the split's last partial batch is dropped (windows hold
    whole batches).
    """
    import tensorflow as tf

    finished = None
    if finish is not None:
        num_classes, label_mode, shape = finish
        finished = _finishing(tf, num_classes, "uint8", label_mode, None, False, shape)

    def cut(images, labels, key):
        count = tf.shape(labels)[0]
        order = tf.random.experimental.stateless_shuffle(
            tf.range(count), seed=tf.stack([key, tf.constant(0, tf.int64)])
        )
        order = tf.slice(order, [0], [count // batch_size * batch_size])  # whole batches
        out = (tf.gather(images, order), tf.gather(labels, order))
        if finished is not None:
            out = finished(*out)
        single = not isinstance(out, tuple)
        out = tuple(
            tf.reshape(t, [-1, batch_size, *t.shape[1:]]) for t in ((out,) if single else out)
        )
        return out[0] if single else out

    return tf.function(cut, autograph=False)


_AUGMENTATIONS = {
    "flip": ("RandomFlip", {"mode": "horizontal"}),
    "rotation": ("RandomRotation", {"factor": 0.1}),
    "zoom": ("RandomZoom", {"height_factor": 0.1}),
    "translation": ("RandomTranslation", {"height_factor": 0.1, "width_factor": 0.1}),
    "contrast": ("RandomContrast", {"factor": 0.2}),
    "brightness": ("RandomBrightness", {"factor": 0.2, "value_range": (0, 255)}),
}


def _augmenter(augment, seed):
    if not augment:
        return None
    import keras

    layers = []
    for number, item in enumerate(augment):
        if isinstance(item, str):
            if item not in _AUGMENTATIONS:
                raise bad_value(
                    "augment", item, f"names from {sorted(_AUGMENTATIONS)} or Keras layers"
                )
            name, kwargs = _AUGMENTATIONS[item]
            layer_seed = None if seed is None else seed + number
            layers.append(getattr(keras.layers, name)(**kwargs, seed=layer_seed))
        elif isinstance(item, keras.layers.Layer):
            layers.append(item)
        else:
            raise bad_value("augment", item, f"names from {sorted(_AUGMENTATIONS)} or Keras layers")
    return keras.Sequential(layers)


def _finisher(tf, plan, augmenter):
    """``(images, labels) -> batch``: resize, augment, cast and labels, as ``plan`` says."""
    return _finishing(
        tf, plan.num_classes, plan.dtype, plan.label_mode, augmenter, plan.resize, plan.shape
    )


def _finishing(tf, num_classes, dtype, label_mode, augmenter, resize, shape):
    def finish(images, labels):
        if resize:
            images = tf.cast(tf.round(tf.image.resize(images, shape[:2])), tf.uint8)
        if augmenter is not None:
            images = augmenter(tf.cast(images, tf.float32), training=True)
            images = tf.cast(tf.clip_by_value(tf.round(images), 0, 255), tf.uint8)
        images = tf.ensure_shape(images, (None, *shape))
        labels = tf.ensure_shape(labels, (None,))
        if dtype != "uint8":
            images = tf.cast(images, tf.float32) / 255.0
            if dtype == "bfloat16":
                images = tf.cast(images, tf.bfloat16)
        if label_mode is None:
            return images
        if label_mode == "int":
            return images, tf.cast(labels, tf.int32)
        if label_mode == "binary":
            return images, tf.cast(tf.reshape(labels, (-1, 1)), tf.float32)
        return images, tf.one_hot(labels, num_classes, dtype=tf.float32)

    return finish


def _padded(tf, dataset, batch_size):
    """The last batch padded to ``batch_size``, with weights 1 (real) and 0 (padding)."""

    def pad(*batch):
        real = tf.shape(batch[0])[0]
        missing = batch_size - real
        weights = tf.concat([tf.ones([real]), tf.zeros([missing])], 0)

        def pad_one(t):
            paddings = [[0, missing]] + [[0, 0]] * (len(t.shape) - 1)
            padded = tf.pad(t, paddings)
            return tf.ensure_shape(padded, (batch_size, *t.shape[1:]))

        return (*(pad_one(t) for t in batch), weights)

    return dataset.map(_plain(tf, pad))


def _distributed(path, split, strategy, arguments):
    kwargs = {k: v for k, v in arguments.items() if k not in ("path", "split", "strategy")}
    manifest = manifest_lib.load(path)  # read once, not once per input pipeline

    def dataset_fn(input_context):
        return load(manifest, split, **dict(kwargs, input_context=input_context))

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    distributed.class_names = list(manifest.class_names)
    distributed.per_replica_batch_size = kwargs["batch_size"]
    distributed.global_batch_size = kwargs["batch_size"] * strategy.num_replicas_in_sync
    return distributed
