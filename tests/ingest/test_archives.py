"""Archives as sources: zip and tar (plain and compressed) trees, WebDataset shards.

An archive must convert exactly as the folder Python extracts from it does (same
shards byte for byte, same rejects.csv); unsafe names, bombs and damage are
rejected with reasons, never read outside the archive nor into memory whole.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
import tracemalloc
import zipfile
import zlib
from collections import Counter
from pathlib import Path

import pytest
from helpers import all_records, make_folder, run_here, write_image

import chute
from chute.errors import ChuteError
from chute.ingest import sources
from chute.ingest.sources import members, tars, webdataset
from chute.tools.inspect import inspect

OPTIONS = {"val_fraction": 0.25, "workers": 1}


def make_tree(top: Path, *, per_class: int = 4) -> Path:
    """``top/Images_with_noise/<a|b|c>/…`` beside ``__MACOSX`` litter, hidden files, a nested
    folder, a non-image, and two bad images (one cut short, one empty); returns ``top``."""
    root = make_folder(top / "Images_with_noise", {"a": per_class, "b": per_class, "c": 3})
    write_image(root / "c" / "nested" / "deep.png", seed=77)
    whole = (root / "a" / "000.png").read_bytes()
    (root / "a" / "cut.png").write_bytes(whole[: len(whole) // 2])  # header fine, data cut
    (root / "b" / "empty.png").write_bytes(b"")
    (root / "b" / ".hidden.png").write_bytes(whole)
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "README.txt").write_text("not an image")
    litter = top / "__MACOSX" / "Images_with_noise" / "a"
    litter.mkdir(parents=True)
    (litter / "._000.png").write_bytes(b"\0\5\26\7AppleDouble")
    return top


def zip_folder(folder: Path, archive: Path) -> Path:
    """Every file and folder under ``folder`` (sorted) into a deflated zip."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for path in sorted(folder.rglob("*")):
            out.write(path, path.relative_to(folder).as_posix())
    return archive


def tar_folder(folder: Path, archive: Path, mode: str = "w") -> Path:
    """``folder``'s content as ``./…`` members (as ``tar -C folder .`` writes them)."""
    with tarfile.open(archive, mode) as out:
        out.add(folder, arcname=".")
    return archive


def extract(archive: Path, folder: Path) -> Path:
    """Python's own extraction of ``archive`` into ``folder``."""
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as opened:
            opened.extractall(folder)
    else:
        with tarfile.open(archive) as opened:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            opened.extractall(folder, **safe)
    return folder


def outputs(out: Path) -> dict[str, bytes]:
    """The shards and rejects.csv of a conversion (the manifest names its source)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(out.iterdir())
        if p.name.endswith(".tfrecord") or p.name == "rejects.csv"
    }


def assert_same_conversion(archive_out: Path, folder_out: Path) -> None:
    archived, extracted = chute.load_manifest(archive_out), chute.load_manifest(folder_out)
    assert archived.class_names == extracted.class_names
    assert archived.splits == extracted.splits  # counts, shard names, sizes and sha256
    assert archived.rejects == extracted.rejects
    assert archived.source["fingerprint"] == extracted.source["fingerprint"]
    assert outputs(archive_out) == outputs(folder_out)


# -- class trees --------------------------------------------------------------------------


def test_zip_with_a_top_folder_and_litter_converts_as_its_extracted_folder(tmp_path):
    archive = zip_folder(make_tree(tmp_path / "made"), tmp_path / "data.zip")
    folder = extract(archive, tmp_path / "extracted") / "Images_with_noise"
    result = chute.convert(archive, tmp_path / "from-zip", **OPTIONS)
    chute.convert(folder, tmp_path / "from-folder", **OPTIONS)
    assert_same_conversion(tmp_path / "from-zip", tmp_path / "from-folder")
    manifest = result.manifest
    assert manifest.source["kind"] == "zip"
    assert manifest.class_names == ["a", "b", "c"]
    assert {r["key"] for r in manifest.rejects} == {"a/cut.png", "b/empty.png"}
    assert result.num_written == {"train": 9, "val": 3}  # 4 + 4 + 3 + deep.png
    assert "(zip, 14 items)" in inspect(tmp_path / "from-zip")


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"])
def test_tar_converts_as_its_extracted_folder_and_leaves_no_temporary_files(
    tmp_path, monkeypatch, suffix
):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where compressed tars unpack
    mode = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.bz2": "w:bz2"}.get(suffix, "w:xz")
    archive = tar_folder(make_tree(tmp_path / "made"), tmp_path / f"data{suffix}", mode)
    folder = extract(archive, tmp_path / "extracted") / "Images_with_noise"
    result = chute.convert(archive, tmp_path / "from-tar", encoding="png", **OPTIONS)
    chute.convert(folder, tmp_path / "from-folder", encoding="png", **OPTIONS)
    assert_same_conversion(tmp_path / "from-tar", tmp_path / "from-folder")
    assert result.manifest.source["kind"] == "tar"
    assert list(temp.iterdir()) == []


def test_presplit_tree_in_a_zip_keeps_its_splits(tmp_path):
    made = tmp_path / "made" / "flowers"
    make_folder(made / "train", {"daisy": 4, "rose": 3})
    make_folder(made / "validation", {"daisy": 2, "rose": 2}, seed=1)
    archive = zip_folder(tmp_path / "made", tmp_path / "flowers.zip")
    found = sources.scan(str(archive))
    assert found.presplit and found.kind == "zip"
    assert {item.key: item.split for item in found.items}["validation/rose/001.png"] == "val"
    folder = extract(archive, tmp_path / "extracted") / "flowers"
    result = chute.convert(archive, tmp_path / "a", workers=1)
    chute.convert(folder, tmp_path / "b", workers=1)
    assert result.num_written == {"train": 7, "val": 4}
    assert_same_conversion(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_tar_member_names_that_are_not_utf8_convert_as_the_extracted_folder(tmp_path, mode):
    """GNU tar members named in latin-1 (é as the byte 0xe9): keys escape the byte as
    ``\\xe9``, as the extracted folder's do, and nothing crashes after a shard is written."""
    made = make_folder(tmp_path / "made", {"a": 2, "b": 2})
    png = write_image(tmp_path / "x.png", seed=11).read_bytes()
    archive = tmp_path / ("latin.tar" + (".gz" if mode.endswith("gz") else ""))
    with tarfile.open(archive, mode, format=tarfile.GNU_FORMAT, encoding="latin-1") as out:
        out.add(made, arcname=".")
        for name, data in (("a/café.png", png), ("b/déjà.png", b"\x89PNG\r\n\x1a\n cut")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    found = sources.scan(str(archive))
    assert {"a/caf\\xe9.png", "b/d\\xe9j\\xe0.png"} <= {i.key for i in found.items}
    found.close()
    folder = extract(archive, tmp_path / "extracted")
    assert os.path.exists(os.fsencode(folder) + b"/a/caf\xe9.png")
    result = chute.convert(archive, tmp_path / "from-tar", **OPTIONS)
    chute.convert(folder, tmp_path / "from-folder", **OPTIONS)
    assert_same_conversion(tmp_path / "from-tar", tmp_path / "from-folder")
    assert [r["key"] for r in result.manifest.rejects] == ["b/d\\xe9j\\xe0.png"]
    keys = {
        r["key"] for split in ("train", "val") for r in all_records(tmp_path / "from-tar", split)
    }
    assert "a/caf\\xe9.png" in keys
    assert "b/d\\xe9j\\xe0.png," in (tmp_path / "from-tar" / "rejects.csv").read_text("utf-8")


def test_class_root_members_stored_twice_backslashes_and_dot_slash(tmp_path):
    archive = tmp_path / "odd.zip"
    write_image(tmp_path / "x.png", seed=1)
    other = write_image(tmp_path / "y.png", seed=2).read_bytes()
    png = (tmp_path / "x.png").read_bytes()
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("./wrap/cats/1.png", png)
        out.writestr("wrap\\dogs\\1.png", png)  # a Windows tool's separators
        out.writestr("wrap/cats/1.png", other)  # stored again: the last copy counts
        out.writestr("wrap/loose.txt", b"notes")
    found = sources.scan(str(archive))
    assert found.class_names == ["cats", "dogs"]
    assert [item.key for item in found.items] == ["cats/1.png", "dogs/1.png"]
    assert members.read_member(found.payload(found.items[0]), 10**6) == other
    # one class folder only (no sub-folders below it): it is the class, not the root
    single = tmp_path / "single.zip"
    with zipfile.ZipFile(single, "w") as out:
        out.writestr("cats/1.png", png)
    assert sources.scan(str(single)).class_names == ["cats"]


def test_links_inside_are_followed_and_names_leaving_the_archive_are_refused(tmp_path):
    png = write_image(tmp_path / "x.png", seed=3).read_bytes()
    (tmp_path / "secret.png").write_bytes(png)  # what an escaping name would reach
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as out:

        def add(name, data=b"", kind=tarfile.REGTYPE, target=""):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, target, len(data)
            out.addfile(info, io.BytesIO(data) if data else None)

        add("d/a/1.png", png)
        add("d/b/1.png", png)
        add("d/b/same.png", kind=tarfile.SYMTYPE, target="../a/1.png")
        add("d/b/hard.png", kind=tarfile.LNKTYPE, target="d/a/1.png")
        add("d/a/up.png", kind=tarfile.SYMTYPE, target="../../../secret.png")
        add("d/a/abs.png", kind=tarfile.SYMTYPE, target=str(tmp_path / "secret.png"))
        add("d/a/hardout.png", kind=tarfile.LNKTYPE, target="../secret.png")
        add("d/a/gone.png", kind=tarfile.SYMTYPE, target="nothing.png")
        add("../escape.png", png)
        add("/abs/root.png", png)
        add("C:/windows.png", png)
        add("d/a/../../x.png", png)
        add("../notes.md", b"not an image: logged, not rejected")
    found = sources.scan(str(archive))
    assert sorted(item.key for item in found.items) == [
        "a/1.png",
        "b/1.png",
        "b/hard.png",
        "b/same.png",
    ]
    reasons = {r["key"]: r["reason"] for r in found.rejects}
    assert reasons == {
        "a/up.png": "a link to '../../../secret.png', outside the archive",
        "a/abs.png": f"a link to {str(tmp_path / 'secret.png')!r}, outside the archive",
        "a/hardout.png": "a link to '../secret.png', outside the archive",
        "a/gone.png": "a link to 'd/a/nothing.png', which the archive lacks",
        "../escape.png": "unsafe name: it leaves the archive (..)",
        "/abs/root.png": "unsafe name: an absolute path",
        "C:/windows.png": "unsafe name: it starts with a drive letter",
        "d/a/../../x.png": "unsafe name: it leaves the archive (..)",
    }
    linked = found.payload(next(i for i in found.items if i.key == "b/same.png"))
    assert linked.name == "d/a/1.png"  # the link reads the member it points to
    result = chute.convert(archive, tmp_path / "out", workers=1)
    assert result.num_written == {"train": 4}
    assert {r["key"] for r in result.manifest.rejects} == set(reasons)


def test_zip_symlink_members_stay_inside(tmp_path):
    png = write_image(tmp_path / "x.png", seed=4).read_bytes()
    archive = tmp_path / "links.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("a/1.png", png)
        out.writestr("b/1.png", png)
        for name, target in (("b/in.png", "../a/1.png"), ("b/out.png", "../../etc/passwd.png")):
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16) | 0x20  # a symbolic link, as Info-ZIP writes
            out.writestr(info, target)
    found = sources.scan(str(archive))
    assert [i.key for i in found.items] == ["a/1.png", "b/1.png", "b/in.png"]
    assert found.rejects == [
        {"key": "b/out.png", "reason": "a link to '../../etc/passwd.png', outside the archive"}
    ]


def bomb_zip(path: Path, megabytes: int) -> Path:
    """A zip of two real images and a PNG header followed by a run of zeros (a bomb)."""
    write_image(path.parent / "h.png", size=(4, 4))
    header = (path.parent / "h.png").read_bytes()[:33]  # signature + IHDR
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for name in ("a/1.png", "b/1.png"):
            out.write(write_image(path.parent / "img.png", seed=len(name)), name)
        with out.open("a/bomb.png", "w", force_zip64=True) as member:
            member.write(header)
            zeros = bytes(1 << 20)
            for _ in range(megabytes):
                member.write(zeros)
    return path


def test_zip_bomb_is_rejected_without_reading_it_into_memory(tmp_path):
    archive = bomb_zip(tmp_path / "bomb.zip", 64)
    assert archive.stat().st_size < 1 << 20  # 64 MiB of zeros deflate to ~64 KiB
    # every option given: no header is read first, the encoder reads each member whole
    fixed = {"image_size": 4, "color_mode": "grayscale", "encoding": "raw", "workers": 1}
    tracemalloc.start()
    started = time.perf_counter()
    try:
        result = chute.convert(archive, tmp_path / "out", **fixed)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # the member is never read whole
    assert time.perf_counter() - started < 30
    (reject,) = result.manifest.rejects
    assert reject["key"] == "a/bomb.png"
    assert "compression bomb" in reject["reason"] and "-fold" in reject["reason"]
    assert result.num_written == {"train": 2}
    # options left to the headers: the header reader refuses it for the same reason
    probed = chute.convert(archive, tmp_path / "probed", workers=1, encoding="auto")
    assert probed.manifest.rejects == result.manifest.rejects


def test_declared_sizes_past_the_limit_are_rejected_before_reading(tmp_path):
    """A member larger than any image within --max-pixels is refused from its declared
    size; a central directory that lies about it (a small file claiming 4 GB) too."""
    archive = tmp_path / "sizes.zip"
    png = write_image(tmp_path / "x.png", seed=5).read_bytes()
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("a/1.png", png)
        out.writestr("b/1.png", write_image(tmp_path / "y.png", seed=6).read_bytes())
        out.writestr("b/big.png", png + bytes(1_200_000))  # stored: no ratio, only the size
        out.writestr("b/liar.png", png)
    data = bytearray(archive.read_bytes())
    entry = data.rindex(b"PK\x01\x02")  # the last central directory entry: b/liar.png
    data[entry + 24 : entry + 28] = (0xFFFF_FFF0).to_bytes(4, "little")  # uncompressed size
    archive.write_bytes(bytes(data))
    result = chute.convert(archive, tmp_path / "out", workers=1, max_pixels=10_000)
    reasons = {r["key"]: r["reason"] for r in result.manifest.rejects}
    limit = members.max_member_bytes(10_000)
    assert reasons == {
        "b/big.png": f"archive member too large: {len(png) + 1_200_000} bytes > {limit}, the most "
        "an image within max_pixels 10000 can take",
        "b/liar.png": f"archive member too large: {0xFFFF_FFF0} bytes > {limit}, the most an "
        "image within max_pixels 10000 can take",
    }


@pytest.mark.parametrize(
    ("name", "max_pixels"),
    [("a/1.png", 10**6), ("a/1.png", 1000), ("a/notes.bin", 10**6)],
    ids=["unpacked", "too-large-to-unpack", "not-an-image"],
)
def test_compressed_tar_data_expanding_past_the_budget_is_a_bomb(
    tmp_path, monkeypatch, name, max_pixels
):
    """Data that really expands more than 1000-fold (past the floor, 1 MiB here) is refused
    while it is decompressed, whether the member would be copied, is too large to be, or
    is no image: nothing of it stays on disk."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(tars, "UNPACK_FLOOR", 1 << 20)
    archive = tmp_path / "bomb.tar.bz2"
    zeros = bytes(8 << 20)
    with tarfile.open(archive, "w:bz2") as out:
        out.addfile(_info("b/1.png", 3), io.BytesIO(b"png"))
        out.addfile(_info(name, len(zeros)), io.BytesIO(zeros))
    assert archive.stat().st_size < 2000  # 8 MiB of zeros
    with pytest.raises(ChuteError, match=r"expands more than 1000-fold.*compression bomb"):
        sources.scan(str(archive), max_pixels=max_pixels)
    assert list(temp.iterdir()) == []


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


@pytest.mark.parametrize(("suffix", "compress"), [(".gz", gzip.compress), (".bz2", bz2.compress)])
def test_a_header_claiming_more_than_the_archive_holds_rejects_that_member_only(
    tmp_path, suffix, compress
):
    """The last header claims 8 GiB and the archive ends: the compressed tar converts as the
    same plain tar does (that member rejected as too large), not as a compression bomb."""
    made = make_folder(tmp_path / "made", {"a": 3, "b": 3})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out:
        out.add(made, arcname=".")
        end = out.offset  # before the end-of-archive blocks
    claim = _info("b/huge.png", 8 << 30).tobuf(tarfile.GNU_FORMAT)
    data = buffer.getvalue()[:end] + claim + bytes(2 * tarfile.BLOCKSIZE)
    plain, packed = tmp_path / "claim.tar", tmp_path / f"claim.tar{suffix}"
    plain.write_bytes(data)
    packed.write_bytes(compress(data))
    results = [chute.convert(path, tmp_path / f"out{path.suffix}", **OPTIONS)
               for path in (plain, packed)]  # fmt: skip
    (reject,) = results[1].manifest.rejects
    assert reject["key"] == "b/huge.png"
    assert reject["reason"].startswith(f"archive member too large: {8 << 30} bytes > ")
    assert results[0].manifest.rejects == results[1].manifest.rejects
    assert results[0].num_written == results[1].num_written == {"train": 4, "val": 2}
    assert outputs(tmp_path / "out.tar") == outputs(tmp_path / f"out{suffix}")


def test_compressed_tar_members_too_large_are_not_unpacked(tmp_path):
    # A member too large for --max-pixels is skipped while unpacking, then rejected.
    archive = tmp_path / "big.tar.gz"
    made = make_folder(tmp_path / "made", {"a": 2, "b": 2})
    (made / "b" / "big.png").write_bytes((made / "a" / "000.png").read_bytes() + bytes(2 << 20))
    tar_folder(made, archive, "w:gz")
    found = sources.scan(str(archive), max_pixels=1000)
    big = found.payload(next(i for i in found.items if i.key == "b/big.png"))
    assert big.offset == -1
    assert os.path.getsize(big.container) < 10_000  # only the small images were unpacked
    found.close()
    assert not os.path.exists(found.temp_dir)
    result = chute.convert(archive, tmp_path / "out", workers=1, max_pixels=1000)
    (reject,) = result.manifest.rejects
    assert reject["key"] == "b/big.png" and "archive member too large" in reject["reason"]


def test_truncated_members_and_corrupt_zip_data_are_rejected_with_reasons(tmp_path):
    made = make_folder(tmp_path / "made", {"a": 3, "b": 3})
    (made / "b" / "last.png").write_bytes(
        write_image(tmp_path / "big.png", size=(60, 60)).read_bytes()
    )
    plain = tar_folder(made, tmp_path / "data.tar")
    data = plain.read_bytes()
    with tarfile.open(plain) as opened:
        last = opened.getmember("./b/last.png")
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: last.offset_data + last.size // 2])  # ends inside b/last.png
    found = sources.scan(str(cut))
    assert found.class_names == ["a", "b"] and len(found.items) == 7
    result = chute.convert(cut, tmp_path / "out-tar", workers=1, encoding="auto")
    (reject,) = result.manifest.rejects
    assert reject == {
        "key": "b/last.png",
        "reason": f"truncated archive member: the archive ends {last.size // 2} bytes into its "
        f"{last.size}",
    }
    # A compressed tar cut inside the same member: the same reject.
    packed = tar_folder(made, tmp_path / "data.tar.gz", "w:gz")
    cut_gz = tmp_path / "cut.tar.gz"
    whole = zlib.decompress(packed.read_bytes(), 31)
    cut_gz.write_bytes(_gzip(whole[: last.offset_data + last.size // 2]))
    result = chute.convert(cut_gz, tmp_path / "out-gz", workers=1, encoding="auto")
    assert [r["key"] for r in result.manifest.rejects] == ["b/last.png"]
    assert "truncated archive member" in result.manifest.rejects[0]["reason"]
    # Deflated data damaged inside a zip member: the member is rejected, the rest converted.
    archive = zip_folder(made, tmp_path / "data.zip")
    damaged = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as opened:
        info = opened.getinfo("b/last.png")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for i in range(start + 20, start + 60):
        damaged[i] ^= 0x55
    archive.write_bytes(bytes(damaged))
    result = chute.convert(archive, tmp_path / "out-zip", workers=1)
    (reject,) = result.manifest.rejects
    assert reject["key"] == "b/last.png"
    assert reject["reason"].startswith("corrupt archive member: ")


def _gzip(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


def test_unreadable_archives_are_errors_naming_the_source(tmp_path):
    made = make_folder(tmp_path / "made", {"a": 2, "b": 2})
    half = zip_folder(made, tmp_path / "half.zip")
    half.write_bytes(half.read_bytes()[: half.stat().st_size // 2])  # central directory lost
    with pytest.raises(ChuteError, match=r"not a readable zip archive. Received: source=.*half"):
        sources.scan(str(half))
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"this is no tar archive at all" * 40)
    with pytest.raises(ChuteError, match="not a readable tar archive"):
        sources.scan(str(garbage))
    (tmp_path / "data.rar").write_bytes(b"Rar!\x1a\x07\x00")
    with pytest.raises(ChuteError, match=r"\.zip, \.tar, \.tar\.gz.*Received: source=.*data\.rar"):
        sources.scan(str(tmp_path / "data.rar"))


def test_cli_exits_2_on_corrupt_and_unsupported_archives_without_traceback(tmp_path):
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 but nothing more")
    (tmp_path / "data.7z").write_bytes(b"7z\xbc\xaf\x27\x1c")
    for name, says in (
        ("bad.zip", "not a readable zip archive"),
        ("data.7z", ".tar.xz, .txz archive"),
    ):
        done = run_here("convert", tmp_path / name, tmp_path / "out", "--no-progress")
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert says in done.stderr and name in done.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("suffix", [".zip", ".tar.gz"])
def test_worker_processes_read_members_themselves(tmp_path, suffix):
    made = make_folder(tmp_path / "made" / "top", {"a": 40, "b": 30})  # > 64: worker processes
    if suffix == ".zip":
        archive = zip_folder(tmp_path / "made", tmp_path / "data.zip")
    else:
        archive = tar_folder(tmp_path / "made", tmp_path / "data.tar.gz", "w:gz")
    chute.convert(archive, tmp_path / "two", val_fraction=0.2, workers=2)
    chute.convert(made, tmp_path / "folder", val_fraction=0.2, workers=1)
    assert_same_conversion(tmp_path / "two", tmp_path / "folder")


def test_a_changed_archive_is_detected_on_a_rerun(tmp_path):
    made = make_folder(tmp_path / "made", {"a": 3, "b": 3})
    archive = zip_folder(made, tmp_path / "data.zip")
    chute.convert(archive, tmp_path / "out", workers=1)
    again = chute.convert(archive, tmp_path / "out", workers=1)
    assert again.already_done
    write_image(made / "b" / "new.png", seed=99)
    zip_folder(made, archive)
    os.utime(archive, ns=(1, 1))  # whatever the clock's resolution
    with pytest.raises(ChuteError, match=f"source` changed .*changed {archive}"):
        chute.convert(archive, tmp_path / "out", workers=1)


def test_progress_reports_unpacked_bytes(tmp_path):
    archive = tar_folder(
        make_folder(tmp_path / "made", {"a": 3, "b": 3}), tmp_path / "d.tgz", "w:gz"
    )
    calls = []
    chute.convert(archive, tmp_path / "out", workers=1, progress=lambda *c: calls.append(c))
    unpack = [c for c in calls if c[0] == "unpack"]
    assert unpack and unpack[-1][1:] == (archive.stat().st_size, archive.stat().st_size)
    assert ("write", 6, 6) in calls


# -- WebDataset ---------------------------------------------------------------------------


def write_shards(
    folder: Path, samples: list[tuple[str, dict[str, bytes]]], per_shard: int, name="shard"
) -> list[Path]:
    """``folder/{name}-000000.tar``, … holding ``per_shard`` samples each."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number in range(0, len(samples), per_shard):
        path = folder / f"{name}-{number // per_shard:06d}.tar"
        with tarfile.open(path, "w") as out:
            for key, files in samples[number : number + per_shard]:
                for extension, data in files.items():
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(data)
                    out.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def samples_of(folder: Path, label=lambda name, index: name.encode(), ext="cls") -> list:
    """WebDataset samples of a class folder's images, labelled by ``label(class, index)``."""
    names = sorted(p.name for p in folder.iterdir())
    out = []
    for image in sorted(folder.rglob("*.png")):
        cls = image.parent.name
        key = f"{cls}_{image.stem}"
        out.append((key, {"png": image.read_bytes(), ext: label(cls, names.index(cls))}))
    return out


def pixels_by_class(out: Path) -> Counter:
    manifest = chute.load_manifest(out)
    return Counter(
        (manifest.class_names[r["class"]], r["image"])
        for split in manifest.splits
        for r in all_records(out, split)
    )


def test_webdataset_brace_pattern_converts_as_the_equivalent_folder(tmp_path):
    folder = make_folder(tmp_path / "folder", {"3": 3, "10": 3, "7": 4})
    samples = samples_of(folder, label=lambda name, _: name.encode())
    write_shards(tmp_path / "wds", samples, per_shard=3)  # shard-000000..000003
    pattern = str(tmp_path / "wds" / "shard-{000000..000003}.tar")
    found = sources.scan(pattern)
    assert found.kind == "webdataset"
    assert found.class_names == ["3", "7", "10"]  # integer labels sort numerically
    assert found.items[0].key == "shard-000000.tar/10_000.png"
    result = chute.convert(pattern, tmp_path / "out", encoding="png", **OPTIONS)
    chute.convert(folder, tmp_path / "ref", encoding="png", **OPTIONS)
    folder_names = chute.load_manifest(tmp_path / "ref").class_names
    assert folder_names == ["10", "3", "7"]  # folder names sort as text, labels as numbers
    assert sorted(result.manifest.class_names) == sorted(folder_names)
    assert result.num_written == {"train": 8, "val": 2}
    assert pixels_by_class(tmp_path / "out") == pixels_by_class(tmp_path / "ref")
    assert "(webdataset, 10 items)" in inspect(tmp_path / "out")


def test_webdataset_glob_with_cls_txt_and_json_labels(tmp_path):
    folder = make_folder(tmp_path / "folder", {"cat": 2, "dog": 2, "owl": 2})
    index = {"cat": 0, "dog": 1, "owl": 2}
    write_shards(tmp_path / "w", samples_of(folder, lambda n, _: b"%d\n" % index[n]), 6, "cls")
    write_shards(
        tmp_path / "w", samples_of(folder, lambda n, _: b" 0%d " % index[n], "txt"), 6, "txt"
    )
    write_shards(
        tmp_path / "w",
        samples_of(folder, lambda n, _: json.dumps({"label": index[n]}).encode(), "json"),
        6,
        "json",
    )
    found = sources.scan(str(tmp_path / "w" / "*.tar"))
    assert found.class_names == ["0", "1", "2"]
    assert Counter(item.label for item in found.items) == {0: 6, 1: 6, 2: 6}
    # class names, and a JSON object's "cls"
    named = tmp_path / "named"
    write_shards(named, samples_of(folder, lambda n, _: n.encode(), "txt"), 6, "a")
    write_shards(
        named, samples_of(folder, lambda n, _: json.dumps({"cls": n}).encode(), "json"), 6, "b"
    )
    found = sources.scan(str(named / "{a,b}-000000.tar"))
    assert found.class_names == ["cat", "dog", "owl"]
    assert len(found.items) == 12 and not found.rejects


def test_webdataset_missing_and_bad_labels_are_rejected_with_reasons(tmp_path):
    png = write_image(tmp_path / "x.png", seed=8).read_bytes()
    other = write_image(tmp_path / "y.png", seed=9).read_bytes()
    samples = [
        ("s/00", {"jpg": _jpeg(tmp_path, 1), "cls": b"0"}),
        ("s/01", {"png": png, "cls": b"1"}),
        ("s/02", {"png": other, "json": b'{"label": 1}'}),
        ("s/03", {"png": png}),  # no label
        ("s/04", {"png": png, "json": b"{not json"}),
        ("s/05", {"png": png, "json": b'{"caption": "a cat"}'}),
        ("s/06", {"png": png, "cls": b"  "}),
        ("s/07", {"png": png[:40], "cls": b"0"}),  # cut short: rejected while decoding
        ("s/08", {"png": png, "json": b"true"}),
        ("s/.09", {"png": png, "cls": b"0"}),  # hidden
    ]
    (shard,) = write_shards(tmp_path / "w", samples, per_shard=10)
    found = sources.scan(str(shard))  # one tar, detected from its content
    assert found.kind == "webdataset"
    reasons = {r["key"]: r["reason"] for r in found.rejects}
    assert reasons == {
        "shard-000000.tar/s/03.png": "no label: the sample has no s/03.cls, .json or .txt member",
        "shard-000000.tar/s/04.png": "label member s/04.json: not JSON (Expecting property name "
        "enclosed in double quotes: line 1 column 2 (char 1))",
        "shard-000000.tar/s/05.png": "label member s/05.json: a JSON object without 'label' or "
        "'cls'",
        "shard-000000.tar/s/06.png": "label member s/06.cls is empty",
        "shard-000000.tar/s/08.png": "label member s/08.json: a label is an integer or a "
        "string, not True",
    }
    result = chute.convert(shard, tmp_path / "out", workers=1, image_size=8)
    assert result.num_written == {"train": 3}
    assert {r["key"] for r in result.manifest.rejects} == {
        *reasons,
        "shard-000000.tar/s/07.png",
    }


def _jpeg(tmp_path: Path, seed: int) -> bytes:
    return write_image(tmp_path / f"{seed}.jpg", seed=seed, size=(16, 16)).read_bytes()


def test_a_tar_is_webdataset_only_when_most_images_have_label_members(tmp_path):
    png = write_image(tmp_path / "x.png", seed=10).read_bytes()
    tree = tmp_path / "tree.tar"
    with tarfile.open(tree, "w") as out:
        for name, data in (("a/1.png", png), ("a/1.json", b"{}"), ("a/2.png", png),
                           ("a/3.png", png), ("b/1.png", png)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    assert sources.scan(str(tree)).kind == "tar"  # one image in four has a sidecar: a tree
    assert webdataset.looks_like(tars.list_tar(str(tree), max_pixels=1).files) is False


def test_webdataset_patterns_that_name_nothing_usable_are_errors(tmp_path):
    folder = make_folder(tmp_path / "folder", {"a": 2, "b": 2})
    write_shards(tmp_path / "w", samples_of(folder), per_shard=2)
    with pytest.raises(ChuteError, match=r"shards that do not exist \('.*shard-000002.tar'"):
        sources.scan(str(tmp_path / "w" / "shard-{000000..000002}.tar"))
    with pytest.raises(ChuteError, match="shards that do not exist"):
        sources.scan(str(tmp_path / "w" / "nothing-*.tar"))
    zip_folder(folder, tmp_path / "w" / "other.zip")
    with pytest.raises(ChuteError, match=r"must name WebDataset \.tar shards"):
        sources.scan(str(tmp_path / "w" / "*"))
    (tmp_path / "trees").mkdir()
    tar_folder(folder, tmp_path / "trees" / "t-0.tar")
    with pytest.raises(ChuteError, match="holds no such samples"):
        sources.scan(str(tmp_path / "trees" / "t-{0..0}.tar"))
    with pytest.raises(ChuteError, match="more than 100000 shards"):
        webdataset.expand_braces("s-{0..100000}.tar")
    assert webdataset.expand_braces("s-{3..1}-{a,b}") == [
        "s-3-a", "s-3-b", "s-2-a", "s-2-b", "s-1-a", "s-1-b"
    ]  # fmt: skip


def test_compressed_webdataset_shards_and_their_cleanup(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    folder = make_folder(tmp_path / "folder", {"a": 2, "b": 2})
    (plain,) = write_shards(tmp_path / "w", samples_of(folder), per_shard=4)
    with tarfile.open(plain) as source, tarfile.open(tmp_path / "w" / "gz-0.tar.gz", "w:gz") as out:
        for info in source.getmembers():
            out.addfile(info, source.extractfile(info))
    result = chute.convert(str(tmp_path / "w" / "gz-{0..0}.tar.gz"), tmp_path / "out", workers=1)
    assert result.num_written == {"train": 4}
    assert result.manifest.source["kind"] == "webdataset"
    assert list(temp.iterdir()) == []
    shutil.rmtree(tmp_path / "out")


def test_beam_runner_refuses_archive_sources_before_reading_them(tmp_path):
    pytest.importorskip("apache_beam")
    archive = zip_folder(make_folder(tmp_path / "made", {"a": 2, "b": 2}), tmp_path / "d.zip")
    for source in (archive, str(tmp_path / "shard-{0..3}.tar")):
        with pytest.raises(ChuteError, match=r"WebDataset or Parquet source.*DirectRunner"):
            chute.convert(source, tmp_path / "out", runner="DirectRunner")
    assert not (tmp_path / "out").exists()
