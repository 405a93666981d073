"""Central's second liveness signal: a node that reads online but sent nothing for more than
``silent_after_s`` reads offline ("silent"), whatever its will did (a will is lost with a
clustered broker's member, docs/brokers.md). The pure part with a fake clock; then a real
node process on a real Mosquitto, stopped by SIGSTOP (its TCP connection open and its
keepalive long, so no will fires), seen silent by a Liveness fed by a real MqttSession."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import pytest
from conftest import Broker, EdgeNode, kill_task_processes
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.central.liveness import SILENT_AFTER_S, Hearing, Liveness, NodeStatus
from edgesched.central.telemetry import TelemetryCollector
from edgesched.config import CentralConfig
from edgesched.sync.session import Endpoint, Listener, MqttSession
from edgesched.sync.telemetry import TELEMETRY_FILTER, telemetry_topic
from edgesched.sync.topics import node_of_topic, status_topic


def status(node: str, state: str) -> bytes:
    return json.dumps({"node": node, "state": state}).encode()


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def live_with(
    clock: Clock,
    silent_after_s: float = 10.0,
    site_of: Callable[[str], str | None] = lambda _node: None,
) -> tuple[Liveness, list[tuple[str, NodeStatus]]]:
    live = Liveness(clock, site_of, silent_after_s=silent_after_s)
    changes: list[tuple[str, NodeStatus]] = []
    live.on_change = lambda node, s: changes.append((node, s))
    return live, changes


def announce(live: Liveness, node: str, state: str = "online") -> None:
    live.handle(status_topic(node), status(node, state))


# --- the pure part -------------------------------------------------------------------------


def test_default_matches_the_config_key() -> None:
    assert Liveness().silent_after_s == SILENT_AFTER_S == CentralConfig().silent_after_s
    with pytest.raises(ValueError, match="silent_after_s"):
        Liveness(silent_after_s=-1)
    with pytest.raises(ValueError, match="silent_after_s"):
        Liveness(silent_after_s=float("nan"))


def test_a_silent_node_goes_offline_since_it_was_last_heard() -> None:
    clock = Clock()
    live, changes = live_with(clock)
    announce(live, "gw1")  # an online status is a sign of life by itself
    assert live.nodes["gw1"] == NodeStatus("online", 1000.0, "status")
    clock.now = 1004.0
    live.heard("gw1", 1004.0)  # telemetry, say
    assert live.sweep(1014.0) == []  # exactly silent_after_s: not *more* than it
    assert live.state("gw1") == "online"
    assert live.sweep(1014.5) == ["gw1"]
    assert live.nodes["gw1"] == NodeStatus("offline", 1004.0, "silent")
    assert live.cause("gw1") == "silent" and live.reported["gw1"] == "online"
    assert [(n, s.state, s.cause) for n, s in changes] == [
        ("gw1", "online", "status"),
        ("gw1", "offline", "silent"),
    ]
    assert live.sweep(2000.0) == [] and len(changes) == 2  # told once


def test_heard_again_or_reannounced_it_is_online_again() -> None:
    clock = Clock()
    live, changes = live_with(clock)
    announce(live, "gw1")
    assert live.sweep(1011.0) == ["gw1"]
    live.heard("gw1", 999.0)  # older than what we had: nothing
    assert live.state("gw1") == "offline"
    clock.now = 1020.0
    live.heard("gw1", 1020.0)
    assert live.nodes["gw1"] == NodeStatus("online", 1020.0, "heard")
    assert live.sweep(1030.0) == []  # a fresh silent_after_s from when it was heard
    assert live.sweep(1030.5) == ["gw1"]
    clock.now = 1040.0
    announce(live, "gw1")  # it reconnected: its online status
    assert live.nodes["gw1"] == NodeStatus("online", 1040.0, "status")
    assert [s.cause for _, s in changes] == ["status", "silent", "heard", "silent", "status"]


def test_only_the_silent_ones_oldest_first_in_one_sweep() -> None:
    clock = Clock()
    live, _ = live_with(clock)
    for node in ("a", "b", "c", "d"):
        announce(live, node)
    live.heard("c", 1001.0)
    live.heard("a", 1002.0)
    live.heard("c", 1003.0)
    live.heard("d", 1008.0)
    # last heard: b 1000, a 1002, c 1003, d 1008
    assert live.sweep(1012.5) == ["b", "a"]
    assert live.sweep(1013.5) == ["c"]
    assert {n: live.state(n) for n in "abcd"} == {
        "a": "offline",
        "b": "offline",
        "c": "offline",
        "d": "online",
    }
    assert live.nodes["a"].since == 1002.0 and live.nodes["c"].since == 1003.0


def test_a_held_loop_is_nobodys_silence() -> None:
    """Central's loop was held 30 s (its messages waited unread): start_over gives every
    online node a fresh window from then, as a reconnect does; a node really gone is still
    swept one window later."""
    clock = Clock()
    live, _ = live_with(clock)
    for node in ("a", "b"):
        announce(live, node)
    live.heard("a", 1005.0)
    clock.now = 1035.0
    live.start_over(clock.now)  # the control loop saw the gap before its sweep
    assert live.sweep(1035.0) == []
    live.heard("a", 1036.0)  # the backlog read: a spoke, b did not
    assert live.sweep(1045.5) == ["b"]
    assert live.nodes["b"].since == 1035.0  # silent since the start over, not since 1000
    assert live.state("a") == "online"


def test_a_large_sweep_logs_a_few_nodes_by_name_and_a_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from edgesched.central.liveness import LOGGED_PER_SWEEP

    caplog.set_level("WARNING", logger="edgesched.central.liveness")
    live, changes = live_with(Clock())
    nodes = [f"n{i:03d}" for i in range(LOGGED_PER_SWEEP + 30)]
    for node in nodes:
        announce(live, node)
    assert live.sweep(1011.0) == nodes
    assert len(changes) == 2 * len(nodes)  # each told online, then offline
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == LOGGED_PER_SWEEP + 1
    assert lines[-1].startswith("30 more nodes: nothing heard")


def test_the_control_loop_tells_a_held_loop_from_a_quiet_one() -> None:
    from edgesched.central.engine import HELD_GAP_S, held_between

    assert not held_between(None, 100.0, 1.0)
    assert not held_between(100.0, 101.0 + HELD_GAP_S - 0.01, 1.0)  # a step a cycle later
    assert held_between(100.0, 101.0 + HELD_GAP_S + 0.01, 1.0)


def test_times_out_of_order_delay_a_sweep_never_hasten_it() -> None:
    """heard() told an older time than the newest it has (not what central does: it tells
    its clock as messages arrive): the node is not swept early, and late by at most the
    difference."""
    live, _ = live_with(Clock())
    for node in ("a", "b"):
        announce(live, node)
    live.heard("a", 1008.0)
    live.heard("b", 1003.0)  # older than a's 1008
    assert live.sweep(1013.5) == []  # b is due (1003 + 10), but behind a: delayed
    assert live.sweep(1018.5) == ["a", "b"]  # a due: b with it, 5 s (the disorder) late
    assert live.nodes["b"].since == 1003.0


def test_a_will_is_not_undone_by_a_late_message_and_is_not_swept() -> None:
    clock = Clock()
    live, changes = live_with(clock)
    announce(live, "gw1")
    clock.now = 1002.0
    announce(live, "gw1", "offline")  # the broker's will
    assert live.nodes["gw1"] == NodeStatus("offline", 1002.0, "will")
    live.heard("gw1", 1003.0)  # a frame still in flight: the will stands
    assert live.state("gw1") == "offline"
    assert live.sweep(5000.0) == []
    assert len(changes) == 2


def test_a_will_after_a_silence_is_the_cause_since_the_silence() -> None:
    clock = Clock()
    live, changes = live_with(clock)
    announce(live, "gw1")
    assert live.sweep(1011.0) == ["gw1"]
    clock.now = 1015.0
    announce(live, "gw1", "offline")  # the will came after all: no second change
    assert live.nodes["gw1"] == NodeStatus("offline", 1000.0, "will") and len(changes) == 2
    live.heard("gw1", 1016.0)  # no longer only silent: the will decides now
    assert live.state("gw1") == "offline"


def test_a_node_never_announced_is_not_made_up() -> None:
    live, changes = live_with(Clock())
    live.heard("ghost", 1000.0)
    assert live.sweep(5000.0) == [] and live.state("ghost") == "unknown" and changes == []
    assert live.heard_at["ghost"] == 1000.0


def test_zero_disables_the_sweep() -> None:
    clock = Clock()
    live, changes = live_with(clock, silent_after_s=0)
    announce(live, "gw1")
    assert live.sweep(1e9) == [] and live.state("gw1") == "online" and len(changes) == 1


async def test_centrals_own_link_down_is_nobodys_silence() -> None:
    """While central's own connection is down nobody can be heard: no sweep; connected
    again, every online node gets a fresh silent_after_s."""
    clock = Clock()
    live, changes = live_with(clock)
    announce(live, "gw1")
    announce(live, "gw2")
    live.heard("gw2", 1005.0)
    live.disconnected()  # the session calls it when central's connection ends
    assert live.sweep(1100.0) == [] and live.state("gw1") == "online"
    clock.now = 1100.0
    await live.serve(None)  # type: ignore[arg-type]  # connected again (no client needed)
    assert live.sweep(1109.0) == []
    live.heard("gw2", 1105.0)
    assert live.sweep(1110.5) == ["gw1"] and live.nodes["gw1"].since == 1100.0
    assert len(changes) == 3


def test_a_sites_bridge_and_silence() -> None:
    """Behind a dropped bridge the node reads offline by its site, and is not swept; when the
    bridge is back it gets a fresh silent_after_s, though it was last heard long before."""
    clock = Clock()
    live, changes = live_with(clock, site_of={"gw1": "north"}.get)
    announce(live, "gw1")
    clock.now = 1005.0
    live.handle("edgesched/v1/site/north/bridge", b"0")
    assert live.nodes["gw1"] == NodeStatus("offline", 1005.0, "site")
    assert live.sweep(1100.0) == []
    clock.now = 1100.0
    live.handle("edgesched/v1/site/north/bridge", b"1")
    assert live.nodes["gw1"] == NodeStatus("online", 1100.0, "status")
    assert live.sweep(1109.0) == []
    assert live.sweep(1110.5) == ["gw1"]
    assert live.nodes["gw1"].since == 1100.0  # its last sign of life: turned online
    assert [s.cause for _, s in changes] == ["status", "site", "status", "silent"]


def test_hearing_passes_everything_on_and_tells_who_spoke() -> None:
    clock = Clock()
    live, _ = live_with(clock)
    collector = TelemetryCollector()
    channel = Hearing(collector, live, lambda topic: node_of_topic(topic, "telemetry"))
    assert channel.routes == (TELEMETRY_FILTER,) and channel.subscriptions
    announce(live, "gw1")
    clock.now = 1007.0
    sample = {"at": 1007.0, "cpu_util": 0.5, "mem_util": 0.2, "power_w": 80, "tasks_running": 1}
    channel.handle(telemetry_topic("gw1"), json.dumps(sample).encode())
    assert live.heard_at["gw1"] == 1007.0 and collector.latest("gw1") is not None
    channel.handle("edgesched/v1/elsewhere", b"")  # no node: nothing heard
    assert live.sweep(1016.0) == [] and live.sweep(1017.5) == ["gw1"]
    channel.disconnected()


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["heard", "online", "offline", "sweep", "down", "up"]),
        st.sampled_from(["a", "b", "c"]),
        st.floats(0, 6),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_sweep_agrees_with_the_definition(events: list[tuple[str, str, float]]) -> None:
    """After any sequence (time moving forward), a node's last sign of life is when it was
    last heard or turned online, whichever is later; a sweep leaves online exactly the nodes
    whose last sign of life is within silent_after_s, turns offline only nodes whose own
    status says online, a silent node heard since would be online, and on_change is told
    of every move and only of moves."""
    clock = Clock(0.0)
    sites = {"a": "north", "b": "north", "c": "south"}
    live, changes = live_with(clock, silent_after_s=5.0, site_of=sites.get)
    for kind, node, step in events:
        clock.now += step
        now = clock.now
        if kind == "heard":
            live.heard(node, now)
        elif kind in ("online", "offline"):
            announce(live, node, kind)
        elif kind in ("down", "up"):
            payload = b"0" if kind == "down" else b"1"
            live.handle(f"edgesched/v1/site/{sites[node]}/bridge", payload)
        else:
            before = {n: s.state for n, s in live.nodes.items()}
            swept = live.sweep(now)
            for n in swept:
                assert before[n] == "online" and live.reported[n] == "online"
                assert now - live.nodes[n].since > 5.0
            for n, s in live.nodes.items():
                if s.state == "online":
                    assert now - max(s.since, live.heard_at.get(n, s.since)) <= 5.0, (n, s)
        for n, s in live.nodes.items():
            if s.cause == "silent":
                assert live.heard_at.get(n, s.since) <= s.since, (n, s)
            assert (s.cause in ("status", "heard")) == (s.state == "online")
    last: dict[str, str] = {}
    for n, s in changes:
        assert last.get(n) != s.state, "told of a non-change"
        last[n] = s.state
    assert last == {n: s.state for n, s in live.nodes.items()}


# --- a real node stopped by SIGSTOP --------------------------------------------------------


class Recorder(Listener):
    """Every status message as it arrives (to prove that no will fired)."""

    def __init__(self, inner: Liveness) -> None:
        self.inner = inner
        self.states: list[str] = []
        self.routes = inner.routes
        self.subscriptions = inner.subscriptions

    async def serve(self, client: aiomqtt.Client) -> None:
        await self.inner.serve(client)

    def handle(self, topic: str, payload: bytes) -> None:
        if "/status" in topic:
            self.states.append(json.loads(payload)["state"])
        self.inner.handle(topic, payload)

    def disconnected(self) -> None:
        self.inner.disconnected()


async def test_a_stopped_node_is_seen_silent_without_a_will(broker: Broker, tmp_path: Path) -> None:
    silent_after_s, margin = 3.0, 2.0
    node_id = "gw-quiet"
    state = tmp_path / "state"
    config = tmp_path / "edge.toml"
    config.write_text(
        f"""[edge]
node_id = "{node_id}"
state_dir = "{state}"
api_port = 0
lease_s = 2.0
cycle_s = 0.2
sample_s = 0.5
[edge.mqtt]
port = {broker.port}
keepalive_s = 600
reconnect_max_s = 1.0
"""
    )
    live = Liveness(silent_after_s=silent_after_s)
    changes: list[tuple[float, NodeStatus]] = []
    live.on_change = lambda node, s: changes.append((time.time(), s))
    recorder = Recorder(live)
    session = MqttSession(Endpoint("127.0.0.1", broker.port, "central", keepalive_s=2))
    session.add(recorder)
    session.add(Hearing(TelemetryCollector(), live, lambda t: node_of_topic(t, "telemetry")))

    async def sweeper() -> None:
        while True:
            live.sweep(time.time())
            await asyncio.sleep(0.1)

    node = EdgeNode(config, state, tmp_path / "edge.log")
    tasks = [asyncio.create_task(session.run()), asyncio.create_task(sweeper())]
    try:
        await asyncio.to_thread(node.start)
        assert node.proc is not None
        async with asyncio.timeout(15):
            while not (
                live.state(node_id) == "online"
                and live.heard_at.get(node_id, 0.0) > live.nodes[node_id].since
            ):
                await asyncio.sleep(0.1)  # online, and its telemetry heard since
        node.proc.send_signal(signal.SIGSTOP)
        stopped = time.time()
        async with asyncio.timeout(silent_after_s + margin):
            while live.state(node_id) != "offline":
                await asyncio.sleep(0.05)
        took = time.time() - stopped
        status = live.nodes[node_id]
        assert status.cause == "silent", status
        assert status.since <= stopped and took > silent_after_s - 1.0, (took, status)
        assert recorder.states == ["online"], "a will fired: the test would not show silence"
        node.proc.send_signal(signal.SIGCONT)
        async with asyncio.timeout(10):
            while live.state(node_id) != "online":
                await asyncio.sleep(0.05)
        assert live.nodes[node_id].cause == "heard"
        assert recorder.states == ["online"]  # the same connection all along
        assert [s.cause for _, s in changes] == ["status", "silent", "heard"]
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGCONT)
            await asyncio.to_thread(node.kill, signal.SIGTERM)
        kill_task_processes(state)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
