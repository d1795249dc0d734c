"""Benchmark: chute.load's Grain engine against its tf.data engine and the codelab's pipeline.

Same shards, same run (issue #21 item 6, "Speed").

    python benchmarks/bench_grain.py --repeats 3 --json benchmarks/results/grain.json

Data (generated once under --work-dir and kept there, no download):

* photos: --photos camera-size photo-like JPEGs (bench_photos.py's generator:
  1.6-2.4k px wide, 4:3 either way, quality 90, 4 classes), converted once with
  ``chute convert SRC OUT --shorter-side 256 --encoding jpeg`` and read the way
  photos are trained: ``image_size=224, augment="crop,flip"``, batch 64.
* glyphs: 657 classes x 40 grayscale 100x100 PNGs (``chute.make_sample_folder``;
  --glyph-classes, --glyphs-per-class)
  converted with ``chute.convert(..., image_size=75, color_mode="grayscale",
  encoding="raw")``, read at 75x75, batch 256.

What runs, for --repeats rounds, the rows taking turns (order reversed every other
round), each run reporting each row's median and the median of the per-round ratios:

* photos, images/s: ``chute.load(engine="tf", cache=None)``; ``chute.load(engine="grain",
  workers=N)`` with N = the cores and N = 0; and the "Keras on TPU" codelab's plain
  pipeline without augmentation, no chute code (``TFRecordDataset(files,
  num_parallel_reads=AUTOTUNE)`` -> ``parse_single_example`` -> ``decode_jpeg`` ->
  ``tf.image.resize`` to 224x224 (float32, as it returns) -> ``batch`` -> ``prefetch``).
* glyphs, images/s: the tf.data engine (``cache=None``) and the Grain engine (N = the
  cores, and 0).
* workers (``--grain-workers-only`` keeps only these rows): the Grain engine with worker
  processes (N = the cores) against threads in the calling process (``workers=0``, what
  ``workers=None`` falls back to where a script's top level would be run again by the
  spawned workers), photos and glyphs: images/s and images per CPU-second (this process
  and its workers together).
* random reads: ``chute.grain_source(shards)[i]`` at random ``i``, microseconds per record,
  for the photo and the glyph shards (every record read once before, untimed: the page
  cache is warm and the files are open).

Before the first round every loader is built and read for a few batches once,
untimed (what TensorFlow, OpenCV and the workers' imports load on first use is
charged to nobody). Every loader streams (``repeat=True``; the codelab's
``.repeat()``), so one iterator spans the pass: its build (``chute.load``'s call)
and its start (``iter()`` to the first batch: the Grain engine starts its worker
processes there, and again at every ``iter()``, i.e. every epoch without
``repeat``) are reported apart, then --warmup seconds of batches are read untimed,
then batches are timed for at least --seconds. tf.data datasets are read through
``.as_numpy_iterator()``, Grain datasets by iterating them (numpy batches).

CPU: user + system seconds of this process and of its child processes (the Grain
workers; ``child_processes`` also counts multiprocessing's resource tracker once a
Grain row has run) over the timed part, from psutil (``resource.getrusage`` without
it, which counts children only once they have exited), as % of one core.

Once per run: the size of an iterator's ``get_state()`` (bytes of ``json.dumps``) of the
Grain engine with workers=0 and workers=cores, after a few batches.

Worker processes are spawned: they import this file as a module, so everything here that
is not a definition stays under ``if __name__ == "__main__"``, and TensorFlow and chute
are imported inside the functions.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
PHOTO_BATCH, GLYPH_BATCH, SIZE = 64, 256, 224
SEED = 0


def cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


# -- data ---------------------------------------------------------------------------------------


def photo_shards(work: str, count: int) -> str:
    """``count`` camera-size photos (bench_photos.py's generator) and their shards at
    shorter side 256, JPEG (``chute convert`` in a fresh process), made once."""
    sys.path.insert(0, HERE)
    from bench_photos import make_photos

    src = make_photos(os.path.join(work, f"photos{count}"), count)
    out = os.path.join(work, f"photos{count}-shards256")
    if not os.path.exists(os.path.join(out, ".done")):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "chute", "-q", "convert", src, out, "--shorter-side", "256",
             "--encoding", "jpeg", "--no-progress", "--overwrite"],
            check=True,
        )  # fmt: skip
        print(f"converted {count} photos in {time.perf_counter() - started:.1f} s", flush=True)
        open(os.path.join(out, ".done"), "w").close()
    return out


def glyph_shards(work: str, classes: int, per_class: int) -> str:
    """Generated 100x100 glyph PNGs as 75x75 grayscale raw shards, made once."""
    import chute

    src = os.path.join(work, f"glyphs-{classes}x{per_class}")
    if not os.path.exists(os.path.join(src, ".complete")):
        shutil.rmtree(src, ignore_errors=True)
        chute.make_sample_folder(
            src, num_classes=classes, images_per_class=per_class, image_size=(100, 100),
            workers=cores(),
        )  # fmt: skip
        open(os.path.join(src, ".complete"), "w").close()
    out = src + "-shards75"
    if not os.path.exists(os.path.join(out, ".done")):
        chute.convert(
            src, out, image_size=75, color_mode="grayscale", encoding="raw", overwrite=True
        )
        open(os.path.join(out, ".done"), "w").close()
    return out


# -- loaders ------------------------------------------------------------------------------------


def tf_engine(shards: str, batch: int, **options):
    def make():
        import chute

        dataset = chute.load(shards, batch_size=batch, cache=None, repeat=True, seed=SEED,
                             **options)  # fmt: skip
        return dataset, lambda d: d.as_numpy_iterator()

    return make


def grain_engine(shards: str, batch: int, workers: int, **options):
    def make():
        import chute

        dataset = chute.load(shards, batch_size=batch, engine="grain", workers=workers,
                             repeat=True, seed=SEED, **options)  # fmt: skip
        return dataset, iter

    return make


def codelab(shards: str, batch: int):
    """The codelab's plain pipeline, unaugmented, no chute code (the file list excepted)."""

    def make():
        import tensorflow as tf

        import chute

        files = chute.load_manifest(shards).shard_paths("train")
        features = {
            "image": tf.io.FixedLenFeature([], tf.string),
            "class": tf.io.FixedLenFeature([], tf.int64),
        }

        def parse(record):
            example = tf.io.parse_single_example(record, features)
            image = tf.io.decode_jpeg(example["image"], channels=3)
            return tf.image.resize(image, [SIZE, SIZE]), example["class"]

        dataset = (
            tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
            .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
            .repeat()
            .batch(batch)
            .prefetch(tf.data.AUTOTUNE)
        )
        return dataset, lambda d: d.as_numpy_iterator()

    return make


# -- measuring ----------------------------------------------------------------------------------


@contextlib.contextmanager
def collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Cpu:
    """CPU seconds (user + system) of this process and its children between two points."""

    def __init__(self):
        try:
            import psutil
        except ImportError:
            psutil = None
        self.psutil = psutil
        self.start = self._snapshot()

    def _snapshot(self):
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        reaped = children.ru_utime + children.ru_stime
        if self.psutil is None:
            me = resource.getrusage(resource.RUSAGE_SELF)
            return {"self": me.ru_utime + me.ru_stime, "live": {}, "reaped": reaped}
        me = self.psutil.Process()
        live = {}
        for proc in me.children(recursive=True):
            with contextlib.suppress(self.psutil.Error):
                times = proc.cpu_times()
                live[proc.pid] = times.user + times.system
        times = me.cpu_times()
        return {"self": times.user + times.system, "live": live, "reaped": reaped}

    def used(self, wall: float) -> dict:
        end, start = self._snapshot(), self.start
        before, after = start["live"], end["live"]
        children = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
        gone = sum(seconds for pid, seconds in before.items() if pid not in after)
        children += end["reaped"] - start["reaped"] - gone
        main = end["self"] - start["self"]
        return {
            "cpu_s": main + children,
            "cpu_pct": round(100 * (main + children) / wall, 1),
            "cpu_main_pct": round(100 * main / wall, 1),
            "cpu_children_pct": round(100 * children / wall, 1),
            "child_processes": len(end["live"]),
        }


def close(iterator) -> None:
    closer = getattr(iterator, "close", None)
    if closer is not None:
        closer()


def stream(make, seconds: float, warmup: float) -> dict:
    """Builds a loader, starts it, reads --warmup seconds untimed, then times at least
    ``seconds`` of batches."""
    started = time.perf_counter()
    dataset, iterate = make()
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    iterator = iterate(dataset)
    batch = next(iterator)
    start_s = time.perf_counter() - started
    per_batch = int(batch[0].shape[0])
    until = time.perf_counter() + warmup
    while time.perf_counter() < until:
        next(iterator)
    with collector_off():
        cpu = Cpu()
        started = time.perf_counter()
        images = batches = 0
        while True:
            batch = next(iterator)
            images, batches = images + int(batch[0].shape[0]), batches + 1
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
        used = cpu.used(elapsed)
    started = time.perf_counter()
    close(iterator)
    del iterator, batch
    close_s = time.perf_counter() - started
    info = getattr(dataset, "chute", None)  # chute's LoadInfo: batches of an epoch
    steps = info.steps if info is not None else None
    result = {
        "images_per_s": images / elapsed,
        "images_per_cpu_s": images / max(used["cpu_s"], 1e-9),
        "seconds": elapsed,
        "batches": batches,
        "build_s": build_s,
        "start_s": start_s,
        "close_s": close_s,
        **used,
    }
    if steps:  # an epoch's length at this rate, against what its start costs
        result["epoch_s"] = steps * per_batch / result["images_per_s"]
    return result


def warm_up(rows: dict) -> None:
    """Every loader once, a few batches, untimed (first-use costs go to nobody)."""
    for kind, what in rows.values():
        if kind == "images":
            dataset, iterate = what()
            iterator = iterate(dataset)
            for _ in range(3):
                next(iterator)
            close(iterator)
            del iterator


def random_reads(shards: str, seconds: float) -> dict:
    """Microseconds per record of ``grain_source(shards)[i]`` at random ``i``."""
    import chute

    source = chute.grain_source(shards, "train")
    n = len(source)
    record_bytes = 0
    for i in range(n):  # untimed: page cache warm, files open
        record_bytes += len(source[i]["image"])
    rng = np.random.default_rng(SEED)
    with collector_off():
        cpu = Cpu()
        started, records = time.perf_counter(), 0
        while True:
            for i in rng.permutation(n).tolist():
                source[i]
            records += n
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
        used = cpu.used(elapsed)
    return {
        "us_per_record": 1e6 * elapsed / records,
        "records_per_s": records / elapsed,
        "records": n,
        "mean_image_bytes": record_bytes / n,
        "seconds": elapsed,
        **used,
    }


def state_size(shards: str, batch: int, workers: int, **options) -> dict:
    """``json.dumps(iterator.get_state())`` of the Grain engine after 3 batches."""
    import chute

    dataset = chute.load(shards, batch_size=batch, engine="grain", workers=workers, seed=SEED,
                         **options)  # fmt: skip
    iterator = iter(dataset)
    for _ in range(min(3, len(dataset))):
        next(iterator)
    state = iterator.get_state()
    try:
        text, exact = json.dumps(state), True
    except TypeError:  # not JSON as such: its repr's length instead
        text, exact = json.dumps(state, default=repr), False
    close(iterator)
    return {"bytes": len(text), "json_as_is": exact, "state": text[:600]}


# -- the run ------------------------------------------------------------------------------------


def rows_of(args, photos: str | None, glyphs: str | None) -> dict:
    n = cores()
    photo = {"image_size": SIZE, "augment": "crop,flip"}
    rows = {}
    others = not args.grain_workers_only  # the tf.data engine and the codelab too
    if photos and others:
        rows["photos: tf engine"] = ("images", tf_engine(photos, PHOTO_BATCH, **photo))
    if photos:
        rows[f"photos: grain engine, workers={n}"] = (
            "images",
            grain_engine(photos, PHOTO_BATCH, n, **photo),
        )
        rows["photos: grain engine, workers=0"] = (
            "images",
            grain_engine(photos, PHOTO_BATCH, 0, **photo),
        )
    if photos and others:
        rows["photos: codelab plain pipeline (no augmentation)"] = (
            "images",
            codelab(photos, PHOTO_BATCH),
        )
    if glyphs and others:
        rows["glyphs: tf engine"] = ("images", tf_engine(glyphs, GLYPH_BATCH))
    if glyphs:
        rows[f"glyphs: grain engine, workers={n}"] = (
            "images",
            grain_engine(glyphs, GLYPH_BATCH, n),
        )
        rows["glyphs: grain engine, workers=0"] = ("images", grain_engine(glyphs, GLYPH_BATCH, 0))
    if "reads" in args.only:
        for name, shards in (("photos", photos), ("glyphs", glyphs)):
            if shards:
                rows[f"random reads: {name}"] = ("reads", shards)
    return rows


def ratios_of(rates: dict) -> dict:
    n = cores()
    wanted = {
        f"photos: grain (workers={n}) / tf engine": (
            f"photos: grain engine, workers={n}",
            "photos: tf engine",
        ),
        f"photos: grain (workers={n}) / codelab": (
            f"photos: grain engine, workers={n}",
            "photos: codelab plain pipeline (no augmentation)",
        ),
        "photos: grain (workers=0) / tf engine": (
            "photos: grain engine, workers=0",
            "photos: tf engine",
        ),
        "photos: tf engine / codelab": (
            "photos: tf engine",
            "photos: codelab plain pipeline (no augmentation)",
        ),
        f"glyphs: grain (workers={n}) / tf engine": (
            f"glyphs: grain engine, workers={n}",
            "glyphs: tf engine",
        ),
        "glyphs: grain (workers=0) / tf engine": (
            "glyphs: grain engine, workers=0",
            "glyphs: tf engine",
        ),
        f"photos: grain threads (workers=0) / processes (workers={n})": (
            "photos: grain engine, workers=0",
            f"photos: grain engine, workers={n}",
        ),
        f"glyphs: grain threads (workers=0) / processes (workers={n})": (
            "glyphs: grain engine, workers=0",
            f"glyphs: grain engine, workers={n}",
        ),
    }
    ratios = {
        name: rates[top] / rates[bottom]
        for name, (top, bottom) in wanted.items()
        if top in rates and bottom in rates
    }
    for kind in ("photos", "glyphs"):  # what each image costs in CPU, not only in time
        threads, processes = (f"{kind}: grain engine, workers={w}" for w in (0, n))
        if f"{threads} per CPU-s" in rates and f"{processes} per CPU-s" in rates:
            ratios[f"{kind}: grain images per CPU-second, threads / processes"] = (
                rates[f"{threads} per CPU-s"] / rates[f"{processes} per CPU-s"]
            )
    return ratios


def machine() -> str:
    versions = []
    for module in ("tensorflow", "grain", "cv2", "PIL"):
        with contextlib.suppress(Exception):
            imported = __import__(module)
            version = getattr(imported, "__version__", None)
            if version is None:
                from importlib import metadata

                version = metadata.version(module)
            versions.append(f"{module} {version}")
    return (
        f"{platform.machine()}, {cores()} cores ({os.cpu_count()} in all), Python "
        f"{platform.python_version()}, " + ", ".join(versions)
    )


def table(summary: dict) -> str:
    lines = [
        "| row | images/s (per round) | images per CPU-s | CPU % (main + workers) | build s "
        "| start s | epoch s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in summary["rows"].items():
        if "images_per_s" not in row:
            continue
        rounds = ", ".join(f"{v:,.0f}" for v in row["rounds"])
        epoch = f"{row['epoch_s']:.2f}" if "epoch_s" in row else "-"
        lines.append(
            f"| {name} | {row['images_per_s']:,.0f} ({rounds}) | "
            f"{row.get('images_per_cpu_s', 0):,.0f} | {row['cpu_pct']:.0f} "
            f"({row['cpu_main_pct']:.0f} + {row['cpu_children_pct']:.0f}) | "
            f"{row['build_s']:.2f} | {row['start_s']:.2f} | {epoch} |"
        )
    lines += ["", "| ratio | median (per round) |", "|---|---:|"]
    for name, ratio in summary["ratios"].items():
        rounds = ", ".join(f"{v:.2f}" for v in ratio["rounds"])
        lines.append(f"| {name} | **{ratio['median']:.2f}** ({rounds}) |")
    reads = {k: v for k, v in summary["rows"].items() if "us_per_record" in v}
    if reads:
        lines += ["", "| random reads | µs / record (per round) | image bytes | CPU % |"]
        lines += ["|---|---:|---:|---:|"]
        for name, row in reads.items():
            rounds = ", ".join(f"{v:.1f}" for v in row["rounds"])
            lines.append(
                f"| {name} | {row['us_per_record']:.1f} ({rounds}) | "
                f"{row['mean_image_bytes']:,.0f} | {row['cpu_pct']:.0f} |"
            )
    if summary.get("get_state"):
        lines += ["", "| get_state() | JSON bytes |", "|---|---:|"]
        for name, state in summary["get_state"].items():
            note = "" if state["json_as_is"] else " (not JSON as is: repr)"
            lines.append(f"| {name} | {state['bytes']}{note} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-bench"))
    parser.add_argument("--photos", type=int, default=1600, help="camera-size JPEGs")
    parser.add_argument("--glyph-classes", type=int, default=657)
    parser.add_argument("--glyphs-per-class", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="rounds")
    parser.add_argument("--seconds", type=float, default=10.0, help="the shortest timed pass")
    parser.add_argument("--warmup", type=float, default=2.0, help="untimed seconds per pass")
    parser.add_argument(
        "--only", nargs="+", default=["photos", "glyphs", "reads", "state"],
        choices=("photos", "glyphs", "reads", "state"), help="run only these parts",
    )  # fmt: skip
    parser.add_argument(
        "--grain-workers-only", action="store_true",
        help="image rows: only the Grain engine's worker processes against its threads",
    )  # fmt: skip
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    os.makedirs(args.work_dir, exist_ok=True)
    photos = photo_shards(args.work_dir, args.photos) if "photos" in args.only else None
    glyphs = (
        glyph_shards(args.work_dir, args.glyph_classes, args.glyphs_per_class)
        if "glyphs" in args.only
        else None
    )
    if "reads" in args.only and not (photos or glyphs):
        parser.error("--only reads needs photos or glyphs too (their shards)")
    import tensorflow as tf  # noqa: F401  (imported before any timing, for every row)

    rows = rows_of(args, photos, glyphs)
    names = list(rows)
    started = time.perf_counter()
    warm_up(rows)
    print(f"warm-up (every loader once, untimed): {time.perf_counter() - started:.1f} s")
    runs = []
    for number in range(args.repeats):
        order = names if number % 2 == 0 else names[::-1]
        measured = {}
        for name in order:
            kind, what = rows[name]
            if kind == "reads":
                measured[name] = random_reads(what, args.seconds)
            else:
                measured[name] = stream(what, args.seconds, args.warmup)
            shown = {
                k: round(v, 3) if isinstance(v, float) else v for k, v in measured[name].items()
            }
            print(f"round {number + 1}: {name}: {json.dumps(shown)}", flush=True)
        rates = {k: v["images_per_s"] for k, v in measured.items() if "images_per_s" in v}
        rates.update(
            {f"{k} per CPU-s": v["images_per_cpu_s"] for k, v in measured.items()
             if "images_per_cpu_s" in v}
        )  # fmt: skip
        runs.append({"rows": measured, "ratios": ratios_of(rates)})

    n = cores()
    states = {}
    if "state" in args.only:
        for workers in (0, n):
            if photos:
                states[f"photos, workers={workers}"] = state_size(
                    photos, PHOTO_BATCH, workers, image_size=SIZE, augment="crop,flip"
                )
            if glyphs:
                states[f"glyphs, workers={workers}"] = state_size(glyphs, GLYPH_BATCH, workers)

    def median(values) -> float:
        return statistics.median(values)

    summary_rows = {}
    for name in names if runs else ():
        per_round = [run["rows"][name] for run in runs]
        keys = [k for k, v in per_round[0].items() if isinstance(v, (int, float))]
        summary_rows[name] = {k: median([r[k] for r in per_round if k in r]) for k in keys}
        main_key = "images_per_s" if "images_per_s" in per_round[0] else "us_per_record"
        summary_rows[name]["rounds"] = [r[main_key] for r in per_round]
    summary = {
        "machine": machine(),
        "seconds_per_pass_at_least": args.seconds,
        "warmup_s": args.warmup,
        "rounds": len(runs),
        "photos": args.photos if photos else None,
        "glyphs": args.glyph_classes * args.glyphs_per_class if glyphs else None,
        "rows": summary_rows,
        "ratios": {
            name: {
                "median": median([run["ratios"][name] for run in runs]),
                "rounds": [run["ratios"][name] for run in runs],
            }
            for name in runs[0]["ratios"]
        }
        if runs
        else {},
        "get_state": states,
    }
    print(json.dumps(summary, indent=1, default=float))
    print(table(summary))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"summary": summary, "runs": runs}, handle, indent=1)


if __name__ == "__main__":
    main()
