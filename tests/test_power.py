"""Fleet power: central's pure park/wake stage (central/power.py), the node's side
(edge/power.py: stale orders, busy nodes, hooks that fail), and a real fleet where central
parks idle nodes, wakes one for work submitted at central, and a node woken by local work is
parked again once idle."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import REG, Broker, EdgeNode, central_and_nodes, until

from edgesched.central.placement import fleet_view
from edgesched.central.power import (
    ACTIVE,
    PARKED,
    power_orders,
    reported,
    with_power,
)
from edgesched.core.model import NodeState, Resources, Task
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView
from edgesched.core.task import TaskState
from edgesched.edge.power import PowerControl
from edgesched.sync.doc import PolicyDoc
from edgesched.sync.schema import (
    NodeView,
    PowerOrder,
    PowerReport,
    Refusals,
    Registration,
    SchemaError,
    TaskReport,
)

ENERGY = PolicyConfig(mode=PolicyMode.ENERGY, park_idle_after_s=60, min_spare_cpu=0)


def doc(power: PowerReport | None = None, tasks: dict[str, TaskReport] | None = None) -> NodeView:
    return NodeView(registration=Registration.from_entry(REG), tasks=tasks or {}, power=power)


def running() -> dict[str, TaskReport]:
    return {"t1": TaskReport(state=TaskState.RUNNING, cpu=2.0, mem_gib=1.0, updated_at=0.0)}


def order(state: str, at: float) -> PowerOrder:
    return PowerOrder(state=state, at=at)


def stage(
    docs: dict[str, NodeView], orders: dict[str, PowerOrder], now: float, **kw: Any
) -> list[Any]:
    view = fleet_view(docs, dict.fromkeys(docs, "online"), now)
    reports = {n: reported(c) for n, c in docs.items()}
    view = with_power(view, reports, orders)
    cluster = ClusterView(view.nodes, view.placements, view.now, forecast_cpu=kw.get("forecast"))
    busy = {p.node_id for p in view.placements}
    return power_orders(cluster, busy, kw.get("waiting", []), ENERGY, orders, reports)


def test_idle_nodes_beyond_the_need_are_parked_and_busy_ones_never() -> None:
    docs = {
        "a": doc(PowerReport(state=ACTIVE, since=0, idle_since=0)),
        "b": doc(PowerReport(state=ACTIVE, since=0, idle_since=None), running()),
        "c": doc(PowerReport(state=ACTIVE, since=0, idle_since=950)),  # idle 50 s only
    }
    orders = stage(docs, {}, 1000.0)
    assert [(o.node_id, o.state) for o in orders] == [("a", PARKED)]
    assert orders[0].to_order() == PowerOrder(state=PARKED, at=1000.0, reason=orders[0].reason)
    # The same order again is standing: not repeated while the node has not changed since.
    standing = {"a": orders[0].to_order()}
    assert stage(docs, standing, 1001.0) == []


def test_the_forecast_keeps_nodes_awake_and_wakes_parked_ones_ahead_of_a_peak() -> None:
    docs = {
        "a": doc(PowerReport(state=ACTIVE, since=0, idle_since=0)),
        "b": doc(PowerReport(state=PARKED, since=10)),
    }
    assert stage(docs, {}, 1000.0, forecast=4.0) == []  # a's 8 cores are needed: stays up
    woken = stage(docs, {}, 1000.0, forecast=12.0)  # more than a alone: wake b
    assert [(o.node_id, o.state) for o in woken] == [("b", ACTIVE)]


def test_waiting_work_wakes_a_parked_node_and_a_waking_one_is_no_target() -> None:
    docs = {"a": doc(PowerReport(state=PARKED, since=10))}
    task = Task("w1", "default", 50, Resources(cpu=2.0, mem_gib=1.0))
    woken = stage(docs, {}, 1000.0, waiting=[task])
    assert [(o.node_id, o.state) for o in woken] == [("a", ACTIVE)]
    view = fleet_view(docs, {"a": "online"}, 1000.0)
    view = with_power(view, {"a": reported(docs["a"])}, {"a": order(ACTIVE, 1000.0)})
    assert view.nodes[0].state is NodeState.WAKING


def test_a_node_that_woke_itself_gets_a_new_park_order_when_idle_again() -> None:
    docs = {"a": doc(PowerReport(state=ACTIVE, since=500.0, idle_since=600.0))}
    stale = {"a": order(PARKED, 400.0)}  # given before the node woke at 500
    orders = stage(docs, stale, 1000.0)
    assert [(o.node_id, o.state) for o in orders] == [("a", PARKED)]
    # An order that found the node busy (before its idle spell began at 600) is re-issued too.
    docs = {"a": doc(PowerReport(state=ACTIVE, since=0.0, idle_since=600.0))}
    orders = stage(docs, stale, 1000.0)
    assert [(o.node_id, o.state) for o in orders] == [("a", PARKED)]


def test_reports_from_older_or_broken_nodes_read_as_active() -> None:
    def read(node: dict[str, Any]) -> tuple[PowerReport, int]:
        refusals = Refusals("test")
        view = NodeView.from_content({"node": {"registration": REG, **node}}, refusals)
        assert view.registration is not None
        return reported(view), refusals.total()

    assert read({}) == (PowerReport(), 0)  # an older engine reports nothing
    # A broken report is refused by the schema (counted) and reads as no report at all.
    assert read({"power": "on"}) == (PowerReport(), 1)
    assert read({"power": {"state": "parked", "since": "x"}}) == (PowerReport(), 1)
    assert read({"power": {"state": "sideways", "since": 5}}) == (PowerReport(ACTIVE, 5.0), 0)
    assert stage({"a": doc()}, {}, 1000.0) == []  # never idle: never parked


# --- the node's side --------------------------------------------------------------------------


async def test_the_node_follows_current_orders_only_and_wakes_for_work() -> None:
    now = [100.0]
    power = PowerControl(lambda: now[0])
    power.observe(busy=False)  # idle since 100
    assert not await power.follow(order(PARKED, 50.0), busy=False)  # stale
    assert not await power.follow(order(PARKED, 150.0), busy=True)  # holds work
    assert await power.follow(order(PARKED, 150.0), busy=False)
    assert power.state.report() == PowerReport(state=PARKED, since=100.0, idle_since=100.0)
    now[0] = 200.0
    assert await power.wake("a local task")
    assert power.state.report() == PowerReport(state=ACTIVE, since=200.0, idle_since=100.0)
    # the park order it woke against is stale now
    assert not await power.follow(order(PARKED, 150.0), busy=False)
    # A nonsense order never reaches the node: the schema refuses it, in the document too.
    with pytest.raises(SchemaError, match="state: must be parked or active"):
        order("sideways", 300.0)
    policy = PolicyDoc("policy", 5)
    policy.root("power")["gw1"] = {"state": "sideways", "at": 300.0}
    assert policy.power() == {} and policy.refusals.by_kind() == {"power-order": 1}
    assert not await power.follow(policy.power().get("gw1"), busy=False)
    assert not await power.follow(None, busy=False)
    assert power.state.report().state == ACTIVE


async def test_a_park_order_that_found_the_node_busy_is_void() -> None:
    now = [100.0]
    power = PowerControl(lambda: now[0])
    power.observe(busy=True)
    assert not await power.follow(order(PARKED, 150.0), busy=True)
    now[0] = 160.0
    power.observe(busy=False)  # idle from 160: the order of 150 was for another idle spell
    assert not await power.follow(order(PARKED, 150.0), busy=False)
    assert await power.follow(order(PARKED, 170.0), busy=False)


async def test_a_failing_hook_leaves_the_node_as_it_was(tmp_path: Path) -> None:
    errors: list[str] = []
    marker = tmp_path / "parked"
    ok = PowerControl(lambda: 1.0, park_command=["touch", str(marker)])
    ok.observe(busy=False)
    assert await ok.follow(order(PARKED, 5.0), busy=False) and marker.exists()
    bad = PowerControl(lambda: 1.0, park_command=["sh", "-c", "echo nope >&2; exit 3"],
                       on_error=errors.append)  # fmt: skip
    bad.observe(busy=False)
    assert not await bad.follow(order(PARKED, 5.0), busy=False)
    assert not bad.state.parked and errors == ["park"] and "exited 3: nope" in bad.last_error
    missing = PowerControl(lambda: 1.0, park_command=[str(tmp_path / "no-such-tool")])
    missing.observe(busy=False)
    assert not await missing.follow(order(PARKED, 5.0), busy=False)
    assert "no-such-tool" in missing.last_error


def test_idle_time_is_tracked() -> None:
    now = [10.0]
    power = PowerControl(lambda: now[0])
    assert power.observe(busy=False) and power.state.idle_since == 10.0
    now[0] = 20.0
    assert not power.observe(busy=False) and power.state.idle_since == 10.0
    assert power.observe(busy=True) and power.state.idle_since is None


# --- a real fleet -----------------------------------------------------------------------------


async def test_central_parks_idle_nodes_and_wakes_one_for_work(
    tmp_path: Path, broker: Broker
) -> None:
    ports = dict.fromkeys(("gw-a", "gw-b"), broker.port)
    policy = {"mode": "energy", "park_idle_after_s": 2, "min_spare_cpu": 0}
    async with central_and_nodes(
        tmp_path,
        broker.port,
        ports,
        central={"park_nodes": True},
        policy=policy,
        edge=lambda _node, d: {"park_command": ["touch", str(d / "parked-hook-ran")]},
    ) as (central, nodes):

        def power(node: EdgeNode) -> str:
            return str(node.get("/v1/status")[1]["power"]["state"])

        def all_parked() -> bool:
            return all(power(n) == PARKED for n in nodes.values())

        await until(all_parked, 30, "idle nodes parked")
        assert all((tmp_path / n / "parked-hook-ran").exists() for n in nodes)
        _, events = await asyncio.to_thread(central.get, "/v1/events")
        assert sum(e["kind"] == "park" for e in events["events"]) >= 2

        # Work submitted at central wakes a node, which then runs it.
        body = {"id": "wake-me", "command": ["sleep", "30"], "cpu": 0.1, "mem_gib": 0.05}
        status, reply = await asyncio.to_thread(central.request, "POST", "/v1/tasks", body)
        assert status == 201, reply

        def placed_on() -> str | None:
            entry = central.get("/v1/tasks/wake-me")[1]
            return entry.get("node") if entry.get("state") == "active" else None

        target = await until(placed_on, 30, "the task placed on a woken node")
        # Woken by central's order, or by the node itself if central placed it before the
        # node's park report reached it (the report is in flight for a few ms): active either way.
        await until(lambda: power(nodes[target]) == ACTIVE, 10, "the target awake")
        _, events = await asyncio.to_thread(central.get, "/v1/events")
        assert any(e["kind"] == "wake" for e in events["events"]), events
        await until(
            lambda: nodes[target].tasks().get("wake-me", {}).get("state") == "running",
            20,
            "the task running",
        )

        # Local work on a parked node wakes it at once (no central needed); once idle again,
        # central parks it again.
        other = next(n for n in nodes if n != target)
        await until(lambda: power(nodes[other]) == PARKED, 20, "the other node parked")
        local = {"id": "local", "command": ["sleep", "1"], "cpu": 0.1, "mem_gib": 0.05}
        status, _ = await asyncio.to_thread(nodes[other].request, "POST", "/v1/tasks", local)
        assert status == 201
        await until(lambda: power(nodes[other]) == ACTIVE, 10, "woken by local work")
        await until(lambda: power(nodes[other]) == PARKED, 30, "parked again once idle")
        _, metrics = await asyncio.to_thread(nodes[other].get, "/metrics")
        assert 'edgesched_edge_power_errors_total{stage="park"}' not in metrics

        # Parking turned off while a node is parked: central wakes it (it would otherwise
        # never be a placement target again).
        await asyncio.to_thread(central.kill, signal.SIGTERM)
        text = central.config.read_text().replace("park_nodes = true", "park_nodes = false")
        central.config.write_text(text)
        await asyncio.to_thread(central.start)
        await until(lambda: power(nodes[other]) == ACTIVE, 30, "woken once parking is off")
