"""Give the C heap's free pages back to the system (glibc's ``malloc_trim``).

A long-running central frees much of what a burst allocated (a heal thaws a thousand node
replicas, ~65 kB of pycrdt's memory each, and freezes them again a minute later), but glibc
keeps freed chunks inside its arenas for reuse: at 10,000 nodes the harness found 134 MB free
in them at the end of a run, resident all the same. ``malloc_trim(0)`` returns every whole
free page to the system (``MADV_DONTNEED`` inside the arenas, not only at their tops); the
next burst faults them in again. :func:`trim` does it once and says how much resident memory
it gave back; off glibc it does nothing.

The call runs in C without the GIL (ctypes releases it) but holds each arena's lock while it
walks it: another thread's ``malloc`` waits meanwhile (a few milliseconds per GB of heap).
Central calls it after each full sweep of its cold documents (every ``cold_after_s``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from functools import cache

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on another C library."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def available() -> bool:
    """Whether this process's C library can trim its heap."""
    return _malloc_trim() is not None


def resident_bytes() -> int | None:
    """This process's resident memory (``/proc/self/statm``), or None off Linux."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def trim() -> int:
    """Return the heap's free pages to the system; the resident bytes that went (0 when
    nothing did, or off glibc)."""
    fn = _malloc_trim()
    if fn is None:
        return 0
    before = resident_bytes()
    fn(0)
    after = resident_bytes()
    if before is None or after is None:
        return 0
    return max(0, before - after)
