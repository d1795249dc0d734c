"""Encoding: orientation, colour modes, resizing, encodings, and the bad-input zoo.

Images are a few pixels each, made in temp dirs; conversions run in-process
with ``workers=1``. Expected pixels are computed independently where the
answer is known (solid colours, bars, borders), and otherwise by doing the
same Pillow convert + OpenCV resize by hand, checked against what the
documentation promises: ``tf.image.resize`` without antialiasing.
"""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import numpy as np
import pytest
from helpers import all_records, decode, make_folder, read_records, write_image
from PIL import Image

import chute
from chute.format.spec import ImageSpec
from chute.image import decode as image_decode
from chute.image.header import Rejected
from chute.ingest import decode as decoding
from chute.ingest import encode

ORIENTATION = 0x0112


def convert(src: Path, out: Path, **options):
    return chute.convert(src, out, workers=1, **options)


def records_by_key(out: Path, split: str = "train") -> dict[str, dict]:
    return {record["key"]: record for record in all_records(out, split)}


def encode_record(tmp_path: Path, payload, spec: ImageSpec) -> dict:
    """One item through encode.encode_one, read back with TensorFlow."""
    framed = encode.encode_one("key", 0, payload, spec)
    path = tmp_path / f"{hashlib.sha1(framed).hexdigest()}.tfrecord"
    path.write_bytes(framed)
    (record,) = read_records(path)
    return record


def luma(rgb: np.ndarray) -> np.ndarray:
    """Pillow's own RGB -> L conversion (ITU-R 601-2), as (H, W, 1)."""
    return np.asarray(Image.fromarray(rgb, "RGB").convert("L"))[..., None]


def gray_to_rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray.reshape(*gray.shape[:2], 1), 3, axis=2)


# -- EXIF orientation ---------------------------------------------------------------------


def _exif_jpeg(path: Path, orientation: int) -> Path:
    """A 16x32 (HxW) grayscale JPEG: left half white, right half black, with EXIF orientation."""
    pixels = np.zeros((16, 32), np.uint8)
    pixels[:, :16] = 255
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    return write_image(path, pixels, quality=95, exif=exif)


@pytest.mark.parametrize("keep_size", [False, True], ids=["probed-size", "keep-size"])
@pytest.mark.parametrize(
    ("orientation", "rot90_k", "size"),
    [(1, 0, (16, 32)), (3, 2, (16, 32)), (6, -1, (32, 16)), (8, 1, (32, 16))],
)
def test_exif_orientation_is_applied(tmp_path, orientation, rot90_k, size, keep_size):
    path = _exif_jpeg(tmp_path / "src" / "a" / "x.jpg", orientation)
    assert Image.open(path).getexif()[ORIENTATION] == orientation
    stored = np.asarray(Image.open(path))  # decoded as stored, not rotated

    probe = decoding.probe_chunk([str(path)], 10**6)[0]
    assert probe.reject is None
    assert (probe.height, probe.width) == size

    out = tmp_path / "out"
    # keep_size with every option given is the path where headers are not probed first.
    result = convert(
        tmp_path / "src", out, encoding="png", color_mode="grayscale", keep_size=keep_size
    )
    if not keep_size:
        assert (result.manifest.image.height, result.manifest.image.width) == size
    (record,) = all_records(out)
    assert record["size"] == size
    pixels = decode(record)[..., 0]
    np.testing.assert_array_equal(pixels, np.rot90(stored, k=rot90_k))


def test_exif_orientation_6_puts_the_stored_left_side_on_top(tmp_path):
    """Orientation 6 means 'rotate 90 degrees clockwise to view'."""
    path = _exif_jpeg(tmp_path / "src" / "a" / "x.jpg", 6)
    spec = ImageSpec(height=None, width=None, channels=1, encoding="raw")
    record = encode_record(tmp_path, str(path), spec)
    assert record["size"] == (32, 16)
    pixels = decode(record)[..., 0].astype(int)
    assert pixels[:14].min() > 230  # the stored white left half is now the top
    assert pixels[18:].max() < 25  # the stored black right half is now the bottom


def test_exif_rotated_jpeg_is_not_stored_as_its_original_bytes(tmp_path):
    path = _exif_jpeg(tmp_path / "src" / "a" / "x.jpg", 6)
    out = tmp_path / "out"
    convert(tmp_path / "src", out, keep_size=True, encoding="jpeg", color_mode="grayscale")
    (record,) = all_records(out)
    assert record["image"] != path.read_bytes()
    assert record["size"] == (32, 16)
    pixels = decode(record)[..., 0].astype(int)
    assert pixels.shape == (32, 16)
    assert pixels[:14].mean() > 230 and pixels[18:].mean() < 25


# -- colour modes -------------------------------------------------------------------------


def _mode_zoo(src: Path) -> dict[str, tuple[np.ndarray, int]]:
    """One image per awkward mode, each in its own class folder.

    Returns ``class -> (expected RGB pixels, tolerance)``.
    """
    expected = {}
    # CMYK JPEG of a known colour (JPEG, so compared within a tolerance).
    cmyk = Image.new("RGB", (8, 8), (200, 30, 40)).convert("CMYK")
    (src / "cmyk").mkdir(parents=True)
    cmyk.save(src / "cmyk" / "x.jpg", quality=95)
    expected["cmyk"] = (np.full((8, 8, 3), (200, 30, 40), np.uint8), 8)

    # Palette PNG: left half red, right half blue.
    index = np.zeros((8, 8), np.uint8)
    index[:, 4:] = 1
    palette = Image.fromarray(index, "P")
    palette.putpalette([255, 0, 0, 0, 0, 255] + [0, 0, 0] * 254)
    (src / "palette").mkdir()
    palette.save(src / "palette" / "x.png")
    rgb = np.zeros((8, 8, 3), np.uint8)
    rgb[:, :4] = (255, 0, 0)
    rgb[:, 4:] = (0, 0, 255)
    expected["palette"] = (rgb, 0)

    # RGBA PNG: alpha is dropped, not composited (Keras's loaders do the same).
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[:, :4] = (200, 30, 40, 0)
    rgba[:, 4:] = (10, 20, 30, 255)
    write_image(src / "rgba" / "x.png", rgba, mode="RGBA")
    expected["rgba"] = (rgba[..., :3].copy(), 0)

    # LA PNG: gray plus alpha.
    la = np.zeros((8, 8, 2), np.uint8)
    la[..., 0] = np.arange(64).reshape(8, 8) * 4
    la[..., 1] = np.arange(64).reshape(8, 8)[::-1] * 3
    (src / "la").mkdir()
    Image.fromarray(la, "LA").save(src / "la" / "x.png")
    expected["la"] = (gray_to_rgb(la[..., 0]), 0)

    # 16-bit grayscale PNG: scaled to 8 bits (65535 -> 255, 0 -> 0).
    wide = np.tile(np.array([[0, 257, 25700, 65535]], np.uint16), (8, 2))
    (src / "i16").mkdir()
    Image.fromarray(wide).save(src / "i16" / "x.png")
    assert Image.open(src / "i16" / "x.png").mode.startswith("I")
    narrow = np.tile(np.array([[0, 1, 100, 255]], np.uint8), (8, 2))
    expected["i16"] = (gray_to_rgb(narrow), 0)
    return expected


def test_awkward_modes_are_probed_as_colour_or_grayscale(tmp_path):
    _mode_zoo(tmp_path / "src")
    names = ["cmyk", "palette", "rgba", "la", "i16"]
    paths = [str(next((tmp_path / "src" / n).iterdir())) for n in names]
    probes = decoding.probe_chunk(paths, 10**6)
    assert [p.reject for p in probes] == [None] * 5
    assert {n: p.grayscale for n, p in zip(names, probes, strict=True)} == {
        "cmyk": False,
        "palette": False,
        "rgba": False,
        "la": True,
        "i16": True,
    }
    assert all((p.height, p.width) == (8, 8) for p in probes)


@pytest.mark.parametrize("color_mode", ["rgb", "grayscale"])
def test_awkward_modes_convert_to_the_chosen_color_mode(tmp_path, color_mode):
    expected = _mode_zoo(tmp_path / "src")
    out = tmp_path / "out"
    result = convert(tmp_path / "src", out, color_mode=color_mode, encoding="raw")
    assert result.num_rejected == 0
    channels = 3 if color_mode == "rgb" else 1
    assert result.manifest.image.channels == channels
    names = result.manifest.class_names
    records = records_by_key(out)
    assert len(records) == 5
    for record in records.values():
        name = names[record["class"]]
        rgb, tolerance = expected[name]
        want = rgb if channels == 3 else luma(rgb)
        got = decode(record)
        assert got.shape == (8, 8, channels), name
        diff = np.abs(got.astype(int) - want.astype(int))
        assert diff.max() <= tolerance, (name, got[..., 0], want[..., 0])


def test_sixteen_bit_grayscale_is_scaled_to_eight_bits(tmp_path):
    values = np.array([[0, 257, 32896, 65535], [65535, 25700, 514, 0]], np.uint16)
    path = tmp_path / "x.png"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "I;16"
    for channels in (1, 3):
        spec = ImageSpec(height=None, width=None, channels=channels, encoding="png")
        pixels = decode(encode_record(tmp_path, str(path), spec))
        assert pixels.shape == (2, 4, channels)
        for c in range(channels):
            np.testing.assert_array_equal(pixels[..., c], [[0, 1, 128, 255], [255, 100, 2, 0]])


def _gray_folder(src: Path) -> Path:
    make_folder(src, {"l": 2}, size=(8, 8))
    la = np.stack([np.full((8, 8), 90, np.uint8), np.full((8, 8), 200, np.uint8)], axis=-1)
    (src / "la").mkdir()
    Image.fromarray(la, "LA").save(src / "la" / "x.png")
    (src / "i16").mkdir()
    Image.fromarray(np.full((8, 8), 40000, np.uint16)).save(src / "i16" / "x.png")
    gray_palette = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8), "P")
    gray_palette.putpalette([v for i in range(256) for v in (i, i, i)])
    (src / "grayp").mkdir()
    gray_palette.save(src / "grayp" / "x.png")
    return src


def test_color_mode_auto_picks_grayscale_when_every_image_is_grayscale(tmp_path):
    src = _gray_folder(tmp_path / "src")
    out = tmp_path / "out"
    result = convert(src, out, color_mode="auto", encoding="raw")
    assert result.manifest.image.channels == 1
    assert {r["channels"] for r in all_records(out)} == {1}


def test_color_mode_auto_picks_rgb_when_one_image_is_colour(tmp_path):
    src = _gray_folder(tmp_path / "src")
    write_image(src / "colour" / "x.png", size=(8, 8), mode="RGB", seed=5)
    out = tmp_path / "out"
    result = convert(src, out, color_mode="auto", encoding="raw")
    assert result.manifest.image.channels == 3
    records = records_by_key(out)
    assert {r["channels"] for r in records.values()} == {3}
    want = np.asarray(Image.open(src / "colour" / "x.png").convert("RGB"))
    np.testing.assert_array_equal(decode(records["colour/x.png"]), want)
    # A grayscale image stored as RGB has three equal channels.
    gray = decode(records["l/000.png"])
    np.testing.assert_array_equal(gray[..., 0], gray[..., 1])
    np.testing.assert_array_equal(gray[..., 0], gray[..., 2])


# -- resize modes -------------------------------------------------------------------------


def _bands(path: Path) -> Path:
    """A 10x30 (HxW) RGB image: red left third, green centre, blue right third."""
    pixels = np.zeros((10, 30, 3), np.uint8)
    pixels[:, :10] = (255, 0, 0)
    pixels[:, 10:20] = (0, 255, 0)
    pixels[:, 20:] = (0, 0, 255)
    return write_image(path, pixels, mode="RGB")


def _one_record(tmp_path: Path, **options) -> dict:
    out = tmp_path / "out"
    convert(tmp_path / "src", out, **options)
    (record,) = all_records(out)
    return record


def test_resize_stretch_gives_the_target_size_and_keeps_everything(tmp_path):
    _bands(tmp_path / "src" / "a" / "x.png")
    record = _one_record(tmp_path, image_size=(8, 6), resize="stretch", encoding="raw")
    assert record["size"] == (8, 6)
    pixels = decode(record)
    assert pixels.shape == (8, 6, 3)
    # Squeezed, not cropped: the red and blue borders are still there.
    assert pixels[:, 0, 0].min() > 200 and pixels[:, 0, 1].max() < 50
    assert pixels[:, -1, 2].min() > 200 and pixels[:, -1, 1].max() < 50


@pytest.mark.parametrize("size", [(10, 10), (5, 5), (6, 4)])
def test_resize_crop_keeps_the_centre(tmp_path, size):
    _bands(tmp_path / "src" / "a" / "x.png")
    record = _one_record(tmp_path, image_size=size, resize="crop", encoding="raw")
    assert record["size"] == size
    pixels = decode(record)
    want = np.zeros((*size, 3), np.uint8)
    want[...] = (0, 255, 0)
    np.testing.assert_array_equal(pixels, want)  # the red and blue borders are gone


def test_resize_crop_of_a_tall_image_keeps_the_middle_rows(tmp_path):
    pixels = np.zeros((30, 10), np.uint8)
    pixels[10:20] = 200
    write_image(tmp_path / "src" / "a" / "x.png", pixels)
    record = _one_record(tmp_path, image_size=10, resize="crop", encoding="raw")
    np.testing.assert_array_equal(decode(record), np.full((10, 10, 1), 200, np.uint8))


def test_resize_pad_adds_black_bars_left_and_right(tmp_path):
    write_image(tmp_path / "src" / "a" / "x.png", np.full((20, 10), 255, np.uint8))
    record = _one_record(tmp_path, image_size=20, resize="pad", encoding="raw")
    assert record["size"] == (20, 20)
    want = np.zeros((20, 20, 1), np.uint8)
    want[:, 5:15] = 255
    np.testing.assert_array_equal(decode(record), want)


def test_resize_pad_adds_black_bars_top_and_bottom(tmp_path):
    write_image(tmp_path / "src" / "a" / "x.png", np.full((10, 20, 3), 255, np.uint8), mode="RGB")
    record = _one_record(tmp_path, image_size=20, resize="pad", encoding="raw")
    want = np.zeros((20, 20, 3), np.uint8)
    want[5:15] = 255
    np.testing.assert_array_equal(decode(record), want)


# -- keep_size ----------------------------------------------------------------------------


def test_keep_size_stores_each_image_at_its_own_size(tmp_path):
    src = tmp_path / "src"
    paths = {
        "a/x.png": write_image(src / "a" / "x.png", size=(12, 10), seed=1),
        "a/y.png": write_image(src / "a" / "y.png", size=(7, 20), seed=2),
        "b/z.png": write_image(src / "b" / "z.png", size=(3, 5), seed=3),
    }
    out = tmp_path / "out"
    result = convert(src, out, keep_size=True, encoding="png")
    assert result.manifest.image.height is None
    assert result.manifest.image.width is None
    assert result.manifest.image.encoding == "png"
    records = records_by_key(out)
    assert sorted(records) == sorted(paths)
    for key, path in paths.items():
        want = np.asarray(Image.open(path))[..., None]
        assert records[key]["size"] == want.shape[:2]
        assert records[key]["image"].startswith(b"\x89PNG")
        np.testing.assert_array_equal(decode(records[key]), want)


def test_mixed_sizes_without_image_size_or_keep_size_is_an_error(tmp_path):
    src = tmp_path / "src"
    write_image(src / "a" / "x.png", size=(12, 10))
    write_image(src / "a" / "y.png", size=(7, 20))
    with pytest.raises(chute.ChuteError) as error:
        convert(src, tmp_path / "out")
    assert "image_size" in str(error.value) and "keep_size" in str(error.value)


def test_keep_size_jpeg_keeps_the_original_bytes_of_an_upright_jpeg(tmp_path):
    src = tmp_path / "src"
    paths = {
        "a/x.jpg": write_image(src / "a" / "x.jpg", size=(16, 24), seed=1, quality=80),
        "b/y.jpg": write_image(src / "b" / "y.jpg", size=(9, 7), seed=2, quality=70),
    }
    out = tmp_path / "out"
    result = convert(src, out, keep_size=True, encoding="jpeg", color_mode="grayscale")
    records = records_by_key(out)
    assert result.manifest.image.channels == 1
    for key, path in paths.items():
        assert records[key]["image"] == path.read_bytes()
        assert records[key]["size"] == Image.open(path).size[::-1]


def test_keep_size_jpeg_keeps_rgb_originals_when_storing_rgb(tmp_path):
    path = write_image(tmp_path / "src" / "a" / "x.jpg", size=(10, 14), mode="RGB", seed=3)
    record = _one_record(tmp_path, keep_size=True, encoding="jpeg", color_mode="rgb")
    assert record["image"] == path.read_bytes()
    assert record["channels"] == 3


def test_keep_size_jpeg_reencodes_a_jpeg_in_the_wrong_mode(tmp_path):
    path = write_image(tmp_path / "src" / "a" / "x.jpg", size=(10, 14), mode="RGB", seed=3)
    record = _one_record(tmp_path, keep_size=True, encoding="jpeg", color_mode="grayscale")
    assert record["image"] != path.read_bytes()
    assert record["size"] == (10, 14)
    assert decode(record).shape == (10, 14, 1)


# -- encodings ----------------------------------------------------------------------------


def _gradient(path: Path, mode: str) -> Path:
    """A smooth 12x10 (HxW) image (JPEG-friendly), RGB or L."""
    y, x = np.mgrid[0:12, 0:10]
    rgb = np.stack([y * 20, x * 25, 255 - (x + y) * 10], axis=-1).clip(0, 255).astype(np.uint8)
    return write_image(path, rgb if mode == "RGB" else rgb[..., 0], mode=mode)


def tf_resize(pixels: np.ndarray, size: tuple[int, int], method: str) -> np.ndarray:
    """``tf.image.resize`` (no antialiasing) of uint8 (H, W, C) pixels, rounded back to uint8."""
    import tensorflow as tf

    resized = tf.image.resize(pixels, size, method=method, antialias=False).numpy()
    return np.clip(np.rint(resized), 0, 255).astype(np.uint8)


def by_hand(path: Path, channels: int, size: tuple[int, int]) -> np.ndarray:
    """The same Pillow convert + OpenCV bilinear resize, done here."""
    import cv2

    converted = np.asarray(Image.open(path).convert("RGB" if channels == 3 else "L"))
    resized = cv2.resize(converted, size[::-1], interpolation=cv2.INTER_LINEAR)
    return resized.reshape(*size, channels)


@pytest.mark.parametrize("source_mode", ["RGB", "L"])
@pytest.mark.parametrize("color_mode", ["rgb", "grayscale"])
@pytest.mark.parametrize("encoding", ["raw", "png", "jpeg"])
def test_encoding_round_trip(tmp_path, encoding, color_mode, source_mode):
    path = _gradient(tmp_path / "src" / "a" / "x.png", source_mode)
    out = tmp_path / "out"
    result = convert(
        tmp_path / "src", out, image_size=(6, 8), encoding=encoding, color_mode=color_mode
    )
    channels = 3 if color_mode == "rgb" else 1
    assert result.manifest.image == ImageSpec(
        height=6, width=8, channels=channels, encoding=encoding
    )
    (record,) = all_records(out)
    assert record["encoding"] == encoding
    assert record["size"] == (6, 8)
    assert record["channels"] == channels
    want = by_hand(path, channels, (6, 8))
    # What the pixels mean: tf.image.resize (bilinear, no antialiasing), to rounding.
    converted = np.asarray(Image.open(path).convert("RGB" if channels == 3 else "L"))
    reference = tf_resize(converted.reshape(12, 10, channels), (6, 8), "bilinear")
    assert np.abs(want.astype(int) - reference.astype(int)).max() <= 1
    got = decode(record)
    assert got.shape == (6, 8, channels)
    if encoding == "raw":
        assert len(record["image"]) == 6 * 8 * channels
        np.testing.assert_array_equal(got, want)
    elif encoding == "png":
        assert record["image"].startswith(b"\x89PNG\r\n\x1a\n")
        np.testing.assert_array_equal(got, want)
    else:
        assert record["image"].startswith(b"\xff\xd8")
        diff = np.abs(got.astype(int) - want.astype(int))
        # Tiny images suffer from 4:2:0 chroma subsampling; still far from a wrong image.
        assert diff.mean() < 10 and diff.max() < 64, diff


@pytest.mark.parametrize(
    ("interpolation", "tf_method", "tolerance"),
    [
        ("nearest", "nearest", 0),
        ("bilinear", "bilinear", 1),
        ("area", "area", 1),
    ],
)
def test_interpolation_matches_tf_image_resize(tmp_path, interpolation, tf_method, tolerance):
    """Documented: nearest, bilinear and area are computed as ``tf.image.resize`` does them."""
    path = write_image(tmp_path / "src" / "a" / "x.png", size=(12, 10), mode="RGB", seed=4)
    record = _one_record(tmp_path, image_size=(5, 7), interpolation=interpolation, encoding="raw")
    want = tf_resize(np.asarray(Image.open(path)), (5, 7), tf_method)
    got = decode(record)
    assert got.shape == want.shape
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= tolerance, f"max |chute - tf.image.resize| = {diff.max()}"


@pytest.mark.parametrize(
    ("interpolation", "flag"), [("bicubic", "INTER_CUBIC"), ("lanczos", "INTER_LANCZOS4")]
)
def test_bicubic_and_lanczos_are_opencvs(tmp_path, interpolation, flag):
    """Documented: bicubic and lanczos are OpenCV's kernels (not tf.image.resize's)."""
    import cv2

    path = write_image(tmp_path / "src" / "a" / "x.png", size=(12, 10), mode="RGB", seed=4)
    record = _one_record(tmp_path, image_size=(5, 7), interpolation=interpolation, encoding="raw")
    want = cv2.resize(np.asarray(Image.open(path)), (7, 5), interpolation=getattr(cv2, flag))
    np.testing.assert_array_equal(decode(record), want)


def test_encode_one_of_an_array_payload(tmp_path):
    rng = np.random.default_rng(6)
    pixels = rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8)
    spec = ImageSpec(height=4, width=5, channels=3, encoding="raw")
    record = encode_record(tmp_path, pixels, spec)
    assert record["size"] == (4, 5)
    np.testing.assert_array_equal(decode(record), pixels)


# -- the bad-input zoo --------------------------------------------------------------------


GOOD = {"a": 4, "b": 3}


@pytest.fixture(params=["headers-probed", "header-free"])
def zoo_options(request) -> dict:
    """With every option given, the first pass only hashes files: bad ones surface later."""
    if request.param == "headers-probed":
        return {"image_size": (12, 10), "color_mode": "auto"}
    return {"image_size": (12, 10), "color_mode": "grayscale", "encoding": "raw"}


def _convert_with_bad(tmp_path: Path, make_bad, **options):
    """A good folder (a: 4, b: 3) plus one bad file ``a/bad.*``; converts it.

    ``image_size`` is given, as it would be for real data of mixed sizes, so a
    truncated file whose header is intact (and names another size) is judged
    on its pixels.
    """
    src = make_folder(tmp_path / "src", GOOD)
    good_keys = sorted(str(p.relative_to(src)) for p in src.rglob("*.png"))
    bad = make_bad(src / "a")
    out = tmp_path / "out"
    result = convert(src, out, **options)
    return result, out, good_keys, f"a/{bad.name}"


def _assert_rejected_alone(result, out: Path, good_keys: list[str], bad_key: str) -> str:
    """The conversion succeeded, rejected exactly ``bad_key``, and wrote every good image."""
    rejects = result.manifest.rejects
    assert [r["key"] for r in rejects] == [bad_key]
    reason = rejects[0]["reason"]
    assert isinstance(reason, str) and reason.strip()
    assert result.num_rejected == 1
    assert chute.load_manifest(str(out)).rejects == rejects  # also in manifest.json

    with open(out / "rejects.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert rows == [{"key": bad_key, "reason": reason}]

    assert result.num_written == {"train": sum(GOOD.values())}
    assert result.manifest.splits["train"]["class_counts"] == [GOOD["a"], GOOD["b"]]
    assert sorted(r["key"] for r in all_records(out)) == good_keys
    return reason.lower()


def test_zero_byte_file_is_rejected(tmp_path, zoo_options):
    def make(folder):
        path = folder / "bad.png"
        path.write_bytes(b"")
        return path

    reason = _assert_rejected_alone(*_convert_with_bad(tmp_path, make, **zoo_options))
    assert "empty" in reason or "0 bytes" in reason


def test_truncated_png_is_rejected(tmp_path, zoo_options):
    def make(folder):
        path = write_image(folder / "bad.png", size=(48, 48), seed=11)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path

    reason = _assert_rejected_alone(*_convert_with_bad(tmp_path, make, **zoo_options))
    assert "truncated" in reason or "corrupt" in reason


def test_truncated_jpeg_is_rejected(tmp_path, zoo_options):
    def make(folder):
        path = write_image(folder / "bad.jpg", size=(64, 64), mode="RGB", seed=12)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path

    reason = _assert_rejected_alone(*_convert_with_bad(tmp_path, make, **zoo_options))
    assert "truncated" in reason or "corrupt" in reason


def test_text_file_with_jpg_extension_is_rejected(tmp_path, zoo_options):
    def make(folder):
        path = folder / "bad.jpg"
        path.write_text("this is not a JPEG, just some text\n" * 20)
        return path

    reason = _assert_rejected_alone(*_convert_with_bad(tmp_path, make, **zoo_options))
    assert "image" in reason


def test_unreadable_file_is_rejected(tmp_path, zoo_options):
    probe = write_image(tmp_path / "probe.png")
    probe.chmod(0)
    try:
        with open(probe, "rb"):
            pytest.skip("running as a user (root) who can read a chmod 000 file")
    except PermissionError:
        pass

    def make(folder):
        path = write_image(folder / "bad.png", seed=13)
        path.chmod(0)
        return path

    try:
        reason = _assert_rejected_alone(*_convert_with_bad(tmp_path, make, **zoo_options))
    finally:
        (tmp_path / "src" / "a" / "bad.png").chmod(0o644)
    assert "read" in reason or "permission" in reason


def test_dangling_symlink_with_image_name_is_rejected(tmp_path, zoo_options):
    """An image name that cannot be opened at all (works even as root)."""

    def make(folder):
        path = folder / "bad.png"
        path.symlink_to(folder / "gone.png")
        return path

    reason = _assert_rejected_alone(*_convert_with_bad(tmp_path, make, **zoo_options))
    assert "read" in reason or "no such file" in reason


def test_image_over_max_pixels_is_rejected(tmp_path, zoo_options):
    def make(folder):
        return write_image(folder / "bad.png", size=(40, 40), seed=14)  # 1600 pixels

    result, out, good_keys, bad_key = _convert_with_bad(
        tmp_path, make, max_pixels=500, **zoo_options
    )
    reason = _assert_rejected_alone(result, out, good_keys, bad_key)  # good ones are 120 px
    assert "pixels" in reason and "500" in reason
    assert result.manifest.options["max_pixels"] == 500


def test_every_kind_of_bad_input_at_once(tmp_path, zoo_options):
    src = make_folder(tmp_path / "src", GOOD)
    good_keys = sorted(str(p.relative_to(src)) for p in src.rglob("*.png"))
    (src / "a" / "empty.png").write_bytes(b"")
    (src / "b" / "text.jpg").write_text("hello")
    png = write_image(src / "a" / "cut.png", size=(48, 48), seed=21).read_bytes()
    (src / "a" / "cut.png").write_bytes(png[: len(png) // 2])
    jpg = write_image(src / "b" / "cut.jpg", size=(64, 64), mode="RGB", seed=22).read_bytes()
    (src / "b" / "cut.jpg").write_bytes(jpg[: len(jpg) // 2])
    write_image(src / "b" / "huge.png", size=(40, 40), seed=23)
    bad = ["a/cut.png", "a/empty.png", "b/cut.jpg", "b/huge.png", "b/text.jpg"]

    out = tmp_path / "out"
    result = convert(src, out, max_pixels=500, **zoo_options)
    assert sorted(r["key"] for r in result.manifest.rejects) == bad
    assert all(r["reason"] for r in result.manifest.rejects)
    with open(out / "rejects.csv", newline="", encoding="utf-8") as handle:
        assert sorted(row["key"] for row in csv.DictReader(handle)) == bad
    assert sorted(r["key"] for r in all_records(out)) == good_keys
    assert result.num_written == {"train": len(good_keys)}


def test_encode_chunk_reports_rejects_and_keeps_going(tmp_path):
    good = write_image(tmp_path / "good.png", size=(4, 4))
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    spec = ImageSpec(height=4, width=4, channels=1, encoding="raw")
    results = encode.encode_chunk(
        [("g1", 0, str(good)), ("e", 1, str(empty)), ("g2", 2, str(good))], spec, 10**6
    )
    assert [r.reject for r in results][0::2] == [None, None]
    assert results[1].reject == "empty file (0 bytes)" and results[1].record is None
    assert results[0].record == encode.encode_one("g1", 0, str(good), spec)
    assert results[2].record == encode.encode_one("g2", 2, str(good), spec)
    assert results[0].digest == results[2].digest == hashlib.sha256(good.read_bytes()).digest()
    with pytest.raises(Rejected):
        encode.encode_one("e", 1, str(empty), spec)
    with pytest.raises(Rejected):
        encode.encode_one("x", 0, str(tmp_path / "missing.png"), spec)


# -- the OpenCV fast path for plain PNGs -----------------------------------------------------------


def test_plain_png_takes_the_fast_path_with_the_same_pixels(tmp_path):
    pixels = np.random.default_rng(3).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    path = write_image(tmp_path / "x.png", pixels)
    spec = ImageSpec(height=None, width=None, channels=3, encoding="raw")
    assert image_decode._png_fast(path.read_bytes(), spec, 10**6) is not None
    np.testing.assert_array_equal(decode(encode_record(tmp_path, str(path), spec)), pixels)


def test_png_with_orientation_or_transparency_goes_through_pillow(tmp_path):
    stored = np.zeros((4, 8), np.uint8)
    stored[:, :4] = 255  # white left half
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    rotated = tmp_path / "rotated.png"
    Image.fromarray(stored).save(rotated, exif=exif)
    spec = ImageSpec(height=None, width=None, channels=1, encoding="raw")
    assert image_decode._png_fast(rotated.read_bytes(), spec, 10**6) is None
    record = encode_record(tmp_path, str(rotated), spec)
    np.testing.assert_array_equal(decode(record)[..., 0], np.rot90(stored, k=-1))

    rgb = np.full((4, 4, 3), 200, np.uint8)
    keyed = tmp_path / "keyed.png"
    Image.fromarray(rgb).save(keyed, transparency=(200, 200, 200))
    spec = ImageSpec(height=None, width=None, channels=3, encoding="raw")
    assert image_decode._png_fast(keyed.read_bytes(), spec, 10**6) is None
    expected = np.asarray(image_decode.to_channels(Image.open(keyed), 3))
    np.testing.assert_array_equal(decode(encode_record(tmp_path, str(keyed), spec)), expected)


def test_any_decoder_exception_rejects_the_image_only(tmp_path, monkeypatch):
    """Pillow's plugins raise more than OSError on hostile files (struct.error,
    IndexError, ...): such an image is rejected, the rest still converted."""
    import struct

    from PIL import ImageFile

    good = write_image(tmp_path / "src" / "a" / "good.png", size=(4, 4))
    odd = write_image(tmp_path / "src" / "a" / "odd.bmp", size=(4, 4))
    real_load = ImageFile.ImageFile.load

    def load(self):
        if self.format == "BMP":
            raise struct.error("unpack requires a buffer of 4 bytes")
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    spec = ImageSpec(height=4, width=4, channels=1, encoding="raw")
    with pytest.raises(Rejected, match="unpack requires"):
        encode.encode_one("odd", 0, str(odd), spec)
    assert encode.encode_one("good", 0, str(good), spec)
    result = convert(tmp_path / "src", tmp_path / "out", image_size=4, color_mode="grayscale")
    assert [r["key"] for r in result.manifest.rejects] == ["a/odd.bmp"]
