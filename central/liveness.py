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

The will is not always there: on a clustered broker (docs/brokers.md) a node's will is lost
when the member it was connected to dies or is cut off, so the node would read online for as
long as the outage lasts. Hence a second signal, the node's silence: central tells
:meth:`Liveness.heard` of every message of a node it receives (its document sync, its
telemetry; an ``online`` status counts by itself), and :meth:`Liveness.sweep`, called every
control step, turns a node whose status says online but that has not been heard for more than
``silent_after_s`` offline, since it was last heard. A silent node heard again, or announcing
``online`` again, is online again. While central's own connection is down nobody is swept
(nobody could be heard), and on connect every node starts its ``silent_after_s`` over. Each
:class:`NodeStatus` says why it is what it is (``cause``: ``status`` or ``heard`` when online;
``will``, ``site`` or ``silent`` when offline), so the API can tell a will from a silence.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import Channel, Listener
from edgesched.sync.topics import (
    SITE_BRIDGE_FILTER,
    STATUS_FILTER,
    json_object,
    node_of_status_topic,
    site_of_bridge_topic,
)

if TYPE_CHECKING:
    import aiomqtt

log = logging.getLogger("edgesched.central.liveness")

STATES = ("online", "offline")
MAX_STATUS_BYTES = 1024
#: Why a node reads what it reads (:attr:`NodeStatus.cause`).
CAUSES = ("status", "heard", "will", "site", "silent")
#: The default of ``[central] silent_after_s`` (see :class:`edgesched.config.CentralConfig`,
#: which says why 20 s).
SILENT_AFTER_S = 20.0
#: Nodes a sweep names one by one in the log; the rest of a larger sweep in one line.
LOGGED_PER_SWEEP = 20


@dataclass(frozen=True)
class NodeStatus:
    state: str  # "online" | "offline"
    since: float  # central's clock when it learned it (a silent node: when it was last heard)
    #: "status": its own retained online status; "heard": a message of it after a silence;
    #: "will": its status says offline (its last will, or its own goodbye); "site": its
    #: site's bridge dropped; "silent": nothing heard for more than ``silent_after_s``. An
    #: offline node's cause follows the reason that holds now (a will arriving after a
    #: silence makes it "will"), its ``since`` stays when it went offline.
    cause: str = "status"


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
    """The latest status of every node that announced one, and whether it went silent.

    ``silent_after_s`` (0 disables the silence signal): see the module docstring. ``heard``
    and ``sweep`` take times of ``clock`` (central's clock). ``sweep`` costs O(nodes it turns
    offline + 1): the online nodes are kept in the order they were last heard, oldest first.
    That order is exact when ``heard`` is told times in order (central's clock, as messages
    arrive); a time older than the newest already told delays the sweep of the nodes heard
    between the two by at most that difference, never turns a node offline early.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        site_of: Callable[[str], str | None] = lambda _node: None,
        *,
        silent_after_s: float = SILENT_AFTER_S,
    ) -> None:
        if not (math.isfinite(silent_after_s) and silent_after_s >= 0):
            raise ValueError(f"silent_after_s must be finite and >= 0, got {silent_after_s}")
        self.clock = clock
        self.site_of = site_of
        self.silent_after_s = silent_after_s
        self.nodes: dict[str, NodeStatus] = {}  # what central believes, sites' bridges included
        self.reported: dict[str, str] = {}  # what each node's own status says
        self.sites_down: dict[str, float] = {}  # site -> when its bridge dropped
        #: node -> when central last heard any message of it (its online status included)
        self.heard_at: dict[str, float] = {}
        #: node -> since when it is silent (swept, not heard since)
        self.silent: dict[str, float] = {}
        #: the nodes central believes online -> their last sign of life (heard, or turned
        #: online), in that order, oldest first: what :meth:`sweep` walks from the front
        self._watch: dict[str, float] = {}
        #: central's own connection is down (this channel's session said so): nobody can be
        #: heard, so nobody is silent; the sweep waits, and every node starts over on connect
        self.link_down = False
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

    async def serve(self, client: aiomqtt.Client) -> None:
        """Connected (again): every node that reads online gets a fresh ``silent_after_s``
        from now; the retained statuses arrive anew with the subscription."""
        if self.link_down:
            self.start_over(self.clock())
        self.link_down = False

    def disconnected(self) -> None:
        self.link_down = True

    def start_over(self, now: float) -> None:
        """Central could not hear anyone until ``now`` (its connection was down, or its event
        loop was held and messages waited unread): every node that reads online gets a fresh
        ``silent_after_s`` from ``now``. O(online nodes)."""
        self._watch = dict.fromkeys(self._watch, now)

    def cause(self, node_id: str) -> str | None:
        """Why ``node_id`` reads what it reads (:data:`CAUSES`), None if never announced."""
        status = self.nodes.get(node_id)
        return None if status is None else status.cause

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
        if state == "online":  # the node speaking (an offline status is the broker's will)
            self.silent.pop(node_id, None)
            self._hear(node_id, self.clock())
        else:
            self.silent.pop(node_id, None)  # the will explains it now
        self._settle(node_id)

    # --- silence: the signal that needs no last will -----------------------------------------

    def heard(self, node_id: str, at: float) -> None:
        """A message of ``node_id`` arrived at ``at`` (central's clock): its document sync,
        its telemetry, anything only the node sends. A node that is silent comes back online
        (``cause="heard"``, since ``at``); a node offline for any other reason stays so (its
        status, or its site's bridge, decides). O(1)."""
        if not self._hear(node_id, at):
            return
        silent = self.silent.get(node_id)
        if silent is not None and at > silent:
            del self.silent[node_id]
            self._settle(node_id, at=at)

    def sweep(self, now: float) -> list[str]:
        """Turn every node that reads online but was not heard for more than
        ``silent_after_s`` before ``now`` offline (``cause="silent"``, since it was last
        heard), telling ``on_change`` of each; return their ids, oldest silence first.
        Nothing while central's own connection is down (:attr:`link_down`)."""
        if self.silent_after_s <= 0 or self.link_down:
            return []
        cutoff = now - self.silent_after_s
        swept: list[str] = []
        while self._watch:
            node_id, last = next(iter(self._watch.items()))
            if last >= cutoff:
                break
            del self._watch[node_id]
            self.silent[node_id] = last
            if len(swept) < LOGGED_PER_SWEEP:
                log.warning(
                    "node %s: nothing heard for %.1f s (its status says online)",
                    node_id,
                    now - last,
                )
            self._settle(node_id)
            swept.append(node_id)
        if len(swept) > LOGGED_PER_SWEEP:
            log.warning(
                "%d more nodes: nothing heard for more than %.1f s (their status says online)",
                len(swept) - LOGGED_PER_SWEEP,
                self.silent_after_s,
            )
        return swept

    def _hear(self, node_id: str, at: float) -> bool:
        """Record a sign of life; False if ``at`` is not newer than the last one."""
        last = self.heard_at.get(node_id)
        if last is not None and at <= last:
            return False
        self.heard_at[node_id] = at
        if node_id in self._watch:
            del self._watch[node_id]  # to the back: the newest sign of life
            self._watch[node_id] = at
        return True

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
                if up:
                    self.silent.pop(node_id, None)  # its silence was the bridge's: start over
                self._settle(node_id)

    def _settle(self, node_id: str, *, at: float | None = None) -> None:
        """Recompute what central believes of ``node_id``; tell ``on_change`` if it moved.

        ``at``: the node was heard then (it comes back from a silence)."""
        reported = self.reported.get(node_id, "offline")
        down = self.sites_down.get(self.site_of(node_id) or "")
        silent = self.silent.get(node_id)
        if down is not None:
            state, since, cause = "offline", down, "site"
        elif reported != "online":
            state, since, cause = "offline", self.clock(), "will"
        elif silent is not None:
            state, since, cause = "offline", silent, "silent"
        else:
            state, since = "online", self.clock() if at is None else at
            cause = "status" if at is None else "heard"
        old = self.nodes.get(node_id)
        if old is not None and old.state == state:
            if state == "offline" and old.cause != cause:
                # still offline, for another reason now (a will after a silence): say so, and
                # keep since when (failover counts from it); not a change to tell
                self.nodes[node_id] = NodeStatus(state, old.since, cause)
            return
        status = NodeStatus(state, since, cause)
        self.nodes[node_id] = status
        if state == "online":
            # a fresh start: silent_after_s from now (or from when it was heard, if later)
            self._watch.pop(node_id, None)
            self._watch[node_id] = max(since, self.heard_at.get(node_id, since))
        else:
            self._watch.pop(node_id, None)
        log.info("node %s is %s (%s)", node_id, state, cause)
        if self.on_change is not None:
            self.on_change(node_id, status)


class Hearing:
    """A channel that is ``inner`` and also tells ``liveness`` that a node spoke: every message
    on a topic ``node_of`` maps to a node id (say ``edgesched/v1/node/<id>/telemetry``, which
    only the node may publish) is :meth:`Liveness.heard` at ``liveness.clock()`` before
    ``inner`` handles it. Add it to the session in place of ``inner``."""

    def __init__(
        self, inner: Channel, liveness: Liveness, node_of: Callable[[str], str | None]
    ) -> None:
        self.inner = inner
        self.liveness = liveness
        self.node_of = node_of
        self.routes: tuple[str, ...] = inner.routes
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = inner.subscriptions

    async def serve(self, client: aiomqtt.Client) -> None:
        await self.inner.serve(client)

    def handle(self, topic: str, payload: bytes) -> None:
        node_id = self.node_of(topic)
        if node_id is not None:
            self.liveness.heard(node_id, self.liveness.clock())
        self.inner.handle(topic, payload)

    def disconnected(self) -> None:
        self.inner.disconnected()
