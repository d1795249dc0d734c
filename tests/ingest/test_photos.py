"""Photos in chute convert: DCT-scaled JPEG decoding, and photos kept larger than the
training size (``shorter_side``) for random-resized crops when reading."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from helpers import all_records, decode, tree_bytes
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

import chute
from chute import ChuteError
from chute.format.spec import ImageSpec
from chute.image import resize as resizing
from chute.image.decode import load_pixels

ORIENTATION = 0x0112


def photo(path: Path, size=(900, 1200), *, seed: int = 0, exif: int | None = None) -> Path:
    """A smooth, photo-like JPEG of ``size`` (height, width): gradients plus mild noise."""
    height, width = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 6.28, 3)
    channels = [
        127 + 100 * np.sin(x / (37 + 11 * c) + y / (53 + 7 * c) + phase[c]) for c in range(3)
    ]
    pixels = np.stack(channels, -1) + rng.normal(0, 4, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {}
    if exif is not None:
        tags = Image.Exif()
        tags[ORIENTATION] = exif
        extra["exif"] = tags
    image.save(path, quality=92, **extra)
    return path


def full_decode(path: Path, spec: ImageSpec) -> np.ndarray:
    """The same conversion without DCT scaling: a full decode, then the same resize."""
    image = Image.open(path)
    image.load()
    from PIL import ImageOps

    pixels = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
    return resizing.resize(pixels, spec.height, spec.width, spec.resize, spec.interpolation)


@pytest.mark.parametrize("resize", ["stretch", "crop", "pad"])
@pytest.mark.parametrize("exif", [None, 6])
def test_large_jpegs_decode_at_a_reduced_scale_close_to_a_full_decode(
    tmp_path, monkeypatch, resize, exif
):
    path = photo(tmp_path / "big.jpg", (900, 1400), exif=exif)
    spec = ImageSpec(112, 96, 3, "raw", resize=resize, interpolation="area")
    drafted = []
    real = JpegImageFile.draft

    def spy(self, mode, size):
        result = real(self, mode, size)
        drafted.append((size, self.size))
        return result

    monkeypatch.setattr(JpegImageFile, "draft", spy)
    pixels, _ = load_pixels(str(path), spec)
    monkeypatch.undo()
    assert pixels.shape == (112, 96, 3)
    ((asked, got),) = drafted
    # the decoder returned a reduced image, still at least what the resize needs
    assert got[0] < 1400 and got[0] >= asked[0] and got[1] >= asked[1]
    reference = full_decode(path, spec)
    difference = np.abs(pixels.astype(int) - reference.astype(int))
    assert difference.mean() < 4.0, difference.mean()  # of 255: see the README


def test_small_targets_of_small_images_are_decoded_in_full(tmp_path, monkeypatch):
    path = photo(tmp_path / "small.jpg", (120, 160))
    asked = []
    monkeypatch.setattr(JpegImageFile, "draft", lambda self, mode, size: asked.append(size))
    load_pixels(str(path), ImageSpec(100, 100, 3, "raw", resize="crop"))
    assert asked == []  # 100 is more than half of 120: no DCT scale would fit


def test_conversion_of_photos_is_deterministic_for_any_worker_count(tmp_path):
    for i in range(70):
        photo(tmp_path / "src" / ("a" if i % 2 else "b") / f"{i:03d}.jpg", (300, 420), seed=i)
    options = {"image_size": 64, "resize": "crop", "encoding": "jpeg", "min_shards": 2}
    chute.convert(tmp_path / "src", tmp_path / "one", workers=1, **options)
    chute.convert(tmp_path / "src", tmp_path / "two", workers=2, **options)
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")


def test_shorter_side_keeps_aspect_ratios_and_shrinks_only_large_photos(tmp_path):
    src = tmp_path / "src"
    photo(src / "a" / "wide.jpg", (300, 500), seed=1)
    photo(src / "a" / "tall.jpg", (480, 240), seed=2)
    small = photo(src / "b" / "small.jpg", (90, 120), seed=3)
    photo(src / "b" / "turned.jpg", (200, 400), seed=4, exif=6)  # upright: 400 x 200
    out = tmp_path / "out"
    result = chute.convert(src, out, shorter_side=120, workers=1)
    spec = result.manifest.image
    assert spec == ImageSpec(None, None, 3, "jpeg", shorter_side=120)
    assert spec.describe() == "shorter side <= 120 x3 jpeg"
    sizes = {record["key"]: record["size"] for record in all_records(out)}
    assert sizes == {
        "a/wide.jpg": (120, 200),
        "a/tall.jpg": (240, 120),
        "b/small.jpg": (90, 120),
        "b/turned.jpg": (240, 120),
    }
    # an upright JPEG that needs no resize is stored as it is
    (kept,) = [r for r in all_records(out) if r["key"] == "b/small.jpg"]
    assert kept["image"] == small.read_bytes()
    # pixels: the same steps by hand (a full decode, then the resize) come close
    (wide,) = [r for r in all_records(out) if r["key"] == "a/wide.jpg"]
    by_hand = np.asarray(Image.open(src / "a" / "wide.jpg").convert("RGB").resize((200, 120)))
    assert np.abs(decode(wide).astype(int) - by_hand.astype(int)).mean() < 6
    assert chute.verify(out).ok


def test_shorter_side_from_the_command_line(tmp_path):
    from helpers import run_here

    photo(tmp_path / "src" / "a" / "x.jpg", (300, 400))
    photo(tmp_path / "src" / "b" / "y.jpg", (300, 400), seed=1)
    done = run_here("convert", tmp_path / "src", tmp_path / "out", "--shorter-side", "150")
    assert done.returncode == 0, done.stderr
    assert "shorter side <= 150 x3 jpeg" in done.stdout
    record = all_records(tmp_path / "out")[0]
    assert record["size"] == (150, 200)
    assert Image.open(io.BytesIO(record["image"])).size == (200, 150)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"shorter_side": 0}, "`shorter_side` must be"),
        ({"shorter_side": 64, "image_size": 32}, "excludes `image_size`"),
        ({"shorter_side": 64, "keep_size": True}, "excludes `image_size` and `keep_size`"),
        ({"shorter_side": 64, "encoding": "raw"}, "when shorter_side is set"),
    ],
)
def test_shorter_side_option_errors(options, message):
    with pytest.raises(ChuteError, match=message):
        chute.ConvertOptions(**options)


@pytest.mark.parametrize("keep_metadata", [False, True])
def test_jpegs_stored_as_they_came_lose_their_metadata_unless_asked(tmp_path, keep_metadata):
    pixels = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x010F] = "CameraMaker"
    exif[0x8825] = {1: "N", 2: (51.0, 28.0, 38.0)}  # GPS latitude
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", exif=exif, comment=b"secret note")
    original = buffer.getvalue() + b"trailing bytes after the end marker"
    for name in ("a", "b"):
        (tmp_path / "src" / name).mkdir(parents=True)
        (tmp_path / "src" / name / "x.jpg").write_bytes(original)
    out = tmp_path / "out"
    chute.convert(tmp_path / "src", out, keep_size=True, keep_metadata=keep_metadata, workers=1)
    (record, *_) = all_records(out)
    if keep_metadata:
        assert record["image"] == original
    else:
        stored = record["image"]
        assert b"Exif" not in stored and b"secret note" not in stored
        assert b"CameraMaker" not in stored and stored.endswith(b"\xff\xd9")
        same = np.asarray(Image.open(io.BytesIO(stored)))
        np.testing.assert_array_equal(same, np.asarray(Image.open(io.BytesIO(original))))
