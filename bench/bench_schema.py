"""What the typed document schema costs central: decoding a policy document's assignments.

Central reads the assignments map several times per control step; the document class decodes
it once per change (``SyncedDoc.view``) and keeps a per-entry memo so that an entry whose raw
value did not change is not validated again. Three figures per size, each against the
baseline of the same run (pycrdt's ``to_py`` plus ``normalise``, what reading the map costs
with no schema at all):

- cold: every entry validated (a fresh replica, or central just started);
- one changed: one assignment rewritten, the map decoded again (the steady state: a control
  step changes a few entries);
- cached: no change since the last read (the view is returned as is).

Run: ``.venv/bin/python bench/bench_schema.py`` (sizes 1,000 and 10,000; the ratio of the two
shows how each cost grows).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from edgesched.core.task import TaskSpec
from edgesched.sync.doc import PolicyDoc, normalise
from edgesched.sync.schema import AssignmentEntry, Refusals, decode_map


def _doc(n: int) -> PolicyDoc:
    doc = PolicyDoc("policy", 1)
    for i in range(n):
        spec = TaskSpec(id=f"t{i}", command=("sleep", "60"), cpu=0.5, mem_gib=0.25)
        doc.assign(
            spec.id,
            AssignmentEntry(spec=spec.to_json(), node=f"gw{i % 97}", epoch=1, central="c", at=1.0),
        )
    return doc


def _time(fn: Callable[[], object], repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure(n: int) -> dict[str, float]:
    doc = _doc(n)
    baseline = _time(lambda: normalise(doc.root("assignments").to_py()))
    cold = _time(
        lambda: decode_map(
            AssignmentEntry,
            normalise(doc.root("assignments").to_py()),
            Refusals("bench"),
            where="assignments",
        )
    )
    doc.assignments()
    counter = iter(range(10**9))

    def one_changed() -> None:
        i = next(counter)
        entry = doc.assignments()["t0"]
        doc.assign("t0", dataclasses.replace(entry, at=float(i + 2)))
        doc.assignments()

    changed = _time(one_changed)
    cached = _time(doc.assignments, repeat=50)
    return {"baseline": baseline, "cold": cold, "one_changed": changed, "cached": cached}


def main() -> None:
    sizes = (1_000, 10_000)
    results = {n: measure(n) for n in sizes}
    print("assignments   to_py+normalise   typed cold (x)        one changed (x)       cached")
    for n, r in results.items():
        print(
            f"{n:>11,}   {r['baseline'] * 1e3:10.1f} ms   "
            f"{r['cold'] * 1e3:8.1f} ms ({r['cold'] / r['baseline']:4.1f}x)   "
            f"{r['one_changed'] * 1e3:8.1f} ms ({r['one_changed'] / r['baseline']:4.1f}x)   "
            f"{r['cached'] * 1e6:6.1f} µs"
        )
    small, large = results[sizes[0]], results[sizes[1]]
    growth = {k: large[k] / small[k] for k in ("baseline", "cold", "one_changed")}
    print(
        f"growth {sizes[0]:,} -> {sizes[1]:,} entries ({sizes[1] // sizes[0]}x): "
        + ", ".join(f"{k} {v:.1f}x" for k, v in growth.items())
    )


if __name__ == "__main__":
    main()
