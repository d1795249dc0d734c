"""Preprocessing on other machines: chute's pipeline run by the ``tf.data`` service.

A host with few cores (a TPU VM, a GPU box) cannot decode and augment photos as
fast as its accelerator trains. The ``tf.data`` service runs the pipeline on
spare machines instead: one dispatcher, any number of workers, and the
trainer reading finished batches over the network. chute drives it:

* :func:`serve_dispatcher` and :func:`serve_worker` (``chute data-service
  dispatcher|worker``) start the servers, thin wrappers over
  ``tf.data.experimental.service.DispatchServer`` and ``WorkerServer``.
* ``chute.load(..., data_service="grpc://HOST:PORT")`` (and ``chute train
  --data-service``) registers the training pipeline with the dispatcher, with
  **dynamic sharding**: the dispatcher hands each worker the next shard of the
  split when it asks, so each example is read **at most once per epoch** (an
  example of a shard being read by a worker that dies is lost for that epoch,
  never repeated), and every epoch is a new job with a new order.

What the service cannot promise, chute does locally: evaluation (every example
exactly once) reads on the trainer itself, and a seed cannot fix the order
(shards go to whichever worker asks first), so the order is new every epoch.

TensorFlow retries a dispatcher that is not there forever, and waits inside
the dataset's registration for one that does not answer (a port held by another
server, a dispatcher that hangs), so ``chute.load`` first waits at most
``data_service_timeout`` seconds (:data:`DISPATCHER_TIMEOUT` by default) for it
to answer (:func:`wait_for_dispatcher`: a TCP connection, then a gRPC call that
a dispatcher answers), and fails naming the address.

**The servers have no authentication** (TensorFlow offers none) and listen on
every network interface (TensorFlow binds ``[::]:PORT`` and has no setting for
the address): whoever reaches a dispatcher can register a dataset graph that
its workers run, reading any file they can read, and whoever reaches a worker
can fetch the batches it makes. Run them on a private network, or let a
firewall admit only the trainers and workers (the README's *tf.data service*
shows a rule); both servers log a warning saying so when they start.

Example:
    >>> server = serve_dispatcher(5050)  # doctest: +SKIP
    >>> train = chute.load("gs://b/shards", data_service="grpc://10.0.0.2:5050")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import socket
import threading
import time
from typing import Any

from chute import checks
from chute.errors import ChuteError
from chute.lazy import tf
from chute.read.options import DISPATCHER_TIMEOUT, check_address

log = logging.getLogger(__name__)

DEFAULT_PORT = 5050
# The call every tf.data service client makes first (TensorFlow's compatibility check): a
# dispatcher answers it at once, and it changes nothing there.
_VERSION_CALL = "/tensorflow.data.DispatcherService/GetVersion"
_LOCAL = ("localhost", "127.0.0.1", "[::1]")


def _port(value: Any, *, zero: bool) -> int:
    low = 0 if zero else 1
    return checks.int_in("port", value, low, 65535)


def _host_port(address: str) -> tuple[str, int]:
    """``("10.0.0.2", 5050)`` of ``grpc://10.0.0.2:5050`` (an IPv6 host without brackets)."""
    # rsplit: an IPv6 host holds colons of its own; sockets want it without brackets.
    host, port = address.split("://", 1)[-1].rsplit(":", 1)
    return host.strip("[]"), int(port)


def wait_for_dispatcher(address: str, timeout: float = DISPATCHER_TIMEOUT) -> None:
    """Returns once the dispatcher at ``address`` answers, trying again every second; a
    :class:`~chute.errors.ChuteError` naming it after ``timeout`` seconds.

    TensorFlow itself waits for a dispatcher that is not there forever (trying again every
    few seconds inside the first ``next()``), and inside the dataset's registration for a
    port that accepts connections but does not answer as a dispatcher (another server, a
    dispatcher that hangs). So this comes first: a TCP connection, then a gRPC call that
    every dispatcher answers (:func:`_grpc_answer`), the whole bounded by ``timeout``.

    Example:
        >>> wait_for_dispatcher("grpc://10.0.0.2:5050", timeout=30)  # doctest: +SKIP
    """
    timeout = checks.positive_number(
        "data_service_timeout", timeout, "a positive number of seconds"
    )
    host, port = _host_port(address)
    deadline = time.monotonic() + timeout
    told = listening = False
    while True:
        left = deadline - time.monotonic()
        try:
            # TCP first: it tells "nothing listens" from "something listens but is no dispatcher".
            with socket.create_connection((host, port), timeout=max(0.05, min(left, 5.0))):
                listening = True
        except OSError as error:  # refused, timed out, unknown host, no route
            reason = str(error) or type(error).__name__
        else:
            reason = _grpc_answer(address, max(0.05, deadline - time.monotonic()))
            if reason is None:
                return
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if not told:
            log.info(
                "waiting up to %g s for the tf.data service dispatcher at %s (%s)",
                timeout,
                address,
                reason,
            )
            told = True
        # A dispatcher that starts a moment after the trainer is normal: try again each second.
        time.sleep(min(1.0, left))
    raise ChuteError(_no_answer(address, timeout, reason, listening=listening))


def _grpc_answer(address: str, timeout: float) -> str | None:
    """None when a gRPC server at ``address`` answers the call a dispatcher answers first
    (:data:`_VERSION_CALL`) within ``timeout`` seconds; else why not.

    A gRPC server that does not know the call still answers (``UNIMPLEMENTED``): that is
    left to TensorFlow, which fails at once there rather than waiting.
    """
    try:
        import grpc  # TensorFlow's own dependency; imported here, when a dispatcher is named
    except ImportError:  # pragma: no cover - every TensorFlow wheel requires grpcio
        log.debug("grpc is not installed: the dispatcher at %s is not asked to answer", address)
        return None
    with grpc.insecure_channel(address.split("://", 1)[1]) as channel:
        try:
            channel.unary_unary(_VERSION_CALL)(b"", timeout=timeout)
        except grpc.RpcError as error:
            # Something answered over gRPC: TensorFlow then fails at once, with its own message.
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            said = " ".join(str(error.details() or "").split())[:300]
            return f"gRPC {error.code().name}: {said}"
    return None


def _no_answer(address: str, timeout: float, reason: str, *, listening: bool) -> str:
    """The message of :func:`wait_for_dispatcher` giving up: what to check, the way out."""
    host, port = _host_port(address)
    if listening:  # a program accepts connections there, but not as a dispatcher
        check = (
            f"A program accepts connections on port {port} there but does not answer as a "
            f"dispatcher: check that {port} is the port of `chute data-service dispatcher "
            f"--port {port}` on {host} (not another server's), and that the dispatcher is "
            "not stuck (restart it)"
        )
    else:
        check = (
            f"Check that `chute data-service dispatcher --port {port}` runs on {host} and "
            f"that this machine can reach port {port} there (a firewall?)"
        )
    return (
        f"no tf.data service dispatcher answered at {address} within {timeout:g} s "
        f"({reason}). {check}, or wait longer with data_service_timeout "
        f"(--data-service-timeout SECONDS). Received: data_service={address!r}"
    )


def _exposure(role: str, port: str) -> None:
    """The warning every server start logs: whoever reaches it can use it."""
    what = (
        "register dataset graphs that the workers run, reading any file they can read"
        if role == "dispatcher"
        else "give it dataset graphs to run, reading any file it can read, and fetch the "
        "batches it makes"
    )
    log.warning(
        "the tf.data service %s listens on every network interface (%s) with no "
        "authentication (TensorFlow offers none): anyone who can reach it can %s. Run it "
        "on a private network only, or let a firewall admit only the trainers and workers "
        "to that port (see the README's tf.data service section)",
        role,
        port,
        what,
    )


def _started(make: Any, role: str, port: int) -> Any:
    """``make()``, the server; a port TensorFlow's gRPC server cannot listen on (taken by
    another program) as a :class:`~chute.errors.ChuteError` naming it."""
    try:
        return make()
    except RuntimeError as error:
        # TensorFlow reports a taken port only in this message; any other error is raised as it is.
        if "Could not start gRPC server" not in str(error):
            raise
        raise ChuteError(
            f"the tf.data service {role} could not listen on port {port} ({error}): another "
            f"program (another {role}?) holds it. Pass a free port (--port), or stop that "
            f"program. Received: port={port}"
        ) from None


def serve_dispatcher(port: int = DEFAULT_PORT, *, work_dir: str | None = None) -> Any:
    """Starts a ``tf.data`` service dispatcher on ``port`` (all interfaces, no
    authentication: keep it on a private network or behind a firewall).

    Args:
        port: the port trainers and workers reach it at.
        work_dir: a folder (local or ``gs://``) where it keeps its state, so
            that a restarted dispatcher resumes its jobs; None: in memory.

    Returns:
        The running ``DispatchServer`` (``.join()`` blocks until it stops).

    Raises:
        ChuteError: a bad ``port``, or one that another program holds.

    Example:
        >>> serve_dispatcher(5050).join()  # doctest: +SKIP
    """
    port = _port(port, zero=False)
    # Fault tolerance journals to work_dir, so it can only be on when there is one.
    config = tf.data.experimental.service.DispatcherConfig(
        port=port, work_dir=work_dir, fault_tolerant_mode=work_dir is not None
    )
    server = _started(
        lambda: tf.data.experimental.service.DispatchServer(config), "dispatcher", port
    )
    _exposure("dispatcher", f"port {port}")
    log.info(
        "tf.data service dispatcher serving on port %d (%s); workers join it with "
        "`chute data-service worker --dispatcher %s:%d`, trainers read with "
        "--data-service grpc://%s:%d",
        port,
        f"state kept in {work_dir}" if work_dir else "state in memory",
        socket.gethostname(),
        port,
        socket.gethostname(),
        port,
    )
    return server


def serve_worker(dispatcher: str, *, port: int = 0, address: str | None = None) -> Any:
    """Starts a ``tf.data`` service worker that runs pipelines for ``dispatcher`` (all
    interfaces, no authentication: keep it on a private network or behind a firewall).

    Args:
        dispatcher: the dispatcher's ``HOST:PORT`` (or ``grpc://HOST:PORT``).
        port: this worker's port (0: any free one).
        address: the host name trainers reach this worker at; default:
            ``localhost`` when the dispatcher runs here, else this machine's name.

    Returns:
        The running ``WorkerServer`` (``.join()`` blocks until it stops).

    Raises:
        ChuteError: a bad ``dispatcher`` or ``port``, or a port another program holds.

    Example:
        >>> serve_worker("10.0.0.2:5050").join()  # doctest: +SKIP
    """
    target = check_address("dispatcher", dispatcher)
    port = _port(port, zero=True)
    host_port = target.split("://", 1)[1]
    if address is None:
        # A dispatcher on this machine: trainers here reach the worker as localhost too.
        local = host_port.rsplit(":", 1)[0] in _LOCAL
        address = "localhost" if local else socket.gethostname()
    # %port%: TensorFlow's placeholder for the port it picks when port is 0.
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=host_port, worker_address=f"{address}:%port%", port=port
    )
    server = _started(lambda: tf.data.experimental.service.WorkerServer(config), "worker", port)
    _exposure("worker", f"port {port}" if port else "a port TensorFlow picks; --port fixes it")
    log.info(
        "tf.data service worker for dispatcher %s, reached at %s (port %s): it reads "
        "shards and runs chute's pipeline for the trainers' jobs",
        host_port,
        address,
        port or "any",
    )
    return server


def wait(server: Any) -> None:
    """Returns when the process gets SIGINT (Ctrl-C) or SIGTERM; ``server`` serves
    meanwhile (its threads run on their own)."""
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    log.info("tf.data service server stopping (%s)", type(server).__name__)


def job_name(namespace: str, pipelines: int) -> str | None:
    """The name several input pipelines (hosts) share so that they read one job together
    (as the service requires under ``TPUStrategy`` and ``MultiWorkerMirroredStrategy``);
    None for a single pipeline (an anonymous job of its own each epoch).

    The cluster (``TF_CONFIG``) enters the name, so two runs on the same data from
    different clusters never share a job."""
    if pipelines <= 1:
        return None
    cluster = os.environ.get("TF_CONFIG", "") + os.environ.get("TPU_NAME", "")
    digest = hashlib.sha256(f"{namespace}|{pipelines}|{cluster}".encode()).hexdigest()[:16]
    return f"chute-{digest}"


def read_through(dataset, address: str, *, name: str | None):
    """``dataset`` (chute's pipeline, batches included) run by the service's workers with
    dynamic sharding; this process receives the batches. Each iteration is a new job."""
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
            service=address,
            job_name=name,
        )
    )
