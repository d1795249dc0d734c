"""``chute convert``: a source dataset to verified TFRecord shards and a manifest.

The run, in one direction::

    scan source -> [read headers in workers, when an option is "auto"] -> image spec
    -> split -> plan shards -> encode + hash in workers -> LeakGuard -> ShardWriter
    -> manifest

Every shard is planned before encoding starts and is finished atomically, and
each finished shard leaves a small note in ``OUT/.chute-work``; running the
same command again after a crash keeps the finished shards and redoes the
rest, with the same bytes as an uninterrupted run. The manifest is written
last and the work folder removed after it.

With ``runner`` (Apache Beam, see :mod:`chute.ingest.beam`) this process
still scans, plans and finishes (the same functions below); Beam encodes the
images and writes the shards and their notes, with the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from chute import collector
from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.format import storage
from chute.format.spec import ImageSpec
from chute.ingest import plan as plan_lib
from chute.ingest import resume, sources
from chute.ingest import workers as worker_pool
from chute.ingest.decode import Probe
from chute.ingest.encode import Encoded
from chute.ingest.options import ConvertOptions
from chute.ingest.split import LeakGuard, split_items
from chute.ingest.writer import ShardWriter

log = logging.getLogger(__name__)

PROBE_CHUNK = 256
ENCODE_CHUNK = 64
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
        return {name: split["num_examples"] for name, split in self.manifest.splits.items()}

    @property
    def num_rejected(self) -> int:
        """Inputs skipped, each listed with its reason in the manifest and rejects.csv."""
        return len(self.manifest.rejects)


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
        runner: encode and write on Apache Beam (``pip install chute[beam]``):
            ``"DirectRunner"``, ``"DataflowRunner"``, ``"FlinkRunner"`` or
            ``"SparkRunner"``. This process still scans the source, reads headers
            (``workers`` processes) and plans the shards; the output is the same
            bytes as without a runner. Default: no Beam, local worker processes.
        pipeline_args: Beam pipeline options, as command-line flags
            (``["--project=my-project", "--region=us-central1",
            "--temp_location=gs://my-bucket/tmp"]``) or a Beam ``PipelineOptions``.

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
    if options is not None and option_values:
        raise ChuteError(
            "Pass either `options` or option keywords, not both. Received: options and "
            f"{sorted(option_values)}"
        )
    if options is None:
        options = ConvertOptions.from_dict(option_values)
    workers = worker_pool.check_workers(workers)
    beam = None
    if runner is not None or pipeline_args is not None:
        from chute.ingest.beam import BeamJob

        beam = BeamJob(runner, pipeline_args)  # checked (and Beam imported) before any work
    source, output = os.fspath(source), os.fspath(output).rstrip("/") or "/"
    _check_not_inside(source, output)
    if beam is not None:
        beam.check_paths(source, output)

    # No cycles worth collecting are made here; a full collection walks every object.
    with collector.paused():
        storage.check_output(output, "output")
        found = sources.scan(
            source,
            allow_outside=allow_outside,
            max_pixels=options.max_pixels,
            progress=progress,
            image_column=options.image_column,
            label_column=options.label_column,
        )
        with found:  # closing it deletes what a compressed tar was unpacked to
            log.info(
                "%s: %d images in %d classes (%s)",
                source,
                len(found.items),
                len(found.class_names),
                found.kind,
            )
            if beam is not None:
                beam.check_source(found)
            files = resume.listing(found)
            with resume.locked(output):
                done = resume.existing_state(source, output, options, overwrite, files)
                if done is not None:
                    log.info("%s already holds this conversion; nothing to do", output)
                    resume.remove_work_dir(output)
                    return ConvertResult(done, output, already_done=True)
                processes = workers if len(found.items) > ENCODE_CHUNK else 1
                with worker_pool.start_pool(processes, on_crash=_crashed) as pool:
                    spec, shards, rejects = _plan(found, options, pool, progress)
                    notes = _start_writing(found, shards, spec, output, options, beam is None)
                    if beam is None:
                        written = _write_shards(
                            found, shards, notes, spec, output, options, pool, progress
                        )
                if beam is not None:  # Beam encodes and writes the rest; notes tell the manifest
                    resumed = sum(note is not None for note in notes.values())
                    notes = beam.write_shards(found, shards, notes, spec, output, options)
                    written = _account(found, shards, notes, resumed, progress)
                manifest = _finish(found, spec, options, written, rejects, files, output)
    return ConvertResult(
        manifest, output, resumed_shards=written.resumed, seconds=time.perf_counter() - started
    )


# -- checks before any work ---------------------------------------------------------------


def _check_not_inside(source: str, output: str) -> None:
    if source.startswith("keras:") or not (storage.is_local(source) and storage.is_local(output)):
        return
    src = os.path.realpath(storage.local_path(source))
    out = os.path.realpath(storage.local_path(output))
    if os.path.isdir(src) and (out == src or out.startswith(src + os.sep)):
        raise ChuteError(
            f"`output` must not be inside the source folder (it would be read as data). "
            f"Received: output={output!r}, source={source!r}"
        )


# -- workers ------------------------------------------------------------------------------


def _probe(
    found: sources.Source,
    indices: range,
    options: ConvertOptions,
    pool,
    progress: ProgressFn | None,
) -> list[Probe]:
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


def _crashed(function: str, task: tuple, code: int) -> list:
    """The result of a task that killed two worker processes: each of its files rejected."""
    reason = (
        f"the worker process crashed twice (exit code {code}) on the chunk of "
        f"{len(task[0])} files holding this one"
    )
    if function == "probe_chunk":
        return [Probe(reason, False, 0, 0, "", 0) for _ in task[0]]
    return [Encoded(None, None, reason) for _ in task[0]]


# -- the plan -----------------------------------------------------------------------------


def _plan(
    found: sources.Source, options: ConvertOptions, pool, progress: ProgressFn | None
) -> tuple[ImageSpec, list[plan_lib.Shard], list[dict]]:
    """The image spec, every shard with its items, and the inputs rejected from their header.

    Headers are read first only when an option is left to them; files are
    otherwise read once, when they are encoded (and hashed, for duplicates).
    """
    everything = range(len(found.items))
    probes = None
    if plan_lib.needs_headers(options):
        probes = _probe(found, everything, options, pool, progress)
    spec = plan_lib.image_spec(options, probes)
    rejects = list(found.rejects)  # refused while scanning (a list naming a file again, ...)
    rejects += [
        {"key": found.items[i].key, "reason": p.reject}
        for i, p in enumerate(probes or [])
        if p.reject
    ]
    split = split_items(
        found.items,
        [p.reject is None for p in probes] if probes else [True] * len(found.items),
        found.class_names,
        val_fraction=options.val_fraction,
        test_fraction=options.test_fraction,
        seed=options.seed,
    )
    if probes is None and spec.encoding != "raw":
        step = max(1, len(found.items) // _SIZE_SAMPLE)  # enough to estimate shard sizes
        probes = _probe(found, everything[::step], options, pool, None)
    shards = plan_lib.plan_shards(
        split.indices, plan_lib.bytes_per_record(spec, probes or []), options
    )
    return spec, shards, rejects


# -- writing ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Written:
    infos: dict[str, dict]  # shard name -> manifest entry (plus its split)
    rejects: list[dict]
    guard: LeakGuard
    fingerprint: Any  # a running sha256 over (key, label, split, content hash)
    resumed: int


def _start_writing(
    found: sources.Source,
    plan: list[plan_lib.Shard],
    spec: ImageSpec,
    output: str,
    options: ConvertOptions,
    check_sha256: bool = True,
) -> dict[str, dict | None]:
    """Stamps the work folder with the plan; returns each shard's note from an earlier
    run of the same plan (None for the shards to write). ``check_sha256``: re-read a
    finished shard to check it (else its size is checked)."""
    layout = hashlib.sha256(
        json.dumps(
            [
                [s.name, [(found.items[i].key, found.items[i].label) for i in s.indices]]
                for s in plan
            ]
        ).encode()
    ).hexdigest()
    stamp = {
        "source": found.location,
        "options": options.to_dict(),
        "layout": layout,
        "spec": spec.to_dict(),
    }
    resume.start_work(output, stamp)
    resume.remove_orphans(output, {shard.name for shard in plan})
    notes = {
        shard.name: resume.load_done(output, shard.name, check_sha256=check_sha256)
        for shard in plan
    }
    kept = sum(note is not None for note in notes.values())
    if kept:
        log.info("resuming: %d of %d shards were already complete", kept, len(plan))
    return notes


def _write_shards(
    found: sources.Source,
    plan: list[plan_lib.Shard],
    notes: dict[str, dict | None],
    spec: ImageSpec,
    output: str,
    options: ConvertOptions,
    pool,
    progress: ProgressFn | None,
) -> _Written:
    """Writes the shards without a note, in plan order; the others are replayed.

    Each shard's note records, per item, its content hash and fate (kept,
    dropped as a leak, or the reject reason), so a resumed run rebuilds the
    same LeakGuard, fingerprint and rejects without reading those images again.
    """
    todo = [shard for shard in plan if notes[shard.name] is None]
    tasks = (
        (
            [
                (found.items[i].key, found.items[i].label, found.payload(found.items[i]))
                for i in shard.indices[start : start + ENCODE_CHUNK]
            ],
            spec,
            options.max_pixels,
        )
        for shard in todo
        for start in range(0, len(shard.indices), ENCODE_CHUNK)
    )
    results = pool.ordered("encode_chunk", tasks)
    written = _Written({}, [], LeakGuard(), hashlib.sha256(), len(plan) - len(todo))
    total, finished = sum(len(s.indices) for s in plan), 0
    for shard in plan:
        note, replay = notes[shard.name], notes[shard.name] is not None
        if note is None:
            note = _write_shard(found, shard, output, results, written.guard)
        _add_shard(written, found, shard, note, replay=replay)
        finished += len(shard.indices)
        if progress:
            progress("write", finished, total)
    return written


def _account(
    found: sources.Source,
    plan: list[plan_lib.Shard],
    notes: dict[str, dict],
    resumed: int,
    progress: ProgressFn | None,
) -> _Written:
    """What the shards hold, from the notes of shards written elsewhere (by Beam)."""
    written = _Written({}, [], LeakGuard(), hashlib.sha256(), resumed)
    total, finished = sum(len(s.indices) for s in plan), 0
    for shard in plan:
        _add_shard(written, found, shard, dict(notes[shard.name]), replay=True)
        finished += len(shard.indices)
        if progress:
            progress("write", finished, total)
    return written


def _add_shard(
    written: _Written,
    found: sources.Source,
    shard: plan_lib.Shard,
    note: dict,
    *,
    replay: bool,
) -> None:
    """Adds a finished shard's note to the fingerprint, rejects and manifest entries;
    with ``replay``, also feeds the LeakGuard what it saw when the shard was written
    (its duplicates report; a shard written here fed it already)."""
    for index, (digest, fate) in zip(shard.indices, note.pop("outcomes"), strict=True):
        item = found.items[index]
        if replay and fate in (resume.KEPT, resume.LEAK):
            written.guard.admit(bytes.fromhex(digest), item.key, item.label, shard.split)
        written.fingerprint.update(f"{item.key}\0{item.label}\0{shard.split}\0{digest}\0".encode())
        if fate not in (resume.KEPT, resume.LEAK):
            written.rejects.append({"key": item.key, "reason": fate})
    written.infos[shard.name] = note


def _write_shard(
    found: sources.Source, shard: plan_lib.Shard, output: str, results: Iterator, guard: LeakGuard
) -> dict:
    """Writes one shard from the encoded chunks; returns (and saves) its note."""
    outcomes: list[tuple[str | None, str]] = []
    work = storage.join(output, resume.WORK_DIR)
    path = storage.join(output, shard.name)
    with ShardWriter(path, tmp_dir=work) as writer:
        for start in range(0, len(shard.indices), ENCODE_CHUNK):
            kept, labels = [], []
            chunk = shard.indices[start : start + ENCODE_CHUNK]
            for index, encoded in zip(chunk, next(results), strict=True):
                item = found.items[index]
                digest = encoded.digest.hex() if encoded.digest else None
                if encoded.reject is not None:
                    outcomes.append((digest, encoded.reject))
                elif guard.admit(encoded.digest, item.key, item.label, shard.split):
                    kept.append(encoded.record)
                    labels.append(item.label)
                    outcomes.append((digest, resume.KEPT))
                else:  # its content is already in a higher split
                    outcomes.append((digest, resume.LEAK))
            writer.write(b"".join(kept), labels)
    note = dict(writer.info, split=shard.split, outcomes=outcomes)
    resume.save_done(output, shard.name, note)
    return note


def _finish(
    found: sources.Source,
    spec: ImageSpec,
    options: ConvertOptions,
    written: _Written,
    header_rejects: list[dict],
    files: list[tuple[str, int, int]],
    output: str,
) -> manifest_lib.Manifest:
    """Writes ``rejects.csv`` and, last, the manifest; removes the work folder."""
    from chute import __version__

    fingerprint = written.fingerprint
    for reject in header_rejects:  # inputs rejected from their header never reached a shard
        fingerprint.update(f"{reject['key']}\0rejected\0".encode())
    rejects = header_rejects + written.rejects
    duplicates = written.guard.report()
    splits: dict[str, dict] = {}
    for info in written.infos.values():
        split = splits.setdefault(
            info.pop("split"),
            {"num_examples": 0, "class_counts": [0] * len(found.class_names), "shards": []},
        )
        split["num_examples"] += info["num_records"]
        shard_counts = manifest_lib.dense_counts(info["class_counts"], len(found.class_names))
        split["class_counts"] = [
            a + b for a, b in zip(split["class_counts"], shard_counts, strict=True)
        ]
        split["shards"].append(info)
    empty = [
        name
        for name, count in zip(found.class_names, splits["train"]["class_counts"], strict=True)
        if count == 0
    ]
    warnings = []
    if empty:  # kept and reported: the shards are good, the class is not learnable
        warnings.append(
            f"{len(empty)} class(es) lost every training image to files rejected while "
            f"decoding: {empty[:10]} (see rejects.csv); a model trained on this split "
            "never sees them"
        )
        log.warning(warnings[-1])
    rejects = sorted(rejects, key=lambda r: r["key"])
    manifest = manifest_lib.Manifest(
        class_names=found.class_names,
        image=spec,
        splits=splits,
        options=options.to_dict(),
        source={
            "location": found.location,
            "kind": found.kind,
            "fingerprint": fingerprint.hexdigest(),
            "num_items": len(found.items),
        },
        rejects=rejects,
        duplicates=duplicates,
        warnings=warnings,
        created_by=f"chute {__version__}",
        location=output,
    )
    resume.write_rejects(output, rejects)
    resume.write_listing(output, files)
    manifest.save(output)  # last: its presence means the conversion is complete
    resume.remove_work_dir(output)
    log.info(
        "wrote %s: %s; %d rejected, %d duplicate groups",
        output,
        ", ".join(f"{k} {v['num_examples']}" for k, v in splits.items()),
        len(rejects),
        len(duplicates),
    )
    return manifest
