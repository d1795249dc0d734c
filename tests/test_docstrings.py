"""The examples in docstrings are true: every module that does not load TensorFlow, Keras
or JAX runs its ``>>>`` examples as doctests (examples that need files on disk are marked
``# doctest: +SKIP``)."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

import chute

SRC = Path(chute.__file__).parent
# A module that imports one of these (directly or through chute.lazy) is left to its own tests.
_HEAVY = re.compile(
    r"^\s*(?:from\s+(?:tensorflow|keras|jax)\b|import\s+(?:tensorflow|keras|jax)\b"
    r"|from\s+chute\.lazy\s+import\b)",
    re.MULTILINE,
)


def _light_modules() -> list[str]:
    names = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__main__.py" or _HEAVY.search(path.read_text(encoding="utf-8")):
            continue
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


LIGHT = _light_modules()


def test_most_modules_are_light_enough_to_run_their_examples():
    assert len(LIGHT) >= 30, LIGHT


@pytest.mark.parametrize("name", LIGHT)
def test_docstring_examples_hold(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name, globs=vars(module).copy()):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
