"""Evaluate, predict and export with a multi-label model bundle.

The model is built by hand, not trained: a sigmoid per colour over the image's mean
red, green and blue (``sigmoid(20 * (mean - 0.5))``), so a 16x16 image whose channel is
bright carries that label and every answer is known in advance. The dataset is a
list of such images with ``|``-separated labels (some none), converted in a temp dir.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import run_here, write_image
from PIL import Image

import chute
from chute.errors import ChuteError
from chute.fit import multilabel
from chute.fit.evaluate import evaluate
from chute.fit.evaluate_labels import MultiLabelReport
from chute.fit.export import export
from chute.fit.predict import predict
from chute.format.bundle import load_bundle, save_bundle

NAMES = ["blue", "green", "red"]  # label order: the manifest's, sorted
THRESHOLDS = [0.5, 0.3, 0.7]
COLOURS = {"blue": 2, "green": 1, "red": 0}  # name -> channel


def picture(labels: list[str], seed: int, level: int = 220, other: int = 30) -> np.ndarray:
    """A 16x16 RGB image whose labelled channels are at ``level``, the others at ``other``."""
    pixels = np.full((16, 16, 3), other, np.int64)
    for name in labels:
        pixels[..., COLOURS[name]] = level
    noise = np.random.default_rng(seed).integers(-10, 11, pixels.shape)
    return np.clip(pixels + noise, 0, 255).astype(np.uint8)


def make_model(activation: str = "sigmoid"):
    """uint8 (16, 16, 3) -> one score per label in NAMES' order: sigmoid(20 * (mean - 0.5))."""
    import keras

    inputs = keras.Input((16, 16, 3), dtype="uint8")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)  # (red, green, blue) means
    outputs = keras.layers.Dense(3, activation=activation, dtype="float32")(x)
    model = keras.Model(inputs, outputs)
    kernel = np.zeros((3, 3), np.float32)
    for label, name in enumerate(NAMES):
        kernel[COLOURS[name], label] = 20.0
    model.layers[-1].set_weights([kernel, np.full(3, -10.0, np.float32)])
    return model


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """40 images, each with a random set of labels (about one in five has none)."""
    root = tmp_path_factory.mktemp("ml-data")
    rng = np.random.default_rng(0)
    rows = ["path,labels"]
    for i in range(40):
        labels = [name for name in NAMES if rng.random() < 0.4]
        # Dim positives and grey negatives too: some positives score below some
        # negatives and below their thresholds, so AP and F1 are not all 1.
        level, other = (220, 30) if i % 3 else (110, 130)
        write_image(root / "img" / f"{i:02d}.png", picture(labels, i, level, other))
        rows.append(f"img/{i:02d}.png,{'|'.join(labels)}")
    (root / "list.csv").write_text("\n".join(rows) + "\n")
    out = root / "shards"
    chute.convert(root / "list.csv", out, val_fraction=0.25, allow_empty_labels=True, workers=1)
    return out


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def bundle_dir(model, data, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("ml-run") / "bundle"
    image = _manifest(data).image
    save_bundle(model, directory, class_names=NAMES, image=image, thresholds=THRESHOLDS)
    return directory


@pytest.fixture(scope="module")
def single_bundle(data, tmp_path_factory) -> Path:
    """A softmax model over the same names: single-label."""
    directory = tmp_path_factory.mktemp("sl-run") / "bundle"
    save_bundle(
        make_model(activation="softmax"),
        directory,
        class_names=NAMES,
        image=_manifest(data).image,
    )
    return directory


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Files to predict: red; green and red; none; and one that is not an image."""
    root = tmp_path_factory.mktemp("ml-images")
    write_image(root / "a_red.png", picture(["red"], seed=1))
    write_image(root / "b_green_red.png", picture(["green", "red"], seed=2))
    write_image(root / "c_none.png", picture([], seed=3))
    (root / "d_broken.png").write_bytes(b"not a png")
    return root


def _manifest(data: Path):
    from chute.format import manifest

    return manifest.load(data)


def _scores(model, data: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The split's multi-hot labels and the model's scores, read as evaluate reads them."""
    ds = chute.load(data, split, batch_size=256, training=False, label_mode="multi_hot")
    truths, scores = [], []
    for images, labels in ds:
        truths.append(np.asarray(labels))
        scores.append(np.asarray(model.predict_on_batch(np.asarray(images))))
    return np.concatenate(truths), np.concatenate(scores)


# -- evaluate -----------------------------------------------------------------------------


def test_evaluate_gives_the_label_report_of_the_split_and_writes_it(
    model, data, bundle_dir, tmp_path
):
    report = evaluate(bundle_dir, data, split="val", out_dir=tmp_path)
    assert isinstance(report, MultiLabelReport)
    y_true, scores = _scores(model, data, "val")
    assert report.examples == len(y_true) == _manifest(data).num_examples("val")
    expected = multilabel.label_report(y_true, scores, THRESHOLDS, NAMES)
    got = dataclasses.asdict(report)
    assert {k: got[k] for k in expected if k != "labels"} == pytest.approx(
        {k: v for k, v in expected.items() if k != "labels"}
    )
    for mine, theirs in zip(report.labels, expected["labels"], strict=True):
        assert mine == pytest.approx(theirs)
    assert report.map is not None and 0 < report.map < 1 and report.micro_f1 < 1
    assert [r["threshold"] for r in report.labels] == THRESHOLDS
    p = np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)
    bce = -(y_true * np.log(p) + (1 - y_true) * np.log(1 - p)).mean()
    assert report.loss == pytest.approx(bce, rel=1e-5)

    written = json.loads((tmp_path / "evaluation-val.json").read_text())
    assert written == json.loads(json.dumps(got))
    assert (tmp_path / "per-label-val.txt").read_text() == report.table() + "\n"
    assert report.table().splitlines()[0].startswith(f"val: {report.examples} images, mAP ")
    with Image.open(tmp_path / "precision-recall-val.png") as picture_file:
        assert picture_file.format == "PNG" and picture_file.width > 100
    assert not (tmp_path / "confusion-val.png").exists()  # single-label pictures are not drawn


def test_evaluate_refuses_a_model_of_the_other_label_mode(
    data, bundle_dir, single_bundle, tmp_path
):
    with pytest.raises(ChuteError, match=r"is single-label but the dataset .* is multi-label") as e:
        evaluate(single_bundle, data)
    assert str(single_bundle) in str(e.value) and str(data) in str(e.value)
    assert "\n" not in str(e.value)
    folders = tmp_path / "folders"
    for c, name in enumerate(NAMES):
        for i in range(2):
            write_image(folders / name / f"{i}.png", picture([name], seed=10 * c + i))
    single_data = tmp_path / "single"
    chute.convert(folders, single_data, val_fraction=0.34, workers=1)
    with pytest.raises(ChuteError, match=r"is multi-label but the dataset .* is single-label"):
        evaluate(bundle_dir, single_data)


def test_cli_evaluate_prints_the_summary_and_the_table(data, bundle_dir, tmp_path):
    result = run_here("evaluate", bundle_dir, data, "--split", "val", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("val: ") and "mAP" in lines[0] and "macro F1" in lines[0]
    assert lines[1].split()[:3] == ["label", "AP", "F1"]
    assert [line.split()[0] for line in lines[2:5]] == NAMES
    assert lines[-1] == f"reports in {tmp_path}"
    assert (tmp_path / "precision-recall-val.png").exists()
    refused = run_here("evaluate", bundle_dir, tmp_path / "nothing-here")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr


def test_cli_shows_the_weakest_labels_of_a_long_report(capsys):
    from chute import cli

    names = [f"tag{i:02d}" for i in range(30)]
    rng = np.random.default_rng(3)
    y = rng.random((50, 30)) < 0.3
    scores = np.clip(y * 0.6 + rng.random((50, 30)) * 0.5, 0, 1)
    report = MultiLabelReport.from_scores("test", y, scores, [0.5] * 30, names)
    cli._print_label_report(report, None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("label (20 of lowest AP)")
    assert len(lines) == 2 + 20 + 1
    assert lines[-1].startswith("20 of 30 labels shown, lowest AP first")
    aps = sorted(r["ap"] for r in report.labels)[:20]
    assert [float(line.split()[1]) for line in lines[2:22]] == pytest.approx(aps, abs=5e-4)


# -- predict ------------------------------------------------------------------------------


def _files(images: Path) -> list[Path]:
    return sorted(images.iterdir())


def test_predict_gives_every_label_at_or_above_its_threshold(bundle_dir, images):
    result = predict(bundle_dir, _files(images))
    assert result.multi_label
    assert [Path(p.path).name for p in result.predictions] == [
        "a_red.png",
        "b_green_red.png",
        "c_none.png",
    ]
    assert [Path(path).name for path, _ in result.failures] == ["d_broken.png"]
    by_name = {Path(p.path).name: p for p in result.predictions}
    assert [n for n, _ in by_name["a_red.png"].labels] == ["red"]
    assert sorted(n for n, _ in by_name["b_green_red.png"].labels) == ["green", "red"]
    assert by_name["c_none.png"].labels == []
    for p in result.predictions:
        scores = dict(p.top)
        assert len(p.top) == 3  # the default top: 5, or every class when fewer
        assert [s for _, s in p.labels] == sorted((s for _, s in p.labels), reverse=True)
        cut = dict(zip(NAMES, THRESHOLDS, strict=True))
        assert {n for n, _ in p.labels} == {n for n, s in scores.items() if s >= cut[n]}

    everything = predict(bundle_dir, _files(images), threshold=0.0)
    assert all(len(p.labels) == 3 for p in everything.predictions)
    nothing = predict(bundle_dir, _files(images), threshold=1.0)
    assert all(p.labels == [] for p in nothing.predictions)
    one = predict(bundle_dir, images / "b_green_red.png", top_k=1)
    (only,) = one.predictions
    assert len(only.top) == 1 and len(only.labels) == 2  # top_k leaves the labels alone
    assert only.top[0] == only.labels[0]


def test_predict_outputs_json_and_csv(bundle_dir, images):
    result = predict(bundle_dir, _files(images))
    body = json.loads(result.to_json())
    first, _, empty = body["predictions"]
    assert list(first) == ["path", "labels", "top"]
    assert first["labels"] == [{"label": "red", "score": result.predictions[0].labels[0][1]}]
    assert empty["labels"] == [] and len(empty["top"]) == 3
    assert [Path(f["path"]).name for f in body["failures"]] == ["d_broken.png"]

    rows = list(csv.reader(io.StringIO(result.to_csv())))
    assert rows[0] == ["path", "rank", "label", "score"]
    assert [(Path(r[0]).name, r[1], r[2]) for r in rows[1:]] == [
        ("a_red.png", "1", "red"),
        ("b_green_red.png", "1", result.predictions[1].labels[0][0]),
        ("b_green_red.png", "2", result.predictions[1].labels[1][0]),
        ("c_none.png", "", ""),  # no label: still a row
    ]
    assert float(rows[1][3]) == result.predictions[0].labels[0][1]
    top_rows = list(csv.reader(io.StringIO(result.to_csv(top=True))))
    assert top_rows[0] == ["path", "rank", "class", "probability"] and len(top_rows) == 1 + 3 * 3


def test_predict_applies_the_sigmoid_to_logits(data, bundle_dir, images, tmp_path):
    save_bundle(
        make_model(activation="linear"),
        tmp_path / "logits",
        class_names=NAMES,
        image=_manifest(data).image,
        thresholds=THRESHOLDS,
    )
    file = images / "b_green_red.png"
    from_logits = predict(tmp_path / "logits", file).predictions[0]
    from_scores = predict(bundle_dir, file).predictions[0]
    assert [n for n, _ in from_logits.labels] == [n for n, _ in from_scores.labels]
    np.testing.assert_allclose(
        [s for _, s in from_logits.top], [s for _, s in from_scores.top], rtol=1e-5
    )


def test_predict_checks_the_threshold(bundle_dir, single_bundle, images):
    image = images / "a_red.png"
    for bad in (1.5, -0.1, "0.5", True, float("nan")):
        with pytest.raises(
            ChuteError, match=r"`threshold` must be a number from 0 to 1\. Received: threshold="
        ):
            predict(bundle_dir, image, threshold=bad)
    with pytest.raises(ChuteError, match=r"`threshold` applies to a multi-label model; .*single"):
        predict(single_bundle, image, threshold=0.5)
    single = predict(single_bundle, image)
    assert not single.multi_label and single.predictions[0].labels is None
    assert "labels" not in json.loads(single.to_json())["predictions"][0]  # unchanged output
    assert single.to_csv().splitlines()[0] == "path,rank,class,probability"


def test_cli_predict_text_json_csv_top_k_and_threshold(bundle_dir, images):
    text = run_here("predict", bundle_dir, *_files(images)[:3])
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"{images / 'a_red.png'}: red 0.")
    assert lines[0].count(",") == 0 and lines[1].count(",") == 1
    assert lines[2] == f"{images / 'c_none.png'}: no label at or above its threshold"

    top = run_here("predict", bundle_dir, images / "c_none.png", "--top-k", "2")
    assert top.returncode == 0 and top.stdout.count(",") == 1  # the 2 highest, under threshold

    body = json.loads(run_here("predict", bundle_dir, images / "c_none.png", "--json").stdout)
    assert body["predictions"][0]["labels"] == []
    rows = run_here("predict", bundle_dir, images / "c_none.png", "--csv").stdout.splitlines()
    assert rows == ["path,rank,label,score", f"{images / 'c_none.png'},,,"]
    rows = run_here("predict", bundle_dir, images / "c_none.png", "--csv", "--top-k", "1").stdout
    assert rows.splitlines()[0] == "path,rank,class,probability"

    low = run_here("predict", bundle_dir, images / "c_none.png", "--threshold", "0")
    assert low.stdout.count(",") == 2  # every label
    bad = run_here("predict", bundle_dir, images / "c_none.png", "--threshold", "2")
    assert bad.returncode == 2
    assert "chute predict: error: `threshold` must be a number from 0 to 1" in bad.stderr


# -- export -------------------------------------------------------------------------------


def test_export_keeps_the_thresholds_and_serves_the_scores(model, bundle_dir, tmp_path):
    import tensorflow as tf

    keras_copy = load_bundle(export(bundle_dir, tmp_path / "k", format="keras"))
    assert keras_copy.multi_label and keras_copy.thresholds == THRESHOLDS

    out = export(bundle_dir, tmp_path / "serving" / "1")
    meta = json.loads((Path(out) / "chute.json").read_text())
    assert meta["thresholds"] == THRESHOLDS and meta["class_names"] == NAMES
    assert "threshold" in meta["export"]["output"]["meaning"]
    x = np.stack([picture(["red"], 1), picture([], 2), picture(["blue", "green"], 3)])
    loaded = tf.saved_model.load(out)  # kept: its functions need its variables alive
    served = loaded.serve(tf.constant(x)).numpy()
    assert served.shape == (3, 3)
    np.testing.assert_allclose(served, model.predict_on_batch(x), rtol=1e-4, atol=1e-6)
    decided = served >= np.asarray(THRESHOLDS)
    assert decided.tolist() == [[False, False, True], [False, False, False], [True, True, False]]
    assert os.path.exists(Path(out) / "saved_model.pb")
