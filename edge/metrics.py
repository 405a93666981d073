"""Prometheus metrics of the edge sub-engine, on a registry of its own (served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from edgesched.edge.agent import Sample


class EdgeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.mode = Gauge("edgesched_edge_mode", "1 for the current mode", ["mode"], registry=r)
        self.mode_changes = Counter(
            "edgesched_edge_mode_changes", "Mode changes, by the mode entered", ["mode"], registry=r
        )
        self.power_errors = Counter(
            "edgesched_edge_power_errors",
            "Park or wake commands that failed (the node stayed as it was)",
            ["stage"],
            registry=r,
        )
        self.tasks = Gauge(
            "edgesched_edge_tasks", "Tasks on this node by state", ["state"], registry=r
        )
        self.submissions = Counter("edgesched_edge_submissions", "Accepted submissions", registry=r)
        self.decisions = Counter(
            "edgesched_edge_decisions", "Decisions made, by who made them", ["source"], registry=r
        )
        self.starts = Counter("edgesched_edge_task_starts", "Task processes started", registry=r)
        self.start_failures = Counter(
            "edgesched_edge_task_start_failures", "Task processes that failed to start", registry=r
        )
        self.exits = Counter("edgesched_edge_task_exits", "Task exits", ["result"], registry=r)
        self.site_errors = Counter(
            "edgesched_edge_site_errors",
            "Site cycles that failed (the node scheduled alone that cycle)",
            registry=r,
        )
        self.site_elections = Counter(
            "edgesched_edge_site_terms",
            "Terms this node began as its cut-off site's coordinator",
            registry=r,
        )
        self.restarts = Counter("edgesched_edge_task_restarts", "Restarts by policy", registry=r)
        self.preemptions = Counter("edgesched_edge_preemptions", "Tasks preempted", registry=r)
        self.recovered = Counter(
            "edgesched_edge_recovered_tasks",
            "Tasks found at start-up: adopted alive or requeued",
            ["how"],
            registry=r,
        )
        self.store_errors = Counter(
            "edgesched_edge_store_errors", "Store writes that failed", ["kind"], registry=r
        )
        self.cpu = Gauge("edgesched_edge_cpu_utilization", "CPU utilization (0-1)", registry=r)
        self.power = Gauge("edgesched_edge_power_watts", "Node power draw", ["source"], registry=r)
        self.mem_used = Gauge("edgesched_edge_memory_used_gib", "Memory in use", registry=r)
        self.forecast = Gauge(
            "edgesched_edge_forecast_cpu", "Peak CPU cores forecast for the next 15 min", registry=r
        )
        self.model_fallbacks = Counter(
            "edgesched_edge_model_fallbacks",
            "Model fallbacks: a file refused at load, a swap from central refused, or one "
            "forecast or placement served by the heuristic",
            ["kind", "stage"],
            registry=r,
        )

        self.refused = Gauge(
            "edgesched_edge_refused",
            "Document messages refused since start, by channel (node: our document, policy, "
            "desired) and reason (frame, payload, update, sender, authorship, signature, "
            "replay, epoch, schema)",
            ["channel", "reason"],
            registry=r,
        )

    def observe(self, sample: Sample) -> None:
        self.cpu.set(sample.cpu_total)
        self.power.labels(sample.power_source).set(sample.power_w)
        self.mem_used.set(sample.mem_used_gib)

    def render(self) -> bytes:
        return generate_latest(self.registry)
