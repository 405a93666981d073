"""The edge node's link to central over MQTT: hear central's heartbeat, announce our status.

One :class:`CentralLink` per node. Its :meth:`run` task keeps an aiomqtt client connected to
the broker (reconnecting with exponential backoff, jitter and a cap; aiomqtt has no
reconnect of its own), publishes a retained ``online`` status with a retained ``offline``
last will, and records when it last heard central's heartbeat. The engine turns that into
its mode: *connected* while central was heard within the lease, *autonomous* after.

Topics are versioned: ``edgesched/v1/central/heartbeat`` (central → nodes) and
``edgesched/v1/node/<node_id>/status`` (retained, node → everyone).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable

import aiomqtt

from edgesched.config import MqttConfig
from edgesched.sync.session import checked, reraise_if_cancelling

log = logging.getLogger("edgesched.edge.link")

TOPIC_ROOT = "edgesched/v1"
HEARTBEAT_TOPIC = f"{TOPIC_ROOT}/central/heartbeat"
#: A heartbeat larger than this is not a heartbeat.
MAX_HEARTBEAT_BYTES = 4096


def status_topic(node_id: str) -> str:
    return f"{TOPIC_ROOT}/node/{node_id}/status"


def parse_heartbeat(payload: bytes) -> dict[str, object]:
    """A heartbeat is a small JSON object naming the central that sent it; else ValueError."""
    if len(payload) > MAX_HEARTBEAT_BYTES:
        raise ValueError(f"heartbeat of {len(payload)} bytes exceeds {MAX_HEARTBEAT_BYTES}")
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"heartbeat is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("central"), str):
        raise ValueError("heartbeat must be a JSON object with a string 'central'")
    return data


class CentralLink:
    """Keeps the MQTT session up and tracks central's heartbeat; owned by the engine."""

    def __init__(
        self,
        node_id: str,
        mqtt: MqttConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.node_id = node_id
        self.mqtt = mqtt
        self.clock = clock
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.last_heard: float | None = None
        self.broker_connected = False
        self.rejected_heartbeats = 0
        self.connects = 0
        self.on_heartbeat: Callable[[dict[str, object]], None] | None = None

    def heard_within(self, lease_s: float) -> bool:
        return self.last_heard is not None and self.clock() - self.last_heard <= lease_s

    def _status(self, state: str) -> bytes:
        return json.dumps({"node": self.node_id, "state": state}).encode()

    def _client(self) -> aiomqtt.Client:
        return aiomqtt.Client(
            self.mqtt.host,
            self.mqtt.port,
            identifier=self.node_id,
            keepalive=self.mqtt.keepalive_s,
            protocol=aiomqtt.ProtocolVersion.V5,
            timeout=max(2.0, float(self.mqtt.keepalive_s)),
            will=aiomqtt.Will(
                status_topic(self.node_id), self._status("offline"), qos=1, retain=True
            ),
        )

    async def run(self) -> None:
        """Forever: connect, listen, and on any MQTT error back off and reconnect."""
        delay = self.backoff_initial_s
        while True:
            try:
                async with self._client() as client:
                    self.broker_connected = True
                    self.connects += 1
                    delay = self.backoff_initial_s
                    log.info("connected to broker %s:%d", self.mqtt.host, self.mqtt.port)
                    await checked(
                        client.publish(
                            status_topic(self.node_id), self._status("online"), qos=1, retain=True
                        )
                    )
                    await checked(client.subscribe(HEARTBEAT_TOPIC, qos=1))
                    async for message in client.messages:
                        self._handle(message.payload)
            except aiomqtt.MqttError as exc:
                # aiomqtt's __aexit__ may turn a cancel into an MqttError (its graceful
                # disconnect timed out): never let that swallow our cancellation.
                reraise_if_cancelling()
                if self.broker_connected:
                    log.warning("lost broker %s:%d: %s", self.mqtt.host, self.mqtt.port, exc)
                else:
                    log.debug("broker %s:%d unreachable: %s", self.mqtt.host, self.mqtt.port, exc)
            finally:
                self.broker_connected = False
            # Full jitter keeps a fleet that lost its broker together from reconnecting together.
            await asyncio.sleep(random.uniform(0, delay))
            delay = min(delay * 2, self.backoff_max_s)

    def _handle(self, payload: object) -> None:
        if not isinstance(payload, bytes | bytearray):
            self.rejected_heartbeats += 1
            log.warning("dropped heartbeat: payload of type %s", type(payload).__name__)
            return
        try:
            beat = parse_heartbeat(bytes(payload))
        except ValueError as exc:
            self.rejected_heartbeats += 1
            log.warning("dropped heartbeat: %s", exc)
            return
        self.last_heard = self.clock()
        if self.on_heartbeat is not None:
            self.on_heartbeat(beat)
