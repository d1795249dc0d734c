"""Argument checks shared by every public function, with one style of message.

Each check returns the value it accepted (normalised where that helps) or
raises :class:`~chute.errors.ChuteError` naming the argument, what is
allowed and the value received, as Keras words it::

    `batch_size` must be a positive integer. Received: batch_size=0

Example:
    >>> positive_int("epochs", 3)
    3
    >>> one_of("resize", "crop", ("stretch", "crop", "pad"))
    'crop'
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

from chute.errors import ChuteError


def bad_value(name: str, value: Any, allowed: str) -> ChuteError:
    """The error for argument ``name``: what is allowed and what was received."""
    return ChuteError(f"`{name}` must be {allowed}. Received: {name}={value!r}")


def one_of(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """``value`` if it is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise bad_value(name, value, "one of {" + ", ".join(repr(a) for a in allowed) + "}")
    return value


def is_int(value: Any) -> bool:
    """An integer (NumPy's too), and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def all_ints(values: list, minimum: int | None = None) -> bool:
    """Whether every value is an integer (:func:`is_int`), none below ``minimum``; fast
    for plain ints (what JSON gives), so a manifest of a million counts parses quickly.

    Example:
        >>> all_ints([0, 3]), all_ints([0, -1], minimum=0), all_ints([1, True]), all_ints([])
        (True, False, False, True)
    """
    if all(type(value) is int for value in values):
        return minimum is None or not values or min(values) >= minimum
    return all(is_int(value) and (minimum is None or value >= minimum) for value in values)


def int_in(name: str, value: Any, low: int, high: int | None = None, what: str = "") -> int:
    """An integer from ``low`` to ``high`` (no upper bound when ``high`` is None)."""
    if not is_int(value) or value < low or (high is not None and value > high):
        allowed = what or (
            f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"
        )
        raise bad_value(name, value, allowed)
    return int(value)


def positive_int(name: str, value: Any, what: str = "a positive integer") -> int:
    """An integer of at least 1."""
    return int_in(name, value, 1, what=what)


def optional_positive_int(name: str, value: Any) -> int | None:
    """None, or an integer of at least 1."""
    return None if value is None else positive_int(name, value, "None or a positive integer")


def number_in(
    name: str, value: Any, low: float, high: float, *, high_open: bool = False, what: str = ""
) -> float:
    """A finite real number in ``[low, high]`` (``[low, high)`` with ``high_open``)."""
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value
        and (value < high if high_open else value <= high)
    )
    if not ok:
        bracket = ")" if high_open else "]"
        raise bad_value(name, value, what or f"a number in [{low:g}, {high:g}{bracket}")
    return float(value)


def positive_number(name: str, value: Any, what: str = "a positive number") -> float:
    """A finite real number above 0."""
    if (
        not isinstance(value, numbers.Real)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise bad_value(name, value, what)
    return float(value)


def optional_seed(name: str, value: Any) -> int | None:
    """None, or an integer seed from 0 to 2**63 - 1."""
    if value is None:
        return None
    return int_in(name, value, 0, 2**63 - 1, "None or an integer from 0 to 2**63 - 1")
