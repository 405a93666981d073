"""Prometheus metrics of the central engine, on a registry of its own (served at /metrics).

Prometheus conventions (docs/metrics.md lists every series and the renames): base units, a
counter for anything that only grows (exposed with ``_total``), a gauge for what goes up and
down, every label from a fixed set of values (no node id: a fleet has thousands). The counts the
engine keeps itself (refused input, nodes by state) are handed over at scrape time
(:meth:`CentralMetrics.scrape`) and exposed by collectors, never copied into gauges one label
at a time. ``_created`` series are off (see :mod:`edgesched.edge.metrics`).

``edgesched_central_nodes{state}`` counts the nodes central holds a replica of by the state
``GET /v1/nodes`` names (:meth:`edgesched.central.engine.CentralEngine.node_state`): every
state is always present (0 when none), so ``edgesched_central_nodes{state="partitioned"} > 0``
is an alert and the sum over ``state`` is the fleet's size.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import disable_created_metrics

from edgesched.central.liveness import NodeStatus

disable_created_metrics()  # type: ignore[no-untyped-call]  # (untyped in 0.26)

#: The states of ``edgesched_central_nodes``, as ``GET /v1/nodes`` and ``edgesched nodes``
#: name them.
NODE_STATES = ("connected", "suspect", "partitioned", "dead", "unknown")


def node_state_counts(
    replicas: Collection[str],
    liveness: Mapping[str, NodeStatus],
    now: float,
    failover_after_s: float,
    dead_after_s: float,
) -> dict[str, int]:
    """How many of ``replicas`` are in each of :data:`NODE_STATES` at ``now``, by the rule of
    :meth:`~edgesched.central.engine.CentralEngine.node_state`: online is connected; offline
    less than ``failover_after_s`` suspect, less than ``dead_after_s`` partitioned, then dead;
    no status heard unknown. One pass over the statuses, no per-node objects (about 1 ms at
    10,000 nodes: docs/metrics.md)."""
    counts = dict.fromkeys(NODE_STATES, 0)
    suspect_after = now - failover_after_s
    dead_at = now - dead_after_s
    connected = suspect = partitioned = dead = 0
    for node_id, status in liveness.items():
        if node_id not in replicas:
            continue
        if status.state == "online":
            connected += 1
        elif status.since > suspect_after:
            suspect += 1
        elif status.since > dead_at:
            partitioned += 1
        else:
            dead += 1
    counts["connected"], counts["suspect"] = connected, suspect
    counts["partitioned"], counts["dead"] = partitioned, dead
    counts["unknown"] = len(replicas) - connected - suspect - partitioned - dead
    return counts


class _ScrapeCollector:
    """The counts handed over at scrape time, as one gauge (node states) and two counters
    (rejected and refused input: they only grow while central runs)."""

    def __init__(self) -> None:
        self.nodes: Mapping[str, int] = dict.fromkeys(NODE_STATES, 0)
        self.rejected: Mapping[str, int] = {}
        self.refused: Mapping[str, Mapping[str, int]] = {}

    def collect(self) -> Iterable[Metric]:
        nodes = GaugeMetricFamily(
            "edgesched_central_nodes",
            "Nodes central holds a replica of, by state (connected; offline: suspect under "
            "failover_after_s, partitioned under dead_after_s, then dead; unknown: no status "
            "heard yet)",
            labels=["state"],
        )
        for state in NODE_STATES:
            nodes.add_metric([state], self.nodes.get(state, 0))
        yield nodes
        rejected = CounterMetricFamily(
            "edgesched_central_rejected",
            "Messages refused since start, by reason (as /v1/status's rejected)",
            labels=["reason"],
        )
        for reason, count in sorted(self.rejected.items()):
            rejected.add_metric([reason], count)
        yield rejected
        refused = CounterMetricFamily(
            "edgesched_central_refused",
            "Input refused since start, by channel (node, policy, fleet, desired, status, "
            "telemetry) and reason (frame, payload, update, sender, authorship, epoch, schema, "
            "malformed, unknown_document)",
            labels=["channel", "reason"],
        )
        for channel, reasons in sorted(self.refused.items()):
            for reason, count in sorted(reasons.items()):
                refused.add_metric([channel, reason], count)
        yield refused


class CentralMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._scraped = _ScrapeCollector()
        r.register(self._scraped)
        self.online = Gauge(
            "edgesched_central_nodes_online",
            "Nodes whose status central reads online (a node may announce before its first "
            "document: edgesched_central_nodes counts replicas)",
            registry=r,
        )
        self.broker_connected = Gauge(
            "edgesched_central_broker_connected",
            "1 while central's MQTT session with its broker is up, 0 otherwise",
            registry=r,
        )
        self.events = Counter(
            "edgesched_central_events_total",
            "Fleet events by kind (node-online, node-offline, placed, failover, ...: "
            "GET /v1/events)",
            ["kind"],
            registry=r,
        )
        self.snapshots = Counter(
            "edgesched_central_replica_snapshots_total",
            "Replica snapshots written to SQLite",
            registry=r,
        )
        self.model_fallbacks = Counter(
            "edgesched_central_model_fallbacks_total",
            "Model fallbacks: a file refused at load, an upload or peer's swap refused, or one "
            "forecast or placement served by the heuristic; by model kind and stage",
            ["kind", "stage"],
            registry=r,
        )
        self.forecast = Gauge(
            "edgesched_central_forecast_cpu_cores",
            "Fleet CPU cores forecast as the peak of the next 15 min (per-class model)",
            registry=r,
        )
        self.docs_frozen = Gauge(
            "edgesched_central_docs_frozen",
            "Documents held as their encoded state only (unused for cold_after_s)",
            registry=r,
        )
        self.docs_frozen_bytes = Gauge(
            "edgesched_central_docs_frozen_bytes",
            "Encoded bytes of the frozen documents",
            registry=r,
        )
        self.docs_live = Gauge(
            "edgesched_central_docs_live", "Watched documents held live", registry=r
        )
        self.doc_thaws = Counter(
            "edgesched_central_doc_thaws_total", "Frozen documents thawed by a use", registry=r
        )

    def scrape(
        self,
        *,
        nodes: Mapping[str, int],
        online: int,
        broker_connected: bool,
        rejected: Mapping[str, int],
        refused: Mapping[str, Mapping[str, int]],
    ) -> None:
        """What the engine knows at scrape time: nodes by state (:func:`node_state_counts`),
        nodes online, its broker link, and its refusal counts."""
        self._scraped.nodes = nodes
        self._scraped.rejected = rejected
        self._scraped.refused = refused
        self.online.set(online)
        self.broker_connected.set(1 if broker_connected else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
