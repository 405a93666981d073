"""The edge sub-engine as a real process: it schedules alone, survives reboots and SIGKILL, and
refuses bad input clearly. Each node here runs `edgesched edge run` with no broker reachable
unless a test starts Mosquitto."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import Broker, EdgeNode, kill_task_processes, write_edge_config

from edgesched.config import parse_config
from edgesched.core.task import TaskSpec
from edgesched.edge.engine import SubmitError
from edgesched.edge.link import HEARTBEAT_TOPIC, status_topic
from edgesched.serve import edge_engine


def marker_task(tid: str, starts: Path, seconds: int = 300, **extra: Any) -> dict[str, Any]:
    """A task that appends its id to ``starts`` each time it starts, then sleeps."""
    script = f'echo "$0" >> {starts}; exec sleep {seconds}'
    extra = {"cpu": 0.1, "mem_gib": 0.1, **extra}
    return {"id": tid, "command": ["sh", "-c", script, tid], **extra}


def starts_of(starts: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    if starts.exists():
        for line in starts.read_text().split():
            counts[line] = counts.get(line, 0) + 1
    return counts


def running(node: EdgeNode, ids: list[str]) -> dict[str, int] | None:
    tasks = node.tasks()
    if all(tasks.get(i, {}).get("state") == "running" for i in ids):
        return {i: tasks[i]["pid"] for i in ids}
    return None


def test_submit_run_exit_and_restart_policies(edge_node: EdgeNode) -> None:
    ok = {"id": "ok", "command": ["sh", "-c", "exit 0"], "cpu": 0.1}
    bad = {"id": "bad", "command": ["sh", "-c", "exit 3"], "cpu": 0.1, "restart": "never"}
    flaky = {"id": "flaky", "command": ["sh", "-c", "exit 4"], "cpu": 0.1, "max_restarts": 2}
    for body in (ok, bad, flaky):
        status, record = edge_node.request("POST", "/v1/tasks", body)
        assert status == 201, record
        assert record["state"] == "accepted"

    def settled() -> dict[str, Any] | None:
        t = edge_node.tasks()
        done = all(t[i]["state"] in ("exited", "failed") for i in ("ok", "bad", "flaky"))
        return t if done else None

    tasks = edge_node.wait(settled, timeout=30, what="all tasks settled")
    assert tasks["ok"]["state"] == "exited" and tasks["ok"]["exit_code"] == 0
    assert tasks["bad"]["state"] == "failed" and tasks["bad"]["exit_code"] == 3
    assert tasks["bad"]["restarts"] == 0
    assert tasks["flaky"]["state"] == "failed" and tasks["flaky"]["restarts"] == 2
    assert "after 2 restarts" in tasks["flaky"]["reason"]
    for t in tasks.values():
        assert t["decided_by"] == "edge-autonomous"  # no broker: the node decided alone
    status, decisions = edge_node.get("/v1/decisions?task=ok")
    assert status == 200
    assert [d["kind"] for d in decisions if d["kind"] == "place"] == ["place"]
    assert all(d["reason"] and d["source"] == "edge-autonomous" for d in decisions)
    status, metrics = edge_node.get("/metrics")
    assert 'edgesched_edge_mode{mode="autonomous"} 1.0' in metrics
    assert "edgesched_edge_task_restarts_total 2.0" in metrics


def test_reboot_while_offline_brings_every_task_back(edge_node: EdgeNode, tmp_path: Path) -> None:
    starts = tmp_path / "starts.log"
    ids = [f"svc-{i}" for i in range(3)]
    for tid in ids:
        assert edge_node.request("POST", "/v1/tasks", marker_task(tid, starts))[0] == 201
    before = edge_node.wait(lambda: running(edge_node, ids), what="tasks running")
    # Power loss: the engine and every task process die at once.
    edge_node.kill(signal.SIGKILL)
    for pid in before.values():
        os.killpg(pid, signal.SIGKILL)
    edge_node.wait(
        lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                        for p in before.values()),
        what="old processes gone",
    )  # fmt: skip
    # Boot with no broker reachable: everything comes back from SQLite alone.
    edge_node.start()
    after = edge_node.wait(lambda: running(edge_node, ids), what="tasks running again")
    assert set(after) == set(ids)
    assert all(after[i] != before[i] for i in ids)  # new processes
    edge_node.wait(lambda: all(starts_of(starts).get(i, 0) >= 2 for i in ids), what="markers")
    time.sleep(0.5)
    assert starts_of(starts) == dict.fromkeys(ids, 2)  # once per boot, never twice in one
    tasks = edge_node.tasks()
    assert all(tasks[i]["decided_by"] == "edge-autonomous" for i in ids)


def test_engine_crash_adopts_live_tasks_without_starting_them_twice(
    edge_node: EdgeNode, tmp_path: Path
) -> None:
    starts = tmp_path / "starts.log"
    ids = ["a", "b"]
    for tid in ids:
        assert edge_node.request("POST", "/v1/tasks", marker_task(tid, starts))[0] == 201
    before = edge_node.wait(lambda: running(edge_node, ids), what="tasks running")
    edge_node.kill(signal.SIGKILL)
    assert all(psutil.pid_exists(p) for p in before.values())  # tasks outlive the engine
    edge_node.start()
    after = edge_node.wait(lambda: running(edge_node, ids), what="tasks adopted")
    assert after == before
    time.sleep(1.0)  # a few cycles: still one start each
    assert starts_of(starts) == dict.fromkeys(ids, 1)
    # An adopted task's exit is still seen: cancel one and it stops.
    status, record = edge_node.request("DELETE", "/v1/tasks/a")
    assert status == 200 and record["state"] == "cancelled"
    edge_node.wait(lambda: not psutil.pid_exists(before["a"]) or
                   psutil.Process(before["a"]).status() == "zombie", what="a stopped")  # fmt: skip


def test_sigkill_during_a_burst_loses_no_acknowledged_task(
    edge_node: EdgeNode, tmp_path: Path
) -> None:
    starts = tmp_path / "starts.log"
    acked: list[str] = []

    def submit(i: int) -> str | None:
        try:
            body = marker_task(f"b{i:03d}", starts, cpu=0.02, mem_gib=0.05)  # all 60 fit
            status, _ = edge_node.request("POST", "/v1/tasks", body)
        except OSError:
            return None  # the engine died under us: not acknowledged
        return f"b{i:03d}" if status == 201 else None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(submit, i) for i in range(60)]
        edge_node.wait(lambda: sum(f.done() for f in futures) >= 20, what="20 answers")
        edge_node.kill(signal.SIGKILL)
        acked = [tid for f in futures if (tid := f.result()) is not None]
    assert len(acked) >= 20
    edge_node.start()
    edge_node.wait(lambda: running(edge_node, acked), timeout=60, what="every acked task running")
    # "running" is committed before the child's shell writes its marker: wait for the markers.
    edge_node.wait(
        lambda: all(starts_of(starts).get(t, 0) >= 1 for t in acked), what="markers written"
    )
    time.sleep(0.5)
    counts = starts_of(starts)
    twice = {t: n for t, n in counts.items() if n != 1}
    assert not twice, (twice, edge_node.log.read_text()[-6000:])  # none ran twice
    assert all(counts.get(tid) == 1 for tid in acked)


def test_sigkill_keeps_every_acknowledged_task_with_its_document_update(
    edge_node: EdgeNode, tmp_path: Path
) -> None:
    """Read before any restart (a restart re-mirrors SQLite into the document, which would
    hide a lost update): each acknowledged task is in SQLite *and* in the node document rebuilt
    from SQLite, since the row and its document update commit in one transaction."""
    import asyncio

    from edgesched.sync.doc import NodeDoc
    from edgesched.sync.store import Store

    starts = tmp_path / "starts.log"

    def submit(i: int) -> str | None:
        try:
            body = marker_task(f"d{i:03d}", starts, cpu=0.02, mem_gib=0.05)
            status, _ = edge_node.request("POST", "/v1/tasks", body)
        except OSError:
            return None
        return f"d{i:03d}" if status == 201 else None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(submit, i) for i in range(60)]
        edge_node.wait(lambda: sum(f.done() for f in futures) >= 15, what="15 answers")
        edge_node.kill(signal.SIGKILL)
        acked = [tid for f in futures if (tid := f.result()) is not None]
    assert len(acked) >= 15

    async def stored() -> tuple[set[str], set[str]]:
        async with await Store.open(edge_node.state / "edge.db") as store:
            rows = {r.spec.id for r in await store.list_tasks()}
            client_id = int(await store.get_meta("client_id") or 0)
            doc = await NodeDoc.load_from(store, "node-gw-test", client_id)
            return rows, set(doc.tasks())

    rows, mirrored = asyncio.run(stored())
    assert set(acked) <= rows
    assert set(acked) <= mirrored, sorted(set(acked) - mirrored)


def test_bad_input_gets_clear_errors_and_changes_nothing(edge_node: EdgeNode) -> None:
    cases: list[tuple[Any, int, str]] = [
        ({"id": "x", "command": ["sleep", "1"], "cpu": 1000}, 422, "cpu"),
        ({"id": "x", "command": ["no-such-program-anywhere"]}, 422, "command"),
        ({"id": "x", "command": ["sleep", "1"], "colour": "red"}, 400, "colour"),
        ({"id": "x", "command": "sleep 1"}, 400, "command"),
        ({"id": "bad id!", "command": ["sleep", "1"]}, 400, "id"),
        ({"command": ["sleep", "1"]}, 400, "id"),
        ({"id": "x", "command": ["sleep"], "priority": True}, 400, "priority"),
        ([1, 2, 3], 400, "body"),
    ]
    for body, code, field in cases:
        status, problem = edge_node.request("POST", "/v1/tasks", body)
        assert (status, problem["field"]) == (code, field), (body, problem)
        assert problem["detail"]
    status, problem = edge_node.request("POST", "/v1/tasks", raw=b"{not json")
    assert (status, problem["field"]) == (400, "body")
    status, problem = edge_node.request("POST", "/v1/tasks", raw=b" " * (70 * 1024))
    assert status == 413
    assert edge_node.request("GET", "/v1/tasks", auth=False)[0] == 401
    assert edge_node.request("DELETE", "/v1/tasks/nope")[0] == 404
    assert edge_node.tasks() == {}
    ok = {"id": "dup", "command": ["sleep", "5"], "cpu": 0.1}
    assert edge_node.request("POST", "/v1/tasks", ok)[0] == 201
    assert edge_node.request("POST", "/v1/tasks", ok)[0] == 409


def test_mode_follows_central_heartbeat_over_real_mosquitto(broker: Broker, tmp_path: Path) -> None:
    import paho.mqtt.client as mqtt
    import paho.mqtt.enums as enums

    config, state = write_edge_config(tmp_path, broker.port, lease_s=1.5)
    node = EdgeNode(config, state, tmp_path / "edge.log")
    node.start()
    seen: list[tuple[str, bytes]] = []
    central = mqtt.Client(enums.CallbackAPIVersion.VERSION2, client_id="central-test")
    central.on_message = lambda c, u, m: seen.append((m.topic, bytes(m.payload)))
    central.connect("127.0.0.1", broker.port)
    central.subscribe(status_topic("gw-test"), qos=1)
    central.loop_start()
    try:
        node.wait(lambda: node.get("/v1/status")[1]["broker_connected"], what="broker link")
        assert node.get("/v1/status")[1]["mode"] == "autonomous"  # connected broker, no central
        central.publish(HEARTBEAT_TOPIC, b"garbage", qos=1)  # malformed: dropped, logged
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            central.publish(HEARTBEAT_TOPIC, json.dumps({"central": "c1"}), qos=1)
            if node.get("/v1/status")[1]["mode"] == "connected":
                break
            time.sleep(0.2)
        assert node.get("/v1/status")[1]["mode"] == "connected"
        # Central goes quiet: past the lease the node is autonomous again, and keeps working.
        node.wait(lambda: node.get("/v1/status")[1]["mode"] == "autonomous", what="lease expiry")
        body = {"id": "offline-1", "command": ["sleep", "5"], "cpu": 0.1}
        assert node.request("POST", "/v1/tasks", body)[0] == 201
        node.wait(lambda: node.tasks()["offline-1"]["state"] == "running", what="placed offline")
        _, metrics = node.get("/metrics")
        assert 'edgesched_edge_mode_changes_total{mode="connected"} 1.0' in metrics
        assert 'edgesched_edge_mode_changes_total{mode="autonomous"} 1.0' in metrics
        assert any(json.loads(p)["state"] == "online" for _, p in seen)
        # SIGKILL: the broker publishes the retained last will for us.
        node.kill(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            json.loads(p)["state"] == "offline" for _, p in seen
        ):
            time.sleep(0.1)
        assert any(json.loads(p)["state"] == "offline" for _, p in seen)
    finally:
        central.loop_stop()
        central.disconnect()
        if node.proc is not None and node.proc.poll() is None:
            node.kill(signal.SIGTERM)
        kill_task_processes(state)


async def test_full_disk_refuses_submissions_and_keeps_running_tasks(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = parse_config(
        {
            "edge": {
                "node_id": "gw-full",
                "state_dir": str(state),
                "api_port": 0,
                "cycle_s": 0.1,
                "sample_s": 0.2,
                "mqtt": {"port": 1},
            }
        }
    )
    engine = edge_engine(config, max_page_count=40)  # a tiny database: SQLITE_FULL soon
    runner = asyncio.create_task(engine.run())
    try:
        await asyncio.wait_for(engine.wait_ready(), 20)
        first = TaskSpec(id="keeper", command=("sleep", "60"), cpu=0.1)
        await engine.submit(first)
        for _ in range(100):
            record = await engine.store.get_task("keeper")
            if record is not None and record.state.value == "running":
                break
            await asyncio.sleep(0.1)
        assert record is not None and record.pid is not None
        keeper_pid = record.pid
        refused = None
        for i in range(2000):
            spec = TaskSpec(id=f"filler-{i}", command=("sleep", "60"), cpu=0.001,
                            env={"PAD": "x" * 2000})  # fmt: skip
            try:
                await engine.submit(spec)
            except SubmitError as exc:
                refused = exc
                break
        assert refused is not None and refused.status == 507
        assert "full" in refused.message
        await asyncio.sleep(1.0)  # cycles and samples keep failing to write: engine stays up
        assert not runner.done()
        assert psutil.pid_exists(keeper_pid)
        assert engine.metrics.store_errors.labels("full")._value.get() >= 1
    finally:
        engine.stop()
        await asyncio.wait_for(runner, 20)
        kill_task_processes(state)


def test_edge_run_refuses_a_bad_config(tmp_path: Path) -> None:
    import subprocess

    from conftest import edgesched_binary

    bad = tmp_path / "edge.toml"
    bad.write_text('[edge]\nnode_id = "gw 1"\n')
    out = subprocess.run(
        [edgesched_binary(), "edge", "run", "-c", str(bad)], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.startswith("error: edge") and "node_id" in out.stderr
    missing = tmp_path / "noid.toml"
    missing.write_text("[edge]\n")
    out = subprocess.run(
        [edgesched_binary(), "edge", "run", "-c", str(missing)], capture_output=True, text=True
    )
    assert out.returncode == 2 and "edge.node_id: missing" in out.stderr


@pytest.mark.parametrize("flag", ["--help"])
def test_edge_commands_have_help(flag: str) -> None:
    from typer.testing import CliRunner

    from edgesched.cli import app

    for args in (["edge"], ["edge", "run"], ["edge", "submit"], ["node", "qualify"]):
        result = CliRunner().invoke(app, [*args, flag])
        assert result.exit_code == 0 and "Usage" in result.output


def test_forecast_model_loads_or_falls_back_loudly(tmp_path: Path) -> None:
    import shutil

    from conftest import free_port

    from edgesched.policies.models import shipped

    good = tmp_path / "good.onnx"
    shutil.copy(shipped("forecast"), good)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"definitely not onnx")
    for model, expect_name, load_fallbacks in ((good, "onnx:good.onnx", 0), (bad, "ewma", 1)):
        root = tmp_path / model.stem
        root.mkdir()
        config, state = write_edge_config(root, free_port(), forecast_model=str(model))
        node = EdgeNode(config, state, root / "edge.log")
        node.start()
        try:
            status = node.get("/v1/status")[1]
            assert status["forecast"]["model"] == expect_name
            assert status["models"]["placement"]["source"] == "shipped"
            _, metrics = node.get("/metrics")
            line = 'edgesched_edge_model_fallbacks_total{kind="forecast",stage="load"} 1.0'
            assert (line in metrics) == bool(load_fallbacks)
            if load_fallbacks:
                assert "forecast model refused" in node.log.read_text()
                assert "cannot load" in status["models"]["forecast"]["refused"]
        finally:
            node.kill(signal.SIGTERM)


def test_qualification_profile_feeds_the_node_model(tmp_path: Path) -> None:
    import subprocess

    from conftest import edgesched_binary, free_port

    config, state = write_edge_config(tmp_path, free_port())
    out = subprocess.run(
        [edgesched_binary(), "node", "qualify", "--no-tools", "--duration", "0.3", "--json",
         "--workdir", str(tmp_path), "-c", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr  # 1 = a check failed on this busy box
    report = json.loads(out.stdout)
    saved = json.loads((state / "qualification.json").read_text())
    assert saved["perf_factor"] == report["perf_factor"] > 0
    assert all(m["tool"] for m in report["measurements"])  # every figure names its tool
    node = EdgeNode(config, state, tmp_path / "edge.log")
    node.start()
    try:
        hw = node.get("/v1/status")[1]["hardware"]
        assert hw["perf"] == pytest.approx(report["perf_factor"])
        iops = report["profile"].get("iops_k")
        if iops is not None:
            assert hw["iops_k"] == pytest.approx(iops)
    finally:
        node.kill(signal.SIGTERM)


def test_preemption_and_tidal_windows_work_offline(tmp_path: Path) -> None:
    from conftest import free_port

    config, state = write_edge_config(tmp_path, free_port())
    # Give the node a policy of its own: priority mode, preemption on.
    config.write_text('[policy]\nmode = "priority"\n' + config.read_text())
    node = EdgeNode(config, state, tmp_path / "edge.log")
    node.start()
    try:
        cores = node.get("/v1/status")[1]["hardware"]["cores"]
        low = {"id": "low", "command": ["sleep", "60"], "cpu": cores, "priority": 10,
               "mem_gib": 0.1}  # fmt: skip
        assert node.request("POST", "/v1/tasks", low)[0] == 201
        node.wait(lambda: node.tasks()["low"]["state"] == "running", what="low running")
        high = {"id": "high", "command": ["sleep", "60"], "cpu": 1, "priority": 90,
                "mem_gib": 0.1}  # fmt: skip
        assert node.request("POST", "/v1/tasks", high)[0] == 201
        tasks = node.wait(
            lambda: (t := node.tasks())["high"]["state"] == "running" and t, what="preemption"
        )
        assert tasks["low"]["state"] == "preempted"
        assert "preempted for high" in tasks["low"]["reason"]
        assert tasks["high"]["decided_by"] == "edge-autonomous"
    finally:
        node.kill(signal.SIGTERM)
        kill_task_processes(state)
