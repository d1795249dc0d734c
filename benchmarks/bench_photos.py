"""Benchmark: the photo path (convert camera-size JPEGs, read 224x224 JPEG shards, augment)
against the code people write by hand, same files, same run.

    python benchmarks/bench_photos.py --repeats 3 --json benchmarks/results/photos.json

Data (generated once into --data, no download): photo-like JPEGs of camera size
(1.6-2.4k px wide, 4:3 either way, quality 90: smooth gradients, shapes and
sensor-like noise), and the 657-class glyph PNG set of bench_convert.py.

Figures (ratios from one run; medians over --repeats; every timed pass >= 10 s):

1. convert photos -> 224x224 centre crop, JPEG, whole process (``chute convert`` in
   a fresh process, all cores) against a one-process Pillow + TFRecordWriter
   script (fresh process, importing TensorFlow for its writer); and against
   cores x the single-core rate of the fastest decode + resize + encode path
   measured here (Pillow with DCT-scaled decoding, OpenCV resize, Pillow
   encode), run in this process on the same files.
2. convert glyphs (26,280 PNG -> 75x75 raw), whole process, against the
   hand-written script of bench_convert.py in a fresh process.
3. read the 224x224 JPEG shards: ``chute.load`` (no cache) without augmentation,
   with ``["crop", "flip"]``, seeded, and with ``["flip", "rotation", "zoom",
   "contrast"]`` on the host, against the "Keras on TPU" codelab's plain
   pipeline (``TFRecordDataset(num_parallel_reads=AUTOTUNE)`` ->
   ``parse_single_example`` -> ``decode_jpeg`` -> ``batch``); the loaders take
   turns, three rounds per run, and each run reports each one's median.
4. how the pixels of DCT-scaled decoding compare with a full decode followed
   by the same resize (mean and 99th percentile of the absolute difference).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 64


def make_photos(root: str, count: int) -> str:
    """``count`` camera-size, photo-like JPEGs in 4 classes (once)."""
    from PIL import Image, ImageDraw

    marker = os.path.join(root, f".done-{count}")
    if os.path.exists(marker):
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    for number in range(count):
        width = int(rng.integers(1600, 2401))
        height = width * 3 // 4
        if number % 3 == 0:
            width, height = height, width
        y, x = np.mgrid[0:height:4, 0:width:4].astype(np.float32)
        phase = rng.uniform(0, 6.3, 3)
        small = np.stack(
            [120 + 90 * np.sin(x / rng.uniform(40, 120) + y / rng.uniform(50, 150) + p)
             for p in phase], -1,
        )  # fmt: skip
        image = Image.fromarray(np.clip(small, 0, 255).astype(np.uint8)).resize((width, height))
        draw = ImageDraw.Draw(image)
        for _ in range(12):
            box = sorted(rng.integers(0, width, 2)), sorted(rng.integers(0, height, 2))
            colour = tuple(int(v) for v in rng.integers(0, 256, 3))
            draw.ellipse((box[0][0], box[1][0], box[0][1], box[1][1]), fill=colour)
        pixels = np.asarray(image, np.int16) + rng.normal(0, 6, (height, width, 3)).astype(np.int16)
        folder = os.path.join(root, f"class{number % 4}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            os.path.join(folder, f"{number:05d}.jpg"), quality=90
        )
    open(marker, "w").close()
    return root


PHOTO_BASELINE = r"""
import os, sys
import tensorflow as tf
from PIL import Image
src, out = sys.argv[1], sys.argv[2]
classes = sorted(d for d in os.listdir(src) if not d.startswith("."))
with tf.io.TFRecordWriter(out) as writer:
    for label, name in enumerate(classes):
        folder = os.path.join(src, name)
        for file in sorted(os.listdir(folder)):
            image = Image.open(os.path.join(folder, file)).convert("RGB")
            w, h = image.size
            side = min(w, h)
            left, top = (w - side) // 2, (h - side) // 2
            image = image.crop((left, top, left + side, top + side)).resize((224, 224))
            import io
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=90)
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[buffer.getvalue()])),
                "class": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())
"""


def warm(folder: str) -> None:
    """Reads every file under ``folder`` once, so that both sides start from the page cache."""
    for directory, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                while handle.read(1 << 20):
                    pass


def whole_process(command: list[str], source: str) -> float:
    """Seconds of a command in a fresh process, start to end (its source read once before)."""
    warm(source)
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def fastest_single_core(files: list[str], seconds: float) -> float:
    """Images/s of decode (DCT-scaled) + centre crop + resize + JPEG encode on one core."""
    import cv2
    from PIL import Image

    cv2.setNumThreads(1)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for path in files:
            image = Image.open(path)
            w, h = image.size
            side = min(w, h)
            image.draft("RGB", (224 * w // side, 224 * h // side))
            pixels = np.asarray(image.convert("RGB"))
            h, w = pixels.shape[:2]
            side = min(w, h)
            top, left = (h - side) // 2, (w - side) // 2
            crop = pixels[top : top + side, left : left + side]
            small = cv2.resize(crop, (224, 224), interpolation=cv2.INTER_LINEAR)
            Image.fromarray(small).save(io.BytesIO(), format="JPEG", quality=90)
            done += 1
    return done / (time.perf_counter() - started)


def convert_photos(photos: str, work: str, seconds: float) -> dict:
    files = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(photos) for f in fs if f.endswith(".jpg")
    )
    n = len(files)
    out = os.path.join(work, "photo-shards")
    shutil.rmtree(out, ignore_errors=True)
    chute_s = whole_process(
        [sys.executable, "-m", "chute", "-q", "convert", photos, out, "--image-size", "224",
         "--resize", "crop", "--encoding", "jpeg", "--no-progress"], photos,
    )  # fmt: skip
    base_out = os.path.join(work, "photo-baseline.tfrecord")
    baseline_s = whole_process([sys.executable, "-c", PHOTO_BASELINE, photos, base_out], photos)
    single = fastest_single_core(files[:60], seconds)
    cores = os.cpu_count() or 1
    return {
        "images": n,
        "chute_per_s": n / chute_s,
        "baseline_per_s": n / baseline_s,
        "fastest_path_one_core_per_s": single,
        "ratio_chute_vs_baseline": baseline_s / chute_s,
        "share_of_cores_x_fastest_path": (n / chute_s) / (cores * single),
        "shards": out,
    }


def convert_glyphs(data: str, work: str) -> dict:
    sys.path.insert(0, HERE)
    from bench_convert import make_data

    src = make_data(os.path.join(data, "kn40"), 657, 40, 100)
    out = os.path.join(work, "glyph-shards")
    shutil.rmtree(out, ignore_errors=True)
    chute_s = whole_process(
        [sys.executable, "-m", "chute", "-q", "convert", src, out, "--image-size", "75",
         "--color-mode", "grayscale", "--encoding", "raw", "--val-fraction", "0.01",
         "--no-progress"], src,
    )  # fmt: skip
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); from bench_convert import baseline; "
        "baseline(sys.argv[2], sys.argv[3])"
    )
    base_out = os.path.join(work, "glyph-baseline.tfrecord")
    baseline_s = whole_process([sys.executable, "-c", script, HERE, src, base_out], src)
    return {
        "images": 26280,
        "chute_s": chute_s,
        "baseline_s": baseline_s,
        "ratio_chute_vs_baseline": baseline_s / chute_s,
    }


def timed(make, seconds: float) -> float:
    """Images/s over epochs of a dataset built once, for at least ``seconds``."""
    import gc

    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        dataset, images = make(), 0
        while time.perf_counter() - started < seconds:
            for batch in dataset:
                images += int(batch[0].shape[0])
        return images / (time.perf_counter() - started)
    finally:
        gc.enable()


def read(shards: str, seconds: float) -> dict:
    import tensorflow as tf

    import chute

    manifest = chute.load_manifest(shards)
    files = manifest.shard_paths("train")
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "class": tf.io.FixedLenFeature([], tf.int64),
    }

    def codelab():
        def parse(record):
            example = tf.io.parse_single_example(record, features)
            image = tf.reshape(tf.io.decode_jpeg(example["image"], channels=3), [224, 224, 3])
            return image, example["class"]

        dataset = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
        return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)

    def load(**options):
        return lambda: chute.load(shards, batch_size=BATCH, cache=None, **options)

    makers = {
        "codelab plain pipeline": codelab,
        "chute.load": load(),
        "chute.load crop+flip": load(augment=["crop", "flip"]),
        "chute.load crop+flip seeded": load(augment=["crop", "flip"], seed=1),
        "chute.load flip+rotation+zoom+contrast (host)": load(
            augment=["flip", "rotation", "zoom", "contrast"], augment_on="host"
        ),
    }
    for make in makers.values():  # warm-up
        for _ in make().take(3):
            pass
    # The loaders take turns, three rounds: the machine's speed drifts within a run.
    measured = {name: [] for name in makers}
    for _ in range(3):
        for name, make in makers.items():
            measured[name].append(timed(make, seconds))
    rates = {name: statistics.median(values) for name, values in measured.items()}
    base = rates["codelab plain pipeline"]
    unaugmented = rates["chute.load"]
    return {
        "images_per_s": rates,
        "ratios": {
            "chute.load / codelab": unaugmented / base,
            "crop+flip / codelab": rates["chute.load crop+flip"] / base,
            "crop+flip seeded / codelab": rates["chute.load crop+flip seeded"] / base,
            "host flip+rotation+zoom+contrast / chute.load": rates[
                "chute.load flip+rotation+zoom+contrast (host)"
            ]
            / unaugmented,
        },
    }


def pixels(photos: str) -> dict:
    """DCT-scaled decode + resize against a full decode + the same resize."""
    from PIL import Image, ImageOps

    from chute.format.spec import ImageSpec
    from chute.image.decode import load_pixels
    from chute.image.resize import resize

    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(photos) for f in fs)[:40]
    spec = ImageSpec(224, 224, 3, "raw", resize="crop")
    differences = []
    for path in files:
        if not path.endswith(".jpg"):
            continue
        scaled, _ = load_pixels(path, spec)
        image = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
        full = resize(np.asarray(image), 224, 224, "crop", "bilinear")
        differences.append(np.abs(scaled.astype(int) - full.astype(int)).ravel())
    everything = np.concatenate(differences)
    return {
        "mean_abs_difference": float(everything.mean()),
        "p99_abs_difference": float(np.percentile(everything, 99)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "chute-bench-data"))
    parser.add_argument("--photos", type=int, default=1600, help="camera-size JPEGs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="the shortest timed pass")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--only", nargs="+", choices=("convert_photos", "convert_glyphs", "read"),
        help="run only these parts (read needs convert_photos's shards)",
    )  # fmt: skip
    args = parser.parse_args()
    parts = set(args.only or ("convert_photos", "convert_glyphs", "read"))
    photos = make_photos(os.path.join(args.data, f"photos{args.photos}"), args.photos)
    work = tempfile.mkdtemp(prefix="chute-photos-")
    runs = []
    try:
        for number in range(args.repeats):
            converted = convert_photos(photos, work, args.seconds)
            shards = converted.pop("shards")
            run = {}
            if "convert_photos" in parts:
                run["convert_photos"] = converted
            if "convert_glyphs" in parts:
                run["convert_glyphs"] = convert_glyphs(args.data, work)
            if "read" in parts:
                run["read"] = read(shards, args.seconds)
            runs.append(run)
            print(f"-- run {number + 1} of {args.repeats}: {json.dumps(run)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def median(path: list[str]) -> float:
        values = []
        for run in runs:
            value = run
            for key in path:
                value = value[key]
            values.append(value)
        return round(statistics.median(values), 3)

    summary = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "runs": len(runs),
        "pixels": pixels(photos),
    }
    for part in ("convert_photos", "convert_glyphs"):
        if part in parts:
            summary[part] = {k: median([part, k]) for k in runs[0][part]}
    if "read" in parts:
        for key in ("images_per_s", "ratios"):
            summary[f"read_{key}"] = {k: median(["read", key, k]) for k in runs[0]["read"][key]}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"summary": summary, "runs": runs}, handle, indent=1)


if __name__ == "__main__":
    main()
