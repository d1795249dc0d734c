"""gs:// through fsspec (gcsfs), against gcp-storage-emulator on 127.0.0.1 (tests/object_stores.py's
gcs_endpoint, named by STORAGE_EMULATOR_HOST): the storage layer's functions, a dataset
converted into a bucket and read back from it as it reads locally, a source folder in a
bucket, and the one-line errors (no bucket, unusable or missing credentials, no gcsfs).
No network, no cloud account, no gcloud files read.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import make_folder, run_here
from object_stores import new_gcs_bucket

import chute
from chute.errors import ChuteError
from chute.format import remote, storage
from chute.read.grain.source import GrainSource

pytest.importorskip("gcsfs")
pytest.importorskip("gcp_storage_emulator")

CONVERT = ("--val-fraction", "0.25", "--min-shards", "2", "--workers", "1")


@pytest.fixture
def bucket(gcs_endpoint) -> str:
    return new_gcs_bucket(gcs_endpoint)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("gcssrc") / "src", {"a": 10, "b": 8, "c": 6})


@pytest.fixture(scope="module")
def dataset(gcs_endpoint, source) -> str:
    """A dataset converted from a local folder into a bucket (with the CLI, in this process)."""
    out = new_gcs_bucket(gcs_endpoint) + "/shards"
    done = run_here("-q", "convert", source, out, *CONVERT)
    assert done.returncode == 0, done.stderr
    return out


def test_storage_functions_on_gcs(bucket):
    base = bucket + "/out"
    storage.write_atomic(base + "/a.txt", b"hello")
    storage.write_atomic(base + "/sub/b.bin", b"12345")
    assert storage.read_bytes(base + "/a.txt") == b"hello"
    assert storage.listdir(base) == ["a.txt", "sub"]
    assert storage.exists(base) and storage.isdir(base) and storage.isdir(base + "/sub")
    assert storage.exists(base + "/a.txt") and not storage.isdir(base + "/a.txt")
    assert not storage.exists(base + "/nothing")
    assert storage.glob(base + "/*.txt") == [base + "/a.txt"]
    walked = [(top, sorted(dirs), sorted(files)) for top, dirs, files in storage.walk(base)]
    assert walked == [(base, ["sub"], ["a.txt"]), (base + "/sub", [], ["b.bin"])]
    with storage.open_file(base + "/c.bin", "wb") as handle:
        handle.write(b"abc")
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
    storage.rmtree(base)
    assert not storage.exists(base)


def test_gs_goes_through_gcsfs_and_through_tensorflow_only_without_it(monkeypatch):
    tensorflow = remote._installed("tensorflow")
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert remote.handles("gs://b/x") and remote.handles("gcs://b/x")
    assert storage.tensorflow_opens("gs://b/x") is tensorflow  # tf.data opens gs:// itself
    # TensorFlow's GCS client knows no emulator: tf.data does not open gs:// through one
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    assert not storage.tensorflow_opens("gs://b/x")
    assert not storage.tensorflow_opens("gcs://b/x")  # a scheme TensorFlow does not know
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if it were not installed
    assert remote.handles("gs://b/x") is not tensorflow and remote.handles("gcs://b/x")


def test_inspect_verify_and_index_a_dataset_in_a_bucket(dataset):
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


def test_the_grain_engine_reads_the_same_batches_as_locally(dataset, source, tmp_path):
    local = tmp_path / "shards"
    chute.convert(source, local, val_fraction=0.25, min_shards=2, workers=1)
    options = {"engine": "grain", "batch_size": 6, "seed": 1, "workers": 0}
    remote_batches = list(iter(chute.load(dataset, **options)))
    local_batches = list(iter(chute.load(local, **options)))
    assert len(remote_batches) == len(local_batches) == 3
    for (images, labels), (local_images, local_labels) in zip(
        remote_batches, local_batches, strict=True
    ):
        np.testing.assert_array_equal(images, local_images)
        np.testing.assert_array_equal(labels, local_labels)


def test_convert_a_folder_that_is_in_a_bucket(bucket, tmp_path):
    src = make_folder(tmp_path / "src", {"a": 4, "b": 3})
    for path in sorted(src.rglob("*.png")):
        storage.write_atomic(f"{bucket}/src/{path.relative_to(src).as_posix()}", path.read_bytes())
    chute.convert(bucket + "/src", bucket + "/out", workers=1)
    source = GrainSource(chute.load_manifest(bucket + "/out"), "train")
    assert len(source) == 7 and {source[i]["key"] for i in range(7)} >= {"a/000.png"}


def test_no_such_bucket_is_one_line(gcs_endpoint):
    url = "gs://no-such-bucket-here/shards"
    with pytest.raises(ChuteError, match="No bucket 'no-such-bucket-here'"):
        storage.exists(url)
    done = run_here("inspect", url)
    assert done.returncode == 2 and "No bucket" in done.stderr and url in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unusable_credentials_file_is_one_line_that_names_adc(gcs_endpoint, tmp_path):
    key = tmp_path / "key.json"
    key.write_text('{"type": "service_account", "private_key": "SECRET-IN-THE-FILE"')
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("STORAGE_EMULATOR_HOST")  # the real store, with a broken key file
        patch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        done = run_here("inspect", "gs://some-bucket/shards")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "No credentials for 'gs://some-bucket/shards" in done.stderr
    assert "GOOGLE_APPLICATION_CREDENTIALS" in done.stderr and "Application Default" in done.stderr
    assert "SECRET-IN-THE-FILE" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_refusals_are_one_line_each(gcs_endpoint):
    from gcsfs.retry import HttpError
    from google.auth.exceptions import RefreshError

    url = "gs://some-bucket/x"
    cases = [
        (HttpError({"code": 401, "message": "Invalid Credentials"}), "were refused", "ADC"),
        (HttpError({"code": 403, "message": "denied"}), "No access to", "ADC"),
        (OSError("Forbidden: b/some-bucket/o\nno objects.get"), "No access to", "objects.get"),
        (RefreshError("expired"), "were refused", "ADC"),
        (HttpError({"code": 503, "message": "unavailable"}), "Cannot reach", "unavailable"),
        (ValueError("Bad Request: b/o\nInvalid bucket name"), "refused the request", "Invalid"),
    ]
    for error, words, names in cases:
        with pytest.raises(ChuteError) as caught, remote.errors(url):
            raise error
        message = str(caught.value).replace("Application Default Credentials", "ADC")
        assert words in message and url in message and "\n" not in message, message
        assert names in message, message
    with pytest.raises(KeyError), remote.errors(url):  # not a store's: raised as it is
        raise KeyError("a bug")


def _child(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}
    )


def test_no_credentials_found_reads_public_buckets_and_names_adc_on_a_refusal(tmp_path):
    # no emulator, no key file, an empty gcloud folder, not on Google Cloud: anonymous
    code = (
        "from gcsfs.retry import HttpError\n"
        "from chute.errors import ChuteError\n"
        "from chute.format import remote\n"
        "try:\n"
        "    with remote.errors('gs://private/x'):\n"
        "        raise HttpError({'code': 401, 'message': 'Anonymous caller does not have "
        "storage.objects.get access'})\n"
        "except ChuteError as error:\n"
        "    print(error)\n"
    )
    env = {"STORAGE_EMULATOR_HOST": "", "GOOGLE_APPLICATION_CREDENTIALS": "",
           "CLOUDSDK_CONFIG": str(tmp_path), "NO_GCE_CHECK": "true"}  # fmt: skip
    done = _child(code, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("No credentials for 'gs://private/x' (Anonymous caller")
    assert "GOOGLE_APPLICATION_CREDENTIALS" in done.stdout


def test_without_gcsfs_or_tensorflow_the_cli_says_what_to_install_in_one_line():
    code = (
        "import sys; sys.modules['gcsfs'] = sys.modules['tensorflow'] = None  # not installed\n"
        "from chute.cli import main\n"
        "sys.exit(main(['inspect', 'gs://some-bucket/shards']))"
    )
    done = _child(code)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "pip install 'chute[gcs]'" in done.stderr and "gs://some-bucket/shards" in done.stderr


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
    done = _child(code)
    assert done.returncode == 0, done.stderr
    assert "tensorflow" not in done.stdout, done.stdout
    assert storage.exists(out + "/manifest.json")


@pytest.mark.slow
def test_train_evaluate_and_predict_from_a_bucket(dataset, source, tmp_path):
    """chute train (the Grain engine, through the shard cache), evaluate and predict on
    a dataset in a gs:// bucket, from the CLI in this process."""
    run = tmp_path / "run"
    options = ["--epochs", "1", "--batch-size", "8", "--model", "kannada-cnn", "--strategy", "cpu"]
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
