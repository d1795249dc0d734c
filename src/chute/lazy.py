"""TensorFlow and Keras, imported on first use.

Importing TensorFlow takes seconds and hundreds of MB, so no chute module
imports it at import time: ``chute --help`` is instant, and a local
conversion (and every worker process) never loads it. A module that needs it
says so once, at its top, and uses the names as usual::

    from chute.lazy import keras, tf

    def decode(data):
        return tf.io.decode_png(data)  # TensorFlow is imported here, the first time

Example:
    >>> from chute.lazy import tf
    >>> tf.constant(2).numpy()  # doctest: +SKIP
    2
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

from chute.errors import ChuteError

# What to install when a module is missing: TensorFlow is the user's choice of build, never a
# hard requirement that would lay the plain wheel over a TPU VM's or a CUDA image's own.
# chute's extras, in every message that asks for TensorFlow (fit.backend's too).
TENSORFLOW_BUILDS = (
    "pip install 'chute[tensorflow]' (CPU or GPU), 'chute[tensorflow-cpu]' (beside JAX, "
    "e.g. on a TPU VM), or keep the machine's own (tensorflow-tpu, tf-nightly, a "
    "preinstalled wheel)"
)
INSTALL = {
    "tensorflow": (
        "chute reads and trains with TensorFlow, which is not installed here. Install the "
        f"build for this machine beside chute: {TENSORFLOW_BUILDS}"
    ),
    "keras": "chute needs Keras 3: pip install 'keras>=3'",
}


# TensorFlow's native libraries print start-up lines (oneDNN, "Could not find cuda drivers")
# to file descriptor 2 before its logging reads TF_CPP_MIN_LOG_LEVEL; the CLI drops them
# (see quiet_native_start) unless asked to show everything.
_QUIET_START = {"on": False}
_IMPORT_TENSORFLOW = ("tensorflow", "keras")  # Keras on its TensorFlow backend imports it


def quiet_native_start() -> None:
    """Drops what TensorFlow's native libraries print while it is imported (the CLI's
    default; TF_CPP_MIN_LOG_LEVEL quiets what they print later)."""
    _QUIET_START["on"] = True


@contextlib.contextmanager
def _native_stderr_dropped() -> Iterator[None]:
    """File descriptor 2 pointed at the null device for the block (Python's own
    ``sys.stderr`` writes are flushed first and go on as before afterwards)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no descriptor 2 to point elsewhere
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class LazyModule(types.ModuleType):
    """A stand-in for a module that imports it on the first attribute access."""

    def __init__(self, name: str):
        super().__init__(name)
        self._module: types.ModuleType | None = None

    def _load(self) -> types.ModuleType:
        if self._module is None:
            quiet = (
                _QUIET_START["on"]
                and self.__name__ in _IMPORT_TENSORFLOW
                and "tensorflow" not in sys.modules
            )
            try:
                with _native_stderr_dropped() if quiet else contextlib.nullcontext():
                    self._module = importlib.import_module(self.__name__)
            except ModuleNotFoundError as error:
                missing = (error.name or "").split(".")[0]
                if missing in INSTALL:
                    raise ChuteError(INSTALL[missing]) from None
                raise
        return self._module

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._load(), attribute)

    def __dir__(self) -> list[str]:
        return dir(self._load())


def installed(name: str) -> bool:
    """Whether module ``name`` can be imported here, without importing it (a module set to
    None in ``sys.modules`` counts as absent, as Python's import does).

    Example:
        >>> installed("chute"), installed("no_such_module")
        (True, False)
    """
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is not there, or no __spec__
        return False


tf: Any = LazyModule("tensorflow")
keras: Any = LazyModule("keras")
