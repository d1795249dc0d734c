"""The one exception type for user mistakes.

Everything a user can get wrong (a bad option value, a missing source, an
output folder that holds something else) raises :class:`ChuteError` with a
message that names the argument, the value received and what is allowed. The
CLI turns it into one line on stderr and a non-zero exit code, never a
traceback.
"""

from __future__ import annotations


class ChuteError(ValueError):
    """A user error with a message fit to show as is.

    Example:
        >>> raise ChuteError("`color_mode` must be one of {'grayscale', 'rgb'}. Received: 'cmyk'")
        Traceback (most recent call last):
        ...
        chute.errors.ChuteError: `color_mode` must be one of {'grayscale', 'rgb'}. Received: 'cmyk'
    """
