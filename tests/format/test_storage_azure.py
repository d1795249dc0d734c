"""az:// and abfs:// through fsspec (adlfs): which paths go there, the
one-line errors (no credentials, refusals, no secret shown), and a round trip against
Azurite on 127.0.0.1 (tests/object_stores.py's azure_endpoint; skipped where the Azurite
binary, a Node program, is not installed). What to install without adlfs is in
test_stores.py, with the other stores'. No network, no cloud account.
"""

from __future__ import annotations

import os

import pytest
from helpers import make_folder, run_here
from object_stores import AZURITE_KEY, new_azure_container

import chute
from chute.errors import ChuteError
from chute.format import remote, storage
from chute.read.grain.source import GrainSource

pytest.importorskip("adlfs")

KEY = "a-made-up-account-key=="


@pytest.fixture
def no_azure(monkeypatch):
    """An environment with no Azure variables at all."""
    for name in [name for name in os.environ if name.startswith("AZURE_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("path", "account"),
    [("az://data/shards", None), ("abfs://data/shards", None), ("abfss://data/x", None),
     ("abfs://data@myaccount.dfs.core.windows.net/shards", "myaccount"),
     ("az://data@other.blob.core.windows.net/x", "other")],
)  # fmt: skip
def test_azure_urls_go_through_fsspec_into_a_container(path, account):
    assert remote.handles(path) and remote.object_store(path)
    assert not storage.tensorflow_opens(path)  # TensorFlow has no az://
    assert remote._azure_account(path) == account


def test_no_credentials_is_one_line_naming_the_variables(no_azure):
    with pytest.raises(ChuteError, match=r"No credentials for 'az://data/shards'") as caught:
        storage.exists("az://data/shards")
    message = str(caught.value)
    assert "AZURE_STORAGE_CONNECTION_STRING" in message and "AZURE_STORAGE_ACCOUNT_KEY" in message
    done = run_here("inspect", "abfs://data/shards")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "No credentials for 'abfs://data/shards" in done.stderr


def test_refusals_are_one_line_and_never_show_a_secret(no_azure, monkeypatch):
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
    )

    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "myaccount")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
    denied = HttpResponseError(f"This request is not authorized (key {KEY})")
    denied.status_code = 403
    cases = [
        (denied, "No access to"),
        (ClientAuthenticationError("Server failed to authenticate the request"), "refused"),
        (ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token"),
         "No credentials for"),
        (ServiceRequestError(f"Connection refused; AccountKey={KEY};sig=abc&x=1"),
         "Cannot reach"),
    ]  # fmt: skip
    url = "az://data/shards"
    for error, words in cases:
        with pytest.raises(ChuteError) as caught, remote.errors(url, bucket=False):
            raise error
        message = str(caught.value)
        assert words in message and url in message and "\n" not in message, message
        assert KEY not in message and "sig=abc" not in message, message
        assert "AZURE_STORAGE_CONNECTION_STRING" in message


def test_a_round_trip_through_azurite(azure_endpoint, tmp_path):
    container = new_azure_container(azure_endpoint)
    base = container + "/out"
    storage.write_atomic(base + "/a.txt", b"hello")
    assert storage.listdir(base) == ["a.txt"] and storage.isdir(base)
    storage.copy(base + "/a.txt", base + "/b.txt")
    with storage.open_file(base + "/b.txt", "rb") as handle:
        handle.seek(1)  # a ranged read
        assert handle.read(3) == b"ell"
    storage.rmtree(base)
    assert not storage.exists(base)
    make_folder(tmp_path / "src", {"a": 4, "b": 3})
    chute.convert(tmp_path / "src", container + "/shards", workers=1)
    source = GrainSource(chute.load_manifest(container + "/shards"), "train")
    assert len(source) == 7 and source[0]["image"]
    inspected = run_here("inspect", container + "/shards")
    assert inspected.returncode == 0 and "train" in inspected.stdout, inspected.stderr


def test_azurite_refusals_are_one_line(azure_endpoint, monkeypatch):
    done = run_here("inspect", "az://no-such-container/shards")
    assert done.returncode == 2 and "No container 'no-such-container'" in done.stderr
    assert "Traceback" not in done.stderr
    wrong = os.environ["AZURE_STORAGE_CONNECTION_STRING"].replace(AZURITE_KEY, "A" * 86 + "==")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong)
    denied = run_here("inspect", new_azure_container(azure_endpoint) + "/shards")
    assert denied.returncode == 2 and "No access to 'az://chute-" in denied.stderr
    assert "A" * 86 not in denied.stderr and "Traceback" not in denied.stderr
