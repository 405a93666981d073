"""Central's heartbeat: the signal whose absence turns an edge node autonomous.

A channel of central's MQTT session: while connected it publishes a small JSON object
(``{"central": <id>, "seq": n, "ts": unix seconds}``) on ``edgesched/v1/central/heartbeat``
every ``interval_s``. QoS 0 and not retained: a stale heartbeat must never be replayed to a
node that has just reconnected (it would think central is alive when it is not). Nodes hold
a lease of several intervals (``edge.lease_s``), so a lost beat costs nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import checked
from edgesched.sync.topics import HEARTBEAT_TOPIC


class Heartbeat:
    """Publishes central's heartbeat while the session is connected."""

    routes: tuple[str, ...] = ()
    subscriptions: tuple[tuple[str, SubscribeOptions], ...] = ()

    def __init__(
        self, central_id: str, interval_s: float = 1.0, clock: Callable[[], float] = time.time
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"heartbeat interval must be > 0, got {interval_s}")
        self.central_id = central_id
        self.interval_s = interval_s
        self.clock = clock
        self.sent = 0

    def payload(self) -> bytes:
        return json.dumps(
            {"central": self.central_id, "seq": self.sent, "ts": round(self.clock(), 3)}
        ).encode()

    async def serve(self, client: aiomqtt.Client) -> None:
        while True:
            await checked(client.publish(HEARTBEAT_TOPIC, self.payload(), qos=0))
            self.sent += 1
            await asyncio.sleep(self.interval_s)

    def handle(self, topic: str, payload: bytes) -> None:  # pragma: no cover - no routes
        raise AssertionError(f"heartbeat routes nothing, got {topic}")

    def disconnected(self) -> None:
        return None
