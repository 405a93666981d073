"""A small queueing model of the campus's AI-inference work on whole against sliced accelerators.

Not the campus simulator (:mod:`edgesched.core.simulator`): one shared FCFS queue in front of
``devices`` accelerators, fed by the campus's face-recognition class (the inference workload:
its arrival curve, :func:`~edgesched.core.campus.arrival_rate_curve`, and its lognormal
durations), over one day from midnight. Deterministic for a seed.

The latency model, explicitly:

* A job's *duration* ``S`` (drawn from the class) is how long it holds a unit when it gets
  at least its *appetite* ``c`` of a device: the share of one device's compute it can use
  (small-batch inference keeps a fraction of an A100 busy; ``c = 1`` a job that saturates it).
* Whole devices: a job holds a whole device and runs in ``S`` (it cannot use more than ``c``,
  the rest of the device idles).
* Sliced devices (``slices`` per device, hard partitions as MIG or SR-IOV give): a job holds
  one slice, ``f = 1 / slices`` of the device, and runs at ``min(1, f / c)`` of its speed, so
  in ``S * max(1, c / f)``. Time-slicing without partitions is kinder when a GPU is not full
  (one job alone gets it all); this model is the partitioned, pessimistic case.
* Latency = wait in the queue + run time. Device *compute used* = the work done (``c * S`` per
  job, device-seconds) over the devices' time; *held* = the share of units allocated.

Pure functions and plain dataclasses; numpy for the draws.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from edgesched.core.campus import (
    BIN_S,
    BINS_PER_DAY,
    WorkloadClass,
    arrival_rate_curve,
    campus_fleet,
    workload_classes,
)

#: The campus class that is the AI-inference workload.
INFERENCE_CLASS = "face-recognition"


@dataclass(frozen=True, slots=True)
class Jobs:
    """One day's inference jobs: arrival times (s, sorted) and durations (s)."""

    arrivals: tuple[float, ...]
    durations: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class QueueResult:
    """What one configuration gave: latency (wait + run) mean and percentiles (s), the mean
    wait, the share of unit-time held and of device compute used, and the peak of jobs
    running at once."""

    jobs: int
    mean_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    mean_wait_s: float
    held: float
    used: float
    peak_running: int


def inference_jobs(seed: int = 1, scale: float = 1.0) -> Jobs:
    """A day of the campus's inference jobs (its fleet at ``scale``): Poisson arrivals per
    5-minute bin at the class's rate, uniform within the bin, lognormal durations."""
    fleet_cpu = sum(n.capacity.cpu for n in campus_fleet(scale))
    wc = workload_classes(fleet_cpu)[INFERENCE_CLASS]
    return _jobs(wc, np.random.default_rng(seed))


def _jobs(wc: WorkloadClass, rng: np.random.Generator) -> Jobs:
    rates = np.asarray(arrival_rate_curve(wc), dtype=np.float64)
    counts = rng.poisson(rates * BIN_S)
    starts = np.repeat(np.arange(BINS_PER_DAY, dtype=np.float64) * BIN_S, counts)
    arrivals = np.sort(starts + rng.uniform(0.0, BIN_S, size=starts.size))
    durations = rng.lognormal(math.log(wc.duration_median_s), wc.duration_sigma, arrivals.size)
    return Jobs(tuple(arrivals.tolist()), tuple(durations.tolist()))


def inference_devices(scale: float = 1.0) -> int:
    """The accelerators inference gets in the campus: the fleet's, less what AI training
    keeps busy on average (its mean concurrent tasks times its mean devices per task)."""
    fleet = campus_fleet(scale)
    total = sum(n.capacity.accel for n in fleet)
    wc = workload_classes(sum(n.capacity.cpu for n in fleet))["ai-training"]
    rates = np.asarray(arrival_rate_curve(wc), dtype=np.float64)
    per_task = float(np.average(wc.accel_choices, weights=wc.accel_weights))
    busy = float(rates.mean()) * wc.mean_duration_s * per_task
    return max(1, total - round(busy))


def run_queue(jobs: Jobs, devices: int, slices: int, appetite: float) -> QueueResult:
    """FCFS over ``devices * slices`` units (``slices = 1``: whole devices) under the
    module's latency model, a job of appetite ``appetite`` (share of one device)."""
    if devices < 1 or slices < 1:
        raise ValueError("devices and slices must be >= 1")
    if not 0 < appetite <= 1:
        raise ValueError("appetite must be in (0, 1]")
    units = devices * slices
    share = 1.0 / slices
    stretch = max(1.0, appetite / share)  # run time on a unit over the duration
    free_at = [0.0] * units  # a heap of when each unit is next free
    heapq.heapify(free_at)
    latencies = np.empty(len(jobs.arrivals), dtype=np.float64)
    waits = np.empty(len(jobs.arrivals), dtype=np.float64)
    ends: list[float] = []  # a heap of the running jobs' ends (for the peak)
    peak = 0
    held = 0.0
    end_all = 0.0
    for i, (arrival, duration) in enumerate(zip(jobs.arrivals, jobs.durations, strict=True)):
        start = max(arrival, heapq.heappop(free_at))
        run = duration * stretch
        end = start + run
        heapq.heappush(free_at, end)
        while ends and ends[0] <= start:
            heapq.heappop(ends)
        heapq.heappush(ends, end)
        peak = max(peak, len(ends))
        waits[i] = start - arrival
        latencies[i] = end - arrival
        held += run * share
        end_all = max(end_all, end)
    horizon = max(end_all, BINS_PER_DAY * BIN_S)
    work = appetite * float(np.sum(jobs.durations))
    n = len(jobs.arrivals)
    if n == 0:
        return QueueResult(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99]).tolist()
    return QueueResult(
        jobs=n,
        mean_s=float(latencies.mean()),
        p50_s=p50,
        p95_s=p95,
        p99_s=p99,
        mean_wait_s=float(waits.mean()),
        held=held / (devices * horizon),
        used=work / (devices * horizon),
        peak_running=peak,
    )
