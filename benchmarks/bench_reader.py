"""Benchmark: chute.load and the drop-in against Keras's loaders, same data, same run.

    python benchmarks/bench_reader.py --repeats 3 --json benchmarks/results/reader.json

Every figure comes from a timed pass of at least ``--seconds`` (10 by
default): a loader is iterated epoch after epoch until that much time has
passed, so one-time costs (building the dataset, tracing its functions)
weigh what they weigh in a real training run. Data (generated once, no
download):

* glyphs: the 657-class set of the convert benchmark (26,280 grayscale
  100x100 PNGs), read at 75x75, batch 256. chute reads raw shards written by
  ``chute.convert``; the Keras loaders read the PNG folder.
* JPEG: 2,000 224x224 RGB images stored as JPEG records (quality 90);
  chute.load's rate (no cache, all cores) against one core of libjpeg-turbo
  (Pillow decoding the same bytes in a plain loop) times the number of cores.

Loaders are timed with Python's garbage collector off, as ``timeit`` does.
Only chute's public API is used, so the same script measures any version of
chute (see ``compare.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCH = 256


@contextlib.contextmanager
def collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def timed(make, seconds: float, images_of=lambda batch: int(batch[0].shape[0])) -> dict:
    """Builds a dataset and iterates it, epoch after epoch, for at least ``seconds``."""
    with collector_off():
        started = time.perf_counter()
        dataset = make()
        images = epochs = 0
        while True:
            for batch in dataset:
                images += images_of(batch)
            epochs += 1
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
    return {"images_per_s": images / elapsed, "seconds": elapsed, "epochs": epochs}


def first_epochs(make, count: int) -> dict:
    """``count`` fresh datasets, one epoch each, build included: a short pass's cost."""
    rates = []
    with collector_off():
        for _ in range(count):
            started = time.perf_counter()
            images = sum(int(batch[0].shape[0]) for batch in make())
            rates.append(images / (time.perf_counter() - started))
    return {"images_per_s": statistics.median(rates), "runs": count}


def idg_timed(src: str, seconds: float) -> dict | None:
    try:
        import scipy  # noqa: F401  (ImageDataGenerator's transforms need it)
        from tf_keras.preprocessing.image import ImageDataGenerator
    except ImportError:
        return None
    with collector_off():
        started = time.perf_counter()
        flow = ImageDataGenerator().flow_from_directory(
            src, target_size=(75, 75), color_mode="grayscale", batch_size=BATCH,
            class_mode="sparse",
        )  # fmt: skip
        images = 0
        while time.perf_counter() - started < seconds:
            for _ in range(len(flow)):
                images += len(next(flow)[0])
        elapsed = time.perf_counter() - started
    return {"images_per_s": images / elapsed, "seconds": elapsed}


def glyph_data(work: str) -> tuple[str, str]:
    import chute

    src = os.path.join(work, "glyphs-657")
    if not os.path.exists(os.path.join(src, ".complete")):
        chute.make_sample_folder(
            src, num_classes=657, images_per_class=40, image_size=(100, 100),
            workers=os.cpu_count() or 1,
        )  # fmt: skip
        open(os.path.join(src, ".complete"), "w").close()
    shards = os.path.join(work, f"glyph-shards-{os.getpid()}")
    chute.convert(src, shards, image_size=75, color_mode="grayscale", encoding="raw",
                  overwrite=True)  # fmt: skip
    os.sync()
    return src, shards


def jpeg_data(work: str) -> str:
    import chute

    root = os.path.join(work, "jpeg")
    src = os.path.join(root, "src")
    if not os.path.exists(os.path.join(src, ".complete")):
        chute.make_sample_folder(
            src, num_classes=10, images_per_class=200, image_size=(224, 224),
            color_mode="rgb", image_format="jpg", noise=0.05,
        )  # fmt: skip
        open(os.path.join(src, ".complete"), "w").close()
    shards = os.path.join(root, f"shards-{os.getpid()}")
    chute.convert(src, shards, image_size=224, color_mode="rgb", encoding="jpeg", overwrite=True)
    os.sync()
    return shards


def glyph_run(src: str, shards: str, seconds: float) -> dict:
    import keras
    import tensorflow as tf

    import chute

    def load(**options):
        return lambda: chute.load(shards, batch_size=BATCH, **options)

    # warm-up: what TensorFlow loads on first use is charged to nobody
    for cache in (None, "memory"):
        first_epochs(load(cache=cache), 2)
    size = (75, 75)
    rows = {
        "chute.load, cache=None": timed(load(cache=None), seconds),
        "chute.load, cache='memory'": timed(load(cache="memory"), seconds),
        "chute.load, first epoch with build, cache=None": first_epochs(load(cache=None), 20),
        "chute.image_dataset_from_directory": timed(
            lambda: chute.image_dataset_from_directory(
                src, image_size=size, color_mode="grayscale", batch_size=BATCH, verbose=False
            ),
            seconds,
        ),
        "keras image_dataset_from_directory": timed(
            lambda: keras.utils.image_dataset_from_directory(
                src, image_size=size, color_mode="grayscale", batch_size=BATCH, verbose=False
            ),
            seconds,
        ),
    }
    idg = idg_timed(src, seconds)
    if idg is not None:
        rows["tf_keras ImageDataGenerator"] = idg
    n = chute.load_manifest(shards).num_examples("train")
    images, labels = tf.zeros((n, *size, 1), tf.uint8), tf.zeros((n,), tf.int32)
    rows["in-memory Dataset.from_tensor_slices"] = timed(
        lambda: (
            tf.data.Dataset.from_tensor_slices((images, labels))
            .shuffle(n)
            .batch(BATCH, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        ),
        seconds,
    )
    rate = {name: row["images_per_s"] for name, row in rows.items()}
    keras_rate = rate["keras image_dataset_from_directory"]
    ratios = {
        "chute.load cache=None / keras": rate["chute.load, cache=None"] / keras_rate,
        "chute.load cache=memory / keras": rate["chute.load, cache='memory'"] / keras_rate,
        "chute.load cache=memory / from_tensor_slices": rate["chute.load, cache='memory'"]
        / rate["in-memory Dataset.from_tensor_slices"],
        "drop-in / keras": rate["chute.image_dataset_from_directory"] / keras_rate,
    }
    if idg is not None:
        ratios["chute.load cache=None / ImageDataGenerator"] = (
            rate["chute.load, cache=None"] / rate["tf_keras ImageDataGenerator"]
        )
    return {"loaders": rows, "ratios": ratios}


def jpeg_run(shards: str, seconds: float) -> dict:
    import tensorflow as tf
    from PIL import Image

    import chute

    manifest = chute.load_manifest(shards)
    feature = {"image": tf.io.FixedLenFeature([], tf.string)}
    payloads = [
        tf.io.parse_single_example(record, feature)["image"].numpy()
        for path in manifest.shard_paths("train")
        for record in tf.data.TFRecordDataset(path)
    ]
    with collector_off():
        started, decoded = time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            for data in payloads:
                Image.open(io.BytesIO(data)).load()
            decoded += len(payloads)
        one_core = decoded / (time.perf_counter() - started)
    ours = timed(lambda: chute.load(shards, batch_size=64, cache=None), seconds)
    cores = os.cpu_count() or 1
    return {
        "libjpeg_turbo_one_core_per_s": one_core,
        "chute_load_per_s": ours["images_per_s"],
        "ratio_to_one_core_times_cores": ours["images_per_s"] / (one_core * cores),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-bench"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="the shortest timed pass")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    import shutil

    import tensorflow as tf

    os.makedirs(args.work_dir, exist_ok=True)
    src, shards = glyph_data(args.work_dir)
    jpeg_shards = jpeg_data(args.work_dir)
    runs = []
    for number in range(args.repeats):
        runs.append({"glyphs": glyph_run(src, shards, args.seconds),
                     "jpeg": jpeg_run(jpeg_shards, args.seconds)})  # fmt: skip
        print(f"-- run {number + 1} of {args.repeats}: {json.dumps(runs[-1])}", flush=True)
    shutil.rmtree(shards, ignore_errors=True)
    shutil.rmtree(jpeg_shards, ignore_errors=True)

    def median(get) -> float:
        return round(statistics.median(get(run) for run in runs), 2)

    first = runs[0]["glyphs"]
    summary = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, TF {tf.__version__}",
        "seconds_per_pass_at_least": args.seconds,
        "runs": len(runs),
        "median_images_per_s": {
            name: round(median(lambda r, n=name: r["glyphs"]["loaders"][n]["images_per_s"]))
            for name in first["loaders"]
        },
        "median_ratios": {
            name: median(lambda r, n=name: r["glyphs"]["ratios"][n]) for name in first["ratios"]
        },
        "jpeg": {key: median(lambda r, k=key: r["jpeg"][k]) for key in runs[0]["jpeg"]},
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"summary": summary, "runs": runs}, handle, indent=1)


if __name__ == "__main__":
    main()
