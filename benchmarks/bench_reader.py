"""Benchmark: chute.load and the drop-in against Keras's loaders, same data, same run.

    python benchmarks/bench_reader.py --json benchmarks/results/reader.json

Part 1 runs ``chute.bench.run`` (what ``chute bench`` prints) ``--repeats``
times on the 657-class glyph set of the convert benchmark (26,280 grayscale
100x100 PNGs, read at 75x75, batch 256) and keeps the median of each figure.

Part 2, the JPEG path: 224x224 RGB glyph photos stored as JPEG shards;
chute.load's steady decoding rate (no cache, all cores, three epochs timed
from the first batch) against one core of libjpeg-turbo (Pillow's decoder in
a plain loop over the same JPEG bytes) times the number of cores, alternating.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def reader(args) -> dict:
    from chute import bench

    runs = []
    for number in range(args.repeats):
        figures = bench.run(args.source, work_dir=args.work_dir, say=print)
        print(bench.table(figures), flush=True)
        runs.append(figures)
        print(f"-- run {number + 1} of {args.repeats} done", flush=True)
    medians = {
        name: round(statistics.median(r["ratios"][name] for r in runs), 2)
        for name in runs[0]["ratios"]
    }
    loaders = {}
    for row in runs[0]["loaders"]:
        rates = [
            next(x for x in r["loaders"] if x["name"] == row["name"])["images_per_s"] for r in runs
        ]
        loaders[row["name"]] = [round(statistics.median(p[i] for p in rates)) for i in range(2)]
    return {
        "runs": len(runs),
        "median_images_per_s": loaders,
        "median_ratios": medians,
        "all": runs,
    }


def jpeg(args) -> dict:
    import tensorflow as tf
    from PIL import Image

    import chute
    from chute.samples import make_sample_folder

    root = os.path.join(args.work_dir, "jpeg")
    src, shards = os.path.join(root, "src"), os.path.join(root, "shards")
    if not os.path.exists(os.path.join(root, ".complete")):
        make_sample_folder(
            src,
            num_classes=10,
            images_per_class=200,
            image_size=(224, 224),
            color_mode="rgb",
            image_format="jpg",
            noise=0.05,
        )
        chute.convert(
            src, shards, image_size=224, color_mode="rgb", encoding="jpeg", overwrite=True
        )
        open(os.path.join(root, ".complete"), "w").close()
    manifest = chute.load_manifest(shards)
    payloads = [
        tf.io.parse_single_example(r, {"image": tf.io.FixedLenFeature([], tf.string)})[
            "image"
        ].numpy()
        for p in manifest.shard_paths("train")
        for r in tf.data.TFRecordDataset(p)
    ]
    # Steady-state decoding rates, alternating: Pillow's libjpeg-turbo on one
    # core, and chute.load (all cores) over three epochs timed from its first
    # batch on, so the one-time start-up (about 0.1 s) is not charged to decoding.
    one_core, chute_rates, with_startup = [], [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        for data in payloads:
            Image.open(io.BytesIO(data)).load()
        one_core.append(len(payloads) / (time.perf_counter() - started))
        epochs = 3
        dataset = chute.load(shards, batch_size=64, cache=None, repeat=True)
        steps = epochs * len(payloads) // 64
        started = time.perf_counter()
        batches = iter(dataset.take(steps))
        first = int(next(batches)[0].shape[0])
        warm, n = time.perf_counter(), 0
        for images, _ in batches:
            n += int(images.shape[0])
        done = time.perf_counter()
        chute_rates.append(n / (done - warm))
        with_startup.append((n + first) / (done - started))
    cores = os.cpu_count() or 1
    single, ours = statistics.median(one_core), statistics.median(chute_rates)
    return {
        "runs": args.repeats,
        "images": len(payloads),
        "image": "224x224 RGB JPEG (quality 90)",
        "cores": cores,
        "libjpeg_turbo_one_core_per_s": round(single),
        "chute_load_per_s": round(ours),
        "ratio_to_one_core_times_cores": round(ours / (single * cores), 2),
        "chute_load_per_s_with_startup": round(statistics.median(with_startup)),
        "per_run": {
            "libjpeg_turbo_one_core_per_s": [round(r) for r in one_core],
            "chute_load_per_s": [round(r) for r in chute_rates],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", help="image folder (default: generated glyphs)")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-bench"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    figures = {"reader": reader(args), "jpeg": jpeg(args)}
    summary = {
        "median_images_per_s": figures["reader"]["median_images_per_s"],
        "median_ratios": figures["reader"]["median_ratios"],
        "jpeg": figures["jpeg"],
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=1)


if __name__ == "__main__":
    main()
