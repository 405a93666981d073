"""Give the C heap's free memory back to the operating system (glibc's ``malloc_trim``).

pycrdt's documents live in Rust allocations on glibc's heap. When a document is dropped or
frozen (central freezes quiet nodes' replicas: thousands of them a minute at 10,000 nodes),
its blocks go back to glibc's free lists, and glibc keeps the pages resident: ``mallinfo2``
at the end of a 10,000-node run showed 78–191 MB free inside the arenas, counted in
central's RSS, and it moved by the run (``bench/bench_central_scale.py``). glibc returns
only the free space at an arena's top by itself; ``malloc_trim(0)`` also releases every
whole free page inside it (``madvise(MADV_DONTNEED)``). The engines call :func:`trim` on a
worker thread (ctypes drops the GIL for the call; glibc locks one arena at a time), after
the work that frees most: central after each full sweep of its cold documents.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

log = logging.getLogger("edgesched.sync.heap")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        function = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    trim: Callable[[int], int] = function
    return trim


def available() -> bool:
    """Whether this process can trim its heap (glibc)."""
    return _malloc_trim() is not None


def trim() -> bool:
    """Release the heap's whole free pages to the operating system; whether glibc released
    any (False also off glibc). Blocking: call it on a worker thread."""
    function = _malloc_trim()
    return bool(function(0)) if function is not None else False
