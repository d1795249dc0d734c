"""Elastic resume (the Grain engine, JAX): a run backed up on 2 devices goes on on 1,
killed again there goes on on 2, each time at the example where it stopped, with each
epoch's examples trained once (the order is global: tests/read/test_grain_order.py checks
the examples themselves; here the whole path, from backup to log to optimizer steps)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import jax_child_env
from resume_plans import resume_shards

TESTS = Path(__file__).resolve().parents[1]


def _attempt(shards: Path, run: Path, devices: int, die_after: int, cache: Path) -> dict:
    env = {**os.environ, "KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": ""}
    env.update(jax_child_env(cache, devices=devices))
    args = [sys.executable, str(TESTS / "elastic_child.py"), str(shards), str(run), str(die_after)]
    done = subprocess.run(args, timeout=300, capture_output=True, env=env, text=True, cwd=TESTS)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ")[-1]) | {"log": done.stderr}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_resumes_on_another_device_count_at_the_example_it_stopped(
    tmp_path_factory, tmp_path
):
    """90 examples; 2 devices x 8 = 16 a step (5 steps an epoch), 1 device: 8 (11 steps).
    Killed after 3 steps on 2 devices (48 examples); on 1 device it goes on at example 49
    (6 of its batches done: 5 left), then 2 steps into epoch 2 (16 examples) it is killed
    again; back on 2 devices, 1 of 5 batches is done: 4 left. 3 + 5 + 2 + 4 steps in all,
    the optimizer's step count set at each change to the new run's units (so the schedule
    goes on at the same fraction of the run): 2 epochs of 5 steps at the end."""
    shards, run, cache = resume_shards(tmp_path_factory), tmp_path / "run", tmp_path / "xla"
    first = _attempt(shards, run, 2, 3, cache)
    assert first["killed"] and first["devices"] == 2
    state = json.loads((run / "backup" / "state.json").read_text())["current"]
    assert (state["samples"], state["global_batch"], state["layout"]) == (48, 16, [1, 2])

    second = _attempt(shards, run, 1, 7, cache)
    assert second["killed"] and second["devices"] == 1
    assert "backed up with a global batch of 16, now 8" in second["log"]
    assert "resuming epoch 1 at example 49 of 88" in second["log"]
    assert "backed up on 1 process(es) x 2 replica(s) on 1 x 1" in second["log"]
    assert second["steps"] == 6 + 5 + 2  # set to 6 of 11 on restore, then 7 more
    state = json.loads((run / "backup" / "state.json").read_text())["current"]
    assert (state["epoch"], state["samples"], state["global_batch"]) == (1, 16, 8)

    third = _attempt(shards, run, 2, 0, cache)
    assert not third["killed"] and third["devices"] == 2
    assert "resuming epoch 2 at example 17 of 80" in third["log"]
    assert third["iterations"] == 2 * 5
    assert all(len(values) == 2 for values in third["history"].values())
    assert not (run / "backup").exists()
