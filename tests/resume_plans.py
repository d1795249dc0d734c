"""The kill-and-resume plans shared by the resume tests of each backend
(tests/read/test_grain_engine.py on TensorFlow, tests/fit/test_resume_jax.py on JAX), the
data they train on, and the child (tests/resume_child.py) that runs them.

The two backends' tests live in two modules so that pytest-xdist (``--dist loadfile``) runs
them on two workers at once: each is minutes of training on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers import jax_child_env, once_per_run, write_image

import chute

TESTS = Path(__file__).resolve().parent

# Kills at different steps (11 per epoch, backed up every 3). "thrice" dies at step 5, again
# 4 steps into the epoch it resumed, then 9 steps later inside the next epoch (the backup
# there must say epoch 1, not 0). "in the write" dies mid-epoch, then in the middle of
# writing the weights, then in the middle of writing the backup's record, then finds its
# newest backup damaged on disk and resumes from the one before. "twice" (tf.data engine,
# and JAX) dies in epoch 1 and again inside it: the tf.data engine reads an interrupted
# epoch again from its first batch but must resume the epoch of the last kill.
# Each attempt is a training of its own (seconds of tracing): a plan covers several paths.
TWICE = [{"batches": 14}, {"batches": 5}]
PLANS = {
    "thrice": [{"batches": 5}, {"batches": 4}, {"batches": 9}],
    "in the write": [{"batches": 8}, {"in_weights": 2}, {"in_state": 1}, {"corrupt": True}],
}
BEGAN = {  # the epochs each attempt began: after a kill, the epoch it interrupted
    "twice": [[0, 1], [1], [1, 2]],
    "thrice": [[0], [0], [0, 1], [1, 2]],
    # 15 steps an epoch (6 of the first dataset's 90 images a batch of 8)
    "mixed twice": [[0], [0, 1], [1, 2]],
}


def _jpeg_shards(root: Path, classes: dict[str, tuple[int, int]], seed: int, shards: int) -> Path:
    """``classes`` (name -> (images, the channel that is bright)) of random RGB 24x32
    images, converted to JPEG shards stored at their aspect ratio (val 0.25)."""
    rng = np.random.default_rng(seed)
    for name, (count, channel) in classes.items():
        for index in range(count):
            pixels = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
            pixels[:, :, channel] = 200
            write_image(root / "src" / name / f"{index:03d}.png", pixels)
    chute.convert(
        root / "src", root / "shards", image_size=(24, 32), resize="crop", encoding="jpeg",
        val_fraction=0.25, min_shards=shards, workers=1,
    )  # fmt: skip
    return root / "shards"


def resume_shards(tmp_path_factory) -> Path:
    """3 classes x 40 RGB 24x32 photos-like images as JPEG shards (train 90 in 12
    shards, val 30), stored at their aspect ratio (evaluation centre-crops them)."""

    def build(root: Path) -> None:
        _jpeg_shards(root, {"a": (40, 0), "b": (40, 1), "c": (40, 2)}, 0, 12)

    return once_per_run(tmp_path_factory, "grain-shards", build) / "shards"


def mix_shards(tmp_path_factory) -> Path:
    """A second dataset to mix into :func:`resume_shards`' (``chute train --mix``): classes
    ``c`` (its 30 images) and a new one, ``d`` (18), RGB 24x32 JPEG shards, train 36."""

    def build(root: Path) -> None:
        _jpeg_shards(root, {"c": (30, 2), "d": (18, 1)}, 1, 4)

    return once_per_run(tmp_path_factory, "mix-shards", build) / "shards"


def run_resume_child(shards: Path, root: Path, backend: str, plans: dict) -> dict:
    """tests/resume_child.py on ``backend``: uninterrupted runs, then each plan's kills."""
    env = {**os.environ, "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": ""}
    env.update(jax_child_env(root / "jax-cache"))  # the runs compile the same programs
    args = [sys.executable, str(TESTS / "resume_child.py"), str(shards), str(root)]
    args.append(json.dumps(plans))
    done = subprocess.run(args, timeout=700, capture_output=True, env=env, text=True, cwd=TESTS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ran out of data" not in done.stderr  # Keras knows the validation steps
    return json.loads(done.stdout.split("RESULT ")[-1]) | {"stderr": done.stderr}


def check_resumed(shards: Path, root: Path, backend: str, plans: dict) -> None:
    """Runs ``plans`` and checks each ended as an uninterrupted run did: the same weights
    bit for bit (Grain engine), each epoch in its history once, the backup gone at the end,
    the epochs each attempt began; a damaged backup was named and set aside."""
    results = run_resume_child(shards, root, backend, plans)
    for name, plan in plans.items():
        result = results[name]
        assert result["killed"] == [*("corrupt" not in how for how in plan["attempts"]), False]
        assert result["same"] or plan["engine"] == "tf", f"{name}: not the whole run's weights"
        assert all(len(values) == 3 for values in result["history"].values()), name
        assert result["csv_rows"] == 1 + 3, name
        assert "state.json" in result["left"][0], name
        assert result["left"][-1] == [], name  # the backup goes once the run is over
        assert result["began"] == BEGAN.get(name.removeprefix("tf "), result["began"]), name
    assert "cannot be read" in results["stderr"] and ".unreadable" in results["stderr"]
