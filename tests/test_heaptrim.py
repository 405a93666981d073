"""sync/heaptrim.py: free pages inside glibc's heap go back to the system."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgesched.sync import heaptrim

pytestmark = pytest.mark.skipif(
    not heaptrim.available() or heaptrim.resident_bytes() is None,
    reason="needs glibc's malloc_trim and /proc/self/statm",
)

CHUNK = 32 * 1024  # under glibc's mmap threshold: these chunks live in the heap itself
CHUNKS = 4096  # 128 MiB

# Run in a child: it fixes glibc's thresholds for the whole process (mallopt), which would
# otherwise stay so for the rest of the test session.
CHILD = f"""
import ctypes, ctypes.util, json
from edgesched.sync import heaptrim
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
# (fixed thresholds: glibc's dynamic ones could move these chunks to mmap, or trim on free)
libc.mallopt(-3, 4 * 1024 * 1024)  # M_MMAP_THRESHOLD
libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
chunks = [libc.malloc({CHUNK}) for _ in range({CHUNKS})]
assert all(chunks)
for p in chunks:
    ctypes.memset(p, 1, {CHUNK})  # resident
heaptrim.trim()  # (whatever was free before)
held = heaptrim.resident_bytes()
for p in chunks[:-1]:  # the last one holds the top
    libc.free(p)
after_free = heaptrim.resident_bytes()
returned = heaptrim.trim()
after_trim = heaptrim.resident_bytes()
print(json.dumps([held, after_free, returned, after_trim]))
"""


def test_freed_chunks_inside_the_heap_are_given_back() -> None:
    """Chunks freed below a chunk still in use cannot go back by ``free`` (the heap's top is
    held): ``trim`` returns their pages, and says how many bytes went."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    held, after_free, returned, after_trim = json.loads(out.stdout)
    freed = CHUNK * (CHUNKS - 1)
    assert held - after_free < freed // 4  # free alone kept most of it resident
    assert returned >= freed // 2  # trim gave most of it back
    assert after_free - after_trim == returned


def test_trim_with_nothing_free_returns_little() -> None:
    heaptrim.trim()
    assert heaptrim.trim() < 4 * 1024 * 1024
