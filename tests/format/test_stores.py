"""What every object store does the same, written once and run for each: s3:// (moto's S3
server, s3fs) and gs:// (gcp-storage-emulator, gcsfs), both on 127.0.0.1 (tests/object_stores.py):
the storage layer's functions, a dataset converted into a bucket and read back from it as
it reads locally, a source folder in a bucket, and the one-line errors (no bucket, no client
library, the tf.data engine). What one store does alone (its credentials, its routing) is
in test_storage_s3.py, test_storage_gcs.py and test_storage_azure.py.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import make_folder, run_here
from object_stores import new_gcs_bucket, new_s3_bucket

import chute
from chute import lazy
from chute.errors import ChuteError
from chute.format import storage
from chute.read.grain.source import GrainSource


@dataclass(frozen=True)
class Store:
    """One store's server for this module: its URL scheme, and a new empty bucket on it."""

    scheme: str
    new_bucket: Callable[[], str]


# scheme: (its server's fixture in tests/object_stores.py, a new bucket on that server)
SERVERS = {"s3": ("s3_endpoint", new_s3_bucket), "gs": ("gcs_endpoint", new_gcs_bucket)}


@pytest.fixture(scope="module", params=list(SERVERS))
def store(request) -> Store:
    """Each store in turn; only the server of the one in use is started (and skipped where
    its client library or server is not installed)."""
    fixture, new_bucket = SERVERS[request.param]
    endpoint = request.getfixturevalue(fixture)
    return Store(request.param, functools.partial(new_bucket, endpoint))


@pytest.fixture
def bucket(store) -> str:
    return store.new_bucket()


@pytest.fixture(scope="module")
def source(shared_dataset) -> Path:
    """The folder shared_dataset was converted from: 3 classes, 24 PNGs of 12x10."""
    return Path(chute.load_manifest(shared_dataset).source["location"])


@pytest.fixture(scope="module")
def dataset(store, source) -> str:
    """``source`` converted into a bucket (with the CLI, in this process), as shared_dataset
    was converted locally."""
    out = store.new_bucket() + "/shards"
    done = run_here("-q", "convert", source, out, "--val-fraction", "0.25", "--min-shards", "2",
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
        handle.seek(1)  # a ranged read
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


def test_storage_functions(bucket):
    _exercise(bucket + "/out")


def test_memory_urls_go_through_fsspec():
    _exercise(f"memory://chute-{uuid.uuid4().hex[:8]}/out")


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


def test_the_grain_engine_reads_the_same_batches_as_locally(dataset, shared_dataset):
    options = {"engine": "grain", "batch_size": 6, "seed": 1, "workers": 0}
    train = chute.load(dataset, **options)
    batches = list(iter(train))
    local_batches = list(iter(chute.load(shared_dataset, **options)))
    assert len(batches) == len(train) == len(local_batches) == 3
    images = batches[0][0]
    assert images.shape == (6, 12, 10, 1) and images.dtype == np.uint8
    assert set(np.concatenate([b[1] for b in batches]).tolist()) <= {0, 1, 2}
    for (remote_images, labels), (local_images, local_labels) in zip(
        batches, local_batches, strict=True
    ):
        np.testing.assert_array_equal(remote_images, local_images)
        np.testing.assert_array_equal(labels, local_labels)


def test_the_tf_engine_says_it_cannot_read_a_bucket(dataset):
    # gs:// too: TensorFlow's GCS client knows no emulator (test_storage_gcs.py)
    with pytest.raises(ChuteError, match=r"engine='grain'.*--engine grain"):
        chute.load(dataset)


def test_no_such_bucket_is_one_line(store):
    name = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    url = f"{store.scheme}://{name}/shards"
    with pytest.raises(ChuteError, match=f"No bucket '{name}'"):
        storage.exists(url)
    done = run_here("inspect", url)
    assert done.returncode == 2 and "No bucket" in done.stderr and url in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("missing", "url", "extra"),
    [(("s3fs",), "s3://some-bucket/shards", "s3"),
     (("gcsfs", "tensorflow"), "gs://some-bucket/shards", "gcs"),  # either opens gs://
     (("adlfs",), "az://data/shards", "azure")],
    ids=["s3", "gs", "az"],
)  # fmt: skip
def test_without_its_client_library_the_cli_says_what_to_install_in_one_line(missing, url, extra):
    pytest.importorskip(missing[0])
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({missing!r}))  # as if not installed\n"
        "from chute.cli import main\n"
        f"sys.exit(main(['inspect', {url!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lazy.extra(extra) in done.stderr and url in done.stderr
    assert "'chute[" not in done.stderr  # chute is not on PyPI: that finds nothing


def test_converting_into_a_bucket_never_imports_tensorflow(dataset, tmp_path):
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


@pytest.mark.slow  # trains a small model for one epoch (TensorFlow)
def test_train_evaluate_and_predict_from_a_bucket(store, dataset, source, tmp_path):
    """chute train (the Grain engine, through the shard cache), evaluate and predict on
    a dataset in a bucket, from the CLI in this process; the tf.data engine refuses."""
    run = tmp_path / "run"
    options = ["--epochs", "1", "--batch-size", "8", "--model", "kannada-cnn", "--strategy", "cpu"]
    refused = run_here("train", dataset, "--run-dir", tmp_path / "tf", *options)
    assert refused.returncode == 2 and "--engine grain" in refused.stderr
    assert "Traceback" not in refused.stderr
    if store.scheme == "s3":  # a training is the suite's dearest step: one per store
        pytest.skip("s3:// trains, evaluates and predicts in tests/fit/test_without_tensorflow.py")
    done = run_here("train", dataset, "--run-dir", run, "--engine", "grain", *options)
    assert done.returncode == 0, done.stderr
    assert (run / "evaluation-val.json").exists()  # its own evaluation read the bucket too
    evaluated = run_here("evaluate", run, dataset, "--split", "val", "--out", tmp_path / "eval")
    assert evaluated.returncode == 0, evaluated.stderr
    assert "accuracy" in evaluated.stdout
    image = sorted((source / "a").iterdir())[0]
    predicted = run_here("predict", run, image)
    assert predicted.returncode == 0, predicted.stderr
    assert predicted.stdout.split()[1] in {"a", "b", "c"}
