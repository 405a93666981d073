"""An edge node's CRDT document over real Mosquitto: what it decided offline reaches central's
replica when the link returns, and the document survives a restart from SQLite alone."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from conftest import Broker, EdgeNode, kill_task_processes, write_edge_config

from edgesched.core.task import TaskState
from edgesched.sync.doc import NodeDoc, PolicyDoc, client_id_for
from edgesched.sync.peer import DocPeer


async def test_offline_decisions_reach_central_after_heal(broker: Broker, tmp_path: Path) -> None:
    broker.stop()  # the partition: no broker while the node decides
    config, state = write_edge_config(tmp_path, broker.port)
    node = EdgeNode(config, state, tmp_path / "edge.log")
    await asyncio.to_thread(node.start)
    central_doc = NodeDoc("node-gw-test", client_id_for("central-1"))
    central = DocPeer(central_doc, "central-1", "127.0.0.1", broker.port, backoff_max_s=0.5)
    peer_task: asyncio.Task[None] | None = None
    try:
        ids = [f"off-{i}" for i in range(3)]
        for tid in ids:
            body = {"id": tid, "command": ["sleep", "60"], "cpu": 0.1, "mem_gib": 0.1}
            status, _ = await asyncio.to_thread(node.request, "POST", "/v1/tasks", body)
            assert status == 201

        def all_running() -> bool:
            tasks = node.tasks()
            return all(tasks.get(t, {}).get("state") == "running" for t in ids)

        await asyncio.to_thread(node.wait, all_running, 20.0, "tasks running offline")
        # Heal: the broker comes back; central's replica joins.
        await asyncio.to_thread(broker.start)
        peer_task = asyncio.create_task(central.run())
        node_hash = ""
        for _ in range(200):
            status = (await asyncio.to_thread(node.get, "/v1/status"))[1]
            node_hash = status["document"]["content_hash"]
            if central_doc.content_hash() == node_hash:
                break
            await asyncio.sleep(0.1)
        assert central_doc.content_hash() == node_hash  # byte-equal content, by hash
        seen = central_doc.tasks()
        assert set(ids) <= set(seen)
        assert all(seen[t].decided_by == "edge-autonomous" for t in ids)
        assert all(seen[t].state is TaskState.RUNNING for t in ids)
        registration = central_doc.registration()
        assert registration is not None and registration.cpu > 0
        assert central_doc.refusals.total() == 0  # every entry the node wrote decodes
        # Central (of this version, the node's configured "central") says in the fleet-wide
        # policy that it reads packed entries: the node's next reports are JSON text, which
        # central's replica decodes as it did the nested ones.
        assert registration.reads_packed
        assert all(isinstance(central_doc.root("tasks").get(t), dict) for t in ids)
        policy = PolicyDoc("policy", client_id_for("central"))
        policy_peer = DocPeer(policy, "central", "127.0.0.1", broker.port, backoff_max_s=0.5)
        policy.announce_packed()  # (after the peer: its update goes out)
        policy_task = asyncio.create_task(policy_peer.run())
        try:

            def writes_packed() -> bool:
                return bool(node.get("/v1/status")[1]["document"]["packed"])

            # (the node switches on its next step after the policy arrives, not before)
            await asyncio.to_thread(node.wait, writes_packed, 20.0, "node writes packed")
            body = {"id": "packed-1", "command": ["sleep", "60"], "cpu": 0.1, "mem_gib": 0.1}
            status, _ = await asyncio.to_thread(node.request, "POST", "/v1/tasks", body)
            assert status == 201
            for _ in range(200):
                held = central_doc.tasks().get("packed-1")
                if held is not None and held.state is TaskState.RUNNING:
                    break
                await asyncio.sleep(0.1)
            assert held is not None and held.state is TaskState.RUNNING
            assert isinstance(central_doc.root("tasks").get("packed-1"), str)
            assert central_doc.refusals.total() == 0
            ids.append("packed-1")
        finally:
            policy_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await policy_task
        # Power loss while cut off again: restart from SQLite alone. The document is rebuilt
        # from its update log with the same client id and keeps its clock (a restarted doc that
        # reused clock values would diverge from central silently, and never converge again).
        broker.stop()
        await asyncio.to_thread(node.kill, signal.SIGKILL)
        await asyncio.to_thread(node.start)
        status = (await asyncio.to_thread(node.get, "/v1/status"))[1]
        assert status["document"]["client_id"] == client_id_for("gw-test")
        assert status["document"]["tasks"] >= len(ids)
        await asyncio.to_thread(broker.start)
        for _ in range(200):
            status = (await asyncio.to_thread(node.get, "/v1/status"))[1]
            node_hash = status["document"]["content_hash"]
            if central_doc.content_hash() == node_hash:
                break
            await asyncio.sleep(0.1)
        assert central_doc.content_hash() == node_hash
    finally:
        if peer_task is not None:
            peer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await peer_task
        if node.proc is not None and node.proc.poll() is None:
            await asyncio.to_thread(node.kill, signal.SIGTERM)
        kill_task_processes(state)
