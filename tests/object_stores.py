"""Object-store servers on 127.0.0.1 for the tests, started and stopped by them: moto's S3
server (in this process, in a thread), gcp-storage-emulator's GCS server (a process of its
own), and a new empty bucket in each. No network, no cloud account, nothing read from this
machine's AWS or gcloud files.

The fixtures are module-scoped (``--dist loadfile`` runs a module on one worker) and set the
store's variables in the environment for the module's tests and the processes they start.
conftest.py registers them (``pytest_plugins``); a test module imports the helpers:

    from object_stores import new_s3_bucket

    def test_x(s3_endpoint):
        bucket = new_s3_bucket(s3_endpoint)  # "s3://chute-..."
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

S3_SECRET = "not-a-real-secret-key"  # the dummy key: tests check that no message shows it


def _quiet(name: str) -> int:
    """Sets logger ``name`` to WARNING (a server's line per request); returns its level."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    return level


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory) -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1 (its URL), and dummy credentials in the
    environment (nothing read from this machine's AWS files or an instance role)."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    level = _quiet("werkzeug")
    server.start()
    host, port = server.get_host_and_port()
    nothing = tmp_path_factory.mktemp("aws") / "none"
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
                patch.delenv(name, raising=False)
            patch.setenv("AWS_ACCESS_KEY_ID", "testing")
            patch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
            patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
            patch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
            patch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nothing))
            patch.setenv("AWS_CONFIG_FILE", str(nothing))
            patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
            yield f"http://{host}:{port}"
    finally:
        server.stop()
        logging.getLogger("werkzeug").setLevel(level)


def new_s3_bucket(endpoint: str) -> str:
    """A new empty bucket on the S3 server at ``endpoint``: ``"s3://chute-..."``."""
    import boto3

    name = f"chute-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return f"s3://{name}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def gcs_endpoint(tmp_path_factory) -> Iterator[str]:
    """gcp-storage-emulator on a free port of 127.0.0.1, in memory (its URL), named by
    STORAGE_EMULATOR_HOST. No Application Default Credentials can be found meanwhile (an
    empty gcloud folder, no key file, a metadata server that refuses at once)."""
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # A process of its own, its output dropped: the emulator serves one request at a time
    # and prints a traceback for each one a client gave up on (gcsfs asks for an object and
    # its listing at once, and drops the slower answer).
    server = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
         "--port", str(port), "--in-memory", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port, server)
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
            patch.setenv("CLOUDSDK_CONFIG", str(tmp_path_factory.mktemp("gcloud")))
            patch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
            patch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
            patch.setenv("STORAGE_EMULATOR_HOST", url)
            yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def new_gcs_bucket(endpoint: str) -> str:
    """A new empty bucket on the GCS emulator at ``endpoint``: ``"gs://chute-..."``
    (made through the JSON API, as gcloud would, not through chute)."""
    name = f"chute-{uuid.uuid4().hex[:12]}"
    request = urllib.request.Request(
        f"{endpoint}/storage/v1/b?project=test",
        data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200, response.status
    return f"gs://{name}"


# Azurite's development account: a key published in Azure's documentation, not a secret.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_CREDENTIAL = {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}


@pytest.fixture(scope="module")
def azure_endpoint() -> Iterator[str]:
    """Azurite's blob service on a free port of 127.0.0.1, in memory (its URL), named by
    AZURE_STORAGE_CONNECTION_STRING. Azurite is a Node program (``npm install azurite``):
    the tests that need it are skipped where ``azurite-blob`` is not on PATH (or named by
    AZURITE_BLOB)."""
    pytest.importorskip("adlfs")
    binary = os.environ.get("AZURITE_BLOB") or shutil.which("azurite-blob")
    if not binary:
        pytest.skip("azurite-blob not found (npm install azurite; PATH or AZURITE_BLOB)")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    server = subprocess.Popen(
        [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
         "--skipApiVersionCheck", "--loose", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port, server)
        with pytest.MonkeyPatch.context() as patch:
            for name in [name for name in os.environ if name.startswith("AZURE_")]:
                patch.delenv(name)
            patch.setenv(
                "AZURE_STORAGE_CONNECTION_STRING",
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={url};",
            )
            yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def _wait_for_port(port: int, server: subprocess.Popen, timeout: float = 30.0) -> None:
    """Until a server listens on ``port`` of 127.0.0.1 (or has exited: an error)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server on port {port} did not start") from None
            time.sleep(0.05)


def new_azure_container(endpoint: str) -> str:
    """A new empty container on Azurite at ``endpoint``: ``"az://chute-..."``."""
    from azure.storage.blob import BlobServiceClient

    name = f"chute-{uuid.uuid4().hex[:12]}"
    service = BlobServiceClient(endpoint, credential=AZURITE_CREDENTIAL)
    service.create_container(name)
    return f"az://{name}"
