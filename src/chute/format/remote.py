"""fsspec filesystems for the storage layer: the URLs they take, one per scheme, errors in a line.

``s3://`` (s3fs) and every other URL whose scheme fsspec knows and TensorFlow does not
(``memory://``, ``az://``, ...) are read and written through fsspec, so nothing remote
needs TensorFlow. TensorFlow's own filesystems (``ram://``, and ``gs://`` while
TensorFlow is installed) stay with ``tf.io.gfile``, where tf.data opens files itself.

Credentials come from each store's own chain (for S3: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, an instance role; ``AWS_ENDPOINT_URL`` for
an S3-compatible store); they never appear in a message.

Example:
    >>> fs, key = filesystem("memory://notes/a.txt")
    >>> key
    '/notes/a.txt'
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

from chute.errors import ChuteError

# TensorFlow's in-process filesystem: tf.data reads it, nothing else can
_TF_ALWAYS = frozenset({"ram"})
# gs:// stays on tf.io.gfile while TensorFlow is installed (gcsfs takes it in a later step)
_TF_WHEN_INSTALLED = frozenset({"gs"})
# folders are key prefixes: nothing to create, and a missing bucket is worth naming
_BUCKETS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
_INSTALL = {"s3": "pip install 'chute[s3]'", "s3a": "pip install 'chute[s3]'"}
# the environment a filesystem object is made from (its credentials and endpoint)
_ENVIRONMENT = ("AWS_", "FSSPEC_", "GOOGLE_", "AZURE_")
_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")

_filesystems: dict[tuple, Any] = {}
_found_buckets: set[tuple[int, str]] = set()
_lock = threading.Lock()


def scheme(path: str) -> str:
    """The URL scheme of ``path``, lower case (``""`` for a plain path)."""
    return path.split("://", 1)[0].lower() if "://" in path else ""


def handles(path: str) -> bool:
    """Whether a (non-local) ``path`` goes through fsspec rather than ``tf.io.gfile``."""
    name = scheme(path)
    if name in _TF_ALWAYS or (name in _TF_WHEN_INSTALLED and _tensorflow_installed()):
        return False
    from fsspec.registry import known_implementations, registry

    return name in known_implementations or name in registry


def _tensorflow_installed() -> bool:
    if "tensorflow" in sys.modules:  # imported, or set to None (treated as absent)
        return sys.modules["tensorflow"] is not None
    return importlib.util.find_spec("tensorflow") is not None


def object_store(path: str) -> bool:
    """Whether ``path`` is in a bucket, where folders are only key prefixes."""
    return scheme(path) in _BUCKETS


def filesystem(path: str) -> tuple[Any, str]:
    """``(the fsspec filesystem for path's scheme, path as that filesystem names it)``.

    One object per scheme, process and environment: a forked process makes its own
    (an s3fs client is bound to its parent's event loop), and changed credentials or
    endpoint variables give a new one. Listings are never cached: another process
    (a conversion being resumed, a second host) may have written since.

    Raises:
        ChuteError: the package for the scheme (s3fs, ...) is not installed.
    """
    name = scheme(path)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT)))
    key = (name, os.getpid(), env)
    fs = _filesystems.get(key)
    if fs is None:
        import fsspec

        with _lock:
            fs = _filesystems.get(key)
            if fs is None:
                try:
                    fs = fsspec.filesystem(name, skip_instance_cache=True, use_listings_cache=False)
                except ImportError as error:
                    raise ChuteError(_missing_package(path, error)) from None
                _filesystems[key] = fs
    return fs, fs._strip_protocol(path)


def _missing_package(path: str, error: ImportError) -> str:
    name = scheme(path)
    from fsspec.registry import known_implementations

    hint = _INSTALL.get(name) or known_implementations.get(name, {}).get("err") or str(error)
    return f"Reading or writing {path!r} needs the {name}:// filesystem, not installed here: {hint}"


def url(fs: Any, base_url: str, base_key: str, key: str) -> str:
    """The URL of ``key`` (a path as ``fs`` names it), spelled like ``base_url`` (whose
    own key is ``base_key``) when it lies under it: callers compare and cut paths."""
    base_url, base_key = base_url.rstrip("/"), base_key.rstrip("/")
    if key.rstrip("/") == base_key:
        return base_url
    if key.startswith(base_key + "/"):
        return base_url + key[len(base_key) :]
    return fs.unstrip_protocol(key)


def glob_base(pattern: str) -> str:
    """The part of URL ``pattern`` before the folder holding its first wildcard."""
    head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    return head[: head.rfind("/")] if head.rfind("/") > head.find("://") + 2 else head


@contextlib.contextmanager
def errors(path: str, *, bucket: bool = True) -> Iterator[None]:
    """Turns a store's refusals into one ChuteError naming ``path`` and what to do: no
    permission or bad credentials, no credentials, no such bucket (checked when
    ``bucket``), an unreachable endpoint. A missing object stays a FileNotFoundError
    (callers expect one, as from ``open``)."""
    try:
        yield
    except ChuteError:
        raise
    except PermissionError as error:
        raise ChuteError(
            f"No access to {path!r}: {_scrub(error)}. Check the credentials ({_chain(path)}) "
            "and that they may read and write this bucket"
        ) from None
    except FileNotFoundError:
        if bucket:
            check_bucket(path)
        raise
    except Exception as error:
        if not (type(error).__module__ or "").startswith(("botocore", "aiobotocore", "s3fs")):
            raise
        if "Credentials" in type(error).__name__:  # none found, or half of a pair
            raise ChuteError(
                f"No credentials for {path!r} ({_scrub(error)}): set {_chain(path)}"
            ) from None
        raise ChuteError(
            f"Cannot reach {path!r}: {_scrub(error)}. Check the endpoint and the network "
            f"({_chain(path)})"
        ) from None


def check_bucket(path: str) -> None:
    """Raises a ChuteError when the bucket of ``path`` does not exist (asked once per
    bucket and filesystem while it is there)."""
    if not object_store(path):
        return
    fs, key = filesystem(path)
    bucket = key.split("/", 1)[0]
    if not bucket or (id(fs), bucket) in _found_buckets:
        return
    with errors(path, bucket=False):
        found = fs.exists(bucket)
    if not found:
        raise ChuteError(
            f"No bucket {bucket!r} (in {path!r}): check the name and the account or endpoint "
            f"it is in ({_chain(path)}), or create it first"
        )
    _found_buckets.add((id(fs), bucket))


def _chain(path: str) -> str:
    if scheme(path) in ("s3", "s3a"):
        return (
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or an instance "
            "role; AWS_ENDPOINT_URL for an S3-compatible store"
        )
    return f"the {scheme(path)}:// store's standard credentials"


def _scrub(error: BaseException) -> str:
    """The error's first line, with any credential from the environment blanked out."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    for name in _SECRETS:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "***")
    return text.rstrip(".")
