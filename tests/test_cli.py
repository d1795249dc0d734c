"""The command line: fast help, inspect (text, JSON, grid), demo, errors without tracebacks."""

from __future__ import annotations

import io
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_folder, run_cli, run_here, write_image
from PIL import Image

import chute
from chute import cli, lazy


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


# -- a first run: what a new user meets -----------------------------------------------------


def _without_tensorflow(*args: str) -> subprocess.CompletedProcess:
    """``chute ARGS`` in a fresh process where TensorFlow cannot be imported."""
    code = (
        "import sys; sys.modules['tensorflow'] = None  # as if it were not installed\n"
        "from chute.cli import main\n"
        f"sys.exit(main({[str(a) for a in args]!r}))"
    )
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("command", ["train", "evaluate", "inspect", "verify"])
def test_a_folder_of_images_is_named_with_the_convert_command(tmp_path, command):
    images = make_folder(tmp_path / "my images", {"cat": 2, "dog": 2})  # class sub-folders
    args = {"evaluate": ("evaluate", tmp_path / "run", images)}.get(command, (command, images))
    done = run_here(*args)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("chute ")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    out = shlex.quote(f"{images}-shards")
    assert f"chute convert {shlex.quote(str(images))} {out}" in errors[0]
    assert f"chute {command} {out}" in errors[0] and "a folder of images" in errors[0]


def test_image_files_at_the_top_are_images_too_and_other_folders_are_not(tmp_path):
    flat = tmp_path / "flat"
    write_image(flat / "x.JPG", fmt="JPEG")
    assert "chute convert" in run_here("train", flat).stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes" / "a").mkdir(parents=True)
    (tmp_path / "notes" / "a" / "readme.txt").write_text("no images")
    for folder in (tmp_path / "empty", tmp_path / "notes"):
        done = run_here("inspect", folder)
        assert done.returncode == 2 and "not a chute dataset" in done.stderr
        assert "chute convert" not in done.stderr


def test_train_without_tensorflow_names_chute_extras(shared_dataset, tmp_path):
    done = _without_tensorflow("train", shared_dataset, "--run-dir", tmp_path / "run")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lazy.extra("tensorflow") in done.stderr and "[tensorflow-cpu]" in done.stderr
    assert "pip install tensorflow" not in done.stderr  # chute's extras, not a bare wheel
    assert "'chute[" not in done.stderr  # chute is not on PyPI: that finds nothing


def test_inspect_grid_fails_before_the_report(shared_dataset, tmp_path):
    done = run_here("inspect", shared_dataset, "--grid", tmp_path / "no" / "such" / "grid.png")
    assert done.returncode == 1 and "chute inspect: error:" in done.stderr
    assert done.stdout == ""  # not the whole report, then the error
    # the grid reads records in plain Python: drawn without TensorFlow too
    done = _without_tensorflow("inspect", shared_dataset, "--grid", tmp_path / "grid.png")
    assert done.returncode == 0 and (tmp_path / "grid.png").exists(), done.stderr


def test_verify_prints_each_problem_once(shared_dataset, tmp_path):
    out = Path(shutil.copytree(shared_dataset, tmp_path / "out"))
    shard = out / chute.load_manifest(out).splits["train"]["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:-7])  # truncated: size, sha256, records
    done = run_here("verify", out, "--no-progress")
    assert done.returncode == 1
    named = [line for line in done.stderr.splitlines() if shard.name in line]
    assert len(named) >= 2 and all(line.startswith(f"BAD {shard.name}: ") for line in named)
    assert len(set(named)) == len(named), done.stderr  # each problem once


def _verbose_given(monkeypatch, *flags: str, terminal: bool = False):
    """The ``verbose`` that ``chute train FLAGS`` passes to the library's train."""
    import chute.fit.train

    seen = {}

    def train(*args, verbose="auto", **kwargs):
        seen["verbose"] = verbose
        raise chute.ChuteError("stopped by the test")

    class Stdout(io.StringIO):
        def isatty(self) -> bool:
            return terminal

    monkeypatch.setattr(chute.fit.train, "train", train)
    monkeypatch.setattr(sys, "stdout", Stdout())
    assert cli.main(["train", "somewhere", *flags]) == 2
    return seen["verbose"]


def test_train_shows_keras_progress_bars_only_on_a_terminal(monkeypatch):
    # A redirected `chute train > log` gets one line per epoch (Keras's verbose=2), not a
    # bar redrawn with carriage returns and ANSI codes at every step.
    assert _verbose_given(monkeypatch) == 2
    assert _verbose_given(monkeypatch, terminal=True) == 1
    assert _verbose_given(monkeypatch, "--progress") == 1
    assert _verbose_given(monkeypatch, "--no-progress", terminal=True) == 2


def _help(*command: str) -> str:
    done = run_here(*command, "--help")
    assert done.returncode == 0
    return " ".join(done.stdout.split())  # argparse's line wrapping undone


def test_every_export_argument_has_help():
    export = cli._parser()._subparsers._group_actions[0].choices["export"]
    for action in export._actions:
        assert action.help, action.dest
    text = _help("export")
    assert "RUN a chute train run folder" in text and "TF Serving" in text


def test_train_help_says_what_the_seed_is_for():
    # The seed chute train passes to either engine: 1337 unless given (chute.load's Grain
    # engine draws one only when called without a seed).
    text = _help("train")
    assert "--seed N seeds Keras, the data order and augmentation, whichever --engine reads " \
        "(default: 1337)" in text  # fmt: skip


def test_index_refuses_a_folder_of_images_as_verify_does(tmp_path, capsys):
    images = make_folder(tmp_path / "images", {"cat": 2, "dog": 2})
    assert cli.main(["index", str(images), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "a folder of images" in error and f"chute index {images}-shards" in error


def test_progress_bars_are_closed_when_a_command_fails(monkeypatch):
    closed = []
    monkeypatch.setattr(cli._Bars, "close", lambda bars: closed.append(bars.enabled))
    with pytest.raises(chute.ChuteError), cli._progress_bars(None):  # stderr: no terminal
        raise chute.ChuteError("a bad shard")
    assert closed == [False]


# Every command's location arguments, each given a URL that names no place (#38 item 4).
_NO_PLACE = {
    "convert source": (["convert", "{url}", "out"], "source"),
    "convert output": (["convert", "imgs", "{url}"], "output"),
    "inspect": (["inspect", "{url}"], "path"),
    "verify": (["verify", "{url}"], "path"),
    "index": (["index", "{url}"], "path"),
    "train data": (["train", "{url}", "--run-dir", "run"], "data"),
    "train run_dir": (["train", "ds", "--run-dir", "{url}"], "run_dir"),
    "evaluate model": (["evaluate", "{url}", "ds"], "run_or_model"),
    "evaluate data": (["evaluate", "run", "{url}"], "data"),
    "predict model": (["predict", "{url}", "a.png"], "model_path"),
    "predict images": (["predict", "run", "{url}"], "images"),
    "export model": (["export", "{url}", "--output", "out", "--format", "keras"], "run_or_bundle"),
    "export output": (["export", "run", "--output", "{url}", "--format", "keras"], "output"),
}


@pytest.mark.parametrize("url", ["s3://", "gs://", "s3:/bkt/x", "file://"])
@pytest.mark.parametrize("case", list(_NO_PLACE))
def test_a_url_that_names_no_place_is_refused_naming_the_argument(tmp_path, monkeypatch, case, url):
    make_folder(tmp_path / "imgs", {"a": 2, "b": 2})
    monkeypatch.chdir(tmp_path)  # where "s3://" used to become a folder "s3:"
    args, name = _NO_PLACE[case]
    done = run_here(*[arg.replace("{url}", url) for arg in args])
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("chute ")]
    assert len(errors) == 1, done.stderr
    assert f"`{name}`" in errors[0] and f"Received: {name}={url!r}" in errors[0], errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs"]  # nothing written


def test_only_chutes_own_notes_are_shown_other_libraries_warnings_too(shared_dataset, monkeypatch):
    real = cli._inspect

    def noisy(args):
        logging.getLogger("botocore.credentials").info("Found credentials in environment.")
        logging.getLogger("botocore.endpoint").warning("a store's warning")
        logging.getLogger("chute.tools.inspect").info("chute's own note")
        return real(args)

    monkeypatch.setattr(cli, "_inspect", noisy)
    done = run_here("inspect", shared_dataset)
    assert done.returncode == 0, done.stderr
    assert "Found credentials" not in done.stderr
    assert "chute: a store's warning" in done.stderr and "chute: chute's own note" in done.stderr
    assert "chute: Found credentials" in run_here("-v", "inspect", shared_dataset).stderr


def test_tensorflow_native_log_level_is_set_unless_the_user_did_or_asks_for_it(
    shared_dataset, monkeypatch
):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    run_here("-v", "inspect", shared_dataset)
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ  # -v: everything TensorFlow says
    run_here("inspect", shared_dataset)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"  # errors too: they come back as one line
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    run_here("inspect", shared_dataset)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"  # the user's own


@pytest.mark.slow  # a fresh process imports TensorFlow and loads a model
def test_a_tensorflow_command_prints_no_native_log_lines(trained_run, tmp_path):
    run, _ = trained_run
    image = write_image(tmp_path / "x.png", size=(16, 16))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", "chute", "predict", str(run), str(image)],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    native = [line for line in done.stderr.splitlines() if not line.startswith("chute: ")]
    assert native == [], done.stderr


def test_a_finished_progress_bar_is_closed_at_once():
    bars = cli._Bars(True)
    bars("check", 85, 100)
    assert "check" in bars.bars
    bars("check", 100, 100)  # not left standing at its last redraw
    assert "check" not in bars.bars
    bars.close()


def test_log_lines_go_above_the_progress_bars_not_into_them(folder, tmp_path):
    done = run_here("convert", folder, tmp_path / "out", "--progress", "--workers", "1")
    assert done.returncode == 0, done.stderr
    for line in done.stderr.split("\n"):
        if "chute: " in line:
            # whatever a bar drew on this line was erased (\r) before the log line
            assert line.rsplit("\r", 1)[-1].startswith("chute: "), repr(line)


def test_an_unknown_flag_is_not_blamed_on_beam(folder, tmp_path):
    done = run_here("convert", folder, tmp_path / "out", "--appendix")
    assert done.returncode == 2
    assert "unrecognized arguments: --appendix" in done.stderr
    assert "Beam" not in done.stderr and not (tmp_path / "out").exists()
    beam = run_here("convert", folder, tmp_path / "out", "--temp_location=gs://b/tmp")
    assert "(Beam pipeline options need --runner)" in beam.stderr
