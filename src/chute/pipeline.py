"""``chute.load``: a converted split as a ``tf.data.Dataset`` that outruns the accelerator.

The order of the pipeline, and why:

1. **Shard order reshuffled every epoch** (training): files are the unit of
   parallel reading; a fresh order per epoch varies what is read together.
2. **Parallel interleave** of the shards, ``deterministic=False`` unless a
   seed or evaluation asks for a fixed order: a slow file never stalls the rest.
3. **Shuffle buffer of record blocks** (training): each shard is read in
   blocks of 16 records whose boundaries move every epoch (a random start
   offset per shard), and the blocks go through the shuffle buffer. Shards
   were written in random order, so blocks are random samples; moving blocks
   instead of single records through the buffer costs a fraction (a
   per-record buffer took ~40% of the first pass).
4. **Batch before parse and decode**: blocks are regrouped to the batch size,
   then one vectorised ``parse_example`` and one ``decode_raw`` run per batch
   instead of per image. PNG/JPEG decoders take one image: they run per image
   inside the batch, in parallel.
5. **Cache** (``cache="auto"``): when the decoded split fits the memory budget
   it is kept in RAM after the first epoch: raw records as they are (they are
   the pixels), PNG/JPEG as decoded images, so later epochs skip the files.
   Cached epochs replay the first epoch's blocks (their shard order and
   boundaries); only the order of the blocks is shuffled afresh.
6. Resize (only if another size is asked for), cast, **augment** (training
   only, batched, seeded), **prefetch**.

Training batches drop the remainder (static shapes for TPU/XLA); evaluation
(``training=False``) sees every example exactly once: in order, no shuffle,
with a final smaller batch, or, with ``pad_final_batch=True``, a full batch
padded with zeros and a third element of per-example weights (1 real, 0 pad)
that Keras's ``evaluate`` uses as ``sample_weight``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from chute import manifest as manifest_lib
from chute import records
from chute.errors import ChuteError
from chute.options import bad_value, one_of, parse_image_size

log = logging.getLogger(__name__)

LABEL_MODES = ("int", "categorical", "binary", None)
DTYPES = ("uint8", "float32", "bfloat16")
_SHUFFLE_BLOCK = 16  # records that travel together from a shard to a batch
_COUNT_BLOCK = 1024  # records read (and counted) from a shard at a time


def _memory_budget() -> int:
    """A quarter of physical memory: what ``cache="auto"`` may keep decoded."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return 2 << 30


def load(
    path: str | os.PathLike,
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
            ``ram://``) or its ``manifest.json``.
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
        seed: makes shuffling, interleave order and augmentation reproducible.
        shuffle_buffer: records in the shuffle buffer (training).
        pad_final_batch: evaluation only: pad the last batch to full size and
            yield ``(images, labels, weights)`` with weight 0 on the padding.
        repeat: repeat forever (training); ``len()`` is then infinite.
        skip_corrupt: skip records that fail their CRC or do not decode, and
            count them in ``ds.corrupt_count()``, instead of raising.
        input_context: a ``tf.distribute.InputContext``: read this input
            pipeline's part (by shard when there are enough shards, else by record).
        strategy: a ``tf.distribute.Strategy``: return
            ``strategy.distribute_datasets_from_function`` over this function.

    Returns:
        A ``tf.data.Dataset`` with ``class_names``, ``num_examples``,
        ``per_replica_batch_size``, ``global_batch_size`` and ``corrupt_count()``;
        ``len(ds)`` is the exact number of batches of an epoch.

    Raises:
        ChuteError: for a bad argument or a path that is not a chute dataset.
        tf.errors.InvalidArgumentError: while iterating, naming the shard, when
            a shard is corrupt or truncated (unless ``skip_corrupt``).

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

    counters = {
        name: tf.Variable(0, dtype=tf.int64, trainable=False, name=f"chute_{name}")
        for name in ("corrupt", "started", "decoded")
    }
    record_sharded = pipelines > 1 and not by_file
    # Evaluation, a seed, or sharding by record (every pipeline must see one order)
    # fix the order; otherwise a slow file must not hold the others up.
    deterministic = not training or seed is not None or record_sharded
    moving = training and not record_sharded  # new shard order and block boundaries each epoch
    file_ids = tf.data.Dataset.range(len(files))
    if moving:
        file_ids = file_ids.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        offsets = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
        file_ids = tf.data.Dataset.zip(file_ids, offsets.map(lambda r: r % _SHUFFLE_BLOCK))
    else:
        file_ids = file_ids.map(lambda i: (i, tf.constant(0, tf.int64)))
    reader = _shard_reader(tf, files, counts, skip_corrupt, counters["corrupt"])
    blocks = file_ids.interleave(
        reader,
        cycle_length=min(len(files), 16),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    if record_sharded:
        blocks = blocks.unbatch().shard(pipelines, index).batch(_SHUFFLE_BLOCK)

    decode = _decoder(
        tf, manifest, files, encoding, (height, width, channels), skip_corrupt, counters
    )
    # Training batches are all full (drop_remainder): say so in the static shape.
    static_batch = batch_size if training and not skip_corrupt else None
    finish = _finisher(
        tf, manifest, dtype, label_mode, augmenter, (static_batch, height, width, channels)
    )
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": deterministic}
    if cache_target is not None and encoding != "raw":
        # PNG/JPEG: cache decoded blocks, so later epochs skip decoding too.
        blocks = decode(blocks, **parallel)
    if cache_target is not None:
        # Raw blocks are the pixels already (plus a few bytes): cached as they are.
        blocks = blocks.cache(cache_target)
    if training:
        # Shuffle blocks of records: each shard was written in random order, and
        # block boundaries move every epoch, so batches are random samples, at a
        # fraction of the cost of moving every record through a shuffle buffer.
        blocks = blocks.shuffle(max(1, shuffle_buffer // _SHUFFLE_BLOCK), seed=seed)
    # unbatch + batch rather than rebatch: rebatching blocks that are themselves
    # slices makes TF 2.21 log "Tensor RefCount not reliable if buf_ points to a
    # SubBuffer" at ERROR level for every batch (thousands of lines per epoch).
    batched = blocks.unbatch().batch(batch_size, drop_remainder=training)
    if cache_target is not None and encoding != "raw":
        batched = batched.map(finish, **parallel)
    else:
        batched = decode(batched, finish, batch=batch_size, drop_remainder=training, **parallel)
    if not skip_corrupt:  # the manifest knows the size: Keras shows real step counts
        steps = num_examples // batch_size if training else -(-num_examples // batch_size)
        batched = batched.apply(tf.data.experimental.assert_cardinality(steps))
    if repeat and training:
        batched = batched.repeat()
    if pad_final_batch:
        batched = _padded(tf, batched, batch_size)
    options = tf.data.Options()
    options.experimental_optimization.parallel_batch = True  # batches copied in parallel
    batched = batched.prefetch(tf.data.AUTOTUNE).with_options(options)
    batched.class_names = list(manifest.class_names)
    batched.num_examples = num_examples
    batched.per_replica_batch_size = batch_size
    replicas = input_context.num_replicas_in_sync if input_context is not None else 1
    batched.global_batch_size = batch_size * replicas
    batched.corrupt_count = lambda: int(
        counters["corrupt"].numpy() + counters["started"].numpy() - counters["decoded"].numpy()
    )
    return batched


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


def _shard_reader(tf, files, counts, skip_corrupt, corrupt):
    """``(file index, offset) -> blocks of (records, shard index)``; a shard that fails its CRC, is
    truncated or missing raises an error naming it (or, with skip_corrupt, ends
    there and counts what it lost).

    Records are counted a block at a time: a per-record count (``scan``) would
    cost more than parsing them.
    """
    names = tf.constant(files)
    expected = tf.constant(counts, tf.int64)

    def read(file_index, offset):
        path = names[file_index]
        want = expected[file_index]
        records_ds = tf.data.TFRecordDataset(path)
        # Start ``offset`` records in and read those last: block boundaries move.
        records_ds = records_ds.skip(offset).concatenate(records_ds.take(offset))
        records_ds = records_ds.ignore_errors()  # a bad record ends the shard; counted below
        # Counted in large batches (a check per small block costs more than the
        # parsing), then cut into the small blocks that get shuffled.
        tagged = records_ds.batch(_COUNT_BLOCK).map(lambda r: (r, False))
        end = tf.data.Dataset.from_tensors((tf.constant([b""]), True))

        def count(seen, element):
            block, is_end = element
            if skip_corrupt:
                lost = tf.where(is_end, want - seen, tf.constant(0, tf.int64))
                update = corrupt.assign_add(lost)
                check = [update]
            else:
                check = [
                    tf.debugging.Assert(
                        tf.logical_or(tf.logical_not(is_end), tf.equal(seen, want)),
                        [
                            "chute: shard",
                            path,
                            "is corrupt, truncated or missing: read",
                            seen,
                            "of",
                            want,
                            "records. Run `chute verify`, or pass skip_corrupt=True",
                        ],
                    )
                ]
            with tf.control_dependencies(check):
                size = tf.cast(tf.size(block), tf.int64) * tf.cast(tf.logical_not(is_end), tf.int64)
                return seen + size, (block, is_end)

        return (
            tagged.concatenate(end)
            .scan(tf.constant(0, tf.int64), count)
            .filter(lambda block, is_end: tf.logical_not(is_end))
            # each record carries its shard's index, so a decode error can name it
            .map(lambda block, is_end: (block, tf.fill(tf.shape(block), file_index)))
            .rebatch(_SHUFFLE_BLOCK)
        )

    return read


_SIGNATURES = {"png": b"\x89PNG\r\n\x1a\n", "jpeg": b"\xff\xd8"}


def _decoder(tf, manifest, files, encoding, size, skip_corrupt, counters):
    """``batches of (records, shard ids) -> batches of (uint8 images, int labels)``.

    A record whose image does not match the manifest (wrong raw length, not a
    PNG/JPEG) raises an error naming its shard, or with ``skip_corrupt`` is
    dropped and counted.
    """
    height, width, channels = size
    stored_h, stored_w = manifest.image["height"], manifest.image["width"]
    names = tf.constant(files)
    features = {
        records.IMAGE: tf.io.FixedLenFeature([], tf.string),
        records.CLASS: tf.io.FixedLenFeature([], tf.int64),
    }

    def decode_one(data):
        if encoding == "png":
            image = tf.io.decode_png(data, channels=channels)
        else:
            image = tf.io.decode_jpeg(data, channels=channels)
        if stored_h is None or (stored_h, stored_w) != (height, width):
            image = tf.cast(tf.round(tf.image.resize(image, (height, width))), tf.uint8)
        return tf.ensure_shape(image, (height, width, channels))

    def checked(batch, shard_ids):
        """Parses a batch; keeps (or insists on) records whose image looks right."""
        parsed = tf.io.parse_example(batch, features)
        data, labels = parsed[records.IMAGE], parsed[records.CLASS]
        if encoding == "raw":
            ok = tf.equal(tf.strings.length(data), stored_h * stored_w * channels)
            problem = "have raw images of the wrong length"
        else:
            signature = _SIGNATURES[encoding]
            ok = tf.equal(tf.strings.substr(data, 0, len(signature)), signature)
            problem = f"are not {encoding.upper()} images"
        if skip_corrupt:
            counters["corrupt"].assign_add(tf.reduce_sum(tf.cast(tf.logical_not(ok), tf.int64)))
            return tf.boolean_mask(data, ok), tf.boolean_mask(labels, ok)
        first_bad = tf.argmin(tf.cast(ok, tf.int32))
        check = tf.debugging.Assert(
            tf.reduce_all(ok),
            ["chute: records in shard", names[shard_ids[first_bad]], problem,
             "(run `chute verify`, or pass skip_corrupt=True)"],
        )  # fmt: skip
        with tf.control_dependencies([check]):
            return tf.identity(data), labels

    def raw_batch(batch, shard_ids):
        # one vectorised parse and one decode_raw for the whole batch
        data, labels = checked(batch, shard_ids)
        images = tf.reshape(tf.io.decode_raw(data, tf.uint8), [-1, stored_h, stored_w, channels])
        if (stored_h, stored_w) != (height, width):
            images = tf.cast(tf.round(tf.image.resize(images, (height, width))), tf.uint8)
        return images, labels

    def count(name):
        def add(image, label):
            with tf.control_dependencies([counters[name].assign_add(1)]):
                return tf.identity(image), label

        return add

    def apply(dataset, then=None, batch=_SHUFFLE_BLOCK, drop_remainder=False, **parallel):
        """Decodes batches of records; ``then`` (the finisher) runs in the same map."""
        fused = then or (lambda images, labels: (images, labels))
        if encoding == "raw" and stored_h is not None:
            return dataset.map(lambda b, ids: fused(*raw_batch(b, ids)), **parallel)
        # PNG/JPEG decoders take one image: check a batch at once, then decode
        # each image in a parallel map (cheaper than a loop inside each batch).
        records_ds = dataset.map(checked, **parallel).unbatch()
        one = lambda data, label: (decode_one(data), label)  # noqa: E731
        if skip_corrupt:  # a bad image is dropped; started - decoded counts the drops
            records_ds = records_ds.map(count("started")).map(one, **parallel)
            records_ds = records_ds.ignore_errors().map(count("decoded"))
        else:
            records_ds = records_ds.map(one, **parallel)
        decoded = records_ds.batch(batch, drop_remainder=drop_remainder)
        return decoded.map(fused, **parallel) if then else decoded

    return apply


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


def _finisher(tf, manifest, dtype, label_mode, augmenter, shape):
    num_classes = manifest.num_classes

    def finish(images, labels):
        if augmenter is not None:
            images = augmenter(tf.cast(images, tf.float32), training=True)
            images = tf.cast(tf.clip_by_value(tf.round(images), 0, 255), tf.uint8)
        images = tf.ensure_shape(images, shape)
        labels = tf.ensure_shape(labels, shape[:1])
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

    return dataset.map(pad)


def _distributed(path, split, strategy, arguments):
    kwargs = {k: v for k, v in arguments.items() if k not in ("path", "split", "strategy")}

    def dataset_fn(input_context):
        return load(path, split, **dict(kwargs, input_context=input_context))

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    manifest = manifest_lib.load(path)
    distributed.class_names = list(manifest.class_names)
    distributed.per_replica_batch_size = kwargs["batch_size"]
    distributed.global_batch_size = kwargs["batch_size"] * strategy.num_replicas_in_sync
    return distributed
