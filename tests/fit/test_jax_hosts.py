"""chute train on JAX over two processes on 127.0.0.1, as on two hosts, and what is refused.

The test starts ``python -m chute train ... --backend jax --coordinator 127.0.0.1:PORT
--num-processes 2 --process-id I`` twice, as a user would on each host, each process with
2 CPU devices (``XLA_FLAGS``; JAX's CPU collectives, gloo by default in jax 0.10): 4 devices
in one ``DataParallel``. The first time, both processes stall at the end of epoch 1 (after
its backup; a ``sitecustomize`` hook, below) and the test kills them with SIGKILL; the same
commands then resume the run and finish it. Every process is bounded in time and killed in
``finally``. One module fixture runs all of it (about a minute and a half on 2 idle cores);
the tests read what it left. Another pair of the same commands then trains with the Grain
engine for 2 epochs (about 30 s: the first pair's XLA cache).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import jax_child_env, once_per_run, run_here, write_banded

import chute
from chute import ChuteError, TrainConfig
from chute.fit import processes as processes_lib
from chute.fit import rendezvous
from chute.fit.rundir import RunDir

# The two processes compile and train for a minute or two on 2 busy cores: one pytest-xdist
# worker runs this module's tests (another would wait for the run with nothing to do).
pytestmark = pytest.mark.timeout(600)

TESTS = Path(__file__).resolve().parents[1]
PROCESSES, DEVICES, PER_DEVICE = 2, 2, 2  # global batch 2 x 4 = 8, 4 per process
EPOCHS, STALL_AFTER = 3, 1
WAIT = 240  # seconds for each attempt

# Imported by the first attempt's processes at start-up (their PYTHONPATH puts it first):
# each stalls at the end of epoch STALL_AFTER, after its backups (the timer runs last),
# and says so with a file, for the test to kill both there.
STALL_HOOK = """
import os
import time
from pathlib import Path

from helpers import dying_epoch_timer

import chute.fit.train as training

after, marks = int(os.environ["CHUTE_TEST_STALL_AFTER"]), Path(os.environ["CHUTE_TEST_MARKS"])


def stall(epoch):
    if epoch + 1 == after:
        (marks / f"stalled-{os.getpid()}").write_text(str(epoch + 1))
        time.sleep(600)
    return False


training._epoch_timer = dying_epoch_timer(training, stall)
"""


@pytest.fixture(scope="module")
def learnable(tmp_path_factory) -> Path:
    """3 classes x 24 grayscale 16x16 PNGs a small CNN tells apart in a few epochs (a bright
    band whose row says the class), converted to 3 shards per split: train 18 + 18 + 18, so
    process 0 reads 2 shards (36 images) and process 1 one (18); val 6 + 6 + 6."""
    root = tmp_path_factory.mktemp("learnable-hosts")
    write_banded(root / "src")
    chute.convert(
        root / "src", root / "shards", image_size=16, val_fraction=0.25, workers=1, min_shards=3
    )
    manifest = chute.load_manifest(str(root / "shards"))
    assert manifest.shard_counts("train") == [18, 18, 18]
    assert manifest.shard_counts("val") == [6, 6, 6]
    return root / "shards"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(root: Path, attempt: str, **extra: str) -> dict[str, str]:
    """A process's environment: JAX on 2 CPU devices, no accelerator, this checkout's chute,
    its own temporary folder, and a compilation cache shared by both attempts."""
    drop = ("KERAS_BACKEND", "TF_CONFIG", "TPU_NAME", "COLAB_TPU_ADDR", *processes_lib.ENVIRONMENT)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    src = str(Path(chute.__file__).resolve().parents[1])
    paths = [extra.pop("HOOK", None), src, str(TESTS), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    tmp = root / f"tmp-{attempt}"
    tmp.mkdir(exist_ok=True)
    env.update(
        **jax_child_env(root / "jax-cache", DEVICES),
        JAX_PLATFORMS="cpu",
        CUDA_VISIBLE_DEVICES="",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONUNBUFFERED="1",
        TMPDIR=str(tmp),
    )
    env.update(extra)
    return env


def _start(
    data: Path, root: Path, attempt: str, env: dict[str, str], *flags: str, epochs: int = EPOCHS
) -> list[subprocess.Popen]:
    """The same ``chute train`` command (and ``flags``) as on each of two hosts; output in
    ``logs/``."""
    port = _free_port()
    procs = []
    for index in range(PROCESSES):
        log = root / "logs" / f"{attempt}{index}"
        command = [
            sys.executable, "-m", "chute", "train", str(data), "--run-dir", str(root / "run"),
            "--backend", "jax", "--strategy", "cpu", "--epochs", str(epochs),
            "--batch-size", str(PER_DEVICE), "--coordinator", f"127.0.0.1:{port}",
            "--num-processes", str(PROCESSES), "--process-id", str(index),
            # no label smoothing: the tests compare val_loss with evaluate's cross-entropy
            "--label-smoothing", "0", *flags,
        ]  # fmt: skip
        with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
            procs.append(subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=root))
    return procs


def _kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL for every process still running; each reaped."""
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


def _stalled_and_killed(data: Path, root: Path) -> dict:
    """The first attempt: both processes run to the end of epoch STALL_AFTER, where they
    stall; killed there. What the run folder held then."""
    marks = root / "marks"
    marks.mkdir()
    hook = root / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(STALL_HOOK)
    env = _env(
        root, "a", HOOK=str(hook), CHUTE_TEST_STALL_AFTER=str(STALL_AFTER),
        CHUTE_TEST_MARKS=str(marks),
    )  # fmt: skip
    procs = _start(data, root, "a", env)
    try:
        deadline = time.monotonic() + WAIT
        while len(list(marks.iterdir())) < PROCESSES and time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in procs):
                break  # one ended on its own: an error, in its log
            time.sleep(0.5)
        stalled = len(list(marks.iterdir()))
        codes = [proc.poll() for proc in procs]
    finally:
        _kill(procs)
    run = root / "run"
    return {
        "stalled": stalled,
        "codes": codes,
        "backup": sorted(p.name for p in (run / "backup").glob("*")),
        "metadata": json.loads((run / "backup" / "state.json").read_text())["current"]
        if (run / "backup" / "state.json").exists()
        else None,
        "bundle": (run / "bundle").exists(),
    }


def _resumed(data: Path, root: Path) -> dict:
    """The second attempt: the same commands, to the run's end."""
    procs = _start(data, root, "b", _env(root, "b"))
    started = time.monotonic()
    try:
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(1.0, WAIT - (time.monotonic() - started)))
        codes = [proc.poll() for proc in procs]
    finally:
        _kill(procs)
    return {"codes": codes, "seconds": round(time.monotonic() - started, 1)}


@pytest.fixture(scope="module")
def hosts(learnable, tmp_path_factory) -> dict:
    """What both attempts left (``killed``, ``resumed``) and their folder (``root``): the run
    folder ``run``, each process's output ``logs/{a,b}{0,1}.{out,err}``, and each attempt's
    temporary folder ``tmp-{a,b}``. Made once for the whole test run."""

    def build(root: Path) -> None:
        (root / "logs").mkdir()
        started = time.monotonic()
        killed = _stalled_and_killed(learnable, root)
        resumed = _resumed(learnable, root)
        outcome = {"killed": killed, "resumed": resumed}
        outcome["seconds"] = round(time.monotonic() - started, 1)
        (root / "outcome.json").write_text(json.dumps(outcome))

    root = once_per_run(tmp_path_factory, "jax-hosts", build)
    return {"root": root, **json.loads((root / "outcome.json").read_text())}


def _log(hosts: dict, name: str) -> str:
    return (hosts["root"] / "logs" / name).read_text()


def _errors(hosts: dict, attempt: str) -> str:
    """Both processes' stderr tails, without the runtimes' noise, for a failed assertion."""
    tails = []
    for index in range(PROCESSES):
        lines = _log(hosts, f"{attempt}{index}.err").splitlines()
        kept = [line for line in lines if not line.startswith(("I0000", "W0000", "[Gloo]"))]
        tails.append(f"-- process {index} --\n" + "\n".join(kept[-30:]))
    return "\n".join(tails)


@pytest.fixture(scope="module")
def finished(hosts) -> Path:
    """The run folder, once the resumed attempt finished on both processes."""
    assert hosts["killed"]["stalled"] == PROCESSES, _errors(hosts, "a")
    assert hosts["resumed"]["codes"] == [0, 0], _errors(hosts, "b")
    return hosts["root"] / "run"


@pytest.mark.slow
def test_two_jax_processes_train_on_every_device_of_both_and_learn(hosts, finished):
    summary = json.loads((finished / "summary.json").read_text())
    assert summary["backend"] == "jax" and summary["processes"] == PROCESSES
    assert summary["replicas"] == PROCESSES * DEVICES  # the global devices, not one host's
    assert summary["global_batch_size"] == PER_DEVICE * PROCESSES * DEVICES
    config = json.loads((finished / "config.json").read_text())
    assert config["effective"]["replicas"] == PROCESSES * DEVICES
    history = json.loads((finished / "history.json").read_text())
    assert history["accuracy"][-1] >= 0.9, history["accuracy"]  # chance: 1/3
    for index in range(PROCESSES):  # what each host's command printed
        out = _log(hosts, f"b{index}.out")
        assert f"jax cpu: {PROCESSES * DEVICES} device(s)" in out, out
        assert f"{PROCESSES} JAX processes" in out
        assert f"-> {finished}" in out  # the chief's run folder, on every process


_SHARE = re.compile(
    r"input pipeline (\d) of 2 reads \d+ shard\(s\) \(([^)]*)\), (\d+) examples: "
    r"(\d+) batches of (\d+) per epoch"
)


def _shares(hosts: dict, attempt: str, split: str) -> dict[int, dict]:
    """What each process logged it reads of ``split``."""
    found = {}
    for index in range(PROCESSES):
        for match in _SHARE.finditer(_log(hosts, f"{attempt}{index}.err")):
            names = match[2].split(", ")
            if names[0].startswith(f"{split}-"):
                found[int(match[1])] = {
                    "process": index,
                    "shards": names,
                    "examples": int(match[3]),
                    "steps": int(match[4]),
                    "batch": int(match[5]),
                }
    return found


@pytest.mark.slow
def test_each_process_reads_its_own_shards_and_runs_the_same_steps(hosts, finished):
    for attempt in ("a", "b"):
        train = _shares(hosts, attempt, "train")
        assert sorted(train) == [0, 1] and all(train[i]["process"] == i for i in train)
        first, second = train[0], train[1]
        assert not set(first["shards"]) & set(second["shards"])  # no shard read twice
        assert len(first["shards"] + second["shards"]) == 3  # every shard read
        # uneven parts (36 and 18 images), equal steps: the smallest part's, 18 // 4
        assert (first["examples"], second["examples"]) == (36, 18)
        assert first["steps"] == second["steps"] == 18 // (PER_DEVICE * DEVICES)
        assert first["batch"] == second["batch"] == PER_DEVICE * DEVICES  # this host's share
        val = _shares(hosts, attempt, "val")
        assert not set(val[0]["shards"]) & set(val[1]["shards"])
        # the largest part's batches on both (3), the other padded
        assert val[0]["steps"] == val[1]["steps"] == -(-12 // (PER_DEVICE * DEVICES))


@pytest.mark.slow
def test_validation_across_processes_counts_every_example_once(finished):
    """Each process validates its part (12 and 6 images, padded to 3 batches of 4): the
    scores of the best epoch are those of the chief's own evaluation of the same weights
    (the bundle) over the whole split on one device."""
    history = json.loads((finished / "history.json").read_text())
    best = int(np.argmax(history["val_accuracy"]))  # the first best: the checkpoint kept
    single = json.loads((finished / "evaluation-val.json").read_text())
    assert single["examples"] == 18
    assert history["val_accuracy"][best] == pytest.approx(single["accuracy"], abs=1e-6)
    assert history["val_loss"][best] == pytest.approx(single["loss"], rel=1e-4)


@pytest.mark.slow
def test_only_the_chief_writes_the_run_directory(hosts, finished):
    root = hosts["root"]
    made = {p.name for p in root.iterdir()} - {"logs", "marks", "hook", "jax-cache", "outcome.json"}
    assert made == {"run", "tmp-a", "tmp-b"}  # one run folder
    assert not list(finished.glob("worker-*"))  # and no other process's inside it
    for name in ("bundle/model.keras", "checkpoints/best.keras", "checkpoints/last.keras",
                 "history.csv", "history.json", "summary.json", "evaluation-val.json"):  # fmt: skip
        assert (finished / name).is_file(), name
    # the other process kept its callbacks' files in a temporary folder, removed at its exit
    assert not list((root / "tmp-b").glob("chute-process-*"))


@pytest.mark.slow
def test_a_killed_run_resumes_from_the_chiefs_backup_on_every_process(hosts, finished):
    killed = hosts["killed"]
    assert killed["codes"] == [None, None]  # both were running when killed
    assert killed["metadata"]["epoch"] == STALL_AFTER
    assert killed["metadata"]["weights"] in killed["backup"]
    assert not killed["bundle"]
    summary = json.loads((finished / "summary.json").read_text())
    assert summary["resumed"] and summary["epochs_run"] == EPOCHS - STALL_AFTER
    rows = (finished / "history.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + EPOCHS  # header + every epoch once
    assert not (finished / "backup").exists()  # a finished run keeps no backup
    assert "resuming the run in" in _log(hosts, "b0.err")
    assert "process 1 resumes from the chief's backup" in _log(hosts, "b1.err")


# --- the Grain engine across the two processes ------------------------------------------------
#
# The same two commands with ``--engine grain`` (threads: ``--workers 0``), for 2 epochs, after
# the run above (its XLA cache: the same programs). A ``sitecustomize`` hook records the record
# numbers of every batch each process's Grain dataset makes, for the tests to check the shares.

GRAIN_EPOCHS = 2

GRAIN_HOOK = """
import json
import os
from pathlib import Path

import chute.read.grain.dataset as engine

marks, made = Path(os.environ["CHUTE_TEST_MARKS"]), engine.Batches.__getitem__


def recorded(self, number):
    name = f"{self.source.split}-{self.share.index}-{os.getpid()}.jsonl"
    with open(marks / name, "a") as out:
        out.write(json.dumps([int(number), self.records_of(number).tolist()]) + "\\n")
    return made(self, number)


engine.Batches.__getitem__ = recorded
"""


@pytest.fixture(scope="module")
def grain(learnable, hosts, tmp_path_factory) -> dict:
    """Both processes' exit codes, and their folder (``root``): the run folder ``run``, each
    process's output ``logs/g{0,1}.{out,err}`` and the batches each read, ``marks/SPLIT-I-*``
    (``[batch number, [record numbers]]`` a line, I the input pipeline)."""

    def build(root: Path) -> None:
        for name in ("logs", "marks", "hook"):
            (root / name).mkdir()
        (root / "hook" / "sitecustomize.py").write_text(GRAIN_HOOK)
        env = _env(
            root, "g", HOOK=str(root / "hook"), CHUTE_TEST_MARKS=str(root / "marks"),
            JAX_COMPILATION_CACHE_DIR=str(hosts["root"] / "jax-cache"),
        )  # fmt: skip
        flags = ("--engine", "grain", "--workers", "0")
        started = time.monotonic()
        procs = _start(learnable, root, "g", env, *flags, epochs=GRAIN_EPOCHS)
        try:
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(1.0, WAIT - (time.monotonic() - started)))
            codes = [proc.poll() for proc in procs]
        finally:
            _kill(procs)
        outcome = {"codes": codes, "seconds": round(time.monotonic() - started, 1)}
        (root / "outcome.json").write_text(json.dumps(outcome))

    root = once_per_run(tmp_path_factory, "jax-hosts-grain", build)
    outcome = json.loads((root / "outcome.json").read_text())
    assert outcome["codes"] == [0, 0], _errors({"root": root}, "g")
    return {"root": root, **outcome}


def _grain_batches(grain: dict, split: str, index: int) -> dict[int, list[int]]:
    """The record numbers of each batch input pipeline ``index`` made of ``split``."""
    batches: dict[int, list[int]] = {}
    for path in (grain["root"] / "marks").glob(f"{split}-{index}-*.jsonl"):
        for line in path.read_text().splitlines():
            number, records = json.loads(line)
            assert batches.setdefault(number, records) == records  # a batch is its number's
    return batches


@pytest.mark.slow
def test_two_jax_processes_train_with_the_grain_engine_each_on_its_own_share(grain):
    run = grain["root"] / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["backend"] == "jax" and summary["processes"] == PROCESSES
    assert summary["replicas"] == PROCESSES * DEVICES and summary["epochs_run"] == GRAIN_EPOCHS
    config = json.loads((run / "config.json").read_text())
    assert config["load"]["engine"] == "grain"
    batch, steps = PER_DEVICE * DEVICES, 54 // (PER_DEVICE * DEVICES * PROCESSES)  # 4, 6
    for index in range(PROCESSES):  # equal steps: an equal share of one global order
        err = _log(grain, f"g{index}.err")
        assert (
            f"grain engine: input pipeline {index} of {PROCESSES}, a new global shuffle each "
            f"epoch, {steps} batches of {batch} per epoch, 0 worker(s)"
        ) in err, err[-3000:]
        assert f"-> {run}" in _log(grain, f"g{index}.out")
    shares = [_grain_batches(grain, "train", index) for index in range(PROCESSES)]
    for epoch in range(GRAIN_EPOCHS):
        numbers = range(epoch * steps, (epoch + 1) * steps)
        read = []
        for share in shares:
            assert set(numbers) <= set(share)  # every batch of the epoch was made
            records = [r for number in numbers for r in share[number]]
            assert len(records) == len(set(records)) == steps * batch
            read.append(set(records))
        assert not read[0] & read[1]  # no record read by both processes in an epoch
        assert read[0] | read[1] <= set(range(54))


@pytest.mark.slow
def test_grain_validation_across_processes_counts_every_example_once(grain):
    """Each process validates its half of the 18 images (9, padded to 3 batches of 4): the
    scores of the best epoch are those of the chief's single evaluation of the bundle."""
    read = []
    for index in range(PROCESSES):
        batches = _grain_batches(grain, "val", index)
        assert sorted(batches) == [0, 1, 2]
        read.append([r for number in range(3) for r in batches[number] if r >= 0])
    assert sorted(read[0] + read[1]) == list(range(18))  # each example once, by one process
    run = grain["root"] / "run"
    history = json.loads((run / "history.json").read_text())
    assert len(history["loss"]) == GRAIN_EPOCHS
    best = int(np.argmax(history["val_accuracy"]))
    single = json.loads((run / "evaluation-val.json").read_text())
    assert single["examples"] == 18
    assert history["val_accuracy"][best] == pytest.approx(single["accuracy"], abs=1e-6)
    assert history["val_loss"][best] == pytest.approx(single["loss"], rel=1e-4)


@pytest.mark.slow
def test_grain_processes_leave_one_run_folder(grain):
    root = grain["root"]
    made = {p.name for p in root.iterdir()} - {"logs", "marks", "hook", "outcome.json"}
    assert made == {"run", "tmp-g"}
    assert not list((root / "run").glob("worker-*"))
    assert (root / "run" / "bundle" / "model.keras").is_file()
    assert not list((root / "tmp-g").glob("chute-process-*"))


# --- what is refused, and the pieces, in this process ---------------------------------------


def test_coordinator_flags_are_refused_on_tensorflow(train_data, tmp_path):
    result = run_here(
        "train", train_data, "--run-dir", tmp_path / "run", "--backend", "tensorflow",
        "--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "0",
    )  # fmt: skip
    assert result.returncode != 0
    assert "coordinator" in result.stderr and "backend='tensorflow'" in result.stderr
    assert "--backend jax" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"coordinator": "no-port"}, "coordinator"),
        ({"coordinator": "host:99999"}, "coordinator"),
        ({"num_processes": 0}, "num_processes"),
        ({"num_processes": 2, "process_id": 2}, "process_id"),
        ({"process_id": -1}, "process_id"),
    ],
)
def test_bad_process_options_are_named(options, named):
    with pytest.raises(ChuteError, match=f"`{named}` must be .* Received: {named}="):
        TrainConfig(**options)


def test_the_chiefs_backup_and_progress_travel_whole(tmp_path):
    """What the chief sends the other processes before training: every file of the backup
    (each phase's too) and each phase's progress, nothing else."""
    chief = RunDir(str(tmp_path / "chief"), resumed=True)
    files = {
        "backup/head/done.json": b'{"history": {}}',
        "backup/head/end.weights.h5": bytes(range(256)) * 3,
        "backup/fine-tune/latest.weights.h5": b"\x00weights",
        "backup/fine-tune/training_metadata.json": b'{"epoch": 2}',
        "progress-fine-tune.json": b'{"loss": [1.0]}',
    }
    for name, data in {**files, "checkpoints/best.keras": b"no", "history.csv": b"no"}.items():
        path = Path(chief.join(*name.split("/")))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    other = tmp_path / "other"
    assert processes_lib._unpack(processes_lib._pack(chief), str(other)) == len(files)
    got = {str(p.relative_to(other)): p.read_bytes() for p in other.rglob("*") if p.is_file()}
    assert got == {name.replace("/", os.sep): data for name, data in files.items()}


def test_what_the_chief_sends_arrives_whole_in_pieces(monkeypatch):
    """Header and payload through JAX's broadcast (one process here: the chief's own
    values), in pieces of a few bytes, the last one short."""
    monkeypatch.setattr(processes_lib, "_CHUNK", 8)
    payload = bytes(range(27))
    chief = processes_lib.Processes(count=1, index=0)
    assert processes_lib._from_chief([1, 0], payload, chief) == ([1, 0], payload)
    assert processes_lib._from_chief([0, 1], b"", chief) == ([0, 1], b"")


def test_a_refusal_by_the_chief_stops_every_process(monkeypatch, tmp_path):
    """A process other than the chief raises what the chief said, and makes no folder."""
    said = b"`run_dir` holds a finished run"
    monkeypatch.setattr(processes_lib, "_from_chief", lambda header, payload, p: ([0, 0], said))
    other = processes_lib.Processes(count=2, index=1)
    with pytest.raises(
        ChuteError, match=r"process 0 \(the chief\) cannot train in .*holds a finished run"
    ):
        processes_lib.prepare_run(tmp_path / "run", overwrite=False, processes=other)
    assert not (tmp_path / "run").exists()


# --- processes that do not all come: bounded waits, one line naming the missing ----------------


def _meet(port: int, count: int, indexes: list[int], timeout: float) -> dict[int, object]:
    """Processes ``indexes`` of ``count`` meeting at 127.0.0.1:``port`` (each in a thread, as
    on its host): what each returned (None) or raised, and how long each took."""
    outcome: dict[int, object] = {}

    def one(index: int) -> None:
        started = time.monotonic()
        try:
            rendezvous.wait_for_processes(
                f"127.0.0.1:{port}", count=count, index=index, timeout=timeout
            )
            outcome[index] = None
        except ChuteError as error:
            outcome[index] = error
        outcome[-1 - index] = time.monotonic() - started

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in indexes]
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # process 0 (listed first) listens before the others come
    for thread in threads:
        thread.join(timeout=timeout * 2 + 30)
    assert not any(thread.is_alive() for thread in threads)
    return outcome


def test_processes_that_all_come_go_on_and_leave_the_port_to_jax():
    port = _free_port()
    outcome = _meet(port, 3, [0, 2, 1], timeout=30)
    assert [outcome[i] for i in (0, 1, 2)] == [None, None, None]
    with socket.socket() as s:  # free again, for JAX's coordinator
        s.bind(("", port))


def test_process_0_alone_names_the_missing_within_its_timeout(caplog):
    port = _free_port()
    with caplog.at_level("INFO", logger="chute.fit.rendezvous"):
        outcome = _meet(port, 3, [0, 1], timeout=1.5)
    assert outcome[-1] < 1.5 + 5 and outcome[-2] < 1.5 + 5  # bounded, on both
    address = f"127.0.0.1:{port}"
    assert f"waiting up to 1.5 s for 3 JAX processes at {address} (this is process 0" in (
        caplog.text
    )
    chief = str(outcome[0])
    assert chief.startswith(f"JAX process(es) 2 of 3 did not come to {address} within 1.5 s")
    assert "(came: 0, 1)" in chief and "--process-id 2 on its host" in chief
    assert "--process-timeout SECONDS" in chief
    assert f"Received: coordinator='{address}', num_processes=3, process_id=0" in chief
    other = str(outcome[1])  # the one that came hears who is missing
    assert other.startswith(f"JAX process(es) 2 of 3 did not come to {address}")
    assert "process_id=1" in other


def test_a_process_without_process_0_fails_within_its_timeout():
    port = _free_port()
    outcome = _meet(port, 2, [1], timeout=1.0)
    assert outcome[-2] < 1.0 + 5
    message = str(outcome[1])
    assert message.startswith(f"process 0 of 2 did not answer at 127.0.0.1:{port} within 1 s (")
    assert "--process-id 0 on 127.0.0.1" in message and "--process-timeout SECONDS" in message


def test_processes_that_disagree_on_the_run_are_refused_and_a_stranger_ignored():
    port = _free_port()
    outcome: dict[int, object] = {}

    def chief():
        try:
            rendezvous.wait_for_processes(f"127.0.0.1:{port}", count=2, index=0, timeout=20)
            outcome[0] = None
        except ChuteError as error:
            outcome[0] = error

    thread = threading.Thread(target=chief, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while True:  # a stranger speaks first (a port scanner, a health check): not a process
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as stranger:
                stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    with pytest.raises(ChuteError, match=r"started with --num-processes 3, process 0 with 2"):
        rendezvous.wait_for_processes(f"127.0.0.1:{port}", count=3, index=1, timeout=20)
    thread.join(timeout=30)
    assert "started with --num-processes 3, process 0 with 2" in str(outcome[0])


@pytest.mark.slow
def test_a_jax_process_started_alone_exits_with_one_line_not_an_abort(train_data, tmp_path):
    """``--num-processes 2 --process-id 0`` and no other process: JAX alone waits 5 minutes
    in silence, then aborts with SIGABRT and a C++ stack. chute says it waits, and ends
    within --process-timeout with one line naming the process that did not come."""
    port = _free_port()
    command = [
        sys.executable, "-m", "chute", "train", str(train_data), "--run-dir",
        str(tmp_path / "run"), "--backend", "jax", "--strategy", "cpu", "--epochs", "1",
        "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0",
        "--process-timeout", "3",
    ]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(
        command, capture_output=True, text=True, env=_env(tmp_path, "alone"), timeout=240
    )
    assert time.monotonic() - started < 180  # start-up (imports) + 3 s, not JAX's 300 s
    assert result.returncode == 2, result.stderr[-3000:]
    address = f"127.0.0.1:{port}"
    assert f"waiting up to 3 s for 2 JAX processes at {address}" in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(
        f"chute train: error: JAX process(es) 1 of 2 did not come to {address} within 3 s"
    )
    for crash in ("Traceback", "Check failure", "Terminating process", "SIGABRT"):
        assert crash not in result.stderr
    assert not (tmp_path / "run").exists()  # nothing written before the processes met


def test_the_processes_come_from_the_options_else_keras_variables(monkeypatch):
    """What the processes wait for and JAX joins: the options, else Keras's variables read
    as keras.distribution.initialize reads them (the first of several addresses)."""
    for name in processes_lib.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    config = TrainConfig(backend="jax", num_processes=2, process_id=1)
    assert processes_lib._cluster(config) == (None, 2, 1)
    monkeypatch.setenv("KERAS_DISTRIBUTION_JOB_ADDRESSES", "10.0.0.2:1234,10.0.0.3:1234")
    monkeypatch.setenv("KERAS_DISTRIBUTION_PROCESS_ID", "0")
    assert processes_lib._cluster(config) == ("10.0.0.2:1234", 2, 1)  # options first
    assert processes_lib._cluster(TrainConfig(backend="jax")) == ("10.0.0.2:1234", None, 0)
    with pytest.raises(ChuteError, match="lists 2 addresses but there are 3 processes"):
        processes_lib._cluster(TrainConfig(backend="jax", num_processes=3))
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "two")
    with pytest.raises(ChuteError, match="KERAS_DISTRIBUTION_NUM_PROCESSES"):
        processes_lib._cluster(TrainConfig(backend="jax"))
    with pytest.raises(ChuteError, match="`process_timeout` must be a positive number"):
        TrainConfig(process_timeout=0)
    assert TrainConfig().process_timeout == rendezvous.PROCESS_TIMEOUT == 300.0
