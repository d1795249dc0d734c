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
