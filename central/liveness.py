"""Which nodes are up, as the broker tells it: the retained status and last-will messages.

A channel of central's session subscribed to ``edgesched/v1/node/+/status``. Each node
publishes a retained ``{"node": <id>, "state": "online"}`` on connect, and the broker
publishes its retained last will ``{"node": <id>, "state": "offline"}`` when the node's
connection dies (keepalive missed, TCP reset). Central learns of a partition from the will,
within about 1.5 keepalives. A payload that is not such an object, or that names another node
than its topic, is dropped and counted.

Nodes of a site behind its own broker (bridged to central's) keep a live session with *their*
broker when the site's WAN link is cut, so no will fires for them. The bridge's notification
(``site/<site>/bridge``: retained ``1`` while up, the bridge's will ``0`` when it drops) tells
central instead: while a site's bridge is down, every node that registered that site
(``site_of``) reads *offline*, since the moment the bridge dropped; when it is back, each reads
as its own last status again (and central asks it for a resync).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import Listener
from edgesched.sync.topics import (
    SITE_BRIDGE_FILTER,
    STATUS_FILTER,
    json_object,
    node_of_status_topic,
    site_of_bridge_topic,
)

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

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        site_of: Callable[[str], str | None] = lambda _node: None,
    ) -> None:
        self.clock = clock
        self.site_of = site_of
        self.nodes: dict[str, NodeStatus] = {}  # what central believes, sites' bridges included
        self.reported: dict[str, str] = {}  # what each node's own status says
        self.sites_down: dict[str, float] = {}  # site -> when its bridge dropped
        self.rejected = 0
        self.on_change: Callable[[str, NodeStatus], None] | None = None
        self.routes: tuple[str, ...] = (STATUS_FILTER, SITE_BRIDGE_FILTER)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (STATUS_FILTER, SubscribeOptions(qos=1)),
            (SITE_BRIDGE_FILTER, SubscribeOptions(qos=1)),
        )

    def state(self, node_id: str) -> str:
        status = self.nodes.get(node_id)
        return "unknown" if status is None else status.state

    def handle(self, topic: str, payload: bytes) -> None:
        site = site_of_bridge_topic(topic)
        if site is not None:
            self._bridge(site, payload)
            return
        try:
            node_id, state = parse_status(topic, payload)
        except ValueError as exc:
            self.rejected += 1
            log.warning("dropped status message: %s", exc)
            return
        self.reported[node_id] = state
        self._settle(node_id)

    def _bridge(self, site: str, payload: bytes) -> None:
        if payload.strip() not in (b"0", b"1"):
            self.rejected += 1
            log.warning("dropped bridge notification of site %s: %r", site, payload[:32])
            return
        up = payload.strip() == b"1"
        if up == (site not in self.sites_down):
            return
        if up:
            del self.sites_down[site]
            log.warning("site %s: its bridge to central's broker is back", site)
        else:
            self.sites_down[site] = self.clock()
            log.warning("site %s: its bridge to central's broker dropped", site)
        for node_id in sorted(self.reported):
            if self.site_of(node_id) == site:
                self._settle(node_id)

    def _settle(self, node_id: str) -> None:
        """Recompute what central believes of ``node_id``; tell ``on_change`` if it moved."""
        state = self.reported.get(node_id, "offline")
        down = self.sites_down.get(self.site_of(node_id) or "")
        if down is not None:
            state = "offline"
        old = self.nodes.get(node_id)
        if old is not None and old.state == state:
            return
        status = NodeStatus(state, down if down is not None else self.clock())
        self.nodes[node_id] = status
        log.info("node %s is %s", node_id, state)
        if self.on_change is not None:
            self.on_change(node_id, status)
