"""Prometheus metrics of the central engine, on a registry of its own (served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class CentralMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.nodes = Gauge("edgesched_central_nodes", "Node replicas held", registry=r)
        self.online = Gauge("edgesched_central_nodes_online", "Nodes announcing online", registry=r)
        self.broker_connected = Gauge(
            "edgesched_central_broker_connected", "1 while central's MQTT session is up", registry=r
        )
        self.rejected = Gauge(
            "edgesched_central_rejected",
            "Messages refused since start, by reason",
            ["reason"],
            registry=r,
        )
        self.refused = Gauge(
            "edgesched_central_refused",
            "Input refused since start, by channel (node, policy, fleet, desired, status, "
            "telemetry) and reason (frame, payload, update, sender, authorship, epoch, schema, "
            "malformed, unknown_document)",
            ["channel", "reason"],
            registry=r,
        )
        self.events = Counter(
            "edgesched_central_events", "Fleet events by kind", ["kind"], registry=r
        )
        self.snapshots = Counter(
            "edgesched_central_replica_snapshots", "Replica snapshots written", registry=r
        )
        self.model_fallbacks = Counter(
            "edgesched_central_model_fallbacks",
            "Model fallbacks: a file refused at load, an upload or peer's swap refused, or one "
            "forecast or placement served by the heuristic",
            ["kind", "stage"],
            registry=r,
        )
        self.forecast = Gauge(
            "edgesched_central_forecast_cpu",
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
            "edgesched_central_doc_thaws", "Frozen documents thawed by a use", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
