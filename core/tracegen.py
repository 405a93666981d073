"""Seeded synthetic traces, written in each format a replay reads (tests and the scenario suite).

:func:`synthetic_tasks` draws an Alibaba-like hour of batch work: jobs arriving as a Poisson
process (rate swinging +-30% over the hour), each a small DAG of 1-4 tasks (every task after
the first needs one or two earlier ones), each task a geometric number of instances (mean 4),
plan CPU 0.5/1/2/4 cores, lognormal durations (median 40 s before calibration). Durations are
then scaled so that the peak CPU in use, every instance starting as soon as its task may, is
``peak_cores`` (by default 70% of 36 x86 general servers per 30,000 instances). Times are whole
seconds from 1 (Alibaba's 0 means "outside the window").

The writers put the same tasks in each format: :func:`write_edgesched`,
:func:`write_alibaba` (batch_task lines, DAG names ``M1``, ``R2_1``, ``J3_1_2``; jobs of one
task get an opaque ``task_...`` name like the trace's non-DAG tasks), :func:`write_google`
(instance_events, CSV with a BigQuery-style header or JSON lines, events shuffled as an
unordered export is; a Google trace has no dependencies between instances, so the tasks'
start times carry them). A pure function of its arguments, except for the file writes.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesched.core.fleetspec import DEFAULT_PEAK_FILL, DEFAULT_TYPE, peak_cpu, presets
from edgesched.core.trace import TraceRow, write_trace
from edgesched.core.traceformats import ALIBABA_CLASS, Machine

#: Instances per 36 servers of the default sample (the issue's Alibaba-like hour).
INSTANCES_PER_36 = 30_000
#: The most of the target peak one task's instances may ask at once.
MAX_TASK_SHARE = 0.25
#: Borg priority of the Google writer's instances (best-effort batch tier).
GOOGLE_PRIORITY = 110


@dataclass(frozen=True, slots=True)
class SynthTask:
    """One task of a synthetic job: ``number`` (1-based within the job), the task numbers it
    needs, its instances, start and end (whole seconds) and Alibaba's plan_cpu (100 = 1
    core) and plan_mem (0-100 of the reference machine)."""

    job: str
    number: int
    deps: tuple[int, ...]
    instances: int
    start_s: int
    end_s: int
    plan_cpu: float
    plan_mem: float
    opaque: str = ""

    @property
    def name(self) -> str:
        """Its batch_task name: ``task_...`` for a lone task, else the DAG name."""
        if self.opaque:
            return self.opaque
        prefix = "MRJ"[self.number % 3]
        return prefix + "_".join(str(n) for n in (self.number, *self.deps))


def default_peak_cores(instances: int) -> float:
    """70% of the CPU of 36 x86 general servers per 30,000 instances (at least one server)."""
    servers = max(1, round(36 * instances / INSTANCES_PER_36))
    return DEFAULT_PEAK_FILL * servers * presets()[DEFAULT_TYPE].capacity.cpu


def synthetic_tasks(
    seed: int = 0,
    *,
    instances: int = INSTANCES_PER_36,
    hours: float = 1.0,
    peak_cores: float | None = None,
) -> list[SynthTask]:
    """About ``instances`` instances (exactly, unless fewer than one job's worth) of batch
    work arriving over ``hours``, sorted by start."""
    if instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances}")
    if not (math.isfinite(hours) and hours > 0):
        raise ValueError(f"hours must be a finite number > 0, got {hours}")
    target = default_peak_cores(instances) if peak_cores is None else peak_cores
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"peak_cores must be a finite number > 0, got {peak_cores}")
    rng = np.random.default_rng([seed, 2018])
    span = hours * 3600.0
    shapes: list[
        tuple[str, float, list[tuple[int, tuple[int, ...], int, float, float, float]]]
    ] = []
    total = 0
    job_no = 0
    while total < instances:
        job_no += 1
        # thinning: rate (1 + 0.3 sin) over the span, arrival uniform then accepted
        while True:
            at = float(rng.uniform(0.0, span))
            if rng.random() * 1.3 <= 1.0 + 0.3 * math.sin(2 * math.pi * at / span):
                break
        n_tasks = int(rng.choice([1, 2, 3, 4], p=[0.4, 0.3, 0.2, 0.1]))
        tasks = []
        for number in range(1, n_tasks + 1):
            deps: tuple[int, ...] = ()
            if number > 1:
                k = min(number - 1, int(rng.integers(1, 3)))
                deps = tuple(sorted(int(d) for d in rng.choice(number - 1, k, replace=False) + 1))
            count = min(int(rng.geometric(0.25)), instances - total)
            if count < 1:
                break
            total += count
            cpu = float(rng.choice([50.0, 100.0, 200.0, 400.0], p=[0.3, 0.4, 0.2, 0.1]))
            # one task's instances, all at once, at most a quarter of the target peak: else a
            # small trace's peak is that one task, and scaling durations cannot reach the
            # target (a 2,000-instance hour came out at 2% of its fleet, durations of 2 s)
            cap = max(1, int(MAX_TASK_SHARE * target / (cpu / 100)))
            total -= count - min(count, cap)
            count = min(count, cap)
            mem = round(float(rng.uniform(0.1, 2.0)), 2)
            duration = float(rng.lognormal(math.log(40.0), 1.0))
            tasks.append((number, deps, count, cpu, mem, duration))
        shapes.append((f"j_{job_no}", at, tasks))
    opaque = {
        job: "task_" + base64.b64encode(rng.bytes(12)).decode()
        for job, _, tasks in shapes
        if len(tasks) == 1
    }
    scale = 1.0
    out = _lay_out(shapes, scale, opaque)
    peak = _peak(out)
    for _ in range(6):  # durations scaled towards the target peak (not linear: DAGs, rounding)
        if peak <= 0:
            break
        scale *= target / peak
        out = _lay_out(shapes, scale, opaque)
        peak = _peak(out)
    for _ in range(100):  # and not above it (unless one moment's instances alone are)
        if peak <= target:
            break
        scale *= 0.99
        out = _lay_out(shapes, scale, opaque)
        peak = _peak(out)
    return sorted(out, key=lambda t: (t.start_s, t.job, t.number))


def _peak(tasks: Sequence[SynthTask]) -> float:
    return peak_cpu(
        [(t.start_s, t.end_s - t.start_s, t.plan_cpu / 100 * t.instances) for t in tasks]
    )


def _lay_out(
    shapes: Sequence[
        tuple[str, float, Sequence[tuple[int, tuple[int, ...], int, float, float, float]]]
    ],
    scale: float,
    opaque: dict[str, str],
) -> list[SynthTask]:
    out: list[SynthTask] = []
    for job, at, tasks in shapes:
        ends: dict[int, int] = {}
        for number, deps, count, cpu, mem, duration in tasks:
            start = max([1 + int(at), *(ends[d] for d in deps if d in ends)])
            end = start + max(1, round(duration * scale))
            ends[number] = end
            out.append(
                SynthTask(job, number, deps, count, start, end, cpu, mem, opaque.get(job, ""))
            )
    return out


def to_rows(tasks: Sequence[SynthTask], machine: Machine | None = None) -> list[TraceRow]:
    """The edgesched rows of ``tasks``: one per instance, as the Alibaba importer reads them."""
    machine = machine or Machine()
    names = {(t.job, t.number): t.name for t in tasks}
    rows: list[TraceRow] = []
    for t in tasks:
        row = TraceRow(
            arrival_s=float(t.start_s),
            duration_s=float(t.end_s - t.start_s),
            cpu=t.plan_cpu / 100.0,
            mem_gib=t.plan_mem / 100.0 * machine.mem_gib,
            cls=ALIBABA_CLASS,
            job=t.job,
            task=t.name.replace("/", "_"),
            deps=tuple(names[(t.job, d)] for d in t.deps),
        )
        rows.extend([row] * t.instances)
    return rows


def write_edgesched(tasks: Sequence[SynthTask], path: Path) -> Path:
    return write_trace(to_rows(tasks), path)


def format_alibaba(tasks: Sequence[SynthTask]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for t in tasks:
        w.writerow(
            (
                t.name,
                t.instances,
                t.job,
                1,
                "Terminated",
                t.start_s,
                t.end_s,
                t.plan_cpu,
                t.plan_mem,
            )
        )
    return out.getvalue()


def write_alibaba(tasks: Sequence[SynthTask], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_alibaba(tasks), encoding="utf-8")
    return path


GOOGLE_HEADER: tuple[str, ...] = (
    "time",
    "type",
    "collection_id",
    "scheduling_class",
    "missing_type",
    "collection_type",
    "priority",
    "alloc_collection_id",
    "instance_index",
    "machine_id",
    "alloc_instance_index",
    "resource_request.cpus",
    "resource_request.memory",
)


def google_events(
    tasks: Sequence[SynthTask], seed: int = 0, machine: Machine | None = None
) -> list[dict[str, object]]:
    """instance_events of ``tasks`` (SUBMIT, SCHEDULE and FINISH per instance; the request
    only on SUBMIT), shuffled."""
    machine = machine or Machine()
    events: list[dict[str, object]] = []
    index: dict[str, int] = {}
    for t in tasks:
        cid = int(t.job.removeprefix("j_")) + 10_000
        for _ in range(t.instances):
            i = index.get(t.job, 0)
            index[t.job] = i + 1
            base = {"collection_id": cid, "instance_index": i, "priority": GOOGLE_PRIORITY}
            request = {
                "cpus": t.plan_cpu / 100.0 / machine.cores,
                "memory": t.plan_mem / 100.0,
            }
            events.append(
                {"time": t.start_s * 1_000_000, "type": 0, **base, "resource_request": request}
            )
            events.append({"time": t.start_s * 1_000_000, "type": 3, **base, "machine_id": 1})
            events.append({"time": t.end_s * 1_000_000, "type": 6, **base, "machine_id": 1})
    order = np.random.default_rng([seed, 2019]).permutation(len(events))
    return [events[int(k)] for k in order]


def format_google(events: Sequence[dict[str, object]], jsonl: bool = False) -> str:
    out = io.StringIO()
    if jsonl:
        for e in events:
            # BigQuery's JSON export writes INT64 values as strings
            doc = {k: (str(v) if isinstance(v, int) else v) for k, v in e.items()}
            out.write(json.dumps(doc, separators=(",", ":")) + "\n")
        return out.getvalue()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(GOOGLE_HEADER)
    for e in events:
        req = e.get("resource_request")
        cpus = req["cpus"] if isinstance(req, dict) else ""
        mem = req["memory"] if isinstance(req, dict) else ""
        w.writerow(
            (e["time"], e["type"], e["collection_id"], 1, "", 0, e["priority"], 0,
             e["instance_index"], e.get("machine_id", ""), -1, cpus, mem)
        )  # fmt: skip
    return out.getvalue()


def write_google(
    tasks: Sequence[SynthTask], path: Path, *, jsonl: bool = False, seed: int = 0
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_google(google_events(tasks, seed), jsonl), encoding="utf-8")
    return path


def write_sample(path: Path, fmt: str, seed: int = 0, instances: int = INSTANCES_PER_36) -> Path:
    """A synthetic hour in ``fmt`` (``edgesched``, ``alibaba2018``, ``google2019``; Google as
    JSON lines when ``path`` ends in ``.jsonl``)."""
    tasks = synthetic_tasks(seed, instances=instances)
    if fmt == "edgesched":
        return write_edgesched(tasks, path)
    if fmt == "alibaba2018":
        return write_alibaba(tasks, path)
    if fmt == "google2019":
        return write_google(tasks, path, jsonl=path.suffix.lower() == ".jsonl", seed=seed)
    raise ValueError(f"unknown trace format {fmt!r}")
