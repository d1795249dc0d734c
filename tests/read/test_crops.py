"""chute.load on photos: random-resized crops fused with decoding, centre crops in
evaluation, per-image keys for reproducible crops on any core count, and heavy
augmentation left to the device."""

from __future__ import annotations

import collections
import io
import platform
from pathlib import Path

import numpy as np
import pytest
from helpers import all_records
from PIL import Image

import chute
from chute import ChuteError
from chute.image import tf_ops

SIZE = (16, 16)
BATCH = 4


def _photo(path: Path, size, seed: int) -> None:
    """A smooth colour picture of ``size`` (height, width), distinct per seed."""
    height, width = size
    y, x = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(1, 4, 2)
    pixels = np.stack([(x * a) % 256, (y * b) % 256, (x + y + 40 * seed) % 256], -1).astype(
        np.uint8
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=95)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """12 JPEG photos of mixed sizes in 2 classes, stored with their shorter side <= 40."""
    root = tmp_path_factory.mktemp("photos")
    sizes = [(48, 64), (64, 48), (40, 90), (60, 60), (33, 50), (80, 56)]
    for c, name in enumerate(["cat", "dog"]):
        for i, size in enumerate(sizes):
            _photo(root / "src" / name / f"{i}.jpg", size, 10 * c + i)
    chute.convert(root / "src", root / "out", shorter_side=40, min_shards=2, workers=1)
    return root / "out"


def _keys(dataset) -> list[bytes]:
    """Each image's bytes, in the order yielded."""
    return [image.tobytes() for images, _ in dataset for image in images.numpy()]


def _load(out, **options):
    return chute.load(out, batch_size=BATCH, image_size=SIZE, **options)


def test_random_crops_give_full_static_batches_of_the_size_asked(photos):
    ds = _load(photos, augment=["crop", "flip"], seed=1)
    images_spec, _ = ds.element_spec
    assert tuple(images_spec.shape) == (BATCH, *SIZE, 3) and images_spec.dtype.name == "uint8"
    batches = list(ds)
    assert len(batches) == len(ds) == 12 // BATCH
    labels = collections.Counter(int(v) for _, y in batches for v in y.numpy())
    assert labels == {0: 6, 1: 6}  # every example once per epoch


def test_a_seed_gives_the_same_crops_on_any_number_of_cores(photos, monkeypatch):
    from chute.read.tf import plan

    first = _keys(_load(photos, augment=["crop", "flip"], seed=7, cache=None))
    for cores in (1, 3):
        monkeypatch.setattr(plan, "available_cores", lambda cores=cores: cores)
        assert _keys(_load(photos, augment=["crop", "flip"], seed=7, cache=None)) == first
    assert _keys(_load(photos, augment=["crop", "flip"], seed=8, cache=None)) != first


@pytest.mark.parametrize("cache", [None, "memory"])
def test_crops_are_new_every_epoch(photos, cache):
    ds = _load(photos, augment=["crop"], seed=3, cache=cache)
    epochs = [sorted(_keys(ds)) for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]


def test_random_crop_eagerly_and_in_tf_data_agree(photos):
    """The transform gives the same pixels called eagerly and inside tf.data.map."""
    import tensorflow as tf

    manifest = chute.load_manifest(photos)
    (record, *_) = all_records(photos)
    data = tf.constant(record["image"])
    spec = manifest.image
    options = {"scale": (0.2, 1.0), "ratio": (0.75, 1.33), "flip": True}
    key = tf.constant(12345, tf.int64)
    eager = tf_ops.random_crop(data, spec, SIZE, key, **options).numpy()
    mapped = tf.data.Dataset.from_tensors((data, key)).map(
        lambda d, k: tf_ops.random_crop(d, spec, SIZE, k, **options)
    )
    np.testing.assert_array_equal(next(iter(mapped)).numpy(), eager)
    assert eager.shape == (*SIZE, 3) and eager.dtype == np.uint8
    # another key, another crop
    other = tf_ops.random_crop(data, spec, SIZE, key + 1, **options).numpy()
    assert not np.array_equal(other, eager)


def test_a_crop_covers_the_share_of_the_area_asked(photos):
    """With scale (1, 1) the crop is the whole image (at an allowed aspect ratio), and a
    flip is a mirror image: the pixels are the whole image resized, maybe mirrored."""
    import tensorflow as tf

    manifest = chute.load_manifest(photos)
    spec = manifest.image
    square = next(r for r in all_records(photos) if r["size"] == (40, 40))
    data = tf.constant(square["image"])
    whole = tf_ops.centre_crop(data, spec, SIZE, 1.0).numpy()
    for key in range(6):
        crop = tf_ops.random_crop(
            data, spec, SIZE, tf.constant(key, tf.int64), scale=(1.0, 1.0), ratio=(1.0, 1.0),
            flip=True,
        ).numpy()  # fmt: skip
        assert np.array_equal(crop, whole) or np.array_equal(crop, whole[:, ::-1])


def test_evaluation_takes_the_centre_crop_predict_takes(photos):
    import tensorflow as tf

    manifest = chute.load_manifest(photos)
    ds = _load(photos, training=False)
    got = [image for images, _ in ds for image in images.numpy()]
    expected = [
        tf_ops.centre_crop(tf.constant(r["image"]), manifest.image, SIZE, 0.875).numpy()
        for r in all_records(photos)
    ]
    assert sorted(x.tobytes() for x in got) == sorted(x.tobytes() for x in expected)


# TensorFlow's x86-64 wheels compute resizes without fused multiply-adds, as NumPy does; a
# build that fuses them (ARM's may) can round a pixel whose exact value is a .5 the other way.
_EXACT_RESIZE = platform.machine().lower() in ("x86_64", "amd64")


def _same_pixels(got: np.ndarray, expected: np.ndarray) -> None:
    if _EXACT_RESIZE:
        np.testing.assert_array_equal(got, expected)
    else:
        assert np.abs(got.astype(int) - expected.astype(int)).max() <= 1


@pytest.mark.parametrize("size", [(16, 16), (30, 30), (56, 42)])
def test_the_grain_engine_evaluates_with_the_tf_engines_pixels_at_any_size(photos, size):
    """Photos stored at shorter side 40, evaluated smaller (where a JPEG could be decoded
    at half scale), at a size that is no simple fraction, and larger."""
    options = dict(batch_size=BATCH, image_size=size, training=False)
    on_grain = [b[0] for b in chute.load(photos, engine="grain", workers=0, **options)]
    on_tf = [images.numpy() for images, _ in chute.load(photos, **options)]
    _same_pixels(np.concatenate(on_grain), np.concatenate(on_tf))


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
def test_the_grain_engines_resize_is_tensorflows(method):
    """The evaluation resize of the Grain engine's workers, NumPy alone, against
    ``tf.image.resize`` then ``round``: random sizes up and down, 1 and 3 channels."""
    import tensorflow as tf

    from chute.image import crop

    rng = np.random.default_rng(0)
    for _ in range(60):
        height, width, out_height, out_width = (int(n) for n in rng.integers(1, 90, 4))
        pixels = rng.integers(0, 256, (height, width, int(rng.choice([1, 3]))), np.uint8)
        expected = tf.image.resize(pixels, (out_height, out_width), method=method).numpy()
        expected = np.clip(np.round(expected), 0, 255).astype(np.uint8)
        _same_pixels(crop.resized(pixels, (out_height, out_width), method), expected)


def test_heavy_augmentation_on_the_device_is_left_out_of_the_pipeline(photos):
    import tensorflow as tf

    plain = sorted(_keys(_load(photos, training=False, crop_fraction=1.0)))
    ds = _load(photos, augment=["zoom", "contrast"], augment_on="device", seed=2)
    assert ds.chute.device_augmentation is not None
    assert ds.chute.device_augmentation.names == ["zoom", "contrast"]
    # images arrive as the plain pipeline's (here: whole images, resized)
    assert sorted(_keys(ds)) == plain
    images, _ = next(iter(ds))
    out = ds.chute.device_augmentation(images)
    assert out.dtype == tf.uint8 and out.shape == images.shape
    assert not np.array_equal(out.numpy(), images.numpy())
    host = _load(photos, augment=["zoom", "contrast"], augment_on="host", seed=2)
    assert host.chute.device_augmentation is None
    assert sorted(_keys(host)) != plain


def test_mixup_on_the_host_mixes_one_hot_labels(photos):
    ds = _load(photos, augment=["crop", "mixup"], label_mode="categorical", seed=4)
    _, labels = next(iter(ds))
    assert labels.shape == (BATCH, 2)
    np.testing.assert_allclose(labels.numpy().sum(axis=1), 1.0, rtol=1e-5)
    assert ((labels.numpy() > 0) & (labels.numpy() < 1)).any()  # mixed, not one-hot
    with pytest.raises(ChuteError, match="label_mode='categorical'"):
        _load(photos, augment=["mixup"])


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"crop_scale": (0.0, 1.0)}, "crop_scale"),
        ({"crop_scale": (0.9, 0.5)}, "crop_scale"),
        ({"crop_scale": 0.5}, "crop_scale"),
        ({"crop_ratio": (2, 1)}, "crop_ratio"),
        ({"crop_fraction": 0}, "crop_fraction"),
        ({"crop_fraction": 1.5}, "crop_fraction"),
        ({"augment_on": "gpu"}, "augment_on"),
        ({"augment": ["crop", "twirl"]}, "augment"),
    ],
)
def test_bad_crop_arguments_name_the_argument(photos, options, name):
    with pytest.raises(ChuteError, match=name):
        _load(photos, **({"augment": ["crop"]} | options))


def test_fixed_size_datasets_take_crops_too(tmp_path):
    """A raw dataset of one size: crops per image from its pixels, at any output size."""
    for c, name in enumerate(["a", "b"]):
        for i in range(4):
            _photo(tmp_path / "src" / name / f"{i}.jpg", (30, 30), 5 * c + i)
    out = tmp_path / "out"
    chute.convert(tmp_path / "src", out, image_size=20, encoding="raw", workers=1)
    ds = chute.load(out, batch_size=2, image_size=(12, 12), augment=["crop", "flip"], seed=1)
    assert tuple(ds.element_spec[0].shape) == (2, 12, 12, 3)
    assert sum(int(x.shape[0]) for x, _ in ds) == 8
    evaluation = chute.load(out, batch_size=2, training=False)  # stored size: no crop
    assert tuple(evaluation.element_spec[0].shape[1:]) == (20, 20, 3)


def test_host_augmentation_ops_do_what_they_say():
    from chute.read.tf.host_augment import HostAugmentation

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (8, 12, 10, 3), dtype=np.uint8)
    flipped = HostAugmentation(["flip"]).apply(images, np.int64(5))
    for before, after in zip(images, flipped, strict=True):
        assert np.array_equal(after, before) or np.array_equal(after, before[:, ::-1])
    assert any(not np.array_equal(a, b) for a, b in zip(images, flipped, strict=True))
    contrast = HostAugmentation(["contrast"]).apply(images, np.int64(6))
    # contrast scales around each channel's mean: the means stay (up to rounding/clipping)
    np.testing.assert_allclose(
        contrast.reshape(8, -1, 3).mean(1), images.reshape(8, -1, 3).mean(1), atol=3
    )
    rotated = HostAugmentation(["rotation", "zoom"]).apply(images, np.int64(7))
    assert rotated.shape == images.shape and rotated.dtype == np.uint8
    assert not np.array_equal(rotated, images)
    again = HostAugmentation(["rotation", "zoom"]).apply(images, np.int64(7))
    assert np.array_equal(again, rotated)  # the key decides


@pytest.mark.parametrize("stored", ["photos", "raw"])
def test_host_augmentation_with_a_seed_is_the_same_on_any_core_count(
    photos, tmp_path, monkeypatch, stored
):
    from chute.read.tf import plan

    out = photos
    if stored == "raw":  # the block path: decoded pixels shuffled in windows
        for c, name in enumerate(["a", "b"]):
            for i in range(6):
                _photo(tmp_path / "src" / name / f"{i}.jpg", (20, 20), 5 * c + i)
        out = tmp_path / "out"
        chute.convert(tmp_path / "src", out, image_size=16, encoding="raw", workers=1)
    augment = ["flip", "rotation", "contrast"]

    def run():
        return _keys(_load(out, augment=augment, augment_on="host", seed=5, cache=None))

    first = run()
    monkeypatch.setattr(plan, "available_cores", lambda: 3)
    assert run() == first
    plain = _keys(_load(out, augment=["flip"], seed=5, cache=None))
    assert sorted(plain) != sorted(first)


def test_a_flip_alone_runs_in_the_graph_mirroring_about_half_keyed_by_the_batch():
    import tensorflow as tf

    from chute.read.tf.host_augment import HostAugmentation, flipped

    images = np.random.default_rng(0).integers(0, 256, (64, 6, 5, 3), dtype=np.uint8)
    key = tf.constant(11, tf.int64)
    out = HostAugmentation(["flip"])(tf.constant(images), key).numpy()
    mirrored = [np.array_equal(a, b[:, ::-1]) for a, b in zip(out, images, strict=True)]
    kept = [np.array_equal(a, b) for a, b in zip(out, images, strict=True)]
    assert all(m or k for m, k in zip(mirrored, kept, strict=True))
    assert 16 <= sum(mirrored) <= 48  # a coin per image
    assert np.array_equal(flipped(tf.constant(images), key).numpy(), out)  # the key decides
    other = flipped(tf.constant(images), tf.constant(12, tf.int64)).numpy()
    assert not np.array_equal(other, out)


def test_the_workers_jpeg_decoder_gives_opencvs_pixels_and_falls_back_to_it(tmp_path):
    """simplejpeg (libjpeg-turbo) decodes what OpenCV's IMREAD flags decode, bit for bit:
    whole and at 1/2, 1/4, 1/8, in colour and grey, 4:2:0 and 4:4:4, and CMYK; a JPEG it
    refuses (a file cut short) goes to OpenCV."""
    import cv2

    from chute.image import crop

    assert crop.simplejpeg is not None, "the grain extra installs simplejpeg"
    rng = np.random.default_rng(3)
    cases = []
    for height, width in [(37, 53), (120, 97), (64, 64)]:
        pixels = rng.integers(0, 256, (height, width, 3), np.uint8)
        smooth = cv2.GaussianBlur(pixels, (5, 5), 2)
        for subsampling in (0, 2):  # 4:4:4, 4:2:0
            path = tmp_path / f"{height}x{width}-{subsampling}.jpg"
            Image.fromarray(smooth).save(path, quality=90, subsampling=subsampling)
            cases.append(path.read_bytes())
    flags = {
        (3, 1): cv2.IMREAD_COLOR,
        (1, 1): cv2.IMREAD_GRAYSCALE,
        **crop._REDUCED,
    }
    for data in cases:
        height, width = Image.open(io.BytesIO(data)).size[::-1]
        for (channels, reduce), flag in flags.items():
            got = crop.decode(data, "jpeg", (height, width, channels), reduce=reduce)
            expected = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
            if channels == 3:
                expected = cv2.cvtColor(expected, cv2.COLOR_BGR2RGB)
            expected = expected.reshape(*expected.shape[:2], channels)
            assert got.shape == expected.shape, (channels, reduce)
            np.testing.assert_array_equal(got, expected)
    cmyk = io.BytesIO()  # CMYK: converted to RGB as OpenCV converts it
    Image.fromarray(rng.integers(0, 256, (20, 30, 4), np.uint8), "CMYK").save(cmyk, "JPEG")
    expected = cv2.imdecode(np.frombuffer(cmyk.getvalue(), np.uint8), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(
        crop.decode(cmyk.getvalue(), "jpeg", (20, 30, 3)),
        cv2.cvtColor(expected, cv2.COLOR_BGR2RGB),
    )
    # A JPEG cut short: simplejpeg refuses it and OpenCV is asked, which refuses it too.
    data = cases[2][:-10]
    assert crop._turbo(data, 3, 1) is None
    with pytest.raises(ValueError, match="jpeg image that does not decode"):
        crop.decode(data, "jpeg", (120, 97, 3))
