"""Worker tasks for testing the worker pool: crashes, and who ran what (run in workers).

``serve()`` is what a worker started with ``module="crashy_tasks"`` runs.
"""

from __future__ import annotations

import os


def echo(items: list[str], marker_dir: str) -> list[str]:
    """Returns the items; ``"crash"`` kills the process every time, ``"crash-once"`` only
    the first time (a marker file remembers), as a decoder crash or an OOM kill would."""
    for item in items:
        if item == "crash":
            os._exit(7)
        if item == "crash-once":
            marker = os.path.join(marker_dir, "crashed-once")
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(9)
    return [item.upper() for item in items]


def whoami(items: list[str]) -> int:
    """The worker's process id (which worker a task went to)."""
    return os.getpid()


def serve() -> None:
    from chute.ingest.workers import serve as serve_tasks

    serve_tasks({"echo": echo, "whoami": whoami})
