"""The lock of an output folder and the scratch folders named after it (unit level; the
conversions that meet them are in test_resume.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from chute.errors import ChuteError
from chute.ingest import lock


def test_one_output_spelled_two_ways_has_one_scratch_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert lock.scratch_prefix("out") == lock.scratch_prefix(str(tmp_path / "out") + "/")
    assert lock.scratch_prefix("out") != lock.scratch_prefix("other")
    assert lock.scratch_prefix("out").endswith(f"-{os.getpid()}-")


def test_stale_scratch_of_a_dead_process_goes_and_the_rest_stays(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    tag = lock.scratch_prefix("out").rsplit("-", 2)[0]
    dead = tmp_path / f"{tag}-{int(gone.stdout)}-x"
    mine = tmp_path / f"{tag}-{os.getpid()}-x"  # this process's own: in use
    other = tmp_path / f"{lock.scratch_prefix('other').rsplit('-', 2)[0]}-{int(gone.stdout)}-x"
    for folder in (dead, mine, other):
        folder.mkdir()
    lock.remove_stale_scratch("out")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, other.name])


def test_a_lock_held_elsewhere_is_never_taken_over(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holder = {"pid": 1, "host": socket.gethostname() + "-elsewhere", "since": "earlier"}
    (out / lock.LOCK_NAME).write_text(json.dumps(holder))
    busy = pytest.raises(ChuteError, match="Another chute convert is writing into `output`")
    with busy, lock.locked(str(out)):
        pass
    assert json.loads((out / lock.LOCK_NAME).read_text()) == holder  # left as it was


def test_the_lock_goes_with_its_holder_and_so_does_a_folder_it_made(tmp_path):
    out = tmp_path / "new"
    with lock.locked(str(out)):
        assert (out / lock.LOCK_NAME).is_file()
    assert not out.exists()  # made for the lock, left empty: removed
