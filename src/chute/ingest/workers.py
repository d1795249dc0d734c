"""Worker processes for the CPU-bound Pillow work of a conversion.

Each worker is a fresh ``python -m chute.ingest.workers`` that imports only
:mod:`chute.ingest.encode` and :mod:`chute.ingest.decode` (Pillow, NumPy,
OpenCV). Unlike ``multiprocessing``'s spawned workers it never re-runs the
caller's main script, so a script that imports TensorFlow at the top does not
load it again in every worker, and no ``if __name__ == "__main__":`` guard is
needed. Tasks go out round-robin and results come back in task order, so
output never depends on the number of workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from chute import checks
from chute.errors import ChuteError
from chute.machine import available_cores

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<Q")


def _functions() -> dict:
    """What a worker may be asked to run, by name."""
    from chute.ingest import decode, encode

    return {"probe_chunk": decode.probe_chunk, "encode_chunk": encode.encode_chunk}


def check_workers(workers: int | None) -> int:
    """``workers`` validated; ``None`` means every available core."""
    if workers is None:
        return available_cores()
    return checks.int_in("workers", workers, 1, 1024)


def _send(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class WorkerPool:
    """``workers`` processes running the conversion's image functions.

    Example:
        >>> with WorkerPool(2) as pool:  # doctest: +SKIP
        ...     results = list(pool.ordered("probe_chunk", tasks))
    """

    def __init__(self, workers: int):
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self._procs = [
            subprocess.Popen(
                [sys.executable, "-m", "chute.ingest.workers"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            for _ in range(workers)
        ]
        self._broken = False

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(kill=exc_type is not None)

    def ordered(self, function: str, tasks: Iterable[tuple], window: int | None = None) -> Iterator:
        """Results of ``function(*task)``, in task order.

        At most ``window`` tasks (default four per worker) are in flight, which
        bounds memory whatever the dataset size.
        """
        if self._broken:
            raise RuntimeError("the worker pool is broken by an earlier error; start a new one")
        window = window or 4 * len(self._procs)
        in_flight: list[int] = []  # worker of each pending task, oldest first
        for number, task in enumerate(tasks):
            worker = number % len(self._procs)
            try:
                _send(self._procs[worker].stdin, (function, task))
            except BrokenPipeError:
                self._broken = True
                raise self._died(worker) from None
            in_flight.append(worker)
            if len(in_flight) >= window:
                yield self._result(in_flight.pop(0))
        while in_flight:
            yield self._result(in_flight.pop(0))

    def _result(self, worker: int) -> Any:
        proc = self._procs[worker]
        self._broken = True  # until this result is read intact
        try:
            status, value = _receive(proc.stdout)
        except EOFError:
            raise self._died(worker) from None
        if status == "error":
            raise RuntimeError(f"worker process failed:\n{value}")
        self._broken = False
        return value

    def _died(self, worker: int) -> ChuteError:
        code = self._procs[worker].wait()
        return ChuteError(
            f"a worker process died (exit code {code}); out of memory? Run the same "
            "command again to resume, with fewer workers if it happens again"
        )

    def close(self, *, kill: bool = False) -> None:
        """Stops the workers: at once with ``kill`` (after an error), else when idle."""
        for proc in self._procs:
            if kill:
                proc.kill()
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()


class InlinePool:
    """The same interface, working in this process (one worker, or tiny jobs)."""

    def __enter__(self) -> InlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def ordered(self, function: str, tasks: Iterable[tuple], window: int | None = None) -> Iterator:
        """Results of ``function(*task)``, in task order."""
        fn = _functions()[function]
        for task in tasks:
            yield fn(*task)

    def close(self) -> None:
        """Nothing to stop."""


def start_pool(workers: int) -> WorkerPool | InlinePool:
    """Worker processes, or an inline pool when ``workers`` is 1."""
    return WorkerPool(workers) if workers > 1 else InlinePool()


def _serve() -> None:
    """A worker's loop: read tasks from stdin (in a thread, so the parent never
    blocks writing while this process writes a large result), run, reply."""
    import signal

    functions = _functions()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed must not corrupt the result stream
    tasks: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            try:
                tasks.put(_receive(stdin))
            except EOFError:
                tasks.put(None)
                return

    threading.Thread(target=read, daemon=True).start()
    while (task := tasks.get()) is not None:
        function, args = task
        try:
            if function not in functions:
                raise ValueError(f"unknown worker function {function!r}")
            _send(stdout, ("ok", functions[function](*args)))
        except Exception:
            import traceback

            _send(stdout, ("error", traceback.format_exc()))


if __name__ == "__main__":
    _serve()
