"""What central's fleet-wide task views cost as the fleet grows (issue 14): the lifecycle of a
task, a page of ``GET /v1/tasks``, and the history's passes.

Central is built as ``bench_control_step.py`` builds it: N nodes of ``--tasks`` entries, 70%
of them central's running assignments, 30% tasks the nodes decided and finished. Measured at
each size, on this central's own loop (no HTTP):

- the lifecycle of one task (:meth:`CentralEngine.lifecycle_of`), over 5,000 tasks;
- where a page of ``GET /v1/tasks`` from the middle of the ids starts and its 1,000 ids
  (the index keeps the ids sorted), and a page of 1,000 views;
- the history at a start, when every task is due: each pass of ``record_history`` (a slice
  of 5,000 tasks, the finished ones written to SQLite), the slowest pass and how many.

Printed per size, then the largest size against the smallest (a ratio: the per-task costs
should stay flat; the number of history passes at a start grows with the fleet).

    .venv/bin/python bench/bench_task_views.py [--nodes 100,1000] [--tasks 100]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_control_step as base

from edgesched.sync.store import Store


async def measure(nodes: int, tasks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        engine, _clock, _running = base.build(nodes, tasks, Path(tmp))
        engine._store = await Store.open(Path(tmp) / "central.db")  # (as run() opens it)
        try:
            engine.sync_index(project=False)
            gc.collect()
            ids = engine.task_ids()
            middle = ids[len(ids) // 2]
            start = time.perf_counter()
            at = bisect.bisect_right(ids, middle)  # where a page after the middle starts
            deep = [ids[i] for i in range(at, min(at + 1000, len(ids)))]
            ids_s = time.perf_counter() - start
            assert deep
            sample = ids[:: max(1, len(ids) // 5000)][:5000]
            start = time.perf_counter()
            for task_id in sample:
                engine.lifecycle_of(task_id, engine.index.assignments.get(task_id))
            life_us = (time.perf_counter() - start) / len(sample) * 1e6
            start = time.perf_counter()
            page = [engine.any_task_view(t) for t in ids[:1000]]
            page_s = time.perf_counter() - start
            assert all(v is not None for v in page)
            passes: list[float] = []
            written = 0
            while engine._history_due:
                start = time.perf_counter()
                written += await engine.record_history()
                passes.append(time.perf_counter() - start)
            rows = await engine.store.finished_tasks(limit=1000)
        finally:
            await engine.store.close()
    return {
        "nodes": nodes,
        "tasks": len(ids),
        "ids_ms": ids_s * 1e3,
        "life_us": life_us,
        "page_ms": page_s * 1e3,
        "passes": len(passes),
        "pass_p50_ms": statistics.median(passes) * 1e3,
        "pass_max_ms": max(passes) * 1e3,
        "written": written,
        "rows": len(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000")
    parser.add_argument("--tasks", type=int, default=100)
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        row = asyncio.run(measure(n, args.tasks))
        rows.append(row)
        print(
            f"{n:>6} nodes, {row['tasks']:,} tasks: lifecycle {row['life_us']:.1f} us a task; "
            f"a page's ids from the middle {row['ids_ms']:.2f} ms; "
            f"a page of 1,000 views {row['page_ms']:.1f} ms; "
            f"history at a start {row['passes']} passes of 5,000 (p50 {row['pass_p50_ms']:.0f} "
            f"ms, slowest {row['pass_max_ms']:.0f} ms), {row['written']:,} finished tasks "
            f"written",
            flush=True,
        )
        gc.collect()
    small, large = rows[0], rows[-1]
    print(
        f"\n{large['nodes']} vs {small['nodes']} nodes: lifecycle x"
        f"{large['life_us'] / small['life_us']:.2f} a task, page of views x"
        f"{large['page_ms'] / small['page_ms']:.2f}, slowest history pass x"
        f"{large['pass_max_ms'] / small['pass_max_ms']:.2f}, a page's ids x"
        f"{large['ids_ms'] / small['ids_ms']:.1f} (tasks x{large['tasks'] / small['tasks']:.0f})"
    )


if __name__ == "__main__":
    main()
