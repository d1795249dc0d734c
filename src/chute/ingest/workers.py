"""Worker processes for the CPU-bound Pillow work of a conversion.

Each worker is a fresh ``python -m chute.ingest.workers`` that imports only
:mod:`chute.ingest.encode` and :mod:`chute.ingest.decode` (with :mod:`chute.image`:
Pillow, NumPy, OpenCV). Unlike ``multiprocessing``'s spawned workers it never re-runs the
caller's main script, so a script that imports TensorFlow at the top does not
load it again in every worker, and no ``if __name__ == "__main__":`` guard is
needed. Each task goes to the worker with the least work pending (a task's
work is the number of items it carries), and results come back in task order, so
output never depends on the number of workers.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, BinaryIO

from chute import checks
from chute.errors import ChuteError
from chute.machine import available_cores

log = logging.getLogger(__name__)

# A message's length, so the reader knows where one pickle ends: pipes carry bytes only.
_HEADER = struct.Struct("<Q")


# A worker's first lines: the current directory off sys.path (a module file there must
# not shadow a library), then the serving loop of the module named in argv.
_BOOTSTRAP = (
    "import os, sys; cwd = os.getcwd(); "
    "sys.path[:] = [p for p in sys.path if p not in ('', '.', cwd)]; "
    "import importlib; importlib.import_module(sys.argv[1]).serve()"
)


def functions() -> dict:
    """What a worker may be asked to run, by name."""
    from chute.ingest import decode, encode

    return {
        "probe_chunk": decode.probe_chunk,
        "encode_chunk": encode.encode_chunk,
        "encode_columns": encode.encode_columns,
    }


def check_workers(workers: int | None) -> int:
    """``workers`` validated; ``None`` means every available core."""
    if workers is None:
        return available_cores()
    return checks.int_in("workers", workers, 1, 1024)


def task_cost(task: tuple) -> int:
    """The work a task carries: the number of items in its first argument (a chunk of
    images), or 1.

    Example:
        >>> task_cost(([("a", 0, "a.png"), ("b", 1, "b.png")], "spec", 10)), task_cost((3,))
        (2, 1)
    """
    first = task[0] if task else None
    # a list of items, or a chunk of them by column (chute.ingest.encode.Chunk)
    sized = isinstance(first, Sized) and not isinstance(first, str | bytes)
    return max(1, len(first)) if sized else 1


def chunk_bounds(length: int, size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of the fewest chunks of at most ``size`` that cover ``length``
    items, as equal as they can be: 65 items in chunks of 64 are 32 + 33, not 64 + 1.

    Example:
        >>> chunk_bounds(65, 64)
        [(0, 32), (32, 65)]
        >>> chunk_bounds(128, 64), chunk_bounds(0, 64)
        ([(0, 64), (64, 128)], [])
    """
    # The fewest chunks first, then spread evenly: no chunk is left with a handful of items.
    count = -(-length // size)
    return [(length * i // count, length * (i + 1) // count) for i in range(count)]


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

    A worker that dies (a decoder crashing the process, an out-of-memory kill)
    is replaced and its unfinished tasks are sent again; a task it was
    running when it died is tried once more, and if that kills a worker too,
    ``on_crash(function, task, exit_code)`` gives its result instead (the
    conversion rejects the task's files): a crash never ends the run.

    Workers start from a bootstrap that keeps the current directory off
    ``sys.path`` (a ``numpy.py`` there must not run in every worker).

    Example:
        >>> with WorkerPool(2) as pool:  # doctest: +SKIP
        ...     results = list(pool.ordered("probe_chunk", tasks))
    """

    def __init__(self, workers: int, *, module: str = __name__, on_crash: Callable | None = None):
        # The folder holding chute: a worker imports this very copy, even from a source checkout.
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # PYTHONSAFEPATH (Python 3.11+) keeps the current folder off sys.path; _BOOTSTRAP too.
        self._env = dict(os.environ, PYTHONSAFEPATH="1")
        self._env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [package_root, self._env.get("PYTHONPATH")])
        )
        self._module = module
        self._on_crash = on_crash
        self._procs = [self._start() for _ in range(workers)]
        # per worker: the tasks sent and not answered yet, oldest first:
        # [function, task, tries, cost]; and the sum of their costs
        self._pending: list[collections.deque] = [collections.deque() for _ in range(workers)]
        self._load = [0] * workers
        self._broken = False

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, self._module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self._env,
        )

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(kill=exc_type is not None)

    def ordered(self, function: str, tasks: Iterable[tuple], window: int | None = None) -> Iterator:
        """Results of ``function(*task)``, in task order.

        Each task goes to the worker with the least work pending (its items, see
        :func:`task_cost`), so a shard's short last chunk never leaves a worker
        idle behind another's full ones. At most ``window`` tasks (default four
        per worker) are in flight, which bounds memory whatever the dataset size.
        """
        if self._broken:
            raise RuntimeError("the worker pool is broken by an earlier error; start a new one")
        window = window or 4 * len(self._procs)
        in_flight: list[int] = []  # worker of each pending task, oldest first
        for task in tasks:
            worker = min(range(len(self._procs)), key=self._load.__getitem__)
            cost = task_cost(task)
            self._pending[worker].append([function, task, 1, cost])
            self._load[worker] += cost
            # a dead worker: reading its next result notices, and replaces it
            with contextlib.suppress(BrokenPipeError):
                _send(self._procs[worker].stdin, (function, task))
            in_flight.append(worker)
            # The window is full: the oldest result is read before more is sent (bounded memory).
            if len(in_flight) >= window:
                yield self._result(in_flight.pop(0))
        while in_flight:
            yield self._result(in_flight.pop(0))

    def _result(self, worker: int) -> Any:
        """The result of ``worker``'s oldest pending task."""
        self._broken = True  # until this result is read intact
        while True:
            try:
                status, value = _receive(self._procs[worker].stdout)
                break
            except EOFError:
                crashed = self._replace(worker)
                if crashed is not None:
                    self._broken = False
                    return crashed
        self._load[worker] -= self._pending[worker].popleft()[3]
        if status == "error":
            raise RuntimeError(f"worker process failed:\n{value}")
        self._broken = False
        return value

    def _replace(self, worker: int) -> Any:
        """Starts a new process for a dead worker and sends it the dead one's pending
        tasks again. Returns the crash result of the task it died on when that task
        has now killed two processes, else None."""
        code = self._procs[worker].wait()
        with contextlib.suppress(OSError):
            self._procs[worker].stdin.close()
        self._procs[worker].stdout.close()
        pending = self._pending[worker]
        function, task, tries, cost = pending[0]
        crashed = None
        # Twice on one task: that task is the cause, not bad luck, so it is given up.
        if tries >= 2 or self._on_crash is None:
            if self._on_crash is None:
                raise ChuteError(
                    f"a worker process died (exit code {code}); out of memory? Run the same "
                    "command again to resume, with fewer workers if it happens again"
                )
            log.warning("a worker process died twice on one task (exit code %d)", code)
            pending.popleft()
            self._load[worker] -= cost
            crashed = self._on_crash(function, task, code)
        else:
            log.warning("a worker process died (exit code %d); starting another", code)
            pending[0][2] += 1
        self._procs[worker] = self._start()
        # The replacement starts with nothing: every task the dead one held is sent again, in order.
        for function, task, *_ in pending:
            with contextlib.suppress(BrokenPipeError):  # died again: read, noticed, replaced
                _send(self._procs[worker].stdin, (function, task))
        return crashed

    def close(self, *, kill: bool = False) -> None:
        """Stops the workers: at once with ``kill`` (after an error), else when idle."""
        for proc in self._procs:
            if kill:
                proc.kill()
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in self._procs:
            try:
                # A worker ends once stdin closes and its task is done; a hung one is killed.
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()


class InlinePool:
    """The same interface, working in this process (one worker, or tiny jobs).

    Pillow's decompression-bomb guard stays on here (a host process's setting);
    images it refuses are rejected.
    """

    def __enter__(self) -> InlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def ordered(self, function: str, tasks: Iterable[tuple], window: int | None = None) -> Iterator:
        """Results of ``function(*task)``, in task order."""
        fn = functions()[function]
        for task in tasks:
            yield fn(*task)

    def close(self) -> None:
        """Nothing to stop."""


def start_pool(workers: int, on_crash: Callable | None = None) -> WorkerPool | InlinePool:
    """Worker processes, or an inline pool when ``workers`` is 1."""
    return WorkerPool(workers, on_crash=on_crash) if workers > 1 else InlinePool()


def serve(table: dict | None = None) -> None:
    """A worker's loop: read tasks from stdin (in a thread, so the parent never
    blocks writing while this process writes a large result), run, reply.

    ``table`` maps task names to functions (default: :func:`functions`).
    """
    import signal

    from PIL import Image

    # Workers enforce the conversion's own pixel limit (max_pixels) and reject
    # larger images, rather than Pillow warning or raising at its built-in one.
    Image.MAX_IMAGE_PIXELS = None
    table = functions() if table is None else table
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed must not corrupt the result stream
    tasks: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            try:
                tasks.put(_receive(stdin))
            except EOFError:
                # None: the parent closed stdin, so the loop below ends.
                tasks.put(None)
                return

    threading.Thread(target=read, daemon=True).start()
    while (task := tasks.get()) is not None:
        function, args = task
        try:
            if function not in table:
                raise ValueError(f"unknown worker function {function!r}")
            _send(stdout, ("ok", table[function](*args)))
        except Exception:
            import traceback

            # The traceback as text: the exception itself may not pickle.
            _send(stdout, ("error", traceback.format_exc()))


if __name__ == "__main__":
    serve()
