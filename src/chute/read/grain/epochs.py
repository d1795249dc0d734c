"""A plain Grain dataset's epochs (``for batch in train``, Keras's ``fit``): one stream
read across epochs, so worker processes start once, and Keras told nothing false.

Keras iterates its training data anew each epoch, and its validation data at the end of
each. A new Grain iterator each time would start its worker processes again: each start
costs seconds (a spawned process imports the main script's modules: TensorFlow, Keras),
more on a loaded machine, for every epoch and every validation. So a plain dataset keeps
one iterator (:class:`Reader`) over its stream of batches, the epochs one after another
(evaluation: the split again and again), and each ``iter()`` is an
:class:`EpochIterator` over one epoch of it. Every batch is a pure function of its
number, so an epoch read again, or from a restored state, is the same batches.

Keras cannot learn a Grain dataset's length (its adapter says none), so at the end of
the first epoch it warns "Your input ran out of data; interrupting training" though the
epoch was whole. :func:`epoch_read` notes an epoch read to its end, and that one warning,
following at once, is not shown; any other is.

Example:
    >>> train = chute.load("./kn-shards", engine="grain", workers=2)  # doctest: +SKIP
    >>> peek = next(iter(train))  # epoch 0, left part-way  # doctest: +SKIP
    >>> first = list(train)  # epoch 0 again, whole, from the same workers  # doctest: +SKIP
    >>> train.epoch, len(first) == len(train)  # doctest: +SKIP
    (1, True)
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from typing import Any

# Keras's warning when a dataset ends before the steps it expected (or, with no steps
# known, at the end of the first epoch).
_RAN_OUT = "Your input ran out of data"
_WARNING_WINDOW_S = 30.0  # an epoch's end and Keras's warning about it: the same moment
_ended = {"at": None}  # monotonic time of the last epoch read to its end
_hook_lock = threading.Lock()


class Reader:
    """The plain dataset's one iterator over its stream, kept across epochs and across
    Keras's train/validation switches.

    A read at the position the iterator is at goes on; at an epoch start it saw before
    (an iterator left part-way and read again, as Keras's first look at the shapes
    leaves one) it moves back with Grain's ``set_state``, the workers staying; anywhere
    else it starts anew there.
    """

    _MARKS = 4  # epoch starts remembered (their Grain states: a few hundred bytes each)

    def __init__(self, dataset: Any):
        self.dataset, self.iterator, self.next = dataset, None, 0
        self.marks: dict[int, Any] = {}
        self.lock = threading.Lock()  # Keras may read from a thread of its own

    def read(self, number: int) -> Any:
        """Batch ``number`` of the stream."""
        with self.lock:
            if self.iterator is None or number != self.next:
                self._seek(number)
            if number % self.dataset.batches.steps == 0 and number not in self.marks:
                self.marks[number] = self.iterator.get_state()
                for old in sorted(self.marks)[: -self._MARKS]:
                    del self.marks[old]
            batch = next(self.iterator)
            self.next = number + 1
            return batch

    def _seek(self, number: int) -> None:
        if self.iterator is not None and number in self.marks:
            self.iterator.set_state(self.marks[number])
        else:
            self.close()
            self.iterator = self.dataset._stream_from(number)
            self.marks = {number: self.iterator.get_state()}
        self.next = number

    def close(self) -> None:
        """Ends the iterator (its worker processes); a later read starts another."""
        if self.iterator is not None and hasattr(self.iterator, "close"):
            self.iterator.close()
        self.iterator, self.marks = None, {}


@functools.cache
def epoch_iterator(grain: Any) -> type:
    """The class of a plain dataset's ``iter()`` (made once Grain is imported)."""

    class EpochIterator(grain.DatasetIterator):
        """One epoch of a plain dataset (evaluation: one pass over the split; with
        ``repeat``, the stream without end), read through the dataset's :class:`Reader`.
        Its state is where it is, ``{"epoch", "batch"}``: a few bytes that ``set_state``
        restores in any process, with any number of workers."""

        def __init__(self, dataset: Any, epoch: int, batch: int):
            super().__init__()
            self.dataset, self.epoch, self.batch = dataset, epoch, batch

        def __next__(self):
            dataset = self.dataset
            steps = dataset.batches.steps
            if self.batch >= steps and not dataset.plan.repeat:
                # Read to its end: the next iter() reads the next epoch (evaluation: again).
                dataset.epoch = max(dataset.epoch, self.epoch + 1)
                epoch_read()
                raise StopIteration
            batch = dataset._read_at(self.epoch * steps + self.batch)
            self.batch += 1
            return batch

        def get_state(self) -> dict[str, int]:
            return {"epoch": self.epoch, "batch": self.batch}

        def set_state(self, state: dict[str, int]) -> None:
            self.epoch, self.batch = int(state["epoch"]), int(state["batch"])

    return EpochIterator


def epoch_read() -> None:
    """Notes that an epoch was read to its end now: Keras's warning that the input ran
    out, if it follows, says nothing true."""
    _ended["at"] = time.monotonic()
    with _hook_lock:
        if not getattr(warnings.showwarning, "_chute", False):
            warnings.showwarning = _quiet_about_whole_epochs(warnings.showwarning)


def _quiet_about_whole_epochs(show):
    """``warnings.showwarning`` (Python's documented hook) without Keras's "ran out of
    data" right after an epoch read whole; every other warning shown by ``show``."""

    @functools.wraps(show)
    def showwarning(message, category, filename, lineno, file=None, line=None):
        ended = _ended["at"]
        if (
            _RAN_OUT in str(message)
            and ended is not None
            and time.monotonic() - ended < _WARNING_WINDOW_S
        ):
            _ended["at"] = None  # one warning per epoch's end
            return
        show(message, category, filename, lineno, file, line)

    showwarning._chute = True
    return showwarning
