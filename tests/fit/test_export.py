"""chute export's guard on its output folder (the formats are tested with the bundle, in
test_bundle_predict)."""

from __future__ import annotations

import pytest

from chute import ChuteError
from chute.fit import export as exporting


def test_export_overwrite_never_deletes_a_foreign_folder(tmp_path):
    other = tmp_path / "precious"
    other.mkdir()
    (other / "thesis.tex").write_text("years of work")
    with pytest.raises(ChuteError, match="only replaces an earlier chute export"):
        exporting._prepare_output(str(other), str(tmp_path / "bundle"), overwrite=True)
    assert (other / "thesis.tex").exists()


def test_a_folder_of_other_files_is_never_advised_overwrite(tmp_path):
    """--overwrite is refused for a folder without an earlier export: the advice says so,
    and only an earlier export is offered --overwrite."""
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(ChuteError) as error:
        exporting._prepare_output(str(busy), str(tmp_path / "bundle"), overwrite=False)
    message = str(error.value)
    assert "holds no earlier chute export" in message
    assert "choose a new or empty folder" in message
    assert "pass overwrite=True" not in message and "to replace it" not in message
    assert sorted(p.name for p in busy.iterdir()) == ["keep.txt"]

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "chute.json").write_text("{}")
    with pytest.raises(ChuteError, match=r"holds an earlier chute export.*pass overwrite=True"):
        exporting._prepare_output(str(earlier), str(tmp_path / "bundle"), overwrite=False)
    exporting._prepare_output(str(earlier), str(tmp_path / "bundle"), overwrite=True)
    assert list(earlier.iterdir()) == []
