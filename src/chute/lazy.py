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

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """A stand-in for a module that imports it on the first attribute access."""

    def __init__(self, name: str):
        super().__init__(name)
        self._module: types.ModuleType | None = None

    def _load(self) -> types.ModuleType:
        if self._module is None:
            self._module = importlib.import_module(self.__name__)
        return self._module

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._load(), attribute)

    def __dir__(self) -> list[str]:
        return dir(self._load())


tf: Any = LazyModule("tensorflow")
keras: Any = LazyModule("keras")
