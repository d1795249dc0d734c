"""A child process of the resume tests: runs a training to its end without a kill, then
again through a series of simulated kills, and prints what it found as one JSON line.

Usage: ``python resume_child.py DATA ROOT PLANS`` (``KERAS_BACKEND`` chooses the backend).
``PLANS`` is JSON: ``{name: {"engine": "grain" | "tf", "attempts": [attempt, ...]}}`` (and
``"mix": "PATH=WEIGHT"``: another dataset mixed in, ``chute train --mix``), an attempt one of

- ``{"batches": n}``: the run dies after its n-th batch (after that batch's backup, if any);
- ``{"in_weights": k}``: it dies inside its k-th weights write, the file half written
  (what a ``kill -9`` during Keras's ``save_weights`` leaves);
- ``{"in_state": k}``: it dies inside its k-th atomic write of a backup's record, the
  temporary file half written;
- ``{"corrupt": true}``: no run: the newest backup's weights file is damaged on disk.

After its attempts each plan's run is finished unharmed. For each plan the child prints
whether its weights equal an uninterrupted run's on the same engine bit for bit (made
first, for the Grain engine: false for a tf.data plan), its history, the epochs each
attempt began with, and what the backup folder held after each attempt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import keras
import numpy as np
from helpers import Killed

import chute
from chute.fit import train as training
from chute.format import storage

data, root = Path(sys.argv[1]), Path(sys.argv[2])
plans = json.loads(sys.argv[3])
OPTIONS = dict(
    model="kannada-cnn", epochs=3, batch_size=8, strategy="cpu", verbose=0, seed=1,
    image_size=16, augment="crop,flip", schedule="cosine", backup_every=3,
)  # fmt: skip
REAL_TIMER, REAL_SAVE_WEIGHTS, REAL_WRITE = (
    training._epoch_timer,
    keras.Model.save_weights,
    storage.write_atomic,
)
began: list[int] = []  # the epochs each attempt began, in order


def timer(die_after: int | None):
    """The epoch timer, counting batches; it raises Killed after ``die_after`` of them
    (it runs after the position callback, so that batch's backup is written)."""
    real, seen = REAL_TIMER(), [0]
    original_begin = real.on_epoch_begin

    def on_epoch_begin(epoch, logs=None):
        began.append(epoch)
        original_begin(epoch, logs)

    def on_train_batch_end(batch, logs=None):
        seen[0] += 1
        if seen[0] == die_after:
            raise Killed

    real.on_epoch_begin, real.on_train_batch_end = on_epoch_begin, on_train_batch_end
    return real


def dying_weights(k: int):
    calls = [0]

    def save_weights(self, filepath, *args, **kwargs):
        calls[0] += 1
        REAL_SAVE_WEIGHTS(self, filepath, *args, **kwargs)
        if calls[0] == k:
            whole = Path(filepath).read_bytes()
            Path(filepath).write_bytes(whole[: len(whole) // 2])
            raise Killed

    return save_weights


def dying_state(k: int):
    calls = [0]

    def write_atomic(path, body):
        if "backup" in str(path) and str(path).endswith(".json"):
            calls[0] += 1
            if calls[0] == k:
                Path(str(path) + ".tmp").write_bytes(body[: len(body) // 2])
                raise Killed
        REAL_WRITE(path, body)

    return write_atomic


def attempt(run: Path, engine: str, how: dict, mix: str | None = None) -> bool:
    """One run of the plan; True if it was killed."""
    if how.get("corrupt"):
        state = json.loads((run / "backup" / "state.json").read_text())
        newest = run / "backup" / state["current"]["weights"]
        newest.write_bytes(b"\0" * 64 + newest.read_bytes()[64:])
        return False
    training._epoch_timer = lambda: timer(how.get("batches"))
    if "in_weights" in how:
        keras.Model.save_weights = dying_weights(how["in_weights"])
    if "in_state" in how:
        storage.write_atomic = dying_state(how["in_state"])
    keras.backend.clear_session()  # each run builds its model afresh, as a new process would
    try:
        chute.train(data, run, **OPTIONS, mix=mix, load={"engine": engine, "workers": 0})
        return False
    except Killed:
        return True
    finally:
        training._epoch_timer, keras.Model.save_weights = REAL_TIMER, REAL_SAVE_WEIGHTS
        storage.write_atomic = REAL_WRITE


def weights(run: Path) -> list[np.ndarray]:
    return keras.models.load_model(run / "checkpoints" / "last.keras").get_weights()


# The uninterrupted runs the kills are compared with: the Grain engine's only. The tf.data
# engine reads an interrupted epoch again from its first batch, so its weights differ from
# an uninterrupted run's by design (its plans check epochs and history, not weights).
whole = {}
for engine, mix in sorted(
    {
        (plan["engine"], plan.get("mix") or "")
        for plan in plans.values()
        if plan["engine"] == "grain"
    }
):
    attempt(root / f"whole-{engine}-{len(whole)}", engine, {}, mix or None)
    whole[engine, mix] = weights(root / f"whole-{engine}-{len(whole)}")
results = {}
for name, plan in plans.items():
    run, began[:] = root / name, []
    killed, left, starts = [], [], []
    for how in [*plan["attempts"], {}]:
        starts.append(len(began))
        killed.append(attempt(run, plan["engine"], how, plan.get("mix")))
        backup = run / "backup"
        left.append(sorted(p.name for p in backup.iterdir()) if backup.is_dir() else [])
    ends = [*starts[1:], len(began)]
    results[name] = {
        "killed": killed,
        "left": left,
        "same": (key := (plan["engine"], plan.get("mix") or "")) in whole
        and all(np.array_equal(a, b) for a, b in zip(whole[key], weights(run), strict=True)),
        "began": [began[a:b] for a, b in zip(starts, ends, strict=True)],
        "history": json.loads((run / "history.json").read_text()),
        "csv_rows": len((run / "history.csv").read_text().strip().splitlines()),
    }
print("RESULT " + json.dumps(results))
