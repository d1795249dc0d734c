"""Worker processes: order, errors, a dying worker, and scripts without a __main__ guard."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_folder, tree_bytes

from chute import ChuteError
from chute.ingest import workers


@pytest.fixture(scope="module")
def pool():
    with workers.WorkerPool(2) as started:
        yield started


def test_results_come_back_in_task_order(tmp_path, pool):
    src = make_folder(tmp_path / "src", {"a": 7}, size=(3, 4 + 0))
    paths = sorted(str(p) for p in src.rglob("*.png"))
    tasks = [([p], 10**6) for p in paths] * 3
    probes = list(pool.ordered("probe_chunk", tasks, window=3))
    inline = list(workers.InlinePool().ordered("probe_chunk", tasks))
    assert probes == inline and len(probes) == 21


def test_work_goes_to_the_worker_with_the_least_pending(monkeypatch):
    """Shards of 65 images used to be cut into 64 + 1 and dealt round-robin: one worker got
    every 64-image chunk, the other the 1-image remainders, and sat idle."""
    tests = str(Path(__file__).resolve().parents[1])  # where crashy_tasks.py is
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    tasks = [(["x"] * 64,), (["x"],)] * 8
    with workers.WorkerPool(2, module="crashy_tasks") as pool:
        pids = list(pool.ordered("whoami", tasks))
    items = collections.Counter()
    for task, pid in zip(tasks, pids, strict=True):
        items[pid] += len(task[0])
    assert len(items) == 2
    assert min(items.values()) >= 0.4 * sum(items.values()), items


def test_a_task_costs_its_items():
    assert workers.task_cost(([1, 2, 3], "spec")) == 3
    assert workers.task_cost(([], "spec")) == 1  # still a message to answer
    assert workers.task_cost(("ls",)) == 1


def test_an_error_in_a_worker_is_raised_with_its_traceback():
    with workers.WorkerPool(2) as pool:
        with pytest.raises(RuntimeError, match=r"(?s)worker process failed.*TypeError"):
            list(pool.ordered("probe_chunk", [(None, 1)]))
        with pytest.raises(RuntimeError, match="pool is broken"):  # never a misaligned result
            list(pool.ordered("probe_chunk", [([], 1)]))
    with (
        workers.WorkerPool(2) as pool,
        pytest.raises(RuntimeError, match="unknown worker function 'system'"),
    ):
        list(pool.ordered("system", [("ls",)]))


def test_a_dying_worker_is_a_clear_error():
    with workers.WorkerPool(2) as pool:
        pool._procs[1].kill()
        with pytest.raises(ChuteError, match="a worker process died"):
            list(pool.ordered("probe_chunk", [([], 1)] * 4))


def test_check_workers():
    assert workers.check_workers(None) >= 1
    assert workers.check_workers(3) == 3
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ChuteError, match="`workers` must be an integer from 1 to 1024"):
            workers.check_workers(bad)


@pytest.mark.slow
def test_script_without_main_guard_that_imports_tensorflow(tmp_path):
    """Workers never re-run the caller's script (unlike multiprocessing's spawn)."""
    src = make_folder(tmp_path / "src", {"a": 60, "b": 60}, size=(5, 5))
    script = tmp_path / "convert_it.py"
    script.write_text(
        "import tensorflow  # noqa: F401  (a typical Keras script's first line)\n"
        "import chute\n"
        f"chute.convert({str(src)!r}, {str(tmp_path / 'out')!r}, workers=2)\n"
        "print('converted')\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("converted") == 1  # the script body ran once, not once per worker
    assert (tmp_path / "out" / "manifest.json").exists()
    assert tree_bytes(tmp_path / "out")
