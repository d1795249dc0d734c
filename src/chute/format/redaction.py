"""Credentials taken out of locations before they are stored, logged or shown.

A location may carry a secret: ``http://user:password@host/list.csv``, an S3 or GCS
pre-signed URL (``X-Amz-Signature=...``, ``X-Goog-Credential=...``), an Azure SAS
(``sig=...``), an API ``token``. chute reads with the location as given, but what it
writes into a manifest, a log line, a summary or an error holds :func:`redact`'s form:
the password and the secret parameters' values replaced by ``***``, the rest kept so
the place stays recognisable.

Example:
    >>> redact("http://ann:pw@example.com/list.csv?sv=2024&sig=abc%2F")
    'http://ann:***@example.com/list.csv?sv=2024&sig=***'
    >>> redact_text("cannot read 'https://h/a.npz?X-Amz-Signature=f00': 403")
    "cannot read 'https://h/a.npz?X-Amz-Signature=***': 403"
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import ParamSpec, TypeVar
from urllib.parse import unquote

P = ParamSpec("P")
R = TypeVar("R")

MASK = "***"
# Query parameters whose value is a secret, by name (case-insensitive): SAS, pre-signed
# S3 and GCS URLs, OAuth and API tokens and keys. Named explicitly where short ("sig",
# "key"), by a telling word otherwise.
_SECRET_NAMES = frozenset({"sig", "key", "code", "pwd", "auth", "authorization"})
_SECRET_WORDS = re.compile(r"signature|credential|token|secret|passw|apikey|[-_]key$", re.I)
# A URL inside a longer text: its scheme, then everything up to a space or a quote.
_URL = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*")
# Containers are named where a password would be (``abfs://container@account...``).
_AZURE = frozenset({"az", "abfs", "abfss"})


def redact(location: str) -> str:
    """``location`` with its credentials replaced by ``***``: a URL's password (its
    whole user part when that may be a token) and the values of secret query parameters
    (``sig``, ``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``,
    ``X-Goog-Signature``, ``X-Goog-Credential``, ``token``, ``access_token``, ``key``,
    ``api_key``, ...). Local paths and ``hf:``/``keras:`` names come back as they are."""
    if "://" not in location:
        return location
    scheme, rest = location.split("://", 1)
    authority, tail = re.match(r"([^/?#]*)(.*)", rest, re.S).groups()  # type: ignore[union-attr]
    if "@" in authority:
        user, host = authority.rsplit("@", 1)
        name, colon, _ = user.partition(":")
        if colon:
            authority = f"{name}:{MASK}@{host}"
        elif scheme.lower() not in _AZURE:  # a lone user part may be a token (https://TOKEN@)
            authority = f"{MASK}@{host}"
    path, question, query = tail.partition("?")
    if question:
        query, hash_sign, fragment = query.partition("#")
        query = "&".join(_redact_parameter(part) for part in query.split("&"))
        tail = f"{path}?{query}{hash_sign}{fragment}"
    return f"{scheme}://{authority}{tail}"


def _redact_parameter(part: str) -> str:
    name, equals, value = part.partition("=")
    if equals and value and _secret(unquote(name)):
        return f"{name}={MASK}"
    return part


def _secret(name: str) -> bool:
    return name.lower() in _SECRET_NAMES or bool(_SECRET_WORDS.search(name))


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (see :func:`redact`)."""
    if "://" not in text:
        return text
    return _URL.sub(lambda found: redact(found.group(0)), text)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the URLs in each record's message (formatted once,
    here, so a location passed as an argument is redacted too); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: logging reports it when it formats it
            return True
        if "://" in message:
            redacted = redact_text(message)
            if redacted != message:
                record.msg, record.args = redacted, None
        return True


LOG_FILTER = RedactingFilter()


def redacting_errors(function: Callable[P, R]) -> Callable[P, R]:
    """Decorates an entry point that takes locations: the messages of the ChuteErrors
    and OSErrors it raises (whoever wrote them, down to a store's client) are redacted,
    the same exception raised on."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except (ValueError, OSError) as error:  # ChuteError is a ValueError
            redact_error(error)
            raise

    return wrapper


def redact_error(error: BaseException) -> None:
    """Redacts, in place, the URLs in an exception's message (its ``args``, and an
    OSError's ``strerror`` and file names, which its text is made of)."""
    error.args = tuple(redact_text(a) if isinstance(a, str) else a for a in error.args)
    if isinstance(error, OSError):
        for name in ("strerror", "filename", "filename2"):
            value = getattr(error, name, None)
            if isinstance(value, str):
                setattr(error, name, redact_text(value))
