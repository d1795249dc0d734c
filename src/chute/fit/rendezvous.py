"""JAX processes on several hosts wait for each other for a bounded time before JAX joins them.

``jax.distributed.initialize`` waits in C++ for every process and, when one
does not come within its ``initialization_timeout``, ends the whole process with
SIGABRT and a C++ stack: nothing a caller can catch or explain. So chute's
processes meet first, on the coordinator's port, before JAX takes it
(:func:`wait_for_processes`): process 0 listens there and waits for the
others; each other process connects to it (trying again while it is not up
yet) and says its index; once all have come, process 0 tells them to go on,
closes the port, and every process calls JAX, which then finds them all. A
process that does not come within ``process_timeout`` seconds
(:data:`PROCESS_TIMEOUT` by default, ``--process-timeout``) ends every process
that came with a :class:`~chute.errors.ChuteError` naming those missing: a
one-line error, not an abort.

The exchange is one line each way over TCP: ``chute-join 1 COUNT INDEX`` from a
process, then ``go``, ``missing I,J`` or ``refused WHY`` from process 0.

Example:
    >>> wait_for_processes("10.0.0.2:1234", count=2, index=1, timeout=300)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import time

from chute.errors import ChuteError

log = logging.getLogger(__name__)

PROCESS_TIMEOUT = 300.0
"""Seconds a JAX process waits for the others by default (JAX's own initialization wait)."""
# The version in the greeting: a chute speaking another protocol is ignored, not misread.
_HELLO = "chute-join 1"
_LINE = 1024  # bytes: the longest line either side sends


def wait_for_processes(coordinator: str, *, count: int, index: int, timeout: float) -> None:
    """Returns once all ``count`` processes of the run have come to ``coordinator``.

    Process 0 (``index`` 0) listens on the coordinator's port and waits at most
    ``timeout`` seconds for the others; each other process waits at most
    ``timeout`` seconds for process 0 to listen, then for its word (it gives it
    by its own deadline).

    Args:
        coordinator: process 0's ``HOST:PORT`` (an IPv6 host in brackets).
        count: how many processes the run has (at least 2).
        index: this process's index, from 0 to ``count - 1``.
        timeout: seconds to wait.

    Raises:
        ChuteError: a process did not come (naming which), process 0 did not
            answer, or the processes disagree on the run (count, two of one index).
    """
    # rsplit: an IPv6 host holds colons of its own.
    host, port = coordinator.rsplit(":", 1)
    received = (
        f"Received: coordinator={coordinator!r}, num_processes={count}, process_id={index}, "
        f"process_timeout={timeout:g}"
    )
    log.info(
        "waiting up to %g s for %d JAX processes at %s (this is process %d%s)",
        timeout,
        count,
        coordinator,
        index,
        ", which listens there" if index == 0 else "",
    )
    if index == 0:
        _gather(int(port), count, timeout, coordinator, received)
    else:
        # Brackets off: socket.create_connection wants the bare IPv6 address.
        _arrive(host.strip("[]"), int(port), count, index, timeout, coordinator, received)
    log.info("all %d JAX processes came to %s", count, coordinator)


def _listen(port: int) -> socket.socket:
    """A socket listening on ``port`` of every interface, as JAX's coordinator does."""
    # Dual-stack where possible, so processes that reach this host by IPv4 or IPv6 both get in.
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


def _gather(port: int, count: int, timeout: float, coordinator: str, received: str) -> None:
    """Process 0: waits for processes 1 to ``count - 1``; tells them to go, or who is missing."""
    try:
        listener = _listen(port)
    except OSError as error:
        raise ChuteError(
            f"process 0 cannot listen on port {port} here ({error}), the port --coordinator "
            f"{coordinator} names: another program (an earlier run?) holds it. Pass a free "
            f"port in --coordinator on every host. {received}"
        ) from None
    # Closed before returning: JAX's coordinator listens on this same port next.
    with listener, _Gathering(listener, count) as gathering:
        try:
            gathering.wait(time.monotonic() + timeout)
        except ChuteError as error:  # the processes disagree on the run: all are told
            _tell(gathering.joined.values(), f"refused {error}")
            raise ChuteError(f"{error}. {received}") from None
        missing = [i for i in range(1, count) if i not in gathering.joined]
        _tell(
            gathering.joined.values(), f"missing {','.join(map(str, missing))}" if missing else "go"
        )
        came = ", ".join(map(str, [0, *sorted(gathering.joined)]))
    if missing:
        which = (
            f"--process-id {missing[0]} on its host"
            if len(missing) == 1
            else f"--process-id I on the host of each I in {', '.join(map(str, missing))}"
        )
        raise ChuteError(
            f"JAX process(es) {', '.join(map(str, missing))} of {count} did not come to "
            f"{coordinator} within {timeout:g} s (came: {came}). Start the same `chute train` "
            f"with --coordinator {coordinator} --num-processes {count} {which}, check that "
            f"it can reach port {port} here (a firewall?), or wait longer with "
            f"--process-timeout SECONDS. {received}"
        )


class _Gathering:
    """Process 0's side of the meeting: the processes that came (``joined``: index ->
    connection) and the connections that have not said who they are yet. Closes them all
    on exit."""

    def __init__(self, listener: socket.socket, count: int):
        self.listener, self.count = listener, count
        self.joined: dict[int, socket.socket] = {}
        self.unnamed: dict[socket.socket, bytes] = {}  # connection -> what it said so far
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)

    def __enter__(self) -> _Gathering:
        return self

    def __exit__(self, *exc: object) -> None:
        for connection in [*self.joined.values(), *self.unnamed]:
            connection.close()
        self.selector.close()

    def wait(self, deadline: float) -> None:
        """Takes processes in until all came or ``deadline``; a process that closes its
        connection meanwhile (it gave up) no longer counts."""
        while len(self.joined) < self.count - 1 and (left := deadline - time.monotonic()) > 0:
            for key, _ in self.selector.select(left):
                if key.fileobj is self.listener:
                    # A connection that vanished between select and accept is just not counted.
                    with contextlib.suppress(OSError):
                        connection = self.listener.accept()[0]
                        self.unnamed[connection] = b""
                        self.selector.register(connection, selectors.EVENT_READ)
                else:
                    self._heard(key.fileobj)

    def _heard(self, connection: socket.socket) -> None:
        try:
            data = connection.recv(_LINE)
        except OSError:
            data = b""
        if not data:  # closed: gone, whether it had said who it is or not
            self._drop(connection)
            return
        if connection not in self.unnamed:  # a process that came says nothing more
            return
        said = self.unnamed[connection] + data
        self.unnamed[connection] = said
        # The greeting may come in pieces: wait for its end (or give up on a flood).
        if b"\n" not in said and len(said) <= _LINE:
            return
        line = said.split(b"\n", 1)[0].decode("ascii", "replace")
        words = line.split()
        ours = len(words) == 4 and " ".join(words[:2]) == _HELLO
        if not (ours and words[2].isdigit() and words[3].isdigit()):
            # a port scanner, a health check, a chute of another version: not a process
            log.warning(
                "ignoring a connection to the coordinator's port that is not a chute process "
                "of this version (it said %r)",
                line[:80],
            )
            self._drop(connection)
            return
        try:
            index = _joining_index(int(words[2]), int(words[3]), self.count, self.joined)
        except ChuteError as error:
            _tell([connection], f"refused {error}")
            raise
        del self.unnamed[connection]
        self.joined[index] = connection

    def _drop(self, connection: socket.socket) -> None:
        self.selector.unregister(connection)
        self.unnamed.pop(connection, None)
        for index in [i for i, c in self.joined.items() if c is connection]:
            del self.joined[index]
        connection.close()


def _joining_index(theirs: int, index: int, count: int, joined: dict[int, socket.socket]) -> int:
    """``index``, the one a process says it has (in a run of ``theirs`` processes); a
    ChuteError when it does not fit this run."""
    # A process started with another count would wait for processes that never come.
    if theirs != count:
        raise ChuteError(
            f"process {index} was started with --num-processes {theirs}, process 0 with "
            f"{count}: pass the same number on every host"
        )
    if index in joined:
        raise ChuteError(f"two processes say --process-id {index}: give each its own")
    if not 0 < index < count:
        raise ChuteError(f"a process says --process-id {index}, outside 1 to {count - 1}")
    return index


def _tell(connections, line: str) -> None:
    """Sends ``line`` to every process that came; each closes its side first (the port is
    JAX's next, free of connections waiting to close on this side)."""
    for connection in connections:
        with contextlib.suppress(OSError):
            connection.setblocking(True)
            connection.sendall((" ".join(line.split()) + "\n").encode()[:_LINE])
    for connection in connections:
        with contextlib.suppress(OSError):
            connection.settimeout(2.0)
            # The other side closes first: no TIME_WAIT is left here on JAX's port.
            connection.recv(1)


def _arrive(
    host: str, port: int, count: int, index: int, timeout: float, coordinator: str, received: str
) -> None:
    """A process other than 0: connects to process 0 (trying again while it is not up),
    says its index, and waits for process 0's word."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            # At most 5 s per try, so a host that comes up late is tried again before the deadline.
            connection = socket.create_connection((host, port), timeout=max(0.05, min(left, 5.0)))
            break
        except OSError as error:  # refused (not up yet), timed out, unknown host, no route
            reason = str(error) or type(error).__name__
        if time.monotonic() >= deadline:
            raise ChuteError(
                f"process 0 of {count} did not answer at {coordinator} within {timeout:g} s "
                f"({reason}). Start the same `chute train` with --process-id 0 on {host}, "
                f"check that this host can reach port {port} there (a firewall?), or wait "
                f"longer with --process-timeout SECONDS. {received}"
            )
        # Process 0 may not listen yet: try again shortly, never past the deadline.
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    with connection:
        connection.sendall(f"{_HELLO} {count} {index}\n".encode())
        # process 0 answers by its own deadline, at most `timeout` after it began to listen
        connection.settimeout(timeout + 5.0)
        try:
            word = _line(connection)
        except TimeoutError:
            raise ChuteError(
                f"process 0 at {coordinator} took this process in but said nothing more "
                f"within {timeout + 5.0:g} s (is it stuck?). {received}"
            ) from None
    if word == "go":
        return
    if word.startswith("missing "):
        missing = word.split(" ", 1)[1].replace(",", ", ")
        raise ChuteError(
            f"JAX process(es) {missing} of {count} did not come to {coordinator} within "
            f"process 0's {timeout:g} s: start the same `chute train` on each missing one's "
            f"host, or wait longer with --process-timeout SECONDS. {received}"
        )
    if word.startswith("refused "):
        raise ChuteError(f"process 0 at {coordinator} refused this run: {word[8:]}. {received}")
    raise ChuteError(
        f"process 0 at {coordinator} {'said ' + repr(word[:80]) if word else 'stopped'} "
        f"before every process had come (see its output). {received}"
    )


def _line(connection: socket.socket) -> str:
    """One line from ``connection`` (without its end); "" when it closes first.

    Raises:
        TimeoutError: nothing came within the connection's timeout.
    """
    data = b""
    try:
        while b"\n" not in data and len(data) <= _LINE:
            piece = connection.recv(_LINE)
            if not piece:
                break
            data += piece
    # TimeoutError is an OSError: raised again before the branch below swallows it.
    except TimeoutError:
        raise
    except OSError:  # reset: process 0 ended
        pass
    return data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
