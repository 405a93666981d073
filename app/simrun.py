"""Running the campus experiment across processes, one strategy per worker.

The core's simulator is single-threaded and pure; this module is the effectful shell that
spreads strategies over CPU cores. Each worker regenerates the (deterministic) scenario from
its seed rather than receiving 60,000 pickled tasks, and reports progress through a queue
that the caller drains into its progress bar.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import Manager
from typing import Any

from edgesched.core.affinity import arm48_experiment
from edgesched.core.campus import campus_scenario
from edgesched.core.experiment import ExperimentResult, build_strategies, check_targets
from edgesched.core.policy import PolicyConfig
from edgesched.core.simulator import SimReport, simulate
from edgesched.core.tidal import TidalProfile


@dataclass(frozen=True, slots=True)
class SimJob:
    seed: int
    days: float
    scale: float
    policy: PolicyConfig
    tidal: TidalProfile
    strategy: str
    batch_s: float = 1.0


def _run_one(job: SimJob, progress: Any | None) -> SimReport:
    scenario = campus_scenario(seed=job.seed, days=job.days, scale=job.scale)
    (strategy,) = build_strategies(scenario, job.tidal, job.policy, [job.strategy])
    horizon = job.days * 86_400
    step = horizon / 200
    last = [-step]

    def report(t: float) -> None:
        if progress is not None and t - last[0] >= step:
            last[0] = t
            progress.put((job.strategy, t))

    result = simulate(scenario, strategy, batch_s=job.batch_s, progress=report)
    if progress is not None:
        progress.put((job.strategy, horizon))
    return result


def default_workers() -> int:
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 8))


def run_campus(
    *,
    seed: int,
    days: float,
    scale: float,
    policy: PolicyConfig,
    tidal: TidalProfile,
    strategies: Sequence[str],
    affinity_load: float,
    workers: int,
    batch_s: float = 1.0,
    progress: Callable[[str, float], None] | None = None,
) -> ExperimentResult:
    """Every strategy over the same seeded campus, ``workers`` at a time, in the given order."""
    jobs = [SimJob(seed, days, scale, policy, tidal, name, batch_s) for name in strategies]
    reports: dict[str, SimReport] = {}
    if workers <= 1 or len(jobs) == 1:
        sink = _CallbackQueue(progress) if progress is not None else None
        for job in jobs:
            reports[job.strategy] = _run_one(job, sink)
    else:
        with Manager() as manager, ProcessPoolExecutor(max_workers=workers) as pool:
            updates = manager.Queue()
            futures: dict[Future[SimReport], str] = {
                pool.submit(_run_one, job, updates): job.strategy for job in jobs
            }
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(updates, progress)
                for fut in done:
                    reports[futures[fut]] = fut.result()
            _drain(updates, progress)
    ordered = [reports[name] for name in strategies]
    affinity = {k: float(v) for k, v in arm48_experiment(affinity_load, seed).items()}
    scenario = campus_scenario(seed=seed, days=days, scale=scale)
    return ExperimentResult(tuple(ordered), affinity, check_targets(scenario, ordered, affinity))


class _CallbackQueue:
    """Queue-shaped adapter so the in-process path reports like the worker path."""

    def __init__(self, cb: Callable[[str, float], None]) -> None:
        self.cb = cb

    def put(self, item: tuple[str, float]) -> None:
        self.cb(*item)


def _drain(updates: Any, progress: Callable[[str, float], None] | None) -> None:
    while True:
        try:
            name, t = updates.get_nowait()
        except queue.Empty:
            return
        if progress is not None:
            progress(name, t)
