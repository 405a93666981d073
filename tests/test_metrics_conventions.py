"""Both tiers' /metrics by Prometheus conventions, scraped from real processes.

A real Mosquitto, a real ``edgesched central run`` and a real ``edgesched edge run``: each
exposition is parsed by prometheus-client's parser, checked by ``promtool check metrics``
(an implementation we did not write) and against the conventions promtool does not check
(base units, counters for what only grows, the exact names docs/metrics.md lists, bounded
labels). The scrape-only ``metrics-token`` reads /metrics and is refused everywhere else; the
per-state node gauge follows a node from connected to partitioned as ``GET /v1/nodes`` does;
docs/alerts.yml passes ``promtool check rules`` and its partitioned-node and SQLite alerts fire
under ``promtool test rules``.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import Broker, EdgeNode, central_and_nodes, until
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from edgesched.central.liveness import NodeStatus
from edgesched.central.metrics import NODE_STATES, node_state_counts
from edgesched.rest.client import ApiClient, ApiTarget

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: Every family each tier exposes (a counter by its name without ``_total``, as the parser
#: names it), with its type: a rename shows here first, and must be listed in docs/metrics.md.
EDGE_FAMILIES = {
    "edgesched_edge_mode": "gauge",
    "edgesched_edge_mode_changes": "counter",
    "edgesched_edge_power_errors": "counter",
    "edgesched_edge_tasks": "gauge",
    "edgesched_edge_submissions": "counter",
    "edgesched_edge_decisions": "counter",
    "edgesched_edge_task_starts": "counter",
    "edgesched_edge_task_start_failures": "counter",
    "edgesched_edge_task_exits": "counter",
    "edgesched_edge_site_errors": "counter",
    "edgesched_edge_site_terms": "counter",
    "edgesched_edge_task_restarts": "counter",
    "edgesched_edge_preemptions": "counter",
    "edgesched_edge_recovered_tasks": "counter",
    "edgesched_edge_store_errors": "counter",
    "edgesched_edge_cpu_utilization_ratio": "gauge",
    "edgesched_edge_power_watts": "gauge",
    "edgesched_edge_memory_used_bytes": "gauge",
    "edgesched_edge_memory_total_bytes": "gauge",
    "edgesched_edge_forecast_cpu_cores": "gauge",
    "edgesched_edge_model_fallbacks": "counter",
    "edgesched_edge_broker_connected": "gauge",
    "edgesched_edge_refused": "counter",
}
CENTRAL_FAMILIES = {
    "edgesched_central_nodes": "gauge",
    "edgesched_central_rejected": "counter",
    "edgesched_central_refused": "counter",
    "edgesched_central_nodes_online": "gauge",
    "edgesched_central_broker_connected": "gauge",
    "edgesched_central_events": "counter",
    "edgesched_central_replica_snapshots": "counter",
    "edgesched_central_model_fallbacks": "counter",
    "edgesched_central_forecast_cpu_cores": "gauge",
    "edgesched_central_docs_frozen": "gauge",
    "edgesched_central_docs_frozen_bytes": "gauge",
    "edgesched_central_docs_live": "gauge",
    "edgesched_central_doc_thaws": "counter",
}
#: Unit words that are not Prometheus base units (bytes, seconds, watts, joules, ratio).
NOT_BASE_UNITS = re.compile(
    r"_(gib|mib|kib|gb|mb|kb|kilobytes|megabytes|gigabytes|ms|us|ns|milliseconds|"
    r"microseconds|nanoseconds|minutes|hours|days|percent|kw|mw|kwh|wh|mhz|ghz)(_|$)"
)
#: Labels whose values are unbounded in a fleet: never a label of these series.
UNBOUNDED_LABELS = {"node", "node_id", "task", "task_id", "id", "instance_id", "client_id"}


def problems(text: str, families: dict[str, str]) -> list[str]:
    """Everything in ``text`` (an exposition) against the conventions; [] when it keeps them."""
    found: list[str] = []
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    if set(parsed) != set(families):
        found.append(
            f"families: missing {sorted(set(families) - set(parsed))}, "
            f"unexpected {sorted(set(parsed) - set(families))}"
        )
    for name, family in parsed.items():
        if family.type != families.get(name, family.type):
            found.append(f"{name} is a {family.type}, expected a {families[name]}")
        if not family.documentation.strip():
            found.append(f"{name} has no HELP")
        if NOT_BASE_UNITS.search(name):
            found.append(f"{name} is not in a base unit")
        if family.type == "gauge" and name.endswith("_total"):
            found.append(f"{name}: a gauge named like a counter")
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                found.append(f"{sample.name}: a counter sample without _total")
            if sample.name.endswith("_created"):
                found.append(f"{sample.name}: _created series should be off")
            if UNBOUNDED_LABELS & set(sample.labels):
                found.append(f"{sample.name} has an unbounded label {sorted(sample.labels)}")
            if family.type == "counter" and sample.value < 0:
                found.append(f"{sample.name} is a negative counter")
    return found


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (apt-get install prometheus; `make system-deps`)")
    return found


def promtool_check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )


def samples(text: str) -> dict[str, list[Sample]]:
    """Sample name -> its samples."""
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(text: str, name: str, **labels: str) -> float:
    matching = [s.value for s in samples(text).get(name, []) if s.labels == labels]
    assert len(matching) == 1, (name, labels, matching)
    return float(matching[0])


def client(proc: EdgeNode, token_file: str) -> ApiClient:
    """A client of ``proc``'s API sending the token of ``<state>/token_file``."""
    base = ApiTarget.from_state_dir(proc.state).base_url
    return ApiClient(ApiTarget(base, (proc.state / token_file).read_text().strip()))


def scrape(proc: EdgeNode, token_file: str = "metrics-token") -> str:
    resp = client(proc, token_file).request("GET", "/metrics")
    assert resp.status == 200, resp.body
    assert resp.content_type.startswith("text/plain"), resp.content_type
    return str(resp.body)


def test_the_checks_catch_what_they_are_for() -> None:
    """The convention checker flags the mistakes this suite guards against (so a pass means
    something)."""
    bad = (
        "# HELP edgesched_edge_memory_used_gib Memory\n# TYPE edgesched_edge_memory_used_gib "
        "gauge\nedgesched_edge_memory_used_gib 1.5\n# TYPE edgesched_edge_refused_total gauge\n"
        'edgesched_edge_refused_total{node="gw-1"} 3\n'
    )
    found = problems(bad, {"edgesched_edge_memory_used_gib": "gauge"})
    assert any("not in a base unit" in p for p in found)
    assert any("gauge named like a counter" in p for p in found)
    assert any("unbounded label" in p for p in found)
    assert any("no HELP" in p for p in found)
    assert any("unexpected" in p for p in found)


def test_promtool_flags_a_counter_without_total() -> None:
    verdict = promtool_check_metrics("# TYPE ticks counter\nticks 1\n")
    assert verdict.returncode != 0 and '"_total" suffix' in verdict.stdout + verdict.stderr


def test_node_state_counts_follow_central_s_rule() -> None:
    """Each state at its boundaries (``failover_after_s`` 30, ``dead_after_s`` 3600), only
    replicas counted, every state present, the sum the fleet's size."""
    now = 10_000.0
    liveness = {
        "up": NodeStatus("online", now - 5000),
        "just-cut": NodeStatus("offline", now - 1),
        "cut-29s": NodeStatus("offline", now - 29.5),
        "cut-31s": NodeStatus("offline", now - 31),
        "cut-59min": NodeStatus("offline", now - 3599),
        "cut-2h": NodeStatus("offline", now - 7200, "will"),
        "no-replica": NodeStatus("offline", now - 7200),
    }
    replicas = {n for n in liveness if n != "no-replica"} | {"never-heard"}
    counts = node_state_counts(replicas, liveness, now, 30.0, 3600.0)
    assert counts == {
        "connected": 1,
        "suspect": 2,
        "partitioned": 2,
        "dead": 1,
        "unknown": 1,
    }
    assert tuple(counts) == NODE_STATES and sum(counts.values()) == len(replicas)
    assert node_state_counts(set(), liveness, now, 30.0, 3600.0) == dict.fromkeys(NODE_STATES, 0)


def test_alert_rules_check_and_fire(tmp_path: Path) -> None:
    """docs/alerts.yml is valid, and its partitioned-node and SQLite alerts fire on the series
    the tiers expose (and not before)."""
    tool = promtool()
    rules = DOCS / "alerts.yml"
    checked = subprocess.run(
        [tool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    central = 'instance="central:8080",job="edgesched-central"'
    edge = 'instance="gw-01:8081",job="edgesched-edge"'
    unit = tmp_path / "alerts_test.yml"
    unit.write_text(
        f"""rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'edgesched_central_nodes{{state="partitioned",{central}}}'
        values: '0 0 1 1 1 1'
      - series: 'edgesched_central_nodes{{state="connected",{central}}}'
        values: '10 10 9 9 9 9'
      - series: 'edgesched_edge_store_errors_total{{kind="full",{edge}}}'
        values: '0 0 0 2 2 2'
    alert_rule_test:
      - eval_time: 2m
        alertname: EdgeschedNodePartitioned
        exp_alerts: []
      - eval_time: 4m
        alertname: EdgeschedNodePartitioned
        exp_alerts:
          - exp_labels: {{severity: warning, state: partitioned, instance: "central:8080",
                          job: edgesched-central}}
            exp_annotations:
              summary: "1 node(s) partitioned from central central:8080"
              description: "Run `edgesched nodes` to see which; they run on alone until they heal."
      - eval_time: 4m
        alertname: EdgeschedFleetMostlyCut
        exp_alerts: []
      - eval_time: 2m
        alertname: EdgeschedEdgeStoreErrors
        exp_alerts: []
      - eval_time: 4m
        alertname: EdgeschedEdgeStoreErrors
        exp_alerts:
          - exp_labels: {{severity: critical, kind: full, instance: "gw-01:8081",
                          job: edgesched-edge}}
            exp_annotations:
              summary: "gw-01:8081: SQLite store writes failing (full)"
"""
    )
    tested = subprocess.run(
        [tool, "test", "rules", str(unit)], capture_output=True, text=True, timeout=30
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


async def test_both_tiers_scrape_by_conventions(tmp_path: Path, broker: Broker) -> None:
    """Central and a node as processes: each /metrics keeps the conventions and passes
    promtool; the metrics token scrapes and nothing else; the node's memory is in bytes; the
    node state gauge goes connected -> partitioned when the node dies, as /v1/nodes says."""
    async with central_and_nodes(
        tmp_path,
        broker.port,
        {"gw-m": broker.port},
        central={"failover_after_s": 0.5, "dead_after_s": 3600.0},
    ) as (central, nodes):
        node = nodes["gw-m"]
        connected = await until(
            lambda: (
                value(scrape(central), "edgesched_central_nodes", state="connected") == 1
                and scrape(central)
            ),
            20,
            "gw-m connected at central",
            tolerate=(AssertionError,),
        )
        edge_text = await until(
            lambda: (
                (t := scrape(node))
                and value(t, "edgesched_edge_broker_connected") == 1
                and value(t, "edgesched_edge_memory_total_bytes") > 0
                and value(t, "edgesched_edge_mode", mode="connected") == 1
                and t
            ),
            20,
            "gw-m's first sample, its broker session, central heard",
            tolerate=(AssertionError,),  # a series not there yet
        )
        for text, families in ((edge_text, EDGE_FAMILIES), (connected, CENTRAL_FAMILIES)):
            assert problems(text, families) == []
            verdict = promtool_check_metrics(text)
            assert verdict.returncode == 0 and not verdict.stdout + verdict.stderr, verdict

        # Base units: bytes (the old series was GiB), a ratio, and every node state present.
        used = value(edge_text, "edgesched_edge_memory_used_bytes")
        total = value(edge_text, "edgesched_edge_memory_total_bytes")
        assert total == psutil.virtual_memory().total
        assert 1 << 20 < used <= total
        assert 0 <= value(edge_text, "edgesched_edge_cpu_utilization_ratio") <= 1
        assert value(edge_text, "edgesched_edge_mode", mode="autonomous") == 0
        assert {s.labels["state"] for s in samples(connected)["edgesched_central_nodes"]} == set(
            NODE_STATES
        )
        assert value(connected, "edgesched_central_broker_connected") == 1
        # the node's refusal counts are counters, one per channel and reason
        refused = samples(edge_text)["edgesched_edge_refused_total"]
        assert {s.labels["channel"] for s in refused} >= {"node", "policy"}

        # The metrics token reads /metrics, and nothing else, at both tiers.
        for proc, others in (
            (node, [("GET", "/v1/status"), ("GET", "/v1/tasks"), ("POST", "/v1/tasks")]),
            (
                central,
                [("GET", "/v1/status"), ("GET", "/v1/nodes"), ("POST", "/v1/policy")],
            ),
        ):
            scraper = client(proc, "metrics-token")
            assert scraper.request("HEAD", "/metrics").status == 200
            for method, path in others:
                resp = scraper.request(method, path, {} if method == "POST" else None)
                assert resp.status == 403, (proc.tier, method, path, resp.body)
                assert "metrics token" in resp.body["detail"]
                assert client(proc, "api-token").request("GET", "/v1/status").status == 200
            unauthenticated = scraper.request("GET", "/metrics", auth=False)
            assert unauthenticated.status == 401
            assert "metrics-token" in unauthenticated.body["detail"]
            assert (proc.state / "metrics-token").stat().st_mode & 0o777 == 0o600
        assert scrape(central, "api-token-read").startswith("# HELP")  # the read token too
        assert scrape(node, "api-token").startswith("# HELP")

        # The node dies: the broker publishes its will (offline), and past failover_after_s
        # central reads it partitioned.
        await asyncio.to_thread(node.kill, signal.SIGKILL)

        def partitioned() -> tuple[str, Any] | None:
            text = scrape(central)
            listed = central.get("/v1/nodes")[1]["nodes"]
            if value(text, "edgesched_central_nodes", state="partitioned") != 1:
                return None
            return text, listed

        text, listed = await until(partitioned, 20, "gw-m partitioned at central")
        assert [n["state"] for n in listed] == ["partitioned"]
        assert value(text, "edgesched_central_nodes", state="connected") == 0
        assert sum(s.value for s in samples(text)["edgesched_central_nodes"]) == 1
        assert value(text, "edgesched_central_events_total", kind="node-offline") >= 1
        assert problems(text, CENTRAL_FAMILIES) == []
