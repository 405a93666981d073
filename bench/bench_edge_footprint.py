"""Idle footprint of a real edge node with its ONNX models loaded, against bare interpreters.

Starts the edge engine offline (MQTT port closed, so autonomous) with the two ONNX models it
ships with (the per-class demand forecaster and the placement score, each in an onnxruntime
session): as the systemd unit starts it, ``edgesched edge run`` (the console script routes it
to the lean entry point ``edgesched.edgemain``: argparse, no typer or rich, no central
modules), also with an allocator environment (``MALLOC_ARENA_MAX=2 OPENBLAS_NUM_THREADS=1``,
not in the unit: tasks inherit the unit's environment) and, for reference, the typer CLI's
``edge run`` (what the console script ran before ``edgesched.entry``); and, to measure what
removing onnxruntime would save, the lean entry with a stub ``onnxruntime`` that fails to
import (the engine then refuses both models and keeps its heuristics). After /v1/health answers
and a settle time, it measures each engine's CPU share of one core over the window and its RSS
(anonymous and file-backed parts) and USS at the end. Baselines measured in the same run, each
alone (USS leaves out pages shared with a concurrent process): a bare interpreter that only
sleeps; one that opens the same two models in onnxruntime sessions with the engine's options
(``edgesched.policies.ortsession``); the same with onnxruntime's default options; and one that
imports the libraries the engine needs, one at a time, printing what each added (where the
floor is). Prints every figure, the ratios and differences to the baselines, and the RSS target
(<= 70 MB).

    .venv/bin/python bench/bench_edge_footprint.py [--seconds 30] [--settle 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from edgesched.policies.models import shipped
from edgesched.ports import free_port

TARGET_RSS_MB = 70.0  # KubeEdge EdgeCore's documented minimum; a K3s agent idles near 270 MB
MB = 1024 * 1024
#: The environment the systemd unit gives the engine (one malloc arena per two threads at most,
#: one OpenBLAS thread: numpy's BLAS is not used on the edge's hot path).
ALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "OPENBLAS_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Mem:
    rss: float
    uss: float
    anon: float
    file: float
    threads: int


def memory(pid: int) -> Mem:
    """RSS, USS and RSS's anonymous and file-backed parts (MB), and the OS thread count."""
    proc = psutil.Process(pid)
    info = proc.memory_full_info()
    status: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                status[key] = int(value.split()[0]) / 1024
    return Mem(
        info.rss / MB,
        info.uss / MB,
        status.get("RssAnon", 0.0),
        status.get("RssFile", 0.0) + status.get("RssShmem", 0.0),
        proc.num_threads(),
    )


def write_config(tmp: Path, sample_s: float, cycle_s: float) -> Path:
    """An offline node (nobody listens on its MQTT port) with the shipped models."""
    state = tmp / "state"
    edge: dict[str, object] = {
        "node_id": "gw-bench",
        "state_dir": str(state),
        "api_port": 0,
        "sample_s": sample_s,
        "cycle_s": cycle_s,
    }
    lines = ["[edge]", *(f"{k} = {json.dumps(v)}" for k, v in edge.items())]
    lines += ["[edge.mqtt]", f"port = {free_port()}"]
    config = tmp / "edge.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def start_engine(
    argv: list[str], config: Path, log: Path, env: dict[str, str], timeout: float = 30.0
) -> subprocess.Popen[bytes]:
    """The engine once /v1/health answers; RuntimeError with the log if it exits first."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=out, cwd=config.parent, env={**os.environ, **env}
        )
    port_file = config.parent / "state" / "api-port"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited {proc.returncode}: {log.read_text().strip()}")
        with contextlib.suppress(OSError, ValueError):
            url = f"http://127.0.0.1:{int(port_file.read_text())}/v1/health"
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return proc
        time.sleep(0.1)
    stop(proc)
    raise TimeoutError(f"engine not up after {timeout}s: {log.read_text().strip()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def baseline(code: str, *argv: str, settle: float = 2.0) -> tuple[Mem, list[str]]:
    """Memory of ``python -c code`` once it prints ready and settles, measured alone, and the
    lines it printed before ready."""
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        lines = []
        while (line := proc.stdout.readline().decode()) != "ready\n":
            assert line, "the baseline exited before it was ready"
            lines.append(line.rstrip("\n"))
        time.sleep(settle)
        return memory(proc.pid), lines
    finally:
        stop(proc)


_SESSIONS = """
import sys, time, onnxruntime as ort
from pathlib import Path
if sys.argv[1] == "engine":
    from edgesched.policies.ortsession import open_session
    sessions = [open_session(Path(p)) for p in sys.argv[2:]]
else:
    sessions = [ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for p in sys.argv[2:]]
for s in sessions:  # one inference each, as the engine's models serve at idle
    i = s.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in i.shape]
    import numpy as np
    s.run(None, {i.name: np.zeros(shape, np.float32)})
print("ready", flush=True)
time.sleep(120)
"""

#: What the engine imports, one library at a time: each step's RSS growth in a fresh process
#: (``sys.argv[1]``: how many steps; the model files after it).
_STEPS = [
    ("numpy", "import numpy"),
    ("onnxruntime", "import onnxruntime"),
    (
        "its two sessions (engine options)",
        "from edgesched.policies.ortsession import open_session; from pathlib import Path; "
        "S = [open_session(Path(p)) for p in sys.argv[1:]]",
    ),
    ("asyncio (with ssl)", "import asyncio"),
    ("aiohttp.web", "import aiohttp.web"),
    ("pycrdt", "import pycrdt"),
    (
        "sqlite3, psutil, aiomqtt, prometheus_client",
        "import sqlite3, psutil, aiomqtt, prometheus_client",
    ),
    # (the third-party libraries end here: the "libraries" baseline stops after this step)
    ("edgesched's edge modules", "import edgesched.edge.api, edgesched.edgemain"),
    (
        "cryptography (only with frame signing on)",
        "import cryptography.hazmat.primitives.asymmetric.ed25519",
    ),
]
_LIBRARY_STEPS = 7
_LIBRARIES = f"""
import sys, time
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
prev = rss()
print(f"python|{{prev:.1f}}|{{prev:.1f}}", flush=True)
for name, code in {_STEPS!r}[: int(sys.argv.pop(1))]:
    exec(code)
    now = rss()
    print(f"{{name}}|{{now:.1f}}|{{now - prev:.1f}}", flush=True)
    prev = now
print("ready", flush=True)
time.sleep(120)
"""


def models_in_use(log: Path) -> str:
    text = log.read_text()
    found = [k for k in ("forecast", "placement") if f"{k} model in use" in text]
    refused = [ln for ln in text.splitlines() if "model refused" in ln]
    if refused:
        return f"NOT all loaded: {refused[0]}"
    return ", ".join(found) + " (shipped)" if found else "NONE loaded"


@dataclass(frozen=True)
class Run:
    name: str
    mem: Mem
    cpu_share: float
    models: str


def measure_engine(
    name: str, argv: list[str], env: dict[str, str], args: argparse.Namespace
) -> Run:
    with tempfile.TemporaryDirectory(prefix="edgesched-footprint-") as tmpdir:
        tmp = Path(tmpdir)
        config = write_config(tmp, args.sample_s, args.cycle_s)
        log = tmp / "edge.log"
        engine = start_engine([*argv, "-c", str(config)], config, log, env)
        try:
            time.sleep(args.settle)
            proc = psutil.Process(engine.pid)
            cpu0, wall0 = sum(proc.cpu_times()[:4]), time.monotonic()
            time.sleep(args.seconds)
            cpu1, wall1 = sum(proc.cpu_times()[:4]), time.monotonic()
            assert engine.poll() is None, log.read_text()
            mem = memory(engine.pid)
            models = models_in_use(log)
        finally:
            stop(engine)
    return Run(name, mem, (cpu1 - cpu0) / (wall1 - wall0), models)


def row(name: str, m: Mem) -> str:
    return (
        f"{name:<34} RSS {m.rss:6.1f} MB (anon {m.anon:5.1f}, file {m.file:5.1f})  "
        f"USS {m.uss:6.1f} MB  {m.threads} threads"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    parser.add_argument("--settle", type=float, default=5.0, help="wait after health answers")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--cycle-s", type=float, default=1.0)
    parser.add_argument("--no-cli", action="store_true", help="skip the typer CLI (reference)")
    parser.add_argument(
        "--optimize",
        action="store_true",
        help="also run the lean entry under python -OO (no docstrings, no asserts); a first "
        "run writes the -OO bytecode files (*.opt-2.pyc) the measured second run reads",
    )
    args = parser.parse_args()
    models = [str(shipped("forecast")), str(shipped("placement"))]

    # One at a time: pages shared with a concurrent process would not count as unique.
    bare, _ = baseline("import time; print('ready', flush=True); time.sleep(120)")
    ort_engine, _ = baseline(_SESSIONS, "engine", *models)
    ort_default, _ = baseline(_SESSIONS, "default", *models)
    libs, _ = baseline(_LIBRARIES, str(_LIBRARY_STEPS), *models)
    _, steps = baseline(_LIBRARIES, str(len(_STEPS)), *models)

    python = sys.executable
    script = str(Path(python).with_name("edgesched"))
    runs = [
        measure_engine("engine, `edgesched edge run` (unit)", [script, "edge", "run"], {}, args),
        measure_engine(
            "engine, lean entry + allocator env",
            [python, "-m", "edgesched.edgemain"],
            ALLOC_ENV,
            args,
        ),
    ]
    if not args.no_cli:
        typer_cli = "import sys; from edgesched.cli import main; sys.argv[0] = 'edgesched'; main()"
        runs.append(
            measure_engine(
                "engine, the typer CLI's `edge run`",
                [python, "-c", typer_cli, "edge", "run"],
                {},
                args,
            )
        )
    with tempfile.TemporaryDirectory(prefix="edgesched-no-ort-") as stub:
        # What the engine would weigh without onnxruntime: a stub package that fails to import
        # ahead of the real one, so the engine refuses both models and keeps its heuristics.
        # Not a configuration: the measure of what removing onnxruntime would save.
        (Path(stub) / "onnxruntime").mkdir()
        (Path(stub) / "onnxruntime" / "__init__.py").write_text(
            "raise ImportError('onnxruntime blocked by bench_edge_footprint')\n"
        )
        runs.append(
            measure_engine(
                "engine WITHOUT onnxruntime (stub)",
                [python, "-m", "edgesched.edgemain"],
                {**ALLOC_ENV, "PYTHONPATH": stub},
                args,
            )
        )
    if args.optimize:
        oo = [python, "-OO", "-m", "edgesched.edgemain"]
        writes = {**ALLOC_ENV, "PYTHONDONTWRITEBYTECODE": ""}  # (empty: bytecode is written)
        warm = argparse.Namespace(**{**vars(args), "seconds": 1.0, "settle": 0.0})
        measure_engine("(warm-up: writes .opt-2.pyc)", oo, writes, warm)
        runs.append(measure_engine("engine, lean entry + allocator env, -OO", oo, ALLOC_ENV, args))

    print(
        f"edge node idle footprint: offline (MQTT port closed), sample_s {args.sample_s:g}, "
        f"cycle_s {args.cycle_s:g}, {args.settle:g} s settle, {args.seconds:g} s window; "
        f"allocator env {' '.join(f'{k}={v}' for k, v in ALLOC_ENV.items())}"
    )
    for run in runs:
        print(row(run.name, run.mem) + f"  CPU {run.cpu_share:.2%} of one core")
        print(f"{'':<34} models: {run.models}")
    print(row("bare python (sleep)", bare))
    print(row("python + ORT, 2 models (engine)", ort_engine))
    print(row("python + ORT, 2 models (defaults)", ort_default))
    print(row("python + the engine's libraries", libs) + " (no edgesched module)")
    print("the engine's imports, one at a time in a fresh process (RSS after, added):")
    for line in steps:
        name, after, added = line.split("|")
        print(f"  {name:<44} {float(after):6.1f} MB  +{float(added):5.1f} MB")
    for run in runs:
        m = run.mem
        print(
            f"{run.name:<34} / bare python x{m.rss / bare.rss:.2f} (+{m.rss - bare.rss:.1f} MB)"
            f"  / python + ORT x{m.rss / ort_engine.rss:.2f} (+{m.rss - ort_engine.rss:.1f} MB)"
            f"  / libraries x{m.rss / libs.rss:.2f} (+{m.rss - libs.rss:.1f} MB)"
        )
    lean = runs[0].mem.rss
    verdict = "met" if lean <= TARGET_RSS_MB else "MISSED"
    print(
        f"target RSS <= {TARGET_RSS_MB:.0f} MB (KubeEdge EdgeCore minimum; K3s agent ~270 MB): "
        f"{verdict} ({lean:.1f} MB, `edgesched edge run` as the unit starts it; "
        f"python + ORT with the two models alone is {ort_engine.rss:.1f} MB)"
    )


if __name__ == "__main__":
    main()
