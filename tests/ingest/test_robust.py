"""Nothing aborts a conversion: odd files are rejected one by one, crashed workers are
replaced, and workers run isolated from the current directory."""

from __future__ import annotations

import contextlib
import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
from helpers import all_records, make_folder
from PIL import Image

import chute
from chute import ChuteError
from chute.image.decode import read_file
from chute.image.header import Rejected
from chute.ingest import decode as decoding
from chute.ingest import encode
from chute.ingest.workers import WorkerPool

TESTS = str(Path(__file__).resolve().parents[1])


@pytest.fixture
def crashy(monkeypatch, tmp_path):
    """A pool factory whose workers run tests/crashy_tasks.py."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))

    def make(**kwargs):
        return WorkerPool(2, module="crashy_tasks", **kwargs)

    return make


def test_a_worker_that_dies_is_replaced_and_its_tasks_sent_again(crashy, tmp_path):
    tasks = [(["a", "b"], str(tmp_path)), (["crash-once"], str(tmp_path)), (["c"], str(tmp_path))]
    tasks += [([f"x{i}"], str(tmp_path)) for i in range(6)]
    with crashy(on_crash=lambda *args: ["never"]) as pool:
        results = list(pool.ordered("echo", tasks, window=4))
    assert results == [["A", "B"], ["CRASH-ONCE"], ["C"]] + [[f"X{i}"] for i in range(6)]


def test_a_task_that_kills_two_workers_gets_the_crash_result_and_the_run_goes_on(crashy, tmp_path):
    seen = []

    def on_crash(function, task, code):
        seen.append((function, task[0], code))
        return ["rejected"]

    tasks = [(["a"], str(tmp_path)), (["crash"], str(tmp_path)), (["b"], str(tmp_path))]
    tasks += [([f"y{i}"], str(tmp_path)) for i in range(5)]
    with crashy(on_crash=on_crash) as pool:
        results = list(pool.ordered("echo", tasks, window=3))
        assert list(pool.ordered("echo", [(["again"], str(tmp_path))])) == [["AGAIN"]]
    assert results == [["A"], ["rejected"], ["B"]] + [[f"Y{i}"] for i in range(5)]
    assert seen == [("echo", ["crash"], 7)]


def test_without_a_crash_handler_a_dead_worker_is_a_clear_error(crashy, tmp_path):
    with crashy() as pool, pytest.raises(ChuteError, match="worker process died"):
        list(pool.ordered("echo", [(["crash"], str(tmp_path))]))


def test_any_decoder_failure_rejects_that_file_only(tmp_path, monkeypatch):
    """A header probe, a decode, a convert or an encode that raises anything rejects
    the file with its reason; the others are converted."""
    good = tmp_path / "good.png"
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(good)
    paletted = tmp_path / "paletted.png"
    Image.new("P", (4, 4)).save(paletted)

    def broken(self, *args, **kwargs):
        raise ValueError("invalid palette size")

    monkeypatch.setattr(Image.Image, "getpalette", broken)
    good_probe, bad_probe = decoding.probe_chunk([str(good), str(paletted)], 10**6)
    assert good_probe.reject is None
    assert "invalid palette size" in bad_probe.reject
    monkeypatch.undo()

    def odd(self, *args, **kwargs):
        raise ZeroDivisionError("a decoder's own bug")

    monkeypatch.setattr(Image.Image, "convert", odd)
    spec = chute.ImageSpec(4, 4, 3, "png")
    results = encode.encode_chunk([("g", 0, str(good)), ("p", 1, str(paletted))], spec, 10**6)
    assert all(r.record is None and "a decoder's own bug" in r.reject for r in results)


def _fuzzed(root: Path, count: int) -> list[Path]:
    """``count`` files: PNG, JPEG, GIF, BMP, TIFF and WebP images of several modes,
    truncated, with bytes flipped, or with their header mutated (seeded)."""
    rng = random.Random(1234)
    pixels = np.random.default_rng(0).integers(0, 256, (24, 20, 3), dtype=np.uint8)
    bases = []
    for fmt, ext in (("PNG", "png"), ("JPEG", "jpg"), ("GIF", "gif"), ("BMP", "bmp"),
                     ("TIFF", "tif"), ("WEBP", "webp")):  # fmt: skip
        for mode in ("RGB", "L", "P", "RGBA", "I;16"):
            image = Image.fromarray(pixels)
            if mode == "I;16":
                if fmt not in ("PNG", "TIFF"):
                    continue
                image = Image.fromarray(pixels[..., 0].astype(np.uint16) * 257)
            elif mode != "RGB":
                if fmt == "JPEG" and mode in ("P", "RGBA"):
                    continue
                image = image.convert(mode)
            buffer = io.BytesIO()
            image.save(buffer, format=fmt)
            bases.append((ext, buffer.getvalue()))
    files = []
    for number in range(count):
        ext, data = bases[number % len(bases)]
        data = bytearray(data)
        kind = number % 4
        if kind == 0:  # truncated
            data = data[: rng.randrange(1, len(data))]
        elif kind == 1:  # bytes flipped anywhere
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 2:  # header mutated
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(min(64, len(data)))] = rng.randrange(256)
        path = root / f"c{number % 3}" / f"{number:04d}.{ext}"  # kind 3: intact
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(data))
        files.append(path)
    return files


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {},  # every option left to the files (auto: probed headers)
        {"image_size": 16, "resize": "crop", "color_mode": "rgb", "encoding": "png"},
        {"keep_size": True, "color_mode": "grayscale", "encoding": "jpeg"},
    ],
    ids=["auto", "every-option", "keep-size"],
)
def test_a_fuzzed_corpus_converts_with_every_file_stored_or_rejected(tmp_path, options):
    src = tmp_path / "src"
    files = _fuzzed(src, 540)
    out = tmp_path / "out"
    if not options:
        options = {"image_size": 16}  # sizes differ: auto would refuse (a clear error)
        options["color_mode"] = "auto"
    result = chute.convert(src, out, workers=2, val_fraction=0.1, **options)
    stored = {r["key"] for split in result.manifest.splits for r in all_records(out, split)}
    rejected = {r["key"] for r in result.manifest.rejects}
    dropped = {k for group in result.manifest.duplicates for k in group["dropped"]}
    keys = {str(path.relative_to(src)) for path in files}
    assert stored | rejected | dropped == keys
    assert not stored & rejected
    assert all(r["reason"] for r in result.manifest.rejects)
    assert stored and rejected  # the corpus has both
    assert chute.verify(out).ok


def test_workers_ignore_modules_in_the_current_directory(tmp_path, monkeypatch):
    """A numpy.py (or any module) in the current directory must not run in workers."""
    src = tmp_path / "src"
    for c in range(2):
        for i in range(40):
            path = src / f"k{c}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((4, 4), 40 * c + i, np.uint8)).save(path)
    here = tmp_path / "here"
    here.mkdir()
    marker = tmp_path / "ran"
    (here / "numpy.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError\n")
    monkeypatch.chdir(here)
    chute.convert(src, tmp_path / "out", workers=2)
    assert not marker.exists()
    assert chute.load_manifest(tmp_path / "out").num_examples("train") == 80


def test_pillows_bomb_guard_stays_on_in_the_host_process():
    from chute.ingest import convert, workers  # noqa: F401  (importing must not lift it)

    assert Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS > 0


@contextlib.contextmanager
def _fifo(path: Path):
    """A named pipe at ``path``; on the way out, a reader still waiting in ``open()`` (the
    old code's worker) is let go: a writer opens it, and the reader reads an empty file."""
    os.mkfifo(path)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):  # ENXIO: nobody is waiting on it
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.timeout(60)  # the old code waited in open() for ever: fail rather than hang
def test_a_fifo_named_like_an_image_is_rejected_not_opened(tmp_path):
    src = make_folder(tmp_path / "src", {"cat": 4, "dog": 4})
    with _fifo(src / "cat" / "pipe.png"):
        result = chute.convert(src, tmp_path / "out", workers=1, val_fraction=0.25)
    reasons = {r["key"]: r["reason"] for r in result.manifest.rejects}
    assert list(reasons) == ["cat/pipe.png"]
    assert "not a regular file" in reasons["cat/pipe.png"] and "pipe" in reasons["cat/pipe.png"]
    assert sum(result.manifest.num_examples(s) for s in result.manifest.splits) == 8


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.timeout(60)
def test_reading_a_fifo_or_a_device_is_a_reject_with_its_reason(tmp_path):
    with _fifo(tmp_path / "pipe.png") as pipe:
        with pytest.raises(Rejected, match="not a regular file: a named pipe"):
            read_file(str(pipe))
        probe = decoding.probe_chunk([str(pipe)], 10**6)[0]
        assert probe.reject is not None and "not a regular file: a named pipe" in probe.reject
    if os.path.exists("/dev/zero"):  # a device would stream without end
        with pytest.raises(Rejected, match="not a regular file: a character device"):
            read_file("/dev/zero")
