"""One readable event of the MQTT socket reads what is buffered (sync/session.py
``read_what_is_buffered``): a real paho client, its socket one end of a socket pair, the
other end holding MQTT v5 PUBLISH packets written byte for byte as a broker sends them.

paho reads one packet per ``loop_read`` unless its own messages are in flight; at central
the PUBACK of a fresh assignment then waited behind a heal's inbound documents for several
turns of a busy event loop. Patched, one call reads up to the batch, or for the turn's time.
"""

from __future__ import annotations

import socket
import types
from collections.abc import Iterator
from typing import Any, cast

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgesched.sync.session import read_what_is_buffered


def publish_packet(topic: str, payload: bytes) -> bytes:
    """An MQTT v5 QoS 0 PUBLISH: fixed header, topic, no properties, payload."""
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + b"\x00" + payload
    size, length = len(body), bytearray()
    while True:
        digit, size = size % 128, size // 128
        length.append(digit | (0x80 if size else 0))
        if not size:
            break
    return bytes([0x30]) + bytes(length) + body


@pytest.fixture
def client() -> Iterator[tuple[mqtt.Client, socket.socket, list[str]]]:
    paho = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    ours, broker = socket.socketpair()
    ours.setblocking(False)
    paho._sock = ours
    got: list[str] = []
    paho.on_message = lambda _c, _u, msg: got.append(msg.topic)
    yield paho, broker, got
    ours.close()
    broker.close()


def test_paho_alone_reads_one_packet_per_event(
    client: tuple[mqtt.Client, socket.socket, list[str]],
) -> None:
    paho, broker, got = client
    broker.sendall(b"".join(publish_packet(f"t/{i}", b"x" * 100) for i in range(50)))
    paho.loop_read()
    assert got == ["t/0"]  # (what the patch is for)


def test_one_event_reads_every_packet_buffered_in_order(
    client: tuple[mqtt.Client, socket.socket, list[str]],
) -> None:
    paho, broker, got = client
    read_what_is_buffered(cast(Any, types.SimpleNamespace(_client=paho)), turn_s=60.0)
    broker.sendall(b"".join(publish_packet(f"t/{i}", b"x" * 100) for i in range(500)))
    assert paho.loop_read() == mqtt.MQTT_ERR_SUCCESS
    assert got == [f"t/{i}" for i in range(500)]
    assert paho.loop_read() == mqtt.MQTT_ERR_SUCCESS and len(got) == 500  # nothing more


def test_a_read_stops_at_its_batch_or_its_time_and_the_next_reads_on(
    client: tuple[mqtt.Client, socket.socket, list[str]],
) -> None:
    paho, broker, got = client
    read_what_is_buffered(cast(Any, types.SimpleNamespace(_client=paho)), batch=100, turn_s=0.0)
    broker.sendall(b"".join(publish_packet(f"t/{i}", b"y" * 10) for i in range(300)))
    paho.loop_read()
    assert len(got) == 64  # out of time: checked every 64 packets
    read_what_is_buffered(cast(Any, types.SimpleNamespace(_client=paho)), batch=100, turn_s=60)
    paho.loop_read()
    assert len(got) == 164  # the batch
    while len(got) < 300:
        paho.loop_read()
    assert got == [f"t/{i}" for i in range(300)]


def test_a_closed_socket_ends_the_read(
    client: tuple[mqtt.Client, socket.socket, list[str]],
) -> None:
    paho, broker, got = client
    read_what_is_buffered(cast(Any, types.SimpleNamespace(_client=paho)))
    broker.sendall(publish_packet("t/last", b"z"))
    broker.close()
    paho.loop_read()
    assert got == ["t/last"]
    assert paho.loop_read() != mqtt.MQTT_ERR_SUCCESS  # the peer is gone: an error, not a hang
