"""The edge node's link to central over MQTT: hear central's heartbeat, announce our status.

One :class:`CentralLink` per node, a channel of the node's one MQTT session
(:class:`edgesched.sync.session.MqttSession`, which reconnects): it publishes a retained
``online`` status on every connect (the session carries the retained ``offline`` last will)
and records when it last heard central's heartbeat. The engine turns that into
its mode: *connected* while central was heard within the lease, *autonomous* after. A
decision's label asks more (:meth:`CentralLink.live`): the broker link up and no more than
three of central's heartbeat intervals missed, so a decision made in the first seconds of a
cut, inside the lease, is labelled ``edge-autonomous``.

Topics are versioned: ``edgesched/v1/central/heartbeat`` (central → nodes) and
``edgesched/v1/node/<node_id>/status`` (retained, node → everyone).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.config import MqttConfig
from edgesched.sync.session import publish
from edgesched.sync.topics import HEARTBEAT_TOPIC, parse_heartbeat, status_topic

log = logging.getLogger("edgesched.edge.link")

#: Heartbeats missed before a decision is no longer labelled connected (see CentralLink.live).
MISSED_BEATS = 3.0
#: Gaps between heartbeats kept, for their median when central does not say its interval.
HEARTBEAT_GAPS_KEPT = 8
#: What a heartbeat's ``every_s`` is clamped to (a central cannot make us judge in 1 µs).
MIN_BEAT_S = 0.05
MAX_BEAT_S = 60.0

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
        #: the gaps between central's last heartbeats as we heard them (this clock)
        self.gaps: deque[float] = deque(maxlen=HEARTBEAT_GAPS_KEPT)
        #: the interval central says it beats at (``every_s`` in its heartbeat), if it says
        self.every_s: float | None = None
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

    def beat_s(self) -> float | None:
        """How often central's heartbeat comes: what central says (``every_s``), else the
        median of the gaps heard; None before either is known."""
        if self.every_s is not None:
            return self.every_s
        if len(self.gaps) < 2:
            return None
        return statistics.median(self.gaps)

    def live(self, lease_s: float) -> bool:
        """Whether central hears us now, as far as we can tell: the broker link is up and
        central's heartbeat came within ``MISSED_BEATS`` of its intervals (at most the
        lease). The lease keeps the node following central through a blip; a decision's
        label asks this instead, so a decision made in the first seconds of a cut is not
        called connected (it was made when central could not know of it)."""
        if not self.broker_connected or self.last_heard is None:
            return False
        beat = self.beat_s()
        window = lease_s if beat is None else min(lease_s, MISSED_BEATS * beat)
        return self.clock() - self.last_heard <= window

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
        now = self.clock()
        if self.last_heard is not None and now > self.last_heard:
            self.gaps.append(now - self.last_heard)
        every = beat.get("every_s")
        if isinstance(every, int | float) and not isinstance(every, bool):
            self.every_s = min(MAX_BEAT_S, max(MIN_BEAT_S, float(every)))
        self.last_heard = now
        if self.on_heartbeat is not None:
            self.on_heartbeat(beat)
