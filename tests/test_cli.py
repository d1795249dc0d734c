"""The command line: fast help, inspect (text, JSON, grid), demo, errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import make_folder, run_cli, run_here
from PIL import Image

import chute
from chute import cli


def test_help_lists_commands_without_importing_tensorflow():
    # Fast help means not importing TensorFlow (seconds); asserted by module, not by clock.
    code = (
        "import sys; from chute.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('TF', 'tensorflow' in sys.modules, 'keras' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for command in ("convert", "inspect", "verify", "demo"):
        assert command in out.stdout
    assert "TF False False" in out.stdout


def test_python_dash_m_and_version():
    result = run_cli("--version")
    assert result.returncode == 0 and chute.__version__ in result.stdout


def test_inspect_text_and_json(shared_dataset, capsys):
    assert cli.main(["inspect", str(shared_dataset)]) == 0
    text = capsys.readouterr().out
    assert "3 classes, 12x10, 1 channel(s), raw" in text
    assert "train" in text and "val" in text
    assert "rejected inputs: 0" in text
    assert cli.main(["inspect", str(shared_dataset), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["class_names"] == ["a", "b", "c"] and body["format"] == "chute.manifest"


def test_inspect_summarises_many_classes(tmp_path, capsys):
    src = make_folder(tmp_path / "src", {f"k{i:02d}": 2 + (i == 7) for i in range(25)}, size=(4, 4))
    chute.convert(src, tmp_path / "out", workers=1)
    assert cli.main(["inspect", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "largest classes in train:  k07 (3)" in text
    assert "smallest classes in train" in text
    assert "k13" not in text.split("smallest")[0]  # no per-class table for 25 classes


def test_grid_draws_every_class_row(shared_dataset, tmp_path, capsys):
    out = tmp_path / "grid.png"
    assert cli.main(["inspect", str(shared_dataset), "--grid", str(out)]) == 0
    image = Image.open(out)
    assert image.height == 3 * (64 + 2)  # one row per class
    assert "grid of sample images" in capsys.readouterr().out


@pytest.mark.slow  # draws its sample images in worker processes
def test_demo_runs_small(tmp_path):
    # Every step (draw, convert, inspect, grid, verify, train, classify held-out images)
    # runs; one epoch is enough for that.
    result = run_here(
        "demo", tmp_path / "demo", "--classes", "3", "--per-class", "12", "--epochs", "1"
    )
    assert result.returncode == 0, result.stderr
    assert "ok:" in result.stdout and "grid.png" in result.stdout
    assert (tmp_path / "demo" / "shards" / "manifest.json").exists()


def test_a_user_error_in_a_fresh_process_exits_2_without_traceback(tmp_path):
    result = run_cli("convert", tmp_path / "missing", tmp_path / "out")
    assert result.returncode == 2
    assert "`source` does not exist" in result.stderr and "Traceback" not in result.stderr


def test_user_errors_exit_2_with_one_line(tmp_path):
    result = run_here("inspect", tmp_path / "nothing-here")
    assert result.returncode == 2
    assert "No manifest.json" in result.stderr and "Traceback" not in result.stderr
    result = run_here("convert", "x", "y", "--color-mode", "cmyk")
    assert result.returncode == 2 and "--color-mode" in result.stderr and "cmyk" in result.stderr


def test_cli_unwritable_output_path_is_one_line(shared_dataset, tmp_path):
    result = run_here("inspect", shared_dataset, "--grid", tmp_path / "no" / "such" / "grid.png")
    assert result.returncode == 1, result.stderr
    assert "chute inspect: error:" in result.stderr and "Traceback" not in result.stderr
