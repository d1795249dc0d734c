"""Benchmark: is training the Kannada-sized CNN on this CPU ever waiting for chute.load?

    python benchmarks/bench_train.py --json benchmarks/results/train.json

The same model (``kannada-cnn``, 75x75 grayscale, 657 classes, batch 128) trains
for ``--steps`` steps per measurement, fed either by ``chute.load`` streaming
from the raw shards (``cache=None``: the slowest way chute feeds) or by an
in-memory ``Dataset.from_tensor_slices`` of the same decoded images (input
costs ~nothing). The input-bound share of step time is
``1 - time_in_memory / time_chute`` (medians of alternating runs). Then the
in-memory run is repeated under ``mixed_bfloat16`` to compare precisions.

Shards come from the convert benchmark's data (``--shards``), or are made
from the generated glyph set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", help="a converted 75x75 grayscale dataset")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-bench"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    import chute

    shards = args.shards
    if shards is None:
        src = os.path.join(args.work_dir, "glyphs-657")
        if not os.path.exists(os.path.join(src, ".complete")):
            chute.make_sample_folder(
                src, num_classes=657, images_per_class=40, image_size=(100, 100)
            )
            open(os.path.join(src, ".complete"), "w").close()
        shards = os.path.join(args.work_dir, "shards")
        chute.convert(
            src, shards, image_size=75, color_mode="grayscale", encoding="raw", overwrite=True
        )
    manifest = chute.load_manifest(shards)
    batch, steps = args.batch_size, args.steps

    # The same decoded images, in memory, for the baseline.
    images, labels = [], []
    for x, y in chute.load(shards, batch_size=1024, training=False, cache=None):
        images.append(x.numpy())
        labels.append(y.numpy())
    images, labels = np.concatenate(images), np.concatenate(labels)

    def in_memory():
        return (
            tf.data.Dataset.from_tensor_slices((images, labels))
            .shuffle(len(labels))
            .repeat()
            .batch(batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )

    def streaming():
        return chute.load(shards, batch_size=batch, cache=None, repeat=True)

    def model(policy: str):
        keras.mixed_precision.set_global_policy(policy)
        built = chute.build_model(
            "kannada-cnn", input_shape=images.shape[1:], num_classes=manifest.num_classes
        )
        built.compile("adam", "sparse_categorical_crossentropy", jit_compile=False)
        return built

    def timed(built, dataset) -> float:
        built.fit(dataset, steps_per_epoch=3, epochs=1, verbose=0)  # compile, warm up
        started = time.perf_counter()
        built.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
        return time.perf_counter() - started

    runs = {"chute.load (cache=None)": [], "in-memory": [], "in-memory, mixed_bfloat16": []}
    for number in range(args.repeats):
        f32 = model("float32")
        runs["chute.load (cache=None)"].append(timed(f32, streaming()))
        runs["in-memory"].append(timed(f32, in_memory()))
        runs["in-memory, mixed_bfloat16"].append(timed(model("mixed_bfloat16"), in_memory()))
        keras.mixed_precision.set_global_policy("float32")
        print({k: round(v[-1], 2) for k, v in runs.items()}, f"run {number + 1}", flush=True)
    median = {k: statistics.median(v) for k, v in runs.items()}
    per_s = {k: round(steps * batch / v) for k, v in median.items()}
    figures = {
        "steps": steps,
        "batch_size": batch,
        "images": steps * batch,
        "median_s": {k: round(v, 3) for k, v in median.items()},
        "images_per_s": per_s,
        "input_bound_share": round(1 - median["in-memory"] / median["chute.load (cache=None)"], 4),
        "bfloat16_vs_float32": round(median["in-memory"] / median["in-memory, mixed_bfloat16"], 2),
        "all_s": {k: [round(x, 3) for x in v] for k, v in runs.items()},
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=1)


if __name__ == "__main__":
    main()
