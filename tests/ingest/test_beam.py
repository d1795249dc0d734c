"""chute.convert(runner=...) and `chute convert --runner`: Apache Beam writes what the
local converter writes (DirectRunner, in this process)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import all_records, decode, make_folder, run_here, tree_bytes

import chute
from chute import cli, lazy
from chute.errors import ChuteError
from chute.ingest import resume, sources
from chute.ingest.beam import BeamJob
from chute.ingest.writer import ShardWriter

pytest.importorskip("apache_beam")

# One in-process worker: what keeps a test pipeline small and fast.
DIRECT = ["--direct_num_workers=1", "--direct_running_mode=in_memory"]
OPTIONS = {"val_fraction": 0.25, "test_fraction": 0.15, "min_shards": 2}
OLD_NS = 1_000_000_000


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """Three classes with copies across classes, a file whose header is fine but whose
    data is cut (rejected while encoding, by Beam) and one that is no image at all
    (rejected from its header, before Beam starts)."""
    root = make_folder(tmp_path / "src", {"a": 12, "b": 10, "c": 8})
    for i in range(4):
        shutil.copy(root / "a" / f"{i:03d}.png", root / "b" / f"copy{i}.png")
    whole = (root / "c" / "000.png").read_bytes()
    (root / "c" / "cut.png").write_bytes(whole[: len(whole) // 2])
    (root / "c" / "notes.png").write_bytes(b"not an image")
    return root


def _records(out: Path, split: str) -> list[tuple]:
    return [(r["key"], r["class"], decode(r).tobytes()) for r in all_records(out, split)]


def test_beam_writes_the_same_bytes_and_records_as_the_local_converter(src, tmp_path):
    local, beam = tmp_path / "local", tmp_path / "beam"
    expected = chute.convert(src, local, workers=1, **OPTIONS)
    result = chute.convert(src, beam, runner="DirectRunner", pipeline_args=DIRECT, **OPTIONS)

    manifest = result.manifest
    assert sorted(manifest.splits) == ["test", "train", "val"]
    assert result.num_written == expected.num_written
    for split in manifest.splits:
        assert _records(beam, split) == _records(local, split)
    reasons = {r["key"]: r["reason"] for r in manifest.rejects}
    assert sorted(reasons) == ["c/cut.png", "c/notes.png"]
    assert "truncated" in reasons["c/cut.png"]  # by a Beam worker, while encoding
    assert "not an image" in reasons["c/notes.png"]  # from its header, before Beam
    dropped = [key for group in manifest.duplicates for key in group["dropped"]]
    assert len(manifest.duplicates) == 4 and dropped  # copies split up: one side dropped
    assert tree_bytes(beam) == tree_bytes(local)  # shards, indexes, manifest, rejects.csv, ...
    indexes = sorted(p.name for p in beam.glob("index/*.index"))  # Beam's workers wrote them
    assert indexes == sorted(
        s["index"]["file"] for v in manifest.splits.values() for s in v["shards"]
    )
    assert len(indexes) == len(list(beam.glob("*.tfrecord")))
    assert not (beam / resume.WORK_DIR).exists()
    assert chute.verify(beam).ok


def _crash_on_write(monkeypatch, call: int) -> None:
    """ShardWriter.write raises on its ``call``-th call: a conversion killed mid-run."""
    real, calls = ShardWriter.write, []

    def write(self, framed, labels, **given):
        calls.append(self.path)
        real(self, framed, labels, **given)
        if len(calls) == call:
            raise KeyboardInterrupt

    monkeypatch.setattr(ShardWriter, "write", write)


def test_beam_keeps_the_shards_a_killed_run_finished(src, tmp_path, monkeypatch):
    reference = tmp_path / "reference"
    chute.convert(src, reference, workers=1, **OPTIONS)
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _crash_on_write(patch, 3)  # train's 2 shards finished; val's first one cut short
        with pytest.raises(KeyboardInterrupt):
            chute.convert(src, out, workers=1, **OPTIONS)
    done = ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert sorted(p.name for p in out.glob("*.tfrecord")) == done
    for name in done:
        os.utime(out / name, ns=(OLD_NS, OLD_NS))

    result = chute.convert(src, out, runner="DirectRunner", pipeline_args=DIRECT, **OPTIONS)
    assert result.resumed_shards == 2
    for name in done:  # kept, not written again
        assert (out / name).stat().st_mtime_ns == OLD_NS
    # The copies dropped from val are dropped because train (not rewritten) holds them.
    assert any(group["dropped"] for group in result.manifest.duplicates)
    assert tree_bytes(out) == tree_bytes(reference)


def test_a_rerun_after_the_launcher_died_only_writes_the_manifest(src, tmp_path, monkeypatch):
    """The job finished but the launching process died before the manifest: the same
    command finds every shard's note and runs no pipeline."""
    from chute.ingest import convert as convert_lib

    reference, out = tmp_path / "reference", tmp_path / "out"
    chute.convert(src, reference, workers=1, **OPTIONS)
    with monkeypatch.context() as patch:
        patch.setattr(convert_lib, "_finish", lambda *args: sys.exit("launcher died"))
        with pytest.raises(SystemExit):
            chute.convert(src, out, runner="DirectRunner", pipeline_args=DIRECT, **OPTIONS)
    assert not (out / "manifest.json").exists()
    with monkeypatch.context() as patch:
        patch.setattr(BeamJob, "_pipeline", lambda self: pytest.fail("a pipeline ran again"))
        result = chute.convert(src, out, runner="DirectRunner", pipeline_args=DIRECT, **OPTIONS)
    assert result.resumed_shards == 6
    assert tree_bytes(out) == tree_bytes(reference)


def test_beam_writes_to_a_tensorflow_filesystem(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 5, "b": 4})
    out = f"ram://chute-beam-{os.getpid()}/out"
    chute.convert(src, tmp_path / "local", workers=1, val_fraction=0.25)
    result = chute.convert(src, out, runner="DirectRunner", pipeline_args=DIRECT, val_fraction=0.25)
    assert result.manifest == chute.load_manifest(tmp_path / "local")
    assert chute.verify(out).ok
    assert _records(out, "val") == _records(tmp_path / "local", "val")


def test_cli_runner_converts_with_beam_options_then_verifies(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 6, "b": 5}, mode="RGB", size=(9, 7))
    out = tmp_path / "out"
    done = run_here(
        "convert", src, out, "--val-fraction", "0.2", "--no-progress",
        "--runner", "DirectRunner", *DIRECT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "on Beam's DirectRunner" in done.stdout
    manifest = chute.load_manifest(out)
    assert manifest.image.channels == 3 and manifest.num_examples("val") == 2
    checked = run_here("verify", out, "--no-progress")
    assert checked.returncode == 0, checked.stderr
    assert "ok: 2 shards, 11 records" in checked.stdout


def test_a_bad_beam_option_is_beams_message_without_a_traceback(folder, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["convert", str(folder), str(out), "--runner", "DirectRunner",
                     "--num_workers=many"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "invalid int value: 'many'" in err and "--num_workers=many" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_beam_options_without_a_runner_are_refused(folder, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["convert", str(folder), str(tmp_path / "out"), "--project=my-project"])
    assert exit_info.value.code == 2
    assert "--project=my-project (Beam pipeline options need --runner)" in capsys.readouterr().err
    with pytest.raises(ChuteError, match=r"`pipeline_args`.*need a `runner`.*runner=None"):
        chute.convert(folder, tmp_path / "out", pipeline_args=["--project=my-project"])


def test_an_unknown_runner_is_named_with_the_allowed_ones(folder, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["convert", str(folder), str(tmp_path / "out"), "--runner", "Direct"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --runner: invalid choice: 'Direct'" in err
    assert "'DirectRunner', 'DataflowRunner', 'FlinkRunner', 'SparkRunner'" in err
    with pytest.raises(ChuteError, match=r"`runner` must be one of \{'DirectRunner'.*"
                       r"'SparkRunner'\}. Received: runner='Direct'"):  # fmt: skip
        chute.convert(folder, tmp_path / "out", runner="Direct")
    assert not (tmp_path / "out").exists()


def test_without_apache_beam_the_error_names_the_extra(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # import apache_beam fails
    with pytest.raises(ChuteError, match=re.escape(lazy.extra("beam", instead="apache-beam"))):
        chute.convert(folder, tmp_path / "out", runner="DirectRunner")
    code = cli.main(["convert", str(folder), str(tmp_path / "out"), "--runner", "DataflowRunner"])
    assert code == 2
    err = capsys.readouterr().err
    assert "needs Apache Beam" in err and lazy.extra("beam") in err and "'chute[" not in err
    assert "runner='DataflowRunner'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_beam_refuses_what_its_workers_could_not_reach(folder, tmp_path):
    np.savez(tmp_path / "arrays.npz", x=np.zeros((4, 3, 3), np.uint8), y=np.arange(4) % 2)
    with pytest.raises(ChuteError, match=r"array source.*source='.*arrays.npz'"):
        chute.convert(tmp_path / "arrays.npz", tmp_path / "out", runner="DirectRunner")
    with pytest.raises(ChuteError, match=r"Beam refused .*DataflowRunner.*project"):
        chute.convert(folder, "gs://bucket/out", runner="DataflowRunner")
    dataflow = ["--project=my-project", "--region=us-central1", "--dry_run=True"]
    dataflow += ["--temp_location=gs://my-bucket/tmp", "--staging_location=gs://my-bucket/s"]
    with pytest.raises(ChuteError, match=r"`output` must be where Dataflow.*output='/"):
        chute.convert(folder, tmp_path / "out", runner="DataflowRunner", pipeline_args=dataflow)
    job = BeamJob("DataflowRunner", dataflow)
    with pytest.raises(ChuteError, match=r"`source` must be where Dataflow.*which holds '/"):
        job.check_source(sources.scan(str(folder)))
    with pytest.raises(ChuteError, match=r"runner once.*runner='DirectRunner'.*'FlinkRunner'"):
        chute.convert(folder, tmp_path / "out", runner="DirectRunner",
                      pipeline_args=["--runner=FlinkRunner"])  # fmt: skip
    with pytest.raises(ChuteError, match=r"`pipeline_args` must be a list of Beam flags"):
        chute.convert(folder, tmp_path / "out", runner="DirectRunner", pipeline_args="--x=1")
    assert not (tmp_path / "out").exists()
