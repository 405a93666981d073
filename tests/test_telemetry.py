"""Telemetry messages: validation of what arrives, and central's per-node ring buffers."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgesched.central.telemetry import TelemetryCollector
from edgesched.sync.telemetry import Telemetry, parse_telemetry, telemetry_topic


def payload(**over: object) -> bytes:
    body = {"at": 100.0, "cpu_util": 0.5, "mem_util": 0.25, "power_w": 80.0, "tasks_running": 3}
    return json.dumps({**body, **over}).encode()


def test_a_good_sample_round_trips() -> None:
    node, sample = parse_telemetry(telemetry_topic("gw1"), payload())
    assert node == "gw1" and sample == Telemetry(100.0, 0.5, 0.25, 80.0, 3)
    assert (
        parse_telemetry(telemetry_topic("gw1"), json.dumps(sample.to_json()).encode())[1] == sample
    )


def test_bad_samples_say_what_is_wrong() -> None:
    topic = telemetry_topic("gw1")
    for body, needle in [
        (payload(cpu_util=1.5), "cpu_util"),
        (payload(power_w=float("nan")).replace(b"NaN", b"1e999"), "power_w"),
        (payload(tasks_running=-1), "tasks_running"),
        (payload(tasks_running=True), "tasks_running"),
        (payload(at="now"), "at"),
        (b"[1]", "object"),
        (b"\xff", "JSON"),
        (b" " * 3000, "exceeds"),
    ]:
        try:
            parse_telemetry(topic, body)
        except ValueError as exc:
            assert needle in str(exc), (body[:40], exc)
        else:
            raise AssertionError(f"accepted {body[:40]!r}")
    for bad_topic in ("edgesched/v1/node/gw1/status", "edgesched/v1/node//telemetry", "x"):
        try:
            parse_telemetry(bad_topic, payload())
        except ValueError:
            continue
        raise AssertionError(bad_topic)


@given(st.binary(max_size=300), st.text(max_size=40))
def test_parse_never_raises_anything_but_value_error(body: bytes, topic: str) -> None:
    with contextlib.suppress(ValueError):
        parse_telemetry(topic, body)


def test_collector_keeps_the_newest_per_node_in_order_and_bounded() -> None:
    c = TelemetryCollector(keep=3, max_nodes=2)
    topic = telemetry_topic("gw1")
    for at in (1.0, 2.0, 3.0, 2.5, 4.0):
        c.handle(topic, payload(at=at))
    assert [s.at for s in c.samples("gw1")] == [2.0, 3.0, 4.0]  # 2.5 arrived late: dropped
    assert [s.at for s in c.samples("gw1", since=3.0)] == [3.0, 4.0]
    c.handle(telemetry_topic("gw2"), payload())
    c.handle(telemetry_topic("gw3"), payload())  # over max_nodes
    c.handle(topic, b"garbage")
    assert set(c.series) == {"gw1", "gw2"} and c.rejected == 2
    latest = c.latest("gw1")
    assert latest is not None and latest.at == 4.0 and c.latest("nobody") is None


@pytest.mark.parametrize("kind", ["[", "{"])
@pytest.mark.parametrize("closed", [True, False])
def test_json_nested_past_the_parsers_depth_is_a_value_error(kind: str, closed: bool) -> None:
    """A node's status and telemetry, and central's heartbeat, are parsed by central and
    the nodes from MQTT: JSON nested ~1,000 deep (1 KiB is enough) made json.loads raise
    RecursionError, which no caller caught (issue 13). Each parser says what is wrong. (Not
    a hypothesis test: hypothesis raises the recursion limit while it runs one.)"""
    from edgesched.central.liveness import parse_status
    from edgesched.sync.topics import parse_heartbeat

    depth = 1024
    opening = ("[" if kind == "[" else '{"a":') * depth
    closing = ("]" if kind == "[" else "}") * depth if closed else ""
    body = (opening + "1" + closing).encode()
    parsers = (
        lambda: parse_status("edgesched/v1/node/gw1/status", body[:1024]),
        lambda: parse_telemetry(telemetry_topic("gw1"), body[:2048]),
        lambda: parse_heartbeat(body[:4096]),
    )
    for parse in parsers:
        try:
            parse()
        except ValueError:
            continue
        raise AssertionError(f"accepted {body[:40]!r}")
