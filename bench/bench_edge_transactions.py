"""SQLite transactions and fsyncs per task of a real edge engine, submission to running.

Runs an :class:`~edgesched.edge.engine.EdgeEngine` in-process (offline: its MQTT port is
closed, the session just retries; no HTTP API) on a fresh state directory, submits a batch of
N tasks at once (``EdgeEngine.submit``, concurrently) and waits until every one is committed
``running`` in SQLite. Each task is ``sh -c 'date +%s.%N > <file>; exec sleep 120'`` (cpu and
memory small enough for all N to fit on this machine).

What is counted, in the window from just before the first submit to the moment the last task
reads ``running`` in the store:

* **commits**: every ``COMMIT`` statement the store's SQLite connection starts (the store's
  statement trace, :meth:`~edgesched.sync.store.Store.trace`, set once the engine is ready, so
  whatever path a write takes through :class:`~edgesched.sync.store.Store` is seen);
  ``BEGIN`` too, as a cross-check;
* **fsyncs**: the child running the engine runs under
  ``strace -f --seccomp-bpf -y -ttt -e trace=fsync,fdatasync`` (only those two system calls
  stop the tracee, so the overhead is small) and the ``fsync``/``fdatasync`` calls whose
  timestamps fall in the window are counted, per file (the WAL, the database, others). SQLite
  in WAL mode with ``synchronous=FULL`` syncs the WAL once per commit, plus the WAL and the
  database at each checkpoint. Without a working strace this column says ``n/a``.
* **latency**: in a second child with no strace, per task the time from just before its
  ``submit`` to the timestamp its process writes (p50, p99); baseline in the same child, the
  same command started N times with :class:`subprocess.Popen` and timed the same way. The
  ratios engine / plain are printed. ``ack`` is the time ``submit`` took to return.

The sample loop runs with ``sample_s = 3600`` (one telemetry sample at start, none in the
window) so the counts are the task path's own. Every task process is killed at the end.

    .venv/bin/python bench/bench_edge_transactions.py [--batches 1,20,200] [--cycle-s 1.0]

Figures (a 2-core development machine shared with other work; BEFORE is 73aa50b, where each
task row, each decision batch and each CRDT update was its own transaction; AFTER is one
transaction per state change plus group commit of queued submissions; run back to back)::

    batch  commits/task  fsyncs/task  p50 ms  p99 ms  x plain p50  x plain p99  ack p50 ms
    BEFORE
        1       10.00        10.00       25.4    25.4        10          10         3.4
       20        7.10         6.75      210.8   342.7        36          34        23.3
      200        7.01         6.92     3807.0  6602.8       455         204       147.3
    AFTER
        1        3.00         3.00       23.3    23.3         8           8         2.1
       20        0.20         0.15       97.0   150.5        18          13         6.6
      200        0.02         0.02     1340.1  3170.1       288         115        17.6

(An earlier BEFORE run counted 9 commits for the lone task.) What is left at 200 is the
executor: it spawns the 200 processes one after the other, about 11 ms each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_edge_latency import stamper, wait_stamp  # the same clock stamp and wait

MARK = "EDGESCHED_BENCH_TX"  # in every task's environment, to find leftovers


# ---------------------------------------------------------------------- the child: one batch


def _count_commits() -> tuple[dict[str, list[float]], Callable[[str], None]]:
    """The wall time of every BEGIN and COMMIT the store starts, and the statement trace
    (for ``Store.trace``) that records them."""
    seen: dict[str, list[float]] = {"BEGIN": [], "COMMIT": []}

    def trace(sql: str) -> None:  # in the store's database thread
        word = sql.lstrip()[:6].upper()
        for key in seen:
            if word.startswith(key):
                seen[key].append(time.time())

    return seen, trace


async def _batch(tmp: Path, n: int, cycle_s: float, stamp: str) -> dict[str, Any]:
    from edgesched.config import parse_config
    from edgesched.core.task import TaskSpec, TaskState
    from edgesched.edge.engine import EdgeEngine
    from edgesched.edge.executor import kill_leftovers
    from edgesched.ports import free_port

    seen, trace = _count_commits()
    state = tmp / "state"
    config = parse_config(
        {
            "edge": {
                "node_id": "gw-bench",
                "state_dir": str(state),
                "api_port": 0,
                "cycle_s": cycle_s,
                "sample_s": 3600.0,
                "stop_grace_s": 1.0,
                "mqtt": {"port": free_port(), "reconnect_max_s": 5.0},
            }
        }
    )
    engine = EdgeEngine(config)
    runner = asyncio.create_task(engine.run())
    (tmp / "e").mkdir()
    (tmp / "b").mkdir()
    share = 0.5 / n  # all n fit with room to spare, on any machine with a core
    specs = [
        TaskSpec(
            id=f"tx-{i:04d}",
            command=("sh", "-c", stamp.format(tmp / "e" / f"tx-{i:04d}") + "; exec sleep 120"),
            cpu=share,
            mem_gib=share,
            env={MARK: str(tmp)},
        )
        for i in range(n)
    ]
    t0: dict[str, float] = {}
    acked: dict[str, float] = {}
    try:
        await asyncio.wait_for(engine.wait_ready(), 60)
        await engine.store.trace(trace)
        # startup writes (identity, registration) and the first cycles' (the idle power
        # report) settle and are logged, so the window counts the task path's commits only
        await asyncio.sleep(max(1.0, 2.5 * cycle_s))
        assert engine._journal is not None
        await engine._journal.flushed()
        start = time.time()

        async def submit(spec: TaskSpec) -> None:
            t0[spec.id] = time.time()
            await engine.submit(spec)
            acked[spec.id] = time.time() - t0[spec.id]

        await asyncio.gather(*(submit(s) for s in specs))
        deadline = time.monotonic() + 120
        while True:
            running = await engine.store.list_tasks([TaskState.RUNNING])
            if len(running) >= n:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(running)}/{n} running after 120 s")
            await asyncio.sleep(0.01)
        end = time.time()
        engine_lat = [wait_stamp(tmp / "e" / s.id, timeout=60.0) - t0[s.id] for s in specs]
        commits = [t for t in seen["COMMIT"] if start <= t <= end]
        begins = [t for t in seen["BEGIN"] if start <= t <= end]
    finally:
        engine.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(runner, 30)
        kill_leftovers([state / "run"])
    plain = _plain(tmp, n, stamp)
    return {
        "n": n,
        "window": [start, end],
        "commits": len(commits),
        "begins": len(begins),
        "engine": engine_lat,
        "ack": list(acked.values()),
        "plain": plain,
        "db": str(state / "edge.db"),
    }


def _plain(tmp: Path, n: int, stamp: str) -> list[float]:
    env = {**os.environ, MARK: str(tmp)}
    out: list[float] = []
    children: list[subprocess.Popen[bytes]] = []
    t0: list[float] = []
    for i in range(n):
        path = tmp / "b" / f"tx-{i:04d}"
        t0.append(time.time())
        children.append(
            subprocess.Popen(
                ["sh", "-c", stamp.format(path) + "; exec sleep 120"],
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        )
    for i, child in enumerate(children):
        out.append(wait_stamp(tmp / "b" / f"tx-{i:04d}", timeout=60.0) - t0[i])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    return out


def child_main(n: int, cycle_s: float, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="edgesched-tx-") as tmpdir:
        result = asyncio.run(_batch(Path(tmpdir), n, cycle_s, stamper()))
    out.write_text(json.dumps(result))


# ---------------------------------------------------------------------- the parent


_TRACE = re.compile(r"^\d+\s+(\d+\.\d+)\s+(fsync|fdatasync)\((\d+)(?:<([^>]*)>)?\)")


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(
        ["strace", "-f", "--seccomp-bpf", "-e", "trace=fsync", "-o", os.devnull, "true"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def _run_child(n: int, cycle_s: float, traced: bool, tmp: Path) -> dict[str, Any]:
    out = tmp / f"result-{n}-{int(traced)}.json"
    argv = [sys.executable, __file__, "--child", str(n), "--cycle-s", str(cycle_s)]
    argv += ["--out", str(out)]
    trace = tmp / f"trace-{n}.txt"
    if traced:
        argv = ["strace", "-f", "--seccomp-bpf", "-y", "-ttt", "-e", "trace=fsync,fdatasync",
                "-o", str(trace), *argv]  # fmt: skip
    subprocess.run(argv, check=True, cwd=tmp)
    result: dict[str, Any] = json.loads(out.read_text())
    if traced:
        start, end = result["window"]
        per_file: dict[str, int] = {}
        for line in trace.read_text().splitlines():
            m = _TRACE.match(line)
            if m and start <= float(m.group(1)) <= end:
                path = m.group(4) or f"fd {m.group(3)}"
                kind = "wal" if path.endswith("-wal") else "db" if path.endswith(".db") else path
                per_file[kind] = per_file.get(kind, 0) + 1
        result["fsyncs"] = per_file
    return result


def _q(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    cuts = statistics.quantiles(xs, n=100, method="inclusive")
    return statistics.median(xs), cuts[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,20,200")
    parser.add_argument("--cycle-s", type=float, default=1.0)
    parser.add_argument("--label", default="", help="printed in the header (e.g. BEFORE)")
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        assert args.out is not None
        child_main(args.child, args.cycle_s, args.out)
        return
    traced = _strace_works()
    import edgesched.sync.store as store_module

    print(
        f"edge engine, submission -> running, one batch submitted at once, cycle_s "
        f"{args.cycle_s:g}, offline {args.label}".rstrip()
    )
    print(f"  store module: {store_module.__file__}")
    print(
        "  commits: COMMITs on the store's connection in the window; fsyncs: strace "
        f"(fsync+fdatasync, all threads) {'' if traced else '-- strace unavailable: n/a'}"
    )
    print(
        f"{'batch':>6} {'commits':>8} {'/task':>6} {'fsyncs':>7} {'/task':>6}  "
        f"{'(wal/db/other)':<15} {'p50 ms':>8} {'p99 ms':>8} {'plain p50':>9} "
        f"{'plain p99':>9} {'x p50':>6} {'x p99':>6} {'ack p50':>8}"
    )
    with tempfile.TemporaryDirectory(prefix="edgesched-txbench-") as tmpdir:
        tmp = Path(tmpdir)
        for n in (int(b) for b in args.batches.split(",")):
            counted = _run_child(n, args.cycle_s, traced, tmp)
            timed = _run_child(n, args.cycle_s, False, tmp)
            fs = counted.get("fsyncs")
            total = sum(fs.values()) if fs is not None else None
            split = (
                "n/a"
                if fs is None
                else f"{fs.get('wal', 0)}/{fs.get('db', 0)}/"
                f"{sum(v for k, v in fs.items() if k not in ('wal', 'db'))}"
            )
            e50, e99 = _q(timed["engine"])
            p50, p99 = _q(timed["plain"])
            a50, _ = _q(timed["ack"])
            ms = 1000.0
            print(
                f"{n:>6} {counted['commits']:>8} {counted['commits'] / n:>6.2f} "
                f"{'n/a' if total is None else total:>7} "
                f"{'n/a' if total is None else f'{total / n:.2f}':>6}  {split:<15} "
                f"{e50 * ms:>8.1f} {e99 * ms:>8.1f} {p50 * ms:>9.2f} {p99 * ms:>9.2f} "
                f"{e50 / p50:>6.0f} {e99 / p99:>6.0f} {a50 * ms:>8.1f}"
            )
            if counted["begins"] != counted["commits"]:
                print(f"       ({counted['begins']} BEGINs: some writes rolled back)")


if __name__ == "__main__":
    main()
