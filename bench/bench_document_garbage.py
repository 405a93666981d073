"""What a finished task leaves behind in central's documents: the ``fleet`` document (every
assignment of the fleet) and a node's ``desired-<node>`` document; and what rotating the fleet
document of a central that runs alone (:class:`SoleFleetDoc`) leaves, and costs.

Central writes an assignment when it places a task and removes it once the task is finished
and its retention has passed. Where central replicas co-write them, both documents are
multi-writer (:class:`PolicyDoc`), so unlike a node's own document they never rotate to a
fresh epoch (see :mod:`edgesched.sync.doc`): each removed entry stays as a pycrdt tombstone.
A central alone is its fleet document's one writer, and rotates it. This bench
measures that garbage with the project's own classes (packed entries, as central writes
them). The live content is held constant (``--live`` assignments, 7,000 by default: 100
nodes of 70) while ``--lifecycles`` tasks (10,000 and 40,000 by default) are each assigned,
placed again once (a failover or a pending task placed: the entry written twice) and
dropped. Printed per run length:

* **encoded**: the document's encoded state (its SQLite snapshot, and what a full resync
  sends), against a fresh document of the same live content built in the same run (the
  baseline: what a rotation would leave), as bytes per finished task and as a ratio;
* **memory**: glibc's heap in use (``mallinfo2``) held by the live pycrdt document after the
  run, less the fresh document's, per finished task (pycrdt's blocks are Rust allocations);
* then the growth from the first run length to the last (garbage grows with the tasks
  finished, not with the fleet), and what a day at ``--rate`` tasks a second comes to;
* the same run on a :class:`SoleFleetDoc` of ``--rotating-live`` assignments (1,000: its
  garbage reaches the policy's bound within the run) that asks its rotation policy every
  ``--check-every`` finished tasks: its size against a fresh one's, its rotations, and the
  garbage memory per finished task (bounded by the live content: it falls as more finish);
* one rotation's cost at ``--live`` and ten times that many assignments, whole and in slices
  (:meth:`SyncedDoc.rotate_in_slices`, what central does past ``ROTATE_IN_SLICES_BYTES``: the
  longest the event loop is held);
* one node's desired-state document (``--live / --nodes`` standing assignments) through
  ``--desired-lifecycles`` of its tasks (2,500 and 10,000), co-written (:class:`PolicyDoc`,
  central replicas) and written by a central alone (:class:`SoleDesiredDoc`, checked at each
  of its journal's compactions): the largest encoded size reached, the rotations, the cost of
  one, and the garbage memory the node's live replica holds at the end.

    .venv/bin/python bench/bench_document_garbage.py [--live 7000] [--lifecycles 10000,40000]

~1 minute by default on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from dataclasses import replace
from typing import Any

import psutil
import pycrdt
from bench_central_scale import mallinfo2

from edgesched.central.placement import assignment_entry
from edgesched.core.task import TaskSpec
from edgesched.sync import heap
from edgesched.sync.doc import (
    DEFAULT_COMPACT_AFTER,
    PolicyDoc,
    SoleDesiredDoc,
    SoleFleetDoc,
    client_id_for,
)

CENTRAL = "central-a"
T0 = 1_764_900_000.0


def heap_in_use() -> int:
    """glibc's heap in use, in bytes (``mallinfo2().uordblks`` plus mmapped blocks)."""
    info = mallinfo2()
    if info is None:
        raise SystemExit("bench_document_garbage measures glibc's heap: needs glibc 2.33+")
    return int(info.uordblks + info.hblkhd)


def entry(task_id: str, node: str, at: float) -> Any:
    spec = TaskSpec(id=task_id, command=("sleep", "30"), cpu=0.5, mem_gib=0.25, priority=40)
    return assignment_entry(
        spec, node, central=CENTRAL, epoch=1, replacement=False, score=0.73, at=at,
        reason="placed",
    )  # fmt: skip


def finish(doc: PolicyDoc, task_id: str, first: Any) -> None:
    """One finished task's life in ``doc``: assigned, placed again once (a failover or a
    pending task placed: the entry written twice), dropped; a transaction each."""
    with doc.doc.transaction():
        doc.assign(task_id, first)
    with doc.doc.transaction():
        doc.assign(task_id, replace(first, at=first.at + 1, epoch=2, replacement=True))
    with doc.doc.transaction():
        doc.drop_assignment(task_id)


def live_fleet(cls: type[PolicyDoc], live: int, nodes: int) -> PolicyDoc:
    """A packed fleet document of class ``cls`` holding ``live`` standing assignments, spread
    over ``nodes`` nodes, written in one transaction."""
    fleet = cls("fleet", client_id_for(CENTRAL))
    if isinstance(fleet, SoleFleetDoc):
        fleet.sole_writer = CENTRAL
    fleet.packed = True
    with fleet.doc.transaction():
        for i in range(live):
            fleet.assign(f"live-{i:07d}", entry(f"live-{i:07d}", f"n{i % nodes:05d}", T0))
    return fleet


def run(live: int, lifecycles: int, nodes: int) -> dict[str, float]:
    """One fleet document and one node's desired document through ``lifecycles`` finished
    tasks over ``live`` standing assignments; their garbage against fresh documents."""
    fleet = live_fleet(PolicyDoc, live, nodes)
    desired = PolicyDoc("desired-n00000", client_id_for(CENTRAL))
    desired.packed = True
    per_node = live // nodes
    with desired.doc.transaction():
        for i in range(per_node):
            desired.assign(f"live-{i * nodes:07d}", entry(f"live-{i * nodes:07d}", "n00000", T0))
    for i in range(lifecycles):
        task_id = f"t-{i:08d}"
        node = f"n{i % nodes:05d}"
        first = entry(task_id, node, T0 + i)
        for doc, mine in ((fleet, True), (desired, node == "n00000")):
            if mine:
                finish(doc, task_id, first)
    out: dict[str, float] = {}
    states: dict[str, tuple[bytes, bytes]] = {}  # name -> (its state, a fresh one's)
    for name, doc in (("fleet", fleet), ("desired", desired)):
        states[name] = doc.snapshot(), doc._fresh().get_update()
        out[f"{name}_encoded"], out[f"{name}_fresh"] = map(len, states[name])
    out["desired_finished"] = sum(1 for i in range(lifecycles) if i % nodes == 0)
    # the fleet document's memory against a fresh one of the same content, rebuilt here
    del fleet, desired
    gc.collect()
    state, fresh_state = states["fleet"]
    out["fleet_memory"] = _rebuilt(state)
    out["fleet_fresh_memory"] = _rebuilt(fresh_state)
    return out


def run_rotating(live: int, lifecycles: int, nodes: int, check_every: int) -> dict[str, float]:
    """The fleet document of a central that runs alone (:class:`SoleFleetDoc`: its one
    writer, so it rotates) through the same lifecycles: the garbage it still holds at the end,
    how many rotations it took, and how long each held the caller (a rotation builds a fresh
    document of the live content: O(live), on central's loop). Central asks
    :meth:`should_rotate` when its journal compacts (every ~1,000 updates); here every
    ``check_every`` finished tasks (each writes the document three times)."""
    fleet = live_fleet(SoleFleetDoc, live, nodes)
    held: list[float] = []
    worst = 0.0  # the largest encoded size against a fresh document's, at a check
    for i in range(lifecycles):
        task_id = f"t-{i:08d}"
        finish(fleet, task_id, entry(task_id, f"n{i % nodes:05d}", T0 + i))
        if (i + 1) % check_every == 0:
            size = len(fleet.snapshot())
            worst = max(worst, size / len(fleet._fresh().get_update()))
            start = time.perf_counter()
            if fleet.should_rotate(size):
                fleet.rotate()
                held.append(time.perf_counter() - start)
    state, fresh_state = fleet.snapshot(), fleet._fresh().get_update()
    out = {
        "encoded": float(len(state)),
        "fresh": float(len(fresh_state)),
        "rotations": float(len(held)),
        "rotation_s_max": max(held, default=0.0),
        "epoch": float(fleet.epoch),
        "worst": worst,
        "ratio": fleet.rotation_policy.ratio if fleet.rotation_policy else 0.0,
    }
    del fleet
    gc.collect()
    out["memory"] = _rebuilt(state)
    out["fresh_memory"] = _rebuilt(fresh_state)
    return out


#: Finished tasks between two compactions of a desired document's journal, where the
#: rotation policy is asked: each writes the document 3 times.
TASKS_PER_COMPACTION = DEFAULT_COMPACT_AFTER // 3


def run_desired(cls: type[PolicyDoc], live: int, lifecycles: int) -> dict[str, float]:
    """One node's desired document of class ``cls`` holding ``live`` assignments through
    ``lifecycles`` finished tasks of the node, asked to rotate at each compaction."""
    doc = cls("desired-n00000", client_id_for(CENTRAL))
    if isinstance(doc, SoleDesiredDoc):
        doc.sole_writer = CENTRAL
    doc.packed = True
    with doc.doc.transaction():
        for i in range(live):
            doc.assign(f"live-{i:05d}", entry(f"live-{i:05d}", "n00000", T0))
    held: list[float] = []
    largest = 0
    for i in range(lifecycles):
        task_id = f"t-{i:08d}"
        finish(doc, task_id, entry(task_id, "n00000", T0 + i))
        if (i + 1) % TASKS_PER_COMPACTION == 0:
            size = len(doc.snapshot())
            largest = max(largest, size)
            start = time.perf_counter()
            if doc.should_rotate(size):
                doc.rotate()
                held.append(time.perf_counter() - start)
    state, fresh_state = doc.snapshot(), doc._fresh().get_update()
    out = {
        "encoded": float(len(state)),
        "fresh": float(len(fresh_state)),
        "largest": float(max(largest, len(state))),
        "rotations": float(len(held)),
        "rotation_ms": 1000 * sum(held) / len(held) if held else 0.0,
    }
    del doc
    gc.collect()
    out["garbage_memory"] = _rebuilt(state) - _rebuilt(fresh_state)
    return out


def resident_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 1e6


def rotation_holds(live: int, nodes: int) -> tuple[float, float, float, float, float]:
    """A fleet document of ``live`` assignments rotated whole (:meth:`rotate`: seconds it
    holds the caller) and in slices (:meth:`rotate_in_slices`, as central's journal does past
    ``ROTATE_IN_SLICES_BYTES``: seconds in all, and the longest the event loop was held); and
    this process's resident MB it grew by through the rotation in slices, before and after
    trimming the heap (:func:`edgesched.sync.heap.trim`, which central runs after each full sweep:
    the old document's pages stay resident in glibc's free lists until then)."""

    fleet = live_fleet(SoleFleetDoc, live, nodes)
    start = time.perf_counter()
    fleet.rotate()
    whole = time.perf_counter() - start
    del fleet
    fleet = live_fleet(SoleFleetDoc, live, nodes)

    async def sliced() -> tuple[float, float]:
        gaps = [0.0]
        done = False

        async def ticker() -> None:  # (a turn of the loop between two of the rotation's)
            last = time.perf_counter()
            while not done:
                await asyncio.sleep(0)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        start = time.perf_counter()
        await fleet.rotate_in_slices()
        total = time.perf_counter() - start
        done = True
        await ticking
        return total, max(gaps)

    gc.collect()
    before = resident_mb()
    total, held = asyncio.run(sliced())
    gc.collect()
    grown = resident_mb() - before
    heap.trim()
    return whole, total, held, grown, resident_mb() - before


def _rebuilt(state: bytes) -> float:
    """glibc heap a pycrdt document rebuilt from ``state`` holds."""
    gc.collect()
    before = heap_in_use()
    doc: pycrdt.Doc[Any] = pycrdt.Doc()
    doc.apply_update(state)
    held = heap_in_use() - before
    del doc
    return float(held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=7000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--lifecycles", default="10000,40000", help="comma-separated")
    parser.add_argument("--rate", type=float, default=2.0, help="tasks finished a second")
    parser.add_argument(
        "--check-every", type=int, default=300, help="finished tasks between rotation checks"
    )
    parser.add_argument(
        "--desired-lifecycles", default="2500,10000", help="a node's finished tasks"
    )
    parser.add_argument(
        "--rotating-live",
        type=int,
        default=1000,
        help="live assignments of the rotating run (fewer: it reaches its garbage bound)",
    )
    args = parser.parse_args()
    lengths = [int(n) for n in args.lifecycles.split(",")]
    if len(lengths) < 2:
        parser.error("--lifecycles needs at least two run lengths (the growth is a ratio)")
    print(
        f"document garbage: {args.live:,} live assignments over {args.nodes} nodes; each "
        "finished task assigned, placed again, dropped"
    )
    print(
        f"{'tasks':>8} {'document':>8} {'encoded':>10} {'fresh':>10} {'ratio':>6} "
        f"{'B/task':>7} {'memory B/task':>13}"
    )
    per_task: dict[int, dict[str, float]] = {}
    for n in lengths:
        r = run(args.live, n, args.nodes)
        fleet_mem = (r["fleet_memory"] - r["fleet_fresh_memory"]) / n
        for name, finished in (("fleet", n), ("desired", r["desired_finished"])):
            enc, fresh = r[f"{name}_encoded"], r[f"{name}_fresh"]
            b = (enc - fresh) / finished
            per_task.setdefault(n, {})[name] = b
            mem = f"{fleet_mem:>13,.0f}" if name == "fleet" else f"{'':>13}"
            print(
                f"{n:>8,} {name:>8} {enc:>10,.0f} {fresh:>10,.0f} {enc / fresh:>5.1f}x "
                f"{b:>7,.1f} {mem}"
            )
        per_task[n]["memory"] = fleet_mem
    first, last = lengths[0], lengths[-1]
    for name in ("fleet", "desired", "memory"):
        print(
            f"{name}: garbage per finished task x{per_task[last][name] / per_task[first][name]:.2f}"
            f" from {first:,} to {last:,} tasks (total garbage x{last / first:.0f})"
        )
    day = args.rate * 86_400
    print(
        f"a day at {args.rate:g} tasks/s ({day:,.0f} tasks): the fleet document "
        f"+{per_task[last]['fleet'] * day / 1e6:,.0f} MB encoded, "
        f"+{per_task[last]['memory'] * day / 1e6:,.0f} MB in central's memory; each node's "
        f"desired document +{per_task[last]['desired'] * day / args.nodes / 1e6:,.1f} MB "
        f"encoded over {args.nodes} nodes"
    )

    print(
        f"\nthe fleet document of a central that runs alone (SoleFleetDoc: it rotates once "
        f"its garbage passes a share of the live content, FLEET_ROTATION), "
        f"{args.rotating_live:,} live assignments, checked every {args.check_every} tasks:"
    )
    print(
        f"{'tasks':>8} {'encoded':>10} {'fresh':>10} {'ratio':>6} {'worst':>6} "
        f"{'rotations':>9} {'held max s':>10} {'garbage MB':>10} {'live MB':>8}"
    )
    rotating: dict[int, dict[str, float]] = {}
    for n in lengths:
        r = run_rotating(args.rotating_live, n, args.nodes, check_every=args.check_every)
        rotating[n] = r
        print(
            f"{n:>8,} {r['encoded']:>10,.0f} {r['fresh']:>10,.0f} "
            f"{r['encoded'] / r['fresh']:>5.2f}x {r['worst']:>5.2f}x {r['rotations']:>9.0f} "
            f"{r['rotation_s_max']:>10.3f} {(r['memory'] - r['fresh_memory']) / 1e6:>10.2f} "
            f"{r['fresh_memory'] / 1e6:>8.2f}"
        )
    worst = max(r["worst"] for r in rotating.values())
    unrotated = per_task[last]["memory"] * last / (per_task[first]["memory"] * first)
    print(
        f"rotating: the encoded state was at most {worst:.2f}x a fresh one's at any check "
        f"over {last:,} tasks (policy ratio {rotating[last]['ratio']:g}, plus what finishes "
        f"between two checks): the garbage is bounded by the live content, whatever the run's "
        f"length; without rotation it grows with the tasks finished (x{unrotated:.2f} from "
        f"{first:,} to {last:,})"
    )
    small, large = args.live, args.live * 10
    holds = {n: rotation_holds(n, args.nodes) for n in (small, large)}
    for n, (whole, total, held, grown, trimmed) in holds.items():
        print(
            f"one rotation at {n:,} live assignments: whole {whole:.3f} s on central's loop; "
            f"in slices {total:.3f} s in all, the loop held at most {held * 1000:.0f} ms; "
            f"resident {grown:+.0f} MB after it, {trimmed:+.0f} MB once the heap is trimmed"
        )
    per = holds[large][1] / large
    print(
        f"rotation cost x{holds[large][1] / holds[small][1]:.1f} for x10 live assignments: "
        f"~{per * 700_000:.0f} s of central's CPU at 10,000 nodes (700,000), in slices; the "
        f"longest hold is the end's encoding and swap, x{holds[large][2] / holds[small][2]:.1f}"
    )

    per_node = max(1, args.live // args.nodes)
    spans = [int(n) for n in args.desired_lifecycles.split(",")]
    print(
        f"\none node's desired document, {per_node} live assignments, through its finished "
        f"tasks (asked to rotate at each compaction, every ~{TASKS_PER_COMPACTION} tasks):"
    )
    print(
        f"{'tasks':>8} {'written by':>18} {'encoded':>9} {'largest':>9} {'fresh':>7} "
        f"{'rotations':>9} {'ms each':>7} {'node garbage MB':>15}"
    )
    desired: dict[tuple[str, int], dict[str, float]] = {}
    for n in spans:
        for label, cls in (("central replicas", PolicyDoc), ("a central alone", SoleDesiredDoc)):
            r = desired[label, n] = run_desired(cls, per_node, n)
            print(
                f"{n:>8,} {label:>18} {r['encoded']:>9,.0f} {r['largest']:>9,.0f} "
                f"{r['fresh']:>7,.0f} {r['rotations']:>9.0f} {r['rotation_ms']:>7.2f} "
                f"{r['garbage_memory'] / 1e6:>15.2f}"
            )
    a, b = spans[0], spans[-1]
    shared = desired["central replicas", b]["encoded"] / desired["central replicas", a]["encoded"]
    sole = desired["a central alone", b]["largest"] / desired["a central alone", a]["largest"]
    print(
        f"desired document, x{b / a:.0f} the tasks: co-written x{shared:.2f} encoded (it grows "
        f"with them); alone its largest size x{sole:.2f} (bounded by the rotation policy: "
        f"64 KiB, or twice the live content)"
    )


if __name__ == "__main__":
    main()
