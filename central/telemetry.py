"""Central's telemetry collector: the latest hour of every node's samples, in memory.

A channel of central's session subscribed to ``edgesched/v1/node/+/telemetry`` (QoS 0). A
sample whose topic names a node central does not hold a document for is still kept (a node's
telemetry may arrive before its document), up to ``max_nodes``; malformed ones are dropped and
counted. The dashboard and ``GET /v1/nodes/{id}/telemetry`` read it.
"""

from __future__ import annotations

import logging
from collections import deque

from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import Listener
from edgesched.sync.telemetry import TELEMETRY_FILTER, Telemetry, parse_telemetry

log = logging.getLogger("edgesched.central.telemetry")


class TelemetryCollector(Listener):
    """Per-node ring buffers of :class:`Telemetry` samples."""

    def __init__(self, *, keep: int = 720, max_nodes: int = 10_000) -> None:
        self.keep = keep
        self.max_nodes = max_nodes
        self.series: dict[str, deque[Telemetry]] = {}
        self.rejected = 0
        self.routes: tuple[str, ...] = (TELEMETRY_FILTER,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (TELEMETRY_FILTER, SubscribeOptions(qos=0)),
        )

    def latest(self, node_id: str) -> Telemetry | None:
        series = self.series.get(node_id)
        return series[-1] if series else None

    def samples(self, node_id: str, since: float = 0.0) -> list[Telemetry]:
        return [s for s in self.series.get(node_id, ()) if s.at >= since]

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            node_id, sample = parse_telemetry(topic, payload)
        except ValueError as exc:
            self.rejected += 1
            log.debug("dropped telemetry: %s", exc)
            return
        series = self.series.get(node_id)
        if series is None:
            if len(self.series) >= self.max_nodes:
                self.rejected += 1
                return
            series = self.series[node_id] = deque(maxlen=self.keep)
        if series and sample.at < series[-1].at:
            return  # out of order (QoS 0 after a reconnect): the newer one is kept
        series.append(sample)
