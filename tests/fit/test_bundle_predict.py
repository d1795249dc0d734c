"""Model bundles, prediction on the CPU, and export for serving or reloading.

The model is built here with hand-set weights, so every answer is known in
advance: a Dense layer over the mean brightness tells "dark", "mid" and
"bright" 8x8 grayscale images apart. Images are a few pixels each, written
into temp dirs; one test predicts in a fresh Python process to show that a
saved bundle reloads with nothing but its folder.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from helpers import decode, read_records, write_image
from PIL import Image

import chute
from chute.errors import ChuteError
from chute.fit.export import export
from chute.fit.predict import Prediction, PredictResult, predict, prepare_image
from chute.format.bundle import Bundle, load_bundle, save_bundle
from chute.format.spec import ImageSpec
from chute.ingest import encode

CLASSES = ["dark", "mid", "bright"]
IMAGE = ImageSpec(height=8, width=8, channels=1)  # stretched, bilinear
ORIENTATION = 0x0112


def make_model(activation: str = "softmax"):
    """uint8 (8, 8, 1) -> class probabilities; the class follows the mean brightness m.

    Logits: dark 20 * (0.33 - m), mid 0, bright 20 * (m - 0.67).
    """
    import keras

    inputs = keras.Input((8, 8, 1), dtype="uint8")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(3, activation=activation, dtype="float32")(x)
    model = keras.Model(inputs, outputs)
    kernel = np.zeros((64, 3), np.float32)
    kernel[:, 0], kernel[:, 2] = -20 / 64, 20 / 64
    model.layers[-1].set_weights([kernel, np.array([20 * 0.33, 0, -20 * 0.67], np.float32)])
    return model


U = 2.0**-24  # float32's unit round-off


def score_rtol(model) -> float:
    """How far, relatively, the probabilities of a model like ``make_model``'s (a Dense
    layer over pixels scaled to [0, 1], then softmax) may move between two float32
    computations of the same images that sum in other orders: the kernel oneDNN picks
    for another batch size, a SavedModel's graph, another process.

    A logit z_k = b_k + sum_i w_ik x_i of n terms, summed in any order, is within
    gamma_n * L_k of its exact value, where L_k = |b_k| + sum_i |w_ik| (as 0 <= x_i <= 1)
    and gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability of Numerical
    Algorithms, 3.1); n counts the scaling and the bias too. Two computations' logits
    then differ by up to 2 gamma_n max L_k, and log p_k = z_k - logsumexp(z) by twice
    that: rtol = 4 gamma_n max L_k, plus the softmax's own roundings (exp, sum, divide:
    a few u each run). For make_model: n = 66, L = 20 + 13.4, rtol ~ 5e-4, while any
    two of the test images have a score a factor of 1.8 apart or more, so a score
    given to the wrong image still fails.
    """
    kernel, bias = model.layers[-1].get_weights()
    n = kernel.shape[0] + 2
    gamma = n * U / (1 - n * U)
    magnitude = float((np.abs(kernel).sum(axis=0) + np.abs(bias)).max())
    return 4 * gamma * magnitude + 16 * U


def batch(n: int, seed: int) -> np.ndarray:
    """``n`` noisy uint8 images from black to white: every class is among them."""
    noise = np.random.default_rng(seed).integers(-20, 21, (n, 8, 8, 1))
    levels = np.linspace(0, 255, n).reshape(n, 1, 1, 1)
    return np.clip(levels + noise, 0, 255).astype(np.uint8)


def solid(value: int, size=(8, 8), mode="L") -> np.ndarray:
    shape = (*size, 3) if mode == "RGB" else size
    return np.full(shape, value, np.uint8)


def expected_class(mean: float) -> str:
    logits = [20 * (0.33 - mean / 255), 0.0, 20 * (mean / 255 - 0.67)]
    return CLASSES[int(np.argmax(logits))]


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def bundle_dir(model, tmp_path_factory) -> Path:
    """A run folder holding ``bundle/``, as training writes it."""
    run = tmp_path_factory.mktemp("run")
    save_bundle(
        model,
        run / "bundle",
        class_names=CLASSES,
        image=IMAGE,
        info={"val_accuracy": 1.0},
    )
    return run / "bundle"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """A folder of test images: good ones of several kinds, and bad ones."""
    root = tmp_path_factory.mktemp("images")
    write_image(root / "imgs" / "dark.png", solid(20))
    write_image(root / "imgs" / "sub" / "bright.png", solid(235))
    # Pure green: Pillow's luma is 150 ("mid"); its red channel alone (0) would be "dark".
    green = np.zeros((8, 8, 3), np.uint8)
    green[..., 1] = 255
    write_image(root / "imgs" / "green_rgb.png", green)
    write_image(root / "imgs" / "big_bright.png", solid(230, size=(40, 30)))  # resized
    (root / "imgs" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 20)
    (root / "imgs" / "notes.jpg").write_text("not an image at all\n")
    (root / "imgs" / "readme.txt").write_text("skipped: not an image name\n")
    write_image(root / "imgs" / ".hidden.png", solid(20))  # hidden: skipped
    write_image(root / "imgs" / ".cache" / "x.png", solid(20))  # hidden folder: skipped
    write_image(root / "other" / "mid_a.png", solid(128, size=(16, 16)))
    write_image(root / "other" / "mid_b.png", solid(120, size=(4, 4)))
    write_image(root / "single.bmp", solid(10), fmt="BMP")
    return root


# -- bundle -------------------------------------------------------------------------------


def test_bundle_round_trip(model, bundle_dir: Path):
    assert sorted(os.listdir(bundle_dir)) == ["chute.json", "model.keras"]
    body = json.loads((bundle_dir / "chute.json").read_text())
    assert body["format"] == "chute.bundle" and body["version"] == 2
    assert body["class_names"] == CLASSES
    assert body["image"] == IMAGE.to_dict()
    assert body["image"]["resize"] == "stretch" and body["image"]["interpolation"] == "bilinear"
    assert body["info"] == {"val_accuracy": 1.0}

    x = batch(16, seed=0)
    expected = model.predict_on_batch(x)
    assert len(set(np.argmax(expected, axis=1))) == 3  # the inputs span every class
    # The folder, its chute.json, its model.keras and the run folder above it all work.
    for path in (
        bundle_dir,
        bundle_dir / "chute.json",
        bundle_dir / "model.keras",
        bundle_dir.parent,
    ):
        bundle = load_bundle(path)
        assert Path(bundle.location).resolve() == bundle_dir.resolve()
        assert bundle.class_names == CLASSES
        assert bundle.image == IMAGE
        assert bundle.info == {"val_accuracy": 1.0}
    np.testing.assert_allclose(bundle.model.predict_on_batch(x), expected, rtol=1e-6)


def test_bundle_on_a_tf_filesystem(model, images: Path):
    root = f"ram://chute-bundle-test-{uuid.uuid4().hex}"
    save_bundle(model, root + "/run/bundle", class_names=CLASSES, image=IMAGE)
    bundle = load_bundle(root + "/run")
    assert bundle.location == root + "/run/bundle"
    import tensorflow as tf

    tf.io.gfile.makedirs(root + "/imgs/sub")
    tf.io.gfile.copy(str(images / "imgs" / "dark.png"), root + "/imgs/dark.png")
    tf.io.gfile.copy(str(images / "imgs" / "sub" / "bright.png"), root + "/imgs/sub/bright.png")
    result = predict(root + "/run", [root + "/imgs"], top_k=1)
    assert [(p.path, p.class_name) for p in result.predictions] == [
        (root + "/imgs/dark.png", "dark"),
        (root + "/imgs/sub/bright.png", "bright"),
    ]
    assert result.failures == []

    served = tf.saved_model.load(export(root + "/run", root + "/serving/1"))
    x = batch(4, seed=3)
    np.testing.assert_allclose(
        served.serve(x).numpy(), model.predict_on_batch(x), rtol=score_rtol(model)
    )
    assert load_bundle(export(bundle, root + "/kx", format="keras")).class_names == CLASSES


def test_load_bundle_errors(tmp_path: Path, bundle_dir: Path):
    with pytest.raises(ChuteError, match=r"`path` does not exist.*Received: path=.*nowhere"):
        load_bundle(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ChuteError, match=r"No chute.json in .*empty.* nor in its bundle/"):
        load_bundle(tmp_path / "empty")
    half = tmp_path / "half"
    half.mkdir()
    (half / "model.keras").write_bytes((bundle_dir / "model.keras").read_bytes())
    with pytest.raises(ChuteError, match=r"holds model\.keras but no chute\.json"):
        load_bundle(half)
    (half / "chute.json").write_text('{"format": "chute.manifest", "version": 1}')
    with pytest.raises(ChuteError, match="is not a chute model bundle"):
        load_bundle(half)
    body = json.loads((bundle_dir / "chute.json").read_text())
    (half / "chute.json").write_text(json.dumps({**body, "version": 4}))
    with pytest.raises(ChuteError, match="newer chute"):
        load_bundle(half)
    (half / "chute.json").write_text(
        json.dumps({**body, "image": {"height": 8, "width": 8, "channels": 4}})
    )
    with pytest.raises(ChuteError, match=r"not a valid chute model bundle.*channels"):
        load_bundle(half)
    (half / "chute.json").write_text("{not json")
    with pytest.raises(ChuteError, match="not valid JSON"):
        load_bundle(half)
    (half / "chute.json").write_text(json.dumps(body))
    (half / "model.keras").unlink()
    with pytest.raises(ChuteError, match=r"has chute\.json but no model\.keras"):
        load_bundle(half)


def test_save_bundle_checks_against_the_model(model, tmp_path: Path):
    args = {"class_names": CLASSES, "image": IMAGE}
    with pytest.raises(ChuteError, match=r"one name per model output \(3\).*2 class names"):
        save_bundle(model, tmp_path / "b", **{**args, "class_names": ["a", "b"]})
    with pytest.raises(ChuteError, match=r"`image` must match the model's input shape"):
        save_bundle(model, tmp_path / "b", **{**args, "image": ImageSpec(8, 8, 3)})
    with pytest.raises(ChuteError, match=r"`crop_fraction` must be"):
        save_bundle(model, tmp_path / "b", **args, crop_fraction=0)
    with pytest.raises(ChuteError, match=r"`image` must be an ImageSpec"):
        save_bundle(model, tmp_path / "b", **{**args, "image": IMAGE.to_dict()})
    with pytest.raises(ChuteError, match=r"`resize` must be one of"):
        ImageSpec(8, 8, 1, resize="zoom")
    with pytest.raises(ChuteError, match="`class_names` must be unique"):
        save_bundle(model, tmp_path / "b", **{**args, "class_names": ["a", "a", "b"]})
    with pytest.raises(ChuteError, match="`info` must be JSON-serialisable"):
        save_bundle(model, tmp_path / "b", **args, info={"x": object()})
    assert not (tmp_path / "b" / "chute.json").exists()
    # The input size comes from the model, whatever size the images were stored at.
    stored = ImageSpec(None, None, 1, "png", shorter_side=30)
    save_bundle(model, tmp_path / "b", **{**args, "image": stored}, crop_fraction=0.5)
    loaded = load_bundle(tmp_path / "b")
    assert loaded.image == stored and loaded.input_size == (8, 8)
    assert loaded.crop_fraction == 0.5


def test_a_version_1_bundle_still_loads(model, bundle_dir: Path, tmp_path: Path):
    """Bundles of chute.json version 1 kept the resize mode and interpolation apart."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.keras").write_bytes((bundle_dir / "model.keras").read_bytes())
    body = {
        "format": "chute.bundle",
        "version": 1,
        "class_names": CLASSES,
        "image": {"height": 8, "width": 8, "channels": 1},
        "preprocessing": {"resize": "pad", "interpolation": "area"},
        "info": {},
    }
    (old / "chute.json").write_text(json.dumps(body))
    bundle = load_bundle(old)
    assert bundle.image == ImageSpec(8, 8, 1, resize="pad", interpolation="area")
    x = batch(4, seed=2)
    np.testing.assert_allclose(
        bundle.model.predict_on_batch(x), model.predict_on_batch(x), rtol=1e-6
    )


# -- preprocessing: what predict feeds the model is what convert stored -------------------


def test_prepare_image_matches_convert(tmp_path: Path):
    src = tmp_path / "src"
    write_image(src / "a" / "rgb_wide.png", size=(12, 30), mode="RGB", seed=1)
    write_image(src / "a" / "palette.png", size=(20, 9), mode="P", seed=2)
    write_image(src / "b" / "gray_tall.jpg", size=(31, 7), seed=3)
    rotated = Image.fromarray(np.random.default_rng(4).integers(0, 256, (10, 24, 3), np.uint8))
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    (src / "b").mkdir(parents=True, exist_ok=True)
    rotated.save(src / "b" / "rotated.jpg", exif=exif)
    out = tmp_path / "out"
    chute.convert(
        src,
        out,
        workers=1,
        image_size=(9, 11),
        color_mode="grayscale",
        encoding="raw",
        resize="pad",
        interpolation="area",
    )
    manifest = chute.load_manifest(out)
    spec = manifest.image
    assert spec.shape == (9, 11, 1)
    assert (spec.resize, spec.interpolation) == ("pad", "area")
    bundle = Bundle(class_names=manifest.class_names, image=spec, info={}, location="")
    records = [r for path in manifest.shard_paths("train") for r in read_records(path)]
    assert len(records) == 4
    for record in records:
        np.testing.assert_array_equal(
            prepare_image(str(src / record["key"]), bundle), decode(record)
        )


def test_prepare_image_rgb_model(tmp_path: Path):
    pixels = np.random.default_rng(5).integers(0, 256, (13, 21), np.uint8)
    path = write_image(tmp_path / "gray.png", pixels)
    spec = ImageSpec(6, 6, 3, "raw", resize="crop", interpolation="nearest")
    bundle = Bundle(class_names=CLASSES, image=spec, info={}, location="")
    framed = encode.encode_one("k", 0, path.read_bytes(), spec)
    (tmp_path / "one.tfrecord").write_bytes(framed)
    (record,) = read_records(tmp_path / "one.tfrecord")
    got = prepare_image(str(path), bundle)
    assert got.shape == (6, 6, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, decode(record))
    np.testing.assert_array_equal(prepare_image(path.read_bytes(), bundle), got)


# -- predict ------------------------------------------------------------------------------


def predict_all(bundle_dir: Path, images: Path, **kwargs) -> PredictResult:
    return predict(
        bundle_dir.parent,  # the run folder
        [
            images / "imgs",
            str(images / "other" / "*.png"),
            images / "single.bmp",
            images / "missing.png",
        ],
        **kwargs,
    )


def test_predict_files_folders_globs(bundle_dir: Path, images: Path):
    result = predict_all(bundle_dir, images, top_k=3)
    got = {Path(p.path).relative_to(images).as_posix(): p for p in result.predictions}
    # Folder files sorted (recursively), then the glob's matches, then the file.
    assert list(got) == [
        "imgs/big_bright.png",
        "imgs/dark.png",
        "imgs/green_rgb.png",
        "imgs/sub/bright.png",
        "other/mid_a.png",
        "other/mid_b.png",
        "single.bmp",
    ]
    expected = {
        "imgs/big_bright.png": expected_class(230),
        "imgs/dark.png": "dark",
        "imgs/green_rgb.png": "mid",  # converted to gray (luma 150), not one channel
        "imgs/sub/bright.png": "bright",
        "other/mid_a.png": "mid",  # 16x16, resized
        "other/mid_b.png": "mid",  # 4x4, resized
        "single.bmp": "dark",
    }
    assert expected["imgs/big_bright.png"] == "bright"
    assert {k: p.class_name for k, p in got.items()} == expected
    for p in result.predictions:
        assert len(p.top) == 3 and sorted(name for name, _ in p.top) == sorted(CLASSES)
        probs = [prob for _, prob in p.top]
        assert probs == sorted(probs, reverse=True)
        assert 0 < sum(probs) <= 1 + 1e-6 and all(0 <= q <= 1 for q in probs)
    # The same numbers the model gives for the same pixels, prepared by hand.
    bright = got["imgs/big_bright.png"]
    import cv2

    pixels = cv2.resize(solid(230, size=(40, 30)), (8, 8), interpolation=cv2.INTER_LINEAR)
    reloaded = load_bundle(bundle_dir).model
    direct = reloaded.predict_on_batch(pixels[None, ..., None])[0]  # a batch of 1, not 7
    assert bright.probability == pytest.approx(float(direct.max()), rel=score_rtol(reloaded))

    reasons = {Path(path).name: reason for path, reason in result.failures}
    assert set(reasons) == {"corrupt.png", "notes.jpg", "missing.png"}
    assert "no such file or folder" in reasons["missing.png"]
    assert "not an image" in reasons["notes.jpg"]
    assert reasons["corrupt.png"]  # Pillow's reason, whichever it is


def test_predict_gives_the_same_answers_whatever_the_batch_size(
    model, bundle_dir: Path, images: Path
):
    # Images are decoded batch by batch; unreadable files fall inside batches. Each batch
    # size may get its own kernel (another order of summation): the scores agree within
    # float32 round-off (score_rtol), the ranking exactly (no two logits of an image are
    # within round-off of each other: the closest, mid_a's dark and bright, are 0.08 apart).
    whole = predict_all(bundle_dir, images)
    for batch_size in (1, 2):
        small = predict_all(bundle_dir, images, batch_size=batch_size)
        assert [p.path for p in small.predictions] == [p.path for p in whole.predictions]
        for a, b in zip(small.predictions, whole.predictions, strict=True):
            assert [n for n, _ in a.top] == [n for n, _ in b.top]
            assert [q for _, q in a.top] == pytest.approx(
                [q for _, q in b.top], rel=score_rtol(model), abs=0
            )
        assert small.failures == whole.failures


def _logits_summed_as(kernel, bias, pixels, order, lanes: int, fma: bool) -> np.ndarray:
    """make_model's float32 logits, summed as some kernel may sum them: the 64 terms in
    ``order``, spread over ``lanes`` partial sums (SIMD lanes, blocks) added at the end,
    each term added with one rounding (``fma``) or two."""
    x = pixels.reshape(len(pixels), -1).astype(np.float32) * np.float32(1 / 255)
    partial = np.zeros((len(x), lanes, kernel.shape[1]), np.float32)
    for j, i in enumerate(order):
        if fma:  # a product of two float32 is exact in float64: rounded once, as an FMA
            exact = partial[:, j % lanes] + x[:, i, None].astype(np.float64) * kernel[i]
            partial[:, j % lanes] = exact.astype(np.float32)
        else:
            partial[:, j % lanes] += x[:, i, None] * kernel[i]
    total = partial[:, 0]
    for lane in range(1, lanes):
        total = total + partial[:, lane]
    return total + bias


def test_score_rtol_covers_the_orders_other_kernels_sum_in(model):
    """What another machine's kernels may do to make_model's scores: sum in another order,
    over several partial sums, with or without FMA. Every way is within score_rtol of every
    other, while 1e-5 (these tests' old tolerance) is not enough."""
    kernel, bias = model.layers[-1].get_weights()
    levels = (10, 20, 120, 128, 150, 230, 235)  # the solid images predict reads
    pixels = np.concatenate([batch(16, seed=0), np.stack([solid(v)[..., None] for v in levels])])
    rng = np.random.default_rng(0)
    scores = []
    for way in range(24):
        order = rng.permutation(64) if way % 2 else np.arange(64)
        lanes, fma = (1, 4, 8, 16)[way % 4], way % 3 == 0
        logits = _logits_summed_as(kernel, bias, pixels, order, lanes, fma)
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        scores.append(e / e.sum(axis=1, keepdims=True))
    spread = float((np.max(scores, axis=0) / np.min(scores, axis=0) - 1).max())
    assert 1e-5 < spread < score_rtol(model), spread


def test_predict_top_k_and_outputs(model, bundle_dir: Path, images: Path):
    result = predict_all(bundle_dir, images, top_k=2)
    every = predict_all(bundle_dir, images)  # the default: 5, or every class when fewer
    assert [len(p.top) for p in every.predictions] == [3] * 7
    for two, three in zip(result.predictions, every.predictions, strict=True):
        assert two.path == three.path and two.top == three.top[:2]
        assert sum(q for _, q in three.top) == pytest.approx(1, abs=1e-6)
        assert sum(q for _, q in two.top) <= 1 - three.top[2][1] + 1e-6

    small_batches = predict_all(bundle_dir, images, top_k=2, batch_size=2)  # 4 batches, 1 padded
    for a, b in zip(small_batches.predictions, result.predictions, strict=True):
        assert a.path == b.path and [n for n, _ in a.top] == [n for n, _ in b.top]
        # another batch size: another kernel, within float32 round-off (see score_rtol)
        np.testing.assert_allclose(
            [q for _, q in a.top], [q for _, q in b.top], rtol=score_rtol(model)
        )

    body = json.loads(result.to_json())
    assert len(body["predictions"]) == 7 and len(body["failures"]) == 3
    first = body["predictions"][0]
    assert first["path"] == result.predictions[0].path
    assert first["top"] == [{"class": n, "probability": q} for n, q in result.predictions[0].top]
    assert {f["path"] for f in body["failures"]} == {p for p, _ in result.failures}

    rows = list(csv.DictReader(io.StringIO(result.to_csv())))
    assert list(rows[0]) == ["path", "rank", "class", "probability"]
    assert len(rows) == 7 * 2
    for i, p in enumerate(result.predictions):
        for rank, (name, prob) in enumerate(p.top, start=1):
            row = rows[2 * i + rank - 1]
            assert (row["path"], row["rank"], row["class"]) == (p.path, str(rank), name)
            assert float(row["probability"]) == prob

    one = predict(bundle_dir, images / "single.bmp", top_k=1)
    assert [(Path(p.path).name, len(p.top)) for p in one.predictions] == [("single.bmp", 1)]
    assert Prediction("x", [("a", 0.5)]).probability == 0.5


def test_predict_errors(bundle_dir: Path, images: Path, tmp_path: Path):
    for bad in (0, 4, True, "3"):
        with pytest.raises(ChuteError, match=rf"`top_k` must be .*Received: top_k={bad!r}"):
            predict(bundle_dir, images / "single.bmp", top_k=bad)
    with pytest.raises(ChuteError, match=r"from 1 to the number of classes \(3\)"):
        predict(bundle_dir, images / "single.bmp", top_k=4)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ChuteError, match=r"`images` must name .*none was found.*no such file"):
        predict(bundle_dir, [tmp_path / "empty", str(tmp_path / "*.png"), tmp_path / "gone.png"])
    with pytest.raises(ChuteError, match=r"`images` must name at least one"):
        predict(bundle_dir, [])
    with pytest.raises(ChuteError, match="`path` does not exist"):
        predict(tmp_path / "no-model", images / "single.bmp")
    # Files were found but none is readable: reported, not an error.
    result = predict(bundle_dir, [images / "imgs" / "notes.jpg"])
    assert result.predictions == [] and len(result.failures) == 1


def test_predict_turns_logits_into_probabilities(images: Path, tmp_path: Path):
    logits_model = make_model(activation="linear")
    save_bundle(logits_model, tmp_path / "b", class_names=CLASSES, image=IMAGE)
    path = images / "imgs" / "dark.png"
    got = predict(tmp_path / "b", path, top_k=3).predictions[0].top
    x = prepare_image(str(path), load_bundle(tmp_path / "b"))[None]
    logits = logits_model.predict_on_batch(x)[0]
    assert logits.min() < 0  # a real logits model, or the test proves nothing
    want = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert [n for n, _ in got] == ["dark", "mid", "bright"]
    np.testing.assert_allclose([q for _, q in got], np.sort(want)[::-1], rtol=1e-5)


def test_predict_in_a_fresh_process(model, bundle_dir: Path, images: Path):
    """The saved bundle is all a new process needs (the "reload on a CPU machine" case)."""
    code = (
        "import sys\n"
        "from chute.fit.predict import predict\n"
        "print(predict(sys.argv[1], sys.argv[2:], top_k=3).to_json())\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = [str(bundle_dir), str(images / "imgs"), str(images / "single.bmp")]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = json.loads(done.stdout)
    here = json.loads(predict(bundle_dir, args[1:], top_k=3).to_json())
    assert [p["path"] for p in fresh["predictions"]] == [p["path"] for p in here["predictions"]]
    assert len(fresh["predictions"]) == 5
    for a, b in zip(fresh["predictions"], here["predictions"], strict=True):
        assert [t["class"] for t in a["top"]] == [t["class"] for t in b["top"]]
        np.testing.assert_allclose(  # another process may get other kernels
            [t["probability"] for t in a["top"]],
            [t["probability"] for t in b["top"]],
            rtol=score_rtol(model),
        )
    assert fresh["failures"] == here["failures"]


# -- export -------------------------------------------------------------------------------


def test_export_keras(model, bundle_dir: Path, tmp_path: Path):
    out = export(bundle_dir.parent, tmp_path / "kx", format="keras")
    assert sorted(os.listdir(out)) == ["chute.json", "model.keras"]
    reloaded = load_bundle(out)
    assert reloaded.class_names == CLASSES and reloaded.image == IMAGE
    x = batch(5, seed=1)
    np.testing.assert_allclose(
        reloaded.model.predict_on_batch(x), model.predict_on_batch(x), rtol=1e-6
    )


def test_export_savedmodel(model, bundle_dir: Path, tmp_path: Path):
    import tensorflow as tf

    out = export(bundle_dir, tmp_path / "serving" / "1")
    assert {"saved_model.pb", "variables", "chute.json"} <= set(os.listdir(out))
    meta = json.loads((Path(out) / "chute.json").read_text())
    assert meta["class_names"] == CLASSES and meta["image"] == IMAGE.to_dict()
    assert meta["export"]["format"] == "savedmodel"

    loaded = tf.saved_model.load(out)
    x = batch(6, seed=2)
    served = loaded.serve(tf.constant(x)).numpy()
    # a SavedModel's graph, optimised apart from Keras's: float32 round-off (score_rtol)
    np.testing.assert_allclose(served, model.predict_on_batch(x), rtol=score_rtol(model))
    signature = loaded.signatures["serving_default"]
    (spec,) = signature.structured_input_signature[1].values()
    assert spec.dtype == tf.uint8 and spec.shape.as_list() == [None, 8, 8, 1]
    np.testing.assert_allclose(signature(images=tf.constant(x))["output_0"].numpy(), served)
    with pytest.raises(ChuteError, match="savedmodel export, not a model bundle"):
        load_bundle(out)


def test_export_errors(bundle_dir: Path, tmp_path: Path):
    with pytest.raises(
        ChuteError, match=r"`format` must be one of \{'savedmodel', 'keras'\}.*onnx"
    ):
        export(bundle_dir, tmp_path / "x", format="onnx")
    with pytest.raises(ChuteError, match="`path` does not exist"):
        export(tmp_path / "no-run", tmp_path / "x")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(ChuteError, match=r"`output` is a non-empty folder.*overwrite=True"):
        export(bundle_dir, busy, format="keras")
    assert (busy / "keep.txt").exists()
    # overwrite replaces an earlier export, never a folder of someone else's files
    with pytest.raises(ChuteError, match="only replaces an earlier chute export"):
        export(bundle_dir, busy, format="keras", overwrite=True)
    assert sorted(os.listdir(busy)) == ["keep.txt"]
    earlier = tmp_path / "earlier"
    export(bundle_dir, earlier, format="keras")
    (earlier / "stale.txt").write_text("left by the earlier export")
    export(bundle_dir, earlier, format="keras", overwrite=True)
    assert sorted(os.listdir(earlier)) == ["chute.json", "model.keras"]
    for inside in (bundle_dir, bundle_dir.parent):
        with pytest.raises(ChuteError, match="must not be the bundle's folder or a folder above"):
            export(bundle_dir, inside, format="keras", overwrite=True)
    assert sorted(os.listdir(bundle_dir)) == ["chute.json", "model.keras"]


@pytest.mark.parametrize(
    "options",
    [
        {"shorter_side": 20},  # JPEG photos kept at their aspect ratio: a 0.875 centre crop
        {"image_size": 12, "resize": "crop", "encoding": "jpeg"},
        {"image_size": 12, "resize": "pad", "encoding": "raw"},
    ],
)
def test_predict_scores_a_file_as_evaluate_scores_its_record(tmp_path, options):
    """A file gets in predict exactly the pixels its record gets in evaluation, so the
    model's scores are the same."""
    import keras

    src = tmp_path / "src"
    for c, name in enumerate(["a", "b"]):
        for i, size in enumerate([(30, 40), (44, 26), (24, 24)]):
            write_image(src / name / f"{i}.jpg", size=size, mode="RGB", seed=10 * c + i)
    out = tmp_path / "out"
    manifest = chute.convert(src, out, workers=1, **options).manifest
    inputs = keras.Input((12, 12, 3), dtype="uint8")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))
    fraction = 0.875 if "shorter_side" in options else 1.0
    save_bundle(
        model, tmp_path / "b", class_names=["a", "b"], image=manifest.image, crop_fraction=fraction
    )
    report_ds = chute.load(
        out, training=False, batch_size=32, image_size=(12, 12), crop_fraction=fraction
    )
    (images, _), *_ = list(report_ds)
    keys = [record["key"] for record in read_records(manifest.shard_paths("train")[0])]
    keys += [r["key"] for path in manifest.shard_paths("train")[1:] for r in read_records(path)]
    files = [str(src / key) for key in keys]
    bundle = load_bundle(tmp_path / "b")
    for file, image in zip(files, images.numpy(), strict=True):
        np.testing.assert_array_equal(prepare_image(file, bundle), image)
    scores = predict(tmp_path / "b", files, top_k=2)
    expected = model.predict_on_batch(images.numpy())
    for prediction, row in zip(scores.predictions, expected, strict=True):
        got = dict(prediction.top)
        np.testing.assert_allclose([got["a"], got["b"]], row, rtol=1e-5)


# -- the predict command's exit status ---------------------------------------------------


def test_cli_predict_fails_when_no_input_was_classified(bundle_dir: Path, images: Path):
    from helpers import run_here

    result = run_here("predict", bundle_dir, images / "imgs" / "notes.jpg")
    assert result.returncode == 1, result.stderr
    assert f"could not classify {images / 'imgs' / 'notes.jpg'}" in result.stderr
    assert "chute predict: error: none of the 1 input(s) could be classified" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_predict_partial_success_exits_0_and_reports_the_failures(
    bundle_dir: Path, images: Path
):
    from helpers import run_here

    result = run_here(
        "predict", bundle_dir, images / "imgs" / "notes.jpg", images / "single.bmp", "--json"
    )
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert [Path(p["path"]).name for p in body["predictions"]] == ["single.bmp"]
    assert [Path(f["path"]).name for f in body["failures"]] == ["notes.jpg"]
    assert "could not classify" in result.stderr and "error:" not in result.stderr
    help_text = " ".join(run_here("predict", "--help").stdout.split())
    assert (
        "0 when at least one image was classified" in help_text and "1 when none was" in help_text
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.timeout(60)  # the old code waited in open() for ever: fail rather than hang
def test_predict_skips_a_fifo_named_like_an_image_with_its_reason(bundle_dir: Path, tmp_path):
    from helpers import run_here

    folder = tmp_path / "imgs"
    write_image(folder / "dark.png", solid(20))
    pipe = folder / "pipe.png"
    os.mkfifo(pipe)
    try:
        result = predict(bundle_dir, [folder, pipe])
        cli = run_here("predict", bundle_dir, pipe, folder / "dark.png", "--json")
    finally:  # a reader still waiting in open() (the old code) is let go
        with contextlib.suppress(OSError):
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
    assert [Path(p.path).name for p in result.predictions] == ["dark.png"]
    assert result.failures == [(str(pipe), "not a regular file: a named pipe (FIFO)")]
    assert cli.returncode == 0, cli.stderr
    body = json.loads(cli.stdout)
    assert [f["path"] for f in body["failures"]] == [str(pipe)]
    assert "not a regular file" in body["failures"][0]["reason"]


# -- file names that are not UTF-8 -------------------------------------------------------


def _strict_stdout_main(*args: str | Path) -> tuple[int, bytes, str]:
    """``chute ARGS`` in this process with a stdout that refuses what is not UTF-8 (as a
    pipe under a UTF-8 locale is): the exit code, the bytes written, and stderr."""
    import contextlib

    from chute import cli

    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="\n")
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([os.fspath(a) for a in args])
        out.flush()
    return code, raw.getvalue(), err.getvalue()


@pytest.mark.parametrize("output", ["--json", "--csv", "text"])
def test_predict_names_a_file_that_is_not_utf8_as_its_key(bundle_dir: Path, tmp_path, output):
    """A file named with the bytes ``caf\\xe9.png`` (Latin-1, not UTF-8) is classified and
    printed as ``chute convert`` writes its key, ``caf\\\\xe9.png``: valid UTF-8 (JSON that
    loads), never a UnicodeEncodeError."""
    folder = os.fsencode(tmp_path / "odd")
    os.mkdir(folder)
    png = io.BytesIO()
    Image.fromarray(solid(235)).save(png, format="PNG")
    try:
        with open(os.path.join(folder, b"caf\xe9.png"), "wb") as handle:
            handle.write(png.getvalue())
    except OSError as error:  # a file system that takes only UTF-8 names (macOS)
        pytest.skip(f"this file system refuses the name: {error}")
    (tmp_path / "odd" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # a failure too
    odd = os.fsdecode(os.path.join(folder, b"caf\xe9.png"))
    key = str(tmp_path / "odd" / "caf\\xe9.png")
    flags = [] if output == "text" else [output]

    code, written, err = _strict_stdout_main(
        "predict", bundle_dir, os.fsdecode(folder), odd, *flags
    )
    assert code == 0, err
    text = written.decode("utf-8")  # strict: raises on a byte that is not UTF-8
    if output == "--json":
        body = json.loads(text)
        assert [p["path"] for p in body["predictions"]] == [key]
        assert body["predictions"][0]["top"][0]["class"] == "bright"
        assert [f["path"] for f in body["failures"]] == [str(tmp_path / "odd" / "corrupt.png")]
    elif output == "--csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        assert {row["path"] for row in rows} == {key}
    else:
        assert text.splitlines()[0].startswith(f"{key}: bright ")
    assert "could not classify" in err and "\\udc" not in err
    # the library's answer keeps the real path, which opens the file
    result = predict(bundle_dir, odd)
    assert result.predictions[0].path == odd and result.predictions[0].text_path == key


def test_predict_uses_no_internals_of_the_conversion_stage():
    """predict finds image files and names them with chute.image.files, as chute convert
    does, and imports nothing of chute.ingest (a sibling stage's internals)."""
    code = (
        "import sys, chute.fit.predict\n"
        "print(sorted(m for m in sys.modules if m.startswith('chute.ingest')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"
