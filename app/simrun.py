"""Running the campus experiment and trace replays across processes, one strategy per worker.

The core's simulator is single-threaded and pure; this module is the effectful shell that
spreads strategies over CPU cores. Each worker regenerates the (deterministic) scenario from
its seed (a trace replay's worker reads the trace file again) rather than receiving tens of
thousands of pickled tasks, and reports progress through a queue that the caller drains into
its progress bar.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import Manager
from pathlib import Path
from typing import Any, TypeVar

from edgesched.core.affinity import arm48_experiment
from edgesched.core.campus import campus_scenario
from edgesched.core.experiment import (
    LEARNED_STRATEGY,
    ExperimentResult,
    build_strategies,
    check_targets,
)
from edgesched.core.fleetspec import parse_fleet
from edgesched.core.policy import PolicyConfig
from edgesched.core.simulator import ScenarioLike, SimReport, simulate
from edgesched.core.strategies import Strategy
from edgesched.core.tidal import TidalProfile
from edgesched.core.trace import TraceScenario, gated, trace_scenario
from edgesched.core.traceformats import ImportStats, Machine, load_trace


@dataclass(frozen=True, slots=True)
class SimJob:
    seed: int
    days: float
    scale: float
    policy: PolicyConfig
    tidal: TidalProfile
    strategy: str
    batch_s: float = 1.0


def _strategies(
    scenario: ScenarioLike, tidal: TidalProfile, policy: PolicyConfig, name: str
) -> list[Strategy]:
    """The strategy ``name``; ``learned`` scores with the shipped placement model unless the
    policy already carries a score model (without a usable model the core falls back to the
    energy heuristic per placement, and the model loader logs why)."""
    learned = None
    if name == LEARNED_STRATEGY and policy.learned_score is None:
        from edgesched.policies.placement import learned_policy

        learned = learned_policy(None).learned_score
    return build_strategies(scenario, tidal, policy, [name], learned=learned)


def _simulate(
    scenario: ScenarioLike,
    strategy: Strategy,
    name: str,
    horizon: float,
    batch_s: float,
    progress: Any | None,
) -> SimReport:
    """One simulation, telling ``progress`` (a queue, or None) its clock 200 times over."""
    step = horizon / 200
    last = [-step]

    def report(t: float) -> None:
        if progress is not None and t - last[0] >= step:
            last[0] = t
            progress.put((name, t))

    result = simulate(scenario, strategy, batch_s=batch_s, progress=report)
    if progress is not None:
        progress.put((name, horizon))
    return result


def _run_one(job: SimJob, progress: Any | None) -> SimReport:
    scenario = campus_scenario(seed=job.seed, days=job.days, scale=job.scale)
    (strategy,) = _strategies(scenario, job.tidal, job.policy, job.strategy)
    return _simulate(scenario, strategy, job.strategy, job.days * 86_400, job.batch_s, progress)


J = TypeVar("J", "SimJob", "TraceJob")


def _run_jobs(
    jobs: Sequence[J],
    run: Callable[[J, Any | None], SimReport],
    workers: int,
    progress: Callable[[str, float], None] | None,
) -> dict[str, SimReport]:
    """Each job's report by strategy: in this process, or ``workers`` processes at a time
    whose progress queues are drained into ``progress``."""
    reports: dict[str, SimReport] = {}
    if workers <= 1 or len(jobs) == 1:
        sink = _CallbackQueue(progress) if progress is not None else None
        for job in jobs:
            reports[job.strategy] = run(job, sink)
        return reports
    with Manager() as manager, ProcessPoolExecutor(max_workers=workers) as pool:
        updates = manager.Queue()
        futures: dict[Future[SimReport], str] = {
            pool.submit(run, job, updates): job.strategy for job in jobs
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(updates, progress)
            for fut in done:
                reports[futures[fut]] = fut.result()
        _drain(updates, progress)
    return reports


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
    reports = _run_jobs(jobs, _run_one, workers, progress)
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


# --------------------------------------------------------------------------------------------
# Trace replays


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One strategy over a trace file; the worker reads the file again (deterministic)."""

    path: str
    fmt: str
    fleet: str | None
    slo_wait_s: float
    slo_by_class: tuple[tuple[str, float], ...]
    machine: Machine
    policy: PolicyConfig
    tidal: TidalProfile
    strategy: str
    batch_s: float = 1.0


def load_trace_scenario(
    path: Path,
    fmt: str,
    fleet: str | None,
    slo_wait_s: float,
    slo_by_class: Sequence[tuple[str, float]] = (),
    machine: Machine | None = None,
) -> tuple[TraceScenario, ImportStats]:
    """The replay of a trace file (TraceError, FleetSpecError or ValueError when it cannot be
    built)."""
    rows, stats = load_trace(path, fmt, machine)
    nodes = parse_fleet(fleet) if fleet else None
    scenario = trace_scenario(
        rows, nodes, slo_wait_s=slo_wait_s, slo_by_class=dict(slo_by_class), source=str(path)
    )
    return scenario, stats


def _run_trace_one(
    job: TraceJob, progress: Any | None, scenario: TraceScenario | None = None
) -> SimReport:
    if scenario is None:
        scenario, _ = load_trace_scenario(
            Path(job.path), job.fmt, job.fleet, job.slo_wait_s, job.slo_by_class, job.machine
        )
    (strategy,) = _strategies(scenario, job.tidal, job.policy, job.strategy)
    return _simulate(
        scenario, gated(strategy, scenario), job.strategy, scenario.horizon_s, job.batch_s, progress
    )


def run_trace(
    scenario: TraceScenario,
    *,
    path: Path,
    fmt: str,
    fleet: str | None,
    slo_wait_s: float,
    slo_by_class: Sequence[tuple[str, float]],
    machine: Machine,
    policy: PolicyConfig,
    tidal: TidalProfile,
    strategies: Sequence[str],
    workers: int,
    batch_s: float = 1.0,
    progress: Callable[[str, float], None] | None = None,
) -> ExperimentResult:
    """Every strategy over the same trace, ``workers`` at a time, in the given order.

    ``scenario`` is the replay already built from these arguments (the in-process path runs
    it; each worker process builds its own from the file rather than receive it pickled)."""
    jobs = [
        TraceJob(
            str(path), fmt, fleet, slo_wait_s, tuple(slo_by_class), machine, policy, tidal, name,
            batch_s,
        )
        for name in strategies
    ]  # fmt: skip
    if workers <= 1 or len(jobs) == 1:
        reports = _run_jobs(jobs, lambda job, q: _run_trace_one(job, q, scenario), 1, progress)
    else:
        reports = _run_jobs(jobs, _run_trace_one, workers, progress)
    return ExperimentResult(tuple(reports[name] for name in strategies), {}, ())
