"""s3:// through fsspec (s3fs), against moto's S3 server on 127.0.0.1: the storage layer's
functions, a dataset converted into a bucket and read back from it, and the one-line
errors (no bucket, no credentials, no s3fs, the tf.data engine). memory:// goes through
fsspec too. No network, no cloud account: the server is tests/object_stores.py's s3_endpoint.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import numpy as np
import pytest
from helpers import make_folder, run_here
from object_stores import S3_SECRET as SECRET
from object_stores import new_s3_bucket

import chute
from chute.errors import ChuteError
from chute.format import remote, storage
from chute.read.grain.source import GrainSource

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


@pytest.fixture
def bucket(s3_endpoint) -> str:
    return new_s3_bucket(s3_endpoint)


@pytest.fixture(scope="module")
def dataset(s3_endpoint, tmp_path_factory) -> str:
    """A dataset converted from a local folder into a bucket (with the CLI)."""
    src = make_folder(tmp_path_factory.mktemp("s3src") / "src", {"a": 10, "b": 8, "c": 6})
    out = new_s3_bucket(s3_endpoint) + "/shards"
    done = run_here("-q", "convert", src, out, "--val-fraction", "0.25", "--min-shards", "2",
                    "--workers", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def _exercise(base: str) -> None:
    """Every storage function on a folder URL of an fsspec filesystem."""
    storage.makedirs(base)
    storage.write_atomic(storage.join(base, "a.txt"), b"hello")
    storage.write_atomic(storage.join(base, "sub", "b.bin"), b"12345")
    assert storage.read_bytes(storage.join(base, "a.txt")) == b"hello"
    assert storage.listdir(base) == ["a.txt", "sub"]
    assert storage.exists(base) and storage.isdir(base) and storage.isdir(base + "/sub")
    assert storage.exists(base + "/a.txt") and not storage.isdir(base + "/a.txt")
    assert not storage.exists(base + "/nothing")
    assert storage.size(base + "/sub/b.bin") == 5
    assert storage.glob(base + "/*.txt") == [base + "/a.txt"]
    walked = [(top, sorted(dirs), sorted(files)) for top, dirs, files in storage.walk(base)]
    assert walked == [(base, ["sub"], ["a.txt"]), (base + "/sub", [], ["b.bin"])]
    with storage.open_file(base + "/c.bin", "wb") as handle:
        handle.write(b"abc")
        storage.sync(handle)  # nothing to fsync: the object is written on close
    with storage.open_file(base + "/c.bin", "rb") as handle:
        handle.seek(1)
        assert handle.read(2) == b"bc"
    storage.rename(base + "/c.bin", base + "/d.bin")
    storage.copy(base + "/d.bin", base + "/e.bin")
    storage.rename(base + "/sub", base + "/moved")
    assert storage.listdir(base) == ["a.txt", "d.bin", "e.bin", "moved"]
    assert storage.read_bytes(base + "/moved/b.bin") == b"12345"
    with pytest.raises(FileNotFoundError):  # a missing object is what `open` raises
        storage.read_bytes(base + "/sub/b.bin")
    storage.remove_if_exists(base + "/e.bin")
    storage.rmtree(base)
    assert not storage.exists(base)


def test_storage_functions_on_s3(bucket):
    _exercise(bucket + "/out")


def test_memory_urls_go_through_fsspec():
    _exercise(f"memory://chute-{uuid.uuid4().hex[:8]}/out")


@pytest.mark.parametrize(
    ("path", "tensorflow"),
    [("/data/x", True), ("file:///data/x", True), ("ram://x", True), ("s3://b/x", False),
     ("memory://x", False)],
)  # fmt: skip
def test_which_paths_tensorflow_opens(path, tensorflow):
    assert storage.tensorflow_opens(path) is tensorflow


def test_a_local_copy_of_a_bucket_file(bucket, tmp_path):
    storage.write_atomic(bucket + "/x.bin", b"\x00\x01")
    storage.copy(bucket + "/x.bin", str(tmp_path / "x.bin"))
    storage.copy(str(tmp_path / "x.bin"), bucket + "/y.bin")
    assert storage.read_bytes(bucket + "/y.bin") == b"\x00\x01"


def test_inspect_and_index_a_dataset_in_a_bucket(dataset):
    assert chute.load_manifest(dataset).location == dataset
    inspected = run_here("inspect", dataset)
    assert inspected.returncode == 0 and "train" in inspected.stdout, inspected.stderr
    indexed = run_here("index", dataset, "--no-progress")
    assert indexed.returncode == 0, indexed.stderr
    assert not [name for name in storage.listdir(dataset) if name.endswith(".tmp")]


@pytest.mark.slow  # imports TensorFlow (verify decodes every record with tf.data)
def test_verify_a_dataset_in_a_bucket(dataset):
    verified = run_here("verify", dataset, "--no-progress")
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("ok: 4 shards, 24 records match"), verified.stdout


def test_convert_a_folder_that_is_in_a_bucket(bucket, tmp_path):
    src = make_folder(tmp_path / "src", {"a": 4, "b": 3})
    for path in sorted(src.rglob("*.png")):
        storage.write_atomic(f"{bucket}/src/{path.relative_to(src).as_posix()}", path.read_bytes())
    chute.convert(bucket + "/src", bucket + "/out", workers=1)
    source = GrainSource(chute.load_manifest(bucket + "/out"), "train")
    assert len(source) == 7 and {source[i]["key"] for i in range(7)} >= {"a/000.png"}


def test_the_grain_engine_reads_batches_from_a_bucket(dataset):
    train = chute.load(dataset, engine="grain", batch_size=6, seed=1, workers=0)
    batches = list(iter(train))
    assert len(batches) == len(train) == 3
    images = batches[0][0]
    assert images.shape == (6, 12, 10, 1) and images.dtype == np.uint8
    assert set(np.concatenate([b[1] for b in batches]).tolist()) <= {0, 1, 2}


def test_the_tf_engine_says_it_cannot_read_a_bucket(dataset):
    with pytest.raises(ChuteError, match=r"engine='grain'.*--engine grain"):
        chute.load(dataset)


def test_no_such_bucket_is_one_line(s3_endpoint):
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/shards"
    with pytest.raises(ChuteError, match="No bucket 'no-such-bucket-"):
        storage.exists(url)
    done = run_here("inspect", url)
    assert done.returncode == 2 and "No bucket" in done.stderr and url in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_credentials_are_one_line_that_names_the_chain(bucket, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    done = run_here("inspect", bucket + "/shards")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "No credentials for" in done.stderr and "AWS_ACCESS_KEY_ID" in done.stderr


def test_a_refusal_never_shows_the_secret(bucket, monkeypatch):
    # an unreachable endpoint: the error names the URL and the chain, not the key
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(ChuteError, match="Cannot reach") as caught:
        storage.exists(bucket + "/shards")
    assert SECRET not in str(caught.value) and "s3://" in str(caught.value)


def test_without_s3fs_the_cli_says_what_to_install_in_one_line():
    code = (
        "import sys; sys.modules['s3fs'] = None  # as if it were not installed\n"
        "from chute.cli import main\n"
        "sys.exit(main(['inspect', 's3://some-bucket/shards']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "pip install 'chute[s3]'" in done.stderr and "s3://some-bucket/shards" in done.stderr


def test_converting_into_a_bucket_never_imports_tensorflow(dataset, s3_endpoint, tmp_path):
    make_folder(tmp_path / "src", {"a": 3, "b": 3})
    out = dataset.rsplit("/", 1)[0] + "/tf-free"
    code = (
        "import sys, chute\n"
        f"chute.convert({str(tmp_path / 'src')!r}, {out!r}, workers=1)\n"
        "from chute.format import manifest\n"
        "from chute.read.grain.source import GrainSource\n"
        f"source = GrainSource(manifest.load({out!r}), 'train')\n"
        "assert source[0]['image']\n"
        "print(','.join(m for m in ('tensorflow', 'keras') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "tensorflow" not in done.stdout, done.stdout
    assert storage.exists(out + "/manifest.json")


def test_schemes_and_glob_bases():
    assert remote.glob_base("s3://b/out/train-*") == "s3://b/out"
    assert remote.scheme("S3://b/x") == "s3" and remote.scheme("/x") == ""


@pytest.mark.slow  # trains a small model for one epoch (TensorFlow)
def test_train_from_a_bucket_with_the_grain_engine(s3_endpoint, tmp_path):
    make_folder(tmp_path / "src", {"a": 8, "b": 8}, size=(16, 16))
    out = new_s3_bucket(s3_endpoint) + "/shards"
    chute.convert(tmp_path / "src", out, image_size=16, val_fraction=0.25, workers=1)
    options = ["--epochs", "1", "--batch-size", "8", "--model", "kannada-cnn", "--strategy", "cpu"]
    refused = run_here("train", out, "--run-dir", tmp_path / "tf", *options)
    assert refused.returncode == 2 and "--engine grain" in refused.stderr
    assert "Traceback" not in refused.stderr
    done = run_here("train", out, "--run-dir", tmp_path / "grain", "--engine", "grain", *options)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "grain" / "evaluation-val.json").exists()  # evaluated through Grain
