"""Telemetry messages: validation of what arrives, and central's per-node ring buffers."""

from __future__ import annotations

import contextlib
import json
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.central.telemetry import (
    FIRST_ROWS,
    MAX_TASKS_RUNNING,
    TelemetryCollector,
    TelemetryRing,
)
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


# --- central's per-node rings (TelemetryRing): compact rows, same answers as a deque ---------


def sample(at: float, k: int = 0) -> Telemetry:
    return Telemetry(at, (k % 100) / 100 + 0.001, 1 / (k + 3), 80.0 + k / 7, k)


def test_ring_grows_by_doubling_up_to_keep_then_wraps() -> None:
    ring = TelemetryRing(20)
    assert len(ring) == 0 and not ring and ring.rows == FIRST_ROWS and ring.latest() is None
    assert ring.since(0.0) == []
    rows = []
    for k in range(50):
        assert ring.append(sample(float(k), k))
        rows.append(ring.rows)
        assert len(ring) == min(k + 1, 20)
        assert ring.latest() == sample(float(k), k)
    assert rows[:8] == [8] * 8 and rows[8:16] == [16] * 8 and set(rows[16:]) == {20}
    assert list(ring) == [sample(float(k), k) for k in range(30, 50)]
    assert ring.since(45.0) == [sample(float(k), k) for k in range(45, 50)]
    assert ring.since(31.5) == [sample(float(k), k) for k in range(32, 50)]
    assert ring.since(-1.0) == list(ring) and ring.since(49.5) == []
    assert TelemetryRing(3).rows == 3  # keep below FIRST_ROWS: keep rows from the start
    with pytest.raises(ValueError):
        TelemetryRing(0)
    with pytest.raises(ValueError):
        TelemetryCollector(keep=0)


def test_ring_since_at_boundaries_keeps_every_equal_timestamp() -> None:
    keep = 10
    ring = TelemetryRing(keep)
    times = [1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0, 5.0, 6.0, 6.0, 7.0, 7.0, 7.0]
    for k, at in enumerate(times):
        assert ring.append(sample(at, k))
    kept = [sample(at, k) for k, at in enumerate(times)][-keep:]  # wrapped: from the 3.0s
    for since in (0.0, 3.0, 4.0, 5.0, 5.5, 6.0, 7.0, 7.0000001):
        assert ring.since(since) == [s for s in kept if s.at >= since], since
    # the boundary between the older run (buf[start:]) and the newer (buf[:start])
    assert ring._start == len(times) % keep
    assert ring.since(kept[keep - ring._start].at)[0].at == kept[keep - ring._start].at


def test_ring_drops_out_of_order_samples_and_keeps_equal_ones() -> None:
    ring = TelemetryRing(4)
    assert ring.append(sample(10.0, 1)) and ring.append(sample(10.0, 2))
    assert not ring.append(sample(9.999, 3))
    assert [s.tasks_running for s in ring] == [1, 2] and ring.latest() == sample(10.0, 2)


def test_ring_values_read_back_exactly_float64() -> None:
    """float64 columns: a value reads back bit for bit, also an awkward one."""
    odd = Telemetry(1_700_000_000.123456, 0.1 + 0.2, 1 / 3, 123456.78901234567, 2**32 - 1)
    c = TelemetryCollector(keep=2)
    c.handle(telemetry_topic("gw1"), json.dumps(odd.to_json()).encode())
    back = c.latest("gw1")
    assert back == odd and type(back.tasks_running) is int and type(back.at) is float
    assert json.dumps(c.samples("gw1")[0].to_json()) == json.dumps(odd.to_json())


def test_collector_rejects_a_tasks_running_too_large_to_keep() -> None:
    c = TelemetryCollector()
    c.handle(telemetry_topic("gw1"), payload(tasks_running=MAX_TASKS_RUNNING + 1))
    assert c.rejected == 1 and "gw1" not in c.series
    c.handle(telemetry_topic("gw1"), payload(tasks_running=MAX_TASKS_RUNNING))
    latest = c.latest("gw1")
    assert latest is not None and latest.tasks_running == MAX_TASKS_RUNNING


def test_collector_series_answers_len_truth_and_membership() -> None:
    c = TelemetryCollector(keep=720, max_nodes=3)
    for node in ("a", "b", "c", "d"):
        c.handle(telemetry_topic(node), payload())
    assert "a" in c.series and "d" not in c.series and c.rejected == 1
    assert len(c.series["a"]) == 1 and c.series["a"] and c.series["a"].rows == FIRST_ROWS
    c.handle(telemetry_topic("a"), payload(at=50.0))  # out of order: dropped, not rejected
    assert len(c.series["a"]) == 1 and c.rejected == 1
    assert c.samples("nobody") == [] and c.samples("a", since=100.0) == c.samples("a")
    assert c.samples("a", since=100.0000001) == []


_unit = st.floats(0, 1, allow_nan=False)
_step = st.tuples(
    st.one_of(st.just(0.0), st.floats(-3, 10, allow_nan=False)),  # the step in time
    _unit,
    _unit,
    st.floats(0, 1e6, allow_nan=False),
    st.integers(0, MAX_TASKS_RUNNING),
)


@st.composite
def _runs(draw: st.DrawFn) -> tuple[int, list[tuple[float, float, float, float, int]]]:
    """A small keep and up to ~4 times as many samples (hypothesis's lists are short unless
    told: the ring must wrap, often several times)."""
    keep = draw(st.integers(1, 12))
    count = draw(st.integers(0, 4 * keep + 8))
    return keep, draw(st.lists(_step, min_size=count, max_size=count))


@settings(max_examples=200, deadline=None)
@given(_runs(), st.lists(st.floats(-5, 400, allow_nan=False), max_size=8))
def test_collector_answers_as_a_deque_of_objects_would(
    run: tuple[int, list[tuple[float, float, float, float, int]]], sinces: list[float]
) -> None:
    """The ring against the layout it replaced (a deque(maxlen=keep) of Telemetry, the late
    ones dropped), through handle() with the JSON a node sends: the same answers, exactly
    (float64 columns), after every sample."""
    keep, steps = run
    c = TelemetryCollector(keep=keep)
    model: deque[Telemetry] = deque(maxlen=keep)
    topic = telemetry_topic("gw1")
    at = 100.0
    for step, cpu, mem, power, running in steps:
        at = max(0.0, at + step)
        sent = Telemetry(at, cpu, mem, power, running)
        c.handle(topic, json.dumps(sent.to_json()).encode())
        if not model or sent.at >= model[-1].at:
            model.append(sent)
        assert len(c.series["gw1"]) == len(model) and c.latest("gw1") == model[-1]
        for since in [*sinces, at, model[0].at, model[-1].at]:
            assert c.samples("gw1", since) == [s for s in model if s.at >= since]
    assert c.samples("gw1") == list(model) == list(c.series.get("gw1", ()))
    assert c.rejected == 0
