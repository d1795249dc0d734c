"""``chute convert``: a source dataset to verified TFRecord shards and a manifest.

The run, in one direction::

    scan source -> probe (hash, header) in workers -> resolve spec -> split
    -> plan shards -> encode in workers -> ShardWriter per shard -> manifest

Every shard is planned before encoding starts and is finished atomically, and
each finished shard leaves a small note in ``OUT/.chute-work``; running the
same command again after a crash keeps the finished shards and redoes the
rest, with the same bytes as an uninterrupted run. The manifest is written
last and the work folder removed after it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from chute import encode, shards, sources, storage
from chute import manifest as manifest_lib
from chute.errors import ChuteError
from chute.options import ConvertOptions, bad_value
from chute.split import split_items

log = logging.getLogger(__name__)

WORK_DIR = ".chute-work"
REJECTS_NAME = "rejects.csv"
PROBE_CHUNK = 256
ENCODE_CHUNK = 64
RAW_AUTO_MAX_PIXELS = 128 * 128  # up to here raw pixels are barely larger than PNG
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
    **option_values: Any,
) -> ConvertResult:
    """Converts an image-classification dataset into sharded TFRecords and a manifest.

    Args:
        source: a class-per-folder tree (optionally pre-split into
            train/val/test), a ``.csv``/``.jsonl`` list of ``path,label``, a
            ``.npz`` with ``x``/``y``, or ``keras:cifar10`` (``cifar100``,
            ``mnist``, ``fashion_mnist``).
        output: the directory to write (local, ``gs://``, ``ram://``, ...).
        options: a :class:`~chute.options.ConvertOptions`; or pass its fields
            as keywords (``image_size=75, color_mode="grayscale"``).
        workers: worker processes (default: all cores). Output does not depend on it.
        overwrite: replace an existing conversion made with other options.
        allow_outside: let a list name files outside its own folder.
        progress: called as ``progress(phase, done, total)`` while working.

    Returns:
        A :class:`ConvertResult` with the manifest.

    Raises:
        ChuteError: for a bad option, source or output (before any work starts).

    Example:
        >>> result = convert("Images_with_noise", "kn-shards", image_size=75,
        ...                  color_mode="grayscale", val_fraction=0.01)  # doctest: +SKIP
        >>> result.num_written  # doctest: +SKIP
        {'train': 25844, 'val': 261}
    """
    started = time.perf_counter()
    if options is not None and option_values:
        raise ChuteError(
            "Pass either `options` or option keywords, not both. Received: options and "
            f"{sorted(option_values)}"
        )
    if options is None:
        fields = {f.name for f in dataclasses.fields(ConvertOptions)}
        unknown = sorted(set(option_values) - fields)
        if unknown:
            raise ChuteError(f"Unknown option(s) {unknown}. Allowed: {sorted(fields)}")
        options = ConvertOptions(**option_values)
    workers = _check_workers(workers)
    source, output = os.fspath(source), os.fspath(output).rstrip("/") or "/"
    _check_not_inside(source, output)

    with _gc_paused():
        return _convert(
            source, output, options, workers, overwrite, allow_outside, progress, started
        )


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector: with TensorFlow loaded, each full
    collection walks hundreds of thousands of objects, and a conversion creates
    no reference cycles worth collecting."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _convert(
    source: str,
    output: str,
    options: ConvertOptions,
    workers: int,
    overwrite: bool,
    allow_outside: bool,
    progress: ProgressFn | None,
    started: float,
) -> ConvertResult:
    state = _existing_state(source, output, options, overwrite)
    if isinstance(state, manifest_lib.Manifest):
        log.info("%s already holds this conversion; nothing to do", output)
        _remove_work_dir(output)
        return ConvertResult(state, output, already_done=True)

    found = sources.scan(source, allow_outside=allow_outside)
    log.info(
        "%s: %d images in %d classes (%s)",
        source,
        len(found.items),
        len(found.class_names),
        found.kind,
    )
    pool = _pool(workers, len(found.items))
    try:
        probes = _probe(found, options, pool, progress)
        rejects = [
            {"key": item.key, "reason": probe.reject}
            for item, probe in zip(found.items, probes, strict=True)
            if probe.reject
        ]
        spec = _resolve_spec(options, probes)
        split = split_items(
            found.items,
            [p.digest for p in probes],
            found.class_names,
            val_fraction=options.val_fraction,
            test_fraction=options.test_fraction,
            seed=options.seed,
        )
        plan = _plan(split.indices, probes, spec, options)
        fingerprint = _fingerprint(found, probes)
        resumed, infos, late_rejects = _write_shards(
            found, plan, spec, output, options, fingerprint, pool, progress
        )
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    rejects += late_rejects
    manifest = _finish(found, spec, options, infos, rejects, split.duplicates, fingerprint, output)
    return ConvertResult(
        manifest, output, resumed_shards=resumed, seconds=time.perf_counter() - started
    )


# -- checks before any work ---------------------------------------------------------------


def _check_workers(workers: int | None) -> int:
    if workers is None:
        return max(
            1,
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1),
        )
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 1024:
        raise bad_value("workers", workers, "an integer from 1 to 1024")
    return workers


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


def _existing_state(
    source: str, output: str, options: ConvertOptions, overwrite: bool
) -> manifest_lib.Manifest | None:
    """Returns the manifest of an identical finished run, or None to (re)start.

    Raises when the output holds a different conversion or other files, unless
    ``overwrite`` (then chute's own files there are removed).
    """
    fs = storage.gfile()
    if not fs.exists(output):
        return None
    if not fs.isdir(output):
        raise ChuteError(f"`output` exists and is not a directory. Received: output={output!r}")
    wanted = {"source": source, "options": options.to_dict()}
    manifest_file = storage.join(output, manifest_lib.MANIFEST_NAME)
    plan_file = storage.join(output, WORK_DIR, "plan.json")
    previous = None
    if fs.exists(manifest_file):
        existing = manifest_lib.load(output)
        previous = {"source": existing.source.get("location"), "options": existing.options}
        if previous == wanted and not overwrite:
            return existing
    elif fs.exists(plan_file):
        with fs.GFile(plan_file, "rb") as handle:
            stored = json.loads(handle.read())
        previous = {"source": stored.get("source"), "options": stored.get("options")}
        if previous == wanted and not overwrite:
            return None  # resume
    elif fs.listdir(output) and not overwrite:
        raise ChuteError(
            "`output` is a non-empty folder that chute did not write. "
            f"Received: output={output!r}; choose an empty or new folder"
        )
    if previous is not None and previous != wanted and not overwrite:
        changed = [
            f"{key}: {previous['options'].get(key)!r} -> {value!r}"
            for key, value in wanted["options"].items()
            if (previous.get("options") or {}).get(key) != value
        ]
        if previous.get("source") != source:
            changed.insert(0, f"source: {previous.get('source')!r} -> {source!r}")
        raise ChuteError(
            f"`output` {output!r} holds a conversion with other options ({'; '.join(changed)}). "
            "Pass overwrite=True (--overwrite) to replace it, or choose another folder"
        )
    if overwrite:
        _remove_outputs(output)
    return None


def _remove_outputs(output: str) -> None:
    fs = storage.gfile()
    for name in fs.listdir(output):
        name = name.rstrip("/")
        if shards.SHARD_NAME.match(name) or name in (manifest_lib.MANIFEST_NAME, REJECTS_NAME):
            fs.remove(storage.join(output, name))
    _remove_work_dir(output)


def _remove_work_dir(output: str) -> None:
    fs = storage.gfile()
    work = storage.join(output, WORK_DIR)
    if fs.exists(work):
        fs.rmtree(work)


# -- workers ------------------------------------------------------------------------------


def _pool(workers: int, num_items: int) -> concurrent.futures.Executor | None:
    if workers <= 1 or num_items <= ENCODE_CHUNK:
        return None
    # spawn, not fork: this process may have TensorFlow's threads running.
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("spawn")
    )
    try:
        pool.submit(int).result()
    except concurrent.futures.process.BrokenProcessPool:
        pool.shutdown()
        log.warning(
            "worker processes could not start, so this conversion runs in one process. A script "
            "that calls chute.convert at top level needs an `if __name__ == '__main__':` guard"
        )
        return None
    return pool


def _ordered(
    pool: concurrent.futures.Executor | None, fn: Callable, tasks: Iterable[tuple], window: int
) -> Iterator[Any]:
    """Results of ``fn(*task)`` in task order, with at most ``window`` tasks in flight."""
    if pool is None:
        for task in tasks:
            yield fn(*task)
        return
    pending: collections.deque = collections.deque()
    for task in tasks:
        pending.append(pool.submit(fn, *task))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _window(pool: concurrent.futures.Executor | None) -> int:
    return 4 * getattr(pool, "_max_workers", 1)


def _probe(
    found: sources.Source, options: ConvertOptions, pool, progress: ProgressFn | None
) -> list[encode.Probe]:
    items = found.items
    header = (
        options.color_mode == "auto"
        or options.encoding == "auto"
        or (options.image_size is None and not options.keep_size)
    )
    tasks = (
        (
            [found.payload(item) for item in items[start : start + PROBE_CHUNK]],
            options.max_pixels,
            header,
        )
        for start in range(0, len(items), PROBE_CHUNK)
    )
    probes: list[encode.Probe] = []
    for chunk in _ordered(pool, encode.probe_chunk, tasks, _window(pool)):
        probes += chunk
        if progress:
            progress("check", len(probes), len(items))
    return probes


# -- decisions ----------------------------------------------------------------------------


def _resolve_spec(options: ConvertOptions, probes: list[encode.Probe]) -> encode.ImageSpec:
    usable = [p for p in probes if p.reject is None]
    if not usable:
        raise ChuteError(
            f"No usable image: all {len(probes)} inputs were rejected (first: "
            f"{next((p.reject for p in probes), '')}). Check the source"
        )
    if options.color_mode == "auto":
        channels = 1 if all(p.grayscale for p in usable) else 3
    else:
        channels = 1 if options.color_mode == "grayscale" else 3
    height = width = None
    if options.image_size is not None:
        height, width = options.image_size
    elif not options.keep_size:
        sizes = collections.Counter((p.height, p.width) for p in usable)
        if len(sizes) > 1:
            common = ", ".join(f"{h}x{w} ({n})" for (h, w), n in sizes.most_common(4))
            raise ChuteError(
                f"Images have {len(sizes)} different sizes ({common}, ...). Received: "
                "image_size=None; pass image_size (--image-size H or HxW) to resize them, or "
                "keep_size=True (--keep-size) to store each at its own size"
            )
        height, width = next(iter(sizes))
    encoding = options.encoding
    if encoding == "auto":
        jpeg_share = sum(p.format == "JPEG" for p in usable) / len(usable)
        if options.keep_size:
            encoding = "jpeg" if jpeg_share == 1.0 else "png"
        elif height * width <= RAW_AUTO_MAX_PIXELS:
            encoding = "raw"
        else:
            encoding = "jpeg" if jpeg_share >= 0.5 else "png"
    log.info(
        "storing %s images as %s, %s channel(s)",
        f"{height}x{width}" if height else "original-size",
        encoding,
        channels,
    )
    return encode.ImageSpec(
        height=height,
        width=width,
        channels=channels,
        encoding=encoding,
        quality=options.quality,
        resize=options.resize,
        interpolation=options.interpolation,
        max_pixels=options.max_pixels,
    )


def _bytes_per_record(
    indices: list[int], probes: list[encode.Probe], spec: encode.ImageSpec
) -> float:
    overhead = 128  # framing, feature names, size, key
    if spec.height is not None and spec.encoding == "raw":
        return spec.height * spec.width * spec.channels + overhead
    # Assume the compression ratio of the source files carries over.
    total = 0.0
    for i in indices:
        p = probes[i]
        if spec.height is None:
            total += p.nbytes
        else:
            raw = spec.height * spec.width * spec.channels
            scale = (spec.height * spec.width) / (p.height * p.width) if p.height else 1.0
            total += min(raw, p.nbytes * scale)
    return total / max(1, len(indices)) + overhead


@dataclasses.dataclass
class _Shard:
    split: str
    name: str
    indices: list[int]


def _plan(
    splits: dict[str, list[int]], probes, spec: encode.ImageSpec, options: ConvertOptions
) -> list[_Shard]:
    planned = []
    for split, indices in splits.items():
        runs = shards.plan(
            len(indices),
            _bytes_per_record(indices, probes, spec),
            shard_size_mb=options.shard_size_mb,
            min_shards=options.min_shards,
        )
        for number, (start, stop) in enumerate(runs):
            planned.append(
                _Shard(split, shards.shard_name(split, number, len(runs)), indices[start:stop])
            )
    return planned


def _fingerprint(found: sources.Source, probes: list[encode.Probe]) -> str:
    digest = hashlib.sha256()
    for item, probe in zip(found.items, probes, strict=True):
        digest.update(f"{item.key}\0{item.label}\0{item.split}\0".encode())
        digest.update(probe.digest or b"rejected")
    return digest.hexdigest()


# -- writing ------------------------------------------------------------------------------


def _write_shards(
    found: sources.Source,
    plan: list[_Shard],
    spec: encode.ImageSpec,
    output: str,
    options: ConvertOptions,
    fingerprint: str,
    pool,
    progress: ProgressFn | None,
) -> tuple[int, dict[str, dict], list[dict]]:
    fs = storage.gfile()
    work = storage.join(output, WORK_DIR)
    fs.makedirs(work)
    layout = hashlib.sha256(
        json.dumps([[s.name, [found.items[i].key for i in s.indices]] for s in plan]).encode()
    ).hexdigest()
    plan_file = storage.join(work, "plan.json")
    stamp = {
        "source": found.location,
        "options": options.to_dict(),
        "fingerprint": fingerprint,
        "layout": layout,
        "spec": dataclasses.asdict(spec),
    }
    if fs.exists(plan_file):
        with fs.GFile(plan_file, "rb") as handle:
            if json.loads(handle.read()) != stamp:
                log.warning("the source changed since the interrupted run; starting over")
                fs.rmtree(work)
                fs.makedirs(work)
    storage.write_atomic(plan_file, json.dumps(stamp, sort_keys=True).encode())

    infos: dict[str, dict] = {}
    todo: list[_Shard] = []
    for shard in plan:
        done = _load_done(output, shard.name)
        if done is None:
            todo.append(shard)
        else:
            infos[shard.name] = done
    if infos:
        log.info("resuming: %d of %d shards were already complete", len(infos), len(plan))
    total = sum(len(s.indices) for s in plan)
    finished = sum(len(s.indices) for s in plan if s.name in infos)
    tasks = (
        (
            [
                (found.items[i].key, found.items[i].label, found.payload(found.items[i]))
                for i in shard.indices[start : start + ENCODE_CHUNK]
            ],
            spec,
        )
        for shard in todo
        for start in range(0, len(shard.indices), ENCODE_CHUNK)
    )
    results = _ordered(pool, encode.encode_chunk, tasks, _window(pool))
    for shard in todo:
        shard_rejects: list[dict] = []
        path = storage.join(output, shard.name)
        with shards.ShardWriter(path, len(found.class_names), tmp_dir=work) as writer:
            for start in range(0, len(shard.indices), ENCODE_CHUNK):
                framed, labels, rejected = next(results)
                writer.write(framed, labels)
                shard_rejects += [{"key": k, "reason": r} for k, r in rejected]
                finished += min(ENCODE_CHUNK, len(shard.indices) - start)
                if progress:
                    progress("write", finished, total)
        info = dict(writer.info, split=shard.split, rejects=shard_rejects)
        storage.write_atomic(storage.join(work, shard.name + ".json"), json.dumps(info).encode())
        infos[shard.name] = info
    late_rejects = [r for s in plan for r in infos[s.name].pop("rejects")]
    ordered = {s.name: infos[s.name] for s in plan}
    return len(plan) - len(todo), ordered, late_rejects


def _load_done(output: str, name: str) -> dict | None:
    """The note of a shard finished by an earlier run, if the shard is really there."""
    fs = storage.gfile()
    note = storage.join(output, WORK_DIR, name + ".json")
    shard = storage.join(output, name)
    if not (fs.exists(note) and fs.exists(shard)):
        return None
    with fs.GFile(note, "rb") as handle:
        info = json.loads(handle.read())
    return info if fs.stat(shard).length == info["bytes"] else None


def _finish(
    found: sources.Source,
    spec: encode.ImageSpec,
    options: ConvertOptions,
    infos: dict[str, dict],
    rejects: list[dict],
    duplicates: list[dict],
    fingerprint: str,
    output: str,
) -> manifest_lib.Manifest:
    from chute import __version__

    splits: dict[str, dict] = {}
    for info in infos.values():
        split = splits.setdefault(
            info.pop("split"),
            {"num_examples": 0, "class_counts": [0] * len(found.class_names), "shards": []},
        )
        split["num_examples"] += info["num_records"]
        split["class_counts"] = [
            a + b for a, b in zip(split["class_counts"], info["class_counts"], strict=True)
        ]
        split["shards"].append(info)
    empty = [
        name
        for name, count in zip(found.class_names, splits["train"]["class_counts"], strict=True)
        if count == 0
    ]
    if empty:
        _remove_outputs(output)
        raise ChuteError(
            f"{len(empty)} class(es) lost every training image to unreadable files: "
            f"{empty[:10]}. The rejects were: {rejects[:10]}"
        )
    rejects = sorted(rejects, key=lambda r: r["key"])
    manifest = manifest_lib.Manifest(
        class_names=found.class_names,
        image={
            "height": spec.height,
            "width": spec.width,
            "channels": spec.channels,
            "encoding": spec.encoding,
        },
        splits=splits,
        options=options.to_dict(),
        source={
            "location": found.location,
            "kind": found.kind,
            "fingerprint": fingerprint,
            "num_items": len(found.items),
        },
        rejects=rejects,
        duplicates=duplicates,
        created_by=f"chute {__version__}",
        location=output,
    )
    lines = ["key,reason"] + [_csv_row(r["key"], r["reason"]) for r in rejects]
    storage.write_atomic(storage.join(output, REJECTS_NAME), ("\n".join(lines) + "\n").encode())
    manifest.save(output)  # last: its presence means the conversion is complete
    _remove_work_dir(output)
    log.info(
        "wrote %s: %s; %d rejected, %d duplicate groups",
        output,
        ", ".join(f"{k} {v['num_examples']}" for k, v in splits.items()),
        len(rejects),
        len(duplicates),
    )
    return manifest


def _csv_row(*cells: str) -> str:
    return ",".join(
        '"' + c.replace('"', '""') + '"' if any(x in c for x in ',"\n') else c for c in cells
    )
