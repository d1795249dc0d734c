"""A child process of tests/fit/test_elastic_resume.py: one attempt of a JAX training with
the Grain engine on as many CPU devices as ``XLA_FLAGS`` gives it, killed after a number of
batches or run to its end; prints what it found as one JSON line.

Usage: ``python elastic_child.py DATA RUN DIE_AFTER`` (``DIE_AFTER`` 0: no kill).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import keras
from helpers import Killed

import chute
from chute.fit import train as training

data, run, die_after = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
REAL_TIMER = training._epoch_timer
batches = [0]


def timer():
    """The epoch timer, counting batches; it raises Killed after ``die_after`` of them
    (it runs after the backup callback, so that batch's backup is written)."""
    real = REAL_TIMER()

    def on_train_batch_end(batch, logs=None):
        batches[0] += 1
        if batches[0] == die_after:
            raise Killed

    real.on_train_batch_end = on_train_batch_end
    return real


training._epoch_timer = timer
logging.basicConfig(level=logging.INFO)  # the resume's lines, for the test to read
killed = False
try:
    chute.train(
        data, run, model="kannada-cnn", epochs=2, batch_size=8, strategy="cpu", verbose=0,
        seed=1, image_size=16, backup_every=1, steps_per_execution=1,
        load={"engine": "grain", "workers": 0},
    )  # fmt: skip
except Killed:
    killed = True
    steps = json.loads((run / "backup" / "state.json").read_text())["current"]["step"]
result = {
    "killed": killed,
    "batches": batches[0],
    "devices": len(keras.distribution.list_devices()),
}
if killed:
    result["steps"] = steps  # the optimizer steps of the last backup
else:
    model = keras.models.load_model(run / "checkpoints" / "last.keras")
    result["iterations"] = int(model.optimizer.iterations.numpy())
    result["history"] = json.loads((run / "history.json").read_text())
print("RESULT " + json.dumps(result))
