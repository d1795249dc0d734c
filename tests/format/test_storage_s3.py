"""s3:// through fsspec (s3fs), against moto's S3 server on 127.0.0.1: which paths TensorFlow
opens, and the errors only S3 has (no credentials in its chain, an unreachable endpoint that
must not show the key). What every store does (the storage functions, a dataset in a bucket,
no bucket, no s3fs, the tf.data engine) is in test_stores.py, memory:// there too. No network,
no cloud account: the server is tests/object_stores.py's s3_endpoint.
"""

from __future__ import annotations

import pytest
from helpers import run_here
from object_stores import S3_SECRET as SECRET
from object_stores import new_s3_bucket

from chute.errors import ChuteError
from chute.format import remote, storage

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


@pytest.fixture
def bucket(s3_endpoint) -> str:
    return new_s3_bucket(s3_endpoint)


@pytest.mark.parametrize(
    ("path", "tensorflow"),
    [("/data/x", True), ("file:///data/x", True), ("ram://x", True), ("s3://b/x", False),
     ("memory://x", False)],
)  # fmt: skip
def test_which_paths_tensorflow_opens(path, tensorflow):
    assert storage.tensorflow_opens(path) is tensorflow


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


def test_schemes_and_glob_bases():
    assert remote.glob_base("s3://b/out/train-*") == "s3://b/out"
    assert remote.scheme("S3://b/x") == "s3" and remote.scheme("/x") == ""
