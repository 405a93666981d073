"""Idle footprint of a real edge node with its ONNX forecast model, against bare interpreters.

Starts ``edgesched edge run`` offline (MQTT port closed, so autonomous) with ``[edge]
forecast_model`` pointing at a small ONNX MLP built here (32 -> 64 -> 1, Relu, opset 17). An
engine that refuses the key runs without it, and the output says so. After /v1/health
answers and a settle time, it measures the engine's CPU share of one core over the window
and its RSS and USS at the end. Baselines measured in the same run, each alone (USS leaves
out pages shared with a concurrent process): a bare interpreter that only sleeps, and one
that only loads the same model into an onnxruntime InferenceSession (one intra- and one
inter-op thread, as the engine's forecaster does). Prints the engine's figures, the ratios
to both baselines, and the RSS target (<= 70 MB).

    .venv/bin/python bench/bench_edge_footprint.py [--seconds 60] [--settle 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import psutil
from onnx import TensorProto, helper, numpy_helper

from edgesched.ports import free_port

TARGET_RSS_MB = 70.0  # KubeEdge EdgeCore's documented minimum; a K3s agent idles near 270 MB
MB = 1024 * 1024


def build_model(path: Path, seed: int = 0) -> None:
    """A float32 MLP x[N, 32] -> Gemm -> Relu -> Gemm -> y[N, 1], seeded random weights."""
    rng = np.random.default_rng(seed)
    weights = {
        "w1": rng.standard_normal((32, 64)).astype(np.float32) * 0.1,
        "b1": rng.standard_normal(64).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((64, 1)).astype(np.float32) * 0.1,
        "b2": rng.standard_normal(1).astype(np.float32) * 0.1,
    }
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["y"]),
        ],
        "forecast_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(a, name) for name, a in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # the IR version of opset 17; any onnxruntime >= 1.11 reads it
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_config(tmp: Path, model: Path | None, sample_s: float, cycle_s: float) -> Path:
    state = tmp / "state"
    edge: dict[str, object] = {
        "node_id": "gw-bench",
        "state_dir": str(state),
        "api_port": 0,
        "sample_s": sample_s,
        "cycle_s": cycle_s,
    }
    if model is not None:
        edge["forecast_model"] = str(model)
    lines = ["[edge]", *(f"{k} = {json.dumps(v)}" for k, v in edge.items())]
    lines += ["[edge.mqtt]", f"port = {free_port()}"]  # nobody listens there: offline
    config = tmp / "edge.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def start_engine(config: Path, log: Path, timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """The engine once /v1/health answers; RuntimeError with the log if it exits first."""
    exe = str(Path(sys.executable).with_name("edgesched"))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [exe, "edge", "run", "-c", str(config)], stdout=out, stderr=out, cwd=config.parent
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


def memory(pid: int) -> tuple[float, float]:
    """(RSS, USS) in MB."""
    info = psutil.Process(pid).memory_full_info()
    return info.rss / MB, info.uss / MB


def ort_mapped(pid: int) -> bool:
    return any("onnxruntime" in m.path for m in psutil.Process(pid).memory_maps())


def baseline(code: str, *argv: str, settle: float = 2.0) -> tuple[float, float]:
    """(RSS, USS) of ``python -c code`` once it prints ready and settles, measured alone."""
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(settle)
        return memory(proc.pid)
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="measurement window")
    parser.add_argument("--settle", type=float, default=5.0, help="wait after health answers")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--cycle-s", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgesched-footprint-") as tmpdir:
        tmp = Path(tmpdir)
        model = tmp / "forecast.onnx"
        build_model(model)
        # One at a time: pages shared with a concurrent process would not count as unique.
        b_rss, b_uss = baseline("import time; print('ready', flush=True); time.sleep(60)")
        o_rss, o_uss = baseline(
            "import sys, time, onnxruntime as ort; "
            "o = ort.SessionOptions(); o.intra_op_num_threads = o.inter_op_num_threads = 1; "
            "s = ort.InferenceSession(sys.argv[1], o, providers=['CPUExecutionProvider']); "
            "print('ready', flush=True); time.sleep(60)",
            str(model),
        )
        log = tmp / "edge.log"
        try:
            engine = start_engine(write_config(tmp, model, args.sample_s, args.cycle_s), log)
            model_note = "loaded via [edge] forecast_model"
        except RuntimeError as exc:
            if "forecast_model" not in str(exc):
                raise
            refusal = str(exc).splitlines()[-1]
            engine = start_engine(write_config(tmp, None, args.sample_s, args.cycle_s), log)
            model_note = f"NOT loaded: the engine refused the key ({refusal}); ran without it"
        try:
            time.sleep(args.settle)
            refused = [ln for ln in log.read_text().splitlines() if "model refused" in ln]
            if refused:
                model_note = f"NOT loaded: the engine refused the file, fell back: {refused[0]}"
            proc = psutil.Process(engine.pid)
            cpu0, wall0 = sum(proc.cpu_times()[:4]), time.monotonic()
            time.sleep(args.seconds)
            cpu1, wall1 = sum(proc.cpu_times()[:4]), time.monotonic()
            assert engine.poll() is None, log.read_text()
            share = (cpu1 - cpu0) / (wall1 - wall0)
            e_rss, e_uss = memory(engine.pid)
            mapped = "yes" if ort_mapped(engine.pid) else "no"
            children = len(proc.children(recursive=True))
        finally:
            stop(engine)
    verdict = "met" if e_rss <= TARGET_RSS_MB else "MISSED"
    print(
        f"edge node idle footprint: offline (MQTT port closed), sample_s {args.sample_s:g}, "
        f"cycle_s {args.cycle_s:g}, {args.settle:g} s settle, {args.seconds:g} s window"
    )
    print(f"forecast model: {model_note}; onnxruntime mapped in the engine: {mapped}")
    print(
        f"engine                    RSS {e_rss:6.1f} MB  USS {e_uss:6.1f} MB  "
        f"CPU {share:.2%} of one core  ({children} child processes)"
    )
    print(f"bare python (sleep)       RSS {b_rss:6.1f} MB  USS {b_uss:6.1f} MB")
    print(f"python + ORT session      RSS {o_rss:6.1f} MB  USS {o_uss:6.1f} MB")
    print(f"engine / bare python      RSS x{e_rss / b_rss:.2f}  USS x{e_uss / b_uss:.2f}")
    print(f"engine / python + ORT     RSS x{e_rss / o_rss:.2f}  USS x{e_uss / o_uss:.2f}")
    print(
        f"target RSS <= {TARGET_RSS_MB:.0f} MB (KubeEdge EdgeCore minimum; K3s agent ~270 MB): "
        f"{verdict} ({e_rss:.1f} MB)"
    )


if __name__ == "__main__":
    main()
