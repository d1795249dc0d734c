"""Benchmark: does ``chute convert`` use every core on photos? Images/s and CPU use per
worker count, against what the cores can do, measured side by side in one run.

    python benchmarks/bench_workers.py --repeats 3 --json benchmarks/results/workers.json

Data: camera-size photo-like JPEGs (1.6-2.4k px, made once into --data by
bench_photos.py's generator), converted to 224x224 centre-cropped JPEG shards.

Per round (rounds alternate, so drift hits every figure alike):

1. the limit: the fastest single-core decode (DCT-scaled) + crop + resize + JPEG
   encode loop, alone (one process) and as ``cores`` copies side by side
   (separate processes, at the same time): their summed images/s is what the
   cores can do;
2. ``chute convert --workers N`` for N = 1 .. cores, each a fresh process timed
   whole (start-up included), its CPU time (user + system of it and its
   workers) read from ``resource.getrusage(RUSAGE_CHILDREN)``.

Reported: images/s and CPU use (% of one core) per worker count, the speed-up
over one worker, and each as a share of ``cores x`` the single-loop rate (the
target of issue 19: >= 0.8 with every core) and of the side-by-side limit.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_photos import fastest_single_core, make_photos, warm  # noqa: E402

LOOP = """
import json, sys
sys.path.insert(0, {here!r})
from bench_photos import fastest_single_core
print(json.dumps(fastest_single_core(json.loads(sys.argv[1]), float(sys.argv[2]))))
"""


def side_by_side(files: list[str], copies: int, seconds: float) -> list[float]:
    """Images/s of ``copies`` single-core loops run at the same time in separate processes."""
    code = LOOP.format(here=HERE)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(files), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(copies)
    ]
    return [float(proc.communicate()[0]) for proc in procs]


def convert(photos: str, out: str, workers: int) -> dict:
    """One ``chute convert --workers N`` in a fresh process: wall seconds and CPU seconds."""
    shutil.rmtree(out, ignore_errors=True)
    warm(photos)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "chute", "-q", "convert", photos, out, "--image-size", "224",
         "--resize", "crop", "--encoding", "jpeg", "--no-progress", "--workers", str(workers)],
        check=True, capture_output=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"seconds": wall, "cpu_seconds": cpu}


def one_round(photos: str, files: list[str], work: str, cores: int, seconds: float) -> dict:
    sample = files[:60]
    alone = fastest_single_core(sample, seconds)
    together = side_by_side(sample, cores, seconds)
    run = {
        "single_loop_per_s": alone,
        "side_by_side_per_s": sum(together),
        "side_by_side_each_per_s": together,
        "workers": {},
    }
    for workers in range(1, cores + 1):
        timed = convert(photos, os.path.join(work, f"out-{workers}"), workers)
        rate = len(files) / timed["seconds"]
        run["workers"][str(workers)] = {
            "images_per_s": rate,
            "cpu_percent": 100 * timed["cpu_seconds"] / timed["seconds"],
            "seconds": timed["seconds"],
            "share_of_cores_x_single_loop": rate / (workers * alone),
            "share_of_side_by_side": rate / sum(together) if workers == cores else None,
        }
    one = run["workers"]["1"]["images_per_s"]
    for figures in run["workers"].values():
        figures["speedup_over_1_worker"] = figures["images_per_s"] / one
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "chute-bench-data"))
    parser.add_argument("--photos", type=int, default=2400, help="camera-size JPEGs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="each single-core loop")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    photos = make_photos(os.path.join(args.data, f"photos{args.photos}"), args.photos)
    files = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(photos) for f in fs if f.endswith(".jpg")
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    work = tempfile.mkdtemp(prefix="chute-workers-")
    runs = []
    try:
        for number in range(args.repeats):
            runs.append(one_round(photos, files, work, cores, args.seconds))
            print(f"-- run {number + 1} of {args.repeats}: {json.dumps(runs[-1])}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def median(pick) -> float:
        return round(statistics.median(pick(run) for run in runs), 3)

    summary = {
        "machine": f"{platform.machine()}, {cores} cores, Python {platform.python_version()}",
        "runs": len(runs),
        "images": len(files),
        "single_loop_per_s": median(lambda r: r["single_loop_per_s"]),
        "side_by_side_per_s": median(lambda r: r["side_by_side_per_s"]),
        "workers": {
            n: {
                key: median(lambda r, n=n, key=key: r["workers"][n][key])
                for key in runs[0]["workers"][n]
                if runs[0]["workers"][n][key] is not None
            }
            for n in runs[0]["workers"]
        },
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"summary": summary, "runs": runs}, handle, indent=1)


if __name__ == "__main__":
    main()
