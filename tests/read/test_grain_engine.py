"""chute.load(engine="grain"): global shuffle, positions that save and restore, the same
evaluation pixels as the tf.data engine, class-balanced draws, and exact mid-epoch resume."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from resume_plans import PLANS, TWICE, check_resumed, mix_shards, resume_shards

import chute
from chute import ChuteError

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """3 classes x 40 RGB 24x32 photos-like JPEG shards (train 90 in 12 shards, val 30)."""
    return resume_shards(tmp_path_factory)


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


def test_a_stream_reads_from_its_position_however_often_it_is_iterated(shards):
    """A resumed run's input (chute.fit.position): Keras iterates a dataset a few times
    before it trains, so each iter() of a stream starts at its position, batch j of epoch
    e being the plain dataset's; the plain dataset still moves on an epoch per iter()."""
    from chute.read.stream import StreamPosition

    train = chute.load(shards, engine="grain", batch_size=8, seed=3, workers=0)
    epochs = [list(iter(train)) for _ in range(2)]
    stream = train.stream(StreamPosition(epoch=1, batch=4))
    for _ in range(2):
        np.testing.assert_array_equal(next(iter(stream))[0], epochs[1][4][0])
    assert len(list(iter(stream))) == 11 - 4  # not repeated: to the epoch's end
    assert stream.chute is train.chute and train.epoch == 2


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


@pytest.mark.slow
@pytest.mark.timeout(800)
def test_a_run_killed_any_number_of_times_resumes_on_the_next_batch(
    shards, tmp_path, tmp_path_factory
):
    """Killed three times at different steps (mid-epoch, inside resumed epochs), inside
    each backup write and with its newest backup damaged: each run ends with an
    uninterrupted run's weights, bit for bit (the same batches, learning rate, optimizer
    step and dropout draws), with each epoch in its history once; so does a mixture of
    two datasets killed twice; the tf.data engine, killed twice, resumes the epoch of its
    last kill (JAX: tests/fit/test_resume_jax.py)."""
    plans = {name: {"engine": "grain", "attempts": attempts} for name, attempts in PLANS.items()}
    plans["tf twice"] = {"engine": "tf", "attempts": TWICE}
    # a mixture of two datasets (chute train --mix), killed twice: its batches resume too
    mixed = f"{mix_shards(tmp_path_factory)}=0.25"
    plans["mixed twice"] = {"engine": "grain", "attempts": TWICE, "mix": mixed}
    check_resumed(shards, tmp_path, "tensorflow", plans)


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


def test_training_validates_with_threads_on_the_grain_engine(shards):
    """Keras iterates validation anew each epoch: worker processes would start each time."""
    from chute import LoadOptions, TrainConfig
    from chute.fit import reading
    from chute.fit import train as training
    from chute.fit.devices import Devices

    manifest = chute.load_manifest(str(shards))
    for workers, expected in ((None, 0), (2, 2)):
        config = TrainConfig(batch_size=32, load=LoadOptions(engine="grain", workers=workers))
        _, asked = reading.reading(config, Devices("cpu"), manifest)
        assert asked.workers == expected and asked.training is False
        # Keras is told the steps (else it reads to the end, and warns it ran out of data)
        inputs = training._inputs(manifest, config, Devices("cpu"))
        assert inputs.val_steps == len(inputs.val) == -(-30 // 32) and asked.repeat is True


# Loaded by every process of a child (its spawned workers too, through PYTHONPATH): the
# names of the shared-memory blocks each makes or opens, one a line.
LOG_SHARED_MEMORY = """
import os
from multiprocessing import shared_memory

_init = shared_memory.SharedMemory.__init__


def _logged(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    with open(os.environ["CHUTE_TEST_SHM_LOG"], "a") as log:
        log.write(self.name.lstrip("/") + "\\n")


shared_memory.SharedMemory.__init__ = _logged
"""


def _run_logging_shared_memory(args: list[str], tmp_path: Path):
    """``python ARGS`` with every process's shared-memory blocks logged: (the finished
    process, the blocks it made or opened that are still there now that it has exited)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(LOG_SHARED_MEMORY)
    log = tmp_path / "shm.log"
    log.unlink(missing_ok=True)
    path = os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "CHUTE_TEST_SHM_LOG": str(log)}
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path, env=env)  # fmt: skip
    # Looked at as soon as the process (and its resource tracker: stderr's other end) is
    # gone: what it left is there now, whatever the load, and nobody else's counts.
    names = set(log.read_text().split()) if log.exists() else set()
    return done, {name for name in names if os.path.exists(f"/dev/shm/{name}")}, names


READ_WITH_THE_DEFAULTS = """
import chute
train = chute.load({shards!r}, engine="grain", batch_size=8, seed=1{options})
for images, labels in train:  # a top-level loop leaves its last batch in globals
    pass
iterator = iter(train)  # and an iterator open at exit
batch = next(iterator)
print("WORKERS", train.workers)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="shared memory seen in /dev/shm")
def test_a_plain_script_and_python_c_read_with_the_defaults_and_exit_quietly(shards, tmp_path):
    """No ``if __name__ == "__main__":`` (every Keras tutorial): worker processes, which
    spawn runs the script again in, would die bootstrapping; with ``python -c`` they
    start (also with a shard-block shuffle). Either way: rc 0, no tracebacks at exit, and
    none of the shared memory it used left behind the moment it has exited."""
    script = tmp_path / "tutorial.py"
    script.write_text(READ_WITH_THE_DEFAULTS.format(shards=str(shards), options=""))
    blocks = READ_WITH_THE_DEFAULTS.format(shards=str(shards), options=", shard_window=3")
    runs = [([str(script)], False), (["-c", blocks], True)]
    for args, processes in runs:
        done, left, used = _run_logging_shared_memory(args, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        for noise in ("Traceback", "Exception ignored", "leaked", "bootstrapping"):
            assert noise not in done.stderr, done.stderr[-3000:]
        workers = int(done.stdout.split("WORKERS")[-1])
        assert (workers > 0) == processes, done.stdout
        assert bool(used) == processes  # the workers' batches came through shared memory
        assert not left, f"{len(left)} of {len(used)} blocks left in /dev/shm"


def test_worker_processes_asked_for_from_an_unguarded_script_are_refused_by_name(shards, tmp_path):
    """``workers=2`` at a script's unguarded top level: each spawned worker would run the
    script again and die bootstrapping. One ChuteError names the argument, the line and the
    ways out, before any process starts; under the guard the same call is taken."""
    import runpy

    call = f"chute.load({str(shards)!r}, engine='grain', batch_size=8, workers=2)"
    script = tmp_path / "tutorial.py"
    script.write_text(f"import chute\n\ntrain = {call}\n")
    with pytest.raises(ChuteError) as refused:
        runpy.run_path(str(script), run_name="__main__")  # as `python tutorial.py` runs it
    message = str(refused.value)
    assert "`workers`: got 2" in message and "tutorial.py (line 3)" in message
    assert 'if __name__ == "__main__":' in message and "workers=0" in message
    script.write_text(f"import chute\n\nif __name__ == '__main__':\n    train = {call}\n")
    assert runpy.run_path(str(script), run_name="__main__")["train"].workers == 2


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


ITERATE_FOREVER = """
import sys, chute
train = chute.load(sys.argv[1], engine="grain", batch_size=8, seed=1, workers=2, repeat=True)
iterator = iter(train)
next(iterator)
print("READY", flush=True)
for _ in iterator:
    pass
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds processes through /proc")
def test_worker_processes_end_when_their_parent_is_killed(shards):
    """``kill -9`` runs no cleanup: the workers must see for themselves that their
    parent is gone (else they live on, re-parented, holding the terminal's stdout)."""
    import signal

    args = [sys.executable, "-c", ITERATE_FOREVER, str(shards)]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout.readline().strip() == "READY"
        workers = _children(child.pid)  # 2 workers and multiprocessing's resource tracker
        assert len(workers) >= 2
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 10
    while any(map(_running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if _running(pid)]
    for pid in left:  # not to leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not left


def test_input_pipelines_without_a_seed_share_one_order(shards):
    """Each pipeline reads its share of one global order: none drawn apart, and the same
    in every process (each host derives it alike)."""
    import types

    def pipelines():  # what the Grain engine reads of a tf.distribute.InputContext
        contexts = [
            types.SimpleNamespace(num_input_pipelines=2, input_pipeline_id=index)
            for index in (0, 1)
        ]
        return [chute.load(shards, engine="grain", batch_size=8, workers=0, input_context=c)
                for c in contexts]  # fmt: skip

    first = pipelines()
    images = [image.tobytes() for train in first for batch in train for image in batch[0]]
    assert len(images) == 2 * 5 * 8  # 90 records: 5 batches of 8 for each of 2 pipelines
    assert len(set(images)) == len(images)  # the shares are disjoint (the images differ)
    again = pipelines()
    assert [t.batches.seed for t in again] == [t.batches.seed for t in first]
    alone = [chute.load(shards, engine="grain", batch_size=8, workers=0) for _ in range(2)]
    assert alone[0].batches.seed != alone[1].batches.seed  # one pipeline: drawn each time


def test_an_empty_evaluation_share_pads_with_weight_0(shards):
    """A JAX process whose share of a small val split is empty (fewer examples than
    processes) runs the others' steps in weight-0 batches; only an empty split is refused."""
    import types

    last = types.SimpleNamespace(num_input_pipelines=32, input_pipeline_id=31)  # 30 in val
    val = chute.load(shards, "val", engine="grain", batch_size=8, workers=0,
                     pad_final_batch=True, input_context=last)  # fmt: skip
    batches = list(val)
    assert len(batches) == val.chute.steps == 1 and val.chute.num_examples == 0
    images, labels, weights = batches[0]
    assert len(images) == len(labels) == 8 and not weights.any() and not images.any()


def test_the_grain_engine_logs_its_class_sampling(imbalanced, caplog):
    with caplog.at_level("INFO", logger="chute"):
        chute.load(imbalanced, engine="grain", batch_size=30, seed=0, workers=0,
                   sampling="balanced")  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sampling=")]
    assert lines == ["sampling='balanced': 2 of 2 classes drawn, p = 0.5 each; 510 draws an "
                     "epoch: '0' (10 examples) ~25.5 times each, '1' (500) ~0.51"]  # fmt: skip


@pytest.mark.parametrize("training", [True, False])
def test_raw_records_read_in_place_give_the_general_parses_batches(
    shared_dataset, monkeypatch, training
):
    """The Grain engine's path for raw images of the size read (no Example parse per
    record) yields exactly what parsing each record does, flips drawn alike."""
    from chute.read.grain import dataset as grain_dataset

    def batches(fast: bool) -> list:
        if not fast:
            monkeypatch.setattr(grain_dataset.Batches, "_fast", lambda *args: False)
        augment = ["flip"] if training else ()
        ds = chute.load(shared_dataset, "train", engine="grain", batch_size=4, seed=3,
                        workers=0, training=training, augment=augment)  # fmt: skip
        got = [tuple(np.asarray(t) for t in batch) for _, batch in zip(range(4), ds, strict=False)]
        monkeypatch.undo()
        return got

    used = []
    real = grain_dataset.Batches._fast
    monkeypatch.setattr(
        grain_dataset.Batches, "_fast", lambda *a: used.append(real(*a)) or used[-1]
    )
    fast = batches(True)
    assert used and all(used)  # every record took the in-place path
    for (images, labels), (want_images, want_labels) in zip(fast, batches(False), strict=True):
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)


READ_UNDER_A_LOW_LIMIT = """
import os, resource, sys
import chute

if __name__ == "__main__":
    limit = int(sys.argv[2])  # as `ulimit -n` sets it: soft and hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    for workers in (0, 2):
        train = chute.load(sys.argv[1], engine="grain", batch_size=8, seed=0, workers=workers)
        for epoch in range(2):
            seen = sum(len(labels) for _, labels in train)
        print("READ", workers, seen, len(os.listdir("/proc/self/fd")), flush=True)
        # Its reader lives on across epochs, its open shards with it, until closed (at
        # 64 descriptors those 8 left the next one's shared-memory batches too few).
        train.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_more_shards_than_the_descriptor_limit_are_read_in_and_out_of_workers(
    many_shards, tmp_path
):
    """96 shards at ``ulimit -n 64`` (ImageNet's 1,024 at 1,024 alike): every process,
    this one and each worker, keeps its open shards under its own limit."""
    script = tmp_path / "low_limit.py"
    script.write_text(READ_UNDER_A_LOW_LIMIT)
    done = subprocess.run([sys.executable, str(script), str(many_shards), "64"],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Too many open files" not in done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.startswith("READ")]
    assert [(workers, seen) for _, workers, seen, _ in lines] == [("0", "192"), ("2", "192")]
    assert all(int(fds) < 64 for *_, fds in lines)


def test_epochs_read_on_from_one_iterator_and_a_part_read_epoch_is_read_again(shards):
    """Keras reads two batches to learn the shapes, then an epoch per iter(): the epoch
    left part-way is read again whole, from the same iterator (no new workers), and each
    epoch read to its end moves the next iter() on."""
    import itertools

    train = chute.load(shards, engine="grain", batch_size=8, seed=3, workers=0)
    fresh = chute.load(shards, engine="grain", batch_size=8, seed=3, workers=0)
    expected = [list(iter(fresh)) for _ in range(2)]
    peeked = list(itertools.islice(iter(train), 2))
    reader = train._reader.iterator
    epochs = [list(iter(train)) for _ in range(2)]
    assert train._reader.iterator is reader and train.epoch == 2
    for got, want in zip([peeked, *epochs], [expected[0][:2], *expected], strict=True):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a[0], b[0])
    val = chute.load(shards, "val", engine="grain", batch_size=8, workers=0)
    passes = [np.concatenate([b[1] for b in val]) for _ in range(3)]
    assert val._reader.iterator is not None and val.epoch == 3
    for labels in passes[1:]:
        np.testing.assert_array_equal(labels, passes[0])
    train.close()
    assert train._reader is None


FIT_WITH_WORKERS = """
import os, sys, warnings
import chute, keras

class Workers(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        children = sorted(int(p) for p in os.popen(f"pgrep -P {os.getpid()}").read().split())
        print("EPOCH", epoch, *children, flush=True)

if __name__ == "__main__":
    warnings.simplefilter("always")
    train = chute.load(sys.argv[1], engine="grain", batch_size=16, seed=0, workers=2)
    val = chute.load(sys.argv[1], "val", engine="grain", batch_size=16, workers=2)
    model = keras.Sequential([keras.Input((24, 32, 3)), keras.layers.Rescaling(1 / 255),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(train, validation_data=val, epochs=3, verbose=0, callbacks=[Workers()])
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("pgrep") is None, reason="lists worker processes with pgrep")
def test_a_users_fit_keeps_its_workers_across_epochs_and_validation(shards, tmp_path):
    """A user's own ``model.fit(train, validation_data=val, epochs=3)``: the worker
    processes of both datasets start once (each start costs seconds on a loaded machine),
    and Keras's "ran out of data" warning about whole epochs is not shown."""
    script = tmp_path / "fit.py"
    script.write_text(FIT_WITH_WORKERS)
    done = subprocess.run([sys.executable, str(script), str(shards)], capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ran out of data" not in done.stderr, done.stderr[-3000:]
    epochs = [line.split()[2:] for line in done.stdout.splitlines() if line.startswith("EPOCH")]
    assert len(epochs) == 3
    # 4 workers (2 each) and the resource tracker, the same processes at every epoch's end
    # (pgrep itself is a child too: a new one each time)
    kept = set(epochs[0]) & set(epochs[1]) & set(epochs[2])
    assert len(kept) >= 4, epochs


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="shared memory seen in /dev/shm")
def test_a_batch_handed_out_unlinks_its_shared_memory_at_once():
    """Grain unlinks a delivered block when its array is deleted, in a background thread
    that a short script's exit may never let run (the blocks stay in /dev/shm, "leaked"):
    chute copies the batch out and unlinks the block's name there and then."""
    from grain.python import SharedMemoryArray

    from chute.read.grain.workers import _plain

    pixels = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    made = SharedMemoryArray(pixels.shape, pixels.dtype)  # as a worker makes a batch
    made[...] = pixels
    received = SharedMemoryArray.from_metadata(made.metadata)  # as the reader opens it
    received.unlink_on_del()  # the reader's end is the one to unlink (Grain marks it so)
    name = received.shm.name.lstrip("/")
    try:
        copy = _plain(received)
        assert type(copy) is np.ndarray and np.array_equal(copy, pixels)
        assert not os.path.exists(f"/dev/shm/{name}")  # before the array is deleted
        del received, made  # and Grain's own deletion then finds nothing to unlink
    finally:
        from multiprocessing import shared_memory

        with contextlib.suppress(FileNotFoundError):  # the test failed: not left behind
            shared_memory.SharedMemory(name).unlink()
