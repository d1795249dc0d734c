"""Grain's worker processes: how many by default, and that they end with their parent and
leave nothing behind at exit.

Grain spawns its workers (on every OS), and a spawned process first runs the
main script again, all but what ``if __name__ == "__main__":`` guards. So
:func:`default_workers` (``workers=None``) is one process per core where that is
safe (a guarded script, ``chute train``, a notebook, ``python -c``, ``python -m
package``) and threads where it is not (``chute.load`` called at a script's
unguarded top level, as in most tutorials). :func:`end_with_parent` is the
workers' init hook: they end when their parent does, however it ends.
:func:`delivered` hands batches out of shared memory and closes iterators still
open at exit, before the interpreter tears down the modules Grain's finalizers use.

Example:
    >>> default_workers() >= 0
    True
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import functools
import gc
import inspect
import linecache
import logging
import os
import sys
import threading
import time
import weakref

import numpy as np

from chute.errors import ChuteError
from chute.machine import available_cores

log = logging.getLogger(__name__)

_PARENT_POLL_S = 0.25  # how often a worker process looks whether its parent is alive


def default_workers() -> int:
    """``workers=None``: one worker process per core where Grain can start them from
    here, else 0 (threads in this process), logged with the way to processes.

    Grain spawns its workers (on every OS), and a spawned process first runs the
    main script again as ``__mp_main__``: all of it but what ``if __name__ ==
    "__main__":`` guards. Called from a script's unguarded top level, each
    worker would reach this call again and try to start workers of its own, which
    Python refuses ("... before the current process has finished its bootstrapping
    phase") after running the script's work (a whole training) in each worker.
    """
    # An unguarded call would run again in each spawned worker (a whole training in each).
    unsafe = _unguarded_main_line()
    if unsafe is None:
        return available_cores()
    log.info(
        "grain engine: reading with threads in this process, not worker processes: "
        'chute.load runs outside `if __name__ == "__main__":` in %s (line %s), and each '
        "worker process would run that line again. Put the script's work under that guard "
        "for a worker process per core (or pass workers=0 to say threads)",
        unsafe[0],
        unsafe[1] or "unknown",
    )
    return 0


def check_processes(workers: int) -> None:
    """Refuses ``workers`` > 0 asked for from a script's unguarded top level, where each
    spawned worker would run the script again and Python would stop it (a ChuteError
    naming the line and the ways out, before any process starts).

    Example:
        >>> check_processes(0)  # threads: nothing to start
    """
    if workers <= 0:
        return
    unsafe = _unguarded_main_line()
    if unsafe is None or not unsafe[1]:  # safe, or the line is unknown: let Grain try
        return
    raise ChuteError(
        f"`workers`: got {workers} worker processes, which Grain spawns, and a spawned "
        f"process runs the main script again: chute.load runs outside "
        f'`if __name__ == "__main__":` in {unsafe[0]} (line {unsafe[1]}), so each worker '
        "would start workers of its own. Put the script's work under that guard, or pass "
        "workers=0 (threads in this process) or workers=None (chosen for you)"
    )


def _unguarded_main_line() -> tuple[str, int] | None:
    """``(file, line)`` of the main script's top-level statement running now when a
    spawned process would run it again (not under a ``__name__`` guard); None when
    nothing would (``python -c``, a notebook, ``python -m package``, a guarded line)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:  # python -m: spawn runs the module again, but not a __main__.py
        if name == "__main__" or name.endswith(".__main__"):
            return None
    elif getattr(main, "__file__", None) is None:  # python -c, the REPL, a notebook
        return None
    frame = _main_module_frame(vars(main))
    if frame is None:  # the script's top level is over (or unknown): assume the worst
        return (str(getattr(main, "__file__", "__main__")), 0)
    where = (frame.f_code.co_filename, frame.f_lineno)
    linecache.checkcache(where[0])  # the script as it is now (rerun after an edit)
    try:
        tree = ast.parse("".join(linecache.getlines(where[0], vars(main))))
    # The source cannot be read back: assume the line is unguarded.
    except (SyntaxError, ValueError):
        return where
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            guarded = node.body if _is_main_test(node.test) else None
            # `if __name__ != "__main__": ... else: ...` guards its else branch.
            if _is_main_test(node.test, negated=True):
                guarded = node.orelse
            if guarded and guarded[0].lineno <= where[1] <= guarded[-1].end_lineno:
                return None
    return where


def _main_module_frame(main_globals: dict):
    """The outermost frame running the main module's top-level code: on this thread's
    stack, else on the main thread's."""
    stacks = [inspect.currentframe()]
    if threading.current_thread() is not threading.main_thread():
        # From another thread, the script's top level is on the main thread's stack.
        stacks.append(sys._current_frames().get(threading.main_thread().ident))
    for frame in stacks:
        outer = None
        while frame is not None:
            if frame.f_globals is main_globals and frame.f_code.co_name == "<module>":
                # Kept going: the outermost <module> frame of __main__ is the script's own line.
                outer = frame
            frame = frame.f_back
        if outer is not None:
            return outer
    return None


def _is_main_test(test: ast.expr, negated: bool = False) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (``!=`` when ``negated``), alone or
    the first of an ``and``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and not negated:
        return _is_main_test(test.values[0])
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.NotEq if negated else ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = {side.id for side in sides if isinstance(side, ast.Name)}
    values = {side.value for side in sides if isinstance(side, ast.Constant)}
    return names == {"__name__"} and values == {"__main__"}


def end_with_parent(parent: int, worker: int, workers: int) -> None:
    """Grain's worker init hook: a daemon thread ends this worker process when its parent
    (pid ``parent``) is gone, however it ended. A ``kill -9`` runs no cleanup, so without
    it the workers live on, re-parented, waiting forever on a queue nobody reads (and
    holding the terminal's stdout). (Not ``PR_SET_PDEATHSIG``: it fires when the
    *thread* that started the process ends, and Grain starts them from pool threads.)"""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        # os._exit: the parent is gone, and a normal exit would wait on Grain's queues forever.
        os._exit(1)

    threading.Thread(target=watch, name="chute-parent-watch", daemon=True).start()


_OPEN_ITERATORS: weakref.WeakSet = weakref.WeakSet()


def delivered(iterator):
    """Grain's ``iterator`` over worker processes as chute hands it out: its batches as
    plain arrays, and closed and let go at exit if it is still open then.

    Batches come from the workers in shared memory, which Grain frees when the
    array is deleted. Copied out (a memory copy per batch), the block goes at once:
    a script's global ``images`` or iterator would otherwise live until the
    interpreter tears down its modules, where Grain's ``__del__``s fail on modules
    already gone (AttributeError tracebacks; the resource tracker's warning about
    leaked shared memory).
    """
    if not _OPEN_ITERATORS:
        # Registered after Grain imported multiprocessing, whose exit hook stops the pool
        # that frees shared memory: atexit runs the later first.
        atexit.unregister(_close_open_iterators)
        atexit.register(_close_open_iterators)
    wrapped = _delivered_class()(iterator)
    _OPEN_ITERATORS.add(wrapped)
    return wrapped


def _close_open_iterators() -> None:
    open_now = list(_OPEN_ITERATORS)
    for iterator in open_now:
        try:
            iterator.close()
        except Exception:  # exiting: one failure must not keep the others open
            log.debug("grain engine: closing an iterator at exit failed", exc_info=True)
    if open_now:
        gc.collect()  # what the iterators held in reference cycles goes now too


@functools.cache
def _delivered_class():
    import grain

    class Delivered(grain.DatasetIterator):
        """Grain's iterator ``inner`` as it is (its position, ``get_state``/``set_state``),
        its batches copied out of shared memory; ``close()`` closes it and lets it go."""

        def __init__(self, inner):
            super().__init__(inner)  # its parent: Grain shares the context down the chain

        def __next__(self):
            batch = next(self._inner())
            if isinstance(batch, tuple):
                return tuple(_plain(part) for part in batch)
            return _plain(batch)

        def get_state(self):
            return self._inner().get_state()

        def set_state(self, state) -> None:
            self._inner().set_state(state)

        def close(self) -> None:
            # Dropping the parents lets Grain's iterator (and its shared memory) go now.
            parents, self._parents = self._parents, ()
            self._closed = True
            for parent in parents:
                parent.close()

        def _inner(self):
            if not self._parents:
                raise ValueError("this Grain iterator is closed")
            return self._parents[0]

    return Delivered


def _plain(array: np.ndarray) -> np.ndarray:
    """``array`` as a plain ndarray: a copy of one in shared memory, whose block is
    unlinked here and now.

    Grain unlinks a block when its array is deleted, in a background thread (up to 50
    waiting): at exit those still waiting are never unlinked, and the resource tracker
    reports them as leaked (about 50 ``/dev/shm/psm_*`` left after a short script on a
    loaded machine). Unlinked here, the name is gone at once; the mapping goes with the
    array, and Grain's deletion then only closes it.
    """
    # type(), not isinstance: Grain's shared-memory arrays are ndarray subclasses.
    if type(array) is np.ndarray:
        return array
    copy = np.array(array)
    block = getattr(array, "shm", None)
    # Only a block this process is to unlink (Grain marks the receiving end's arrays), and
    # only where Grain's mark can be cleared after (so its deletion does not unlink again).
    if block is not None and getattr(array, "_unlink_on_del", False):
        with contextlib.suppress(FileNotFoundError):
            block.unlink()
        array._unlink_on_del = False
    return copy
