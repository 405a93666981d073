"""What a node's telemetry says (``[edge] telemetry_source``): this host as the agent sampled it,
or the server the node registered as at what its tasks reserve (the demo's simulated nodes,
which used to show this host's CPU and power, issue 14).

The figures are checked on the pure functions, then once through a real edge engine that
registers as a simulated 8-core ARM server and publishes over a real Mosquitto."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import pytest
from conftest import Broker, kill_task_processes

from edgesched.config import TelemetrySource, parse_config
from edgesched.core.model import Arch, Node, PowerModel, Resources, ServerClass
from edgesched.core.task import TaskSpec, TaskState
from edgesched.edge.agent import Sample
from edgesched.edge.fakehw import SERVER_KINDS, build_server
from edgesched.edge.hal import default_power_model, discover, to_node
from edgesched.edge.telemetry import host_telemetry, reserved_telemetry
from edgesched.serve import edge_engine
from edgesched.sync.telemetry import Telemetry, parse_telemetry, telemetry_topic

POWER = PowerModel(idle_w=100.0, peak_w=500.0, parked_w=12.0)


def node(cpu: float = 32.0, mem_gib: float = 128.0, accel: int = 0) -> Node:
    return Node("sim-1", Arch.X86_64, ServerClass.GENERAL, Resources(cpu, mem_gib, accel), POWER)


def test_reserved_is_the_share_of_the_registered_server_and_its_power_model() -> None:
    got = reserved_telemetry(
        node(),
        [Resources(cpu=6.0, mem_gib=16.0), Resources(cpu=2.0, mem_gib=16.0)],
        at=5.0,
        tasks_running=2,
    )
    assert got == Telemetry(at=5.0, cpu_util=0.25, mem_util=0.25, power_w=200.0, tasks_running=2)


def test_reserved_with_nothing_reserved_is_idle() -> None:
    got = reserved_telemetry(node(), [], at=1.0, tasks_running=0)
    assert (got.cpu_util, got.mem_util, got.power_w) == (0.0, 0.0, 100.0)


def test_reserved_is_clamped_to_the_server() -> None:
    got = reserved_telemetry(node(), [Resources(cpu=40.0, mem_gib=200.0)], at=1.0, tasks_running=1)
    assert (got.cpu_util, got.mem_util, got.power_w) == (1.0, 1.0, 500.0)


def test_reserved_power_follows_the_busier_of_cpu_and_accelerators() -> None:
    """An AI server with every GPU booked by a 1-CPU task draws near its peak, as the demo's
    energy report counts it; its CPU share still reads as CPU."""
    ai = node(accel=4)
    got = reserved_telemetry(
        ai, [Resources(cpu=1.0, mem_gib=8.0, accel=4)], at=1.0, tasks_running=1
    )
    assert got.cpu_util == 1 / 32 and got.power_w == 500.0
    half = reserved_telemetry(ai, [Resources(cpu=1.0, accel=2)], at=1.0, tasks_running=1)
    assert half.power_w == POWER.power(0.5)


def test_reserved_parked_draws_the_parked_power() -> None:
    got = reserved_telemetry(node(), [], at=1.0, tasks_running=0, parked=True)
    assert got.power_w == 12.0


def test_reserved_without_memory_or_accelerators_reads_zero_not_a_division_error() -> None:
    bare = node(mem_gib=0.0)
    got = reserved_telemetry(
        bare, [Resources(cpu=8.0, mem_gib=1.0, accel=1)], at=1, tasks_running=1
    )
    assert (got.cpu_util, got.mem_util, got.power_w) == (0.25, 0.0, 200.0)


def sample(**over: object) -> Sample:
    fields: dict[str, object] = {
        "at": 7.0,
        "cpu_per_core": (0.5, 0.62),
        "cpu_total": 0.56,
        "freq_mhz": (),
        "mem_used_gib": 4.0,
        "mem_total_gib": 16.0,
        "net_rx_bps": 0.0,
        "net_tx_bps": 0.0,
        "power_w": 123.0,
        "power_source": "rapl",
        "power_estimated": False,
        **over,
    }
    return Sample(**fields)  # type: ignore[arg-type]


def test_host_is_the_agents_sample_of_this_machine() -> None:
    assert host_telemetry(sample(), 3) == Telemetry(7.0, 0.56, 0.25, 123.0, 3)
    odd = host_telemetry(sample(cpu_total=1.2, power_w=-1.0, mem_total_gib=0.0), 0)
    assert (odd.cpu_util, odd.mem_util, odd.power_w) == (1.0, 0.0, 0.0)


@pytest.mark.timeout(60)
async def test_a_simulated_node_publishes_its_reservations_not_this_host(
    broker: Broker, tmp_path: Path
) -> None:
    """A real engine as a simulated 8-core ARM server (``hal_root``) with ``telemetry_source =
    "reserved"``: with a 2-CPU, 4-GiB task running its telemetry over Mosquitto reads exactly
    2/8 CPU, 4/32 GiB and the registered power model at 0.25, whatever this host is doing;
    after the task exits, idle."""
    arm8 = next(k for k in SERVER_KINDS if k.name == "arm8")
    root = build_server(arm8, tmp_path / "hw")
    profile = discover(root)
    registered = to_node(profile, "sim-arm8", power=default_power_model(profile))
    assert registered.capacity.cpu == 8.0
    state = tmp_path / "state"
    config = parse_config(
        {
            "edge": {
                "node_id": "sim-arm8",
                "state_dir": str(state),
                "api_port": 0,
                "cycle_s": 0.1,
                "sample_s": 0.2,
                "hal_root": str(root),
                "telemetry_source": "reserved",
                "mqtt": {"port": broker.port, "keepalive_s": 2, "reconnect_max_s": 0.5},
            }
        }
    )
    assert config.edge.telemetry_source is TelemetrySource.RESERVED
    engine = edge_engine(config)
    runner = asyncio.create_task(engine.run())
    try:
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="watcher") as client:
            await client.subscribe(telemetry_topic("sim-arm8"))
            await asyncio.wait_for(engine.wait_ready(), 20)
            spec = TaskSpec(id="busy", command=("sleep", "3"), cpu=2.0, mem_gib=4.0)
            await engine.submit(spec)

            async def next_where(ok: Callable[[Telemetry], bool]) -> Telemetry:
                async for message in client.messages:
                    _, got = parse_telemetry(str(message.topic), bytes(message.payload))
                    if ok(got):
                        return got
                raise AssertionError("the subscription ended")

            busy = await asyncio.wait_for(next_where(lambda t: t.tasks_running == 1), 15)
            assert busy.cpu_util == 0.25
            assert math.isclose(busy.mem_util, 4.0 / registered.capacity.mem_gib)
            assert math.isclose(busy.power_w, registered.power.power(0.25))
            while (record := await engine.store.get_task("busy")) is None or (
                not record.state.terminal
            ):
                await asyncio.sleep(0.1)
            assert record.state is TaskState.EXITED, record
            ended = engine.clock()
            idle = await asyncio.wait_for(next_where(lambda t: t.at > ended), 15)
            assert (idle.cpu_util, idle.mem_util, idle.tasks_running) == (0.0, 0.0, 0)
            assert math.isclose(idle.power_w, registered.power.idle_w)
    finally:
        engine.stop()
        await asyncio.wait_for(runner, 20)
        kill_task_processes(state)
