"""Training on a multi-label dataset (TensorFlow; the JAX run is a stage of
tests/jax_runs_child.py): a sigmoid head and binary cross-entropy chosen from the
dataset, multi-label metrics, thresholds tuned on validation into the bundle, and the
options that do not fit refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import FAST_TRAINING

import chute
from chute.errors import ChuteError
from chute.fit import multilabel, thresholds
from chute.format import manifest as manifest_lib


@pytest.fixture(scope="module")
def multi_run(multi_label_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("multi") / "run"
    options = {**FAST_TRAINING, "epochs": 4, "positive_weights": "balanced"}
    return run, chute.train(multi_label_data, run, **options)


@pytest.mark.slow
def test_a_multi_label_run_trains_a_sigmoid_model_and_tunes_its_thresholds(
    multi_run, multi_label_data
):
    run, result = multi_run
    manifest = manifest_lib.load(multi_label_data)
    bundle = chute.load_bundle(run)
    assert bundle.multi_label and len(bundle.thresholds) == manifest.num_classes
    assert bundle.model.get_layer("predictions").get_config()["activation"] == "sigmoid"
    assert result.best_val_accuracy is None and 0 <= result.best_val_map <= 1
    history = json.loads((run / "history.json").read_text())
    assert {"map", "val_map", "auc", "micro_f1", "macro_f1"} <= set(history)
    # the thresholds are the ones that maximise each label's F1 on val, as the rule says
    scores, truth = thresholds.scores_and_truth(
        bundle.model, manifest, "val", chute.LoadOptions(), input_size=bundle.input_size
    )
    np.testing.assert_allclose(
        bundle.thresholds, multilabel.tune_thresholds(truth, scores), rtol=1e-6
    )
    # the colours are easy to see: the model learns them (chance is each label's share)
    ap = multilabel.average_precision(truth, scores)
    share = truth.mean(0)
    assert np.nanmean(ap) > np.mean(share) + 0.15, (ap, share)


@pytest.mark.parametrize(
    ("data", "options", "message"),
    [
        ("multi", {"class_weights": "balanced"}, r"is multi-label.*positive_weights='balanced'"),
        ("single", {"positive_weights": "balanced"}, r"`positive_weights`.*one class per image"),
    ],
)
def test_weights_of_the_other_kind_are_refused(
    data, options, message, multi_label_data, shared_dataset, tmp_path
):
    source = multi_label_data if data == "multi" else shared_dataset
    with pytest.raises(ChuteError, match=message):
        chute.train(source, tmp_path / "run", **FAST_TRAINING, **options)
    assert not (tmp_path / "run" / "bundle").exists()


def _hub_parquet(root):
    """A Parquet file in the Hub's layout (``data/train-*.parquet``): the images of
    ``helpers.write_multi_label_list`` with their labels as a ``Sequence(ClassLabel)``."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers import MULTI_LABELS, write_multi_label_list

    listed = write_multi_label_list(root / "src", 80, seed=1)
    with open(listed, newline="") as handle:
        rows = list(csv.DictReader(handle))
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = [{"bytes": (root / "src" / r["path"]).read_bytes(), "path": r["path"]} for r in rows]
    tags = [[MULTI_LABELS.index(n) for n in r["labels"].split("|") if n] for r in rows]
    table = pa.table(
        {"image": pa.array(images, struct), "tags": pa.array(tags, pa.list_(pa.int64()))}
    )
    feature = {"_type": "Sequence", "feature": {"_type": "ClassLabel", "names": MULTI_LABELS}}
    info = {"info": {"features": {"image": {"_type": "Image"}, "tags": feature}}}
    table = table.replace_schema_metadata({b"huggingface": json.dumps(info).encode()})
    (root / "hub" / "data").mkdir(parents=True)
    pq.write_table(table, root / "hub" / "data" / "train-00000-of-00001.parquet")
    return root / "hub"


@pytest.mark.slow
def test_a_hub_parquet_of_tags_converts_trains_evaluates_and_predicts_from_the_cli(tmp_path):
    from helpers import MULTI_LABELS, run_here

    hub = _hub_parquet(tmp_path)
    out, run = tmp_path / "shards", tmp_path / "run"
    done = run_here("convert", hub, out, "--val-fraction", "0.25", "--allow-empty-labels")
    assert done.returncode == 0, done.stderr
    assert "multi-label" in done.stderr + done.stdout
    done = run_here("train", out, "--run-dir", run, "--epochs", "3", "--batch-size", "8",
                    "--strategy", "cpu", "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "best val mAP" in done.stdout
    done = run_here("evaluate", run, out, "--out", tmp_path / "eval")
    assert done.returncode == 0, done.stderr
    assert "mAP" in done.stdout
    image = str(tmp_path / "src" / "img" / "000.png")
    done = run_here("predict", run, image, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    found = answer[0] if isinstance(answer, list) else answer["predictions"][0]
    assert {label["label"] for label in found["labels"]} <= set(MULTI_LABELS)


@pytest.mark.slow
def test_the_grain_engine_trains_a_weighted_multi_label_dataset(multi_label_data, tmp_path):
    result = chute.train(
        multi_label_data, tmp_path / "run", **{**FAST_TRAINING, "epochs": 1},
        load={"engine": "grain", "workers": 0},
    )  # fmt: skip
    assert result.best_val_map is not None
    assert chute.load_bundle(tmp_path / "run").multi_label


def test_a_weighted_single_label_list_yields_integer_labels_and_weights(tmp_path):
    from helpers import write_image

    rows = ["path,label,weight"]
    for i in range(12):
        write_image(tmp_path / "src" / f"{i}.png", seed=i, size=(8, 8))
        rows.append(f"{i}.png,{'ab'[i % 2]},{0.5 * (1 + i % 2)}")
    (tmp_path / "src" / "list.csv").write_text("\n".join(rows) + "\n")
    chute.convert(
        tmp_path / "src" / "list.csv", tmp_path / "out", weight_column="weight", workers=1
    )
    manifest = manifest_lib.load(tmp_path / "out")
    assert manifest.weighted and not manifest.multi_label
    for engine in ("tf", "grain"):
        extra = {"workers": 0} if engine == "grain" else {}
        _, labels, weights = (
            np.asarray(t)
            for t in next(iter(chute.load(tmp_path / "out", "train", batch_size=12, engine=engine,
                                          seed=1, **extra)))
        )  # fmt: skip
        assert labels.dtype == np.int32
        # class b weighs 1.0, class a 0.5: the weight travels with its own image
        np.testing.assert_array_equal(weights, np.where(labels == 1, 1.0, 0.5))


def test_class_weights_on_a_weighted_dataset_are_refused_before_any_work(tmp_path):
    from helpers import write_image

    rows = ["path,label,weight"]
    for i in range(8):
        write_image(tmp_path / "src" / f"{i}.png", seed=i, size=(8, 8))
        rows.append(f"{i}.png,{'ab'[i % 2]},1.5")
    (tmp_path / "src" / "list.csv").write_text("\n".join(rows) + "\n")
    chute.convert(tmp_path / "src" / "list.csv", tmp_path / "out", weight_column="weight")
    with pytest.raises(ChuteError, match=r"has sample weights.*--no-sample-weights.*'balanced'"):
        chute.train(tmp_path / "out", tmp_path / "run", **FAST_TRAINING, class_weights="balanced")


def test_label_smoothing_reaches_both_multi_label_losses():
    import keras

    from chute.fit.config import TrainConfig
    from chute.fit.objective import make_loss

    config = TrainConfig(label_smoothing=0.2)
    plain = make_loss(config, positives=np.ones(2))
    assert plain.get_config()["label_smoothing"] == pytest.approx(0.2)
    weighted = make_loss(TrainConfig(label_smoothing=0.2, positive_weights="balanced"),
                         positives=np.ones(2))  # fmt: skip
    truth = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    scores = np.array([[0.9, 0.2], [0.3, 0.6]], np.float32)
    # with every weight 1 the weighted loss is Keras's, smoothing included
    expected = keras.losses.BinaryCrossentropy(label_smoothing=0.2)(truth, scores)
    np.testing.assert_allclose(float(weighted(truth, scores)), float(expected), rtol=1e-5)


def test_the_cli_turns_sample_weights_off_and_on():
    from chute import cli

    parser = cli._parser()
    base = ["train", "data"]
    assert parser.parse_args([*base, "--no-sample-weights"]).sample_weights is False
    assert parser.parse_args([*base, "--sample-weights"]).sample_weights is True
    assert parser.parse_args(base).sample_weights is None


def test_a_multi_label_run_records_its_label_mode(multi_label_data, shared_dataset):
    from chute.fit.config import TrainConfig
    from chute.fit.train import _started_with

    multi = _started_with(TrainConfig(), manifest_lib.load(multi_label_data))
    single = _started_with(TrainConfig(), manifest_lib.load(shared_dataset))
    assert multi["label_mode"] == "multi" and "label_mode" not in single
