"""Kill-and-resume on JAX: the plans of tests/resume_plans.py that differ in what the
backend saves and loads (optimizer and random-layer state, weights files); the rest is
backend-free logic, run on TensorFlow by tests/read/test_grain_engine.py."""

from __future__ import annotations

import pytest
from resume_plans import PLANS, TWICE, check_resumed, resume_shards


@pytest.mark.slow
@pytest.mark.timeout(800)
def test_a_jax_run_killed_any_number_of_times_resumes_on_the_next_batch(tmp_path_factory, tmp_path):
    """Killed twice (the second time inside the epoch it resumed), inside each backup
    write and with its newest backup damaged: each run ends with an uninterrupted run's
    weights, bit for bit, and each epoch in its history once."""
    plans = {
        "twice": {"engine": "grain", "attempts": TWICE},
        "in the write": {"engine": "grain", "attempts": PLANS["in the write"]},
    }
    check_resumed(resume_shards(tmp_path_factory), tmp_path, "jax", plans)
