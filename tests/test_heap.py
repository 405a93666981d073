"""``edgesched.sync.heap.trim``: pycrdt documents dropped leave their pages resident in glibc's free
lists until the heap is trimmed (what central's frozen replicas did to its RSS). Measured in a
fresh interpreter, whose heap holds nothing else."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgesched.sync import heap

pytestmark = pytest.mark.skipif(not heap.available(), reason="needs glibc's malloc_trim")

SCRIPT = """
import gc, json, os
import pycrdt
from edgesched.sync import heap

def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

survivors, docs = [], []
for j in range(40):
    doc = pycrdt.Doc()
    entries = doc.get("tasks", type=pycrdt.Map)
    with doc.transaction():
        for i in range(5000):
            entries[f"t{i}"] = f"task-{i}-" + "x" * 40
    docs.append(doc)
    small = pycrdt.Doc()  # (allocated between them: the free space is not at the heap's top)
    small.get("a", type=pycrdt.Map)["j"] = j
    survivors.append(small)
built = resident_mb()
del docs, doc, entries
gc.collect()
freed = resident_mb()
released = heap.trim()
print(json.dumps({"built": built, "freed": freed, "trimmed": resident_mb(),
                  "released": released, "survivor": survivors[-1].get("a", type=pycrdt.Map)["j"]}))
"""


def test_dropped_documents_stay_resident_until_the_heap_is_trimmed() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    got = json.loads(out.stdout)
    assert got["released"] and got["survivor"] == 39
    assert got["freed"] > got["built"] - 20, got  # dropped, and glibc kept the pages
    assert got["trimmed"] < got["freed"] - 30, got  # trimmed: back to the system
