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
import functools
import importlib
import importlib.util
import json
import os
import shlex
import sys
import types
from collections.abc import Iterator
from typing import Any

from chute.errors import ChuteError


@functools.cache
def _origin() -> tuple[str, bool] | None:
    """The folder or wheel file pip installed chute from, and whether editably (PEP 610's
    ``direct_url.json``); None when unknown or no longer there."""
    import urllib.parse
    import urllib.request
    from importlib import metadata

    try:
        info = json.loads(metadata.distribution("chute").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return None
    url = urllib.parse.urlparse(info.get("url", ""))
    path = urllib.request.url2pathname(url.path)
    if url.scheme != "file" or not os.path.exists(path):
        return None
    return path, bool(info.get("dir_info", {}).get("editable"))


def extra(name: str, instead: str = "") -> str:
    """The command that adds chute's extra ``name`` (``or pip install {instead}`` after it).

    chute is not on PyPI, so ``pip install 'chute[NAME]'`` finds nothing: the command names
    what this chute was installed from (its clone, or its wheel file), and a clone's
    ``pip install -e '.[NAME]'`` where that is not known.

    Example:
        >>> extra("grain", instead="grain")  # doctest: +SKIP
        "pip install -e '/home/me/chute[grain]' (or pip install grain)"
    """
    origin = _origin()
    if origin is None:
        command = f"pip install -e '.[{name}]' in a clone of chute"
    else:
        path, editable = origin
        command = f"pip install {'-e ' if editable else ''}{shlex.quote(f'{path}[{name}]')}"
    return f"{command} (or pip install {instead})" if instead else command


def tensorflow_builds() -> str:
    """What to install for TensorFlow, in every message that asks for it: TensorFlow is the
    user's choice of build, never a hard requirement that would lay the plain wheel over a TPU
    VM's or a CUDA image's own, so chute's extras, or the machine's own build."""
    return (
        f"{extra('tensorflow')} (CPU or GPU; [tensorflow-cpu] beside JAX, e.g. on a TPU VM), "
        "or keep the machine's own (tensorflow-tpu, tf-nightly, a preinstalled wheel)"
    )


def _install(module: str) -> str | None:
    """What to install when ``module`` is missing; None for a module chute names nothing for."""
    if module == "tensorflow":
        return (
            "chute reads and trains with TensorFlow, which is not installed here. Install the "
            f"build for this machine beside chute: {tensorflow_builds()}"
        )
    if module == "keras":
        return "chute needs Keras 3: pip install 'keras>=3'"
    return None


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
                hint = _install((error.name or "").split(".")[0])
                if hint:
                    raise ChuteError(hint) from None
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
