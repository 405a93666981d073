"""Central's service controller at fleet scale, in one process (issue 15).

Builds central's real engine over ``--nodes`` replicas of the project's document classes (as
``bench_control_step.py`` does, with ``--tasks`` other tasks a node), then creates S services
of ``--replicas`` replicas each (spread across nodes, at most 2 a node), for two values of S
(``--services``), and times:

* **placing**: the control step that starts and places every replica of every service (the
  core with each service's spread), per replica;
* **a step after one replica changed**: one replica of one service exits on its node; the
  next step reconciles that service only and starts its next incarnation (what a step costs
  while the services sit still but for a change here and there);
* **the full pass**: the step that reconciles every service (after a change to the services,
  and every 30 s as a safety net), per service.

Prints each figure at both sizes and the ratio large / small: the step after one change should
not grow with the number of services; the placing and the periodic pass grow with what they
do (replicas, services), so their per-unit cost should stay flat. A service at rest costs
nothing between full passes (a rollout's or an autoscaler's timer aside).

    .venv/bin/python bench/bench_services.py [--nodes 1000] [--tasks 20] [--services 20,200]
        [--replicas 10] [--steps 30]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_control_step as base
import psutil

from edgesched.central.engine import CentralEngine
from edgesched.central.services import FULL_PASS_S
from edgesched.core.service import ServiceSpec, parse_replica_id
from edgesched.core.task import TaskState
from edgesched.sync.schema import AssignmentRef, TaskReport


class NoJournal:
    """The fleet document's journal: what SQLite costs is not what this measures."""

    async def flushed(self) -> None:
        return None


def service(name: str, replicas: int) -> ServiceSpec:
    return ServiceSpec.from_json(
        {
            "name": name,
            "template": {"command": ["srv"], "cpu": 0.5, "mem_gib": 0.25},
            "replicas": replicas,
            "spread": {"max_per_node": 2, "across": ["node"]},
        }
    )


def report_running(engine: CentralEngine, now: float) -> int:
    """Every placed replica runs on its node (written through central's replica of the
    node's document, as the node's own report would arrive). Returns how many."""
    count = 0
    for task_id, entry in engine.index.assignments.items():
        if parse_replica_id(task_id) is None or not entry.active or not entry.node:
            continue
        doc = engine.replicas.replicas[entry.node].doc
        held = doc.task(task_id)
        if held is not None and held.state is TaskState.RUNNING:
            continue
        doc.put_task(task_id, TaskReport(
            state=TaskState.RUNNING, updated_at=now, cpu=0.5, mem_gib=0.25, started_at=now,
            assignment=AssignmentRef("central", entry.epoch),
        ))  # fmt: skip
        engine._replica_changed(entry.node)
        count += 1
    return count


async def measure(services: int, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        engine, clock, _ = base.build(args.nodes, args.tasks, Path(tmp))
        engine._fleet_journal = NoJournal()  # type: ignore[assignment]  # (no store here)
        engine.sync_index(project=False)
        engine.control_step()
        for s in range(services):
            await engine.apply_service(service(f"svc-{s:04d}", args.replicas))
        t0 = time.perf_counter()
        engine.control_step()  # every replica started and placed
        placing = time.perf_counter() - t0
        placed = sum(
            1 for t, e in engine.index.assignments.items()
            if parse_replica_id(t) is not None and e.active
        )  # fmt: skip
        report_running(engine, clock.now)
        engine.control_step()
        per_node = max(
            sum(1 for t in engine.index.assigned.get(n, ()) if t.startswith("svc-0000."))
            for n in engine.replicas.replicas
        )
        one_change: list[float] = []
        replaced = 0
        for step in range(args.steps):
            clock.now += 0.01  # (within the second: only what changed is reconciled)
            name = f"svc-{step % services:04d}"
            victim = next(t for t in engine.services.replica_ids(name)
                          if engine.index.assignments[t].active)  # fmt: skip
            entry = engine.index.assignments[victim]
            doc = engine.replicas.replicas[entry.node].doc
            doc.put_task(victim, TaskReport(
                state=TaskState.FAILED, updated_at=clock.now, cpu=0.5, exit_code=1,
                assignment=AssignmentRef("central", entry.epoch),
            ))  # fmt: skip
            engine._replica_changed(entry.node)
            engine.sync_index()
            before = len(engine.index.assignments)
            t0 = time.perf_counter()
            engine.control_step()
            one_change.append(time.perf_counter() - t0)
            replaced += len(engine.index.assignments) - before
            report_running(engine, clock.now)
            engine.control_step()
        full: list[float] = []
        for _ in range(max(3, args.steps // 5)):
            clock.now += FULL_PASS_S + 0.1  # past the safety net's interval: every service
            t0 = time.perf_counter()
            engine.control_step()
            full.append(time.perf_counter() - t0)
        rss = psutil.Process().memory_info().rss / 2**20
    return {
        "services": services,
        "replicas": placed,
        "placing_s": placing,
        "placing_per_replica_ms": placing / max(placed, 1) * 1e3,
        "max_per_node": per_node,
        "one_change_p50_ms": statistics.median(one_change) * 1e3,
        "one_change_p99_ms": base.quantile(one_change, 0.99) * 1e3,
        "replaced": replaced,
        "full_p50_ms": statistics.median(full) * 1e3,
        "full_per_service_ms": statistics.median(full) * 1e3 / services,
        "rss_mib": rss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=20, help="other task entries per node")
    parser.add_argument("--services", default="20,200", help="two service counts")
    parser.add_argument("--replicas", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    small, large = (int(s) for s in args.services.split(","))
    rows = [asyncio.run(measure(n, args)) for n in (small, large)]
    print(
        f"services on {args.nodes:,} nodes ({args.tasks} other tasks a node), "
        f"{args.replicas} replicas a service, spread across nodes (at most 2 a node)"
    )
    figures = [
        ("replicas placed", "replicas", "{:.0f}"),
        ("most replicas of a service on a node", "max_per_node", "{:.0f}"),
        ("placing them all: one step (s)", "placing_s", "{:.3f}"),
        ("  per replica (ms)", "placing_per_replica_ms", "{:.3f}"),
        ("step after one replica failed, p50 (ms)", "one_change_p50_ms", "{:.2f}"),
        ("  p99 (ms)", "one_change_p99_ms", "{:.2f}"),
        ("  replicas replaced", "replaced", "{:.0f}"),
        ("the full pass over every service (ms)", "full_p50_ms", "{:.1f}"),
        ("  per service (ms)", "full_per_service_ms", "{:.3f}"),
        ("RSS (MiB)", "rss_mib", "{:.0f}"),
    ]
    head = f"{'figure':<44}{small:>10,}{large:>10,}{'ratio':>8}"
    print(head)
    print("-" * len(head))
    for label, key, fmt in figures:
        a, b = rows[0][key], rows[1][key]
        ratio = f"x{b / a:.2f}" if a else "-"
        print(f"{label:<44}{fmt.format(a):>10}{fmt.format(b):>10}{ratio:>8}")


if __name__ == "__main__":
    main()
