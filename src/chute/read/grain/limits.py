"""How many shard files a process may keep open: a share of its ``RLIMIT_NOFILE``.

A global shuffle reads every shard of a split all the time, so a reader would keep one
descriptor a shard open (ImageNet's 1,024 train shards; 21k's more): at the usual
``ulimit -n 1024`` that ends in "Too many open files". A Grain source keeps at most
:func:`max_open_files` open in each process, the one read longest ago closed to open
another. A local shard reopens in one ``open``; a cached copy of a bucket's shard also
takes the cache's shared lock, and a split read with most of its copies closed ran 3x
slower. So where the split has more shards than the share allows and the hard limit
leaves room, the soft limit is raised first (what ``ulimit -n`` does, once, logged);
where it does not (``ulimit -n`` sets both), the share holds whatever the shard count.

Example:
    >>> 4 <= max_open_files() <= 4096
    True
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# A source's share of the process's limit (the rest is for TensorFlow, sockets, the other
# splits' sources, Grain's queues), within bounds; the soft limit is raised at most this far.
_OPEN_SHARE, _MIN_OPEN, _MAX_OPEN, _RAISE_TO = 8, 4, 4096, 65536


def max_open_files(wanted: int = 0) -> int:
    """How many shards a source keeps open at once in this process: an eighth of the soft
    ``RLIMIT_NOFILE``, at least 4 and at most 4,096. With ``wanted`` (the split's shards)
    above that, the soft limit is first raised toward the hard one, as far as
    ``wanted`` needs (at most 65,536).

    Example:
        >>> max_open_files() >= 4
        True
    """
    try:
        import resource
    except ImportError:  # Windows: no such limit to stay under; the C runtime's own is 512
        return 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MAX_OPEN
    if wanted > _share(soft) and (hard == resource.RLIM_INFINITY or soft < hard):
        target = min(wanted * _OPEN_SHARE, _RAISE_TO)
        if hard != resource.RLIM_INFINITY:
            target = min(target, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # not allowed here: the share of what there is
            return _share(soft)
        log.info(
            "raised this process's open-file limit (ulimit -n) from %d to %d, so that %d "
            "shards can stay open while they are read",
            soft,
            target,
            wanted,
        )
        soft = target
    return _share(soft)


def _share(soft: int) -> int:
    return max(_MIN_OPEN, min(_MAX_OPEN, soft // _OPEN_SHARE))
