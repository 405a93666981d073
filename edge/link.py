"""The edge node's link to central over MQTT: hear central's heartbeat, announce our status.

One :class:`CentralLink` per node, a channel of the node's one MQTT session
(:class:`edgesched.sync.session.MqttSession`, which reconnects): it publishes a retained
``online`` status on every connect (the session carries the retained ``offline`` last will)
and records when it last heard central's heartbeat. The engine turns that into
its mode: *connected* while central was heard within the lease, *autonomous* after.

Topics are versioned: ``edgesched/v1/central/heartbeat`` (central → nodes) and
``edgesched/v1/node/<node_id>/status`` (retained, node → everyone).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.config import MqttConfig
from edgesched.sync.session import publish
from edgesched.sync.topics import HEARTBEAT_TOPIC, parse_heartbeat, status_topic

log = logging.getLogger("edgesched.edge.link")

#: A heartbeat larger than this is not a heartbeat.

__all__ = ["HEARTBEAT_TOPIC", "CentralLink", "parse_heartbeat", "status_topic"]


class CentralLink:
    """Tracks central's heartbeat and announces our status: a channel of the node's session.

    Owned by the engine. The session carries :meth:`will` (retained ``offline``); on every
    connect :meth:`serve` publishes a retained ``online``."""

    def __init__(
        self,
        node_id: str,
        mqtt: MqttConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_id = node_id
        self.mqtt = mqtt
        self.clock = clock
        self.last_heard: float | None = None
        self.broker_connected = False
        self.rejected_heartbeats = 0
        self.connects = 0
        self.on_heartbeat: Callable[[dict[str, object]], None] | None = None
        self.routes: tuple[str, ...] = (HEARTBEAT_TOPIC,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (HEARTBEAT_TOPIC, SubscribeOptions(qos=1)),
        )

    def heard_within(self, lease_s: float) -> bool:
        return self.last_heard is not None and self.clock() - self.last_heard <= lease_s

    def _status(self, state: str) -> bytes:
        return json.dumps({"node": self.node_id, "state": state}).encode()

    def will(self) -> aiomqtt.Will:
        """The broker publishes this (retained ``offline``) when our connection dies."""
        return aiomqtt.Will(status_topic(self.node_id), self._status("offline"), qos=1, retain=True)

    async def serve(self, client: aiomqtt.Client) -> None:
        self.broker_connected = True
        self.connects += 1
        log.info("connected to broker %s:%d", self.mqtt.host, self.mqtt.port)
        await publish(
            client, status_topic(self.node_id), self._status("online"), qos=1, retain=True
        )

    def disconnected(self) -> None:
        self.broker_connected = False

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            beat = parse_heartbeat(payload)
        except ValueError as exc:
            self.rejected_heartbeats += 1
            log.warning("dropped heartbeat: %s", exc)
            return
        self.last_heard = self.clock()
        if self.on_heartbeat is not None:
            self.on_heartbeat(beat)
