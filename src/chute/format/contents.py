"""The content hashes of a dataset's images, a file per version.

Each conversion (and each ``chute convert --append``) writes
``OUT/hashes/vNNNN.sha256``: the sha256 of every source image its version kept,
32 bytes each, in record order (sorted only when an append reads them: a conversion
pays for writing them, not for sorting). An append reads those of every earlier
version to skip images the dataset already holds. The folder lies beside ``index/``, where
no shard glob reaches; a dataset converted before chute wrote them has none.

Example:
    >>> import hashlib
    >>> digest = hashlib.sha256(b"pixels").digest()
    >>> write("ram://contents-doc", 1, [digest, digest])
    >>> len(read("ram://contents-doc", 1)), len(known("ram://contents-doc", 1)[0])
    (2, 1)
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from chute.format import storage

FOLDER = "hashes"
DIGEST = 32  # bytes of a sha256


def path(output: str, version: int) -> str:
    """Where version ``version``'s hashes are kept.

    Example:
        >>> path("gs://b/out", 2)
        'gs://b/out/hashes/v0002.sha256'
    """
    return storage.join(output, FOLDER, f"v{version:04d}.sha256")


def write(output: str, version: int, digests: Iterable[bytes]) -> None:
    """Writes version ``version``'s hashes, atomically."""
    joined = b"".join(digests)
    if len(joined) % DIGEST:
        raise ValueError("a sha256 digest has 32 bytes")
    storage.makedirs(storage.join(output, FOLDER))
    storage.write_atomic(path(output, version), joined)


def read(output: str, version: int) -> np.ndarray:
    """Version ``version``'s hashes as an array of 32-byte values (empty: none kept)."""
    return np.frombuffer(storage.read_bytes(path(output, version)), f"V{DIGEST}")


def known(output: str, versions: int) -> tuple[np.ndarray, list[int]]:
    """The hashes of versions 1 to ``versions`` together, sorted and distinct (an array of
    ``S32`` values, as :class:`~chute.ingest.split.LeakGuard` takes them), and the
    versions that have no hashes file (converted by a chute that wrote none)."""
    found, missing = [], []
    for version in range(1, versions + 1):
        if storage.exists(path(output, version)):
            found.append(read(output, version))
        else:
            missing.append(version)
    joined = np.concatenate(found) if found else np.empty(0, "V32")
    return np.unique(joined.view("S32")), missing
