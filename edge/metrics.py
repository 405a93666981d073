"""Prometheus metrics of the edge sub-engine, on a registry of its own (served at /metrics).

Prometheus conventions (docs/metrics.md lists every series and the renames): base units
(bytes, seconds, watts, ratios 0-1), a counter for anything that only grows (exposed with
``_total``; prometheus-client adds the suffix), a gauge for what goes up and down, every label
from a fixed set of values. Counts the engine keeps itself (refused messages) are read at
scrape time and exposed as counters by a collector, never copied into gauges. The ``_created``
series prometheus-client adds to each counter are off: Prometheus' text format carries them
as separate gauges nobody reads, doubling the counters' series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.metrics import disable_created_metrics

from edgesched.edge.agent import GIB, Sample

disable_created_metrics()  # type: ignore[no-untyped-call]  # (untyped in 0.26)

#: The refusal counts' labels: channel (node: our document, policy, desired) and reason.
REFUSED_HELP = (
    "Document messages refused since start, by channel (node: our document, policy, desired) "
    "and reason (frame, payload, update, sender, authorship, signature, replay, epoch, schema)"
)


class RefusedCollector:
    """``edgesched_edge_refused_total{channel,reason}``: the engine's own refusal counts
    (reset at a restart, as a counter may be), handed over before each render."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name, self.documentation = name, documentation
        self.counts: Mapping[str, Mapping[str, int]] = {}

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=["channel", "reason"])
        for channel, reasons in sorted(self.counts.items()):
            for reason, count in sorted(reasons.items()):
                family.add_metric([channel, reason], count)
        yield family


class EdgeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.mode = Gauge(
            "edgesched_edge_mode",
            "1 for the mode the node is in (connected, autonomous), 0 for the other",
            ["mode"],
            registry=r,
        )
        self.mode_changes = Counter(
            "edgesched_edge_mode_changes_total",
            "Mode changes, by the mode entered",
            ["mode"],
            registry=r,
        )
        self.power_errors = Counter(
            "edgesched_edge_power_errors_total",
            "Park or wake commands that failed (the node stayed as it was), by stage",
            ["stage"],
            registry=r,
        )
        self.tasks = Gauge(
            "edgesched_edge_tasks",
            "Tasks in this node's store, by state (finished ones until the history prunes them)",
            ["state"],
            registry=r,
        )
        self.submissions = Counter(
            "edgesched_edge_submissions_total", "Submissions accepted", registry=r
        )
        self.decisions = Counter(
            "edgesched_edge_decisions_total",
            "Scheduling decisions this node made, by whether central could know of them "
            "(edge-connected: within the lease; edge-autonomous: cut off)",
            ["source"],
            registry=r,
        )
        self.starts = Counter(
            "edgesched_edge_task_starts_total", "Task processes started", registry=r
        )
        self.start_failures = Counter(
            "edgesched_edge_task_start_failures_total",
            "Task processes that failed to start",
            registry=r,
        )
        self.exits = Counter(
            "edgesched_edge_task_exits_total",
            "Task process exits, by result (success, failure)",
            ["result"],
            registry=r,
        )
        self.site_errors = Counter(
            "edgesched_edge_site_errors_total",
            "Site cycles that failed (the node scheduled alone that cycle)",
            registry=r,
        )
        self.site_elections = Counter(
            "edgesched_edge_site_terms_total",
            "Terms this node began as its cut-off site's coordinator",
            registry=r,
        )
        self.restarts = Counter(
            "edgesched_edge_task_restarts_total",
            "Task restarts by restart policy",
            registry=r,
        )
        self.preemptions = Counter(
            "edgesched_edge_preemptions_total", "Tasks preempted", registry=r
        )
        self.recovered = Counter(
            "edgesched_edge_recovered_tasks_total",
            "Tasks found at start-up, by how they were recovered (adopted alive, requeued)",
            ["how"],
            registry=r,
        )
        self.store_errors = Counter(
            "edgesched_edge_store_errors_total",
            "SQLite store writes that failed, by kind (full: the disk or quota is full; "
            "error: any other)",
            ["kind"],
            registry=r,
        )
        self.cpu = Gauge(
            "edgesched_edge_cpu_utilization_ratio",
            "CPU utilization of the whole node, 0 to 1, at the last sample",
            registry=r,
        )
        self.power = Gauge(
            "edgesched_edge_power_watts",
            "Node power draw at the last sample, by where it came from (rapl, hwmon: "
            "measured; model: estimated from utilization)",
            ["source"],
            registry=r,
        )
        self.mem_used = Gauge(
            "edgesched_edge_memory_used_bytes",
            "Memory in use (total minus available) at the last sample",
            registry=r,
        )
        self.mem_total = Gauge(
            "edgesched_edge_memory_total_bytes", "Memory installed, at the last sample", registry=r
        )
        self.forecast = Gauge(
            "edgesched_edge_forecast_cpu_cores",
            "Peak CPU cores forecast for the next 15 min",
            registry=r,
        )
        self.model_fallbacks = Counter(
            "edgesched_edge_model_fallbacks_total",
            "Model fallbacks: a file refused at load, a swap from central refused, or one "
            "forecast or placement served by the heuristic; by model kind and stage",
            ["kind", "stage"],
            registry=r,
        )
        self.broker_connected = Gauge(
            "edgesched_edge_broker_connected",
            "1 while the node's MQTT session with its broker is up, 0 otherwise",
            registry=r,
        )
        self.refused = RefusedCollector("edgesched_edge_refused", REFUSED_HELP)
        r.register(self.refused)
        self._power_source: str | None = None

    def observe(self, sample: Sample) -> None:
        self.cpu.set(sample.cpu_total)
        if sample.power_source != self._power_source:  # one series: the source now in use
            self.power.clear()
            self._power_source = sample.power_source
        self.power.labels(sample.power_source).set(sample.power_w)
        self.mem_used.set(round(sample.mem_used_gib * GIB))
        self.mem_total.set(round(sample.mem_total_gib * GIB))

    def scrape(self, *, broker_connected: bool, refused: Mapping[str, Mapping[str, int]]) -> None:
        """What the engine knows at scrape time (read by the API's ``/metrics``)."""
        self.broker_connected.set(1 if broker_connected else 0)
        self.refused.counts = refused

    def render(self) -> bytes:
        return generate_latest(self.registry)
