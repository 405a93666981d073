"""Central's heartbeat: the signal whose absence turns an edge node autonomous, and by
which central replicas know each other (:class:`CentralPeers`: who leads).

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

from edgesched.sync.session import Listener, publish
from edgesched.sync.topics import HEARTBEAT_TOPIC, parse_heartbeat


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
            {
                "central": self.central_id,
                "seq": self.sent,
                "ts": round(self.clock(), 3),
                "every_s": self.interval_s,  # (how a node judges a missed beat)
            }
        ).encode()

    async def serve(self, client: aiomqtt.Client) -> None:
        while True:
            await publish(client, HEARTBEAT_TOPIC, self.payload(), qos=0)
            self.sent += 1
            await asyncio.sleep(self.interval_s)

    def handle(self, topic: str, payload: bytes) -> None:  # pragma: no cover - no routes
        raise AssertionError(f"the heartbeat publisher routes nothing, got {topic}")

    def disconnected(self) -> None:
        return None


class CentralPeers(Listener):
    """Hears the other centrals' heartbeats: which central replicas are alive, and so which
    one leads. The leader (the smallest id among the live ones) places, fails over and
    reconciles; the others serve the API and accept submissions as *pending*, which the
    leader places. Two centrals cut off from each other both lead for a while: their writes
    to the policy document merge when the link returns, and a task placed twice is settled by
    the reconcile rule like any other."""

    def __init__(
        self, central_id: str, lease_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.central_id = central_id
        self.lease_s = lease_s
        self.clock = clock
        self.last_heard: dict[str, float] = {}
        self.rejected = 0
        self.routes: tuple[str, ...] = (HEARTBEAT_TOPIC,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (HEARTBEAT_TOPIC, SubscribeOptions(qos=0, noLocal=True)),
        )

    def alive(self) -> list[str]:
        now = self.clock()
        return sorted(c for c, at in self.last_heard.items() if now - at <= self.lease_s)

    def leader(self) -> str:
        return min([self.central_id, *self.alive()])

    def is_leader(self) -> bool:
        return self.leader() == self.central_id

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            beat = parse_heartbeat(payload)
        except ValueError:
            self.rejected += 1
            return
        sender = str(beat["central"])
        if sender != self.central_id:  # MQTT 3.1.1 has no no-local: our own come back
            self.last_heard[sender] = self.clock()
