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

And the cost of one entry, for the two kinds central decodes by the million (a node's
``tasks[id]`` and the policy document's ``assignments[id]``): ``from_entry`` of each value of a
real document (read through ``to_py`` plus ``normalise``, as the views do), in microseconds per
entry, against the generic decoder it replaced (``schema._reference_decode``: fields, type
hints and isinstance checks resolved per field per entry) in the same run. The assignment's
figure includes ``TaskSpec.from_json`` of its spec (shared by both decoders, so the ratio is
only the schema's part of the saving), which is also shown alone.

Run: ``.venv/bin/python bench/bench_schema.py`` (sizes 1,000 and 10,000; the ratio of the two
shows how each cost grows).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable

from edgesched.core.task import TaskSpec, TaskState
from edgesched.sync import schema
from edgesched.sync.doc import NodeDoc, PolicyDoc, normalise
from edgesched.sync.schema import (
    AssignmentEntry,
    AssignmentRef,
    Entry,
    Refusals,
    TaskReport,
    decode_map,
)


def _doc(n: int) -> PolicyDoc:
    doc = PolicyDoc("policy", 1)
    for i in range(n):
        spec = TaskSpec(id=f"t{i}", command=("sleep", "60"), cpu=0.5, mem_gib=0.25)
        doc.assign(
            spec.id,
            AssignmentEntry(spec=spec, node=f"gw{i % 97}", epoch=1, central="c", at=1.0),
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


def _node_doc(n: int) -> NodeDoc:
    doc = NodeDoc("node-gw1", 1)
    for i in range(n):
        doc.put_task(
            f"t{i}",
            TaskReport(
                state=TaskState.RUNNING,
                updated_at=1_700_000_000.0 + i,
                node="gw1",
                decided_by="central",
                workload="video",
                priority=i % 100,
                cpu=0.5,
                mem_gib=0.25,
                restarts=i % 3,
                accepted_at=1_700_000_000.0,
                started_at=1_700_000_001.5,
                assignment=AssignmentRef(central="c1", epoch=1 + i % 4, score=0.5),
            ),
        )
    return doc


def per_entry(n: int = 2_000) -> dict[str, tuple[float, float]]:
    """µs per entry: (from_entry, the reference generic decoder) for each kind, and the spec."""
    tasks = list(normalise(_node_doc(n).root("tasks").to_py()).values())
    assignments = list(normalise(_doc(n).root("assignments").to_py()).values())
    specs = [a["spec"] for a in assignments]

    def each(*decoders: Callable[[object], object], values: list[object]) -> list[float]:
        """The fastest of 15 passes of each decoder over ``values``, the passes interleaved
        (the machine is shared: a burst of other work hits both alike, the minimum skips it)."""
        best = [math.inf] * len(decoders)
        for _ in range(15):
            for i, decode in enumerate(decoders):
                started = time.perf_counter()
                for value in values:
                    decode(value)
                best[i] = min(best[i], time.perf_counter() - started)
        return [b / len(values) * 1e6 for b in best]

    def reference(cls: type[Entry]) -> Callable[[object], object]:
        return lambda raw: schema._reference_decode(cls, raw, cls.KIND)

    out: dict[str, tuple[float, float]] = {}
    for kind, values in ((TaskReport, tasks), (AssignmentEntry, assignments)):
        fast, ref = each(kind.from_entry, reference(kind), values=values)
        out[kind.__name__] = (fast, ref)
    (spec_cost,) = each(TaskSpec.from_json, values=specs)
    out["TaskSpec.from_json"] = (spec_cost, spec_cost)
    return out


def main() -> None:
    print("per entry           from_entry   reference   speed-up")
    for name, (fast, ref) in per_entry().items():
        print(f"{name:<18} {fast:8.2f} µs {ref:8.2f} µs   {ref / fast:5.1f}x")
    print()
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
