"""Node qualification: the bring-up checks of a new server type, as a node profile.

``edgesched node qualify`` runs the article's bring-up evaluation on this machine and turns it
into numbers the scheduler can use:

1. **CPU throughput and stability.** A built-in probe always runs: one process per core
   (``subprocess`` of this interpreter) runs a fixed pure-Python integer workload (trial-division
   prime counting, the same kind of work as ``sysbench cpu``) for ``duration_s``, counting
   work units and the CPU time they took per interval. It reports ops/s per core (wall
   clock), ops per CPU-second, and the coefficient of variation (CV) of the per-interval
   ops per CPU-second across all cores as the stability figure; a CV above
   :data:`CPU_CV_LIMIT` or a crashed worker fails the check. Workers that got well under a
   full core (other load on the machine) are noted, not failed. When ``sysbench`` is
   installed, ``sysbench cpu --time=N --threads=T run`` runs as well (events/s and thread
   fairness).
2. **Memory bandwidth.** A single-thread numpy copy of a large array (256 MiB, capped at an
   eighth of available memory), best of several repeats, counted STREAM-style (bytes read
   plus bytes written).
3. **Last-level cache.** The size from sysfs (highest cache level of cpu0), and a built-in
   dependent-load sweep (16 interleaved pointer chains over a random cyclic permutation, one
   load per 64-byte line) over working sets of 32 KiB to 64 MiB. Jumps of at least
   :data:`KNEE_RATIO` in ns/load are reported as knees and matched against the sysfs levels;
   when no jump shows (numpy's per-call overhead can mask cache latency) it says so.
4. **Storage IOPS** in ``workdir``: ``fio`` (4 KiB randread, ``direct=1`` falling back to
   buffered, psync, :data:`STORAGE_QUEUE_DEPTH` jobs) when installed, else a built-in probe of
   random 4 KiB ``preadv`` reads from as many threads on a temp file (``O_DIRECT`` when the
   filesystem takes it, else buffered, which mostly measures the page cache and is labelled
   so). An fsync latency probe (4 KiB write + ``fsync``) always runs.
5. **perf_factor**: the built-in probe's ops/s per core, counted per CPU-second the workers
   actually ran (so other load on the machine does not skew it), divided by
   :data:`REFERENCE_OPS_PER_CPU_SECOND`; usable as :attr:`edgesched.core.model.Node.perf`.

Every check is bounded by ``duration_s`` (the cache sweep by ~2 s), temp files live in a
temp directory under ``workdir`` that is always removed, and worker processes are joined or
killed before :func:`qualify` returns. A check that cannot run becomes a problem entry in the
report, never an exception.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import mmap
import os
import platform
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Built-in CPU probe work per CPU-second (= ops/s of a core the probe has to itself) on the
#: reference machine: a 2-vCPU KVM guest, "Intel(R) Xeon(R) Processor" (L2 2 MiB, sysfs L3
#: 480 MiB), CPython 3.11.7, ``cpu_probe(3.0)`` with both cores loaded; median of 7 runs
#: (2180..2292) on 2026-11-30 while other work kept the load average at 1.6-1.9 (the workers
#: got 72-84% of a core: wall-clock rates fell 20-30%, per-CPU-second ones stayed within 5%).
#: Pure-Python work: only comparable under CPython 3.11.
REFERENCE_OPS_PER_CPU_SECOND = 2280.0
#: The CPU check fails when the CV of per-interval ops per CPU-second (all cores) exceeds this.
CPU_CV_LIMIT = 0.15
#: A latency rise of at least this factor from one working set to the next (and the one after)
#: counts as a cache knee.
KNEE_RATIO = 1.2
#: Parallel 4 KiB reads in flight in the storage probes (threads or fio jobs).
STORAGE_QUEUE_DEPTH = 4
#: Size of the storage probe file (shrunk when the filesystem has less room).
STORAGE_FILE_BYTES = 64 << 20
#: Largest array the memory bandwidth probe copies.
MEMORY_ARRAY_BYTES = 256 << 20

_PRIME_LIMIT = 2000  # one CPU work unit: count primes below this by trial division (~0.4 ms)
_BLOCK = 4096
_SWEEP_CHAINS = 16
_SWEEP_MIN_LOADS = 1 << 18
_SWEEP_BUDGET_S = 2.0
_SPAWN_TIMEOUT_S = 30.0
_CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class Measurement:
    """One measured figure and the tool that produced it (``builtin``, ``sysfs``, a tool)."""

    name: str
    value: float
    unit: str
    tool: str
    detail: str = ""

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ValueError(f"measurement {self.name}: value must be finite, got {self.value}")

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "tool": self.tool,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Measurement:
        value = data.get("value")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"measurement value must be a number, got {value!r}")
        return cls(
            name=_str_field(data, "name"),
            value=float(value),
            unit=_str_field(data, "unit"),
            tool=_str_field(data, "tool"),
            detail=_str_field(data, "detail", ""),
        )


@dataclass(frozen=True)
class QualificationReport:
    """The outcome of :func:`qualify`.

    ``passed`` is true when ``problems`` is empty. ``perf_factor`` is the built-in CPU probe's
    ops per CPU-second relative to :data:`REFERENCE_OPS_PER_CPU_SECOND` (1.0 when the probe
    could not run, with a problem saying so). ``notes`` are honest caveats that do not fail
    the node.
    """

    measurements: tuple[Measurement, ...]
    passed: bool
    problems: tuple[str, ...]
    perf_factor: float
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (math.isfinite(self.perf_factor) and self.perf_factor > 0):
            raise ValueError(f"perf_factor must be finite and > 0, got {self.perf_factor}")

    def value(self, name: str) -> float | None:
        """The value of the first measurement called ``name``, if any."""
        for m in self.measurements:
            if m.name == name:
                return m.value
        return None

    def profile(self) -> dict[str, float]:
        """What the scheduler uses: ``perf`` (Node.perf) and, when measured, ``iops_k``
        (Resources.iops_k), ``mem_gbps`` and ``llc_kib``."""
        out: dict[str, float] = {"perf": self.perf_factor}
        iops = self.value("storage_randread_iops")
        if iops is not None:
            out["iops_k"] = round(iops / 1000.0, 3)
        for key, name in (("mem_gbps", "mem_copy_bandwidth"), ("llc_kib", "llc_size")):
            v = self.value(name)
            if v is not None:
                out[key] = v
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "perf_factor": self.perf_factor,
            "problems": list(self.problems),
            "notes": list(self.notes),
            "measurements": [m.to_json() for m in self.measurements],
            "profile": self.profile(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> QualificationReport:
        """Inverse of :meth:`to_json` (``profile`` is derived and ignored)."""
        raw = data.get("measurements")
        if not isinstance(raw, list):
            raise ValueError("measurements must be a list")
        measurements: list[Measurement] = []
        for item in raw:
            if not isinstance(item, Mapping):
                raise ValueError(f"measurement must be an object, got {item!r}")
            measurements.append(Measurement.from_json(item))
        passed = data.get("passed")
        if not isinstance(passed, bool):
            raise ValueError(f"passed must be a boolean, got {passed!r}")
        perf = data.get("perf_factor")
        if not isinstance(perf, int | float) or isinstance(perf, bool):
            raise ValueError(f"perf_factor must be a number, got {perf!r}")
        return cls(
            measurements=tuple(measurements),
            passed=passed,
            problems=_str_list(data, "problems"),
            perf_factor=float(perf),
            notes=_str_list(data, "notes"),
        )


def _str_field(data: Mapping[str, object], key: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


def _str_list(data: Mapping[str, object], key: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} must be a list of strings, got {value!r}")
    return tuple(str(v) for v in value)


@dataclass(frozen=True)
class _Outcome:
    """What one check produced: figures, failures and caveats."""

    measurements: tuple[Measurement, ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------- CPU, built-in


def _work_unit() -> int:
    """One fixed unit of CPU work: count primes below ``_PRIME_LIMIT`` by trial division."""
    found = 0
    for c in range(3, _PRIME_LIMIT):
        t = math.isqrt(c)
        d = 2
        while d <= t:
            if c % d == 0:
                break
            d += 1
        else:
            found += 1
    return found


def _count_work(n: int, interval_s: float) -> tuple[list[int], list[int]]:
    """Run work units for ``n`` intervals of ``interval_s``; per interval, the units finished
    and the CPU time (ns) they took."""
    duration_s = n * interval_s
    counts = [0] * n
    cpu_ns = [0] * n
    t0 = time.perf_counter()
    c_prev = time.process_time_ns()
    while True:
        _work_unit()
        elapsed = time.perf_counter() - t0
        if elapsed >= duration_s:
            break
        c_now = time.process_time_ns()
        i = min(n - 1, int(elapsed / interval_s))
        counts[i] += 1
        cpu_ns[i] += c_now - c_prev
        c_prev = c_now
    return counts, cpu_ns


def _cpu_child() -> None:
    """Entry point of a CPU probe worker process (``python -c``; argv: intervals, interval
    seconds, crash flag). Says ``ready``, waits for ``go`` on stdin, prints its counts as one
    JSON line."""
    n, interval_s, crash = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "go":
        return
    if crash:
        os._exit(17)
    counts, cpu_ns = _count_work(n, interval_s)
    sys.stdout.write(json.dumps({"counts": counts, "cpu_ns": cpu_ns}) + "\n")
    sys.stdout.flush()


_CHILD_CODE = "from edgesched.edge.qualify import _cpu_child; _cpu_child()"


@dataclass(frozen=True)
class CpuProbeResult:
    """Built-in CPU probe outcome.

    ``ops_per_core`` is the wall-clock rate per worker (what a task sees on this machine as it
    is, other load included); ``ops_per_cpu_s`` is work per CPU-second of the workers (what a
    core does while it runs, robust to other processes sharing the cores). ``cv`` is the
    coefficient of variation of the per-interval ops per CPU-second (hardware stability:
    throttling, frequency changes); ``wall_cv`` that of the wall-clock rates (also moves with
    competing load). ``cpu_share`` is the CPU time the workers got over their wall time.
    """

    ops_per_core: float
    ops_per_cpu_s: float
    cv: float
    wall_cv: float
    cpu_share: float
    worker_rates: tuple[float, ...]
    intervals: int
    interval_s: float
    problems: tuple[str, ...]


def _cv(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


class _Worker:
    """One CPU probe child process and a thread reading its stdout lines into a queue."""

    def __init__(self, index: int, n: int, interval_s: float, crash: bool) -> None:
        self.index = index
        # -P: do not put the working directory on sys.path (a source checkout there would
        # shadow the installed package)
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-c", _CHILD_CODE, str(n), repr(interval_s), str(int(crash))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def line(self, deadline: float) -> str | None:
        """The next stdout line, or None at EOF or when ``deadline`` (monotonic) passes."""
        try:
            return self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None

    def go(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()

    def why(self) -> str:
        """The exit status of a worker that failed (waits up to 1 s for it to end)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(1.0)
        code = self.proc.poll()
        return f"exit code {code}" if code is not None else "still running"

    def stop(self) -> str:
        """Kill the process if still running, reap it, close the pipes; returns the last line
        of its stderr."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(5.0)
        tail = ""
        if self.proc.stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                lines = self.proc.stderr.read().strip().splitlines()
                tail = lines[-1] if lines else ""
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return tail


def cpu_probe(
    duration_s: float, threads: int | None = None, *, _crash_worker: int | None = None
) -> CpuProbeResult:
    """Run the built-in CPU probe: ``threads`` worker processes (default: usable CPUs) for
    ``duration_s``. The workers are always reaped (killed if need be) before returning.

    ``_crash_worker`` (tests only) makes that worker exit abnormally after the start signal.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    workers = threads if threads is not None else _usable_cpus()
    if workers < 1:
        raise ValueError(f"threads must be >= 1, got {workers}")
    n_intervals = max(2, min(20, int(duration_s / 0.05)))
    interval_s = duration_s / n_intervals
    pool: list[_Worker] = []
    problems: list[str] = []
    failed: list[_Worker] = []
    results: list[tuple[list[int], list[int]]] = []
    try:
        try:
            for i in range(workers):
                pool.append(_Worker(i, n_intervals, interval_s, i == _crash_worker))
        except OSError as exc:
            problems.append(f"cpu: cannot start worker {len(pool)}: {exc}")
            return CpuProbeResult(0.0, 0.0, 0.0, 0.0, 0.0, (), 0, interval_s, tuple(problems))
        deadline = time.monotonic() + _SPAWN_TIMEOUT_S
        for w in pool:
            if w.line(deadline) != "ready\n":
                failed.append(w)
                problems.append(f"cpu: worker {w.index} did not start ({w.why()})")
        if not failed:
            for w in pool:
                w.go()
            deadline = time.monotonic() + duration_s + 15.0
            for w in pool:
                parsed = _parse_counts(w.line(deadline), n_intervals)
                if parsed is None:
                    failed.append(w)
                    problems.append(f"cpu: worker {w.index} crashed or hung ({w.why()})")
                else:
                    results.append(parsed)
    finally:
        tails = {w.index: w.stop() for w in pool}
    problems = [
        p + (f": {tails[w.index]}" if tails.get(w.index) else "")
        for p, w in zip(problems, failed, strict=True)
    ]
    if failed or not results:
        return CpuProbeResult(0.0, 0.0, 0.0, 0.0, 0.0, (), 0, interval_s, tuple(problems))
    skip = 1 if n_intervals >= 3 else 0  # the first interval is warm-up
    wall_rates = [c / interval_s for counts, _ in results for c in counts[skip:]]
    # intervals where a worker ran for under a quarter of the time say little about the core
    cpu_rates = [
        c / (ns / 1e9)
        for counts, cpu in results
        for c, ns in zip(counts[skip:], cpu[skip:], strict=True)
        if c > 0 and ns >= 0.25 * interval_s * 1e9
    ]
    ops = sum(sum(counts[skip:]) for counts, _ in results)
    cpu_s = sum(sum(cpu[skip:]) for _, cpu in results) / 1e9
    wall_s = len(results) * (n_intervals - skip) * interval_s
    if ops <= 0 or cpu_s <= 0:
        problems.append("cpu: workers completed no work units")
        return CpuProbeResult(0.0, 0.0, 0.0, 0.0, 0.0, (), 0, interval_s, tuple(problems))
    return CpuProbeResult(
        ops_per_core=ops / wall_s,
        ops_per_cpu_s=ops / cpu_s,
        cv=_cv(cpu_rates),
        wall_cv=_cv(wall_rates),
        cpu_share=cpu_s / wall_s,
        worker_rates=tuple(sum(c[skip:]) / ((n_intervals - skip) * interval_s) for c, _ in results),
        intervals=n_intervals - skip,
        interval_s=interval_s,
        problems=(),
    )


def _parse_counts(line: str | None, n: int) -> tuple[list[int], list[int]] | None:
    if line is None:
        return None
    try:
        doc = json.loads(line)
        counts = [int(c) for c in doc["counts"]]
        cpu_ns = [int(c) for c in doc["cpu_ns"]]
    except (ValueError, KeyError, TypeError):
        return None
    return (counts, cpu_ns) if len(counts) == len(cpu_ns) == n else None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _check_cpu_builtin(duration_s: float, threads: int | None) -> tuple[_Outcome, float | None]:
    res = cpu_probe(duration_s, threads)
    if not res.worker_rates:
        return _Outcome(problems=res.problems or ("cpu: built-in probe produced nothing",)), None
    workers = len(res.worker_rates)
    spread = f"{min(res.worker_rates):.0f}..{max(res.worker_rates):.0f}"
    common = (
        f"{workers} processes x {duration_s:g} s, {res.intervals} intervals of "
        f"{res.interval_s * 1000:.0f} ms"
    )
    problems = list(res.problems)
    notes: list[str] = []
    if res.cv > CPU_CV_LIMIT:
        problems.append(
            f"cpu: unstable throughput per CPU-second, CV {res.cv:.3f} > {CPU_CV_LIMIT} "
            "(throttling or frequency changes?)"
        )
    if res.cpu_share < 0.9:
        notes.append(
            f"cpu: the probe's workers got only {res.cpu_share:.0%} of a core each (load "
            f"average {os.getloadavg()[0]:.2f}); other processes compete, so wall-clock "
            "figures understate the hardware; qualify an idle node"
        )
    ms = (
        Measurement(
            "cpu_ops_per_core",
            round(res.ops_per_core, 1),
            "ops/s",
            "builtin",
            f"wall-clock rate per process; op = primes < {_PRIME_LIMIT} by trial division; "
            f"{common}; per-process {spread}; CPU share {res.cpu_share:.0%}; "
            f"CPython {platform.python_version()}",
        ),
        Measurement(
            "cpu_ops_per_cpu_second",
            round(res.ops_per_cpu_s, 1),
            "ops/cpu-s",
            "builtin",
            f"work per CPU-second of the workers (basis of perf_factor); {common}",
        ),
        Measurement(
            "cpu_stability_cv",
            round(res.cv, 4),
            "ratio",
            "builtin",
            f"CV of per-interval ops per CPU-second over all processes (limit {CPU_CV_LIMIT}); "
            f"wall-clock CV {res.wall_cv:.3f}",
        ),
    )
    return _Outcome(ms, tuple(problems), tuple(notes)), res.ops_per_cpu_s


# --------------------------------------------------------------------------- CPU, sysbench


@dataclass(frozen=True)
class SysbenchCpuResult:
    """Parsed ``sysbench cpu run`` output."""

    version: str
    threads: int
    events_per_s: float
    total_events: int | None
    latency_avg_ms: float | None
    latency_p95_ms: float | None
    fairness_events_avg: float | None
    fairness_events_stddev: float | None

    @property
    def fairness_cv(self) -> float | None:
        """Stddev / mean of events per thread (None when sysbench did not print it)."""
        if not self.fairness_events_avg or self.fairness_events_stddev is None:
            return None
        return self.fairness_events_stddev / self.fairness_events_avg


def _search_float(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def parse_sysbench_cpu(text: str) -> SysbenchCpuResult:
    """Parse the text ``sysbench cpu ... run`` prints (1.0.x and 1.1.x formats).

    Raises :class:`ValueError` when there is no ``events per second`` figure.
    """
    eps = _search_float(r"events per second:\s*([0-9.]+)", text)
    if eps is None:
        raise ValueError("sysbench output has no 'events per second' line")
    version = re.search(r"^sysbench\s+(\S+)", text, re.MULTILINE)
    threads = re.search(r"Number of threads:\s*(\d+)", text)
    total = re.search(r"total number of events:\s*(\d+)", text)
    fair = re.search(r"events \(avg/stddev\):\s*([0-9.]+)/([0-9.]+)", text)
    return SysbenchCpuResult(
        version=version.group(1) if version else "unknown",
        threads=int(threads.group(1)) if threads else 1,
        events_per_s=eps,
        total_events=int(total.group(1)) if total else None,
        latency_avg_ms=_search_float(r"avg:\s*([0-9.]+)", text),
        latency_p95_ms=_search_float(r"95th percentile:\s*([0-9.]+)", text),
        fairness_events_avg=float(fair.group(1)) if fair else None,
        fairness_events_stddev=float(fair.group(2)) if fair else None,
    )


def _run_tool(argv: Sequence[str], timeout_s: float, cwd: Path | None = None) -> tuple[int, str]:
    """Run a tool in its own process group; on timeout kill the whole group.

    Returns (exit code, stdout + stderr); exit code -1 means it timed out and was killed.
    """
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -1, out + err
    finally:
        if proc.poll() is None:  # pragma: no cover - interrupted
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out + ("\n" + err if err else "")


def _check_cpu_sysbench(exe: str, duration_s: float, threads: int) -> _Outcome:
    seconds = max(1, round(duration_s))
    argv = [exe, "cpu", f"--time={seconds}", f"--threads={threads}", "run"]
    rc, out = _run_tool(argv, seconds + 15.0)
    if rc != 0:
        tail = out.strip().splitlines()[-1:] or ["no output"]
        return _Outcome(problems=(f"cpu: {' '.join(argv)} failed (exit {rc}): {tail[0]}",))
    try:
        res = parse_sysbench_cpu(out)
    except ValueError as exc:
        return _Outcome(problems=(f"cpu: cannot parse sysbench output: {exc}",))
    tool = f"sysbench {res.version}"
    ms = [
        Measurement(
            "sysbench_cpu_events_per_s",
            res.events_per_s,
            "events/s",
            tool,
            f"{' '.join(argv[1:])}: {res.threads} threads, "
            f"{res.events_per_s / max(res.threads, 1):.1f} events/s per thread, "
            f"latency avg {res.latency_avg_ms} ms p95 {res.latency_p95_ms} ms",
        )
    ]
    problems: list[str] = []
    cv = res.fairness_cv
    if cv is not None:
        ms.append(
            Measurement(
                "sysbench_fairness_cv",
                round(cv, 4),
                "ratio",
                tool,
                f"events per thread stddev/avg = {res.fairness_events_stddev}/"
                f"{res.fairness_events_avg} (limit {CPU_CV_LIMIT})",
            )
        )
        if cv > CPU_CV_LIMIT:
            problems.append(f"cpu: sysbench thread fairness CV {cv:.3f} > {CPU_CV_LIMIT}")
    return _Outcome(tuple(ms), tuple(problems))


# --------------------------------------------------------------------------- memory


def memory_bandwidth(duration_s: float, array_bytes: int = MEMORY_ARRAY_BYTES) -> float:
    """Best single-thread copy bandwidth in GB/s (1e9 B/s), counting read + write bytes.

    Copies an ``array_bytes`` float64 array repeatedly for up to ``duration_s`` (at least two
    timed copies, at most 10).
    """
    n = max(1, array_bytes // 8)
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault in the destination pages before timing
    best = math.inf
    deadline = time.perf_counter() + duration_s
    for i in range(10):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
        if i >= 1 and time.perf_counter() >= deadline:
            break
    return 2 * src.nbytes / best / 1e9


def _available_memory() -> int:
    """MemAvailable from /proc/meminfo, else free physical pages (bytes)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_memory(duration_s: float) -> _Outcome:
    available = _available_memory()
    size = min(MEMORY_ARRAY_BYTES, available // 8)
    if size < (16 << 20):
        return _Outcome(problems=(f"memory: only {available >> 20} MiB available to probe",))
    try:
        gbps = memory_bandwidth(duration_s, size)
    except MemoryError:
        return _Outcome(problems=(f"memory: cannot allocate 2 x {size >> 20} MiB",))
    return _Outcome(
        (
            Measurement(
                "mem_copy_bandwidth",
                round(gbps, 2),
                "GB/s",
                "builtin",
                f"numpy copy of {size >> 20} MiB float64, best of repeats, single thread; "
                "counts bytes read + written (STREAM Copy convention)",
            ),
        )
    )


# --------------------------------------------------------------------------- cache


@dataclass(frozen=True)
class CacheLevel:
    """One cache of cpu0 as sysfs describes it."""

    level: int
    type: str
    size_bytes: int


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if not m:
        raise ValueError(f"cannot parse cache size {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def read_cache_levels(root: Path = _CACHE_SYSFS) -> list[CacheLevel]:
    """The caches listed under ``root`` (``/sys/devices/system/cpu/cpu0/cache``); entries
    that are missing or unreadable are skipped, so an empty list means "not exposed"."""
    levels: list[CacheLevel] = []
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text().strip())
            ctype = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        levels.append(CacheLevel(level, ctype, size))
    return levels


def last_level_cache(levels: Sequence[CacheLevel]) -> CacheLevel | None:
    """The highest-level data or unified cache."""
    data = [c for c in levels if c.type in ("Unified", "Data")]
    return max(data, key=lambda c: (c.level, c.size_bytes)) if data else None


def _fmt_kib(n_bytes: int) -> str:
    kib = n_bytes >> 10
    return f"{kib >> 10} MiB" if kib >= 1024 and kib % 1024 == 0 else f"{kib} KiB"


def _check_cache_sysfs(root: Path = _CACHE_SYSFS) -> tuple[_Outcome, list[CacheLevel]]:
    levels = read_cache_levels(root)
    llc = last_level_cache(levels)
    if llc is None:
        return _Outcome(notes=(f"cache: {root} does not describe the caches",)), levels
    listing = ", ".join(
        f"L{c.level}{c.type[0].lower() if c.type != 'Unified' else ''} {_fmt_kib(c.size_bytes)}"
        for c in levels
    )
    m = Measurement(
        "llc_size",
        float(llc.size_bytes >> 10),
        "KiB",
        "sysfs",
        f"L{llc.level} {llc.type.lower()} {_fmt_kib(llc.size_bytes)} per {root}; all: {listing}",
    )
    return _Outcome((m,)), levels


@dataclass(frozen=True)
class SweepPoint:
    working_set_bytes: int
    ns_per_load: float


def cache_sweep(
    min_bytes: int = 32 << 10, max_bytes: int = 64 << 20, budget_s: float = _SWEEP_BUDGET_S
) -> list[SweepPoint]:
    """Dependent-load latency over working sets ``min_bytes`` .. ``max_bytes`` (doubling).

    Each working set is an int64 array with one pointer per 64-byte line, linked into one
    random cycle; :data:`_SWEEP_CHAINS` chains walk it interleaved (``p = arr[p]``), which
    amortises numpy's per-call overhead. Stops early (shorter curve) when ``budget_s`` runs
    out.
    """
    rng = np.random.default_rng(20261130)
    points: list[SweepPoint] = []
    deadline = time.perf_counter() + budget_s
    size = min_bytes
    while size <= max_bytes and time.perf_counter() < deadline:
        lines = max(2, size // 64)
        arr = np.zeros(lines * 8, dtype=np.int64)
        order = rng.permutation(lines)
        arr[order * 8] = np.roll(order, -1) * 8
        chains = min(_SWEEP_CHAINS, lines)
        starts = order[:: max(1, lines // chains)][:chains] * 8
        steps = max(2 * lines // chains, _SWEEP_MIN_LOADS // chains)
        best = math.inf
        for _ in range(3):
            p = starts.copy()
            t = time.perf_counter()
            for _ in range(steps):
                p = arr[p]
            best = min(best, (time.perf_counter() - t) / (steps * chains))
        points.append(SweepPoint(size, best * 1e9))
        size *= 2
    return points


def find_knees(
    points: Sequence[SweepPoint], ratio: float = KNEE_RATIO
) -> list[tuple[SweepPoint, SweepPoint]]:
    """Neighbouring sweep points ``(a, b)`` where latency rises by at least ``ratio`` and
    stays up: the point after ``b`` (when there is one) is also ``ratio`` above ``a``, so a
    one-off noisy sample is not a knee."""
    knees = []
    for i in range(len(points) - 1):
        a, b = points[i], points[i + 1]
        after = points[i + 2] if i + 2 < len(points) else b
        limit = ratio * a.ns_per_load
        if b.ns_per_load >= limit and after.ns_per_load >= limit:
            knees.append((a, b))
    return knees


def _check_cache_sweep(levels: Sequence[CacheLevel], duration_s: float) -> _Outcome:
    points = cache_sweep(budget_s=min(_SWEEP_BUDGET_S, max(duration_s, 0.5)))
    if len(points) < 2:
        return _Outcome(notes=("cache sweep: out of time before two working sets were measured",))
    curve = ", ".join(f"{_fmt_kib(p.working_set_bytes)}:{p.ns_per_load:.1f}" for p in points)
    steps = [b.ns_per_load / a.ns_per_load for a, b in itertools.pairwise(points)]
    top = max(steps)
    knees = find_knees(points)
    span = f"{_fmt_kib(points[0].working_set_bytes)}..{_fmt_kib(points[-1].working_set_bytes)}"
    ms = [
        Measurement(
            "cache_sweep_max_step",
            round(top, 3),
            "ratio",
            "builtin",
            f"largest latency rise between neighbouring working sets; ns/load {curve}",
        )
    ]
    notes: list[str] = []
    if not knees:
        notes.append(
            f"cache sweep: no knee visible over {span} (largest step x{top:.2f} < x{KNEE_RATIO}); "
            "numpy's per-call overhead may mask cache latency here"
        )
        return _Outcome(tuple(ms), notes=tuple(notes))
    described = []
    for a, b in knees:
        lo, hi = a.working_set_bytes, b.working_set_bytes
        match = [c for c in levels if c.type != "Instruction" and lo < c.size_bytes <= hi]
        what = (
            "matches " + ", ".join(f"L{c.level} {_fmt_kib(c.size_bytes)}" for c in match)
            if match
            else "no sysfs cache level in this range (TLB reach, or the cache share this "
            "machine really gets)"
        )
        described.append(
            f"{_fmt_kib(lo)}->{_fmt_kib(hi)} x{b.ns_per_load / a.ns_per_load:.2f} ({what})"
        )
    last = knees[-1][0]
    ms.append(
        Measurement(
            "cache_sweep_knee",
            float(last.working_set_bytes >> 10),
            "KiB",
            "builtin",
            "largest working set before the last latency jump; jumps: " + "; ".join(described),
        )
    )
    llc = last_level_cache(levels)
    if llc is not None and llc.size_bytes > points[-1].working_set_bytes:
        notes.append(
            f"cache sweep: sysfs LLC {_fmt_kib(llc.size_bytes)} is beyond the sweep's "
            f"{_fmt_kib(points[-1].working_set_bytes)}, so its knee cannot show here"
        )
    return _Outcome(tuple(ms), notes=tuple(notes))


# --------------------------------------------------------------------------- storage, fio


@dataclass(frozen=True)
class FioResult:
    """Parsed ``fio --output-format=json`` figures for one direction (summed over jobs)."""

    version: str
    iops: float
    bw_kib_s: float
    clat_mean_us: float | None
    jobs: int


def parse_fio_json(text: str, direction: str = "read") -> FioResult:
    """Parse fio's JSON output (tolerating text before/after the JSON document, as fio prints
    with ``--output-format=json,normal``). IOPS and bandwidth are summed over jobs; the
    completion latency is the I/O-weighted mean (None when fio recorded none, e.g. with
    ``gtod_reduce``). Raises :class:`ValueError` on missing data or a job error.
    """
    m = re.search(r"^\{", text, re.MULTILINE)
    if m is None:
        raise ValueError("no JSON document in fio output")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text, m.start())
    except json.JSONDecodeError as exc:
        raise ValueError(f"fio JSON does not parse: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list) or not doc["jobs"]:
        raise ValueError("fio JSON has no jobs")
    iops = bw = lat_sum = 0.0
    lat_n = 0
    for job in doc["jobs"]:
        if not isinstance(job, dict) or not isinstance(job.get(direction), dict):
            raise ValueError(f"fio job without {direction!r} figures")
        if job.get("error", 0):
            raise ValueError(f"fio job {job.get('jobname')!r} failed with error {job['error']}")
        d = job[direction]
        iops += float(d.get("iops", 0.0))
        bw += float(d.get("bw", 0.0))
        clat = d.get("clat_ns")
        if isinstance(clat, dict) and clat.get("N"):
            lat_sum += float(clat["mean"]) * int(clat["N"])
            lat_n += int(clat["N"])
    version = str(doc.get("fio version", "fio-unknown")).removeprefix("fio-")
    return FioResult(
        version=version,
        iops=iops,
        bw_kib_s=bw,
        clat_mean_us=lat_sum / lat_n / 1000.0 if lat_n else None,
        jobs=len(doc["jobs"]),
    )


def _fio_argv(exe: str, path: Path, size: int, duration_s: float, direct: bool) -> list[str]:
    return [
        exe,
        "--name=edgesched-qualify",
        "--filename=" + str(path).replace(":", "\\:"),  # fio splits file lists on ':'
        f"--size={size}",
        "--rw=randread",
        "--bs=4k",
        f"--direct={int(direct)}",
        "--ioengine=psync",
        f"--numjobs={STORAGE_QUEUE_DEPTH}",
        "--group_reporting",
        "--time_based",
        f"--runtime={max(1, int(duration_s * 1000))}ms",
        "--output-format=json",
    ]


def _check_storage_fio(exe: str, tmp: Path, size: int, duration_s: float) -> _Outcome:
    path = tmp / "fio.dat"
    notes: list[str] = []
    for direct in (True, False):
        argv = _fio_argv(exe, path, size, duration_s, direct)
        rc, out = _run_tool(argv, duration_s + 60.0, cwd=tmp)
        if rc == 0:
            break
        if direct:
            notes.append("storage: fio --direct=1 failed, retried buffered")
    else:
        tail = out.strip().splitlines()[-1:] or ["no output"]
        return _Outcome(problems=(f"storage: fio failed (exit {rc}): {tail[0]}",))
    try:
        res = parse_fio_json(out)
    except ValueError as exc:
        return _Outcome(problems=(f"storage: cannot parse fio output: {exc}",))
    mode = "direct=1" if direct else "buffered (page cache; not device IOPS)"
    lat = f"{res.clat_mean_us:.1f} us" if res.clat_mean_us is not None else "n/a"
    tool = f"fio {res.version}"
    ms = [
        Measurement(
            "storage_randread_iops",
            round(res.iops, 1),
            "IOPS",
            tool,
            f"randread 4k psync, {STORAGE_QUEUE_DEPTH} jobs, {mode}, {size >> 20} MiB file, "
            f"{duration_s:g} s; clat mean {lat}, {res.bw_kib_s:.0f} KiB/s",
        )
    ]
    if res.clat_mean_us is not None:
        ms.append(
            Measurement(
                "storage_randread_latency",
                round(res.clat_mean_us, 2),
                "us",
                tool,
                "mean completion latency per read",
            )
        )
    return _Outcome(tuple(ms), notes=tuple(notes))


# --------------------------------------------------------------------------- storage, built-in


@dataclass(frozen=True)
class StorageProbeResult:
    iops: float
    lat_mean_us: float
    lat_p99_us: float
    direct: bool
    reads: int


def _write_probe_file(path: Path, size: int) -> None:
    chunk = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < size:
            written += os.write(fd, chunk[: min(len(chunk), size - written)])
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _open_direct(path: Path) -> int | None:
    """An O_DIRECT read descriptor when the filesystem honours it, else None."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None
    buf = mmap.mmap(-1, _BLOCK)
    try:
        os.preadv(fd, [buf], 0)
    except OSError:
        os.close(fd)
        return None
    finally:
        buf.close()
    return fd


def storage_probe(path: Path, size: int, duration_s: float) -> StorageProbeResult:
    """Random 4 KiB reads of the existing file ``path`` (``size`` bytes) from
    :data:`STORAGE_QUEUE_DEPTH` threads for ``duration_s``; O_DIRECT when possible."""
    fd = _open_direct(path)
    direct = fd is not None
    if fd is None:
        fd = os.open(path, os.O_RDONLY)
    blocks = max(1, size // _BLOCK)
    lats: list[list[int]] = [[] for _ in range(STORAGE_QUEUE_DEPTH)]
    errors: list[BaseException] = []
    stop = time.perf_counter() + duration_s

    def reader(i: int) -> None:
        rnd = random.Random(i)
        buf = mmap.mmap(-1, _BLOCK)
        out = lats[i]
        try:
            while time.perf_counter() < stop:
                off = rnd.randrange(blocks) * _BLOCK
                t = time.perf_counter_ns()
                os.preadv(fd, [buf], off)
                out.append(time.perf_counter_ns() - t)
        except OSError as exc:
            errors.append(exc)
        finally:
            buf.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=reader, args=(i,)) for i in range(STORAGE_QUEUE_DEPTH)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    all_lats = sorted(x for lst in lats for x in lst)
    if not all_lats:
        raise OSError("no read completed")
    p99 = all_lats[min(len(all_lats) - 1, int(0.99 * len(all_lats)))]
    return StorageProbeResult(
        iops=len(all_lats) / elapsed,
        lat_mean_us=statistics.fmean(all_lats) / 1000.0,
        lat_p99_us=p99 / 1000.0,
        direct=direct,
        reads=len(all_lats),
    )


def fsync_latency(path: Path, duration_s: float) -> tuple[float, float, int]:
    """Median and p99 latency (ms) of a 4 KiB ``pwrite`` + ``fsync`` on ``path`` for
    ``duration_s`` (at least 3 samples, at most 2000)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    data = os.urandom(_BLOCK)
    samples: list[float] = []
    stop = time.perf_counter() + duration_s
    try:
        while len(samples) < 2000 and (len(samples) < 3 or time.perf_counter() < stop):
            t = time.perf_counter()
            os.pwrite(fd, data, (len(samples) % 16) * _BLOCK)
            os.fsync(fd)
            samples.append((time.perf_counter() - t) * 1000.0)
    finally:
        os.close(fd)
    samples.sort()
    return (
        statistics.median(samples),
        samples[min(len(samples) - 1, int(0.99 * len(samples)))],
        len(samples),
    )


def _check_storage(workdir: Path, duration_s: float, fio: str | None) -> _Outcome:
    if not workdir.is_dir():
        what = "does not exist" if not workdir.exists() else "is not a directory"
        return _Outcome(problems=(f"storage: workdir {workdir} {what}; storage not measured",))
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".edgesched-qualify-", dir=workdir))
    except OSError as exc:
        return _Outcome(
            problems=(
                f"storage: workdir {workdir} is not writable ({exc.strerror}); "
                "storage not measured",
            )
        )
    try:
        return _storage_in(tmp, workdir, duration_s, fio)
    except OSError as exc:
        return _Outcome(problems=(f"storage: I/O error in {workdir}: {exc}",))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _storage_in(tmp: Path, workdir: Path, duration_s: float, fio: str | None) -> _Outcome:
    free = shutil.disk_usage(tmp).free
    size = min(STORAGE_FILE_BYTES, (free // 4) // (1 << 20) * (1 << 20))
    if size < (4 << 20):
        return _Outcome(problems=(f"storage: only {free >> 20} MiB free in {workdir}",))
    read_s = duration_s * 0.75
    ms: list[Measurement] = []
    problems: list[str] = []
    notes: list[str] = []
    if fio is not None:
        out = _check_storage_fio(fio, tmp, size, read_s)
        ms += out.measurements
        problems += out.problems
        notes += out.notes
        (tmp / "fio.dat").unlink(missing_ok=True)
    if not ms:  # no fio, or fio produced nothing: the built-in probe
        if fio is not None:
            notes.append("storage: fio gave no figure; built-in probe used instead")
        data = tmp / "randread.dat"
        _write_probe_file(data, size)
        res = storage_probe(data, size, read_s)
        data.unlink()
        if res.direct:
            mode = "O_DIRECT (a hypervisor's host cache may still serve reads)"
        else:
            mode = "buffered: O_DIRECT not supported here, reads mostly hit the page cache"
            notes.append("storage: O_DIRECT unsupported in workdir; IOPS is page-cache speed")
        ms += [
            Measurement(
                "storage_randread_iops",
                round(res.iops, 1),
                "IOPS",
                "builtin",
                f"random 4 KiB preadv, {STORAGE_QUEUE_DEPTH} threads, {mode}, "
                f"{size >> 20} MiB file, {read_s:g} s, {res.reads} reads",
            ),
            Measurement(
                "storage_randread_latency",
                round(res.lat_mean_us, 2),
                "us",
                "builtin",
                f"mean per read; p99 {res.lat_p99_us:.1f} us",
            ),
        ]
    med, p99, n = fsync_latency(tmp / "fsync.dat", duration_s * 0.25)
    ms.append(
        Measurement(
            "storage_fsync_latency",
            round(med, 3),
            "ms",
            "builtin",
            f"median of {n} x (4 KiB pwrite + fsync); p99 {p99:.3f} ms",
        )
    )
    return _Outcome(tuple(ms), tuple(problems), tuple(notes))


# --------------------------------------------------------------------------- orchestration


def qualify(
    workdir: Path,
    *,
    duration_s: float = 3.0,
    threads: int | None = None,
    use_tools: bool = True,
    progress: Callable[[str], None] | None = None,
) -> QualificationReport:
    """Run the bring-up checks on this machine and return the node's qualification report.

    ``workdir`` is where storage is measured (a temp directory is created there and removed);
    ``threads`` defaults to the usable CPUs; ``use_tools=False`` skips sysbench and fio even
    when installed. With the defaults the run takes about 10 s without the tools and about
    15 s with them.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    workers = threads if threads is not None else _usable_cpus()
    if workers < 1:
        raise ValueError(f"threads must be >= 1, got {workers}")
    say = progress or (lambda _msg: None)
    sysbench = shutil.which("sysbench") if use_tools else None
    fio = shutil.which("fio") if use_tools else None
    outcomes: list[_Outcome] = []
    if use_tools:
        missing = [name for name, exe in (("sysbench", sysbench), ("fio", fio)) if exe is None]
        if missing:
            outcomes.append(
                _Outcome(notes=(f"{' and '.join(missing)} not installed; built-in probes used",))
            )

    say(f"cpu: built-in probe, {workers} processes for {duration_s:g} s")
    cpu_outcome, ops_per_cpu_s = _check_cpu_builtin(duration_s, workers)
    outcomes.append(cpu_outcome)
    if sysbench is not None:
        say(f"cpu: sysbench, {workers} threads")
        outcomes.append(_check_cpu_sysbench(sysbench, duration_s, workers))

    say("memory: copy bandwidth")
    outcomes.append(_check_memory(duration_s))

    say("cache: sysfs and latency sweep")
    sysfs_outcome, levels = _check_cache_sysfs()
    outcomes.append(sysfs_outcome)
    outcomes.append(_check_cache_sweep(levels, duration_s))

    say(f"storage: random 4 KiB reads in {workdir}" + (" with fio" if fio else ""))
    outcomes.append(_check_storage(Path(workdir), duration_s, fio))

    if ops_per_cpu_s is not None and ops_per_cpu_s > 0:
        perf = round(ops_per_cpu_s / REFERENCE_OPS_PER_CPU_SECOND, 3)
    else:
        perf = 1.0
    problems = tuple(p for o in outcomes for p in o.problems)
    report = QualificationReport(
        measurements=tuple(m for o in outcomes for m in o.measurements),
        passed=not problems,
        problems=problems,
        perf_factor=perf,
        notes=tuple(n for o in outcomes for n in o.notes),
    )
    say("done: " + ("passed" if report.passed else f"{len(problems)} problem(s)"))
    return report


def render_text(report: QualificationReport) -> str:
    """A plain-text table of the report for the command line."""
    lines = [f"{'check':28} {'value':>12} {'unit':8} {'tool':18} detail"]
    for m in report.measurements:
        lines.append(f"{m.name:28} {m.value:>12g} {m.unit:8} {m.tool:18} {m.detail}")
    lines.append("")
    lines.append(f"perf_factor: {report.perf_factor:g} (1.0 = reference machine)")
    lines.extend(f"note: {n}" for n in report.notes)
    lines.extend(f"PROBLEM: {p}" for p in report.problems)
    lines.append("PASSED" if report.passed else "FAILED")
    return "\n".join(lines)
