"""User mistakes found in review: each is a clear ChuteError (or exit code), never a traceback."""

from __future__ import annotations

import pytest
from helpers import make_folder, run_cli, write_image

import chute
from chute import ChuteError
from chute.ingest import sources


def test_list_that_is_not_utf8(tmp_path):
    write_image(tmp_path / "a.png")
    (tmp_path / "list.csv").write_bytes("a.png,caf\xe9\n".encode("latin-1"))
    with pytest.raises(ChuteError, match="not UTF-8"):
        sources.scan(str(tmp_path / "list.csv"))


def test_jsonl_split_that_is_not_a_string(tmp_path):
    write_image(tmp_path / "a.png")
    (tmp_path / "list.jsonl").write_text('{"path": "a.png", "label": "x", "split": 3}\n')
    with pytest.raises(ChuteError, match=r"line 1.*'split' must be a string"):
        sources.scan(str(tmp_path / "list.jsonl"))


def test_corrupt_npz(tmp_path):
    (tmp_path / "data.npz").write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(ChuteError, match=r"not a readable \.npz file"):
        sources.scan(str(tmp_path / "data.npz"))


def test_file_url_source(tmp_path):
    src = make_folder(tmp_path / "src", {"a": 2, "b": 2}, size=(4, 4))
    assert len(sources.scan(f"file://{src}").items) == 4


def test_pad_final_batch_needs_labels(shared_dataset):
    with pytest.raises(ChuteError, match="needs labels"):
        chute.load(shared_dataset, "val", training=False, pad_final_batch=True, label_mode=None)


def test_export_overwrite_never_deletes_a_foreign_folder(tmp_path):
    other = tmp_path / "precious"
    other.mkdir()
    (other / "thesis.tex").write_text("years of work")
    from chute.fit import export as exporting

    with pytest.raises(ChuteError, match="only replaces an earlier chute export"):
        exporting._prepare_output(str(other), str(tmp_path / "bundle"), overwrite=True)
    assert (other / "thesis.tex").exists()


def test_cli_unwritable_output_path_is_one_line(shared_dataset, tmp_path):
    result = run_cli("inspect", shared_dataset, "--grid", tmp_path / "no" / "such" / "grid.png")
    assert result.returncode == 1, result.stderr
    assert "chute inspect: error:" in result.stderr and "Traceback" not in result.stderr
