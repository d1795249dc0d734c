"""Sources in a bucket (moto's S3 server on 127.0.0.1): a .zip, a .tar and a .tar.gz of
class folders, Hugging Face Parquet files, and CSV lists (paths relative to the list in
the bucket, or whole s3:// URLs) convert through chute.format.storage to the same shards
as the same source on local disk.

How each is read: a folder, a plain .tar and a .zip are read in place (the listing, then
each member by a ranged read; a zip's central directory by seeks); a CSV list and its
images are read object by object; a compressed tar is streamed once through its
decompressor into a local scratch folder and Parquet files' image bytes into one local
scratch file (as for a local source: their members cannot be read by offset).
"""

from __future__ import annotations

import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import make_folder
from ingest.test_parquet import _hf_metadata, _png, _write
from object_stores import new_s3_bucket

import chute
from chute.errors import ChuteError
from chute.format import storage

pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def bucket(s3_endpoint) -> str:
    return new_s3_bucket(s3_endpoint)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """3 classes of tiny PNGs: ``images/<class>/<n>.png``."""
    return make_folder(tmp_path_factory.mktemp("bucket-src") / "images", {"a": 4, "b": 3, "c": 3})


def _upload(local: Path, url: str) -> None:
    if local.is_dir():
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            storage.write_atomic(f"{url}/{path.relative_to(local).as_posix()}", path.read_bytes())
    else:
        storage.write_atomic(url, local.read_bytes())


def _shards(out: Path | str) -> dict[str, list[str]]:
    """Each split's shards as their sha256: equal when the records are byte for byte."""
    manifest = chute.load_manifest(str(out))
    return {name: [s.sha256 for s in split.shards] for name, split in manifest.splits.items()}


def _same_as_local(source: Path, remote: str, tmp_path: Path, **options) -> None:
    """``remote`` (a copy of ``source`` in the bucket) converts to the shards ``source`` does."""
    _upload(source, remote)
    options = {"val_fraction": 0.25, "workers": 1, **options}
    chute.convert(str(source), tmp_path / "local", **options)
    chute.convert(remote, tmp_path / "remote", **options)
    assert _shards(tmp_path / "remote") == _shards(tmp_path / "local")


def _archive(images: Path, path: Path) -> Path:
    if path.suffix == ".zip":
        with zipfile.ZipFile(path, "w") as archive:
            for file in sorted(images.rglob("*.png")):
                archive.write(file, file.relative_to(images).as_posix())
    else:
        with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as archive:
            for file in sorted(images.rglob("*.png")):
                archive.add(file, file.relative_to(images).as_posix())
    return path


@pytest.mark.parametrize("name", ["images.zip", "images.tar", "images.tar.gz"])
def test_an_archive_in_a_bucket_converts_as_on_local_disk(bucket, images, tmp_path, name):
    archive = _archive(images, tmp_path / name)
    _same_as_local(archive, f"{bucket}/archives/{name}", tmp_path)


def test_parquet_files_in_a_bucket_convert_as_on_local_disk(bucket, tmp_path):
    hub = tmp_path / "hub"
    for name, seeds in {
        "train-00000-of-00001": range(8),
        "test-00000-of-00001": range(8, 12),
    }.items():
        rows = [(f"{seed}.png", _png(seed), seed % 3) for seed in seeds]
        _write(hub / "data" / f"{name}.parquet", rows, metadata=_hf_metadata())
    _same_as_local(hub, f"{bucket}/hub", tmp_path, val_fraction=0.0)
    # one .parquet file by itself too
    one = hub / "data" / "train-00000-of-00001.parquet"
    chute.convert(f"{bucket}/hub/data/{one.name}", tmp_path / "one", workers=1)
    assert chute.load_manifest(str(tmp_path / "one")).splits["train"].examples == 8


def test_a_csv_list_in_a_bucket_reads_paths_relative_to_it(bucket, images, tmp_path):
    folder = tmp_path / "listed"
    shutil.copytree(images, folder / "pics")
    rows = ["path,label"] + [
        f"pics/{p.relative_to(images).as_posix()},{p.parent.name}"
        for p in sorted(images.rglob("*.png"))
    ]
    (folder / "list.csv").write_text("\n".join(rows) + "\n")
    _upload(folder, f"{bucket}/listed")
    chute.convert(str(folder / "list.csv"), tmp_path / "local", val_fraction=0.25, workers=1)
    chute.convert(f"{bucket}/listed/list.csv", tmp_path / "remote", val_fraction=0.25, workers=1)
    assert _shards(tmp_path / "remote") == _shards(tmp_path / "local")


def test_a_csv_list_in_a_bucket_may_name_whole_urls(bucket, images, tmp_path):
    _upload(images, f"{bucket}/elsewhere")
    rows = ["path,label"] + [
        f"{bucket}/elsewhere/{p.relative_to(images).as_posix()},{p.parent.name}"
        for p in sorted(images.rglob("*.png"))
    ]
    storage.write_atomic(f"{bucket}/lists/urls.csv", ("\n".join(rows) + "\n").encode())
    with pytest.raises(chute.ChuteError, match="inside the list's folder"):
        chute.convert(f"{bucket}/lists/urls.csv", tmp_path / "refused", workers=1)
    chute.convert(f"{bucket}/lists/urls.csv", tmp_path / "out", workers=1, allow_outside=True)
    manifest = chute.load_manifest(str(tmp_path / "out"))
    assert manifest.class_names == ["a", "b", "c"] and manifest.splits["train"].examples == 10


def test_keys_with_an_empty_folder_name_in_a_bucket_folder_are_rejected_not_lost(
    bucket, images, tmp_path
):
    folder = f"{bucket}/slashes"
    _upload(images, folder)
    png = (images / "a" / "000.png").read_bytes()
    for key in ("a//extra.png", "b/deeper//more.png"):  # no folder walk reaches these
        storage.write_atomic(f"{folder}/{key}", png)
    chute.convert(folder, tmp_path / "out", workers=1)
    manifest = chute.load_manifest(str(tmp_path / "out"))
    assert sum(split.examples for split in manifest.splits.values()) == 10  # the reachable ones
    rejected = {entry["key"]: entry["reason"] for entry in manifest.rejects}
    assert set(rejected) == {"a//extra.png", "b/deeper//more.png"}, rejected
    assert all("empty folder name ('//')" in reason for reason in rejected.values())


@pytest.mark.parametrize("inside", ["src/out", "src", "src//out/", "src/a/deeper"])
def test_an_output_inside_a_bucket_source_is_refused_as_a_local_one_is(bucket, images, inside):
    """#38 item 9: refused before anything is written (the lock object, made before the
    scan, used to be read as a class 'out' of the source)."""
    source = f"{bucket}/inside/src"
    _upload(images, source)
    before = storage.glob(f"{source}/**")
    with pytest.raises(ChuteError, match="`output` must not be inside the source folder"):
        chute.convert(f"{source}/", f"{bucket}/inside/{inside}", workers=1)
    assert storage.glob(f"{source}/**") == before
    # beside it, not inside: converted (a name that merely starts with the source's)
    chute.convert(source, f"{bucket}/inside/src-out", workers=1)
    assert chute.load_manifest(f"{bucket}/inside/src-out").class_names == ["a", "b", "c"]
