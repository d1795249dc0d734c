"""chute train / evaluate / predict / export end to end on tiny data, resume, config, CLI errors."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest
from helpers import (
    FAST_TRAINING,
    Killed,
    dying_epoch_timer,
    make_folder,
    once_per_run,
    run_here,
)

import chute
from chute import ChuteError, TrainConfig
from chute.fit import train as training

FAST = FAST_TRAINING  # 2 epochs of kannada-cnn, batch 8, on the CPU


@pytest.fixture(scope="module")
def data(train_data) -> Path:
    """3 classes x 16 images 16x16, train 36 / val 12 (the session's, shared: read only)."""
    return train_data


@pytest.fixture(scope="module")
def trained(trained_run) -> tuple[Path, chute.TrainResult]:
    """A finished run of ``FAST`` on ``data`` and what ``chute.train`` returned (the
    session's, shared: read only)."""
    return trained_run


def test_train_writes_the_whole_run_directory(trained):
    run, result = trained
    assert result.epochs_run == 2 and result.replicas == 1 and result.global_batch_size == 8
    assert result.strategy == "cpu" and result.precision == "float32"
    assert 0.0 <= result.best_val_accuracy <= 1.0 and result.images_per_second > 0
    for name in (
        "bundle/chute.json",
        "bundle/model.keras",
        "checkpoints/best.keras",
        "checkpoints/last.keras",
        "history.csv",
        "history.json",
        "curves.png",
        "confusion-val.png",
        "per-class-val.csv",
        "evaluation-val.json",
        "config.json",
        "summary.json",
    ):
        assert (run / name).is_file(), name
    assert any((run / "logs").rglob("*tfevents*"))  # TensorBoard
    config = json.loads((run / "config.json").read_text())
    assert config["effective"] == {
        "strategy": "cpu",
        "precision": "float32",
        "replicas": 1,
        "global_batch_size": 8,
    }
    history = json.loads((run / "history.json").read_text())
    assert len(history["loss"]) == 2 and "val_accuracy" in history
    assert chute.load_bundle(run).class_names == ["a", "b", "c"]


def test_a_finished_run_is_not_overwritten_by_accident(trained, data):
    run, _ = trained
    with pytest.raises(ChuteError, match="holds a finished run"):
        chute.train(data, run, **FAST)


def test_overwrite_starts_the_run_afresh(trained, data, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained[0], run)  # a finished run of 2 epochs
    assert len((run / "history.csv").read_text().strip().splitlines()) == 1 + 2
    chute.train(data, run, overwrite=True, **{**FAST, "epochs": 1})
    rows = (run / "history.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 1  # the old run's history is gone, not appended to


def test_an_interrupted_run_resumes_only_with_the_options_it_started_with(data, tmp_path):
    """Killed on one dataset, then run on another (other classes): refused, naming what
    differs and the ways out, the backup kept; with ``overwrite`` it starts afresh."""
    run = tmp_path / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training, "_epoch_timer", dying_epoch_timer(training, lambda e: e == 0))
        with pytest.raises(Killed):
            chute.train(data, run, **{**FAST, "epochs": 2})
    assert (run / "backup").is_dir()
    # what the backup's variables and step count depend on (the optimizer's variables, a
    # loss-scale optimizer's, the augmentation layers in the step, the steps per epoch)
    for change, said in [
        ({"optimizer": "sgd"}, "optimizer: 'adam' then, 'sgd' now"),
        ({"precision": "mixed_float16"}, "precision: 'auto' then, 'mixed_float16' now"),
        ({"augment": "rotation", "augment_on": "device"}, "augment: [] then, ['rotation'] now"),
        ({"batch_size": 4}, "batch_size: 8 then, 4 now"),
    ]:
        with pytest.raises(ChuteError, match="interrupted run") as refused:
            chute.train(data, run, **{**FAST, "epochs": 2, **change})
        assert said in str(refused.value)
    other = tmp_path / "other"
    src = make_folder(tmp_path / "src", {"x": 8, "y": 8}, size=(16, 16))
    chute.convert(src, other, image_size=16, val_fraction=0.25, workers=1)

    with pytest.raises(ChuteError) as refused:
        chute.train(other, run, **{**FAST, "epochs": 1})
    message = str(refused.value)
    assert "`run_dir`" in message and str(run) in message and "interrupted run" in message
    assert "class_names: ['a', 'b', 'c'] then, ['x', 'y'] now" in message
    assert "overwrite=True (--overwrite)" in message and "command it was started with" in message
    assert (run / "backup").is_dir()  # nothing touched
    done = run_here("train", other, "--run-dir", run, "--epochs", "1")
    assert done.returncode == 2 and "interrupted run" in done.stderr
    assert "Traceback" not in done.stderr

    result = chute.train(other, run, overwrite=True, **{**FAST, "epochs": 1})
    assert not result.resumed and result.epochs_run == 1
    # the killed run's epoch is not in the new run's history (its progress file is gone)
    history = json.loads((run / "history.json").read_text())
    assert all(len(values) == 1 for values in history.values())
    assert chute.load_bundle(run).class_names == ["x", "y"]
    assert not (run / "backup").exists()


def test_a_run_from_before_started_json_resumes_as_it_did(tmp_path):
    from chute.fit import rundir

    started = {"model": "kannada-cnn", "class_names": ["a", "b"]}
    (tmp_path / "run" / "backup").mkdir(parents=True)  # interrupted, nothing recorded
    assert rundir.prepare(tmp_path / "run", overwrite=False, started=started).resumed
    assert not (tmp_path / "run" / "started.json").exists()  # kept as it was
    fresh = rundir.prepare(tmp_path / "new", overwrite=False, started=started)
    assert not fresh.resumed
    assert json.loads((tmp_path / "new" / "started.json").read_text()) == started
    (tmp_path / "new" / "backup").mkdir()
    same = rundir.prepare(tmp_path / "new", overwrite=True, started=started)
    assert same.resumed and (tmp_path / "new" / "backup").is_dir()  # same options: resumed


class _Stop(Exception):
    pass


def test_an_interrupted_run_is_not_resumed_on_a_dataset_converted_again(tmp_path, monkeypatch,
                                                                         caplog):  # fmt: skip
    """The same classes, converted again with fewer images: the backup's position is in an
    order that no longer exists, so the run is refused, saying what changed (the CLI with
    exit code 2); ``--overwrite`` starts afresh. A run dir that recorded no data (an older
    chute) resumes as it did, said in the log."""
    src, data, run = tmp_path / "src", tmp_path / "data", tmp_path / "run"
    chute.convert(make_folder(src, dict.fromkeys("abc", 16), size=(16, 16)), data,
                  image_size=16, val_fraction=0.25, workers=1)  # fmt: skip
    with monkeypatch.context() as patch:  # started.json written, then stopped before training
        patch.setattr(training, "_devices", lambda config: (_ for _ in ()).throw(_Stop()))
        with pytest.raises(_Stop):
            chute.train(data, run, **FAST)
    started = json.loads((run / "started.json").read_text())
    assert started["data"]["train"]["examples"] == 36 and started["data"]["val"]["shards"] == 1
    (run / "backup").mkdir()  # killed mid-run: a backup to resume from
    shutil.rmtree(src)
    chute.convert(make_folder(src, dict.fromkeys("abc", 4), size=(16, 16)), data,
                  image_size=16, val_fraction=0.25, workers=1, overwrite=True)  # fmt: skip

    with pytest.raises(ChuteError) as refused:
        chute.train(data, run, **FAST)
    message = str(refused.value)
    assert "interrupted run" in message and "the dataset changed" in message
    assert "the train split: 36 examples in 1 shard(s) then, 9 in 1 now" in message
    assert "the val split: 12 examples" in message and "3 in 1 now" in message
    assert "overwrite=True (--overwrite)" in message and "class_names" not in message
    flags = ["--run-dir", run, "--model", "kannada-cnn", "--batch-size", "8", "--strategy", "cpu"]
    done = run_here("train", data, *flags, "--epochs", "2")
    assert done.returncode == 2 and "the dataset changed" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and (run / "backup").is_dir()  # nothing touched

    with monkeypatch.context() as patch:  # --overwrite: started afresh on the new data
        patch.setattr(training, "_devices", lambda config: (_ for _ in ()).throw(_Stop()))
        with pytest.raises(_Stop):
            chute.train(data, run, overwrite=True, **FAST)
    assert not (run / "backup").exists()
    now = json.loads((run / "started.json").read_text())
    assert now["data"]["train"]["examples"] == 9 and now != started

    from chute.fit import rundir

    older = {key: value for key, value in now.items() if key != "data"}  # an older chute's
    (run / "started.json").write_text(json.dumps(older))
    (run / "backup").mkdir()
    with caplog.at_level("INFO", logger="chute.fit.rundir"):
        assert rundir.prepare(run, overwrite=False, started=now).resumed  # as it did
    assert "without checking data: an older chute started it" in caplog.text


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def resumed(data, tmp_path_factory) -> dict:
    """A run of 2 epochs killed at the end of epoch 1, after BackupAndRestore saved it (it
    runs before the timer; a kill at the start of epoch 2 finds the same files), then
    resumed with the same call. Built once for the session (read only): ``run``, what
    the killed run left (``backup``, ``bundle``: whether they existed; ``best_before``:
    its best score; ``best_keras``: the sha256 of its best.keras), and the ``result`` of
    the resumed call."""

    def build(root: Path) -> None:
        run = root / "run"
        options = {**FAST, "epochs": 2}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(training, "_epoch_timer", dying_epoch_timer(training, lambda e: e == 0))
            with pytest.raises(Killed):
                chute.train(data, run, **options)
        left = {
            "backup": (run / "backup").exists(),
            "bundle": (run / "bundle").exists(),
            "best_before": json.loads((run / "checkpoints" / "best.json").read_text())["best"],
            "best_keras": _sha256(run / "checkpoints" / "best.keras"),
        }
        result = chute.train(data, run, **options)
        (root / "resumed.pickle").write_bytes(pickle.dumps({**left, "result": result}))

    root = once_per_run(tmp_path_factory, "resumed-run", build)
    return {"run": root / "run", **pickle.loads((root / "resumed.pickle").read_bytes())}


def test_an_interrupted_run_continues_where_it_stopped(resumed):
    run, result = resumed["run"], resumed["result"]
    assert resumed["backup"] and not resumed["bundle"]  # as the kill left it
    assert result.resumed
    assert result.epochs_run == 1  # epoch 2 only
    rows = (run / "history.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 2  # header + every epoch once


def test_config_file_and_flags(tmp_path):
    toml = tmp_path / "train.toml"
    toml.write_text('model = "cifar-cnn"\nepochs = 3\nlearning_rate = 0.01\naugment = ["flip"]\n')
    config = TrainConfig.from_toml(str(toml), epochs=5, batch_size=None)
    assert (config.model, config.epochs, config.learning_rate) == ("cifar-cnn", 5, 0.01)
    assert config.augment == ("flip",)
    toml.write_text("epochz = 3\n")
    with pytest.raises(ChuteError, match=r"Unknown training option.*epochz"):
        TrainConfig.from_toml(str(toml))
    toml.write_text("epochs = \n")
    with pytest.raises(ChuteError, match="not valid TOML"):
        TrainConfig.from_toml(str(toml))


def test_a_load_table_sets_how_the_data_are_read(tmp_path):
    toml = tmp_path / "train.toml"
    toml.write_text(
        'epochs = 3\n[load]\ncache = "none"\nshuffle_buffer = 512\ncrop_scale = [0.25, 1.0]\n'
    )
    config = TrainConfig.from_toml(str(toml), load={"shuffle_buffer": 64}, epochs=None)
    assert config.epochs == 3
    assert config.load == chute.LoadOptions(cache=None, shuffle_buffer=64, crop_scale=(0.25, 1))
    assert TrainConfig().load == chute.LoadOptions()  # the reader's own defaults
    assert TrainConfig(load={"skip_corrupt": True}).load.skip_corrupt
    toml.write_text("[load]\ncahce = 'memory'\n")
    with pytest.raises(ChuteError, match=r"Unknown load option\(s\) \['cahce'\]"):
        TrainConfig.from_toml(str(toml))
    toml.write_text("[load]\nshuffle_buffer = 0\n")
    with pytest.raises(ChuteError, match=r"`shuffle_buffer` must be a positive integer"):
        TrainConfig.from_toml(str(toml))
    toml.write_text("[load]\nbatch_size = 64\n")
    with pytest.raises(ChuteError, match=r"`load.batch_size` cannot be set.*set `batch_size`"):
        TrainConfig.from_toml(str(toml))
    with pytest.raises(ChuteError, match=r"`load.dtype` cannot be set.*chooses it"):
        TrainConfig(load=chute.LoadOptions(dtype="float32"))


class _Stop(Exception):
    """Raised by a spy once it has seen what it was after."""


def test_training_reads_with_the_load_options(data, tmp_path, monkeypatch):
    seen = []

    def spy(manifest, split, options, **overrides):
        seen.append((split, options, overrides))
        raise _Stop

    monkeypatch.setattr(training, "load", spy)
    with pytest.raises(_Stop):
        chute.train(data, tmp_path / "run", **FAST, load={"cache": None, "shuffle_buffer": 16})
    ((split, options, _),) = seen
    assert split == "train" and (options.cache, options.shuffle_buffer) == (None, 16)
    assert options.batch_size == 8 and options.seed == 1337  # chosen by chute.fit.reading


def test_cli_reading_flags_fill_the_load_options(data, tmp_path, monkeypatch, capsys):
    from chute import cli
    from chute.fit import train as train_module

    toml = tmp_path / "train.toml"
    toml.write_text("[load]\nshuffle_buffer = 512\ncache = 'memory'\n")
    configs = []

    def spy(data, run_dir, *, config, overwrite, verbose):
        configs.append(config)
        raise _Stop

    monkeypatch.setattr(train_module, "train", spy)
    with pytest.raises(_Stop):
        cli.main(["train", str(data), "--config", str(toml), "--cache", "none",
                  "--crop-ratio", "0.5,2", "--skip-corrupt"])  # fmt: skip
    (config,) = configs
    assert config.load == chute.LoadOptions(
        shuffle_buffer=512, cache=None, crop_ratio=(0.5, 2.0), skip_corrupt=True
    )
    assert cli.main(["train", str(data), "--crop-scale", "0.5,0.2"]) == 2
    assert "`crop_scale` must be a (min, max) pair" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "--shuffle-buffer N" in shown and "(default: 0.08,1)" in shown
    assert "--batch-size" in shown and shown.count("--batch-size") == 2  # usage + help, once


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("epochs", 0, "`epochs` must be a positive integer"),
        ("optimizer", "adagrad", "`optimizer` must be one of"),
        ("schedule", "step", "`schedule` must be one of"),
        ("label_smoothing", 0.9, "`label_smoothing` must be a number from 0 to 0.5"),
        ("class_weights", "inverse", "`class_weights` must be None or 'balanced'"),
        ("learning_rate", -1, "`learning_rate` must be a number"),
    ],
)
def test_bad_training_options(field, value, message):
    with pytest.raises(ChuteError, match=message):
        TrainConfig(**{field: value})


def test_smoothing_weights_schedule_and_augmentation_train(data, tmp_path):
    result = chute.train(
        data,
        tmp_path / "run",
        model="cifar-cnn",
        epochs=1,
        batch_size=8,
        strategy="cpu",
        label_smoothing=0.1,
        class_weights="balanced",
        schedule="cosine",
        optimizer="sgd",
        augment=("flip", "contrast"),
        verbose=0,
    )
    assert result.epochs_run == 1 and "val_top5" in result.final


def test_evaluate_predict_export(trained, data, tmp_path):
    run, result = trained
    report = chute.evaluate(run, data, split="val")
    assert report.examples == chute.load_manifest(data).num_examples("val")
    assert report.accuracy == pytest.approx(result.best_val_accuracy, abs=1e-6)
    images = sorted((Path(chute.load_manifest(data).source["location"])).rglob("*.png"))[:3]
    predicted = chute.predict(run, [str(p) for p in images], top_k=2)
    assert len(predicted.predictions) == 3 and all(len(p.top) == 2 for p in predicted.predictions)
    out = chute.export(run, tmp_path / "served", format="savedmodel")
    assert (Path(out) / "saved_model.pb").exists()


def test_cli_train_evaluate_predict_export(data, tmp_path):
    # In this process (helpers.run_here): what a fresh process adds (exit codes, no
    # traceback) is tested in tests/test_cli.py.
    run = tmp_path / "run"
    result = run_here(
        "train", data, "--run-dir", run, "--epochs", "1", "--batch-size", "8", "--strategy", "cpu"
    )
    assert result.returncode == 0, result.stderr
    assert "best val accuracy" in result.stdout and "global batch 8 = 8 x 1" in result.stdout
    result = run_here("evaluate", run, data, "--split", "val", "--out", tmp_path / "eval")
    assert result.returncode == 0, result.stderr
    assert "accuracy" in result.stdout and (tmp_path / "eval" / "confusion-val.png").exists()
    image = next(Path(chute.load_manifest(data).source["location"]).rglob("*.png"))
    result = run_here("predict", run, image, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["predictions"][0]["path"].endswith(image.name)
    result = run_here("export", run, "--format", "keras", "--output", tmp_path / "exported")
    assert result.returncode == 0, result.stderr


def test_cli_errors_are_clear(data, tmp_path):
    # In this process: an exception escaping cli.main would fail the test here, and a
    # traceback it logged would be in stderr (run_here captures the log lines too).
    missing = run_here("train", tmp_path / "nothing", "--epochs", "1")
    assert missing.returncode == 2 and "No manifest.json" in missing.stderr
    unknown = run_here(
        "train",
        data,
        "--model",
        "megacnn",
        "--run-dir",
        tmp_path / "r1",
        "--strategy",
        "cpu",
        "--batch-size",
        "8",
    )
    assert (
        unknown.returncode == 2 and "megacnn" in unknown.stderr and "kannada-cnn" in unknown.stderr
    )
    weights = run_here(
        "train",
        data,
        "--weights",
        tmp_path / "none.weights.h5",
        "--run-dir",
        tmp_path / "r2",
        "--strategy",
        "cpu",
    )
    assert (
        weights.returncode == 2
        and "weights" in weights.stderr
        and "none.weights.h5" in weights.stderr
    )
    flag = run_here("train", data, "--epochs", "many")
    assert flag.returncode == 2 and "--epochs" in flag.stderr
    for result in (missing, unknown, weights, flag):
        assert "Traceback" not in result.stderr


def test_a_resumed_run_keeps_its_best_history_and_patience(resumed):
    """Killed after epoch 1 of 2 and resumed: the history, its CSV and the best score
    cover both epochs (before: only those after the resume, and the first epoch after
    it overwrote best.keras whatever its score)."""
    run, result, before = resumed["run"], resumed["result"], resumed["best_before"]
    assert result.resumed and result.epochs_run == 1
    history = json.loads((run / "history.json").read_text())
    assert all(len(values) == 2 for values in history.values())
    assert len((run / "history.csv").read_text().strip().splitlines()) == 1 + 2
    best = json.loads((run / "checkpoints" / "best.json").read_text())["best"]
    assert best == pytest.approx(max(history["val_accuracy"])) and best >= before
    # best.keras is saved again only by an epoch after the resume that beats `before` (on
    # these random images val accuracy often ties, which an unconditional save shows)
    beaten = max(history["val_accuracy"][1:]) > before
    assert (_sha256(run / "checkpoints" / "best.keras") != resumed["best_keras"]) == beaten
    assert result.best_val_accuracy == pytest.approx(best)
    assert not list(run.glob("progress-*.json"))  # kept while running only


def test_patience_counts_the_epochs_before_a_resume(tmp_path):
    """Best at epoch 2 of 4 done before a resume, patience 3: one more epoch without a
    better score stops the run (Keras's EarlyStopping would wait 3 more)."""
    from chute.fit import trainable
    from chute.fit.rundir import prepare

    run = prepare(tmp_path / "run", overwrite=False)
    earlier = {"val_accuracy": [0.5, 0.8, 0.7, 0.6], "loss": [1.0, 0.8, 0.7, 0.6]}
    (tmp_path / "run" / "progress-all.json").write_text(json.dumps(earlier))
    kept = trainable.progress(run, "all", "val_accuracy", patience=3)

    class Model:
        stop_training = False

    kept.set_model(Model())
    kept.on_epoch_end(4, {"val_accuracy": 0.79, "loss": 0.5})
    assert kept.model.stop_training
    assert kept.finish()["val_accuracy"] == [0.5, 0.8, 0.7, 0.6, 0.79]
    assert not (tmp_path / "run" / "progress-all.json").exists()


def test_a_mixed_precision_run_saves_a_float32_bundle(data, tmp_path):
    """The bundle predicts on CPUs: float32 layers, the weights of the best checkpoint."""
    import keras
    import numpy as np

    run = tmp_path / "run"
    result = chute.train(data, run, **{**FAST, "epochs": 1}, precision="mixed_bfloat16")
    assert result.precision == "mixed_bfloat16"
    assert keras.mixed_precision.global_policy().name == "float32"  # restored after the run
    best = keras.models.load_model(run / "checkpoints" / "best.keras")
    served = keras.models.load_model(run / "bundle" / "model.keras")
    assert {layer.dtype_policy.name for layer in best.layers} >= {"mixed_bfloat16"}
    assert {layer.dtype_policy.name for layer in served.layers} == {"float32"}
    for a, b in zip(best.get_weights(), served.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    x = np.random.default_rng(0).random((4, *served.input_shape[1:]), dtype=np.float32)
    np.testing.assert_allclose(served.predict(x, verbose=0), best.predict(x, verbose=0), atol=0.05)


@pytest.mark.parametrize(
    ("kind", "gpus", "capable", "expected"),
    [
        ("multiworker", 2, True, "mixed_float16"),
        ("multiworker", 2, False, "float32"),
        ("multiworker", 0, True, "float32"),
        ("gpu", 1, True, "mixed_float16"),
        ("cpu", 0, True, "float32"),
    ],
)
def test_auto_precision_follows_this_workers_gpus(monkeypatch, kind, gpus, capable, expected):
    from types import SimpleNamespace

    from chute.fit import strategy as strategy_lib

    monkeypatch.setattr(strategy_lib, "count_gpus", lambda: gpus)
    monkeypatch.setattr(strategy_lib, "gpu_supports_mixed_float16", lambda: capable)
    built = SimpleNamespace(num_replicas_in_sync=1, extended=SimpleNamespace(worker_devices=[]))
    devices = strategy_lib.devices_of(built, strategy_lib.Plan(kind))
    assert training._precision(TrainConfig(), devices) == expected


@pytest.mark.slow  # a short training
def test_train_from_python_draws_no_bars_into_redirected_output(data, tmp_path, capfd):
    options = {k: v for k, v in FAST.items() if k != "verbose"}  # Keras's "auto"
    chute.train(data, tmp_path / "run", **{**options, "epochs": 1})
    out, err = capfd.readouterr()
    assert len([line for line in out.splitlines() if "val_accuracy" in line]) == 1  # per epoch
    assert not any(code in out + err for code in ("\r", "\x08", "\x1b[")), repr(out)
