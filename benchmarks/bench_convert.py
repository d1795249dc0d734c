"""Benchmark: chute convert against a plain single-process loop, same data, same run.

    python benchmarks/bench_convert.py            # 131k images, 657 classes
    python benchmarks/bench_convert.py --memory   # also peak RSS at ~20k and ~200k images

The data: grayscale 100x100 PNG glyphs in 657 classes (the Kannada dataset that
motivates chute has 40 per class; 200 per class here, 131,400 images, so that
one conversion takes over 10 s and start-up costs weigh what they weigh on a
real dataset), generated once into --data. Both sides convert it to 75x75 raw
uint8 records:

* baseline: one process, PIL decode + resize, tf.train.Example, tf.io.TFRecordWriter;
* chute: ``chute.convert(..., workers=all cores)``, end to end (scan, hash, split,
  encode, write, manifest).

Runs alternate (baseline, chute, baseline, chute, ...) and the medians are compared.
"""

from __future__ import annotations

import argparse
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

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def make_data(root: str, classes: int, per_class: int, size: int) -> str:
    from chute import make_sample_folder

    marker = os.path.join(root, f".done-{classes}-{per_class}-{size}")
    if not os.path.exists(marker):
        shutil.rmtree(root, ignore_errors=True)
        make_sample_folder(
            root,
            num_classes=classes,
            images_per_class=per_class,
            image_size=(size, size),
            workers=os.cpu_count() or 1,
        )
        open(marker, "w").close()
    return root


def baseline(src: str, out: str) -> int:
    """The loop people write by hand: one process, PIL + tf.io.TFRecordWriter."""
    import tensorflow as tf
    from PIL import Image

    classes = sorted(d for d in os.listdir(src) if not d.startswith("."))
    count = 0
    with tf.io.TFRecordWriter(out) as writer:
        for label, name in enumerate(classes):
            folder = os.path.join(src, name)
            for file in sorted(os.listdir(folder)):
                image = Image.open(os.path.join(folder, file)).convert("L").resize((75, 75))
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(
                                bytes_list=tf.train.BytesList(value=[image.tobytes()])
                            ),
                            "class": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                        }
                    )
                )
                writer.write(example.SerializeToString())
                count += 1
    return count


def run_chute(src: str, out: str) -> int:
    import chute

    result = chute.convert(
        src,
        out,
        image_size=75,
        color_mode="grayscale",
        encoding="raw",
        val_fraction=0.01,
        overwrite=True,
    )
    return sum(result.num_written.values())


def speed(args) -> dict:
    import tensorflow as tf  # noqa: F401  (imported before timing, by both sides)

    src = make_data(os.path.join(args.data, f"kn{args.per_class}"), 657, args.per_class, 100)
    work = tempfile.mkdtemp(prefix="chute-bench-")
    times: dict[str, list[float]] = {"baseline": [], "chute": []}
    counts = {}
    for _ in range(args.repeats):
        for name, fn in (("baseline", baseline), ("chute", run_chute)):
            out = os.path.join(work, name)
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out, exist_ok=True) if name == "baseline" else None
            target = os.path.join(out, "all.tfrecord") if name == "baseline" else out
            started = time.perf_counter()
            counts[name] = fn(src, target)
            times[name].append(time.perf_counter() - started)
            print(f"{name}: {counts[name]} images in {times[name][-1]:.2f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    rate = {k: counts[k] / statistics.median(v) for k, v in times.items()}
    return {
        "images": counts["chute"],
        "runs": args.repeats,
        "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "images_per_s": {k: round(v) for k, v in rate.items()},
        "ratio_chute_vs_baseline": round(rate["chute"] / rate["baseline"], 2),
        "all_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            kids = [int(p) for p in handle.read().split()]
    except OSError:
        return []
    return kids + [grandchild for kid in kids for grandchild in _children(kid)]


def _peak_rss_child(src: str, out: str) -> None:
    """Runs inside a fresh interpreter: convert while sampling the RSS of this process
    and of its worker processes every 20 ms; report the peaks (Linux /proc)."""
    import threading

    import chute

    me, peaks, done = os.getpid(), {"main_mb": 0.0, "workers_mb": 0.0, "total_mb": 0.0}, False

    def sample() -> None:
        while not done:
            main = _rss_mb(me)
            workers = sum(_rss_mb(kid) for kid in _children(me))
            for key, value in (
                ("main_mb", main),
                ("workers_mb", workers),
                ("total_mb", main + workers),
            ):
                peaks[key] = max(peaks[key], value)
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    result = chute.convert(
        src, out, image_size=16, color_mode="grayscale", encoding="raw", overwrite=True
    )
    done = True
    thread.join()
    peaks = {key: round(value) for key, value in peaks.items()}
    peaks["images"] = sum(result.num_written.values())
    peaks["main_hwm_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(peaks))


def memory(args) -> dict:
    results = {}
    for total in (20_000, 200_000):
        per_class = total // 200
        src = make_data(os.path.join(args.data, f"mem{total}"), 200, per_class, 24)
        out = tempfile.mkdtemp(prefix="chute-mem-")
        proc = subprocess.run(
            [sys.executable, __file__, "--_rss-child", src, out],
            capture_output=True,
            text=True,
            check=True,
        )
        shutil.rmtree(out, ignore_errors=True)
        results[total] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{total} images: {results[total]}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "chute-bench-data"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=200, help="images per class (657)")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--_rss-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._rss_child:
        _peak_rss_child(*args._rss_child)
        return
    python = platform.python_version()
    figures = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {python}"}
    figures["speed"] = speed(args)
    if args.memory:
        figures["peak_rss"] = memory(args)
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=1)


if __name__ == "__main__":
    main()
