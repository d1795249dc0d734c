"""chute.load(engine="grain"): global shuffle, positions that save and restore, the same
evaluation pixels as the tf.data engine, class-balanced draws, and exact mid-epoch resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import jax_child_env, once_per_run, write_image

import chute
from chute import ChuteError

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """3 classes x 40 RGB 24x32 photos-like images as JPEG shards (train 90 in 12
    shards, val 30), stored at their aspect ratio (evaluation centre-crops them)."""

    def build(root: Path) -> None:
        rng = np.random.default_rng(0)
        for label, name in enumerate("abc"):
            for index in range(40):
                pixels = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
                pixels[:, :, label] = 200
                write_image(root / "src" / name / f"{index:03d}.png", pixels)
        chute.convert(
            root / "src", root / "shards", image_size=(24, 32), resize="crop", encoding="jpeg",
            val_fraction=0.25, min_shards=12, workers=1,
        )  # fmt: skip

    return once_per_run(tmp_path_factory, "grain-shards", build) / "shards"


def test_each_epoch_is_a_new_global_permutation(shards):
    train = chute.load(shards, engine="grain", batch_size=8, seed=3, workers=0)
    assert len(train) == 90 // 8 == train.chute.steps
    records = len(train.batches.source)
    first, second = train.batches.draw(0), train.batches.draw(1)
    # each record at most once: every record but the last partial batch's (a new 2 each epoch)
    for order in (first, second):
        assert len(set(order.tolist())) == len(order) == 88 and set(order) <= set(range(records))
    assert list(first) != list(second)
    batches = [list(iter(train)) for _ in range(2)]  # each iter() the next epoch
    assert [len(epoch) for epoch in batches] == [11, 11]
    labels = [np.concatenate([b[1] for b in epoch]) for epoch in batches]
    assert not np.array_equal(labels[0], labels[1])
    same = chute.load(shards, engine="grain", batch_size=8, seed=3, workers=0)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in iter(same)]),
                                  np.concatenate([b[0] for b in batches[0]]))  # fmt: skip


def test_the_start_of_an_epoch_draws_from_almost_every_shard(tmp_path):
    """A global shuffle: the first 5% of an epoch comes from >= 90% of the shards (a
    window shuffle over interleaved shards reads a few shards at a time)."""
    images = np.random.default_rng(1).integers(0, 255, (2000, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / "data.npz", x=images, y=np.arange(2000) % 4)
    chute.convert(tmp_path / "data.npz", tmp_path / "shards", val_fraction=0, min_shards=20,
                  workers=1)  # fmt: skip
    train = chute.load(tmp_path / "shards", engine="grain", batch_size=10, seed=0, workers=0)
    source = train.batches.source
    shards = len(source._starts) - 1  # record number of each shard's first record, then all
    assert shards >= 20
    early = train.batches.draw(0)[: len(source) // 20]
    hit = {int(np.searchsorted(source._starts, r, side="right")) - 1 for r in early}
    assert len(hit) >= 0.9 * shards, (len(hit), shards)


def test_a_restored_iterator_in_a_new_process_continues_exactly(shards, tmp_path):
    train = chute.load(shards, engine="grain", batch_size=8, seed=5, augment="crop,flip",
                       image_size=16, workers=0)  # fmt: skip
    iterator = iter(train)
    for _ in range(4):
        next(iterator)
    state = iterator.get_state()
    assert len(json.dumps(state)) < 500
    expected = next(iterator)
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys, numpy as np, chute
        train = chute.load({str(shards)!r}, engine="grain", batch_size=8, seed=5,
                           augment="crop,flip", image_size=16, workers=0)
        iterator = iter(train)
        iterator.set_state(json.loads(sys.argv[1]))
        images, labels = next(iterator)
        np.save(sys.argv[2], images), np.save(sys.argv[3], labels)
    """)
    )
    out = [tmp_path / "images.npy", tmp_path / "labels.npy"]
    subprocess.run([sys.executable, str(script), json.dumps(state), *map(str, out)],
                   check=True, timeout=120)  # fmt: skip
    np.testing.assert_array_equal(np.load(out[0]), expected[0])
    np.testing.assert_array_equal(np.load(out[1]), expected[1])


@pytest.mark.parametrize("image_size", [None, (24, 24)])
def test_evaluation_gives_the_tf_engines_pixels_every_example_once(shards, image_size):
    options = dict(batch_size=8, image_size=image_size, pad_final_batch=True)
    on_grain = list(chute.load(shards, "val", engine="grain", workers=0, **options))
    on_tf = list(chute.load(shards, "val", **options).as_numpy_iterator())
    assert len(on_grain) == len(on_tf) == 4  # 30 in batches of 8, the last padded
    for mine, theirs in zip(on_grain, on_tf, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            np.testing.assert_array_equal(a, b)


def test_the_grain_engine_runs_its_work_in_worker_processes(shards):
    train = chute.load(shards, engine="grain", batch_size=8, seed=1, workers=2)
    alone = chute.load(shards, engine="grain", batch_size=8, seed=1, workers=0)
    for a, b in zip(iter(train), iter(alone), strict=True):
        np.testing.assert_array_equal(a[0], b[0])


@pytest.fixture(scope="module")
def imbalanced(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imbalanced")
    labels = np.array([0] * 10 + [1] * 500)
    images = np.random.default_rng(0).integers(0, 255, (510, 4, 4), dtype=np.uint8)
    np.savez(root / "data.npz", x=images, y=labels)
    chute.convert(root / "data.npz", root / "shards", val_fraction=0, workers=1)
    return root / "shards"


def test_balanced_sampling_draws_every_class_alike(imbalanced):
    train = chute.load(imbalanced, engine="grain", batch_size=30, seed=0, workers=0,
                       sampling="balanced")  # fmt: skip
    assert len(train) == 510 // 30
    labels = np.concatenate([b[1] for epoch in range(3) for b in iter(train)])
    assert abs(labels.mean() - 0.5) < 0.05, labels.mean()


def test_what_the_grain_engine_cannot_do_is_refused(shards):
    with pytest.raises(ChuteError, match="`skip_corrupt`"):
        chute.load(shards, engine="grain", skip_corrupt=True)
    with pytest.raises(ChuteError, match="augment_on='device'"):
        chute.load(shards, engine="grain", augment="crop,rotation")
    with pytest.raises(ChuteError, match="`engine`"):
        chute.load(shards, engine="torch")
    device = chute.load(shards, engine="grain", augment="crop,rotation", augment_on="device")
    assert device.chute.device_augmentation is not None


RESUME = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import keras, numpy as np
import chute
from chute.fit import train as training
from helpers import Killed
data, root = Path(sys.argv[1]), Path(sys.argv[2])
options = dict(model="kannada-cnn", epochs=2, batch_size=8, strategy="cpu", verbose=0, seed=1,
               image_size=16, augment="crop,flip", schedule="cosine", backup_every=3,
               load={"engine": "grain", "workers": 0})
keras.backend.clear_session()  # each run builds its model afresh, as a new process would
chute.train(data, root / "whole", **options)
real = training._EpochTimer
def dying():
    timer, seen = real(), [0]
    def on_train_batch_end(batch, logs=None):
        seen[0] += 1
        if seen[0] == 8:
            raise Killed
    timer.on_train_batch_end = on_train_batch_end
    return timer
training._EpochTimer = dying
keras.backend.clear_session()
try:
    chute.train(data, root / "cut", **options)
    killed = False
except Killed:
    killed = True
left = sorted(p.name for p in (root / "cut" / "backup").iterdir())
training._EpochTimer = real
keras.backend.clear_session()
chute.train(data, root / "cut", **options)
whole, cut = (keras.models.load_model(root / name / "checkpoints" / "last.keras").get_weights()
              for name in ("whole", "cut"))
same = all(np.array_equal(a, b) for a, b in zip(whole, cut, strict=True))
print("RESULT " + json.dumps({"killed": killed, "left": left, "same": same}))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_run_killed_mid_epoch_resumes_on_the_next_batch(shards, tmp_path, backend):
    """Killed after step 8 of 22 (backed up at 6, mid-epoch 0 of 11 steps) and run again:
    it ends with an uninterrupted run's weights, bit for bit (the same batches, learning
    rate, optimizer step and dropout draws), on either backend (one child each)."""
    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    env = {**os.environ, "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": ""}
    env.update(jax_child_env(tmp_path / "jax-cache"))  # the three runs compile the same programs
    args = [sys.executable, str(script), str(shards), str(tmp_path), str(TESTS)]
    done = subprocess.run(args, timeout=500, capture_output=True, env=env, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ")[-1])
    assert result["killed"] and "seeds.json" in result["left"]
    assert result["same"], "the resumed run's weights differ from the uninterrupted run's"
    assert "ran out of data" not in done.stderr  # Keras knows the validation steps
    history = json.loads((tmp_path / "cut" / "history.json").read_text())
    assert len(history["loss"]) == 2
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["backend"] == backend


def _position(engine: str, iterations: int, steps: int = 6):
    import types

    from chute.fit import position

    calls = []
    dataset = types.SimpleNamespace(set_epoch=lambda epoch, start: calls.append((epoch, start)))
    callback = position.input_position(dataset, steps=steps, first_epoch=2, engine=engine)
    model = types.SimpleNamespace(
        optimizer=types.SimpleNamespace(iterations=iterations), stop_training=False
    )
    callback.set_model(model)
    return callback, model, calls


def test_the_position_goes_on_from_the_restored_step_and_ends_that_epoch_early():
    callback, model, calls = _position("grain", iterations=10)  # epoch 1, 4 of 6 batches done
    callback.on_train_begin()
    callback.on_epoch_begin(1)
    assert calls == [(3, 4)]  # data epoch 2 + 1, from batch 4
    callback.on_train_batch_end(0)
    assert not callback.cut and not model.stop_training
    callback.on_train_batch_end(1)  # the epoch's 2 remaining batches are trained
    assert callback.cut and model.stop_training
    callback.on_train_begin()  # the next fit: from that epoch's end
    model.optimizer.iterations, model.stop_training = 12, False
    callback.on_epoch_begin(2)
    callback.on_train_batch_end(5)
    assert calls[-1] == (4, 0) and not callback.cut and not model.stop_training


def test_the_tf_engine_says_an_interrupted_epoch_starts_again(caplog):
    callback, _, calls = _position("tf", iterations=10)
    with caplog.at_level("INFO", logger="chute.fit.position"):
        callback.on_train_begin()
        callback.on_epoch_begin(1)
    assert "reads the epoch again from its first batch" in caplog.text
    assert calls == [] and not callback.cut


def test_cli_train_flags_of_the_grain_engine_are_checked(shards, tmp_path):
    from helpers import run_here

    done = run_here("train", shards, "--run-dir", tmp_path / "r", "--backup-every", "0")
    assert done.returncode == 2 and "`backup_every`" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_here("train", shards, "--run-dir", tmp_path / "r", "--engine", "mxnet")
    assert done.returncode == 2
    done = run_here("train", shards, "--run-dir", tmp_path / "r", "--sampling", "x=-1")
    assert done.returncode == 2 and "`sampling`" in done.stderr
    assert not (tmp_path / "r").exists()


def test_training_validates_with_threads_on_the_grain_engine(shards, monkeypatch):
    """Keras iterates validation anew each epoch: worker processes would start each time."""
    import types

    from chute import LoadOptions, TrainConfig
    from chute.fit import train as training

    asked, real_load = [], training.load
    monkeypatch.setattr(
        training, "load", lambda *args, **kwargs: asked.append(kwargs) or real_load(*args, **kwargs)
    )
    monkeypatch.setattr(training, "_per_host", lambda strategy: False)
    strategy = types.SimpleNamespace(chute_kind="cpu", num_replicas_in_sync=1)
    manifest = chute.load_manifest(str(shards))
    for workers, expected in ((None, 0), (2, None)):
        read = LoadOptions(engine="grain", workers=workers)
        val, steps = training._val_split(manifest, TrainConfig(), strategy, read, 1.0)
        assert asked[-1].get("workers") == expected and asked[-1]["training"] is False
        # Keras is told the steps (else it reads to the end, and warns it ran out of data)
        assert steps == len(val) == -(-30 // 32) and asked[-1]["repeat"] is True
