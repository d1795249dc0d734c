"""What this machine lets chute use: cores and memory.

Example:
    >>> available_cores() >= 1
    True
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


CGROUP_LIMITS = (
    "/sys/fs/cgroup/memory.max",  # cgroup v2
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",  # cgroup v1
)


def memory_limit(cgroup_files: tuple[str, ...] = CGROUP_LIMITS) -> int | None:
    """Bytes of memory this process may use: physical memory, or less where the
    container's cgroup limit says so; None where neither is known."""
    limits = [physical] if (physical := physical_memory()) else []
    for path in cgroup_files:
        try:
            with open(path) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max", or v1's "no limit" value
            limits.append(int(text))
    return min(limits) if limits else None


def physical_memory() -> int | None:
    """Bytes of physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
