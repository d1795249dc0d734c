"""Distribution tested on the CPU: MirroredStrategy over 2 logical CPU devices,
MultiWorkerMirroredStrategy over 2 worker processes on 127.0.0.1, and the TPU
path failing fast where there is no TPU.

Logical devices and ``TF_CONFIG`` must be in place before TensorFlow
initialises, so the distributed runs happen in fresh Python processes (scripts
written into ``tmp_path``) that print their results as one JSON line; every
process is bounded in time and killed in ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import make_folder, once_per_run, write_image

import chute
from chute import ChuteError

MARK = "CHUTE_RESULT "  # the scripts print their results on a line starting with this
SEED = 7
PER_REPLICA = 6  # 36 training images: 3 steps of a global batch of 12 per epoch
ONE_STEP = 18  # per replica: a global batch of 36, the whole split: one optimizer step an epoch


@pytest.fixture(scope="module")
def data(train_data) -> Path:
    """3 classes x 16 grayscale 16x16 images: train 36, val 12 (one shard per split); the
    session's (conftest.py's ``train_data``), shared with other modules: read only."""
    return train_data


# --- running scripts in fresh processes ----------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    """The environment of a child: no accelerator, no inherited cluster, this checkout's chute."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CONFIG", "TPU_NAME", "COLAB_TPU_ADDR", "KERAS_BACKEND")
    }
    src = str(Path(chute.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _start(script: Path, *args: object, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Starts ``python SCRIPT ARGS``; stdout and stderr go to files (no pipe can fill up)."""
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(
            [sys.executable, str(script), *map(str, args)],
            stdout=out,
            stderr=err,
            env=env,
            cwd=script.parent,
        )


def _stop(proc: subprocess.Popen) -> None:
    """Kills a child that is still running and reaps it."""
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # killed: it ends promptly
        proc.wait(timeout=30)


def _result(log: Path) -> dict | None:
    for line in log.with_suffix(".out").read_text().splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    return None


def _errors(log: Path, keep: int = 25) -> str:
    """The lines of a child's stderr that say what went wrong (tensor dumps left out)."""
    lines = [line[:300] for line in log.with_suffix(".err").read_text().splitlines()]
    wanted = [line for line in lines if "Error" in line or "error:" in line][-12:]
    tail = [line for line in lines if line.strip() and not line.lstrip().startswith(("[", "..."))]
    return "\n".join([*wanted, "-- stderr tail --", *tail[-keep:]])


def _free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (held together while picked, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# --- MirroredStrategy over 2 logical CPU devices --------------------------------------------

# chute.train asks chute.fit.strategy.tensorflow_devices for its devices; the script points that
# at a MirroredStrategy over the 2 logical CPUs, with the kind chute gives MirroredStrategy
# ("multi-gpu"), and keeps the real function for strategy="cpu" (OneDeviceStrategy).
#
# The comparison with one device uses the same seed, the same images and the same global batch
# (2 x 18 = 36 on two replicas, 36 on one: the whole training split, so that the epoch is ONE
# optimizer step, whatever order the images come in). Two things legitimately differ under
# data parallelism, so the comparison runs turn them off in the model (and only there): Dropout
# masks (each replica draws its own) and BatchNormalization batch statistics (per replica, over
# 18 images instead of 36; synchronized=True computes them over the global batch, as on one
# device). The comparison runs also fix steps_per_execution=1; chute's own choice for the kind
# is exercised, with the real model, by the `defaults` run and its own test.
#
# One step, because training amplifies rounding. The replicas sum in other orders than one
# device (other batch sizes: other kernels), so values differ by float32 round-off; where an
# activation lies within round-off of a ReLU's kink, the backward pass keeps its whole term in
# one run and drops it in the other: one of the 36 x H x W terms a channel's gradient sums, so
# that channel's step is off by up to a few percent (seen here over six seeds, oneDNN on or off
# in either run: one channel off by 2.5%, no layer's step by more than 0.75%). Each later step
# builds on those differences and adds its own: compared after six steps, the runs were 1e-4
# apart here and 0.0214 apart on another machine. So the test compares ONE step (SGD: the
# first is the learning rate times the gradient; Adam's, about its sign, would turn a ~0
# gradient's round-off into a full step) from the identical start, in two parts:
# - what the step computes forward (the loss; each BatchNormalization layer's moving mean and
#   variance, moved toward the batch's): continuous in the round-off. Each layer sums at
#   most 3 x 3 x 128 terms an output and each batch statistic 36 x 16 x 16, each adding
#   log2(n) to sqrt(n) units of round-off (u = 2**-24, relative): under 1e-5 over 8 layers;
#   the variance, E[x^2] - E[x]^2 in the synchronized form, multiplies that by E[x^2] / var
#   (~10-50 here). Bound: 1e-3 of each tensor's movement (seen: under 6e-6);
# - the step itself (the trainable weights' update): per tensor, the L2 distance between
#   the two updates under 5% of the update's norm, 7 times the most ReLU flips did here,
#   while a wrong global batch, loss scaling or data split is off by 50% to 100% (twice the
#   step, half of it, or the gradient of other images). Tried here: a doubled learning rate on
#   the replicas puts the steps 100% apart; batch statistics per replica, 85% (and the moving
#   statistics 42% of their movement).
#
# A second MirroredStrategy training in the same process failed in a collective reduce (Adam,
# TF 2.21) in our runs, so the script runs in two processes side by side: mode "mirrored" (the
# compared MirroredStrategy run) and mode "others" (the `defaults` run, then the compared
# one-device run, which builds the same initial weights from the seed whatever ran before).
MIRRORED_SCRIPT = """
import json, math, os, sys
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras
import numpy as np
import chute
from chute.fit import models
from chute.fit import strategy as strategy_lib

data, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
per_replica, one_step = int(sys.argv[4]), int(sys.argv[5])  # `defaults` run, compared runs
mode = sys.argv[6]  # "mirrored", or "others" (one MirroredStrategy run per process)
real_devices, real_build = strategy_lib.tensorflow_devices, models.build_model


def tensorflow_devices(kind="auto", *, tpu=None):
    if kind != "auto":
        return real_devices(kind, tpu=tpu)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    return strategy_lib.devices_of(strategy, strategy_lib.Plan("multi-gpu"))


strategy_lib.tensorflow_devices = tensorflow_devices
initial = {}


def exact_build(*args, **kwargs):
    model = real_build(*args, **{**kwargs, "dropout": 0.0})
    norms = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
    assert norms, "the model was expected to have BatchNormalization layers"
    for layer in norms:
        layer.synchronized = True
    initial["trainable"] = [np.array(w) for w in model.trainable_weights]
    initial["moving"] = [np.array(w) for w in model.non_trainable_weights]  # BN statistics
    return model


def run(name, **options):
    try:
        result = chute.train(data, f"{out}/{name}", model="kannada-cnn", seed=seed, verbose=0,
                             **options)
    except Exception as error:
        text = f"{type(error).__name__}: {error}"
        return {"error": text if len(text) < 2000 else f"{text[:400]} [...] {text[-1500:]}"}
    return {
        "replicas": result.replicas,
        "global_batch_size": result.global_batch_size,
        "strategy": result.strategy,
        "precision": result.precision,
        "epochs_run": result.epochs_run,
        "loss": result.final.get("loss", math.nan),
    }


same = {"epochs": 1, "optimizer": "sgd", "learning_rate": 0.03, "steps_per_execution": 1}
results = {}
if mode == "others":
    # The real model and every option at chute's defaults for this kind of strategy.
    results["defaults"] = run("defaults", strategy="auto", batch_size=per_replica, epochs=1)
models.build_model = exact_build
if mode == "mirrored":
    name = "mirrored"
    results[name] = run(name, strategy="auto", batch_size=one_step, **same)
else:
    name = "single"
    results[name] = run(name, strategy="cpu", batch_size=2 * one_step, **same)
for kind in ("trainable", "moving"):
    np.savez(f"{out}/{name}-initial-{kind}.npz", *initial.get(kind, []))

images = next(iter(chute.load(data, "val", batch_size=12, training=False)))[0]
if "error" not in results[name]:
    model = keras.models.load_model(f"{out}/{name}/checkpoints/last.keras")
    results[name]["steps"] = int(model.optimizer.iterations.numpy())
    results[name]["trainable"] = [w.path for w in model.trainable_weights]
    results[name]["moving"] = [w.path for w in model.non_trainable_weights]
    np.savez(f"{out}/{name}-final-trainable.npz", *[np.array(w) for w in model.trainable_weights])
    np.savez(f"{out}/{name}-final-moving.npz", *[np.array(w) for w in model.non_trainable_weights])
    np.save(f"{out}/{name}-probs.npy", model.predict(images, verbose=0))
    # before the step's update (with the statistics the step computed): how far it moved them
    for variable, start in zip(model.trainable_weights, initial["trainable"], strict=True):
        variable.assign(start)
    np.save(f"{out}/{name}-probs-before.npy", model.predict(images, verbose=0))

print("CHUTE_RESULT " + json.dumps(results), flush=True)
# The results are out (flushed): skip the interpreter's teardown of TensorFlow (seconds).
os._exit(0)
"""


@pytest.fixture(scope="module")
def mirrored(data, tmp_path_factory) -> tuple[dict, Path]:
    """Runs the MirroredStrategy script's two processes once for the whole test run (its
    tests may go to different pytest-xdist workers); their JSON results and output folder."""

    def build(out: Path) -> None:
        script = out / "mirrored.py"
        script.write_text(textwrap.dedent(MIRRORED_SCRIPT))
        modes = ("mirrored", "others")
        logs = {mode: out / f"mirrored-{mode}" for mode in modes}
        procs: dict[str, subprocess.Popen] = {}
        try:
            for mode in modes:
                args = (data, out, SEED, PER_REPLICA, ONE_STEP, mode)
                procs[mode] = _start(script, *args, env=_env(), log=logs[mode])
            deadline = time.monotonic() + 240
            for mode, proc in procs.items():
                try:
                    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pytest.fail(
                        f"the MirroredStrategy script ran over 240 s\n{_errors(logs[mode])}"
                    )
        finally:
            for proc in procs.values():
                _stop(proc)
        results = {}
        for mode, proc in procs.items():
            part = _result(logs[mode])
            assert proc.returncode == 0 and part is not None, (
                f"the MirroredStrategy script ({mode}) failed (exit {proc.returncode})\n"
                f"{_errors(logs[mode])}"
            )
            results.update(part)
        (out / "results.json").write_text(json.dumps(results))

    out = once_per_run(tmp_path_factory, "mirrored", build)
    return json.loads((out / "results.json").read_text()), out


def _weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as arrays:
        return [arrays[f"arr_{i}"] for i in range(len(arrays.files))]


def _run_weights(out: Path, run: str, when: str) -> dict[str, list[np.ndarray]]:
    """A MirroredStrategy script run's weights at ``when`` (``"initial"`` or ``"final"``):
    ``{"trainable": [...], "moving": [...]}`` (the BatchNormalization statistics)."""
    return {kind: _weights(out / f"{run}-{when}-{kind}.npz") for kind in ("trainable", "moving")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mirrored_over_two_logical_cpus_matches_one_device(mirrored):
    results, out = mirrored
    runs = ("mirrored", "single")
    two, one = (results[run] for run in runs)
    assert "error" not in two, two["error"]
    assert "error" not in one, one["error"]
    assert two["replicas"] == 2 and two["global_batch_size"] == 2 * ONE_STEP
    assert two["strategy"] == "multi-gpu" and two["precision"] == "float32"
    assert one["replicas"] == 1 and one["global_batch_size"] == 2 * ONE_STEP
    assert two["epochs_run"] == one["epochs_run"] == 1
    assert two["steps"] == one["steps"] == 1  # one optimizer step each (see above)
    config = json.loads((out / "mirrored" / "config.json").read_text())
    assert config["effective"]["replicas"] == 2
    assert config["effective"]["global_batch_size"] == 2 * ONE_STEP

    # (the names as the one-device run has them: Keras numbers its layers per process)
    names = {kind: one[kind] for kind in ("trainable", "moving")}
    assert all(len(two[kind]) == len(names[kind]) > 0 for kind in names), (two, one)
    start2, start1 = (_run_weights(out, run, "initial") for run in runs)
    end2, end1 = (_run_weights(out, run, "final") for run in runs)
    # Same seed, same starting point.
    for kind in names:
        assert len(start2[kind]) == len(start1[kind]) == len(names[kind])
        assert all(map(np.array_equal, start2[kind], start1[kind]))
    off = []
    # Forward from the same start (the moving statistics): within float32 round-off (see above).
    moving = (names["moving"], end2["moving"], end1["moving"], start1["moving"])
    for name, a, b, s in zip(*moving, strict=True):
        gap, moved = float(np.abs(a - b).max()), float(np.abs(b - s).max())
        if not gap <= 1e-3 * moved:
            off.append(f"{name}: {gap:.3g} apart, moved {moved:.3g} (bound: 1e-3 of it)")
    # The step: within what ReLU flips explain (see above).
    trainable = (names["trainable"], end2["trainable"], end1["trainable"], start1["trainable"])
    for name, a, b, s in zip(*trainable, strict=True):
        step2, step1 = a.astype(np.float64) - s, b.astype(np.float64) - s
        gap, norm = float(np.linalg.norm(step2 - step1)), float(np.linalg.norm(step1))
        if not gap <= 0.05 * norm:
            off.append(f"{name}: steps {gap:.3g} apart, of norm {norm:.3g} (bound: 5% of it)")
    assert not off, "after one step the runs differ by more than round-off:\n" + "\n".join(off)
    for kind in names:
        pairs = zip(end1[kind], start1[kind], strict=True)
        moved = max(float(np.abs(b - s).max()) for b, s in pairs)
        assert moved > 1e-2, f"the step barely moved the {kind} weights ({moved}): proves nothing"

    # the step's loss: computed forward, from the same start
    assert math.isclose(two["loss"], one["loss"], rel_tol=1e-3), (two["loss"], one["loss"])
    # The saved checkpoints' predictions: within 10% of how far the step moved them, or 1e-3.
    # (With few steps, BatchNormalization keeps the batch's statistics; where a channel's
    # variance is ~1e-3, inference divides by ~0.06 and amplifies the steps' gap: seen up to
    # 1.7%; a doubled step on the replicas puts them 107% apart.)
    probs2, probs1 = np.load(out / "mirrored-probs.npy"), np.load(out / "single-probs.npy")
    moved = float(np.abs(probs1 - np.load(out / "single-probs-before.npy")).max())
    gap = float(np.abs(probs2 - probs1).max())
    assert gap <= max(1e-3, 0.1 * moved), f"predictions {gap} apart; the step moved them {moved}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mirrored_over_two_logical_cpus_trains_with_chute_defaults(mirrored):
    """The real model with every option left to chute (steps_per_execution among them)."""
    results, out = mirrored
    run = results["defaults"]
    assert "error" not in run, f"training under MirroredStrategy failed: {run['error']}"
    assert run["replicas"] == 2 and run["global_batch_size"] == 2 * PER_REPLICA
    assert run["epochs_run"] == 1 and math.isfinite(run["loss"])
    assert (out / "defaults" / "bundle" / "model.keras").is_file()


# --- Per-host input: each worker reads its own share of the shards -----------------------------

READER_SCRIPT = """
import hashlib, json, logging, os, sys
import tensorflow as tf
import chute

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
data = sys.argv[1]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
dataset = chute.load(data, batch_size=4, training=True, strategy=strategy, seed=1)
keys, batches = [], 0
for batch in dataset:
    batches += 1
    images, labels = (strategy.experimental_local_results(t)[0].numpy() for t in batch)
    for image, label in zip(images, labels):
        keys.append(f"{int(label)}:{hashlib.sha256(image.tobytes()).hexdigest()[:16]}")
print("CHUTE_RESULT " + json.dumps({"batches": batches, "keys": keys}), flush=True)
# The results are out (flushed): skip the interpreter's teardown of TensorFlow (seconds).
os._exit(0)
"""


@pytest.fixture(scope="module")
def sixteen_shards(tmp_path_factory) -> Path:
    """160 records in 16 train shards of 10."""
    root = tmp_path_factory.mktemp("sixteen")
    src = make_folder(root / "src", {"a": 80, "b": 80}, size=(4, 4))
    chute.convert(src, root / "shards", workers=1, min_shards=16, encoding="raw")
    return root / "shards"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_worker_reads_its_own_shards_for_the_same_number_of_steps(sixteen_shards, tmp_path):
    """16 shards over 3 workers: uneven shares (6, 5, 5), the same number of steps on each
    (the smallest share's), no example read twice. (Two workers with even shares add nothing
    to this but two more processes that import TensorFlow: the multi-worker runs below have
    two, each with its own shards.)"""
    workers, shards = 3, [6, 5, 5]
    script = tmp_path / "reader.py"
    script.write_text(textwrap.dedent(READER_SCRIPT))
    ports = _free_ports(workers)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    logs = [tmp_path / f"reader{i}" for i in range(workers)]
    procs: list[subprocess.Popen] = []
    try:
        for index in range(workers):
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            env = _env(TF_CONFIG=json.dumps(tf_config))
            procs.append(_start(script, sixteen_shards, env=env, log=logs[index]))
        for proc in procs:
            proc.wait(timeout=240)
    finally:
        for proc in procs:
            _stop(proc)
    report = "\n".join(f"== worker {i}:\n{_errors(log)}" for i, log in enumerate(logs))
    assert [proc.returncode for proc in procs] == [0] * workers, report
    results = [_result(log) for log in logs]
    steps = min(shards) * 10 // 4  # the smallest share's full batches of 4
    for index, result in enumerate(results):
        assert result["batches"] == steps, (index, result["batches"])  # no host waits
        line = f"input pipeline {index} of {workers} reads {shards[index]} shard(s)"
        assert line in logs[index].with_suffix(".err").read_text(), report
    sets = [set(result["keys"]) for result in results]
    assert sum(len(keys) for keys in sets) == len(set().union(*sets)) == workers * steps * 4


# --- MultiWorkerMirroredStrategy over 2 processes, killed and resumed -----------------------

# Each worker backs up every epoch on its own (chute.fit.loop). A restarted run first agrees on
# the last epoch all of them backed up: a worker killed after the chief's backup of an epoch and
# before its own restarts one epoch behind, and workers resuming from different epochs would run
# different numbers of steps (the one with more waits forever in a collective).


def _tiny_training_state():
    """A model, its optimizer and epoch counter in a checkpoint, as the loop keeps them."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    return model, epoch, tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)


def test_a_worker_ahead_resumes_from_the_epoch_every_worker_backed_up(tmp_path):
    """The chief backed up epochs 1-3, another worker only 1-2: the chief goes back to
    epoch 2 (weights, epoch, history), and keeps it as its latest backup, so that another
    interruption before it backs up epoch 3 anew does not take the given-up epoch 3."""
    from chute.fit import loop

    backup = str(tmp_path / "backup")
    history_file = str(tmp_path / "backup" / "history.json")
    model, epoch, checkpoint = _tiny_training_state()
    manager = loop._manager(checkpoint, backup)
    history: dict[str, list[float]] = {"loss": []}
    for done in (1, 2, 3):
        model.set_weights([np.full(w.shape, done, np.float32) for w in model.get_weights()])
        epoch.assign(done)
        history["loss"].append(float(done))
        loop._back_up(manager, history_file, history, done)

    for latest in (3, 2):  # restarted; then restarted again before it backed up epoch 3
        model, epoch, checkpoint = _tiny_training_state()  # a fresh process
        manager = loop._manager(checkpoint, backup)
        assert loop._backed_up(manager) == latest
        assert loop._resume(checkpoint, manager, history_file, 2) == {"loss": [1.0, 2.0]}
        assert int(epoch.numpy()) == 2
        assert all(np.all(np.asarray(w) == 2) for w in model.get_weights())
        assert loop._backed_up(manager) == 2


def test_a_worker_ahead_of_one_without_a_backup_starts_afresh(tmp_path):
    """The other worker died before its first backup: the chief keeps the weights it was
    built with (broadcast to every worker), and epoch 0 becomes its latest backup."""
    from chute.fit import loop

    backup = str(tmp_path / "backup")
    history_file = str(tmp_path / "backup" / "history.json")
    model, epoch, checkpoint = _tiny_training_state()
    start = [np.asarray(w).copy() for w in model.get_weights()]
    manager = loop._manager(checkpoint, backup)
    model.set_weights([w + 1 for w in start])
    epoch.assign(1)
    loop._back_up(manager, history_file, {"loss": [0.5]}, 1)
    model.set_weights(start)  # as built again in a fresh process
    epoch.assign(0)

    assert loop._resume(checkpoint, manager, history_file, 0) == {}
    assert int(epoch.numpy()) == 0
    assert all(np.array_equal(w, s) for w, s in zip(model.get_weights(), start, strict=True))
    assert loop._backed_up(manager) == 0


def test_restore_point_is_the_agreed_epochs_backup_or_a_clear_error():
    from chute.fit import loop

    kept = ["run/backup/ckpt-2", "run/backup/ckpt-3"]
    assert loop._restore_point(kept, 3) == "run/backup/ckpt-3"
    assert loop._restore_point(kept, 2) == "run/backup/ckpt-2"
    assert loop._restore_point([], 0) is None
    with pytest.raises(ChuteError, match=r"epoch 1, .* keeps epochs \[2, 3\]"):
        loop._restore_point(kept, 1)


def test_agreed_epoch_of_a_single_worker_is_its_own():
    import tensorflow as tf

    from chute.fit import loop

    assert loop._agreed_epoch(tf.distribute.get_strategy(), 3) == 3
    assert loop._agreed_epoch(tf.distribute.OneDeviceStrategy("/cpu:0"), 0) == 0


RESUME_EPOCHS = 3
RESUME_BATCH = 8  # per replica: a global batch of 16

# Trains the same run as every attempt of the kill-and-resume run below, and saves the weights
# it ends with. Worker 1's faults (one per attempt, from the environment):
# STALL_BACKUP=n makes its n-th backup never end, like a stuck write to a bucket: it is killed
# there by the test, after the chief backed up the same epoch. DIE_IN_EPOCH=n makes it SIGKILL
# itself halfway through the n-th epoch it trains: after the other worker backed up the epoch
# before (the steps so far are collectives, so the chief took part in them), before either
# could back this one up.
RESUME_SCRIPT = """
import json, logging, os, signal, sys, time
import keras
import numpy as np
import tensorflow as tf
import chute
from chute.fit import loop

# the loop's account (resuming from ..., epoch n: ...) on the worker's stderr
logging.basicConfig(format="%(name)s: %(message)s")
logging.getLogger("chute.fit.loop").setLevel(logging.INFO)

data, run_dir, seed, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
batch_size = int(sys.argv[5])
stall = int(os.environ.get("STALL_BACKUP", "0"))
if stall:
    real_save, saves = tf.train.CheckpointManager.save, []

    def save(self, *args, **kwargs):
        saves.append(1)
        if len(saves) == stall:
            time.sleep(600)
        return real_save(self, *args, **kwargs)

    tf.train.CheckpointManager.save = save
die = int(os.environ.get("DIE_IN_EPOCH", "0"))
if die:
    real_fit, real_steps, steps_per_epoch, done = loop.fit_multiworker, loop._steps, [], []

    def fit_multiworker(*args, **kwargs):
        steps_per_epoch.append(kwargs["steps"])
        return real_fit(*args, **kwargs)

    def steps(*args, **kwargs):
        train_step, val_step = real_steps(*args, **kwargs)

        def dying_step(iterator):
            if len(done) == (die - 1) * steps_per_epoch[0] + steps_per_epoch[0] // 2:
                os.kill(os.getpid(), signal.SIGKILL)
            done.append(1)
            return train_step(iterator)

        return dying_step, val_step

    loop.fit_multiworker, loop._steps = fit_multiworker, steps
result = chute.train(data, run_dir, model="kannada-cnn", strategy="multiworker", epochs=epochs,
                     batch_size=batch_size, learning_rate=3e-3, seed=seed, verbose=0)
model = keras.models.load_model(f"{result.run_dir}/checkpoints/last.keras")
weights = [np.asarray(w, np.float64) for w in model.get_weights()]
np.savez(f"{run_dir}/final.npz", *weights)
print("CHUTE_RESULT " + json.dumps({
    "epochs_run": result.epochs_run,
    "resumed": result.resumed,
    "final": result.final,
    "replicas": result.replicas,
    "global_batch_size": result.global_batch_size,
    "strategy": result.strategy,
    "sum_abs": float(sum(np.abs(w).sum() for w in weights)),
    "first": np.concatenate([w.ravel() for w in weights])[:8].tolist(),
}), flush=True)
# The results are out (flushed): skip the interpreter's teardown of TensorFlow (seconds).
os._exit(0)
"""


@pytest.fixture(scope="module")
def learnable(tmp_path_factory) -> Path:
    """3 classes of 16x16 grayscale images told apart by brightness (pixels ~ N(40 + 85k, 12)):
    train 216, val 72, in shards split evenly between 2 workers (13 steps of 8 an epoch each:
    enough to die halfway through one; each step is a collective across the processes)."""
    root = tmp_path_factory.mktemp("learnable")
    rng = np.random.default_rng(SEED)
    for k, name in enumerate("abc"):
        for i in range(96):
            pixels = np.clip(rng.normal(40 + 85 * k, 12, (16, 16)), 0, 255).astype(np.uint8)
            write_image(root / "src" / name / f"{i:03d}.png", pixels)
    chute.convert(
        root / "src", root / "shards", image_size=16, val_fraction=0.25, hosts=2, workers=1
    )
    return root / "shards"


def _backed_up(backup: Path) -> int:
    """The epoch of a worker's latest backup (0: none), as its CheckpointManager state names it."""
    state = backup / "checkpoint"
    text = state.read_text() if state.is_file() else ""
    found = re.search(r'^model_checkpoint_path: "(.+)"', text, re.M)
    return int(found[1].rsplit("-", 1)[1]) if found else 0


def _kill_and_resume(data: Path, root: Path) -> dict:
    """Starts 2 workers, and again with the same command after each of worker 1's two deaths
    (see ``resumed``). Returns what each attempt left (exit codes, backups, the chief's log;
    the last one's results)."""
    script = root / "resume.py"
    script.write_text(textwrap.dedent(RESUME_SCRIPT))
    cluster = {"worker": [f"127.0.0.1:{port}" for port in _free_ports(2)]}
    runs = [root / f"run{i}" for i in range(2)]
    backups = [runs[0] / "backup", runs[1] / "worker-1" / "backup"]
    faults = {1: {"STALL_BACKUP": "2"}, 2: {"DIE_IN_EPOCH": "2"}, 3: {}}  # worker 1's
    logs = {(a, i): root / f"attempt{a}-worker{i}" for a in faults for i in range(2)}

    def start(attempt: int) -> list[subprocess.Popen]:
        procs = []
        for index in range(2):
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            extra = faults[attempt] if index == 1 else {}
            env = _env(TF_CONFIG=json.dumps(tf_config), **extra)
            args = (data, runs[index], SEED, RESUME_EPOCHS, RESUME_BATCH)
            procs.append(_start(script, *args, env=env, log=logs[attempt, index]))
        return procs

    def report(attempt: int, codes: list) -> str:
        return "\n".join(
            f"== attempt {attempt}, worker {i} (exit {codes[i]}):\n{_errors(logs[attempt, i])}"
            for i in range(2)
        )

    def left(attempt: int, procs: list[subprocess.Popen]) -> dict:
        codes = [p.returncode for p in procs]
        history = backups[0] / "history.json"
        return {
            "codes": codes,
            "backed_up": [_backed_up(backup) for backup in backups],
            "history": json.loads(history.read_text()) if history.is_file() else None,
            "results": [_result(logs[attempt, i]) for i in range(2)],
            "chief_log": logs[attempt, 0].with_suffix(".err").read_text(),
            "report": report(attempt, codes),
        }

    # 1: worker 1 hangs in its backup of epoch 2; once the chief backed it up, worker 1 is
    # killed, and the chief, waiting for it in a collective of epoch 3, is stopped too.
    procs = start(1)
    try:
        deadline = time.monotonic() + 120
        while _backed_up(backups[0]) < 2:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                codes = [p.poll() for p in procs]
                pytest.fail(f"the chief backed up no second epoch in time\n{report(1, codes)}")
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=30)
    finally:
        for proc in procs:
            _stop(proc)
    attempts = [left(1, procs)]

    # 2: worker 1 dies in its second epoch; the chief, waiting for it, is stopped too.
    # 3: the run finishes.
    for attempt, seconds in ((2, 150), (3, 150)):
        procs = start(attempt)
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                if attempt == 2 and procs[1].poll() is not None:
                    break
                if any(p.poll() is not None for p in procs):
                    # One worker ended: the other ends with it, or waits on it in a collective.
                    deadline = min(deadline, time.monotonic() + 30)
                time.sleep(0.2)
        finally:
            for proc in procs:
                _stop(proc)
        attempts.append(left(attempt, procs))
    return {"attempts": attempts, "chief": str(runs[0]), "runs": [str(run) for run in runs]}


@pytest.fixture(scope="module")
def resumed(request, tmp_path_factory) -> dict:
    """One 2-worker run of RESUME_EPOCHS epochs, started again with the same command after
    each of two deaths of worker 1, made once for the whole test run (its tests may go to
    different pytest-xdist workers):

    1. worker 1 hangs in its backup of epoch 2 and is SIGKILLed there, after the chief backed
       up epoch 2 (the chief is stopped too);
    2. restarted, both resume from epoch 1, the last one both backed up, and train epoch 2;
       worker 1 dies by SIGKILL halfway through epoch 3, after both backed up epoch 2;
    3. restarted, both resume from epoch 2 and finish the run.
    """

    def build(root: Path) -> None:
        data = request.getfixturevalue("learnable")  # only where the run is made
        (root / "outcome.json").write_text(json.dumps(_kill_and_resume(data, root)))

    return json.loads(
        (once_per_run(tmp_path_factory, "resumed", build) / "outcome.json").read_text()
    )


def _check_resumed(outcome: dict, agreed: int) -> None:
    """The last restart trained the epochs left from ``agreed`` on both workers, to the same
    weights, and the chief wrote a whole run: every epoch's history, best checkpoint, bundle."""
    last = outcome["attempts"][-1]
    assert last["codes"] == [0, 0], f"the resumed workers did not both finish\n{last['report']}"
    results = last["results"]
    assert all(results), last["report"]
    for result in results:
        assert result["resumed"]
        assert result["epochs_run"] == RESUME_EPOCHS - agreed, (result, agreed)
        assert math.isfinite(result["final"]["loss"])
    assert math.isclose(results[0]["sum_abs"], results[1]["sum_abs"], rel_tol=1e-6), results
    chief = Path(outcome["chief"])
    history = json.loads((chief / "history.json").read_text())
    assert {name: len(values) for name, values in history.items()} == dict.fromkeys(
        history, RESUME_EPOCHS
    )
    assert all(math.isfinite(value) for value in history["loss"])
    # A run reaches 1.0 from its first epoch on (13 steps); chance is 0.33.
    assert history["val_accuracy"][-1] >= 0.6, history
    assert results[0]["final"]["val_accuracy"] == history["val_accuracy"][-1]
    for name in ("checkpoints/best.keras", "bundle/model.keras"):
        assert (chief / name).is_file(), name
    assert not (chief / "backup").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_multiworker_resume_agrees_when_a_worker_died_before_its_backup(resumed):
    """Worker 1 killed after the chief backed up epoch 2 and before it did: both resume
    from epoch 1 (the chief goes back one), rather than the chief from 2 and worker 1 from 1."""
    first, second = resumed["attempts"][:2]
    assert first["codes"][1] == -signal.SIGKILL and not any(first["results"]), first["report"]
    assert first["backed_up"] == [2, 1], first
    # Restarted, the chief went back to epoch 1, and the two trained epoch 2 in step (worker 1
    # died in the next one). Had the chief resumed from epoch 2, it would have trained its
    # last epoch while worker 1 trained epoch 2, and finished the run alone.
    assert "resuming from epoch 1," in second["chief_log"], second["report"]
    assert second["codes"][1] == -signal.SIGKILL and not any(second["results"]), second["report"]
    assert second["backed_up"] == [2, 2], second
    assert len(second["history"]["loss"]) == 2, second["history"]
    _check_resumed(resumed, agreed=2)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_multiworker_run_resumes_after_a_worker_is_killed_mid_epoch(resumed):
    """Worker 1 SIGKILLed halfway through an epoch, between backups: the same command
    resumes both workers from the last epoch they backed up and finishes the run."""
    second = resumed["attempts"][1]
    assert second["codes"][1] == -signal.SIGKILL and not any(second["results"]), second["report"]
    epoch = second["backed_up"][0]
    assert 0 < epoch < RESUME_EPOCHS, second  # killed mid-run
    assert len(second["history"]["loss"]) >= epoch
    _check_resumed(resumed, agreed=min(second["backed_up"]))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_multiworker_two_local_processes_end_with_the_same_weights(resumed):
    """The two workers of that run end with the same weights (every array, BatchNorm's moving
    statistics included), and the chief writes the run folder."""
    last = resumed["attempts"][-1]
    assert last["codes"] == [0, 0], f"the workers did not both finish\n{last['report']}"
    results = last["results"]
    assert all(results), last["report"]
    for result in results:
        assert result["strategy"] == "multiworker" and result["replicas"] == 2
        assert result["global_batch_size"] == 2 * RESUME_BATCH
    runs = [Path(run) for run in resumed["runs"]]
    chief = runs[0]
    for name in ("bundle/model.keras", "checkpoints/best.keras", "history.csv", "curves.png"):
        assert (chief / name).is_file(), name  # the chief writes the run directory
    assert any((chief / "logs").rglob("*tfevents*"))
    first, second = (_weights(run / "final.npz") for run in runs)
    assert len(first) == len(second) > 0
    differing = [
        i for i, (a, b) in enumerate(zip(first, second, strict=True)) if not np.allclose(a, b)
    ]
    assert not differing, (
        f"weights {differing} differ between the workers: {results[0]} vs {results[1]}"
    )
    assert math.isclose(results[0]["sum_abs"], results[1]["sum_abs"], rel_tol=1e-6)


# --- TPU ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tpu_strategy_without_a_tpu_fails_fast_before_training(data, tmp_path, monkeypatch):
    """Detection and fallback are unit-tested with fakes (test_strategy.py); here the real
    resolver finds no TPU, and chute.train stops with a clear error before building anything
    (the timeout mark only guards against a hang; no clock is asserted)."""
    if Path("/dev/accel0").exists() or Path("/dev/vfio/0").exists():
        pytest.skip("this machine may have a TPU")
    from chute.fit import models
    from chute.fit import train as train_module

    for name in ("TPU_NAME", "COLAB_TPU_ADDR", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)

    def no_training(*args, **kwargs):
        raise AssertionError("training started although there is no TPU")

    monkeypatch.setattr(models, "build_model", no_training)
    monkeypatch.setattr(train_module, "load", no_training)
    run = tmp_path / "run"
    with pytest.raises(ChuteError, match="TPU") as caught:
        chute.train(data, run, model="kannada-cnn", strategy="tpu", epochs=1, verbose=0)
    assert "no TPU was found" in str(caught.value)
    assert not (run / "checkpoints").exists() and not (run / "bundle").exists()
