"""The edge service's lean entry point (``python -m edgesched.edgemain`` / ``edgesched-edge``):
it runs the real engine against a real Mosquitto, with its shipped ONNX models, and the
service process never imports the CLI's libraries (typer, rich, click) nor central's
modules; it tells systemd it is ready (``Type=notify``); its mistakes are one ``error:`` line,
as ``edgesched edge run``'s (a second process under the node's identity exits 3)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import Broker, EdgeNode, kill_task_processes, write_edge_config

from edgesched.core import campus
from edgesched.policies import demand
from edgesched.policies.models import shipped
from edgesched.policies.ortsession import open_session
from edgesched.ports import free_port
from edgesched.sync.session import EXIT_IDENTITY_IN_USE

#: Modules a service process must not load (what the lean entry point leaves out).
FORBIDDEN = re.compile(r"^(typer|rich|click|edgesched\.cli|edgesched\.central)(\.|$)")
#: Modules imported only where they are used: frame signing (off here) and models' training.
LAZY = re.compile(
    r"^(cryptography|edgesched\.core\.(campus|simulator|experiment|strategies)"
    r"|edgesched\.policies\.onnxgraph)(\.|$)"
)


#: What the ``edgesched`` console script runs, with the arguments that follow it.
ENTRY = "import sys; from edgesched.entry import main; sys.argv[0] = 'edgesched'; main()"


def _imported(importtime_log: str) -> set[str]:
    """The modules ``python -X importtime`` reported loading."""
    names = set()
    for line in importtime_log.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def test_runs_the_engine_connected_with_its_models_and_no_cli_libraries(
    tmp_path: Path, broker: Broker
) -> None:
    config, state = write_edge_config(tmp_path, broker.port, node_id="gw-lean")
    log = tmp_path / "edge.log"
    node = EdgeNode(config, state, log)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # systemd's end of sd_notify
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(20)
    with log.open("wb") as out:
        node.proc = subprocess.Popen(
            # as the unit starts it, `edgesched edge run` (the console script's entry.main)
            [sys.executable, "-X", "importtime", "-c", ENTRY, "edge", "run", "-c", str(config)],
            stdout=out,
            stderr=out,
            cwd=tmp_path,
            env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")},
        )
    try:
        messages = [notify.recv(4096).decode()]
        while not any("READY=1" in m.splitlines() for m in messages):
            messages.append(notify.recv(4096).decode())
        node.wait(
            lambda: (state / "api-port").exists() and node.get("/v1/health", auth=False)[0] == 200,
            what="/v1/health",
        )
        status = node.wait(
            lambda: (s := node.get("/v1/status")[1]).get("broker_connected") and s,
            what="connected to the broker",
        )
        assert status["node"] == "gw-lean"
        assert {k: v["source"] for k, v in status["models"].items()} == {
            "forecast": "shipped",
            "placement": "shipped",
        }, status["models"]
        assert status["forecast"]["model"] != "ewma", status["forecast"]  # the ONNX model
        code, record = node.request(
            "POST", "/v1/tasks", {"id": "t1", "command": ["sleep", "30"], "cpu": 0.1}
        )
        assert code == 201, record
        node.wait(lambda: node.tasks()["t1"]["state"] == "running", what="t1 running")

        # A second service process under the same node id stops, exit 3 (which the unit's
        # RestartPreventExitStatus names), with one line naming the first one's pid.
        twin_dir = tmp_path / "twin"
        twin_dir.mkdir()
        twin_config, _ = write_edge_config(twin_dir, broker.port, node_id="gw-lean")
        twin = _run("-c", str(twin_config))
        assert twin.returncode == EXIT_IDENTITY_IN_USE == 3, twin.stderr[-3000:]
        last = twin.stderr.splitlines()[-1]
        assert last.startswith("error: edge: another process connected to broker"), last
        assert f"pid {node.proc.pid}" in last and twin.stderr.count("error:") == 1
        assert node.proc.poll() is None

        # A second engine on the SAME config (state directory) stops before it opens the
        # store: no recovery adopting the first one's tasks, no store write, exit 3.
        store = state / "edge.db"
        before = (store.stat().st_mtime_ns, store.stat().st_size)
        same = _run("-c", str(config))
        assert same.returncode == EXIT_IDENTITY_IN_USE, same.stderr[-3000:]
        assert same.stderr.splitlines()[-1] == (
            f"error: edge: state directory {state} is in use by another engine "
            f"(pid {node.proc.pid}): this edge engine gw-lean stops before touching its "
            "store; stop the other one first, or give this one a state_dir of its own"
        ), same.stderr[-3000:]
        assert "recover" not in same.stderr.lower(), same.stderr[-3000:]
        assert node.tasks()["t1"]["state"] == "running" and node.proc.poll() is None
        assert (store.stat().st_mtime_ns, store.stat().st_size) == before
        node.proc.send_signal(signal.SIGTERM)
        assert node.proc.wait(15) == 0, log.read_text()[-3000:]
    finally:
        if node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait()
        kill_task_processes(state)
        notify.close()
    text = log.read_text()
    assert "edge node gw-lean up" in text and "edge node gw-lean stopped" in text
    imported = _imported(text)
    assert "edgesched.edge.engine" in imported and "onnxruntime" in imported  # the log is read
    assert sorted(m for m in imported if FORBIDDEN.match(m)) == []
    assert sorted(m for m in imported if LAZY.match(m)) == []


def test_the_full_cli_would_have_loaded_them() -> None:
    """The check above can fail: the CLI's module does load what the service path leaves out."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import edgesched.cli"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = {m.split(".")[0] for m in _imported(out.stderr) if FORBIDDEN.match(m)}
    assert {"typer", "rich"} <= found


def test_every_session_gets_the_memory_options() -> None:
    session = open_session(shipped("forecast"))
    options = session.get_session_options()
    assert (options.enable_cpu_mem_arena, options.enable_mem_pattern) == (False, False)
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_the_forecasters_bins_are_the_campus_scenarios() -> None:
    """demand.py takes its bins from the engines' (core.classdemand), not from the campus
    scenario its models train on (which it no longer imports): they must be the same."""
    assert (demand.BIN_S, demand.BINS_PER_DAY) == (campus.BIN_S, campus.BINS_PER_DAY)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("edgesched-edge")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)


def test_console_script_mistakes_are_one_error_line(tmp_path: Path) -> None:
    missing = _run("--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: ") and missing.stderr.count("\n") == 1
    assert "nope.toml" in missing.stderr

    config, _ = write_edge_config(tmp_path, free_port())
    lines = config.read_text().splitlines()
    config.write_text("\n".join(ln for ln in lines if not ln.startswith("node_id")) + "\n")
    no_id = _run("-c", str(config))
    assert (no_id.returncode, no_id.stderr) == (
        2,
        "error: edge.node_id: missing (required to run an edge node)\n",
    )

    config, _ = write_edge_config(
        tmp_path, free_port(), mqtt={"password_file": str(tmp_path / "absent")}
    )
    no_password = _run("-c", str(config))
    assert no_password.returncode == 2
    assert no_password.stderr.startswith("error: edge.mqtt: password_file ")

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    config, _ = write_edge_config(tmp_path, free_port(), api_port=taken.getsockname()[1])
    with taken:
        in_use = _run("-c", str(config))
    assert in_use.returncode == 1, in_use.stderr
    last = in_use.stderr.splitlines()[-1]  # (after the engine's log lines)
    assert last.startswith("error: edge API ([edge] api_host, api_port in "), in_use.stderr
    assert "already in use" in last
    assert "Traceback" not in in_use.stderr and in_use.stderr.count("error:") == 1

    bad_level = _run("-c", str(config.with_name("x.toml")), "--log-level", "loud")
    assert bad_level.returncode == 2 and bad_level.stderr.startswith("error: ")


def test_a_store_that_cannot_open_fails_at_run_time_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory goes")
    config, _ = write_edge_config(tmp_path, free_port(), node_id="gw-x")
    started = time.monotonic()
    result = _run("-c", str(config))
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: ")
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 30
