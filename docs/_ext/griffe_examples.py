"""A griffe extension for the API reference, so that chute's docstrings read as they are.

They title their doctests ``Example:`` (Google's style guide spells it so, and Napoleon
reads both): griffe's Google parser knows only ``Examples:``, and would render them as
prose. They name other objects with Sphinx roles (``:func:`load```), which Markdown shows
as written: they become code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc):`~?([^`]+)`")


class ExampleSections(griffe.Extension):
    """Reads ``Example:`` sections as ``Examples:`` ones, and Sphinx roles as code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _ROLE.sub(r"`\1`", value)
