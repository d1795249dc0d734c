"""Benchmark: chute's two engines against every peer reading the same photos, per CPU-second
(issue #29 item 1).

    python benchmarks/bench_peers.py --rounds 3 --json benchmarks/results/peers.json
    python benchmarks/bench_peers.py --workload glyphs --json benchmarks/results/peers-glyphs.json
    make bench-peers

Data (made once under --work-dir, no download):

* photos: --images photo-like JPEGs (bench_service.py's generator: 640-1024 px wide, 4:3
  either way, quality 90, 4 classes; files already made by bench_remote.py or
  bench_service.py are linked, not made again), converted with ``chute.convert(src, out,
  shorter_side=256, encoding="jpeg", min_shards=--shards)``. Read as photos are trained:
  random-resized crop to 224 (scale 0.08-1, ratio 3/4-4/3) + horizontal flip, batch 128.
* glyphs (``--workload glyphs``): ``chute.make_sample_folder`` glyphs (--glyph-classes x
  --glyphs-per-class, 100x100) converted to 75x75 grayscale twice, ``encoding="raw"`` and
  ``encoding="png"``; read at 75x75 with a flip only, batch 256.

Every peer stores the same encoded images (the bytes of chute's records, in record order;
FFCV's writer takes pixels and encodes them itself) in its own format with its own writer;
the conversion time and bytes of each format are a column (chute's is ``chute convert``
from the source files: decode, resize, encode; the others write bytes already encoded).

Rows (2 workers, processes or threads, each; output checked: every batch counted, the
first one's shape and dtype compared with what the row must yield):

* chute tf engine: ``chute.load(shards, engine="tf", cache=None, repeat=True,
  image_size=224, augment="crop,flip")``.
* chute grain engine: the same with ``engine="grain", workers=2``.
* codelab tf.data: the "Keras on TPU" codelab's reader (``TFRecordDataset`` ->
  ``parse_single_example`` -> ``decode_jpeg``) with the crop and flip written by hand
  (``sample_distorted_bounding_box`` -> ``slice`` -> ``tf.image.resize`` -> flip -> uint8),
  ``num_parallel_calls=2``.
* Grain + ArrayRecord + OpenCV: ``ArrayRecordWriter`` files, ``grain.MapDataset`` over
  ``ArrayRecordDataSource`` (global shuffle, ``random_map`` decoding with ``cv2.imdecode``,
  the window, ``cv2.resize``, flip), ``mp_prefetch`` with 2 workers.
* MosaicML Streaming + torchvision: ``MDSWriter`` shards, ``StreamingDataset`` in a torch
  ``DataLoader(num_workers=2)``, Pillow decode, torchvision's ``RandomResizedCrop`` window
  and Pillow bilinear resize, flip (bench_remote.py's ``random_resized_crop``: the
  torchvision wheel of the peer virtualenv does not import beside a CPU-only torch).
* WebDataset + torchvision: ``ShardWriter`` tar shards, ``WebDataset(resampled=True)`` ->
  ``shuffle(1000)`` -> the same decode and crop -> ``batched`` in a ``WebLoader`` with 2
  workers.
* DALI (CPU): ``tfrecord2idx`` indexes chute's own shards; ``fn.readers.tfrecord`` ->
  ``fn.decoders.image_random_crop`` (libjpeg-turbo, decodes the window only) ->
  ``fn.resize`` -> ``fn.flip``, ``device_id=None``, ``num_threads=2``.
* FFCV: its ``DatasetWriter`` (``RGBImageField(write_mode="jpg", jpeg_quality=90)``) and
  ``Loader`` (``RandomResizedCropRGBImageDecoder``, ``RandomHorizontalFlip``, 2 workers),
  when it installs (it compiles against OpenCV and libjpeg-turbo found by pkg-config).
* limit x1: one process, no framework: records in memory, ``simplejpeg`` (libjpeg-turbo)
  decode of the whole image, DCT-scaled when the window allows, crop, ``cv2.resize``
  (``INTER_AREA`` shrinking, ``INTER_LINEAR`` enlarging), flip, into a preallocated batch.
* limit x2: two such processes side by side (what 2 cores can do at best).

Each row is a fresh process per round (the peers run in --peer-venv, made and filled when
missing, never in chute's virtualenv); the rows take turns, order reversed every other
round. A pass builds the loader, reads --warmup seconds untimed, then times batches for at
least --seconds. Per pass: images/s, and images per CPU-second of the whole process tree
(user + system of the pass's process and all its children, bench_grain.py's ``Cpu``);
per row the median over rounds, and the median of the per-round ratios to chute's tf
engine. Spawned worker processes import this file: nothing runs at import.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import io
import itertools
import json
import math
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
WORKERS, SIZE, SEED = 2, 224, 0
BATCH = {"photos": 128, "glyphs": 256}
PEER_PACKAGES = ["mosaicml-streaming", "psutil", "webdataset", "simplejpeg",
                 "opencv-python-headless", "nvidia-dali-cuda120"]  # fmt: skip
FFCV_PACKAGE = "ffcv==1.0.2"
# row -> (interpreter: "chute" or "peer", format, fairness: decode; resize; window decode; out)
ROWS = {
    "chute tf engine": ("chute", "chute", "tf decode_and_crop_jpeg (INTEGER_ACCURATE); "
                        "tf.image.resize bilinear; window only; uint8 NHWC"),
    "chute grain engine": ("chute", "chute", "simplejpeg whole image (1/2-1/8 DCT-reduced "
                           "when the window allows); cv2.resize bilinear (uint8); no; "
                           "uint8 NHWC"),
    "codelab tf.data": ("chute", "chute", "tf decode_jpeg whole image; tf.image.resize "
                        "bilinear (float32); no; uint8 NHWC"),
    "Grain + ArrayRecord + OpenCV": ("chute", "arrayrecord", "cv2.imdecode whole image; "
                                     "cv2.resize area/linear; no; uint8 NHWC"),
    "MosaicML Streaming + torchvision": ("peer", "mds", "Pillow whole image; Pillow bilinear "
                                         "(torchvision window); no; uint8 NHWC tensor"),
    "WebDataset + torchvision": ("peer", "wds", "Pillow whole image; Pillow bilinear "
                                 "(torchvision window); no; uint8 NHWC"),
    "DALI (CPU) over chute's TFRecords": ("peer", "dali", "libjpeg-turbo ROI decode; "
                                          "fn.resize linear, antialias; window only; uint8 NHWC"),
    "FFCV": ("peer", "ffcv", "libjpeg-turbo (fast IDCT, DCT-scaled); cv2 INTER_AREA; "
             "no; uint8 NHWC"),
    "limit x1 (bare loop, 1 process)": ("peer", "memory", "simplejpeg whole image, "
                                        "DCT-scaled; cv2 area/linear; no; uint8 NHWC"),
    "limit x2 (2 bare loops side by side)": ("peer", "memory", "as limit x1, twice"),
}  # fmt: skip
FORMAT_NAMES = {"dali": "tfrecord2idx's index of chute's shards", "memory": "records in RAM"}
# row -> how it decodes glyphs (raw pixels; PNG); none resizes, all flip, all yield uint8 NHWC
GLYPH_FAIRNESS = {
    "chute tf engine": "tf decode_raw / decode_png, in blocks",
    "chute grain engine": "np.frombuffer into the batch / OpenCV, a batch per worker call",
    "codelab tf.data": "tf decode_raw / decode_png, per record",
    "Grain + ArrayRecord + OpenCV": "np.frombuffer / cv2.imdecode, per record",
    "MosaicML Streaming + torchvision": "np.frombuffer / Pillow, per record",
    "WebDataset + torchvision": "np.frombuffer / Pillow, per record",
    "DALI (CPU) over chute's TFRecords": "fn.reshape / fn.decoders.image",
    "limit x1 (bare loop, 1 process)": "np.frombuffer / cv2.imdecode into a preallocated batch",
    "limit x2 (2 bare loops side by side)": "as limit x1, twice",
}


# -- data -----------------------------------------------------------------------------------------


def photo_folder(work: str, count: int) -> str:
    """``count`` photos of bench_service.py's generator (numbered as there, so a file that
    bench_remote.py or bench_service.py made already is the same image: linked)."""
    from concurrent.futures import ProcessPoolExecutor

    from bench_service import _photo

    src = os.path.join(work, f"peers-photos{count}")
    if os.path.exists(os.path.join(src, ".done")):
        return src
    shutil.rmtree(src, ignore_errors=True)
    for k in range(4):
        os.makedirs(os.path.join(src, f"class{k}"))
    made = [
        d
        for d in glob.glob(os.path.join(work, "*photos*"))
        if os.path.exists(os.path.join(d, ".done"))
        and "shards" not in d
        and os.path.exists(os.path.join(d, "class0", "00000.jpg"))
    ]
    missing = []
    for n in range(count):
        name = os.path.join(f"class{n % 4}", f"{n:05d}.jpg")
        there = [os.path.join(d, name) for d in made if os.path.exists(os.path.join(d, name))]
        if there:
            try:
                os.link(there[0], os.path.join(src, name))
            except OSError:  # another file system
                shutil.copyfile(there[0], os.path.join(src, name))
        else:
            missing.append((src, n))
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(_photo, missing, chunksize=32))
    open(os.path.join(src, ".done"), "w").close()
    return src


def glyph_folder(work: str, classes: int, per_class: int) -> str:
    import chute

    src = os.path.join(work, f"glyphs-{classes}x{per_class}")
    if not os.path.exists(os.path.join(src, ".complete")):  # bench_grain.py's marker
        shutil.rmtree(src, ignore_errors=True)
        chute.make_sample_folder(
            src,
            num_classes=classes,
            images_per_class=per_class,
            image_size=(100, 100),
            workers=WORKERS,
        )
        open(os.path.join(src, ".complete"), "w").close()
    return src


def chute_shards(src: str, out: str, shards: int, **options) -> dict:
    """``chute.convert`` once (timed, the time kept beside the shards)."""
    import chute

    meta = os.path.join(out, ".bench-peers.json")
    if not os.path.exists(meta):
        started = time.perf_counter()
        chute.convert(src, out, min_shards=shards, workers=WORKERS, overwrite=True, **options)
        seconds = time.perf_counter() - started
        paths = chute.load_manifest(out).shard_paths("train")
        with open(meta, "w") as handle:
            json.dump({"seconds": seconds, "bytes": sum(map(os.path.getsize, paths))}, handle)
    with open(meta) as handle:
        return {"path": out, **json.load(handle)}


def read_records(path: str) -> list[tuple[int, bytes]]:
    """bench_remote.py's ``export_records`` framing: ``<label int32><length uint32><bytes>``."""
    records = []
    with open(path, "rb") as handle:
        while head := handle.read(8):
            label, length = struct.unpack("<iI", head)
            records.append((label, handle.read(length)))
    return records


def folder_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


# -- writers (each in a fresh process: chute's interpreter or the peers') -------------------------


def write_format(spec: dict) -> dict:
    """Writes ``spec["records"]`` into ``spec["out"]`` in format ``spec["format"]``."""
    fmt, out, encoding = spec["format"], spec["out"], spec["encoding"]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    records = read_records(spec["records"])
    per_shard = max(1, -(-len(records) // spec["shards"]))
    started = time.perf_counter()
    if fmt == "arrayrecord":
        from array_record.python.array_record_module import ArrayRecordWriter

        for k in range(0, len(records), per_shard):
            name = os.path.join(out, f"train-{k // per_shard:05d}.array_record")
            writer = ArrayRecordWriter(name, "group_size:1")
            for label, data in records[k : k + per_shard]:
                writer.write(struct.pack("<i", label) + data)
            writer.close()
    elif fmt == "mds":
        from bench_remote import import_streaming

        with import_streaming().MDSWriter(
            out=out,
            columns={"image": "bytes", "class": "int"},
            compression=None,
            size_limit=max(1 << 20, -(-sum(len(d) for _, d in records) // spec["shards"])),
            progress_bar=False,
        ) as writer:
            for label, data in records:
                writer.write({"image": data, "class": label})
    elif fmt == "wds":
        import webdataset as wds

        with wds.ShardWriter(
            os.path.join(out, "train-%05d.tar"), maxcount=per_shard, verbose=0
        ) as writer:
            for n, (label, data) in enumerate(records):
                writer.write({"__key__": f"{n:07d}", encoding: data, "cls": str(label).encode()})
    elif fmt == "dali":  # DALI's own indexer over chute's shards
        indexer = os.path.join(os.path.dirname(sys.executable), "tfrecord2idx")
        for path in spec["tfrecords"]:
            name = os.path.join(out, os.path.basename(path) + ".idx")
            subprocess.run([sys.executable, indexer, path, name], check=True)
    elif fmt == "ffcv":
        from ffcv.fields import IntField, RGBImageField
        from ffcv.writer import DatasetWriter
        from PIL import Image

        class Decoded:
            def __len__(self):
                return len(records)

            def __getitem__(self, n):
                return Image.open(io.BytesIO(records[n][1])).convert("RGB"), records[n][0]

        fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}
        writer = DatasetWriter(os.path.join(out, "train.beton"), fields, num_workers=WORKERS)
        writer.from_indexed_dataset(Decoded())
    else:
        raise ValueError(
            f"format must be one of arrayrecord, mds, wds, dali, ffcv. Received: {fmt}"
        )
    return {"seconds": time.perf_counter() - started, "bytes": folder_bytes(out)}


# -- what every pipeline does to one image ------------------------------------------------------


def window(height: int, width: int, rng) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop`` window (scale 0.08-1, ratio 3/4-4/3, 10 tries,
    then the centre): ``(top, left, h, w)``."""
    for _ in range(10):
        area = width * height * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    w, h = width, height
    if width / height < 3 / 4:
        h = round(w / (3 / 4))
    elif width / height > 4 / 3:
        w = round(h * 4 / 3)
    return (height - h) // 2, (width - w) // 2, h, w


def cv2_crop(data: bytes, rng):
    """OpenCV decode of the whole image, the window, ``cv2.resize``, flip (Grain+ArrayRecord)."""
    import cv2
    import numpy as np

    cv2.setNumThreads(1)  # parallelism comes from the worker processes, as in chute's
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)
    top, left, h, w = window(image.shape[0], image.shape[1], rng)
    shrink = h >= SIZE and w >= SIZE
    image = cv2.resize(
        image[top : top + h, left : left + w],
        (SIZE, SIZE),
        interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR,
    )
    return image[:, ::-1] if rng.random() < 0.5 else image


def turbo_crop(data: bytes, rng):
    """The limit loop's image: simplejpeg (DCT-scaled to the least that keeps the window at
    224 or more), crop, ``cv2.resize``, flip."""
    import cv2
    import simplejpeg

    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    top, left, h, w = window(height, width, rng)
    image = simplejpeg.decode_jpeg(
        data, colorspace="RGB", min_height=-(-height * SIZE // h), min_width=-(-width * SIZE // w)
    )
    sy, sx = image.shape[0] / height, image.shape[1] / width
    top, left, h, w = (
        round(top * sy),
        round(left * sx),
        max(1, round(h * sy)),
        max(1, round(w * sx)),
    )
    shrink = h >= SIZE and w >= SIZE
    image = cv2.resize(
        image[top : top + h, left : left + w],
        (SIZE, SIZE),
        interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR,
    )
    return image[:, ::-1] if rng.random() < 0.5 else image


def glyph(data: bytes, encoding: str, rng, side: int = 75):
    """A stored glyph decoded (raw pixels or PNG) and flipped half the time."""
    import cv2
    import numpy as np

    if encoding == "raw":
        image = np.frombuffer(data, np.uint8).reshape(side, side, 1)
    else:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE)[..., None]
    return image[:, ::-1] if rng.random() < 0.5 else image


def pillow_sample(data: bytes, encoding: str, rng):
    """What the torch peers do to one image: Pillow decode, then torchvision's window and
    Pillow's bilinear resize (photos) and a flip."""
    import numpy as np
    from PIL import Image

    if encoding == "raw":  # torch's collate takes no negative strides (a flipped view)
        return np.ascontiguousarray(glyph(data, encoding, rng))
    image = Image.open(io.BytesIO(data))
    if encoding == "png":
        image = np.asarray(image.convert("L"))[..., None]
        return np.ascontiguousarray(image[:, ::-1]) if rng.random() < 0.5 else image
    from bench_remote import random_resized_crop

    image = random_resized_crop(image.convert("RGB"), _Uniform(rng))
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(image)


class _Uniform:
    """``random.Random``'s ``uniform``/``randint`` over a NumPy generator."""

    def __init__(self, rng):
        self.rng = rng

    def uniform(self, a, b):
        return self.rng.uniform(a, b)

    def randint(self, a, b):
        return int(self.rng.integers(a, b + 1))


def _grain_decode(record: bytes, rng, encoding: str):
    import numpy as np

    label = struct.unpack("<i", record[:4])[0]
    data = record[4:]
    image = cv2_crop(data, rng) if encoding == "jpeg" else glyph(data, encoding, rng)
    return np.ascontiguousarray(image), label


# -- the loaders (each built in the pass's fresh process) ---------------------------------------


def chute_loader(spec: dict, engine: str):
    import chute

    options = (
        {"augment": "crop,flip", "image_size": SIZE}
        if spec["encoding"] == "jpeg"
        else {"augment": "flip"}
    )
    if engine == "grain":
        options["workers"] = WORKERS
    dataset = chute.load(
        spec["shards"],
        batch_size=spec["batch"],
        engine=engine,
        cache=None,
        repeat=True,
        seed=SEED,
        **options,
    )
    return dataset.as_numpy_iterator() if engine == "tf" else iter(dataset)


def codelab_loader(spec: dict):
    import tensorflow as tf

    import chute

    files = chute.load_manifest(spec["shards"]).shard_paths("train")
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "class": tf.io.FixedLenFeature([], tf.int64),
    }
    encoding = spec["encoding"]

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        if encoding == "raw":
            image = tf.reshape(tf.io.decode_raw(example["image"], tf.uint8), [75, 75, 1])
        elif encoding == "png":
            image = tf.io.decode_png(example["image"], channels=1)
        else:
            image = tf.io.decode_jpeg(example["image"], channels=3)
            begin, size, _ = tf.image.sample_distorted_bounding_box(
                tf.shape(image),
                tf.zeros([0, 0, 4]),
                area_range=(0.08, 1.0),
                aspect_ratio_range=(3 / 4, 4 / 3),
                max_attempts=10,
                use_image_if_no_bounding_boxes=True,
            )
            image = tf.image.resize(tf.slice(image, begin, size), [SIZE, SIZE])
            image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
        return tf.image.random_flip_left_right(image), example["class"]

    options = tf.data.Options()
    options.threading.private_threadpool_size = WORKERS
    dataset = (
        tf.data.TFRecordDataset(files, num_parallel_reads=WORKERS)
        .shuffle(2048)
        .repeat()
        .map(parse, num_parallel_calls=WORKERS)
        .batch(spec["batch"], drop_remainder=True)
        .prefetch(2)
        .with_options(options)
    )
    return dataset.as_numpy_iterator()


def grain_arrayrecord_loader(spec: dict):
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain reads absl flags; no main() parsed them here
        flags.FLAGS.mark_as_parsed()
    paths = sorted(glob.glob(os.path.join(spec["store"], "*.array_record")))
    dataset = (
        grain.MapDataset.source(grain.sources.ArrayRecordDataSource(paths))
        .seed(SEED)
        .shuffle()  # a new global permutation each epoch
        .repeat()
        .random_map(functools.partial(_grain_decode, encoding=spec["encoding"]))
        .batch(spec["batch"], drop_remainder=True)
        .to_iter_dataset()
        .mp_prefetch(grain.MultiprocessingOptions(num_workers=WORKERS))
    )
    return iter(dataset)


_RNGS: dict = {}  # process id -> its generator: one per worker, made there (fresh entropy)


def _torch_sample(data: bytes, encoding: str):
    import numpy as np

    rng = _RNGS.get(os.getpid())
    if rng is None:
        rng = _RNGS[os.getpid()] = np.random.default_rng()
    return pillow_sample(data, encoding, rng)


def mds_loader(spec: dict):
    import torch
    from bench_remote import import_streaming

    streaming = import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    encoding = spec["encoding"]

    class Images(streaming.StreamingDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            return _torch_sample(sample["image"], encoding), sample["class"]

    dataset = Images(local=spec["store"], shuffle=True, shuffle_seed=SEED, batch_size=spec["batch"])
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=spec["batch"],
        num_workers=WORKERS,
        drop_last=True,
        persistent_workers=True,
    )
    return itertools.chain.from_iterable(itertools.repeat(loader))


def _wds_sample(sample: dict, encoding: str):
    return _torch_sample(sample[encoding], encoding), int(sample["cls"])


def wds_loader(spec: dict):
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(spec["store"], "*.tar")))
    dataset = (
        wds.WebDataset(urls, resampled=True, shardshuffle=False, seed=SEED)
        .shuffle(1000)
        .map(functools.partial(_wds_sample, encoding=spec["encoding"]))
        .batched(spec["batch"], partial=False)
    )
    return iter(wds.WebLoader(dataset, batch_size=None, num_workers=WORKERS))


def dali_loader(spec: dict):
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    files = spec["tfrecords"]
    index = [os.path.join(spec["store"], os.path.basename(p) + ".idx") for p in files]
    encoding = spec["encoding"]

    @pipeline_def(batch_size=spec["batch"], num_threads=WORKERS, device_id=None, seed=SEED)
    def pipeline():
        record = fn.readers.tfrecord(
            path=files,
            index_path=index,
            random_shuffle=True,
            initial_fill=2048,
            features={
                "image": tfrec.FixedLenFeature((), tfrec.string, ""),
                "class": tfrec.FixedLenFeature([1], tfrec.int64, -1),
            },
        )
        if encoding == "jpeg":
            image = fn.decoders.image_random_crop(
                record["image"], device="cpu", output_type=types.RGB
            )
            image = fn.resize(image, resize_x=SIZE, resize_y=SIZE)
        elif encoding == "png":
            image = fn.decoders.image(record["image"], device="cpu", output_type=types.GRAY)
        else:
            image = fn.reshape(record["image"], shape=[75, 75, 1])
        return fn.flip(image, horizontal=fn.random.coin_flip()), record["class"]

    pipe = pipeline()
    pipe.build()
    while True:
        images, labels = pipe.run()
        yield images.as_array(), labels.as_array()


def ffcv_loader(spec: dict):
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip

    pipelines = {
        "image": [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip()],
        "label": [IntDecoder()],
    }
    loader = Loader(
        os.path.join(spec["store"], "train.beton"),
        batch_size=spec["batch"],
        num_workers=WORKERS,
        order=OrderOption.RANDOM,
        drop_last=True,
        pipelines=pipelines,
        os_cache=True,
        seed=SEED,
    )
    return itertools.chain.from_iterable(itertools.repeat(loader))


def limit_loader(spec: dict, seed: int = SEED):
    import cv2
    import numpy as np

    cv2.setNumThreads(1)  # one core: the pair of loops is the two-core figure
    records = read_records(spec["records"])
    rng = np.random.default_rng(seed)
    batch, encoding = spec["batch"], spec["encoding"]
    shape = (SIZE, SIZE, 3) if encoding == "jpeg" else (75, 75, 1)
    while True:  # epochs, each a new permutation of the records
        order = rng.permutation(len(records))
        for start in range(0, len(records) - batch + 1, batch):
            out = np.empty((batch, *shape), np.uint8)  # the batch handed over, filled in place
            labels = np.empty(batch, np.int64)
            for i, n in enumerate(order[start : start + batch]):
                label, data = records[n]
                out[i] = turbo_crop(data, rng) if encoding == "jpeg" else glyph(data, encoding, rng)
                labels[i] = label
            yield out, labels


LOADERS = {
    "chute tf engine": functools.partial(chute_loader, engine="tf"),
    "chute grain engine": functools.partial(chute_loader, engine="grain"),
    "codelab tf.data": codelab_loader,
    "Grain + ArrayRecord + OpenCV": grain_arrayrecord_loader,
    "MosaicML Streaming + torchvision": mds_loader,
    "WebDataset + torchvision": wds_loader,
    "DALI (CPU) over chute's TFRecords": dali_loader,
    "FFCV": ffcv_loader,
    "limit x1 (bare loop, 1 process)": limit_loader,
}


# -- one pass -------------------------------------------------------------------------------------


def checked(batch, spec: dict) -> tuple[int, str]:
    """The images in ``batch``, after checking its shape and dtype against the row's."""
    import numpy as np

    images = np.asarray(batch[0])
    want = (spec["batch"], *spec["shape"])
    if images.shape != want or images.dtype != np.uint8:
        raise AssertionError(
            f"{spec['row']}: batch of {images.shape} {images.dtype}, expected {want} uint8"
        )
    if len(np.asarray(batch[1]).reshape(-1)) != spec["batch"]:
        raise AssertionError(f"{spec['row']}: {len(batch[1])} labels for {want[0]} images")
    return images.shape[0], f"{'x'.join(map(str, images.shape))} {images.dtype}"


def timed(batches, spec: dict, cpu_class) -> dict:
    from bench_grain import collector_off

    started = time.perf_counter()
    _, seen = checked(next(batches), spec)
    start_s = time.perf_counter() - started
    until = time.perf_counter() + spec["warmup"]
    while time.perf_counter() < until:
        next(batches)
    with collector_off():
        cpu, started, images = cpu_class(), time.perf_counter(), 0
        while (elapsed := time.perf_counter() - started) < spec["seconds"]:
            images += checked(next(batches), spec)[0]
        used = cpu.used(elapsed)
    return {
        "images": images,
        "seconds": elapsed,
        "images_per_s": images / elapsed,
        "images_per_cpu_s": images / max(used["cpu_s"], 1e-9),
        "start_s": start_s,
        "batch": seen,
        **used,
    }


class _SelfCpu:
    """CPU seconds of this process alone (one of the limit x2 pair)."""

    def __init__(self):
        self.start = time.process_time()

    def used(self, wall: float) -> dict:
        seconds = time.process_time() - self.start
        return {"cpu_s": seconds, "cpu_pct": round(100 * seconds / wall, 1)}


def _limit_twin(spec: dict, seed: int, barrier, results) -> None:
    batches = limit_loader(spec, seed)
    next(batches)
    barrier.wait()  # both warm: the timed parts overlap
    results.put(timed(batches, spec, _SelfCpu))


def limit_pair(spec: dict) -> dict:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2), context.Queue()
    twins = [
        context.Process(target=_limit_twin, args=(spec, SEED + k, barrier, results))
        for k in range(2)
    ]
    for twin in twins:
        twin.start()
    got = [results.get(timeout=spec["seconds"] * 4 + 300) for _ in twins]
    for twin in twins:
        twin.join()
    images, cpu = sum(r["images"] for r in got), sum(r["cpu_s"] for r in got)
    wall = max(r["seconds"] for r in got)
    return {
        "images": images,
        "seconds": wall,
        "images_per_s": sum(r["images_per_s"] for r in got),
        "images_per_cpu_s": images / cpu,
        "cpu_s": cpu,
        "cpu_pct": round(100 * cpu / wall, 1),
        "start_s": max(r["start_s"] for r in got),
        "batch": got[0]["batch"],
    }


def run_pass(spec: dict) -> dict:
    from bench_grain import Cpu, close

    if spec["row"].startswith("limit x2"):
        return limit_pair(spec)
    batches = LOADERS[spec["row"]](spec)
    try:
        return timed(batches, spec, Cpu)
    finally:
        close(batches)


# -- the peers' virtualenv ------------------------------------------------------------------------


def peer_modules() -> dict:
    """In the peers' virtualenv: each peer's version, or why it does not import."""
    from importlib import metadata

    found = {}
    checks = {
        "mosaicml-streaming": "bench_remote:import_streaming",
        "webdataset": "webdataset",
        "simplejpeg": "simplejpeg",
        "opencv-python-headless": "cv2",
        "nvidia-dali-cuda120": "nvidia.dali",
        "ffcv": "ffcv",
        "torch": "torch",
        "psutil": "psutil",
    }
    for package, module in checks.items():
        try:
            if ":" in module:
                owner, name = module.split(":")
                getattr(__import__(owner), name)()
            else:
                __import__(module)
            found[package] = metadata.version(package)
        except Exception as error:
            found[package] = f"not available: {type(error).__name__}: {error}"[:200]
    return found


def peer_python(venv: str, try_ffcv: bool) -> tuple[str, dict]:
    """The peers' interpreter (bench_remote.py's virtualenv, the packages above added), and
    what imports there. FFCV is tried once: its failure is kept in ``venv/.ffcv-failed``."""
    from bench_remote import peer_python as make_venv

    python = make_venv(venv, ["mosaicml-streaming", "psutil"])
    found = _check_peers(python)
    missing = [p for p in PEER_PACKAGES if str(found.get(p, "not")).startswith("not")]
    for package in missing:  # one at a time: one that fails leaves the others installed
        print(f"installing {package} into {venv}", flush=True)
        subprocess.run([python, "-m", "pip", "install", "-q", package], check=False)
    failed = os.path.join(venv, ".ffcv-failed")
    if try_ffcv and str(found.get("ffcv")).startswith("not") and not os.path.exists(failed):
        print(f"trying {FFCV_PACKAGE} (it compiles: up to 5 min)", flush=True)
        try:
            done = subprocess.run(
                [python, "-m", "pip", "install", FFCV_PACKAGE],
                capture_output=True,
                text=True,
                timeout=300,
            )
            reason = None if done.returncode == 0 else _pip_reason(done.stdout + done.stderr)
        except subprocess.TimeoutExpired:
            reason = "pip install did not finish in 300 s"
        if reason:
            with open(failed, "w") as handle:
                handle.write(reason)
    if missing or try_ffcv:
        found = _check_peers(python)
    if os.path.exists(failed) and str(found.get("ffcv")).startswith("not"):
        with open(failed) as handle:
            found["ffcv"] = "not installable here: " + handle.read().strip()
    return python, found


def _check_peers(python: str) -> dict:
    command = [python, __file__, "--check-peers"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pip_reason(output: str) -> str:
    """The last line that names an error (``RuntimeError: ...``, ``error: ...``)."""
    lines = [line.strip() for line in output.splitlines()]
    raised = [line for line in lines if re.match(r"\w+Error: ", line)]
    named = [line for line in lines if re.match(r"(error|fatal error): ", line)]
    return (raised or named or ["pip install failed"])[-1][:200]


# -- the run --------------------------------------------------------------------------------------


def in_fresh_process(python: str, spec: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="chute-bench-peers-") as scratch:
        spec = {**spec, "out_json": os.path.join(scratch, "result.json")}
        with open(os.path.join(scratch, "spec.json"), "w") as handle:
            json.dump(spec, handle)
        done = subprocess.run(
            [python, __file__, "--pass", os.path.join(scratch, "spec.json")],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            named = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
            return {"error": ((named or lines)[-1:] or [f"exit {done.returncode}"])[0][:300]}
        with open(spec["out_json"]) as handle:
            return json.load(handle)


def datasets(args) -> list[dict]:
    """The workload's datasets: chute's shards, the records exported, each peer's store."""
    from bench_remote import export_records

    import chute

    work = args.work_dir
    if args.workload == "photos":
        src = photo_folder(work, args.images)
        made = [
            (
                "jpeg",
                chute_shards(
                    src,
                    os.path.join(work, f"peers-photos{args.images}-shards"),
                    args.shards,
                    shorter_side=256,
                    encoding="jpeg",
                ),
            )
        ]
    else:
        src = glyph_folder(work, args.glyph_classes, args.glyphs_per_class)
        made = [
            (
                encoding,
                chute_shards(
                    src,
                    f"{src}-peers-{encoding}",
                    args.shards,
                    image_size=75,
                    color_mode="grayscale",
                    encoding=encoding,
                ),
            )
            for encoding in ("raw", "png")
        ]
    out = []
    for encoding, shards in made:
        records = shards["path"] + ".records"
        if not os.path.exists(records):
            export_records(shards["path"], records + ".part")
            os.replace(records + ".part", records)
        tfrecords = chute.load_manifest(shards["path"]).shard_paths("train")
        out.append(
            {
                "encoding": encoding,
                "shards": shards,
                "records": records,
                "tfrecords": tfrecords,
                "count": len(read_records(records)),
            }
        )
    return out


def stores(data: dict, args, peer: str | None, found: dict) -> dict:
    """Format -> {"path", "seconds", "bytes"} or {"error"}: each peer's writer, once."""
    made = {
        "chute": {k: data["shards"][k] for k in ("path", "seconds", "bytes")},
        "memory": {"path": data["records"], "seconds": 0.0, "bytes": folder_bytes(data["records"])},
    }
    wanted = {"arrayrecord": sys.executable, "mds": peer, "wds": peer, "dali": peer}
    if data["encoding"] == "jpeg":
        wanted["ffcv"] = peer
    needs = {
        "mds": "mosaicml-streaming",
        "wds": "webdataset",
        "dali": "nvidia-dali-cuda120",
        "ffcv": "ffcv",
    }
    for fmt, python in wanted.items():
        why = found.get(needs.get(fmt, ""), "") if python else "not available: no peer virtualenv"
        if str(why).startswith("not"):
            made[fmt] = {"error": why}
            continue
        out = f"{data['shards']['path']}-{fmt}"
        meta = out + ".json"
        if not os.path.exists(meta):
            spec = {
                "kind": "write",
                "format": fmt,
                "out": out,
                "encoding": data["encoding"],
                "records": data["records"],
                "shards": args.shards,
                "tfrecords": data["tfrecords"],
            }
            result = in_fresh_process(python, spec)
            if "error" in result:
                made[fmt] = result
                continue
            with open(meta, "w") as handle:
                json.dump(result, handle)
        with open(meta) as handle:
            made[fmt] = {"path": out, **json.load(handle)}
    return made


def row_names(encoding: str) -> list[str]:
    names = list(ROWS)
    if encoding != "jpeg":
        names.remove("FFCV")  # its RGB image field is for photos
    return names


def summarise(runs: list[dict], names: list[str], base: str = "chute tf engine") -> dict:
    rows = {}
    for name in names:
        per_round = [run[name] for run in runs if name in run and "error" not in run[name]]
        errors = [run[name]["error"] for run in runs if "error" in run.get(name, {})]
        if not per_round:
            rows[name] = {"error": errors[0] if errors else "not run"}
            continue
        row = {
            key: statistics.median(r[key] for r in per_round)
            for key in ("images_per_s", "images_per_cpu_s", "cpu_pct", "start_s")
        }
        row["rounds_images_per_s"] = [r["images_per_s"] for r in per_round]
        row["rounds_images_per_cpu_s"] = [r["images_per_cpu_s"] for r in per_round]
        row["batch"] = per_round[0]["batch"]
        for key in ("images_per_s", "images_per_cpu_s"):
            ratios = [
                run[name][key] / run[base][key]
                for run in runs
                if "error" not in run.get(name, {"error": 1})
                and "error" not in run.get(base, {"error": 1})
            ]
            row[f"{key}_over_tf"] = statistics.median(ratios) if ratios else None
        if errors:
            row["errors"] = errors
        rows[name] = row
    return rows


def table(summary: dict) -> str:
    def number(value, digits=0):
        return "-" if value is None else f"{value:,.{digits}f}"

    peers = ", ".join(f"{k} {v}" for k, v in summary["peers"].items())
    lines = [f"{summary['machine']}; peers: {peers or 'not run'}"]
    for part in summary["parts"]:
        lines += [
            f"\n**{part['encoding']}** ({part['count']:,} images, batch {part['batch']}):\n",
            "| row | images/s (rounds) | ÷ chute tf | images per CPU-s (rounds) | ÷ chute tf "
            "| CPU % | batch checked | format: conversion s, MB | fairness |",
            "|---|---:|---:|---:|---:|---:|---|---|---|",
        ]
        for name, row in part["rows"].items():
            store = part["stores"].get(ROWS[name][1], {})
            written = "-"
            if "error" not in store:
                mb = store["bytes"] / 1e6
                label = FORMAT_NAMES.get(ROWS[name][1], ROWS[name][1])
                written = f"{label}: {store['seconds']:.1f} s, {mb:.1f} MB"
            fair = ROWS[name][2] if part["encoding"] == "jpeg" else GLYPH_FAIRNESS[name]
            if "error" in row:
                reason = (store.get("error") or row["error"]).replace("|", "/")
                lines.append(f"| {name} | {reason} | | | | | | {written} | {fair} |")
                continue
            rate = ", ".join(f"{v:,.0f}" for v in row["rounds_images_per_s"])
            per_cpu = ", ".join(f"{v:,.0f}" for v in row["rounds_images_per_cpu_s"])
            lines.append(
                f"| {name} | {number(row['images_per_s'])} ({rate}) | "
                f"{number(row['images_per_s_over_tf'], 2)} | {number(row['images_per_cpu_s'])} "
                f"({per_cpu}) | **{number(row['images_per_cpu_s_over_tf'], 2)}** | "
                f"{number(row['cpu_pct'])} | {row['batch']} | {written} | {fair} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=("photos", "glyphs"), default="photos")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "chute-bench"))
    parser.add_argument("--images", type=int, default=2700, help="photos")
    parser.add_argument("--glyph-classes", type=int, default=657)
    parser.add_argument("--glyphs-per-class", type=int, default=40)
    parser.add_argument("--shards", type=int, default=8, help="shards (files) per format")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="timed pass, at least")
    parser.add_argument("--warmup", type=float, default=3.0, help="untimed, before each pass")
    parser.add_argument("--rows", nargs="+", help="only the rows whose name starts so")
    parser.add_argument("--peer-venv", help="default: WORK_DIR/venv-peers")
    parser.add_argument("--no-peers", action="store_true", help="chute's interpreter's rows only")
    parser.add_argument("--no-ffcv", action="store_true", help="do not try to install FFCV")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--check-peers", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pass", dest="one_pass", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.check_peers:
        return print(json.dumps(peer_modules()))
    if args.one_pass:
        with open(args.one_pass) as handle:
            spec = json.load(handle)
        result = write_format(spec) if spec.get("kind") == "write" else run_pass(spec)
        with open(spec["out_json"], "w") as handle:
            json.dump(result, handle)
        return None

    started = time.perf_counter()
    os.makedirs(args.work_dir, exist_ok=True)
    peer, found = None, {}
    if not args.no_peers:
        venv = args.peer_venv or os.path.join(args.work_dir, "venv-peers")
        peer, found = peer_python(venv, try_ffcv=not args.no_ffcv)
        print(f"peers: {json.dumps(found)}", flush=True)
    parts = []
    for data in datasets(args):
        made = stores(data, args, peer, found)
        batch = BATCH[args.workload]
        shape = [SIZE, SIZE, 3] if data["encoding"] == "jpeg" else [75, 75, 1]
        names = [
            n
            for n in row_names(data["encoding"])
            if not args.rows or any(n.startswith(r) for r in args.rows)
        ]
        runs = []
        for number in range(args.rounds):
            measured = {}
            for name in names if number % 2 == 0 else names[::-1]:
                where, fmt, _ = ROWS[name]
                store = made.get(fmt, {"error": "no store"})
                python = sys.executable if where == "chute" else peer
                if "error" in store or python is None:
                    measured[name] = {"error": store.get("error", "no peer virtualenv")}
                    continue
                spec = {
                    "row": name,
                    "encoding": data["encoding"],
                    "batch": batch,
                    "shape": shape,
                    "shards": data["shards"]["path"],
                    "tfrecords": data["tfrecords"],
                    "records": data["records"],
                    "store": store["path"],
                    "seconds": args.seconds,
                    "warmup": args.warmup,
                }
                measured[name] = in_fresh_process(python, spec)
                shown = {
                    k: round(v, 1) if isinstance(v, float) else v for k, v in measured[name].items()
                }
                print(
                    f"{data['encoding']} round {number + 1}: {name}: {json.dumps(shown)}",
                    flush=True,
                )
            runs.append(measured)
        parts.append(
            {
                "encoding": data["encoding"],
                "count": data["count"],
                "batch": batch,
                "stores": made,
                "rows": summarise(runs, names),
                "runs": runs,
            }
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    from importlib import metadata

    ours = []
    for package in ("chute", "tensorflow", "grain", "array-record", "opencv-python-headless"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            ours.append(f"{package} {metadata.version(package)}")
    python = f"Python {platform.python_version()}"
    summary = {
        "machine": f"{platform.machine()}, {cores} cores, {python}, {', '.join(ours)}",
        "peers": found,
        "workload": args.workload,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "wall_s": time.perf_counter() - started,
        "parts": parts,
    }
    print(table(summary))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1, default=str)
    return None


if __name__ == "__main__":
    main()
