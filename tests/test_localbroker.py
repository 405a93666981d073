"""The demo's local broker: Mosquitto (MQTT 5) or the embedded amqtt (MQTT 3.1.1), each
carrying a real document sync and a heartbeat over one session per peer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgesched.central.heartbeat import Heartbeat
from edgesched.config import MqttConfig
from edgesched.core.task import TaskState
from edgesched.edge.link import CentralLink
from edgesched.localbroker import start_local_broker
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.peer import DocPeer, wait_converged
from edgesched.sync.schema import TaskReport
from edgesched.sync.session import Endpoint, MqttSession

#: A node's report of a running task (the content these documents sync).
RUNNING = TaskReport(state=TaskState.RUNNING, updated_at=1.0)


@pytest.mark.parametrize("prefer", ["mosquitto", "embedded"])
async def test_a_local_broker_carries_sync_and_heartbeat(tmp_path: Path, prefer: str) -> None:
    broker = await asyncio.to_thread(start_local_broker, tmp_path, prefer=prefer)
    try:
        assert broker.protocol == ("5" if prefer == "mosquitto" else "3.1.1")
        node_doc = NodeDoc("node-gw1", client_id_for("gw1"))
        replica = NodeDoc("node-gw1", client_id_for("central"))
        link = CentralLink("gw1", MqttConfig(port=broker.port))

        def endpoint(name: str) -> Endpoint:
            return Endpoint("127.0.0.1", broker.port, name, 2, protocol=broker.protocol)

        node = MqttSession(endpoint("gw1"), will=link.will(), backoff_max_s=0.5)
        node.add(link)
        node.add(DocPeer(node_doc, "gw1"))
        central = MqttSession(endpoint("central"), backoff_max_s=0.5)
        central.add(DocPeer(replica, "central"))
        central.add(Heartbeat("central", 0.2))
        node_doc.put_task("before", RUNNING)
        tasks = [asyncio.create_task(node.run()), asyncio.create_task(central.run())]
        try:
            await wait_converged([node_doc, replica], timeout=10)
            node_doc.put_task("after", RUNNING)
            await wait_converged([node_doc, replica], timeout=10)
            async with asyncio.timeout(10):
                while link.last_heard is None:
                    await asyncio.sleep(0.05)
            assert replica.task("after") == RUNNING
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        broker.stop()
    assert broker.proc.poll() is not None
