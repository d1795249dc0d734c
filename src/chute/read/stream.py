"""Where a reader stands in a split's stream of training batches: the one type that a
resumed run (``chute.fit``) hands the Grain engine.

Example:
    >>> StreamPosition(epoch=3, batch=4)
    StreamPosition(epoch=3, batch=4, offset=0)
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StreamPosition:
    """A place in a split's training batches, global to every input pipeline.

    Attributes:
        epoch: the data epoch (0-based; each a new draw of the split).
        batch: the batch of that epoch to read first (0: its first), counted from
            ``offset``.
        offset: examples of that epoch's order read before batch 0 by a run of another
            global batch size (0: none), so that a resumed run with a new batch size goes
            on at the example where the last one stopped.
    """

    epoch: int
    batch: int = 0
    offset: int = 0
