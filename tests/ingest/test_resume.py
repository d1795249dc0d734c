"""Resuming an interrupted conversion: kept shards, redone shards, byte-identical result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import make_folder, tree_bytes

import chute
from chute.errors import ChuteError
from chute.format import manifest as manifest_lib
from chute.ingest import lock as lock_lib
from chute.ingest import resume
from chute.ingest.writer import ShardWriter

OPTIONS = {"val_fraction": 0.25, "min_shards": 4}  # 40 images: train 30 + val 10, 4 + 4 shards
OLD_NS = 1_000_000_000


class Crash(BaseException):
    """Stands in for a kill: not an Exception, so nothing may catch and carry on."""


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "src", {"a": 14, "b": 14, "c": 12})


@pytest.fixture
def reference(src: Path, tmp_path: Path) -> dict[str, bytes]:
    """The bytes of an uninterrupted run with OPTIONS."""
    chute.convert(src, tmp_path / "reference", workers=1, **OPTIONS)
    return tree_bytes(tmp_path / "reference")


def _crash_on_write(monkeypatch, call: int, *, before: bool = False) -> None:
    """ShardWriter.write raises Crash on its ``call``-th call (one call per small shard),
    after writing the data (a half-written shard) or, with ``before``, instead of it."""
    real = ShardWriter.write
    calls = []

    def write(self, framed, labels, **given):
        calls.append(self.path)
        if len(calls) == call and before:
            raise Crash(f"simulated crash before write #{call}")
        real(self, framed, labels, **given)
        if len(calls) == call:
            raise Crash(f"simulated crash after write #{call}")

    monkeypatch.setattr(ShardWriter, "write", write)


def _work(out: Path) -> Path:
    return out / resume.WORK_DIR


def _notes(out: Path) -> list[str]:
    return sorted(p.name for p in _work(out).glob("*.tfrecord.json"))


def _shard_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("*.tfrecord"))


def _interrupted(out: Path) -> None:
    """What any interrupted run must leave: no manifest, the work folder, a clear message."""
    assert not (out / "manifest.json").exists()
    assert _work(out).is_dir()
    assert (_work(out) / "plan.json").is_file()
    with pytest.raises(ChuteError, match="did not finish"):
        chute.load_manifest(out)
    with pytest.raises(ChuteError):
        chute.verify(out)


def test_crash_mid_run_then_resume_is_byte_identical(src, reference, tmp_path, monkeypatch):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 4)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    _interrupted(out)
    done = [f"train-0000{i}-of-00004.tfrecord" for i in range(3)]
    assert _shard_files(out) == done
    assert _notes(out) == [f + ".json" for f in done]
    assert not list(_work(out).glob("*.partial"))  # the failing writer cleaned up
    for name in done:
        os.utime(out / name, ns=(OLD_NS, OLD_NS))

    result = chute.convert(src, out, workers=1, **OPTIONS)
    assert not result.already_done
    assert result.resumed_shards == 3
    for name in done:  # kept, not rewritten
        assert (out / name).stat().st_mtime_ns == OLD_NS
    assert tree_bytes(out) == reference
    assert chute.verify(out).ok


def test_crash_before_a_shard_gets_its_first_bytes(src, reference, tmp_path, monkeypatch):
    # An interrupt (Ctrl-C, a dying worker pool) while the first chunk of a shard is still
    # being encoded: the shard's partial file does not exist yet. The interrupt itself must
    # come out, not an error from cleaning up a file that was never created.
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 2, before=True)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    _interrupted(out)
    assert _shard_files(out) == ["train-00000-of-00004.tfrecord"]

    result = chute.convert(src, out, workers=1, **OPTIONS)
    assert result.resumed_shards == 1
    assert tree_bytes(out) == reference


def test_stale_partial_and_unnoted_or_short_shards_are_redone(
    src, reference, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 4)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    _interrupted(out)
    # A kill -9 leaves the shard being written as a partial file: make a stale, too long one.
    (_work(out) / "train-00003-of-00004.tfrecord.partial").write_bytes(b"\x07" * 10_000)
    # A shard renamed but killed before its done note: complete-looking, but unproven.
    unnoted = out / "train-00001-of-00004.tfrecord"
    (_work(out) / (unnoted.name + ".json")).unlink()
    data = bytearray(unnoted.read_bytes())
    data[len(data) // 2] ^= 0xFF  # if it were kept, the result would differ
    unnoted.write_bytes(bytes(data))
    # A noted shard whose file is short (damaged after the note): redone too.
    short = out / "train-00002-of-00004.tfrecord"
    short.write_bytes(short.read_bytes()[:-7])

    result = chute.convert(src, out, workers=1, **OPTIONS)
    assert result.resumed_shards == 1  # only train-00000
    assert tree_bytes(out) == reference  # no partial or work files left either


def test_crash_between_rename_and_note_redoes_that_shard(src, reference, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real_exit = ShardWriter.__exit__
    exits = []

    def exit_then_crash(self, exc_type, exc, tb):
        real_exit(self, exc_type, exc, tb)
        exits.append(self.path)
        if len(exits) == 3:
            raise Crash("after rename, before the note")

    with monkeypatch.context() as patch:
        patch.setattr(ShardWriter, "__exit__", exit_then_crash)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    _interrupted(out)
    assert len(_shard_files(out)) == 3 and len(_notes(out)) == 2

    result = chute.convert(src, out, workers=1, **OPTIONS)
    assert result.resumed_shards == 2
    assert tree_bytes(out) == reference


def test_crash_while_saving_the_manifest_resumes_every_shard(src, reference, tmp_path, monkeypatch):
    out = tmp_path / "out"

    def crash(self, directory):
        raise Crash("killed while saving the manifest")

    with monkeypatch.context() as patch:
        patch.setattr(manifest_lib.Manifest, "save", crash)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    _interrupted(out)
    (out / "manifest.json.tmp").write_bytes(b'{"half a manifest')  # what a kill there leaves

    result = chute.convert(src, out, workers=1, **OPTIONS)
    assert result.resumed_shards == 8
    assert tree_bytes(out) == reference


def test_crash_after_the_manifest_is_finished_on_rerun(src, reference, tmp_path, monkeypatch):
    out = tmp_path / "out"

    def crash(output):
        raise Crash("killed before the work folder was removed")

    with monkeypatch.context() as patch:
        patch.setattr(resume, "remove_work_dir", crash)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    assert (out / "manifest.json").exists() and _work(out).exists()

    result = chute.convert(src, out, workers=1, **OPTIONS)
    assert result.already_done
    assert tree_bytes(out) == reference


def test_interrupted_run_with_other_options_needs_overwrite(src, tmp_path, monkeypatch):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 4)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    other = {**OPTIONS, "min_shards": 3}
    with pytest.raises(ChuteError, match="min_shards"):
        chute.convert(src, out, workers=1, **other)
    assert len(_shard_files(out)) == 3  # the interrupted run's shards are untouched

    result = chute.convert(src, out, workers=1, overwrite=True, **other)
    assert result.resumed_shards == 0
    chute.convert(src, tmp_path / "clean", workers=1, **other)
    assert tree_bytes(out) == tree_bytes(tmp_path / "clean")


def test_crash_with_worker_processes_then_resume_with_one(tmp_path, monkeypatch):
    src = make_folder(tmp_path / "src", {"a": 50, "b": 50, "c": 50}, size=(6, 5))
    options = {"val_fraction": 0.2, "min_shards": 6}
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 5)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=2, **options)
    _interrupted(out)
    assert len(_notes(out)) == 4

    result = chute.convert(src, out, workers=1, **options)
    assert result.resumed_shards == 4
    chute.convert(src, tmp_path / "reference", workers=1, **options)
    assert tree_bytes(out) == tree_bytes(tmp_path / "reference")


# -- a real kill -9 -------------------------------------------------------------------------


def _convert_cmd(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "chute", "convert", str(src), str(out),
            "--workers", "1", "--min-shards", "12", "--no-progress"]  # fmt: skip


def _kill_mid_run(src: Path, out: Path, deadline_s: float = 60) -> bool:
    """Starts the CLI and kill -9s it once a shard is done; False if it finished first."""
    proc = subprocess.Popen(
        _convert_cmd(src, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if list(_work(out).glob("*.tfrecord.json")):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                return not (out / "manifest.json").exists()
            if proc.poll() is not None:
                return False
            time.sleep(0.002)
        pytest.fail(f"no shard was finished within {deadline_s} s: {_convert_cmd(src, out)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return False  # unreachable


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_is_byte_identical(tmp_path):
    for attempt, count in enumerate((600, 3000)):
        third = count // 3
        sizes = {"a": third, "b": third, "c": count - 2 * third}
        src = make_folder(tmp_path / f"src{attempt}", sizes, size=(8, 8))
        out = tmp_path / f"out{attempt}"
        if _kill_mid_run(src, out):
            break
    else:
        pytest.skip("the conversion finished before it could be killed, even with 3000 images")
    _interrupted(out)
    assert 1 <= len(_notes(out)) < 12

    rerun = subprocess.run(_convert_cmd(src, out), capture_output=True, text=True, timeout=240)
    assert rerun.returncode == 0, rerun.stderr
    assert "resumed:" in rerun.stdout, rerun.stdout
    assert "Traceback" not in rerun.stderr

    reference = tmp_path / "reference"
    chute.convert(str(src), reference, workers=1, min_shards=12)
    assert tree_bytes(out) == tree_bytes(reference)
    assert chute.verify(out).ok


# -- one writer at a time, and what a re-run checks ----------------------------------------


def test_a_second_conversion_into_the_same_output_stops_at_once(src, tmp_path):
    out = tmp_path / "out"
    with lock_lib.locked(str(out)):  # a conversion holding OUT (this process: alive)
        with pytest.raises(ChuteError, match="Another chute convert is writing") as caught:
            chute.convert(src, out, workers=1, **OPTIONS)
        assert str(os.getpid()) in str(caught.value)
    assert not (out / "manifest.json").exists()
    chute.convert(src, out, workers=1, **OPTIONS)  # the lock is gone with its holder
    assert not (out / lock_lib.LOCK_NAME).exists()


def test_a_lock_left_by_a_process_that_is_gone_is_taken_over(src, reference, tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    import json
    import socket

    lock = {"pid": int(gone.stdout), "host": socket.gethostname(), "since": "earlier"}
    (out / lock_lib.LOCK_NAME).write_text(json.dumps(lock))
    with caplog.at_level("WARNING"):
        chute.convert(src, out, workers=1, **OPTIONS)
    assert "taking over the lock" in caplog.text
    assert tree_bytes(out) == reference


def test_a_finished_shard_that_changed_is_written_again_on_resume(
    src, reference, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 4)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    shard = out / "train-00001-of-00004.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same length, other bytes
    shard.write_bytes(bytes(data))
    result = chute.convert(src, out, workers=1, **OPTIONS)
    assert result.resumed_shards == 2  # train-00000 and 00002 kept, 00001 redone
    assert tree_bytes(out) == reference


def test_shards_of_an_earlier_plan_are_removed(src, reference, tmp_path, monkeypatch):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 2)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    (out / "train-00007-of-00009.tfrecord").write_bytes(b"from another plan")
    chute.convert(src, out, workers=1, **OPTIONS)
    assert tree_bytes(out) == reference


def test_a_changed_source_is_named_on_a_rerun_of_a_finished_output(src, tmp_path):
    out = tmp_path / "out"
    chute.convert(src, out, workers=1, **OPTIONS)
    assert chute.convert(src, out, workers=1, **OPTIONS).already_done  # unchanged: a no-op
    from helpers import write_image

    write_image(src / "a" / "new.png", seed=777)
    (src / "b" / "001.png").unlink()
    changed = src / "c" / "002.png"
    write_image(changed, seed=778)
    os.utime(changed, ns=(OLD_NS, OLD_NS))
    with pytest.raises(ChuteError, match="`source` changed") as caught:
        chute.convert(src, out, workers=1, **OPTIONS)
    message = str(caught.value)
    assert "added a/new.png" in message
    assert "removed b/001.png" in message
    assert "changed c/002.png" in message
    result = chute.convert(src, out, workers=1, overwrite=True, **OPTIONS)
    assert not result.already_done and result.manifest.source["num_items"] == 40


# -- a resume checks what it keeps; a source is one source however it is named ------------


def test_a_resume_writes_again_the_shards_whose_files_changed(src, tmp_path, monkeypatch):
    """A resume used to keep a finished shard whose image was overwritten since: the old
    pixels stayed, and source-files.csv listed the new file, so nothing flagged it."""
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 4)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    first = "train-00000-of-00004.tfrecord"
    os.utime(out / first, ns=(OLD_NS, OLD_NS))
    from helpers import read_records, write_image

    key = read_records(out / first)[0]["key"]
    write_image(src / key, seed=4242)  # the same name, new pixels
    result = chute.convert(src, out, workers=1, **OPTIONS)
    assert result.resumed_shards == 2  # shards 1 and 2 kept, shard 0 written again
    assert (out / first).stat().st_mtime_ns != OLD_NS
    fresh = tmp_path / "fresh"
    chute.convert(src, fresh, workers=1, **OPTIONS)
    assert tree_bytes(out) == tree_bytes(fresh)
    assert chute.convert(src, out, workers=1, **OPTIONS).already_done


def test_a_source_spelled_another_way_is_the_same_source(src, tmp_path, monkeypatch):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 2)
        with pytest.raises(Crash):
            chute.convert(src, out, workers=1, **OPTIONS)
    monkeypatch.chdir(src.parent)
    result = chute.convert("./src/", out, workers=1, **OPTIONS)  # resumes, from elsewhere
    assert result.resumed_shards == 1
    assert result.manifest.source["location"] == str(src)
    for spelling in ("src", "src/", str(src), f"{src}/", "../" + src.parent.name + "/src"):
        assert chute.convert(spelling, out, workers=1, **OPTIONS).already_done, spelling


def test_a_hub_dataset_reruns_and_resumes_by_its_name(tmp_path, monkeypatch):
    """hf:OWNER/NAME was compared as the folder it was downloaded to: every re-run was
    refused as 'a conversion with other options'."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from chute.ingest.sources import parquet

    images = make_folder(tmp_path / "images", {"a": 14, "b": 14, "c": 12})
    files = sorted(images.rglob("*.png"))
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({
        "image": pa.array([{"bytes": f.read_bytes(), "path": f.name} for f in files], struct),
        "label": pa.array([f.parent.name for f in files]),
    })  # fmt: skip
    snapshot = tmp_path / "snapshot"
    (snapshot / "data").mkdir(parents=True)
    pq.write_table(table, snapshot / "data" / "train-00000-of-00001.parquet")
    monkeypatch.setattr(parquet, "download", lambda name: str(snapshot))
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 2)
        with pytest.raises(Crash):
            chute.convert("hf:someone/glyphs", out, workers=1, **OPTIONS)
    result = chute.convert("hf:someone/glyphs", out, workers=1, **OPTIONS)
    assert result.resumed_shards == 1
    assert result.manifest.source["location"] == "hf:someone/glyphs"
    assert chute.convert("hf:someone/glyphs", out, workers=1, **OPTIONS).already_done


def _tar_gz(src: Path, path: Path) -> Path:
    import tarfile

    with tarfile.open(path, "w:gz") as archive:
        archive.add(src, arcname="src")
    return path


def test_the_lock_and_the_nothing_to_do_check_come_before_unpacking(src, tmp_path, monkeypatch):
    from chute.ingest.sources import tars

    archive = _tar_gz(src, tmp_path / "src.tar.gz")
    out = tmp_path / "out"
    chute.convert(archive, out, workers=1, **OPTIONS)
    unpacked = []
    real = tars.list_tar
    monkeypatch.setattr(tars, "list_tar", lambda *a, **k: unpacked.append(a) or real(*a, **k))
    assert chute.convert(archive, out, workers=1, **OPTIONS).already_done
    with lock_lib.locked(str(out)), pytest.raises(ChuteError, match="Another chute convert"):
        chute.convert(archive, out, workers=1, overwrite=True, **OPTIONS)
    assert unpacked == []  # neither run unpacked the archive
    os.utime(archive, ns=(OLD_NS, OLD_NS))  # a changed archive is scanned, and named
    with pytest.raises(ChuteError, match="`source` changed"):
        chute.convert(archive, out, workers=1, **OPTIONS)
    assert len(unpacked) == 1


def test_a_failed_scan_leaves_no_output_folder_behind(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ChuteError):
        chute.convert(tmp_path / "empty", tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_temporary_unpack_folders_go_on_sigterm_and_after_kill_9(tmp_path):
    big = make_folder(tmp_path / "big", {"a": 400, "b": 400}, size=(24, 24))
    archive = _tar_gz(big, tmp_path / "big.tar.gz")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "out"
    env = dict(os.environ, TMPDIR=str(scratch))
    command = [sys.executable, "-m", "chute", "convert", str(archive), str(out),
               "--workers", "1", "--min-shards", "40", "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list(_work(out).glob("*.tfrecord.json")) and proc.poll() is None:
            assert time.monotonic() < deadline, "no shard was written in time"
            time.sleep(0.005)
        assert list(scratch.iterdir()), "the archive was not unpacked into TMPDIR"
        proc.terminate()
        assert proc.wait(timeout=60) in (143, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert "Traceback" not in proc.stderr.read().decode()
    assert list(scratch.iterdir()) == []  # SIGTERM: cleaned up on the way out

    # kill -9 cleans nothing: the folder left is named after OUT and a dead process
    stale = scratch / f"{lock_lib.scratch_prefix(str(out)).rsplit('-', 2)[0]}-999999999-x"
    stale.mkdir()
    (stale / "data").write_bytes(b"x" * 1000)
    other = scratch / "chute-unpack-0123456789ab-999999999-x"  # another output's: kept
    other.mkdir()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in scratch.iterdir()) == [other.name]


def test_an_archive_whose_name_is_not_utf8_converts_and_reruns(src, tmp_path):
    import tarfile

    archive = tmp_path / os.fsdecode(b"caf\xe9.tar")
    with tarfile.open(archive, "w") as packed:
        packed.add(src, arcname="src")
    out = tmp_path / "out"
    result = chute.convert(archive, out, workers=1, **OPTIONS)
    assert result.manifest.source["location"].endswith("caf\\xe9.tar")
    assert "caf\\xe9.tar" in (out / "source-files.csv").read_text(encoding="utf-8")
    assert chute.convert(archive, out, workers=1, **OPTIONS).already_done


# -- the decision, as a table ---------------------------------------------------------------

State, Action = resume.FolderState, resume.Action


@pytest.mark.parametrize(
    ("state", "same", "overwrite", "action"),
    [
        (State.NEW, False, False, Action.START),
        (State.NEW, False, True, Action.START),
        (State.EMPTY, False, False, Action.REPLACE),  # a lone rejects.csv goes
        (State.FOREIGN, False, False, Action.REFUSE_FOREIGN),
        (State.FOREIGN, False, True, Action.REPLACE),  # chute's names only
        (State.FINISHED, True, False, Action.KEEP),
        (State.FINISHED, False, False, Action.REFUSE),
        (State.FINISHED, True, True, Action.REPLACE),
        (State.FINISHED, False, True, Action.REPLACE),
        (State.INTERRUPTED, True, False, Action.RESUME),
        (State.INTERRUPTED, False, False, Action.REFUSE),
        (State.INTERRUPTED, True, True, Action.REPLACE),
        (State.INTERRUPTED, False, True, Action.REPLACE),
    ],
)
def test_one_decision_over_state_same_conversion_and_overwrite(state, same, overwrite, action):
    assert resume.decide(state, same, overwrite) is action


def test_the_folder_is_classified_once_by_what_it_holds(tmp_path):
    out = tmp_path / "out"
    assert resume.read_folder(str(out)).state is State.NEW
    out.mkdir()
    assert resume.read_folder(str(out)).state is State.EMPTY
    (out / resume.REJECTS_NAME).write_text("key,reason\n")
    (out / lock_lib.LOCK_NAME).write_text("{}")
    assert resume.read_folder(str(out)).state is State.EMPTY  # a refused run's leftovers
    (out / "notes.txt").write_text("mine")
    assert resume.read_folder(str(out)).state is State.FOREIGN
    (out / resume.WORK_DIR).mkdir()
    (out / resume.WORK_DIR / "plan.json").write_text('{"source": "src", "options": {}}')
    interrupted = resume.read_folder(str(out))
    assert interrupted.state is State.INTERRUPTED and interrupted.manifest is None
    assert interrupted.holds == resume.Conversion.of("src/", {})  # spelled another way
    with pytest.raises(ChuteError, match="`output` exists and is not a folder"):
        resume.read_folder(str(out / "notes.txt"))


def test_a_conversion_stamped_before_an_option_existed_had_its_default(tmp_path):
    from chute.ingest.options import ConvertOptions

    now = resume.Conversion.of("src", ConvertOptions().to_dict())
    assert resume.Conversion.of("src", {}) == now
    other = resume.Conversion.of(str(tmp_path / "other"), {"min_shards": 3})
    assert now.changes_from(other) == [
        f"source: {str(tmp_path / 'other')!r} -> {os.path.abspath('src')!r}",
        f"min_shards: 3 -> {ConvertOptions().min_shards!r}",
    ]


def test_rejects_csv_quotes_only_what_needs_it(tmp_path):
    rejects = [
        {"key": "a/plain.png", "reason": "not an image"},
        {"key": 'b/comma, "quoted".png', "reason": "line\nbreak"},
    ]
    resume.write_rejects(str(tmp_path), rejects)
    assert (tmp_path / resume.REJECTS_NAME).read_bytes() == (
        b'key,reason\na/plain.png,not an image\n"b/comma, ""quoted"".png","line\nbreak"\n'
    )
