"""``chute train DATA --mix B=0.25`` / ``chute.train(..., mix=...)``: training on several
datasets as one, the mixture recorded in the run and the bundle, and a resume refused
when the mixture changed."""

from __future__ import annotations

import json

import pytest
from helpers import run_here

import chute
from chute.errors import ChuteError
from chute.fit import train as training

FAST = ["--model", "kannada-cnn", "--epochs", "1", "--batch-size", "8", "--strategy", "cpu"]


@pytest.mark.parametrize("engine", ["grain", "tf"])
def test_a_run_trains_on_a_mixture_and_records_it(mixable, tmp_path, engine):
    run = tmp_path / "run"
    done = run_here(
        "train", mixable["a"], "--run-dir", run, "--mix", f"{mixable['b']}=0.25",
        "--engine", engine, *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    started = json.loads((run / "started.json").read_text())
    assert started["class_names"] == ["cat", "dog", "eel", "fox"]
    assert [entry["label_map"] for entry in started["mix"]] == [[0, 1, 2], [1, 3]]
    assert [entry["weight"] for entry in started["mix"]] == [0.75, 0.25]
    # each dataset's images of every epoch, in the history and history.csv
    history = json.loads((run / "history.json").read_text())
    assert history["images_a"] == [90.0] and history["images_b"] == [30.0]
    assert "images_b" in (run / "history.csv").read_text().splitlines()[0]
    meta = json.loads((run / "bundle" / "chute.json").read_text())
    assert meta["class_names"] == ["cat", "dog", "eel", "fox"]
    assert [entry["location"] for entry in meta["info"]["mix"]] == [
        str(mixable["a"]),
        str(mixable["b"]),
    ]
    # the first dataset's val split is evaluated, in the mixture's classes
    evaluated = json.loads((run / "evaluation-val.json").read_text())
    assert evaluated["examples"] == 30


class _Stop(Exception):
    pass


def test_an_interrupted_mixed_run_resumes_only_with_the_same_mixture(
    mixable, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    options = dict(model="kannada-cnn", epochs=2, batch_size=8, strategy="cpu", verbose=0)
    with monkeypatch.context() as patch:  # started, then killed before its first epoch
        patch.setattr(training, "_devices", lambda config: (_ for _ in ()).throw(_Stop()))
        with pytest.raises(_Stop):
            chute.train(mixable["a"], run, mix={str(mixable["b"]): 0.25}, **options)
    (run / "backup").mkdir()
    with pytest.raises(ChuteError, match=r"mixed in: .*/b 25% .* then, .*/b 50%"):
        chute.train(mixable["a"], run, mix={str(mixable["b"]): 0.5}, **options)
    with pytest.raises(ChuteError, match=r"mixed in: .* then, nothing now"):
        chute.train(mixable["a"], run, **options)
    with monkeypatch.context() as patch:  # the same mixture: resumed
        patch.setattr(training, "_devices", lambda config: (_ for _ in ()).throw(_Stop()))
        with pytest.raises(_Stop):
            chute.train(mixable["a"], run, mix=f"{mixable['b']}=0.25", **options)
    assert (run / "backup").is_dir()


@pytest.mark.parametrize(
    ("mix", "said"),
    [
        ("b", "Received: mix='b'"),
        ("b=1.5", "summing below 1"),
        ("b=0.6,c=0.5", "summing below 1"),
        ("b=x", "DATASET=WEIGHT"),
    ],
)
def test_a_bad_mix_flag_is_named_without_a_traceback(mixable, tmp_path, mix, said):
    done = run_here("train", mixable["a"], "--run-dir", tmp_path / "run", "--mix", mix, *FAST)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_mixed_dataset_that_cannot_be_mixed_is_refused_before_the_run_starts(
    mixable, multi_label_data, tmp_path
):
    done = run_here(
        "train", mixable["a"], "--run-dir", tmp_path / "run", "--mix",
        f"{multi_label_data}=0.3", *FAST,
    )  # fmt: skip
    assert done.returncode == 2 and "labels of one kind" in done.stderr
    assert not (tmp_path / "run").exists()
