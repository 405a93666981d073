"""The edge engine's periodic work against the size of its finished history in SQLite.

For each history size H (100, 10,000 and 100,000 finished tasks by default) a fresh state
directory is filled, before the engine starts, with H finished task rows (exited, failed and
cancelled in turn, finished 2 to 20 days ago: past the node document's one-day retention, so
the CRDT document stays small and only the store's history grows) and two decisions per
task. Then an :class:`~edgesched.edge.engine.EdgeEngine` runs in-process, offline (MQTT port
closed), with ``history_retention_s`` 30 days where the engine knows the key (the history is
kept, not pruned: the worst case for the hot path), and 10 active tasks (``sleep 600``) are
submitted and left running.

Timed, ``--reps`` times each (median printed), the work the engine repeats every few seconds:

* **cycle**: one :meth:`EdgeEngine.cycle` (read what is queued and held, schedule, mirror);
* **sample**: one pass of the sample loop (agent sample, store it, the per-state task gauges,
  the demand forecast's input, and, where the engine has it, one bounded pruning batch). The
  engine's own step is called when it has one (``_sample_step``); an engine without it (the
  tree before this change) gets a copy of its loop body, without the hourly rollup.

Wall time (includes the store's database thread) and the event loop thread's CPU time
(``time.thread_time``: what the loop itself spent; the store decodes rows in its own
thread since a store call became one job there) are printed, with each
figure's ratio to the H=100 case. With a store that has ``prune_history``, also the time of
one pruning batch with every one of the H rows past the retention.

    .venv/bin/python bench/bench_edge_history.py [--sizes 100,10000,100000] [--reps 20]

Figures (a 2-core development machine shared with other work; ms, median of 20; ``loop``:
the event loop thread's CPU time; x: ratio to the H=100 case)::

                         cycle ms (loop)  x      sample ms (loop)   x     startup  prune batch
    BEFORE (73aa50b)
        100                0.51  (0.42)  1.0       4.39   (3.08)   1.0    0.06 s   -
     10,000                0.51  (0.43)  1.0     299.93 (246.68)  68.4    0.30 s   -
    100,000                0.52  (0.44)  1.0    3427.80 (2657.60) 781.3   4.47 s   -
    AFTER
        100                0.55  (0.46)  1.0       1.66   (1.08)   1.0    0.05 s   2.7 ms
     10,000                0.50  (0.42)  0.9       1.70   (1.10)   1.0    0.03 s   7.5 ms
    100,000                0.57  (0.47)  1.0       2.47   (1.20)   1.5    0.22 s  23.7 ms

The cycle already read only the active tasks; the sample loop decoded every row to count
states. A run with 50 repetitions gave 1.64 / 1.76 ms at 100 / 100,000 (x1.1): the wall
figure at 100,000 moves with the machine's load, the loop's own CPU time does not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

DAY = 86_400.0
ACTIVE = 10


async def _fill(path: Path, history: int, now: float) -> None:
    from edgesched.core.model import Decision, DecisionKind
    from edgesched.core.task import TaskRecord, TaskSpec, TaskState
    from edgesched.sync.store import Store

    states = (TaskState.EXITED, TaskState.FAILED, TaskState.CANCELLED)
    async with await Store.open(path) as store:
        chunk = 5000
        for lo in range(0, history, chunk):
            records, decisions = [], []
            for i in range(lo, min(history, lo + chunk)):
                done = now - 2 * DAY - (18 * DAY) * (i / max(history, 1))
                spec = TaskSpec(id=f"old-{i:06d}", command=("true",), cpu=0.1, mem_gib=0.1)
                records.append(
                    TaskRecord(
                        spec,
                        states[i % 3],
                        done - 60.0,
                        done,
                        decided_by="edge-autonomous",
                        node_id="gw-hist",
                        exit_code=0 if i % 3 == 0 else 1,
                        reason="history",
                    )
                )
                for kind in (DecisionKind.PIN, DecisionKind.PLACE):
                    decisions.append(
                        Decision(kind, "gw-hist", "history", done - 60.0, task_id=spec.id)
                    )
            await store.put_tasks(records)
            await store.append_decisions(decisions, "edge-autonomous")


async def _timed(step: Callable[[], Awaitable[Any]], reps: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.thread_time()
        await step()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.thread_time() - c0)
        await asyncio.sleep(0.01)
    return statistics.median(walls), statistics.median(cpus)


async def _old_sample_step(engine: Any, agent: Any) -> None:
    """The body of the sample loop before this change (without the hourly rollup)."""
    from edgesched.core.task import TaskState
    from edgesched.sync.store import StoreError

    now = engine.clock()
    sample = agent.sample(now, parked=engine.power.state.parked)
    engine.metrics.observe(sample)
    engine._publish_telemetry(now, sample)
    await engine.store.add_sample(now, sample.to_json())
    engine.executor.rotate_logs()
    counts: dict[str, int] = {}
    with contextlib.suppress(StoreError):
        records = await engine.store.list_tasks()
        for r in records:
            counts[r.state.value] = counts.get(r.state.value, 0) + 1
        await engine._observe_demand(now, records)
    for state in TaskState:
        engine.metrics.tasks.labels(state.value).set(counts.get(state.value, 0))


async def _one(history: int, reps: int) -> dict[str, Any]:
    from edgesched.config import EdgeConfig, parse_config
    from edgesched.core.task import TaskSpec, TaskState
    from edgesched.edge.agent import Agent
    from edgesched.edge.engine import EdgeEngine
    from edgesched.edge.executor import kill_leftovers
    from edgesched.edge.hal import default_power_model
    from edgesched.ports import free_port
    from edgesched.sync.store import Store

    with tempfile.TemporaryDirectory(prefix="edgesched-hist-") as tmpdir:
        state = Path(tmpdir) / "state"
        state.mkdir()
        now = time.time()
        await _fill(state / "edge.db", history, now)
        edge: dict[str, Any] = {
            "node_id": "gw-hist",
            "state_dir": str(state),
            "api_port": 0,
            "cycle_s": 3600.0,  # the bench drives the cycles itself
            "sample_s": 3600.0,
            "stop_grace_s": 1.0,
            "mqtt": {"port": free_port()},
        }
        knows_retention = "history_retention_s" in {f.name for f in dataclasses.fields(EdgeConfig)}
        if knows_retention:
            edge["history_retention_s"] = 30 * DAY
        engine = EdgeEngine(parse_config({"edge": edge}))
        t0 = time.perf_counter()
        runner = asyncio.create_task(engine.run())
        out: dict[str, Any] = {"history": history}
        try:
            await asyncio.wait_for(engine.wait_ready(), 300)
            out["startup_s"] = time.perf_counter() - t0
            for i in range(ACTIVE):
                await engine.submit(
                    TaskSpec(id=f"live-{i}", command=("sleep", "600"), cpu=0.01, mem_gib=0.01)
                )
            for _ in range(100):
                await engine.cycle()
                running = await engine.store.list_tasks([TaskState.RUNNING])
                if len(running) >= ACTIVE:
                    break
                await asyncio.sleep(0.05)
            assert engine.profile is not None
            agent = Agent(engine.profile, default_power_model(engine.profile), engine.hal_root)
            sample_step = getattr(engine, "_sample_step", None)

            async def sample() -> None:
                if sample_step is not None:
                    await sample_step(agent, engine.clock())
                else:
                    await _old_sample_step(engine, agent)

            out["cycle"] = await _timed(engine.cycle, reps)
            out["sample"] = await _timed(sample, reps)
            out["kept"] = len(await engine.store.list_tasks([TaskState.EXITED]))
        finally:
            engine.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runner, 60)
            kill_leftovers([state / "run"])
        if hasattr(Store, "prune_history"):
            async with await Store.open(state / "edge.db") as store:
                w0 = time.perf_counter()
                pruned = await store.prune_history(now + 1.0)
                out["prune"] = (time.perf_counter() - w0, pruned)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,10000,100000")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    import edgesched.sync.store as store_module

    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"edge engine periodic work vs finished history ({ACTIVE} tasks running, median of "
        f"{args.reps}) {args.label}".rstrip()
    )
    print(f"  store module: {store_module.__file__}")
    print(
        f"{'history':>8} {'startup s':>9} {'cycle ms':>9} {'(loop)':>7} {'x':>5} "
        f"{'sample ms':>9} {'(loop)':>7} {'x':>5}  prune one batch"
    )
    base: dict[str, Any] | None = None
    for history in sizes:
        r = asyncio.run(_one(history, args.reps))
        base = base or r
        ms = 1000.0
        prune = ""
        if "prune" in r:
            secs, (tasks, decisions) = r["prune"][0], r["prune"][1]
            prune = f"{secs * ms:.1f} ms ({tasks} tasks, {decisions} decisions)"
        print(
            f"{history:>8} {r['startup_s']:>9.2f} {r['cycle'][0] * ms:>9.2f} "
            f"{r['cycle'][1] * ms:>7.2f} {r['cycle'][0] / base['cycle'][0]:>5.1f} "
            f"{r['sample'][0] * ms:>9.2f} {r['sample'][1] * ms:>7.2f} "
            f"{r['sample'][0] / base['sample'][0]:>5.1f}  {prune}"
        )


if __name__ == "__main__":
    main()
