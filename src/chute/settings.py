"""Option dataclasses' fields: each default, its help and its command-line form in one place.

:class:`~chute.ingest.options.ConvertOptions` and
:class:`~chute.fit.config.TrainConfig` declare their fields with
:func:`option`; the CLI builds its flags (``--image-size``, ``--epochs``, ...)
and their help from them, so a default is written once.

Example:
    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Options:
    ...     epochs: int = option(10, "passes over the training split")
    >>> dataclasses.fields(Options)[0].metadata["help"]
    'passes over the training split'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from chute.errors import ChuteError

T = TypeVar("T")


def option(
    default: Any,
    help: str,
    *,
    type: Any = None,
    choices: tuple | None = None,
    metavar: str | None = None,
    flag: bool = True,
) -> Any:
    """A dataclass field with a default and what the CLI needs to offer it as a flag.

    Args:
        default: the default value (the only place it is written).
        help: one line for ``--help``; the default is appended by the CLI.
        type: how the CLI parses the flag's text (default: the default's type;
            ``bool`` fields become on/off switches).
        choices: the values the flag accepts.
        metavar: the flag's placeholder in ``--help``.
        flag: False for fields the CLI does not offer.
    """
    metadata = {"help": help, "type": type, "choices": choices, "metavar": metavar, "flag": flag}
    return dataclasses.field(default=default, metadata=metadata)


def from_mapping(cls: type[T], values: Mapping[str, Any], what: str) -> T:
    """``cls(**values)``; unknown keys are named in the error (``what``: "option", ...)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ChuteError(f"Unknown {what}(s) {unknown}. Allowed: {sorted(fields)}")
    return cls(**values)
