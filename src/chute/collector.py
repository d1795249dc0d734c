"""Python's cyclic garbage collector paused around work that makes no cycles worth collecting.

With TensorFlow loaded, one full collection walks hundreds of thousands of
objects, and it runs whenever enough objects have been allocated: in a
conversion's item loop, or in whichever timed pass of a benchmark happens to
trigger it.

Example:
    >>> with paused():
    ...     items = [object() for _ in range(100_000)]
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused(*, collect_first: bool = False) -> Iterator[None]:
    """Disables the cyclic collector inside the block, re-enabling it after
    only if it was enabled before.

    Args:
        collect_first: collect once before pausing, so that garbage made
            earlier does not wait (a benchmark's timed sections start even).
    """
    if collect_first:
        gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
