"""A run folder in a bucket (``s3://``, which TensorFlow cannot open): trained into,
killed and resumed, then predicted, evaluated and exported from; and a run that cannot
write there refused before anything is written. The bucket is moto's S3 server on
127.0.0.1 (tests/object_stores.py)."""

from __future__ import annotations

import logging

import pytest
from helpers import FAST_TRAINING, Killed, dying_epoch_timer, make_folder
from object_stores import new_s3_bucket

import chute
from chute import ChuteError
from chute.fit import train as training
from chute.format import storage


def _keys(folder: str) -> list[str]:
    """The objects under ``folder`` (a bucket's prefix), relative to it."""
    found = []
    for dirpath, _, names in storage.walk(folder):
        found += [storage.join(dirpath, name)[len(folder) + 1 :] for name in names]
    return sorted(found)


@pytest.mark.slow  # two short trainings (a kill, a resume) and an evaluation
def test_a_run_in_a_bucket_trains_resumes_and_predicts_from_there(
    s3_endpoint, tmp_path, monkeypatch, caplog
):
    bucket = new_s3_bucket(s3_endpoint)
    src = make_folder(tmp_path / "src", {"a": 12, "b": 12}, size=(16, 16))
    data = bucket + "/ds"
    chute.convert(src, data, image_size=16, val_fraction=0.25, workers=1)
    run = bucket + "/runs/r1"
    options = {**FAST_TRAINING, "load": {"engine": "grain", "workers": 0}}
    caplog.set_level(logging.INFO, logger="chute")
    with monkeypatch.context() as patch:  # killed at the end of epoch 1 of 2
        patch.setattr(training, "_epoch_timer", dying_epoch_timer(training, lambda e: e == 0))
        with pytest.raises(Killed):
            chute.train(data, run, **options)
    left = _keys(run)
    assert "started.json" in left and "backup/state.json" in left, left
    assert any(key.startswith("backup/step-") for key in left), left
    assert "checkpoints/last.keras" in left and "history.csv" in left, left
    assert not any(key.startswith("bundle/") for key in left), left
    # TensorBoard's events: written locally, copied into the bucket, said in one line
    assert any(key.startswith("logs/train/events.out.tfevents") for key in left), left
    said = [r.getMessage() for r in caplog.records if "TensorBoard logs" in r.getMessage()]
    assert said and run + "/logs" in said[0] and "copied there after each epoch" in said[0]

    result = chute.train(data, run, **options)  # the same call resumes it
    assert result.resumed and result.epochs_run == 1 and result.bundle == run + "/bundle"
    done = _keys(run)
    assert not any(key.startswith("backup/") for key in done), done
    written = {
        "bundle/chute.json", "bundle/model.keras", "checkpoints/best.keras", "summary.json",
        "curves.png", "evaluation-val.json", "confusion-val.png",
    }  # fmt: skip
    assert written <= set(done), done
    rows = storage.read_bytes(run + "/history.csv").decode().strip().splitlines()
    assert len(rows) == 1 + 2  # the header and each epoch once

    predicted = chute.predict(run, src / "a")
    assert len(predicted.predictions) == 12 and not predicted.failures
    report = chute.evaluate(run, data, split="val")
    assert report.examples == 6
    exported = chute.export(run, tmp_path / "keras", format="keras")
    assert (tmp_path / "keras" / "model.keras").is_file(), exported


def test_a_multi_worker_run_in_a_bucket_is_refused_before_anything_is_written(
    s3_endpoint, tmp_path
):
    bucket = new_s3_bucket(s3_endpoint)
    data = tmp_path / "ds"
    chute.convert(make_folder(tmp_path / "src", {"a": 2, "b": 2}), data, workers=1)
    run = bucket + "/runs/r1"
    with pytest.raises(ChuteError, match="MultiWorkerMirroredStrategy") as refused:
        chute.train(data, run, **{**FAST_TRAINING, "strategy": "multiworker"})
    message = str(refused.value)
    assert "\n" not in message and f"run_dir={run!r}" in message and "gs://" in message
    assert _keys(bucket) == []  # no started.json, nothing
