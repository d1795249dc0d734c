"""The tf.data service's failure modes: a dispatcher that is not there, or a port that does
not answer as one (a bounded wait, an error naming the address), a port another program
holds (one line, not a traceback), and the warning every server start logs (no
authentication, every interface).

Servers are never left running: a port is taken by a plain socket on 127.0.0.1 so that
TensorFlow's server fails to start, TensorFlow's server classes are replaced by stand-ins
where only chute's side is tested, the programs that are not dispatchers (a socket that
never answers, an HTTP server) and a gRPC server answering as one run in threads of this
process and are stopped on exit, and the one real dispatcher runs in a child process that
is stopped.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import run_here

import chute
from chute.errors import ChuteError
from chute.lazy import tf
from chute.read.options import LoadOptions
from chute.read.tf import service


def _closed_port() -> int:
    """A port nothing listens on (bound for a moment, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _taken_port():
    """A port held by a listening socket on 127.0.0.1 (so no server can bind it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


# -- a dispatcher that is not there -------------------------------------------------------------


def test_load_fails_within_the_timeout_naming_the_address(shared_dataset):
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(ChuteError) as error:
        chute.load(shared_dataset, data_service=f"127.0.0.1:{port}", data_service_timeout=1.5)
    assert time.monotonic() - started < 30  # TensorFlow alone waits forever
    message = str(error.value)
    assert f"no tf.data service dispatcher answered at grpc://127.0.0.1:{port} within 1.5 s" in (
        message
    )
    assert f"`chute data-service dispatcher --port {port}`" in message
    assert "--data-service-timeout" in message
    assert f"Received: data_service='grpc://127.0.0.1:{port}'" in message


def test_the_wait_has_a_documented_default_and_is_checked():
    assert LoadOptions().data_service_timeout == service.DISPATCHER_TIMEOUT == 60.0
    assert LoadOptions(data_service_timeout=5).data_service_timeout == 5.0
    for bad in (0, -1, "soon", True, float("inf")):
        with pytest.raises(ChuteError, match=r"`data_service_timeout` must be a positive number"):
            LoadOptions(data_service_timeout=bad)


@contextlib.contextmanager
def _answering_like_a_dispatcher(port: int):
    """A gRPC server on 127.0.0.1:``port`` that answers the call a dispatcher answers first
    (its version), as TensorFlow's does; stopped on exit."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    version = grpc.unary_unary_rpc_method_handler(lambda request, context: b"\x08\x09")
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "tensorflow.data.DispatcherService", {"GetVersion": version}
            )
        ]
    )
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    server.start()
    try:
        yield
    finally:
        server.stop(grace=None).wait(10)


def test_a_dispatcher_that_comes_up_while_waiting_is_found(caplog):
    port = _closed_port()
    ready, done = threading.Event(), threading.Event()

    def listen_later():
        time.sleep(1.0)
        with _answering_like_a_dispatcher(port):
            ready.set()
            done.wait(30)

    thread = threading.Thread(target=listen_later, daemon=True)
    thread.start()
    try:
        with caplog.at_level(logging.INFO, logger="chute.read.tf.service"):
            service.wait_for_dispatcher(f"grpc://127.0.0.1:{port}", timeout=30)
    finally:
        done.set()
        thread.join(timeout=20)
    assert ready.is_set()
    assert f"waiting up to 30 s for the tf.data service dispatcher at grpc://127.0.0.1:{port}" in (
        caplog.text
    )


@contextlib.contextmanager
def _silent_server():
    """A port on 127.0.0.1 whose program accepts connections and never says a word (a
    dispatcher that hangs); its connections and socket closed on exit."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=10)
        for connection in held:
            connection.close()
        listener.close()


@contextlib.contextmanager
def _http_server():
    """A plain HTTP server on 127.0.0.1 (not a dispatcher), shut down on exit."""
    import http.server

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize("server", [_silent_server, _http_server], ids=["silent", "http"])
def test_load_from_a_port_that_is_not_a_dispatcher_fails_within_the_timeout(shared_dataset, server):
    """TensorFlow would wait inside the dataset's registration (past 90 s): the whole of
    chute's wait, the gRPC answer included, is bounded by data_service_timeout."""
    with server() as port:
        started = time.monotonic()
        with pytest.raises(ChuteError) as error:
            chute.load(shared_dataset, data_service=f"127.0.0.1:{port}", data_service_timeout=2)
        waited = time.monotonic() - started
    assert waited < 2 + 10, waited
    message = str(error.value)
    assert f"no tf.data service dispatcher answered at grpc://127.0.0.1:{port} within 2 s" in (
        message
    )
    assert f"A program accepts connections on port {port} there but does not answer" in message
    assert f"`chute data-service dispatcher --port {port}`" in message
    assert "data_service_timeout (--data-service-timeout SECONDS)" in message
    assert f"Received: data_service='grpc://127.0.0.1:{port}'" in message


def test_train_with_no_dispatcher_fails_within_the_timeout(shared_dataset, tmp_path):
    port = _closed_port()
    started = time.monotonic()
    result = run_here(
        "train",
        shared_dataset,
        "--run-dir",
        tmp_path / "run",
        "--epochs",
        "1",
        "--data-service",
        f"127.0.0.1:{port}",
        "--data-service-timeout",
        "1",
    )
    assert time.monotonic() - started < 120
    assert result.returncode == 2, result.stderr
    assert f"no tf.data service dispatcher answered at grpc://127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


# -- a port another program holds ---------------------------------------------------------------


@pytest.mark.parametrize("role", ["dispatcher", "worker"])
def test_a_taken_port_is_one_line_naming_it(role):
    with _taken_port() as port:
        if role == "dispatcher":
            result = run_here("data-service", "dispatcher", "--port", port)
        else:
            result = run_here(
                "data-service", "worker", "--dispatcher", "127.0.0.1:1", "--port", port
            )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    assert (
        f"chute data-service: error: the tf.data service {role} could not listen on port "
        in (errors[0])
    )
    assert f"Received: port={port}" in errors[0] and "--port" in errors[0]
    assert "Traceback" not in result.stderr
    assert "no authentication" not in result.stderr  # no server started: nothing exposed


# -- the exposure warning -----------------------------------------------------------------------


class _FakeServer:
    def __init__(self, config):
        self.config = config


def test_each_server_start_warns_that_it_is_open_to_whoever_reaches_it(monkeypatch, caplog):
    monkeypatch.setattr(tf.data.experimental.service, "DispatchServer", _FakeServer)
    monkeypatch.setattr(tf.data.experimental.service, "WorkerServer", _FakeServer)
    with caplog.at_level(logging.INFO, logger="chute.read.tf.service"):
        service.serve_dispatcher(5391)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    text = warning.getMessage()
    assert "dispatcher listens on every network interface (port 5391)" in text
    assert "no authentication" in text and "reading any file" in text
    assert "private network" in text and "firewall" in text

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chute.read.tf.service"):
        service.serve_worker("127.0.0.1:5391", port=5392)
        service.serve_worker("127.0.0.1:5391")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "worker listens on every network interface (port 5392)" in warnings[0]
    assert "no authentication" in warnings[0] and "fetch the batches" in warnings[0]
    assert "--port fixes it" in warnings[1]  # a port TensorFlow picks cannot be firewalled


def test_the_help_says_the_servers_are_open():
    result = run_here("data-service", "--help")
    assert "no authentication" in " ".join(result.stdout.split())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_real_dispatcher_logs_the_warning(tmp_path):
    port = _closed_port()
    log_path = tmp_path / "dispatcher.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chute", "data-service", "dispatcher", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while "Ctrl-C stops it" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    text = " ".join(log_path.read_text().split())
    assert (
        f"dispatcher listens on every network interface (port {port}) with no authentication"
        in (text)
    )
