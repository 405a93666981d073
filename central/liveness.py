"""Which nodes are up, as the broker tells it: the retained status and last-will messages.

A channel of central's session subscribed to ``edgesched/v1/node/+/status``. Each node
publishes a retained ``{"node": <id>, "state": "online"}`` on connect, and the broker
publishes its retained last will ``{"node": <id>, "state": "offline"}`` when the node's
connection dies (keepalive missed, TCP reset). Central learns of a partition from the will,
within about 1.5 keepalives. A payload that is not such an object, or that names another node
than its topic, is dropped and counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import Listener
from edgesched.sync.topics import STATUS_FILTER, json_object, node_of_status_topic

log = logging.getLogger("edgesched.central.liveness")

STATES = ("online", "offline")
MAX_STATUS_BYTES = 1024


@dataclass(frozen=True)
class NodeStatus:
    state: str  # "online" | "offline"
    since: float  # central's clock when it learned it


def parse_status(topic: str, payload: bytes) -> tuple[str, str]:
    """``(node_id, state)`` from a status message; ValueError says what is wrong with it."""
    node_id = node_of_status_topic(topic)
    if node_id is None:
        raise ValueError(f"not a status topic: {topic}")
    data = json_object(payload, "status", MAX_STATUS_BYTES)
    if data.get("state") not in STATES:
        raise ValueError(f"status must be an object with state in {STATES}")
    if data.get("node") != node_id:
        raise ValueError(f"status on {node_id}'s topic names {data.get('node')!r}")
    return node_id, str(data["state"])


class Liveness(Listener):
    """The latest status of every node that announced one."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.nodes: dict[str, NodeStatus] = {}
        self.rejected = 0
        self.on_change: Callable[[str, NodeStatus], None] | None = None
        self.routes: tuple[str, ...] = (STATUS_FILTER,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (STATUS_FILTER, SubscribeOptions(qos=1)),
        )

    def state(self, node_id: str) -> str:
        status = self.nodes.get(node_id)
        return "unknown" if status is None else status.state

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            node_id, state = parse_status(topic, payload)
        except ValueError as exc:
            self.rejected += 1
            log.warning("dropped status message: %s", exc)
            return
        old = self.nodes.get(node_id)
        if old is not None and old.state == state:
            return
        status = NodeStatus(state, self.clock())
        self.nodes[node_id] = status
        log.info("node %s is %s", node_id, state)
        if self.on_change is not None:
            self.on_change(node_id, status)
