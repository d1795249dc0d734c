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
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import make_folder

import chute
from chute import ChuteError

MARK = "CHUTE_RESULT "  # the scripts print their results on a line starting with this
SEED = 7
PER_REPLICA = 6  # 36 training images: 3 steps of a global batch of 12 per epoch


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """3 classes x 16 grayscale 16x16 images: train 36, val 12 (one shard per split)."""
    root = tmp_path_factory.mktemp("dist-data")
    src = make_folder(root / "src", {"a": 16, "b": 16, "c": 16}, size=(16, 16))
    chute.convert(src, root / "shards", image_size=16, val_fraction=0.25, workers=1)
    return root / "shards"


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

# chute.train asks chute.fit.strategy.auto_strategy for its strategy; the script points that at a
# MirroredStrategy over the 2 logical CPUs, with the kind chute gives MirroredStrategy
# ("multi-gpu"), and keeps the real function for strategy="cpu" (OneDeviceStrategy).
#
# The comparison with one device uses the same seed, data order and global batch (2 x 6 = 12
# on two replicas, 12 on one). Two things legitimately differ under data parallelism, so the
# comparison runs turn them off in the model (and only there): Dropout masks (each replica
# draws its own) and BatchNormalization batch statistics (per replica, over 6 images instead
# of 12; synchronized=True computes them over the global batch, as on one device). SGD with a
# small learning rate: Adam divides each update by the gradient's running magnitude, so for
# weights whose gradient is ~0 a round-off-sized difference becomes a learning-rate-sized one,
# and a large rate makes training on random pixels chaotic; with SGD at 0.003 the two runs
# agree to ~3e-5 in every weight, while a wrong global batch (steps, loss scaling, data split)
# moves weights by about as much as training itself does (~1e-2 and more).
# The comparison runs also fix steps_per_execution=1; chute's own choice for the kind is
# exercised, with the real model, by the `defaults` run and its own test.
MIRRORED_SCRIPT = """
import json, math, sys
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras
import numpy as np
import chute
from chute.fit import models
from chute.fit import strategy as strategy_lib

data, out, seed, per_replica = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
mode = sys.argv[5]  # "compare", or "defaults" (one MirroredStrategy run per process)
real_auto, real_build = strategy_lib.auto_strategy, models.build_model


def auto_strategy(kind="auto", *, tpu=None):
    if kind != "auto":
        return real_auto(kind, tpu=tpu)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    strategy.chute_kind = "multi-gpu"
    return strategy


strategy_lib.auto_strategy = auto_strategy
initial = {}


def exact_build(*args, **kwargs):
    model = real_build(*args, **{**kwargs, "dropout": 0.0})
    norms = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
    assert norms, "the model was expected to have BatchNormalization layers"
    for layer in norms:
        layer.synchronized = True
    initial["weights"] = [np.array(w) for w in model.get_weights()]
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


same = {"epochs": 2, "optimizer": "sgd", "learning_rate": 0.003, "steps_per_execution": 1}
results = {}
if mode == "defaults":
    # The real model and every option at chute's defaults for this kind of strategy.
    results["defaults"] = run("defaults", strategy="auto", batch_size=per_replica, epochs=1)
    print("CHUTE_RESULT " + json.dumps(results), flush=True)
    sys.exit(0)
models.build_model = exact_build
results["mirrored"] = run("mirrored", strategy="auto", batch_size=per_replica, **same)
np.savez(f"{out}/mirrored-initial.npz", *initial.pop("weights", []))
results["single"] = run("single", strategy="cpu", batch_size=2 * per_replica, **same)
np.savez(f"{out}/single-initial.npz", *initial.pop("weights", []))

images = next(iter(chute.load(data, "val", batch_size=12, training=False)))[0]
for name in ("mirrored", "single"):
    if "error" not in results[name]:
        model = keras.models.load_model(f"{out}/{name}/checkpoints/last.keras")
        np.savez(f"{out}/{name}-final.npz", *[np.array(w) for w in model.get_weights()])
        np.save(f"{out}/{name}-probs.npy", model.predict(images, verbose=0))

print("CHUTE_RESULT " + json.dumps(results), flush=True)
"""


@pytest.fixture(scope="module")
def mirrored(data, tmp_path_factory) -> tuple[dict, Path]:
    """Runs the MirroredStrategy script once; its JSON results and output folder."""
    out = tmp_path_factory.mktemp("mirrored")
    script = out / "mirrored.py"
    script.write_text(textwrap.dedent(MIRRORED_SCRIPT))
    results = {}
    # A second MirroredStrategy training in the same process failed in a collective
    # reduce (Adam, TF 2.21) in our runs, so each mode runs in its own process.
    for mode in ("compare", "defaults"):
        log = out / f"mirrored-{mode}"
        proc = _start(script, data, out, SEED, PER_REPLICA, mode, env=_env(), log=log)
        try:
            proc.wait(timeout=200)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the MirroredStrategy script ran over 200 s\n{_errors(log)}")
        finally:
            _stop(proc)
        part = _result(log)
        assert proc.returncode == 0 and part is not None, (
            f"the MirroredStrategy script failed (exit {proc.returncode})\n{_errors(log)}"
        )
        results.update(part)
    return results, out


def _weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as arrays:
        return [arrays[f"arr_{i}"] for i in range(len(arrays.files))]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mirrored_over_two_logical_cpus_matches_one_device(mirrored):
    results, out = mirrored
    two, one = results["mirrored"], results["single"]
    assert "error" not in two, two["error"]
    assert "error" not in one, one["error"]
    assert two["replicas"] == 2 and two["global_batch_size"] == 2 * PER_REPLICA
    assert two["strategy"] == "multi-gpu" and two["precision"] == "float32"
    assert one["replicas"] == 1 and one["global_batch_size"] == 2 * PER_REPLICA
    assert two["epochs_run"] == one["epochs_run"] == 2
    config = json.loads((out / "mirrored" / "config.json").read_text())
    assert config["effective"]["replicas"] == 2
    assert config["effective"]["global_batch_size"] == 2 * PER_REPLICA

    # Same seed, same starting point.
    start2, start1 = _weights(out / "mirrored-initial.npz"), _weights(out / "single-initial.npz")
    assert len(start2) == len(start1) > 0
    assert all(np.array_equal(a, b) for a, b in zip(start2, start1, strict=True))

    # Same end point, up to float round-off (sums taken over replicas, not over one batch).
    end2, end1 = _weights(out / "mirrored-final.npz"), _weights(out / "single-final.npz")
    difference = max(float(np.abs(a - b).max()) for a, b in zip(end2, end1, strict=True))
    moved = max(float(np.abs(a - b).max()) for a, b in zip(end1, start1, strict=True))
    assert moved > 1e-2, f"training barely moved the weights ({moved}): the check proves nothing"
    assert difference < 1e-3, f"weights differ by up to {difference} (training moved {moved})"
    assert math.isclose(two["loss"], one["loss"], rel_tol=1e-3), (two["loss"], one["loss"])
    probs2, probs1 = np.load(out / "mirrored-probs.npy"), np.load(out / "single-probs.npy")
    np.testing.assert_allclose(probs2, probs1, atol=1e-3)


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


# --- MultiWorkerMirroredStrategy over 2 processes ---------------------------------------------

WORKER_SCRIPT = """
import json, sys
import keras
import numpy as np
import chute

data, run_dir, seed, per_replica = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
result = chute.train(data, run_dir, model="kannada-cnn", strategy="multiworker", epochs=1,
                     batch_size=per_replica, seed=seed, verbose=0)
model = keras.models.load_model(f"{result.run_dir}/checkpoints/last.keras")
weights = [np.array(w, dtype=np.float64) for w in model.get_weights()]
np.savez(f"{run_dir}/final.npz", *weights)
print("CHUTE_RESULT " + json.dumps({
    "replicas": result.replicas,
    "global_batch_size": result.global_batch_size,
    "strategy": result.strategy,
    "sum_abs": float(sum(np.abs(w).sum() for w in weights)),
    "first": np.concatenate([w.ravel() for w in weights])[:8].tolist(),
}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_multiworker_two_local_processes_end_with_the_same_weights(data, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER_SCRIPT))
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    logs = [tmp_path / f"worker{i}" for i in range(2)]
    runs = [tmp_path / f"run{i}" for i in range(2)]  # each worker writes its own run_dir
    procs: list[subprocess.Popen] = []
    try:
        for index in range(2):
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            env = _env(TF_CONFIG=json.dumps(tf_config))
            procs.append(
                _start(script, data, runs[index], SEED, PER_REPLICA, env=env, log=logs[index])
            )
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                # One worker failed: the other waits on it in a collective; give it a moment.
                deadline = min(deadline, time.monotonic() + 15)
            time.sleep(0.5)
        codes = [p.poll() for p in procs]
    finally:
        for proc in procs:
            _stop(proc)
    report = "\n".join(f"== worker {i} (exit {codes[i]}):\n{_errors(logs[i])}" for i in range(2))
    assert codes == [0, 0], f"the workers did not both finish cleanly in 240 s\n{report}"

    results = [_result(log) for log in logs]
    assert all(results), report
    for result in results:
        assert result["strategy"] == "multiworker" and result["replicas"] == 2
        assert result["global_batch_size"] == 2 * PER_REPLICA
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
