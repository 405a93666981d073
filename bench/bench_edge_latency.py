"""Offline decision latency of a real edge node: POST /v1/tasks to the task's process started.

Starts ``edgesched edge run`` offline (MQTT port closed, so autonomous; cycle_s 1.0, the
default) and submits N tasks one at a time, each waiting for the previous one to start.
Each task is ``sh -c 'date +%s.%N > <file>; exec sleep 120'``: latency is the timestamp the
child writes minus the wall clock just before the POST, so it covers the HTTP round trip, the
commit to SQLite, the scheduling cycle the submission wakes, the commit of the decision and
the spawn. Baseline in the same run, interleaved with the engine's tasks: the same command
started with ``subprocess.Popen``, timed the same way. Prints p50, p99 and max of both and the
ratio. All tasks are cancelled (DELETE) and every process started is killed at the end.

    .venv/bin/python bench/bench_edge_latency.py [--tasks 50] [--cycle-s 1.0]
"""

from __future__ import annotations

import argparse
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
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from edgesched.ports import free_port

MARK = "EDGESCHED_BENCH_LATENCY"  # in every task's environment, to find leftovers


class Node:
    """A real ``edgesched edge run`` and a minimal client for its local API."""

    def __init__(self, tmp: Path, cycle_s: float) -> None:
        self.state = tmp / "state"
        settings: dict[str, Any] = {
            "node_id": "gw-bench",
            "state_dir": str(self.state),
            "api_port": 0,
            "cycle_s": cycle_s,
            "stop_grace_s": 2.0,
        }
        lines = ["[edge]", *(f"{k} = {json.dumps(v)}" for k, v in settings.items())]
        config = tmp / "edge.toml"
        config.write_text("\n".join([*lines, "[edge.mqtt]", f"port = {free_port()}"]) + "\n")
        self.log = tmp / "edge.log"
        with self.log.open("wb") as out:
            exe = str(Path(sys.executable).with_name("edgesched"))
            self.proc = subprocess.Popen(
                [exe, "edge", "run", "-c", str(config)], stdout=out, stderr=out, cwd=tmp
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited {self.proc.returncode}: {self.log.read_text()}")
            with contextlib.suppress(OSError, ValueError):
                self.base = f"http://127.0.0.1:{int((self.state / 'api-port').read_text())}"
                if self.request("GET", "/v1/health")[0] == 200:
                    self.token = (self.state / "api-token").read_text().strip()
                    return
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"engine not up after 30 s: {self.log.read_text()}")

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if hasattr(self, "token"):
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def stamper() -> str:
    """The shell command that writes the wall clock, ``{}`` standing for the file."""
    probe = subprocess.run(["date", "+%s.%N"], capture_output=True, text=True, check=False)
    if shutil.which("date") and "N" not in probe.stdout:
        return "date +%s.%N > {}"
    # a date(1) without %N (busybox builds): pay for an interpreter instead
    return "python3 -c 'import time; print(repr(time.time()))' > {}"


def wait_stamp(path: Path, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return float(path.read_text())
        time.sleep(0.001)
    raise TimeoutError(f"{path} not written in {timeout} s")


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    cuts = statistics.quantiles(xs, n=100, method="inclusive")
    return statistics.median(xs), cuts[98], max(xs)


def leftovers(tmp: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARK) == str(tmp):
                found.append(proc)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--cycle-s", type=float, default=1.0)
    args = parser.parse_args()
    stamp = stamper()
    with tempfile.TemporaryDirectory(prefix="edgesched-latency-") as tmpdir:
        tmp = Path(tmpdir)
        env = {**os.environ, MARK: str(tmp)}
        (tmp / "e").mkdir()
        (tmp / "b").mkdir()
        engine: list[float] = []
        acked: list[float] = []
        plain: list[float] = []
        pgids: list[int] = []
        ids: list[str] = []
        node = Node(tmp, args.cycle_s)
        try:
            for i in range(args.tasks):
                task_id = f"lat-{i:04d}"
                body = {
                    "id": task_id,
                    "command": ["sh", "-c", stamp.format(tmp / "e" / task_id) + "; exec sleep 120"],
                    "cpu": 0.01,
                    "mem_gib": 0.01,
                    "env": {MARK: str(tmp)},
                }
                t0 = time.time()
                status, reply = node.request("POST", "/v1/tasks", body)
                acked.append(time.time() - t0)
                assert status == 201, (status, reply)
                ids.append(task_id)
                engine.append(wait_stamp(tmp / "e" / task_id) - t0)

                command = ["sh", "-c", stamp.format(tmp / "b" / task_id) + "; exec sleep 120"]
                t0 = time.time()
                child = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, env=env, start_new_session=True
                )
                pgids.append(child.pid)
                plain.append(wait_stamp(tmp / "b" / task_id) - t0)
            rows = node.request("GET", "/v1/tasks")[1]
            pgids += [r["pid"] for r in rows if r["pid"]]
            decided = {r["decided_by"] for r in rows}
            via = set(re.findall(r"\(limits via (\w+)\)", node.log.read_text()))
        finally:
            cancelled = sum(node.request("DELETE", f"/v1/tasks/{t}")[0] == 200 for t in ids)
            node.stop()
            for pgid in pgids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            for proc in leftovers(tmp):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            time.sleep(0.2)
            left = len(leftovers(tmp))
    ms = 1000.0
    e50, e99, emax = quantiles(engine)
    p50, p99, pmax = quantiles(plain)
    a50 = statistics.median(acked)
    within = sum(x < args.cycle_s / 2 for x in engine)
    print(
        f"offline decision latency, {args.tasks} tasks one at a time (cpu 0.01, mem_gib 0.01), "
        f"node cycle_s {args.cycle_s:g} (default 1.0), MQTT port closed (autonomous)"
    )
    print(
        f"engine  POST -> process started  p50 {e50 * ms:7.2f} ms  p99 {e99 * ms:7.2f} ms  "
        f"max {emax * ms:7.2f} ms   (201 returned after p50 {a50 * ms:.2f} ms)"
    )
    print(
        f"plain   Popen -> process started p50 {p50 * ms:7.2f} ms  p99 {p99 * ms:7.2f} ms  "
        f"max {pmax * ms:7.2f} ms"
    )
    print(f"ratio engine / plain             p50 x{e50 / p50:.1f}  p99 x{e99 / p99:.1f}")
    print(
        f"started within cycle_s/2 of submission: {within}/{len(engine)} "
        f"(the submission wakes the loop; decided_by {', '.join(sorted(decided))}; "
        f"task limits via {', '.join(sorted(via)) or '?'})"
    )
    print(f"cleanup: {cancelled}/{len(ids)} cancelled, {left} task processes left")


if __name__ == "__main__":
    main()
