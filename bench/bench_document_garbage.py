"""What a finished task leaves behind in central's multi-writer documents: the ``fleet``
document (every assignment of the fleet) and a node's ``desired-<node>`` document.

Central writes an assignment when it places a task and removes it once the task is finished
and its retention has passed. Both documents are multi-writer (:class:`PolicyDoc`: central
replicas co-write them), so unlike a node's own document they never rotate to a fresh epoch
(see :mod:`edgesched.sync.doc`): each removed entry stays as a pycrdt tombstone. This bench
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
  finished, not with the fleet), and what a day at ``--rate`` tasks a second comes to.

    .venv/bin/python bench/bench_document_garbage.py [--live 7000] [--lifecycles 10000,40000]

~30 s by default on a 2-core machine.
"""

from __future__ import annotations

import argparse
import gc
from dataclasses import replace
from typing import Any

import pycrdt
from bench_central_scale import mallinfo2

from edgesched.central.placement import assignment_entry
from edgesched.core.task import TaskSpec
from edgesched.sync.doc import PolicyDoc, client_id_for

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


def run(live: int, lifecycles: int, nodes: int) -> dict[str, float]:
    """One fleet document and one node's desired document through ``lifecycles`` finished
    tasks over ``live`` standing assignments; their garbage against fresh documents."""
    fleet = PolicyDoc("fleet", client_id_for(CENTRAL))
    desired = PolicyDoc("desired-n00000", client_id_for(CENTRAL))
    fleet.packed = desired.packed = True
    per_node = live // nodes
    with fleet.doc.transaction():
        for i in range(live):
            node = f"n{i % nodes:05d}"
            fleet.assign(f"live-{i:07d}", entry(f"live-{i:07d}", node, T0))
    with desired.doc.transaction():
        for i in range(per_node):
            desired.assign(f"live-{i * nodes:07d}", entry(f"live-{i * nodes:07d}", "n00000", T0))
    for i in range(lifecycles):
        task_id = f"t-{i:08d}"
        node = f"n{i % nodes:05d}"
        first = entry(task_id, node, T0 + i)
        again = replace(first, at=T0 + i + 1, epoch=2, replacement=True)
        for doc, mine in ((fleet, True), (desired, node == "n00000")):
            if not mine:
                continue
            with doc.doc.transaction():
                doc.assign(task_id, first)
            with doc.doc.transaction():
                doc.assign(task_id, again)
            with doc.doc.transaction():
                doc.drop_assignment(task_id)
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


if __name__ == "__main__":
    main()
