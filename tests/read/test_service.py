"""Reading through the tf.data service: a dispatcher and two workers started with
``chute data-service`` as processes on 127.0.0.1 (TF 2.21's servers can crash while
shutting down, tensorflow#113163, so they stay out of the pytest process), and
``chute.load`` / ``chute.train`` in this process reading from them (and ``chute.train`` on
JAX in a child process).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import jax_child_env, make_folder, run_here, write_image
from PIL import Image

import chute
from chute.errors import ChuteError
from chute.lazy import tf
from chute.read.tf import keys as keys_lib
from chute.read.tf import service
from chute.read.tf.plan import make_plan

PER_CLASS = 100  # 200 records in 8 shards, batches of 4: with no worker lost, an epoch
BATCH = 4  # holds every record (each worker's short last batch is regrouped by the reader)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def dispatcher(tmp_path_factory):
    """``grpc://127.0.0.1:PORT`` of a dispatcher with two workers, stopped afterwards."""
    logs = tmp_path_factory.mktemp("service")
    port = _free_port()
    commands = [["dispatcher", "--port", str(port)]] + [
        ["worker", "--dispatcher", f"127.0.0.1:{port}", "--address", "127.0.0.1"]
    ] * 2
    procs = []
    try:
        # All three start at once (each imports TensorFlow for seconds): the workers keep
        # trying to register until the dispatcher is up.
        for i, command in enumerate(commands):
            with open(logs / f"{i}.log", "w") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "chute", "data-service", *command],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + 120
        while not _listening(port):
            if time.monotonic() > deadline or procs[0].poll() is not None:
                pytest.fail(f"no dispatcher on port {port}: {(logs / '0.log').read_text()}")
            time.sleep(0.2)
        yield f"grpc://127.0.0.1:{port}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
    assert [proc.returncode for proc in procs] == [0, 0, 0]  # SIGTERM: a clean exit


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("service-data")
    src = make_folder(root / "src", {"a": PER_CLASS, "b": PER_CLASS}, size=(6, 6))
    chute.convert(src, root / "out", workers=1, min_shards=8, encoding="raw")
    return src, root / "out"


def _source(src: Path) -> collections.Counter:
    return collections.Counter(
        (label, np.asarray(Image.open(path)).tobytes())
        for label, name in enumerate(("a", "b"))
        for path in sorted((src / name).iterdir())
    )


def _examples(batches) -> list[tuple[int, bytes]]:
    out = []
    for images, labels in batches:
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            out.append((int(label), image.tobytes()))
    return out


def _check_epoch(examples, expected) -> None:
    got = collections.Counter(examples)
    assert max(got.values()) == 1, "an example came twice in one epoch"
    assert got == expected, (len(got), len(expected))  # at most once, and none lost


# One dispatcher (three processes) for the module: under `--dist loadfile` its tests run on
# one worker.
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_epoch_holds_every_example_at_most_once_in_a_new_order(dispatcher, data):
    src, out = data
    expected = _source(src)
    # Under a global seed, as chute.train sets: it fixes the op seeds of the graph that every
    # job (epoch) runs afresh; before chute.read.tf.keys mixed in the clock, the epochs
    # differed only by the workers' timing (70-144 of 200 positions alike with one worker;
    # all 200 once, on a loaded 2-core CI run).
    tf.random.set_seed(1)
    try:
        ds = chute.load(out, batch_size=BATCH, training=True, seed=1, data_service=dispatcher)
        epochs = [_examples(ds) for _ in range(2)]
    finally:
        tf.random.set_seed(None)
    for examples in epochs:
        _check_epoch(examples, expected)
    alike = sum(a == b for a, b in zip(*epochs, strict=True))
    assert alike < 20, alike  # two random orders of 200: about 1 (seen: 0 to 3)
    assert ds.element_spec[0].shape.as_list() == [BATCH, 6, 6, 1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_strategy_reads_through_the_service_with_distribute_datasets_from_function(
    dispatcher, data
):
    src, out = data
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    distributed = chute.load(
        out, batch_size=BATCH, training=True, strategy=strategy, data_service=dispatcher
    )
    assert isinstance(distributed, tf.distribute.DistributedDataset)
    _check_epoch(_examples(distributed), _source(src))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_evaluation_reads_locally_every_example_once_in_order(dispatcher, data):
    _, out = data
    local = _examples(chute.load(out, batch_size=BATCH, training=False))
    through = _examples(chute.load(out, batch_size=BATCH, training=False, data_service=dispatcher))
    assert through == local and len(local) == 2 * PER_CLASS


def _levels(root: Path) -> Path:
    """3 classes told apart by brightness (noisy): a model learns them in a few epochs."""
    rng = np.random.default_rng(0)
    for k, name in enumerate(("dark", "mid", "light")):
        for i in range(60):
            pixels = np.clip(rng.normal(40 + 85 * k, 12, (16, 16)), 0, 255).astype(np.uint8)
            write_image(root / name / f"{i:03d}.png", pixels)
    return root


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_train_through_the_service_learns_as_well_as_reading_locally(dispatcher, tmp_path):
    src = _levels(tmp_path / "src")
    out = tmp_path / "out"
    chute.convert(src, out, workers=1, val_fraction=0.25, min_shards=4)
    # Both runs reach val accuracy 1.0 in their first epoch (17 steps): 2 epochs show it.
    options = dict(
        model="kannada-cnn", epochs=2, batch_size=8, learning_rate=3e-3, verbose=0, seed=3
    )
    local = chute.train(out, tmp_path / "local", **options)
    served = chute.train(out, tmp_path / "served", data_service=dispatcher, **options)
    assert served.epochs_run == local.epochs_run == 2
    assert local.best_val_accuracy >= 0.9, local.best_val_accuracy  # the task is learnable
    assert served.best_val_accuracy >= local.best_val_accuracy - 0.1, (
        served.best_val_accuracy,
        local.best_val_accuracy,
    )
    config = (tmp_path / "served" / "config.json").read_text()
    assert dispatcher in config


# Keras's backend is fixed at its import: the JAX run is a child process (TensorFlow only reads).
JAX_THROUGH_SERVICE = """
import dataclasses, json, logging, sys

import chute

logging.basicConfig(level=logging.INFO)
data, run, address = sys.argv[1:4]
result = chute.train(
    data, run, data_service=address, model="kannada-cnn", epochs=1, batch_size=8, verbose=0,
    seed=3,
)
import keras

trained = keras.saving.load_model(f"{run}/checkpoints/last.keras")
print(json.dumps({
    "backend": keras.backend.backend(),
    "steps": int(trained.optimizer.iterations),
    "result": dataclasses.asdict(result),
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_jax_trains_through_the_service(dispatcher, tmp_path):
    """``chute.train(..., data_service=...)`` on KERAS_BACKEND=jax: every step of the epoch
    trained on batches the service's workers made."""
    src = _levels(tmp_path / "src")
    out = tmp_path / "out"
    chute.convert(src, out, workers=1, val_fraction=0.25, min_shards=4)
    steps = chute.load_manifest(str(out)).num_examples("train") // 8  # 135 // 8
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "JAX_PLATFORMS")}
    paths = (str(Path(chute.__file__).resolve().parents[1]), env.get("PYTHONPATH"))
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in paths if p),
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        CUDA_VISIBLE_DEVICES="",
        TF_CPP_MIN_LOG_LEVEL="2",
        **jax_child_env(tmp_path / "jax-cache"),
    )
    run = tmp_path / "run"
    child = subprocess.run(
        [sys.executable, "-c", JAX_THROUGH_SERVICE, str(out), str(run), dispatcher],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-4000:]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found["backend"] == "jax" and found["result"]["backend"] == "jax"
    assert found["result"]["epochs_run"] == 1
    assert found["steps"] == steps  # every step of the epoch, none short of input
    assert f"training split read through the tf.data service at {dispatcher}" in child.stderr
    assert "ran out of data" not in child.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["backend"] == "jax"
    history = json.loads((run / "history.json").read_text())
    assert len(history["loss"]) == 1 and np.isfinite(history["loss"][0])
    assert dispatcher in (run / "config.json").read_text()


# -- no server needed ---------------------------------------------------------------------------


def _first_keys(plan, offset: int) -> list[int]:
    return [int(key) for key in keys_lib.stream(plan, offset).take(8)]


def test_through_the_service_each_job_draws_its_own_keys_under_a_global_seed(shared_dataset):
    """The service runs the same graph afresh for each epoch (a job): there, the keys that
    drive block sizes, window orders, crops and flips must differ from one instantiation
    of the graph to the next even though a global seed fixed its op seeds. Read here,
    a seed still gives the same keys."""
    manifest = chute.load_manifest(shared_dataset)
    here = make_plan(manifest, "train", chute.LoadOptions(batch_size=4, seed=1))
    served = make_plan(
        manifest, "train", chute.LoadOptions(batch_size=4, data_service="127.0.0.1:1")
    )
    assert here.seed == 1 and served.seed is None and served.data_service
    try:
        for offset in (0, 1, 2, 3):
            built = []
            for _ in range(2):  # as each job's worker builds it: the same op seeds
                tf.random.set_seed(7)
                built.append((_first_keys(here, offset), _first_keys(served, offset)))
            (here_a, served_a), (here_b, served_b) = built
            assert here_a == here_b  # a seed: the same keys
            assert not set(served_a) & set(served_b), offset  # each job its own
            assert all(0 <= key < 2**32 for key in served_a + served_b)  # as Dataset.random
    finally:
        tf.random.set_seed(None)


# -- errors (no server needed) ------------------------------------------------------------------


@pytest.mark.parametrize("address", ["nowhere", "grpc://host", "host:99999", 5050])
def test_a_bad_address_names_the_argument(shared_dataset, address):
    with pytest.raises(ChuteError, match=r"`data_service` must be a dispatcher address.*Received"):
        chute.load(shared_dataset, data_service=address)


def test_what_the_service_cannot_run_is_refused_with_the_way_out(shared_dataset):
    out = shared_dataset
    with pytest.raises(ChuteError, match="skip_corrupt"):
        chute.load(out, data_service="127.0.0.1:1", skip_corrupt=True)
    with pytest.raises(ChuteError, match="augment_on='device'"):
        chute.load(out, data_service="127.0.0.1:1", augment=["zoom"], augment_on="host")


def test_the_address_is_normalised():
    assert service.check_address("x", "grpc://10.1.2.3:5050") == "grpc://10.1.2.3:5050"
    assert service.check_address("x", "dispatcher-0.example:80") == "grpc://dispatcher-0.example:80"


def test_hosts_share_one_job_and_single_pipelines_use_their_own(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}}')
    name = service.job_name("train-abc", 2)
    assert name and name == service.job_name("train-abc", 2)  # every host computes the same
    assert service.job_name("train-abc", 1) is None
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["c:1", "d:2"]}}')
    assert service.job_name("train-abc", 2) != name  # another cluster, another job


def test_cli_worker_with_a_bad_dispatcher_fails_cleanly():
    result = run_here("data-service", "worker", "--dispatcher", "not-an-address")
    assert result.returncode == 2
    assert "`dispatcher` must be a dispatcher address" in result.stderr
    assert "Traceback" not in result.stderr


def test_train_config_checks_the_address():
    with pytest.raises(ChuteError, match="`data_service`"):
        chute.TrainConfig(data_service="nope")
    assert chute.TrainConfig(data_service="h:1").data_service == "grpc://h:1"
