"""Where a reader stands in a split's stream of training batches: the one type that a
resumed run (``chute.fit``) hands the Grain engine.

Example:
    >>> StreamPosition(epoch=3, batch=4)
    StreamPosition(epoch=3, batch=4)
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StreamPosition:
    """A place in a split's training batches, global to every input pipeline.

    Attributes:
        epoch: the data epoch (0-based; each a new draw of the split).
        batch: the batch of that epoch to read first (0: its first).
    """

    epoch: int
    batch: int = 0
