"""``chute convert``: a source dataset to verified TFRecord shards and a manifest.

:func:`convert` reads as its steps, in one direction::

    scan the source -> plan: [read headers in workers, when an option is "auto"]
        -> image spec -> split -> shards
    -> write: encode + hash (worker processes, or Beam) -> each record's fate
        -> shard + note (chute.ingest.writer)
    -> finish: rejects.csv, the source listing and, last, the manifest

Every shard is planned before encoding starts and is written atomically by the
one shard-writing core, :func:`chute.ingest.writer.write_shard`, which leaves
a small note per shard in ``OUT/.chute-work``; running the same command again
after a crash keeps the finished shards and redoes the rest, with the same
bytes as an uninterrupted run. The manifest is written last and the work
folder removed after it.

With ``runner`` (Apache Beam, see :mod:`chute.ingest.beam`) this process
still scans, plans and finishes (the same steps below); Beam encodes the
images and writes the shards and their notes with the same core, so the
bytes are the same.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from chute import collector
from chute.errors import ChuteError
from chute.format import contents, records, storage
from chute.format import index as record_index
from chute.format import manifest as manifest_lib
from chute.format.spec import ImageSpec
from chute.image.header import Probe
from chute.ingest import append as appending
from chute.ingest import layout, lock, resume, sources, writer
from chute.ingest import workers as worker_pool
from chute.ingest.decode import probe_chunk
from chute.ingest.encode import Chunk, Encoded, fingerprint_text
from chute.ingest.options import ConvertOptions
from chute.ingest.sources.base import scratch_named
from chute.ingest.split import LeakGuard, NoTrainingImages, split_items

if TYPE_CHECKING:
    from chute.ingest.beam import BeamJob

log = logging.getLogger(__name__)
log.addFilter(storage.LOG_FILTER)  # a source's URL is logged without its credentials

PROBE_CHUNK = 256
ENCODE_CHUNK = 64  # files: each can be megabytes
ARRAY_CHUNK_BYTES = 1 << 20  # rows of an array: as many as fit (up to MAX_CHUNK)
MAX_CHUNK = 1024
_SIZE_SAMPLE = 256  # headers read to estimate shard sizes when nothing else needs them
ProgressFn = Callable[[str, int, int], None]


@dataclasses.dataclass
class ConvertResult:
    """What a conversion did.

    Attributes:
        manifest: the written (or existing) manifest.
        output: the output directory.
        already_done: the output was complete with the same options; nothing ran.
        resumed_shards: shards kept from an interrupted earlier run.
        seconds: wall time of this call.
    """

    manifest: manifest_lib.Manifest
    output: str
    already_done: bool = False
    resumed_shards: int = 0
    seconds: float = 0.0

    @property
    def num_written(self) -> dict[str, int]:
        """Records per split."""
        return {name: split.examples for name, split in self.manifest.splits.items()}

    @property
    def num_rejected(self) -> int:
        """Inputs skipped, each listed with its reason in the manifest and rejects.csv."""
        return len(self.manifest.rejects)


@storage.redacting_errors  # a source's credentials stay out of every error it raises
def convert(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    options: ConvertOptions | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    allow_outside: bool = False,
    progress: ProgressFn | None = None,
    runner: str | None = None,
    pipeline_args: Sequence[str] | Any = None,
    append: bool = False,
    **option_values: Any,
) -> ConvertResult:
    """Converts an image-classification dataset into sharded TFRecords and a manifest.

    Args:
        source: a class-per-folder tree (optionally pre-split into
            train/val/test), a ``.zip`` or ``.tar`` (``.tar.gz``, ...) archive of
            one, WebDataset ``.tar`` shards (``"data/shard-{000000..000099}.tar"``),
            Hugging Face Parquet files (a folder or a file) or ``hf:OWNER/NAME``,
            a ``.csv``/``.jsonl`` list of ``path,label``, a ``.npz`` with
            ``x``/``y``, or ``keras:cifar10`` (``cifar100``, ``mnist``,
            ``fashion_mnist``).
        output: the directory to write (local, ``gs://``, ``ram://``, ...).
        options: a :class:`~chute.ingest.options.ConvertOptions`; or pass its fields
            as keywords (``image_size=75, color_mode="grayscale"``).
        workers: worker processes (default: all cores). Output does not depend on it.
        overwrite: replace an existing conversion made with other options.
        allow_outside: let a list name files outside its own folder.
        progress: called as ``progress(phase, done, total)`` while working: images
            for ``"check"`` and ``"write"``, bytes for ``"unpack"`` (a compressed tar).
        runner: encode and write on Apache Beam (chute's ``beam`` extra):
            ``"DirectRunner"``, ``"DataflowRunner"``, ``"FlinkRunner"`` or
            ``"SparkRunner"``. This process still scans the source, reads headers
            (``workers`` processes) and plans the shards; the output is the same
            bytes as without a runner. Default: no Beam, local worker processes.
        pipeline_args: Beam pipeline options, as command-line flags
            (``["--project=my-project", "--region=us-central1",
            "--temp_location=gs://my-bucket/tmp"]``) or a Beam ``PipelineOptions``.
        append: add the source's images to the dataset ``output`` holds, as its next
            version (:mod:`chute.ingest.append`): new shards only, the dataset's
            options, its classes first, copies of its images skipped and counted.

    Returns:
        A :class:`ConvertResult` with the manifest.

    Raises:
        ChuteError: for a bad option, source or output (before any work starts).

    Example:
        >>> result = convert("Images_with_noise", "kn-shards", image_size=75,
        ...                  color_mode="grayscale", val_fraction=0.01)  # doctest: +SKIP
        >>> result.num_written  # doctest: +SKIP
        {'train': 25844, 'val': 261}
        >>> convert("gs://my-bucket/images", "gs://my-bucket/shards", image_size=224,
        ...         runner="DataflowRunner", pipeline_args=["--project=my-project",
        ...         "--region=us-central1", "--temp_location=gs://my-bucket/tmp",
        ...         "--requirements_file=requirements.txt"])  # doctest: +SKIP
    """
    started = time.perf_counter()
    if append:
        return _append(source, output, options, option_values, workers, overwrite, runner,
                       pipeline_args, allow_outside, progress)  # fmt: skip
    options = _options(options, option_values)
    workers = worker_pool.check_workers(workers)
    beam = _beam_job(runner, pipeline_args)  # checked (and Beam imported) before any work
    # Checked before the trailing "/" goes: "s3://" would become a local folder "s3:".
    source = storage.check_location(source, "source")
    output = storage.check_location(output, "output")
    # A trailing slash would make two names for one output (and its lock); "/" stays itself.
    output = output.rstrip("/") or "/"
    _check_not_inside(source, output)
    # Before the scan: what Beam's workers could not read or write is refused at once.
    if beam is not None:
        beam.check_paths(source, output)
    with contextlib.ExitStack() as stack:
        # No cycles worth collecting are made here; a full collection walks every object.
        stack.enter_context(collector.paused())
        stack.enter_context(_terminated_as_exit())  # SIGTERM unwinds: temporary files go
        # the lock and the "nothing to do" check come before any scan, which may unpack
        stack.enter_context(lock.locked(output))
        done = None if overwrite else resume.finished_before_scan(
            source, output, options, sources.container_files(source)
        )  # fmt: skip
        if done is None:
            # Under the lock, so no other conversion of this output is using the scratch folders.
            lock.remove_stale_scratch(output)
            # closing the source deletes what a compressed tar was unpacked to
            found = stack.enter_context(_scan(source, output, options, allow_outside, progress))
            options = _decide_val_fraction(options, found)
            if beam is not None:
                beam.check_source(found)
            files = found.listing()
            done = resume.existing_state(source, output, options, overwrite, files)
        if done is not None:
            log.info("%s already holds this conversion; nothing to do", output)
            # An interrupted append's shards go with its work: the manifest names none of them.
            listed = {shard.name for split in done.splits.values() for shard in split.shards}
            resume.remove_orphans(output, listed)
            resume.remove_work_dir(output)
            return ConvertResult(done, output, already_done=True)
        # Under one chunk of work, starting worker processes costs more than it saves.
        processes = workers if len(found.items) > ENCODE_CHUNK else 1
        pool = stack.enter_context(worker_pool.start_pool(processes, on_crash=_crashed))
        plan = _plan(source, found, options, output, pool, progress)
        backend = _LocalWorkers(pool) if beam is None else _OnBeam(beam, pool)
        written = _write(plan, files, backend, progress)
        manifest = _finish(plan, written, files)
    return ConvertResult(
        manifest, output, resumed_shards=written.resumed, seconds=time.perf_counter() - started
    )


def _append(
    source: str | os.PathLike,
    output: str | os.PathLike,
    options: ConvertOptions | None,
    option_values: dict[str, Any],
    workers: int | None,
    overwrite: bool,
    runner: str | None,
    pipeline_args: Any,
    allow_outside: bool,
    progress: ProgressFn | None,
) -> ConvertResult:
    """:func:`convert` with ``append``: the source's images as the dataset's next version."""
    started = time.perf_counter()
    if overwrite:
        raise ChuteError(
            "`append` adds to the dataset in `output` and `overwrite` replaces it: pass one "
            "of them. Received: append=True, overwrite=True"
        )
    if runner is not None or pipeline_args is not None:
        raise ChuteError(
            "`append` runs on this machine's worker processes, not on Beam. Received: "
            f"runner={runner!r}, pipeline_args={pipeline_args!r}; leave them out"
        )
    if options is not None:
        raise ChuteError(
            "`append` takes option keywords (those given must match the dataset's), not "
            "`options`: the dataset's own are used"
        )
    workers = worker_pool.check_workers(workers)
    source = storage.check_location(source, "source")
    output = storage.check_location(output, "output").rstrip("/") or "/"
    _check_not_inside(source, output)
    with contextlib.ExitStack() as stack:
        stack.enter_context(collector.paused())
        stack.enter_context(_terminated_as_exit())
        # Locked before the manifest is read: no other conversion or append changes it now.
        stack.enter_context(lock.locked(output))
        base = appending.base_of(output)
        options = appending.options_for(base, option_values)
        lock.remove_stale_scratch(output)
        found = stack.enter_context(_scan(source, output, options, allow_outside, progress))
        # The fractions carve only the splits the new source lacks.
        carve = {item.split for item in found.items if item.split}
        options = dataclasses.replace(
            options,
            val_fraction=0.0 if "val" in carve else options.val_fraction,
            test_fraction=0.0 if "test" in carve else options.test_fraction,
        )
        added = appending.relabel(found, base)
        files = found.listing()
        identity = sources.source_identity(source)
        done = appending.already(base, identity, files)
        if done is None and _same_as_first(base, identity, output, files):
            done = 1
        if done is not None:
            log.info("%s already holds %s (version %d): nothing to append", output, source, done)
            resume.remove_work_dir(output)
            return ConvertResult(base, output, already_done=True)
        processes = workers if len(found.items) > ENCODE_CHUNK else 1
        pool = stack.enter_context(worker_pool.start_pool(processes, on_crash=_crashed))
        first_new = len(base.class_names)
        plan = _plan(source, found, options, output, pool, progress, base=base,
                     needs_training=range(first_new, first_new + len(added)))  # fmt: skip
        written = _write(plan, files, _LocalWorkers(pool), progress)
        if not added and not written.kept:
            # Every image a copy or refused: no version that holds nothing new.
            for shard in plan.shards:
                _remove_shard(output, shard.name)
            resume.remove_work_dir(output)
            copies = written.guard.known_copies
            log.info("%s: every image of %s is in the dataset already (%d) or was refused: "
                     "no new version", output, source, copies)  # fmt: skip
            return ConvertResult(base, output, already_done=True)
        manifest = _finish(plan, written, files)
    return ConvertResult(
        manifest, output, resumed_shards=written.resumed, seconds=time.perf_counter() - started
    )


def _remove_shard(output: str, name: str) -> None:
    """Deletes a shard this conversion wrote, and its record index."""
    storage.remove_if_exists(storage.join(output, name))
    storage.remove_if_exists(record_index.index_path(output, record_index.index_name(name)))


def _same_as_first(
    base: manifest_lib.Manifest, identity: str, output: str, files: list[tuple[str, int, int]]
) -> bool:
    """Whether the source is the one the dataset was converted from, unchanged."""
    if base.source.get("location") != storage.redact(identity):
        return False
    return resume.changes_since(output, files) == []


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """While converting, SIGTERM (a job scheduler, ``kill``) exits through the normal
    unwinding (status 143), so worker processes stop and temporary folders are deleted;
    only in the main thread, and only where SIGTERM's default (die at once) is in force."""
    if (
        threading.current_thread() is not threading.main_thread()
        # A handler of the caller's own (a framework, a test) is left in charge.
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        # 128 + signal number: the status a shell reports for a process killed by that signal.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# -- checks before any work ---------------------------------------------------------------


def _options(options: ConvertOptions | None, values: dict[str, Any]) -> ConvertOptions:
    """``options``, or one made from the option keywords (never both)."""
    if options is not None and values:
        raise ChuteError(
            "Pass either `options` or option keywords, not both. Received: options and "
            f"{sorted(values)}"
        )
    return options if options is not None else ConvertOptions.from_dict(values)


def _beam_job(runner: str | None, pipeline_args: Sequence[str] | Any) -> BeamJob | None:
    """The Beam side of the conversion when a runner (or Beam options) is asked for."""
    if runner is None and pipeline_args is None:
        return None
    from chute.ingest.beam import BeamJob

    return BeamJob(runner, pipeline_args)


def _check_not_inside(source: str, output: str) -> None:
    # A keras: or hf: name is no folder at all. Locations compared normalised (a symlink,
    # a relative path or a doubled "/" must not hide that output lies inside), in any
    # store: in a bucket the lock object written before the scan would be read as a class.
    if source.startswith(("keras:", "hf:")) or not storage.same_or_inside(output, source):
        return
    # Asked only of a source that holds the output's name: in a bucket it is a request.
    if storage.isdir(source):
        raise ChuteError(
            f"`output` must not be inside the source folder (it would be read as data). "
            f"Received: output={storage.redact(output)!r}, source={storage.redact(source)!r}"
        )


# -- scan ---------------------------------------------------------------------------------


def _scan(
    source: str,
    output: str,
    options: ConvertOptions,
    allow_outside: bool,
    progress: ProgressFn | None,
) -> sources.Source:
    """The source's items and class names, once ``output`` is known to be writable; what
    a compressed tar or Parquet files are unpacked to is named after ``output``."""
    storage.check_output(output, "output")
    # Scratch named after the output, so a later run can find and remove what a crash left.
    with scratch_named(lock.scratch_prefix(output)):
        found = sources.scan(
            source,
            allow_outside=allow_outside,
            max_pixels=options.max_pixels,
            progress=progress,
            image_column=options.image_column,
            label_column=options.label_column,
            labels=options.label_rules(),
        )
    log.info(
        "%s: %d images in %d classes (%s)",
        source,
        len(found.items),
        len(found.class_names),
        found.kind,
    )
    return found


def _decide_val_fraction(options: ConvertOptions, found: sources.Source) -> ConvertOptions:
    """The options with an unset ``val_fraction`` decided by the splits the source comes
    with (a validation split carved from train when it has train and test only)."""
    decided = options.for_source_splits({item.split for item in found.items if item.split})
    if options.val_fraction is None and decided.val_fraction:
        log.info(
            "the source has train and test splits only: val_fraction=%g of each class's "
            "training images becomes the val split (val_fraction=0 keeps none)",
            decided.val_fraction,
        )
    return decided


# -- workers ------------------------------------------------------------------------------


def _probe(
    found: sources.Source,
    indices: range,
    options: ConvertOptions,
    pool,
    progress: ProgressFn | None,
) -> list[Probe]:
    if isinstance(found, sources.ArraySource):
        return _probe_arrays(found, indices, options, progress)
    tasks = (
        (
            [found.payload(found.items[i]) for i in indices[start : start + PROBE_CHUNK]],
            options.max_pixels,
        )
        for start in range(0, len(indices), PROBE_CHUNK)
    )
    probes: list[Probe] = []
    for chunk in pool.ordered("probe_chunk", tasks):
        probes += chunk
        if progress:
            progress("check", len(probes), len(indices))
    return probes


def _probe_arrays(
    found: sources.ArraySource,
    indices: range,
    options: ConvertOptions,
    progress: ProgressFn | None,
) -> list[Probe]:
    """The probes of an array source's items, read here: every row of one array has
    the array's header (a worker round trip a row costs more than the header itself)."""
    probes = {
        name: probe_chunk([array[0]], options.max_pixels)[0]
        for name, array in found.arrays.items()
        if len(array)
    }
    found_probes = [probes[found.items[i].split or "train"] for i in indices]
    if progress:
        progress("check", len(found_probes), len(indices))
    return found_probes


def _crashed(function: str, task: tuple, code: int) -> list:
    """The result of a task that killed two worker processes: each of its files rejected."""
    reason = (
        f"the worker process crashed twice (exit code {code}) on the chunk of "
        f"{len(task[0])} files holding this one"
    )
    # Every file of the chunk is rejected: which one crashed the worker cannot be told.
    if function == "probe_chunk":
        return [Probe(reason, False, 0, 0, "", 0) for _ in task[0]]
    if function == "encode_columns":
        chunk = task[0]
        count = len(chunk)
        text = fingerprint_text(chunk.keys, chunk.targets, chunk.split, ["None"] * count)
        return [None] * count, [None] * count, [reason] * count, text
    return [Encoded(None, None, reason) for _ in task[0]]


# -- plan ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a conversion writes, fixed before any image is encoded."""

    source: str  # as the user named it, normalised (sources.source_identity)
    found: sources.Source
    options: ConvertOptions
    output: str
    spec: ImageSpec
    shards: list[layout.Shard]  # every shard, in plan order (train first)
    rejects: list[dict]  # inputs refused while scanning or from their header: in no shard
    chunk: int = ENCODE_CHUNK  # items per worker task
    base: manifest_lib.Manifest | None = None  # the dataset an append adds to

    @property
    def version(self) -> int:
        """The dataset version this conversion writes."""
        return 1 if self.base is None else self.base.version + 1


def _plan(
    source: str,
    found: sources.Source,
    options: ConvertOptions,
    output: str,
    pool,
    progress: ProgressFn | None,
    *,
    base: manifest_lib.Manifest | None = None,
    needs_training: range | None = None,
) -> _Plan:
    """The image spec, every shard with its items, and the inputs rejected from their header.

    Headers are read first only when an option is left to them; files are
    otherwise read once, when they are encoded (and hashed, for duplicates). An
    append (``base``) stores its images as the dataset does; ``needs_training``: the
    classes that must get a training image (default: all).
    """
    everything = range(len(found.items))
    probes = None
    if base is None and layout.needs_headers(options):
        probes = _probe(found, everything, options, pool, progress)
    spec = base.image if base is not None else layout.image_spec(options, probes)
    rejects = list(found.rejects)  # refused while scanning (a list naming a file again, ...)
    rejects += [
        {"key": found.items[i].key, "reason": p.reject}
        for i, p in enumerate(probes or [])
        if p.reject
    ]
    try:
        split = split_items(
            found.items,
            [p.reject is None for p in probes] if probes else [True] * len(found.items),
            found.class_names,
            val_fraction=options.val_fraction,
            test_fraction=options.test_fraction,
            seed=options.seed,
            needs_training=needs_training,
        )
    except NoTrainingImages as error:
        raise _why_no_images(error.classes, found, rejects, output, base) from None
    if probes is None and spec.encoding != "raw":
        step = max(1, len(found.items) // _SIZE_SAMPLE)  # enough to estimate shard sizes
        # A sample only: the records' size is estimated, every file is read in full later anyway.
        probes = _probe(found, everything[::step], options, pool, None)
    version = 1 if base is None else base.version + 1
    size = layout.bytes_per_record(spec, probes or [])
    shards = layout.plan_shards(split.indices, size, options, version)
    identity = sources.source_identity(source)
    chunk = _chunk_size(found)
    return _Plan(identity, found, options, output, spec, shards, rejects, chunk, base)


def _chunk_size(found: sources.Source) -> int:
    """Items per worker task: :data:`ENCODE_CHUNK` files, or rows of an array up to
    :data:`ARRAY_CHUNK_BYTES` (tiny rows in chunks of 64 cost more to send than to encode)."""
    if not isinstance(found, sources.ArraySource) or not found.arrays:
        return ENCODE_CHUNK
    row = max(array[0].nbytes if len(array) else 1 for array in found.arrays.values())
    return max(ENCODE_CHUNK, min(MAX_CHUNK, ARRAY_CHUNK_BYTES // max(1, row)))


def _why_no_images(
    classes: list[str],
    found: sources.Source,
    rejects: list[dict],
    output: str,
    base: manifest_lib.Manifest | None = None,
) -> NoTrainingImages:
    """The error for classes left without a training image, with the first reasons their
    images were refused; every reject goes to ``OUT/rejects.csv``, which is kept."""
    label_of = {item.key: item.labels or (item.label,) for item in found.items}
    names = set(classes)

    def classes_of(key: str) -> set[str]:
        if key in label_of:
            return {found.class_names[label] for label in label_of[key]}
        # A reject from scanning has no item: its class is the folder name in its key.
        return {next((part for part in key.split("/") if part in names), None)}

    shown = []
    for name in classes[:5]:
        theirs = [r for r in rejects if name in classes_of(r["key"])]
        if not theirs:
            shown.append(f"{name!r}: no image found")
            continue
        first = "; ".join(f"{r['key']}: {r['reason']}" for r in theirs[:3])
        more = f" (and {len(theirs) - 3} more)" if len(theirs) > 3 else ""
        shown.append(f"{name!r}: {len(theirs)} refused, {first}{more}")
    reasons = ". " + ". ".join(shown)
    if rejects:
        # Written even though the conversion fails: the user needs the whole list to fix it.
        # An append's go beside its work, not over the dataset's own rejects.csv.
        folder = output if base is None else storage.join(output, manifest_lib.WORK_DIR)
        storage.makedirs(folder)
        resume.write_rejects(folder, sorted(rejects, key=lambda r: r["key"]))
        where = storage.join(folder, resume.REJECTS_NAME)
        reasons += f". All {len(rejects)} refused inputs are listed in {where}"
    return NoTrainingImages(classes, reasons)


# -- write --------------------------------------------------------------------------------


def _target(item: sources.Item) -> int | records.Target:
    """What the item's record says of it besides the image: its class (single-label, no
    weight: as every dataset before multi-label), or its labels and weight."""
    if item.labels is None and item.weight is None:
        return item.label  # the common case, without a call
    return records.target_of(item.label, item.labels, item.weight)


def _described(item: sources.Item) -> tuple[str, int | tuple[int, ...]]:
    """The item's key, and its class or its set of labels: what the LeakGuard reports of
    a copy."""
    return item.key, item.label if item.labels is None else item.labels


_FINGERPRINT = "fingerprint_text"  # in a note just written: its chunks' fingerprint text


class _Tally:
    """What the shards hold, added up from their notes in plan order: the manifest
    entries, the rejects, the LeakGuard (for its duplicates report) and the source
    fingerprint, a running sha256 over (key, label, split, content hash)."""

    def __init__(self, found: sources.Source, resumed: int, known: Any = None):
        self.found = found
        self.resumed = resumed  # shards kept from an earlier run
        self.infos: dict[str, dict] = {}  # shard name -> manifest entry (plus its split)
        self.rejects: list[dict] = []
        self.guard = LeakGuard(known)
        self.fingerprint = hashlib.sha256()

    def add(self, shard: layout.Shard, note: dict, *, replay: bool) -> None:
        """Adds a finished shard's note; with ``replay``, also feeds the LeakGuard what it
        saw when the shard was written (its duplicates report; a shard written by this
        process fed it already)."""
        items, split = self.found.items, shard.split
        if note["fates"] or note["missing"] or replay:
            for index, (digest, fate) in zip(shard.indices, writer.outcomes(note), strict=True):
                if writer.rejected(fate):
                    self.rejects.append({"key": items[index].key, "reason": fate})
                elif replay:
                    self.guard.admit(digest, split, index)
        text = note.pop(_FINGERPRINT, None)  # the workers made it; else (a note read) here
        if text is None:
            members = [items[index] for index in shard.indices]
            keys, targets = [item.key for item in members], [_target(i) for i in members]
            text = fingerprint_text(keys, targets, split, writer.hex_digests(note))
        self.fingerprint.update(text.encode())
        for field in ("digests", "missing", "fates"):
            del note[field]
        self.infos[shard.name] = note

    @property
    def kept(self) -> int:
        """Records the shards hold."""
        return sum(manifest_lib.Shard.from_dict(note).records for note in self.infos.values())


def _write(
    plan: _Plan,
    files: list[tuple[str, int, int]],
    backend: _LocalWorkers | _OnBeam,
    progress: ProgressFn | None,
) -> _Tally:
    """Writes the shards no earlier run finished, and adds up every shard's note.

    Each note records, per item, its content hash and fate (kept, dropped as a
    leak, or the reject reason), so a resumed run rebuilds the same LeakGuard,
    fingerprint and rejects without reading those images again.
    """
    notes = _start_writing(plan, files, check_sha256=backend.check_sha256)
    known = None
    if plan.base is not None:  # the images the dataset holds: their copies are skipped
        known, missing = contents.known(plan.output, plan.base.version)
        if missing:
            log.warning(
                "version(s) %s of %s have no content hashes (converted by an older chute): "
                "copies of their images are not found",
                missing,
                plan.output,
            )
    tally = _Tally(plan.found, resumed=sum(note is not None for note in notes.values()),
                   known=known)  # fmt: skip
    total, finished = sum(len(shard.indices) for shard in plan.shards), 0
    for shard, note, replay in backend.write(plan, notes, tally.guard):
        tally.add(shard, note, replay=replay)
        finished += len(shard.indices)
        if progress:
            progress("write", finished, total)
    return tally


def _start_writing(
    plan: _Plan, files: list[tuple[str, int, int]], *, check_sha256: bool
) -> dict[str, dict | None]:
    """Stamps the work folder with the plan; returns each shard's note from an earlier
    run of the same plan (None for the shards to write). ``check_sha256``: re-read a
    finished shard to check it (else its size is checked). A kept shard that holds a
    source file changed since that run (``files``, the listing now) is written again."""
    items = plan.found.items
    stamp = {
        "source": storage.redact(plan.source),  # stored: no credentials (as in the manifest)
        "options": plan.options.to_dict(),
        # A digest of which item goes to which shard: a kept shard must hold the same items.
        "layout": _layout_digest(plan),
        "spec": plan.spec.to_dict(),
    }
    kept = set()
    if plan.base is not None:
        stamp["append"] = plan.version  # the version an interrupted append was writing
        kept = {shard.name for split in plan.base.splits.values() for shard in split.shards}
    resume.start_work(plan.output, stamp)
    # A finished folder holds only its own shards, not those of an interrupted other plan.
    resume.remove_orphans(plan.output, kept | {shard.name for shard in plan.shards})
    changed = resume.changed_since_start(plan.output, files)
    # a listing of containers (archives, Parquet files) names no item: any change is all
    everything = bool(changed) and bool(changed - {item.key for item in items})
    notes = {}
    for shard in plan.shards:
        note = writer.load_note(plan.output, shard.name, check_sha256=check_sha256)
        touched = changed and any(items[i].key in changed for i in shard.indices)
        if note is not None and (everything or touched):
            log.info("%s holds source files changed since it was written: writing it again",
                     shard.name)  # fmt: skip
            note = None
        notes[shard.name] = note
    kept = sum(note is not None for note in notes.values())
    if kept:
        log.info("resuming: %d of %d shards were already complete", kept, len(plan.shards))
    return notes


def _layout_digest(plan: _Plan) -> str:
    """The sha256 of which item goes to which shard: each shard's name, then its items'
    keys and targets (one JSON array per shard, hashed as it is made)."""
    items = plan.found.items
    digest = hashlib.sha256()
    for shard in plan.shards:
        members = [items[i] for i in shard.indices]
        keys = [item.key for item in members]
        digest.update(json.dumps([shard.name, keys, [_target(item) for item in members]]).encode())
    return digest.hexdigest()


class _LocalWorkers:
    """Writes on this machine: the worker processes encode, this process writes each
    shard with :func:`chute.ingest.writer.write_shard`, in plan order."""

    check_sha256 = True  # a shard kept from an earlier run is re-read and checked

    def __init__(self, pool):
        self.pool = pool

    def write(
        self, plan: _Plan, notes: dict[str, dict | None], guard: LeakGuard
    ) -> Iterator[tuple[layout.Shard, dict, bool]]:
        """Each shard with its note, in plan order, and whether the note is an earlier
        run's (the shard was not written again)."""
        todo = [shard for shard in plan.shards if notes[shard.name] is None]
        sent: collections.deque = collections.deque()  # each task's targets, oldest first
        # Ordered results: shards are written in plan order, so their bytes never depend on timing.
        results = self.pool.ordered("encode_columns", _encode_tasks(plan, todo, sent))
        for shard in plan.shards:
            note = notes[shard.name]
            if note is not None:
                yield shard, note, True
            else:
                yield shard, _write_shard(plan, shard, results, sent, guard), False


class _OnBeam:
    """Writes on Apache Beam (:class:`chute.ingest.beam.BeamJob`), with the same core;
    the notes of what it wrote come back."""

    check_sha256 = False  # a shard kept from an earlier run: its size is checked

    def __init__(self, job: BeamJob, pool):
        self.job = job
        self.pool = pool

    def write(
        self, plan: _Plan, notes: dict[str, dict | None], guard: LeakGuard
    ) -> Iterator[tuple[layout.Shard, dict, bool]]:
        """Each shard with its note, in plan order, all of them notes to replay."""
        self.pool.close()  # the headers are read: Beam encodes the rest
        notes = self.job.write_shards(
            plan.found, plan.shards, notes, plan.spec, plan.output, plan.options
        )
        for shard in plan.shards:
            yield shard, dict(notes[shard.name]), True


def _encode_tasks(
    plan: _Plan, shards: list[layout.Shard], sent: collections.deque
) -> Iterator[tuple]:
    """The worker tasks that encode ``shards``: a :class:`Chunk` each; each chunk's
    targets are kept in ``sent`` for its records."""
    found = plan.found
    for shard in shards:
        for start, stop in worker_pool.chunk_bounds(len(shard.indices), plan.chunk):
            items = [found.items[i] for i in shard.indices[start:stop]]
            targets = [_target(item) for item in items]
            sent.append(targets)
            keys = [item.key for item in items]
            chunk = Chunk(keys, targets, found.payloads(items), shard.split)
            yield chunk, plan.spec, plan.options.max_pixels


def _write_shard(
    plan: _Plan,
    shard: layout.Shard,
    results: Iterator,
    sent: collections.deque,
    guard: LeakGuard,
) -> dict:
    """Writes one shard from its encoded chunks, the next ones in ``results`` (their
    targets the next ones in ``sent``); returns its note. The LeakGuard admits each
    record, in writing order."""

    texts = []  # the fingerprint text of each chunk

    def chunks() -> Iterator[writer.Chunk]:
        for _ in worker_pool.chunk_bounds(len(shard.indices), plan.chunk):
            digests, framed, rejects, text = next(results)  # its task was sent before
            texts.append(text)
            yield sent.popleft(), digests, framed, rejects

    def admit(start: int, digests: list[bytes | None]) -> list[bool]:
        # In writing order, so which copy of a duplicate is kept does not depend on the workers.
        refs = shard.indices[start : start + len(digests)]
        return guard.admit_many(digests, shard.split, refs)

    lock.check_held(plan.output)  # a conversion that took over OUT writes it now, not this one
    note = writer.write_shard(plan.output, shard.name, chunks(), admit=admit)
    note[_FINGERPRINT] = "".join(texts)  # not in the note on disk: a re-run makes it again
    return note


# -- finish -------------------------------------------------------------------------------


def _finish(
    plan: _Plan, written: _Tally, files: list[tuple[str, int, int]]
) -> manifest_lib.Manifest:
    """Writes ``rejects.csv``, the source listing and, last, the manifest; removes the
    work folder."""
    manifest = _manifest(plan, written)
    if plan.base is not None:
        for name in appending.empty_shards(manifest):
            _remove_shard(plan.output, name)
        manifest = appending.merged(
            plan.base, manifest, copies=written.guard.known_copies, files=files
        )
        # Warned of over the whole dataset as it is now (an append may give a class its
        # first training or validation image, or a new class none).
        manifest.warnings = _warnings(manifest.class_names, manifest.splits) + _without_val(
            manifest.class_names, manifest.splits, plan.options
        )
        log.info("append: version %d, %d cop(ies) of the dataset's images skipped",
                 plan.version, written.guard.known_copies)  # fmt: skip
    lock.check_held(plan.output)
    contents.write(plan.output, plan.version, [written.guard.kept()])
    resume.write_rejects(plan.output, manifest.rejects)
    if plan.base is None:  # what a re-run of the first conversion compares with
        resume.write_listing(plan.output, files)
    manifest.save(plan.output)  # last: its presence means the conversion is complete
    resume.remove_work_dir(plan.output)
    log.info(
        "wrote %s: %s; %d rejected, %d duplicate groups",
        plan.output,
        ", ".join(f"{k} {v.examples}" for k, v in manifest.splits.items()),
        len(manifest.rejects),
        len(manifest.duplicates),
    )
    return manifest


def _manifest(plan: _Plan, written: _Tally) -> manifest_lib.Manifest:
    """The manifest of the written shards."""
    from chute import __version__

    found = plan.found
    fingerprint = written.fingerprint
    for reject in plan.rejects:  # inputs rejected from their header never reached a shard
        fingerprint.update(f"{reject['key']}\0rejected\0".encode())
    splits = _splits(written.infos, len(found.class_names))
    return manifest_lib.Manifest(
        class_names=found.class_names,
        image=plan.spec,
        splits=splits,
        options=plan.options.to_dict(),
        source={
            # what the manifest keeps, inspect shows and a re-run compares: no credentials
            "location": storage.redact(plan.source),
            "kind": found.kind,
            "fingerprint": fingerprint.hexdigest(),
            "num_items": len(found.items),
        },
        rejects=sorted(plan.rejects + written.rejects, key=lambda r: r["key"]),
        duplicates=written.guard.report(lambda index: _described(found.items[index])),
        # An append's classes have their images in the dataset's shards: warned of there.
        warnings=[]
        if plan.base is not None
        else _warnings(found.class_names, splits)
        + _without_val(found.class_names, splits, plan.options),
        created_by=f"chute {__version__}",
        label_mode="multi" if found.multi_label else "single",
        weighted=found.weighted,
        location=plan.output,
    )


def _splits(infos: dict[str, dict], num_classes: int) -> dict[str, manifest_lib.Split]:
    """The manifest's splits: record and class counts, and shards, from each shard's entry."""
    shards: dict[str, list[manifest_lib.Shard]] = {}
    for info in infos.values():
        shards.setdefault(info.pop("split"), []).append(manifest_lib.Shard.from_dict(info))
    return {name: manifest_lib.Split.of(found, num_classes) for name, found in shards.items()}


def _warnings(class_names: list[str], splits: dict[str, manifest_lib.Split]) -> list[str]:
    """What the manifest warns of: classes that lost every training image."""
    empty = [
        name
        for name, count in zip(class_names, splits["train"].class_counts, strict=True)
        if count == 0
    ]
    if not empty:  # kept and reported: the shards are good, the class is not learnable
        return []
    warning = (
        f"{len(empty)} class(es) lost every training image to files rejected while "
        f"decoding: {empty[:10]} (see rejects.csv); a model trained on this split "
        "never sees them"
    )
    log.warning(warning)
    return [warning]


def _without_val(
    class_names: list[str], splits: dict[str, manifest_lib.Split], options: ConvertOptions
) -> list[str]:
    """What the manifest warns of: classes with no image in the val split (a small
    ``val_fraction`` rounds a small class's share down to none)."""
    if "val" not in splits:
        return []
    empty = [
        name
        for name, count in zip(class_names, splits["val"].class_counts, strict=True)
        if count == 0
    ]
    if not empty:
        return []
    fraction = options.val_fraction
    hint = f" at val_fraction={fraction:g}; raise it to give them one" if fraction else ""
    warning = (
        f"{len(empty)} of {len(class_names)} class(es) have no validation image{hint}: "
        f"{empty[:10]}{' ...' if len(empty) > 10 else ''}; validation never measures them"
    )
    log.warning(warning)
    return [warning]
