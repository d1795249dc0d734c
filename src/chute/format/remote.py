"""fsspec filesystems for the storage layer: the URLs they take, one per scheme, errors in a line.

``s3://`` (s3fs), ``gs://`` (gcsfs), ``az://`` and ``abfs://`` (adlfs) and every other URL
whose scheme fsspec knows and TensorFlow does not (``memory://``, ...) are read and written
through fsspec, so nothing remote needs TensorFlow. TensorFlow's own filesystems stay with
``tf.io.gfile``: ``ram://``, and ``gs://`` when gcsfs is not installed but TensorFlow is.

Credentials come from each store's own chain; they never appear in a message:

- S3: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, an instance role;
  ``AWS_ENDPOINT_URL`` for an S3-compatible store.
- GCS: Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth
  application-default login``, the metadata server); none found: anonymous (public
  buckets). ``STORAGE_EMULATOR_HOST`` for an emulator (no credentials).
- Azure: ``AZURE_STORAGE_CONNECTION_STRING``, or ``AZURE_STORAGE_ACCOUNT_NAME`` with
  ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``, or the account name alone
  for ``DefaultAzureCredential``.

Example:
    >>> fs, key = filesystem("memory://notes/a.txt")
    >>> key
    '/notes/a.txt'
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

from chute.errors import ChuteError
from chute.lazy import extra

# TensorFlow's in-process filesystem: tf.data reads it, nothing else can
_TF_ALWAYS = frozenset({"ram"})
# TensorFlow's own GCS filesystem: what tf.data opens itself, and the storage layer's way to
# gs:// when gcsfs is not installed
_TF_WHEN_INSTALLED = frozenset({"gs"})
_GCS = frozenset({"gs", "gcs"})
_AZURE = frozenset({"az", "abfs", "abfss"})
# folders are key prefixes: nothing to create, and a missing bucket is worth naming
_BUCKETS = frozenset({"s3", "s3a"}) | _GCS | _AZURE
# scheme -> (chute's extra, the filesystem's own package)
_INSTALL = {
    **dict.fromkeys(("s3", "s3a"), ("s3", "s3fs")),
    **dict.fromkeys(_GCS, ("gcs", "gcsfs")),
    **dict.fromkeys(_AZURE, ("azure", "adlfs")),
}
# the environment a filesystem object is made from (its credentials and endpoint)
_ENVIRONMENT = ("AWS_", "FSSPEC_", "GOOGLE_", "AZURE_", "STORAGE_EMULATOR_HOST", "CLOUDSDK_")
_SECRETS = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_CLIENT_SECRET", "AZURE_CLIENT_SECRET",
)  # fmt: skip
# secrets spelled inside a longer text: a connection string's key, a SAS signature, a token
_SECRET_PARTS = re.compile(r"((?:AccountKey|SharedAccessSignature|sig)=)[^;&\s]+|(Bearer )\S+")
# the modules whose exceptions are a store's refusals (the rest are bugs, raised as they are)
_STORE_MODULES = (
    "botocore", "aiobotocore", "s3fs", "google.auth", "gcsfs", "aiohttp", "azure", "adlfs",
)  # fmt: skip
# Client loggers that repeat in many lines what chute raises as one: gcsfs logs each error it
# then raises (a traceback) and its fallbacks; the Azure SDK each request, headers and all.
_QUIET = {
    **dict.fromkeys(_GCS, ("gcsfs", logging.CRITICAL)),
    **dict.fromkeys(_AZURE, ("azure.core.pipeline.policies.http_logging_policy", logging.WARNING)),
}

_filesystems: dict[tuple, Any] = {}
_found_buckets: set[tuple[int, str]] = set()
# gs:// filesystems made without credentials (none were found): a 401 then means "none"
_anonymous: set[int] = set()
_lock = threading.Lock()


def scheme(path: str) -> str:
    """The URL scheme of ``path``, lower case (``""`` for a plain path)."""
    return path.split("://", 1)[0].lower() if "://" in path else ""


def handles(path: str) -> bool:
    """Whether a (non-local) ``path`` goes through fsspec rather than ``tf.io.gfile``."""
    name = scheme(path)
    if name in _TF_ALWAYS:
        return False
    # gcsfs first: no TensorFlow needed; TensorFlow's gs:// only when gcsfs is missing
    if name in _TF_WHEN_INSTALLED and not _installed("gcsfs") and _installed("tensorflow"):
        return False
    from fsspec.registry import known_implementations, registry

    return name in known_implementations or name in registry


def tensorflow_knows(path: str) -> bool:
    """Whether ``path``'s scheme is one of TensorFlow's own filesystems here (``ram://``,
    and ``gs://`` while TensorFlow is installed and no ``STORAGE_EMULATOR_HOST`` is set:
    TensorFlow's GCS client talks to Google's endpoint only), which tf.data opens itself."""
    name = scheme(path)
    if name in _TF_ALWAYS:
        return True
    emulated = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    return name in _TF_WHEN_INSTALLED and not emulated and _installed("tensorflow")


def _installed(module: str) -> bool:
    if module in sys.modules:  # imported, or set to None (treated as absent)
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


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
        ChuteError: the package for the scheme (s3fs, gcsfs, adlfs, ...) is not
            installed, or the store's credentials are missing or unusable.
    """
    name = scheme(path)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT)))
    account = _azure_account(path) if name in _AZURE else None
    key = (name, account, os.getpid(), env)
    fs = _filesystems.get(key)
    if fs is None:
        with _lock:
            fs = _filesystems.get(key)
            if fs is None:
                fs = _filesystems[key] = _make(path, account)
    return fs, fs._strip_protocol(path)


def _make(path: str, account: str | None) -> Any:
    """A new filesystem for ``path``'s scheme, with its store's credentials."""
    import fsspec

    name = scheme(path)
    if name in _QUIET and logging.getLogger(_QUIET[name][0]).level == logging.NOTSET:
        logging.getLogger(_QUIET[name][0]).setLevel(_QUIET[name][1])  # unless the user chose
    try:
        cls = fsspec.get_filesystem_class(name)
    except ImportError as error:
        raise ChuteError(_missing_package(path, error)) from None
    options: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
    if name in _GCS:
        return _gcs(path, cls, options)
    if name in _AZURE:
        if account:
            options["account_name"] = account
        elif not os.environ.get("AZURE_STORAGE_CONNECTION_STRING") and not os.environ.get(
            "AZURE_STORAGE_ACCOUNT_NAME"
        ):
            # adlfs would say only "Must provide either a connection_string or account_name"
            raise ChuteError(f"No credentials for {path!r}: set {_chain(path)}")
    with errors(path, bucket=False):
        try:
            return cls(**options)
        except ValueError as error:  # adlfs: a connection string or key it cannot use
            raise ChuteError(
                f"Cannot use the credentials for {path!r}: {_scrub(error)}. Check {_chain(path)}"
            ) from None


def _gcs(path: str, cls: Any, options: dict[str, Any]) -> Any:
    """A gcsfs filesystem: anonymous on an emulator, else Application Default Credentials;
    anonymous (public buckets) when none are found, remembered for a later refusal."""
    if os.environ.get("STORAGE_EMULATOR_HOST", "") not in ("", "default"):
        import gcsfs.core

        # gcsfs's default class also asks a gRPC API for each bucket's layout, which an
        # emulator does not serve (every call would wait on retries): the JSON API only
        return gcsfs.core.GCSFileSystem(token="anon", **options)
    from google.auth.exceptions import DefaultCredentialsError

    try:
        # ADC only: not gcsfs's own token cache in the home folder
        return cls(token="google_default", **options)
    except DefaultCredentialsError as error:
        if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):  # set, and unusable: say so
            raise ChuteError(
                f"No credentials for {path!r}: GOOGLE_APPLICATION_CREDENTIALS does not name "
                f"a usable credentials file ({_scrub(error)}). Set it to a service-account "
                "key file, or unset it to use the other Application Default Credentials"
            ) from None
        fs = cls(token="anon", **options)
        _anonymous.add(id(fs))
        return fs


def _azure_account(path: str) -> str | None:
    """The storage account a URL names (``abfs://container@account.dfs.core.windows.net/``)."""
    found = re.match(r"[a-z]+://[^/@]+@([^./]+)\.(?:dfs|blob)\.core\.windows\.net", path, re.I)
    return found.group(1) if found else None


def _missing_package(path: str, error: ImportError) -> str:
    name = scheme(path)
    from fsspec.registry import known_implementations

    if name in _INSTALL:
        hint = extra(*_INSTALL[name])
    else:
        hint = known_implementations.get(name, {}).get("err") or str(error)
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
    permission or bad credentials, no credentials, no such bucket or container (checked
    when ``bucket``), an unreachable endpoint. A missing object stays (or becomes, from
    Azure's ResourceNotFoundError) a FileNotFoundError, as from ``open``."""
    try:
        yield
    except ChuteError:
        raise
    except Exception as error:
        kind = _kind(path, error)
        if kind == "missing":
            if bucket:
                check_bucket(path)  # "no such bucket" rather than "no such file"
            if isinstance(error, FileNotFoundError):
                raise
            raise FileNotFoundError(f"No such object: {path!r}") from None
        if kind is None:
            raise
        raise ChuteError(_refusal(kind, path, error)) from None


def _refusal(kind: str, path: str, error: BaseException) -> str:
    """The one line that says why the store refused ``path``."""
    chain, reason = _chain(path), _scrub(error)
    if kind == "access":
        return (
            f"No access to {path!r}: {reason}. Check the credentials ({chain}) and that "
            "they may read and write this bucket"
        )
    if kind == "credentials":
        return f"No credentials for {path!r} ({reason}): set {chain}"
    if kind == "refused":
        return f"The credentials for {path!r} were refused ({reason}): check {chain}"
    if kind == "request":
        return f"The store refused the request for {path!r}: {reason}"
    return f"Cannot reach {path!r}: {reason}. Check the endpoint and the network ({chain})"


def _kind(path: str, error: BaseException) -> str | None:
    """Which refusal a store's client raised: access, credentials (none found), refused
    (credentials the store turned down), missing (an object or bucket), request (another
    4xx: a malformed name), unreachable; None when ``error`` is not a store's (a bug:
    raised as it is)."""
    if isinstance(error, PermissionError):
        return "access"
    if isinstance(error, FileNotFoundError):
        return "missing"
    module, name, text = type(error).__module__ or "", type(error).__name__, str(error)
    if scheme(path) in _GCS and isinstance(error, OSError) and text.startswith("Forbidden"):
        return "access"  # gcsfs raises a plain OSError("Forbidden: ...") on HTTP 403
    if scheme(path) in _GCS and isinstance(error, ValueError) and text.startswith("Bad Request"):
        return "request"  # and a ValueError on a 400 that says "invalid" (a bucket's name)
    if not module.startswith(_STORE_MODULES):
        return None
    status = getattr(error, "code", None) or getattr(error, "status_code", None)
    # none found (botocore, google.auth, azure.identity), or half of a pair
    if "Credentials" in name or "CredentialUnavailable" in name or "DefaultAzure" in text:
        return "credentials"
    if name in ("RefreshError", "ClientAuthenticationError"):
        return "refused"
    if status == 401:  # GCS: anonymous (no ADC was found), or a token it does not take
        anonymous = scheme(path) in _GCS and id(filesystem(path)[0]) in _anonymous
        return "credentials" if anonymous else "refused"
    if status == 403:
        return "access"
    if name == "ResourceNotFoundError" or status == 404:  # Azure: container or blob
        return "missing"
    if isinstance(status, int) and 400 <= status < 500:
        return "request"
    return "unreachable"


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
        raise ChuteError(_no_bucket(path))
    _found_buckets.add((id(fs), bucket))


def _no_bucket(path: str) -> str:
    word = "container" if scheme(path) in _AZURE else "bucket"
    bucket = filesystem(path)[1].split("/", 1)[0]
    return (
        f"No {word} {bucket!r} (in {path!r}): check the name and the account or endpoint "
        f"it is in ({_chain(path)}), or create it first"
    )


def _chain(path: str) -> str:
    """Where the store's credentials come from, in the words of its own tools."""
    name = scheme(path)
    if name in ("s3", "s3a"):
        return (
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or an instance "
            "role; AWS_ENDPOINT_URL for an S3-compatible store"
        )
    if name in _GCS:
        return (
            "Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS naming a key "
            "file, `gcloud auth application-default login`, or the metadata server on Google "
            "Cloud; STORAGE_EMULATOR_HOST for an emulator"
        )
    if name in _AZURE:
        return (
            "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
            "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or AZURE_STORAGE_ACCOUNT_NAME "
            "alone for DefaultAzureCredential (`az login`, a managed identity)"
        )
    return f"the {name}:// store's standard credentials"


def _scrub(error: BaseException) -> str:
    """The error's first line, with any credential from the environment blanked out (a
    credentials file is never read here: only its name can appear)."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    text = lines[0]
    if text.startswith(("Forbidden:", "Bad Request:")) and len(lines) > 1:
        text = f"{text} ({lines[1].strip()})"  # gcsfs: the path, then the store's reason
    for name in _SECRETS:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "***").replace(secret.lstrip("?"), "***")
    text = _SECRET_PARTS.sub(lambda found: (found.group(1) or found.group(2)) + "***", text)
    return text.rstrip(".")
