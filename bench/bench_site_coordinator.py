"""A site coordinator's cycle as its site grows: N members, ~100 task reports each, in one process.

    .venv/bin/python bench/bench_site_coordinator.py [--members 3,30,300] [--tasks 100]
        [--cycles 40] [--failovers 15] [--json] [--quick]

Builds a site of N members (no MQTT, no engine): each member's own node document, written as
the member writes it (:class:`~edgesched.sync.doc.NodeDoc`: its registration, ``--tasks``
task reports, its vote for the coordinator, ``site_specs`` of its service replicas), then the
coordinator's :class:`~edgesched.edge.site.SiteMember` (the smallest id) holding a read-only
replica of each of the other N-1 documents, filled by applying the writer's snapshot
(``replica.apply_remote(snapshot, sender=peer)``), with every peer marked live through
:meth:`SitePresence.handle` (its retained ``online`` status). A member's reports: 60% local
tasks running, 20% tasks running under central's assignment, 10% service replicas (restart
always, their spec in ``site_specs``: what a peer restarts if the member dies) and 10% queued
local submissions (not offered). Then it times, per cycle, what the engine runs every
``cycle_s`` (1 s by default), each under one transaction of the member's document as the
engine does:

* **steady**: the coordinator's ``elect`` + ``plan`` with every member live (nothing to
  place: the plan still walks every member's task reports and ``site_specs`` to learn that,
  and settles the tasks running on two members);
* **failover**: the same, the cycle after one member died past the failover time (a
  different member each sample, back online after it): its service replicas get ordered onto
  the live members (the core's ``schedule`` over the live members and everything they run);
* **actions**: a non-coordinator member's ``actions`` over its running tasks, following the
  coordinator's orders (its replica of the coordinator's document holds the orders of the
  last failover); it looks up its local tasks in every live peer's reports (handed over?).

And the memory of the coordinator's replicas per member: the process's RSS growth while the
replicas are built (the pycrdt documents: Rust memory, which tracemalloc does not see) and,
with tracemalloc, the Python objects of their decoded views (the reports, specs and
registration the first plan decodes and the documents keep cached).

**The plan's cost is linear in the site's task reports** (N members x their reports): each
cycle it builds a core task of every member's active report, a claim of every assigned one,
and on a failover it runs the core over the live members with every running copy. So at 100
reports a member the steady cycle should grow about as N (x10 from 3 to 30 members, x100 to
300), i.e. its cost per report should stay flat; the tables print each figure's growth
against the N=3 baseline measured in the same run, with the growth of the reports beside it.
(Measured: the calls are exactly linear, but the time per report still grows 1.5-2x from
3,000 to 30,000 reports, evenly across the functions: the working set and Python's GC; see
docs/benchmarks.md, "Site coordinator".)
A member's ``actions`` grows with N too (its local tasks looked up in each live peer's
reports).

``--quick`` runs 3 and 30 members with fewer cycles (the tests); ``--json`` prints the figures
as one JSON document instead of the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import logging
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import psutil

from edgesched.core.model import Arch, ServerClass
from edgesched.core.policy import PolicyConfig
from edgesched.core.task import Assignment, RestartPolicy, TaskRecord, TaskSpec, TaskState
from edgesched.edge.site import SiteMember
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.schema import AssignmentRef, Registration, SiteSpec, SiteVote, TaskReport
from edgesched.sync.topics import status_topic

FAILOVER_S = 30.0
START = 1_000_000.0
REGISTRATION = Registration(
    arch=Arch.X86_64, server_class=ServerClass.GENERAL, cpu=64, mem_gib=256, reads_packed=True
)

#: The figures, their labels and formats (the table's rows).
ROWS: tuple[tuple[str, str, str], ...] = (
    ("reports", "task reports in the site", "{:,}"),
    ("steady_p50_ms", "steady cycle (elect + plan), p50 ms", "{:,.2f}"),
    ("steady_p99_ms", "  p99 ms", "{:,.2f}"),
    ("steady_us_per_report", "  p50 per report, us", "{:,.2f}"),
    ("failover_p50_ms", "failover cycle (elect + plan), p50 ms", "{:,.2f}"),
    ("failover_p99_ms", "  p99 ms", "{:,.2f}"),
    ("orders_per_failover", "  orders given per failover", "{:,.0f}"),
    ("actions_p50_ms", "a member's actions, p50 ms", "{:,.3f}"),
    ("actions_p99_ms", "  p99 ms", "{:,.3f}"),
    ("replica_rss_kib", "replica per member: RSS, KiB", "{:,.0f}"),
    ("replica_views_kib", "  + decoded views (tracemalloc), KiB", "{:,.0f}"),
    ("snapshot_kib", "  its snapshot as applied, KiB", "{:,.1f}"),
    ("build_s", "build the site, s", "{:,.1f}"),
)


class Clock:
    """The members' clock, moved by the benchmark."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@dataclass
class Site:
    """The site as built: the coordinator and a follower, their own documents."""

    ids: list[str]
    clock: Clock
    coordinator: SiteMember
    coordinator_doc: NodeDoc
    follower: SiteMember
    follower_doc: NodeDoc
    follower_records: dict[str, TaskRecord]
    replica_rss_bytes: float
    replica_views_bytes: float
    snapshot_bytes: float
    build_s: float
    reports: int = 0


def member_id(n: int) -> str:
    return f"gw-{n:04d}"


def member_tasks(me: str, tasks: int, now: float) -> list[tuple[TaskSpec, TaskReport]]:
    """One member's tasks and its reports of them: 60% local running, 20% running under
    central's assignment, 10% service replicas (restart always), 10% queued locally."""
    out = []
    for t in range(tasks):
        kind = t % 10
        task_id = f"{me}-t{t:03d}"
        restart = RestartPolicy.ALWAYS if kind == 8 else RestartPolicy.ON_FAILURE
        spec = TaskSpec(
            id=task_id, command=("sleep", "1d"), cpu=0.5, mem_gib=0.5, restart=restart,
            workload="svc" if kind == 8 else "batch",
        )  # fmt: skip
        state = TaskState.ACCEPTED if kind == 9 else TaskState.RUNNING
        ref = AssignmentRef("central", 1, score=1.0) if kind in (6, 7, 8) else None
        started = None if state is TaskState.ACCEPTED else now - 600
        report = TaskReport(
            state=state, updated_at=now - 600, node=me,
            decided_by="central" if ref is not None else "edge-autonomous",
            workload=spec.workload, priority=spec.priority, cpu=spec.cpu, mem_gib=spec.mem_gib,
            accepted_at=now - 700, started_at=started, assignment=ref,
        )  # fmt: skip
        out.append((spec, report))
    return out


def writer_doc(me: str, coordinator: str, tasks: int, now: float) -> NodeDoc:
    """A member's own document, as the member writes it."""
    doc = NodeDoc(f"node-{me}", client_id_for(me))
    doc.packed = True
    with doc.doc.transaction():
        doc.set_registration(REGISTRATION)
        doc.set_site_entry("vote", SiteVote(1, coordinator, now - 60))
        for spec, report in member_tasks(me, tasks, now):
            doc.put_task(spec.id, report)
            if spec.restart is RestartPolicy.ALWAYS:
                doc.put_site_spec(spec.id, SiteSpec(spec))
    return doc


def records_of(me: str, tasks: int, now: float) -> dict[str, TaskRecord]:
    """A member's active task records (what the engine passes to ``actions``)."""
    out = {}
    for spec, report in member_tasks(me, tasks, now):
        a = report.assignment
        out[spec.id] = TaskRecord(
            spec=spec, state=report.state, submitted_at=report.accepted_at,
            updated_at=report.updated_at, decided_by=report.decided_by, node_id=me,
            assignment=None if a is None else Assignment(a.central, a.epoch, a.replacement,
                                                         a.score),
        )  # fmt: skip
    return out


def rss() -> float:
    """The process's RSS, after handing the allocator's free memory back to the system (so
    the growth measured is what the replicas hold, not memory freed earlier and reused)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # (not glibc: the growth may read low)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return float(psutil.Process().memory_info().rss)


def new_member(me: str, ids: Sequence[str], clock: Clock) -> SiteMember:
    member = SiteMember(
        me, [p for p in ids if p != me], client_id=client_id_for(me), centrals=("central",),
        signing=None, failover_after_s=FAILOVER_S, offer_after_s=30.0, clock=clock,
    )  # fmt: skip
    member.presence.connected = True
    return member


def set_status(member: SiteMember, peer: str, state: str) -> None:
    member.presence.handle(status_topic(peer), json.dumps({"node": peer, "state": state}).encode())


def touch_views(doc: NodeDoc) -> None:
    """Decode what the plan reads of a document (the views it then keeps cached)."""
    doc.registration()
    doc.tasks()
    doc.site_specs()
    doc.site_vote()
    doc.site_lease()


def build(members: int, tasks: int) -> Site:
    t0 = time.perf_counter()
    clock = Clock()
    now = clock.now
    ids = [member_id(n) for n in range(members)]
    me, other = ids[0], ids[1]
    own = writer_doc(me, me, tasks, now)
    follower_doc = writer_doc(other, me, tasks, now)
    # the peers' documents as they would arrive: each writer's snapshot (the writers are gone
    # before the replicas are built, so the memory measured below is the replicas' alone)
    snapshots = {other: follower_doc.snapshot()}
    for peer in ids[2:]:
        snapshots[peer] = writer_doc(peer, me, tasks, now).snapshot()
    coordinator = new_member(me, ids, clock)
    snapshot_bytes = sum(len(s) for s in snapshots.values())
    before = rss()
    for peer in ids[1:]:
        replica = NodeDoc(f"node-{peer}", client_id_for(me))
        replica.apply_remote(snapshots[peer], sender=peer)
        coordinator.replicas[peer] = replica
    built = rss()
    tracemalloc.start()
    for replica in coordinator.replicas.values():
        touch_views(replica)
    views, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del snapshots
    for peer in ids[1:]:
        set_status(coordinator, peer, "online")
    # the follower: its own replica of the coordinator's document (it reads the orders there);
    # of the other peers it shares the coordinator's replicas (read-only; the same content)
    follower = new_member(other, ids, clock)
    follower.replicas = {p: d for p, d in coordinator.replicas.items() if p != other}
    follower.replicas[me] = NodeDoc(f"node-{me}", client_id_for(other))
    for peer in ids:
        if peer != other:
            set_status(follower, peer, "online")
    site = Site(
        ids=ids,
        clock=clock,
        coordinator=coordinator,
        coordinator_doc=own,
        follower=follower,
        follower_doc=follower_doc,
        follower_records=records_of(other, tasks, now),
        replica_rss_bytes=max(0.0, built - before),
        replica_views_bytes=float(views),
        snapshot_bytes=float(snapshot_bytes),
        build_s=0.0,
        reports=members * tasks,
    )
    site.build_s = time.perf_counter() - t0
    return site


def sync_orders(site: Site) -> None:
    """The coordinator's document as the follower's replica of it (its orders, its lease)."""
    replica = site.follower.replicas[site.ids[0]]
    replica.apply_remote(site.coordinator_doc.diff(replica.state_vector()), sender=site.ids[0])


def cycle(site: Site, policy: PolicyConfig) -> int:
    """One coordinator cycle, as the engine runs it: elect, then plan. Returns the orders."""
    own, member, now = site.coordinator_doc, site.coordinator, site.clock.now
    with own.doc.transaction():
        member.elect(own, now, True)
    node = REGISTRATION.to_node(member.me)
    with own.doc.transaction():
        return member.plan(own, node, now, policy)


_R = TypeVar("_R")


def timed(fn: Callable[[], _R]) -> tuple[float, _R]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(members: int, tasks: int, cycles: int, failovers: int) -> dict[str, float]:
    if members < 3:
        raise ValueError("a site of at least 3 members (one may die and a majority stay)")
    site = build(members, tasks)
    policy = PolicyConfig()
    coordinator, own, clock = site.coordinator, site.coordinator_doc, site.clock
    # the first cycle takes the lease (the coordinator's term begins) and decodes every view
    clock.now += 1.0
    if cycle(site, policy) != 0:
        raise RuntimeError("a steady site placed something")
    if coordinator.acting is None:
        raise RuntimeError("the coordinator was not elected")
    sync_orders(site)
    site.follower.elect(site.follower_doc, clock.now, True)
    if site.follower.followed is None:
        raise RuntimeError("the follower does not follow the coordinator")
    steady = []
    for _ in range(cycles):
        clock.now += 1.0
        elapsed, orders = timed(lambda: cycle(site, policy))
        if orders != 0:
            raise RuntimeError("a steady cycle placed something")
        steady.append(elapsed)
    # failover: a member (never the coordinator nor the follower) dies; past the failover
    # time its replicas are ordered onto the live members. Then it comes back and the orders
    # are dropped (untimed), so each sample does the same work.
    failover = []
    given = []
    dying = site.ids[2:]
    for k in range(failovers):
        dead = dying[k % len(dying)]
        set_status(coordinator, dead, "offline")
        set_status(site.follower, dead, "offline")
        clock.now += FAILOVER_S + 1.0
        elapsed, orders = timed(lambda: cycle(site, policy))
        failover.append(elapsed)
        given.append(orders)
        if k < failovers - 1:
            set_status(coordinator, dead, "online")
            set_status(site.follower, dead, "online")
            clock.now += 1.0
            with own.doc.transaction():
                own.drop_site_keys("site_orders", list(own.site_orders()))
                coordinator.elect(own, clock.now, True)
    # the follower reads the last failover's orders (none for it to take: it holds no copy
    # of a dead member's replicas unless the core chose it; either way it walks them)
    sync_orders(site)
    site.follower.elect(site.follower_doc, clock.now, True)
    actions = []
    for _ in range(cycles):
        elapsed, _acts = timed(
            lambda: site.follower.actions(site.follower_doc, site.follower_records)
        )
        actions.append(elapsed)
    ms = 1000.0
    return {
        "members": members,
        "tasks_per_member": tasks,
        "reports": site.reports,
        "cycles": cycles,
        "failovers": failovers,
        "steady_p50_ms": statistics.median(steady) * ms,
        "steady_p99_ms": quantile(steady, 0.99) * ms,
        "steady_us_per_report": statistics.median(steady) * 1e6 / site.reports,
        "failover_p50_ms": statistics.median(failover) * ms,
        "failover_p99_ms": quantile(failover, 0.99) * ms,
        "orders_per_failover": statistics.mean(given),
        "replicas_per_failover": sum(1 for t in range(tasks) if t % 10 == 8),
        "actions_p50_ms": statistics.median(actions) * ms,
        "actions_p99_ms": quantile(actions, 0.99) * ms,
        "replica_rss_kib": site.replica_rss_bytes / 1024 / (members - 1),
        "replica_views_kib": site.replica_views_bytes / 1024 / (members - 1),
        "snapshot_kib": site.snapshot_bytes / 1024 / (members - 1),
        "build_s": site.build_s,
    }


#: The figures whose growth against the smallest size is printed (costs, not counts).
GROWTH = (
    "reports",
    "steady_p50_ms",
    "steady_p99_ms",
    "steady_us_per_report",
    "failover_p50_ms",
    "failover_p99_ms",
    "actions_p50_ms",
    "actions_p99_ms",
    "replica_rss_kib",
    "replica_views_kib",
)


def growth(rows: Sequence[dict[str, float]]) -> dict[str, dict[str, float | None]]:
    """Each size's figures over the first size's (the baseline, measured in the same run)."""
    base = rows[0]
    out: dict[str, dict[str, float | None]] = {}
    for row in rows[1:]:
        out[str(int(row["members"]))] = {
            k: (row[k] / base[k] if base[k] > 0 else None) for k in GROWTH
        }
    return out


def table(rows: Sequence[dict[str, float]]) -> list[str]:
    base = rows[0]
    head = ["figure"] + [f"N={int(r['members'])}" for r in rows]
    head += [f"x N={int(r['members'])}/{int(base['members'])}" for r in rows[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label, fmt in ROWS:
        cells = [label] + [fmt.format(r[key]) for r in rows]
        if key in GROWTH:
            cells += [f"x{r[key] / base[key]:.2f}" if base[key] > 0 else "-" for r in rows[1:]]
        else:
            cells += [""] * (len(rows) - 1)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--members", default="3,30,300", help="site sizes, comma-separated")
    parser.add_argument("--tasks", type=int, default=100, help="task reports per member")
    parser.add_argument("--cycles", type=int, default=40, help="steady cycles and actions timed")
    parser.add_argument("--failovers", type=int, default=15, help="failover cycles timed")
    parser.add_argument("--json", action="store_true", help="print JSON, not tables")
    parser.add_argument("--quick", action="store_true", help="3 and 30 members, few cycles")
    args = parser.parse_args(argv)
    # (the site's warnings, one per order and election, go to stderr: not what is measured)
    logging.getLogger("edgesched.edge.site").setLevel(logging.ERROR)
    sizes = [int(x) for x in args.members.split(",") if x.strip()]
    cycles, failovers = args.cycles, args.failovers
    if args.quick:
        sizes, cycles, failovers = [3, 30], 8, 4
    rows = [measure(n, args.tasks, cycles, failovers) for n in sizes]
    if args.json:
        doc = {
            "tasks_per_member": args.tasks,
            "failover_after_s": FAILOVER_S,
            "sizes": rows,
            "baseline": sizes[0],
            "growth": growth(rows),
        }
        print(json.dumps(doc, indent=2))
        return
    print(
        f"site coordinator cycle: {args.tasks} task reports a member, {cycles} steady cycles, "
        f"{failovers} failovers, {cycles} actions per size (load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    print()
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
