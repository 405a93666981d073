"""Telemetry over MQTT: small samples as plain messages, never CRDT state.

A node's resource samples change every few seconds; kept in a CRDT map they would grow its
document forever. They travel instead as QoS 0 messages on ``edgesched/v1/node/<id>/telemetry``
(a lost sample costs nothing; the next one replaces it), and the node keeps the full series in
its own SQLite. :class:`TelemetryPublisher` is the node's channel: it publishes the latest
sample whenever one is offered and the link is up (nothing is queued while it is down: stale
telemetry is noise). :func:`parse_telemetry` is the receiver's validation.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Any

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import publish
from edgesched.sync.topics import json_object, node_of_topic
from edgesched.sync.wire import TOPIC_ROOT

TELEMETRY_FILTER = f"{TOPIC_ROOT}/node/+/telemetry"
MAX_TELEMETRY_BYTES = 2048


def telemetry_topic(node_id: str) -> str:
    return f"{TOPIC_ROOT}/node/{node_id}/telemetry"


@dataclass(frozen=True)
class Telemetry:
    """One node sample as central keeps it."""

    at: float
    cpu_util: float  # 0..1, mean over cores
    mem_util: float  # 0..1
    power_w: float
    tasks_running: int

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "cpu_util": self.cpu_util,
            "mem_util": self.mem_util,
            "power_w": self.power_w,
            "tasks_running": self.tasks_running,
        }


def parse_telemetry(topic: str, payload: bytes) -> tuple[str, Telemetry]:
    """``(node_id, sample)``; ValueError says what is wrong (size, JSON, a field, the topic)."""
    node_id = node_of_topic(topic, "telemetry")
    if node_id is None:
        raise ValueError(f"not a telemetry topic: {topic}")
    data = json_object(payload, "telemetry", MAX_TELEMETRY_BYTES)

    def number(key: str, low: float, high: float) -> float:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"telemetry.{key}: expected a number")
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"telemetry.{key}: {value} outside [{low}, {high}]")
        return float(value)

    running = data.get("tasks_running")
    if isinstance(running, bool) or not isinstance(running, int) or running < 0:
        raise ValueError("telemetry.tasks_running: expected an integer >= 0")
    sample = Telemetry(
        at=number("at", 0, 1e12),
        cpu_util=number("cpu_util", 0, 1),
        mem_util=number("mem_util", 0, 1),
        power_w=number("power_w", 0, 1e6),
        tasks_running=running,
    )
    return node_id, sample


class TelemetryPublisher:
    """The node's telemetry channel: publishes each offered sample while connected."""

    routes: tuple[str, ...] = ()
    subscriptions: tuple[tuple[str, SubscribeOptions], ...] = ()

    def __init__(self, node_id: str) -> None:
        self.topic = telemetry_topic(node_id)
        self.sent = 0
        self._latest: Telemetry | None = None
        self._ready = asyncio.Event()

    def offer(self, sample: Telemetry) -> None:
        self._latest = sample
        self._ready.set()

    async def serve(self, client: aiomqtt.Client) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            sample = self._latest
            if sample is not None:
                payload = json.dumps(sample.to_json()).encode()
                await publish(client, self.topic, payload, qos=0)
                self.sent += 1

    def handle(self, topic: str, payload: bytes) -> None:  # pragma: no cover - no routes
        raise AssertionError(f"telemetry publisher routes nothing, got {topic}")

    def disconnected(self) -> None:
        self._ready.clear()  # what was offered while down is stale
