"""Central and three edge nodes as real processes through a real Mosquitto: one node is cut
off by a fault proxy, decides on its own, and after the heal every replica holds byte-equal
content (by content hash) with every offline decision at central. Also: central killed and
restarted from its SQLite alone, and a broker restart with and without broker persistence."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    Broker,
    EdgeNode,
    central_and_nodes,
    free_port,
    until,
    write_central_config,
)

from edgesched.fieldtest.faultproxy import FaultProxy

NODES = ("gw-a", "gw-b", "gw-c")


@dataclass
class Fleet:
    central: EdgeNode
    nodes: dict[str, EdgeNode]

    def central_nodes(self) -> dict[str, dict[str, Any]]:
        status, body = self.central.get("/v1/nodes")
        assert status == 200, body
        return {n["id"]: n for n in body["nodes"]}

    def node_hash(self, node_id: str) -> str:
        status, body = self.nodes[node_id].get("/v1/status")
        assert status == 200, body
        return str(body["document"]["content_hash"])

    def converged(self) -> dict[str, str] | None:
        """Every node's replica at central equals the node's own document (by hash)."""
        seen = self.central_nodes()
        hashes = {n: self.node_hash(n) for n in self.nodes}
        for node_id, node_hash in hashes.items():
            replica = seen.get(node_id)
            if replica is None or replica["document"]["content_hash"] != node_hash:
                return None
        return hashes


def submit(node: EdgeNode, task_id: str, seconds: int = 120) -> None:
    body = {"id": task_id, "command": ["sleep", str(seconds)], "cpu": 0.05, "mem_gib": 0.05}
    status, reply = node.request("POST", "/v1/tasks", body)
    assert status == 201, reply


@asynccontextmanager
async def fleet(
    tmp_path: Path, ports: dict[str, int], central_port: int, **central_opts: Any
) -> AsyncIterator[Fleet]:
    """Start central and the nodes (node ``n`` talks to MQTT on ``ports[n]``); stop all."""
    node_ports = {n: ports[n] for n in NODES}
    # The nodes take desired state from every central replica there is, and only from them.
    centrals = [central_opts.get("central_id", "central"), *central_opts.get("peers", [])]
    async with central_and_nodes(
        tmp_path,
        central_port,
        node_ports,
        central=central_opts,
        edge=lambda _node, _dir: {"centrals": centrals},
    ) as (central, nodes):
        yield Fleet(central, nodes)


async def test_partitioned_node_decides_alone_and_merges_at_central(
    broker: Broker, tmp_path: Path
) -> None:
    async with FaultProxy("127.0.0.1", 0, "127.0.0.1", broker.port) as proxy:
        ports = {"gw-a": broker.port, "gw-b": broker.port, "gw-c": proxy.port}
        # Central freezes every document unused for 0.5-1 s: the whole run goes through
        # frozen replicas and desired documents, thawed by whatever arrives.
        async with fleet(tmp_path, ports, broker.port, cold_after_s=0.5) as f:
            for node_id, node in f.nodes.items():
                for i in range(2):
                    await asyncio.to_thread(submit, node, f"{node_id}-t{i}")
            await until(f.converged, 30, "central holding every node's document")
            c = f.nodes["gw-c"]
            await until(
                lambda: all(n["telemetry"] for n in f.central_nodes().values()),
                20,
                "telemetry from every node",
            )
            status, series = await asyncio.to_thread(f.central.get, "/v1/nodes/gw-a/telemetry")
            assert status == 200 and 0 <= series["samples"][-1]["cpu_util"] <= 1

            # The partition: a silent one (packets vanish), as a dead WAN link does.
            proxy.blackhole()
            await until(
                lambda: c.get("/v1/status")[1]["mode"] == "autonomous", 20, "gw-c autonomous"
            )
            await until(
                lambda: f.central_nodes()["gw-c"]["status"] == "offline",
                20,
                "central seeing gw-c's last will",
            )
            offline = [f"gw-c-offline-{i}" for i in range(3)]
            for task_id in offline:
                await asyncio.to_thread(submit, c, task_id)
            status, _ = await asyncio.to_thread(c.request, "DELETE", "/v1/tasks/gw-c-t0")
            assert status in (200, 202)
            await asyncio.to_thread(submit, f.nodes["gw-a"], "gw-a-during")

            def offline_decided() -> bool:
                tasks = c.tasks()
                running = all(tasks.get(t, {}).get("state") == "running" for t in offline)
                return running and tasks["gw-c-t0"]["state"] == "cancelled"

            await until(offline_decided, 20, "gw-c deciding while cut off")
            # The operator switches the fleet to energy mode while gw-c is away.
            status, _ = await asyncio.to_thread(
                f.central.request, "POST", "/v1/policy", {"mode": "energy"}
            )
            assert status == 200
            await until(
                lambda: f.nodes["gw-a"].get("/v1/status")[1]["policy"] == "energy",
                20,
                "gw-a following the switch",
            )
            assert (await asyncio.to_thread(c.get, "/v1/status"))[1]["policy"] == "priority"
            # The rest of the fleet goes on syncing; gw-c's replica stays as it was.
            await until(
                lambda: (
                    f.central_nodes()["gw-a"]["document"]["content_hash"] == f.node_hash("gw-a")
                ),
                20,
                "gw-a still syncing",
            )
            assert f.central_nodes()["gw-c"]["document"]["content_hash"] != f.node_hash("gw-c")

            # Central dies while gw-c is away, and comes back from its SQLite alone.
            await asyncio.to_thread(f.central.kill, signal.SIGKILL)
            await asyncio.to_thread(f.central.start)
            restored = await asyncio.to_thread(f.central_nodes)
            assert set(restored) == set(NODES)

            t_heal = time.monotonic()
            proxy.heal()
            hashes = await until(f.converged, 30, "every replica byte-equal after the heal")
            healed_in = time.monotonic() - t_heal
            status, detail = await asyncio.to_thread(f.central.get, "/v1/nodes/gw-c")
            assert status == 200
            at_central = detail["content"]["tasks"]
            at_node = await asyncio.to_thread(c.tasks)
            for task_id in offline:  # every offline decision is at central, as the node has it
                assert at_central[task_id]["state"] == at_node[task_id]["state"] == "running"
                assert at_central[task_id]["decided_by"] == "edge-autonomous"
            assert at_central["gw-c-t0"]["state"] == "cancelled"
            assert len(set(hashes.values())) == len(NODES)  # three different documents
            await until(
                lambda: f.central_nodes()["gw-c"]["status"] == "online", 10, "gw-c online again"
            )
            await until(
                lambda: c.get("/v1/status")[1]["policy"] == "energy", 20, "gw-c picking it up"
            )
            status, central_status = await asyncio.to_thread(f.central.get, "/v1/status")
            assert central_status["rejected"]["rejected_senders"] == 0
            await until(lambda: metric(f.central, "edgesched_central_docs_frozen") > 0, 10,
                        "documents frozen again once quiet")  # fmt: skip
            assert metric(f.central, "edgesched_central_doc_thaws_total") > 0
            print(f"healed in {healed_in:.2f}s (detection by keepalive 2 s)")


def metric(node: EdgeNode, name: str) -> float:
    """One unlabelled sample of central's /metrics."""
    status, body = node.get("/metrics")
    assert status == 200, body
    text = body if isinstance(body, str) else bytes(body).decode()
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.parametrize("persistence", [False, True], ids=["volatile", "persistent"])
async def test_broker_restart_loses_nothing(tmp_path: Path, persistence: bool) -> None:
    """The broker restarts (its queued QoS 1 messages gone unless it persists them); nodes
    keep deciding meanwhile; the state-vector resync on reconnect brings everything."""
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", "log_dest none"]
    if persistence:
        (tmp_path / "mq").mkdir()
        lines += ["persistence true", f"persistence_location {tmp_path / 'mq'}/"]
    else:
        lines.append("persistence false")
    conf.write_text("\n".join(lines) + "\n")
    broker = Broker(port, None, conf)  # type: ignore[arg-type]
    broker.start()
    try:
        ports = dict.fromkeys(NODES, port)
        async with fleet(tmp_path, ports, port) as f:
            await asyncio.to_thread(submit, f.nodes["gw-a"], "before")
            await until(f.converged, 30, "converged before the restart")
            broker.stop()
            for node_id, node in f.nodes.items():
                await asyncio.to_thread(submit, node, f"{node_id}-while-down")
            await asyncio.sleep(1.0)
            broker.start()
            await until(f.converged, 30, "converged after the broker restart")
            seen = await asyncio.to_thread(f.central_nodes)
            for node_id in NODES:
                assert seen[node_id]["tasks"].get("running", 0) >= 1
            status, detail = await asyncio.to_thread(f.central.get, "/v1/nodes/gw-b")
            assert status == 200 and "gw-b-while-down" in detail["content"]["tasks"]
    finally:
        broker.stop()


def central_task(f: Fleet, task_id: str) -> dict[str, Any]:
    status, body = f.central.get(f"/v1/tasks/{task_id}")
    assert status == 200, body
    return dict(body)


async def test_failover_during_a_partition_then_one_copy_after_the_heal(
    broker: Broker, tmp_path: Path
) -> None:
    """Central fails a service over from a cut-off node; the node keeps running it; after the
    heal both copies are seen, the reconcile rule (keep-original) keeps the cut-off node's,
    the replacement is stopped, and every replica agrees. A batch task is never failed over."""
    async with FaultProxy("127.0.0.1", 0, "127.0.0.1", broker.port) as proxy:
        ports = {"gw-a": broker.port, "gw-b": broker.port, "gw-c": proxy.port}
        async with fleet(tmp_path, ports, broker.port, failover_after_s=2.0, cycle_s=0.3) as f:
            c = f.nodes["gw-c"]
            await until(f.converged, 30, "central holding every node's document")
            await until(
                lambda: all(n["status"] == "online" for n in f.central_nodes().values()),
                30,
                "central seeing every node online",
            )
            for task_id, restart in (("svc", "always"), ("batch", "never")):
                body = {"id": task_id, "command": ["sleep", "300"], "cpu": 0.05,
                        "mem_gib": 0.05, "restart": restart, "node": "gw-c"}  # fmt: skip
                status, reply = await asyncio.to_thread(
                    f.central.request, "POST", "/v1/tasks", body
                )
                assert status == 201, reply
                assert reply["node"] == "gw-c" and reply["state"] == "active", reply["reason"]

            def c_runs_both() -> bool:
                tasks = c.tasks()
                return all(tasks.get(t, {}).get("state") == "running" for t in ("svc", "batch"))

            await until(c_runs_both, 20, "gw-c running central's tasks")
            assert (await asyncio.to_thread(c.tasks))["svc"]["decided_by"] == "central"

            proxy.blackhole()
            await until(
                lambda: central_task(f, "svc")["node"] in ("gw-a", "gw-b"), 30, "svc failed over"
            )
            moved = central_task(f, "svc")
            replacement = f.nodes[moved["node"]]
            assert moved["replacement"] is True and moved["epoch"] == 2
            await until(
                lambda: replacement.tasks().get("svc", {}).get("state") == "running",
                20,
                "the replacement copy running",
            )
            assert central_task(f, "batch")["node"] == "gw-c"  # batch waits for its node
            assert (await asyncio.to_thread(c.tasks))["svc"]["state"] == "running"  # still

            proxy.heal()

            def settled() -> list[str] | None:
                view = central_task(f, "svc")
                running = [
                    n for n, node in f.nodes.items()
                    if node.tasks().get("svc", {}).get("state") == "running"
                ]  # fmt: skip
                return running if running == ["gw-c"] and view["node"] == "gw-c" else None

            await until(settled, 30, "one copy of svc, on gw-c (keep-original)")
            lost = (await asyncio.to_thread(replacement.tasks))["svc"]
            assert lost["state"] == "cancelled" and "reconciled" in lost["reason"]
            await until(f.converged, 30, "replicas byte-equal after the merge")
            status, events = await asyncio.to_thread(f.central.get, "/v1/events")
            kinds = [e["kind"] for e in events["events"]]
            assert "failover" in kinds and "reconciled" in kinds
            assert kinds.count("reconciled") == 1  # settled once, not on every cycle
            view = await asyncio.to_thread(central_task, f, "svc")
            assert view["running_on"] == ["gw-c"]

            # The operator moves it: placed on gw-b, then stopped on gw-c once gw-b runs it.
            status, moved = await asyncio.to_thread(
                f.central.request, "POST", "/v1/tasks/svc/migrate", {"node": "gw-b"}
            )
            assert status == 200 and moved["node"] == "gw-b", moved

            def migrated() -> bool:
                on_b = f.nodes["gw-b"].tasks().get("svc", {})
                on_c = c.tasks()["svc"]
                return on_b.get("state") == "running" and on_c["state"] == "cancelled"

            await until(migrated, 20, "svc moved from gw-c to gw-b")
            assert "migrated to gw-b" in (await asyncio.to_thread(c.tasks))["svc"]["reason"]
            # Make before break: gw-c stopped its copy only after gw-b's ran (one machine's
            # clock for both), so the service never ran nowhere.
            on_b = (await asyncio.to_thread(f.nodes["gw-b"].tasks))["svc"]
            on_c = (await asyncio.to_thread(c.tasks))["svc"]
            assert on_c["updated_at"] >= on_b["updated_at"], (on_b, on_c)
            status, _ = await asyncio.to_thread(
                f.central.request, "POST", "/v1/tasks/svc/migrate", {"node": "gw-b"}
            )
            assert status == 409  # it is there already


async def test_two_central_replicas_share_the_policy_document_and_one_leads(
    broker: Broker, tmp_path: Path
) -> None:
    """central-a and central-b run side by side as peers of the policy document. The smaller
    id leads: a task submitted at the standby is accepted as pending and placed by the
    leader. When the leader dies, the standby takes over and places what it is given."""
    ports = {"gw-a": broker.port, "gw-b": broker.port, "gw-c": broker.port}
    async with fleet(tmp_path, ports, broker.port, central_id="central-a",
                     peers=["central-b"]) as f:  # fmt: skip
        d = tmp_path / "b"
        d.mkdir()
        config, state = write_central_config(
            d, broker.port, central_id="central-b", peers=["central-a"]
        )
        standby = EdgeNode(config, state, d / "central.log", tier="central")
        await asyncio.to_thread(standby.start)
        try:
            await until(f.converged, 30, "central-a holding every node's document")

            def status(c: EdgeNode) -> dict[str, Any]:
                return dict(c.get("/v1/status")[1])

            await until(
                lambda: (
                    status(standby)["leader"] == "central-a"
                    and status(f.central)["centrals_alive"] == ["central-b"]
                ),
                20,
                "the two centrals hearing each other",
            )
            body = {"id": "via-b", "command": ["sleep", "120"], "cpu": 0.05, "mem_gib": 0.05}
            code, reply = await asyncio.to_thread(standby.request, "POST", "/v1/tasks", body)
            assert code == 201 and reply["state"] == "pending", reply
            await until(
                lambda: f.central.get("/v1/tasks/via-b")[1].get("state") == "active",
                20,
                "placed by the leader",
            )
            await until(
                lambda: standby.get("/v1/tasks/via-b")[1]["state"] == "active",
                20,
                "the standby seeing the placement",
            )
            await until(
                lambda: status(standby)["policy_hash"] == status(f.central)["policy_hash"],
                20,
                "one policy document on both",
            )
            await asyncio.to_thread(f.central.kill, signal.SIGKILL)
            await until(lambda: status(standby)["leader"] == "central-b", 20, "b taking over")
            body = {"id": "after", "command": ["sleep", "120"], "cpu": 0.05, "mem_gib": 0.05}
            code, reply = await asyncio.to_thread(standby.request, "POST", "/v1/tasks", body)
            assert code == 201 and reply["state"] == "active", reply
            node = f.nodes[reply["node"]]
            await until(
                lambda: node.tasks().get("after", {}).get("state") == "running",
                20,
                "the task running",
            )
        finally:
            if standby.proc is not None and standby.proc.poll() is None:
                await asyncio.to_thread(standby.kill, signal.SIGTERM)
