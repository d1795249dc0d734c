"""What a ``chute.load`` call will read and how: its arguments checked and resolved into a
:class:`ReadPlan`, before anything is built.

Example:
    >>> plan = make_plan(manifest, "train", batch_size=128)  # doctest: +SKIP
    >>> plan.steps, plan.deterministic  # doctest: +SKIP
    (201, False)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.format.manifest import Manifest
from chute.format.spec import ImageSpec
from chute.ingest.options import parse_image_size
from chute.machine import available_cores, physical_memory

log = logging.getLogger(__name__)

LABEL_MODES = ("int", "categorical", "binary", None)
DTYPES = ("uint8", "float32", "bfloat16")
BLOCK = 256  # records read, checked and decoded together from one shard
WINDOW_BYTES = 128 << 20  # the most decoded pixels one shuffle window holds


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """Everything the pipeline of one input pipeline is built from.

    Attributes:
        files: this input pipeline's shards, and ``counts`` the records of each.
        stored: how the shards store images.
        shape: ``(height, width, channels)`` of the images yielded.
        deterministic: the order of elements is fixed (evaluation, a seed, or
            input pipelines sharing records); otherwise a slow file never
            holds the others up.
        reshuffle_each_epoch: a new shard order and new block boundaries each epoch.
        every_nth: ``(pipelines, index)``: keep every n-th record, when there
            are fewer shards than input pipelines.
        cache: ``tf.data`` cache file name (``""`` in memory), or None.
        window: records per shuffle window (training).
        resize: raw images stored at another size are resized per batch.
        steps: batches in an epoch.
    """

    files: tuple[str, ...]
    counts: tuple[int, ...]
    stored: ImageSpec
    shape: tuple[int, int, int]
    num_classes: int
    num_examples: int
    training: bool
    deterministic: bool
    reshuffle_each_epoch: bool
    every_nth: tuple[int, int] | None
    cores: int
    cache: str | None
    batch_size: int
    replicas: int
    seed: int | None
    dtype: str
    label_mode: str | None
    resize: bool
    window: int | None
    shuffle_buffer: int
    repeat: bool
    pad_final_batch: bool
    skip_corrupt: bool

    @property
    def steps(self) -> int:
        """Batches in an epoch: full ones in training, every example in evaluation."""
        if self.training:
            return self.num_examples // self.batch_size
        return -(-self.num_examples // self.batch_size)


def make_plan(
    manifest: Manifest,
    split: str,
    *,
    batch_size: int,
    training: bool | None,
    image_size: Any,
    dtype: str,
    label_mode: str | None,
    cache: str | None,
    seed: int | None,
    shuffle_buffer: int,
    pad_final_batch: bool,
    repeat: bool,
    skip_corrupt: bool,
    input_context: Any,
) -> ReadPlan:
    """Checks ``chute.load``'s arguments against the manifest and resolves them (see there)."""
    manifest.check_split(split)
    training = (split == "train") if training is None else bool(training)
    checks.positive_int("batch_size", batch_size, "a positive integer (per replica)")
    checks.one_of("dtype", dtype, DTYPES)
    checks.one_of("label_mode", label_mode, LABEL_MODES)
    if label_mode == "binary" and manifest.num_classes != 2:
        raise ChuteError(
            "`label_mode='binary'` needs exactly 2 classes. Received: "
            f"{manifest.num_classes} classes in {manifest.location}"
        )
    checks.positive_int("shuffle_buffer", shuffle_buffer)
    if seed is not None and not checks.is_int(seed):
        raise checks.bad_value("seed", seed, "an integer or None")
    if pad_final_batch and training:
        raise ChuteError("`pad_final_batch` applies to evaluation (training=False) only")
    if pad_final_batch and label_mode is None:
        raise ChuteError(
            "`pad_final_batch` yields (images, labels, weights): it needs labels. "
            "Received: label_mode=None"
        )
    stored = manifest.image
    size = parse_image_size(image_size) or stored.size
    if size is None:
        raise ChuteError(
            f"{manifest.location} stores images at their own sizes; pass image_size=(H, W). "
            "Received: image_size=None"
        )
    shape = (*size, stored.channels)

    pipelines, index, replicas = 1, 0, 1
    if input_context is not None:
        pipelines = input_context.num_input_pipelines
        index = input_context.input_pipeline_id
        replicas = input_context.num_replicas_in_sync
    files, counts = manifest.shard_paths(split), manifest.shard_counts(split)
    by_file = pipelines > 1 and len(files) >= pipelines
    if by_file:  # enough shards: each input pipeline reads its own files
        files, counts = files[index::pipelines], counts[index::pipelines]
    num_examples = pipeline_sizes(manifest, split, pipelines)[index]
    if num_examples == 0:
        raise ChuteError(f"split {split!r} of {manifest.location} has no examples to read here")
    every_nth = (pipelines, index) if pipelines > 1 and not by_file else None
    return ReadPlan(
        files=tuple(files),
        counts=tuple(counts),
        stored=stored,
        shape=shape,
        num_classes=manifest.num_classes,
        num_examples=num_examples,
        training=training,
        # every pipeline sharing records must see one order
        deterministic=not training or seed is not None or every_nth is not None,
        reshuffle_each_epoch=training and every_nth is None,
        every_nth=every_nth,
        cores=available_cores(),
        cache=_cache_target(cache, manifest, split),
        batch_size=batch_size,
        replicas=replicas,
        seed=None if seed is None else int(seed),
        dtype=dtype,
        label_mode=label_mode,
        resize=stored.encoding == "raw" and stored.size != size,
        window=_window(shuffle_buffer, batch_size, stored, shape) if training else None,
        shuffle_buffer=shuffle_buffer,
        repeat=repeat and training,
        pad_final_batch=pad_final_batch,
        skip_corrupt=skip_corrupt,
    )


def pipeline_sizes(manifest: Manifest, split: str, pipelines: int) -> list[int]:
    """Examples each of ``pipelines`` input pipelines reads of ``split``.

    With at least as many shards as pipelines each reads its own shards;
    otherwise every pipeline keeps every ``pipelines``-th record.

    Example:
        >>> pipeline_sizes(manifest, "train", 2)  # doctest: +SKIP
        [13008, 13009]
    """
    counts = manifest.shard_counts(split)
    if pipelines > 1 and len(counts) >= pipelines:
        return [sum(counts[i::pipelines]) for i in range(pipelines)]
    return [len(range(i, sum(counts), pipelines)) for i in range(pipelines)]


def memory_budget() -> int:
    """A quarter of physical memory: what ``cache="auto"`` may keep decoded."""
    memory = physical_memory()
    return memory // 4 if memory else 2 << 30


def _cache_target(cache: str | None, manifest: Manifest, split: str) -> str | None:
    if cache is None:
        return None
    if cache == "memory":
        return ""
    if isinstance(cache, str) and cache.startswith("disk:") and len(cache) > 5:
        return cache[5:]
    if cache != "auto":
        raise checks.bad_value("cache", cache, "'auto', 'memory', 'disk:PATH' or None")
    spec = manifest.image
    if not spec.fixed_size:
        return None
    decoded = manifest.num_examples(split) * spec.height * spec.width * spec.channels
    fits = decoded <= memory_budget()
    log.info(
        "cache=auto: %s split decodes to %.0f MB: %s",
        split,
        decoded / 1e6,
        "kept in memory" if fits else "read from the shards each epoch",
    )
    return "" if fits else None


def _window(shuffle_buffer: int, batch_size: int, stored: ImageSpec, shape: tuple) -> int:
    """Records per shuffle window: ``shuffle_buffer``, at most ``WINDOW_BYTES`` of
    decoded uint8 pixels (as stored for raw images, as decoded otherwise), whole batches."""
    height, width, channels = stored.shape if stored.encoding == "raw" else shape
    window = min(shuffle_buffer, max(batch_size, WINDOW_BYTES // (height * width * channels)))
    if window < shuffle_buffer:
        log.info("shuffle window: %d records (%d MB of pixels)", window, WINDOW_BYTES >> 20)
    return batch_size * max(1, window // batch_size)
