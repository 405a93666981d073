"""paho's window of QoS 1 publishes in flight follows the broker (sync/session.py
``window_within_receive_maximum``), against a real Mosquitto.

A session's client opens with a window of :data:`MAX_PENDING_PUBLISHES`, so a publish past
the session's gate goes on the wire at once instead of waiting in paho's queue for PUBACKs
(where central's fresh assignment waited behind a heal's answers). An MQTT 5 broker states
its Receive Maximum in the CONNACK (Mosquitto's ``max_inflight_messages``: 20 unless set);
the window never goes past it. The project's broker config states
:data:`MAX_INFLIGHT_MESSAGES`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
from conftest import Broker
from paho.mqtt.enums import CallbackAPIVersion

from edgesched.ports import free_port
from edgesched.sync.security import MAX_INFLIGHT_MESSAGES, queue_settings
from edgesched.sync.session import MAX_PENDING_PUBLISHES, Endpoint, MqttSession


def project_broker(tmp_path: Path) -> Broker:
    """Mosquitto with the project's queue and in-flight settings (what it deploys)."""
    port = free_port()
    conf = tmp_path / "project.conf"
    lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", "persistence false"]
    conf.write_text("\n".join([*lines, "log_dest none", *queue_settings()]) + "\n")
    b = Broker(port, None, conf)  # type: ignore[arg-type]
    b.start()
    return b


async def window_after_connect(port: int, protocol: str) -> int:
    """The window of a session's own client once connected (``MqttSession._client``)."""
    session = MqttSession(Endpoint("127.0.0.1", port, f"window-{protocol}", protocol=protocol))
    client = session._client()
    assert client._client.max_inflight_messages == MAX_PENDING_PUBLISHES  # (before)
    async with client:
        window: int = client._client.max_inflight_messages
        await client.publish("window/check", b"x", qos=1)  # (the connection works)
    return window


def test_the_project_broker_states_its_receive_maximum(tmp_path: Path) -> None:
    """Mosquitto takes the config line and states it in the CONNACK (what the window reads)."""
    b = project_broker(tmp_path)
    try:
        seen: list[Any] = []
        paho = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        paho.on_connect = lambda _c, _u, _f, _rc, props: seen.append(props)
        paho.connect("127.0.0.1", b.port)
        while not seen:
            paho.loop(timeout=0.5)
        paho.disconnect()
        assert seen[0].ReceiveMaximum == MAX_INFLIGHT_MESSAGES
        assert MAX_INFLIGHT_MESSAGES >= MAX_PENDING_PUBLISHES  # (so nothing waits in paho)
    finally:
        b.stop()


async def test_a_session_keeps_its_whole_window_on_the_project_broker(tmp_path: Path) -> None:
    b = project_broker(tmp_path)
    try:
        assert await window_after_connect(b.port, "5") == MAX_PENDING_PUBLISHES
    finally:
        b.stop()


async def test_the_window_shrinks_to_a_brokers_smaller_receive_maximum(broker: Broker) -> None:
    """A stock Mosquitto (``max_inflight_messages`` 20) states 20: the window follows."""
    assert await window_after_connect(broker.port, "5") == 20


async def test_mqtt_311_states_no_maximum_and_keeps_the_window(broker: Broker) -> None:
    assert await window_after_connect(broker.port, "3.1.1") == MAX_PENDING_PUBLISHES


async def test_the_window_is_left_alone_without_pahos_private_attribute() -> None:
    """A paho without ``_max_inflight_messages`` keeps its own ``on_connect``."""
    from edgesched.sync.session import window_within_receive_maximum

    client = aiomqtt.Client("127.0.0.1", 1)
    before = client._client.on_connect
    del client._client._max_inflight_messages
    window_within_receive_maximum(client)
    assert client._client.on_connect == before
