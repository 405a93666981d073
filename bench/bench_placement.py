"""Placement throughput of the core, against a plain Python per-node loop in the same run.

Both place the same tasks on the same fleet with the same rules (priority mode: filters on
state, architecture, server class and resources; scores least-allocated + class fit), and the
benchmark checks they choose the same nodes, so the ratio compares like with like. Pinned to
one core. Prints placements per second for 1,000 and 10,000 nodes and the ratio.

    .venv/bin/python bench/bench_placement.py [--tasks N] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from edgesched.core.model import (
    Arch,
    DecisionKind,
    Node,
    PowerModel,
    Resources,
    ServerClass,
    Task,
)
from edgesched.core.nodetable import natural_class
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView, schedule


def fleet(n: int, rng: random.Random) -> tuple[Node, ...]:
    nodes = []
    for i in range(n):
        cls = rng.choice(
            [ServerClass.GENERAL] * 6 + [ServerClass.AI_ACCELERATOR, ServerClass.STORAGE_DENSE]
        )
        nodes.append(
            Node(
                f"n{i:05d}",
                rng.choice(list(Arch)),
                cls,
                Resources(
                    rng.choice([32, 48, 64, 80]),
                    rng.choice([128, 256, 512]),
                    8 if cls is ServerClass.AI_ACCELERATOR else 0,
                    2000 if cls is ServerClass.STORAGE_DENSE else 0,
                ),
                PowerModel(100, 400),
            )
        )
    return tuple(nodes)


def workload(count: int, rng: random.Random) -> list[Task]:
    tasks = []
    for i in range(count):
        kind = rng.random()
        accel = 1 if kind < 0.1 else 0
        iops = 100.0 if 0.1 <= kind < 0.2 else 0.0
        archs = frozenset({rng.choice(list(Arch))}) if rng.random() < 0.3 else frozenset()
        tasks.append(
            Task(
                f"t{i:06d}",
                "w",
                rng.randint(0, 100),
                Resources(rng.choice([1, 2, 4, 8]), rng.choice([2, 4, 8, 16]), accel, iops),
                submitted_at=float(i),
                archs=archs,
            )
        )
    return tasks


def plain_loop(nodes: tuple[Node, ...], pending: list[Task]) -> dict[str, str]:
    """The same rules as the core's priority mode, as a per-node Python loop."""
    ordered = sorted(nodes, key=lambda n: n.id)
    used = {n.id: [0.0, 0.0, 0.0, 0.0] for n in ordered}
    chosen: dict[str, str] = {}
    for task in sorted(pending, key=lambda t: (-t.priority, t.submitted_at, t.id)):
        d = task.demand
        want = (d.cpu, d.mem_gib, float(d.accel), d.iops_k)
        best_score, best = -1.0, None
        for node in ordered:
            if not task.runs_on(node.arch):
                continue
            c = node.capacity
            cap = (c.cpu, c.mem_gib, float(c.accel), c.iops_k)
            u = used[node.id]
            if any(u[k] + want[k] > cap[k] + 1e-9 for k in range(4)):
                continue
            asked = [k for k in range(4) if k == 0 or want[k] > 0]
            frac = [min(max((u[k] + want[k]) / max(cap[k], 1e-9), 0.0), 1.0) for k in asked]
            least = 1.0 - sum(frac) / len(frac)
            fit = 1.0 if node.server_class is natural_class(task) else 0.0
            score = (least + fit) / 2
            if score > best_score:
                best_score, best = score, node
        if best is not None:
            for k in range(4):
                used[best.id][k] += want[k]
            chosen[task.id] = best.id
    return chosen


def measure(n_nodes: int, n_tasks: int, repeat: int) -> tuple[float, float]:
    rng = random.Random(n_nodes)
    nodes = fleet(n_nodes, rng)
    tasks = workload(n_tasks, rng)
    policy = PolicyConfig(mode=PolicyMode.PRIORITY)
    view = ClusterView(nodes)
    ours, base = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = schedule(view, tasks, policy)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        plain = plain_loop(nodes, tasks)
        base.append(time.perf_counter() - t0)
    core = {d.task_id: d.node_id for d in result.decisions if d.kind is DecisionKind.PLACE}
    agree = sum(core.get(k) == v for k, v in plain.items()) / max(len(plain), 1)
    placed = len(core)
    print(
        f"{n_nodes:>6} nodes  {placed:>5} placements  "
        f"core {placed / statistics.median(ours):>9,.0f}/s  "
        f"plain loop {len(plain) / statistics.median(base):>8,.0f}/s  "
        f"ratio x{statistics.median(base) / statistics.median(ours):.1f}  "
        f"same choices {agree:.1%}"
    )
    return placed / statistics.median(ours), len(plain) / statistics.median(base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(f"placement throughput, one core, {args.tasks} tasks per cycle, median of {args.repeat}")
    for n in (1_000, 10_000):
        measure(n, args.tasks, args.repeat)


if __name__ == "__main__":
    main()
