"""gs:// through fsspec (gcsfs), against gcp-storage-emulator on 127.0.0.1 (tests/object_stores.py's
gcs_endpoint, named by STORAGE_EMULATOR_HOST): what only GCS has, gcsfs or TensorFlow opening
gs:// (never TensorFlow through an emulator), and its credential errors (an unusable key
file, refusals, no credentials found). What every store does (the storage functions, a
dataset in a bucket, no bucket, no gcsfs) is in test_stores.py. No network, no cloud
account, no gcloud files read.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import run_here

from chute.errors import ChuteError
from chute.format import remote, storage

pytest.importorskip("gcsfs")
pytest.importorskip("gcp_storage_emulator")


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
