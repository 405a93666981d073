"""Sliced accelerators through a real edge engine: a simulated 4-GPU server with ``[edge]
accel_time_slices = 4`` places tasks asking slices and whole devices, hands each process its
unit in the environment, never gives a slice twice, and keeps a task waiting while no device
has its unit free."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import Broker, kill_task_processes

from edgesched.config import parse_config
from edgesched.core.task import TaskSpec, TaskState
from edgesched.edge.engine import EdgeEngine, SubmitError
from edgesched.edge.fakehw import SERVER_KINDS, build_server
from edgesched.serve import edge_engine

SHOW = 'echo "$CUDA_VISIBLE_DEVICES|$EDGESCHED_ACCEL_SLICE"; sleep 30'


async def _running(engine: EdgeEngine, task_id: str, timeout: float = 15.0) -> None:
    async def wait() -> None:
        while (r := await engine.store.get_task(task_id)) is None or r.state is not (
            TaskState.RUNNING
        ):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(wait(), timeout)


async def _unit(state: Path, task_id: str, timeout: float = 10.0) -> str:
    log = state / "run" / f"{task_id}.log"
    for _ in range(int(timeout / 0.05)):
        if log.exists() and log.read_text().strip():
            return log.read_text().strip()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{task_id} wrote nothing")


@pytest.mark.timeout(90)
async def test_engine_hands_out_slices_and_whole_devices(broker: Broker, tmp_path: Path) -> None:
    ai = next(k for k in SERVER_KINDS if k.name == "ai4gpu")
    root = build_server(ai, tmp_path / "hw")
    state = tmp_path / "state"
    config = parse_config(
        {
            "edge": {
                "node_id": "sim-ai",
                "state_dir": str(state),
                "api_port": 0,
                "cycle_s": 0.1,
                "sample_s": 0.5,
                "hal_root": str(root),
                "accel_time_slices": 4,
                "telemetry_source": "reserved",
                "mqtt": {"port": broker.port, "keepalive_s": 2, "reconnect_max_s": 0.5},
            }
        }
    )
    engine = edge_engine(config)
    runner = asyncio.create_task(engine.run())
    try:
        await asyncio.wait_for(engine.wait_ready(), 20)
        assert engine.node is not None
        assert (engine.node.capacity.accel, engine.node.capacity.accel_slices) == (4, 16)
        with pytest.raises(SubmitError, match="at most 4"):
            await engine.submit(TaskSpec(id="big", command=("true",), accel_slices=5))

        async def run(task_id: str, accel: int = 0, accel_slices: int = 0) -> str:
            await engine.submit(
                TaskSpec(
                    id=task_id,
                    command=("sh", "-c", SHOW),
                    accel=accel,
                    accel_slices=accel_slices,
                )
            )
            await _running(engine, task_id)
            return await _unit(state, task_id)

        assert await run("s3", accel_slices=3) == "0|0:0,1,2/4"
        assert await run("s2", accel_slices=2) == "1|1:0,1/4"  # device 0 has 1 left
        assert await run("s1", accel_slices=1) == "0|0:3/4"  # best fit: device 0's last
        assert await run("w2", accel=2) == "2,3|2:0,1,2,3/4;3:0,1,2,3/4"
        # every device is taken or partly sliced: a whole device waits, one more slice fits
        await engine.submit(TaskSpec(id="w1", command=("sh", "-c", SHOW), accel=1))
        assert await run("s1b", accel_slices=2) == "1|1:2,3/4"
        await asyncio.sleep(0.5)
        waiting = await engine.store.get_task("w1")
        assert waiting is not None and waiting.state is TaskState.ACCEPTED
        # the grants are what the store keeps for a restarted engine
        raw = await engine.store.get_meta("accel_grants")
        assert raw is not None and '"s3"' in raw and '"w2"' in raw
        await engine.cancel("w2")
        await _running(engine, "w1")
        assert await _unit(state, "w1") == "2|2:0,1,2,3/4"
    finally:
        engine.stop()
        await asyncio.wait_for(runner, 20)
        kill_task_processes(state)


@pytest.mark.timeout(90)
async def test_a_unit_the_core_thinks_free_waits_at_the_node(
    broker: Broker, tmp_path: Path
) -> None:
    """After a release the real grants differ from a replay of the running tasks in start
    order (a fragment left where the replay packs tight). The node's core sees its real
    grants (its held label), so it keeps the task waiting rather than hand out a device that
    is in use; and had it placed it, the node's own plan would refuse the unit."""
    ai = next(k for k in SERVER_KINDS if k.name == "ai4gpu")
    root = build_server(ai, tmp_path / "hw")
    state = tmp_path / "state"
    config = parse_config(
        {
            "edge": {
                "node_id": "sim-ai",
                "state_dir": str(state),
                "api_port": 0,
                "cycle_s": 0.1,
                "sample_s": 0.5,
                "hal_root": str(root),
                "accel_time_slices": 4,
                "telemetry_source": "reserved",
                "mqtt": {"port": broker.port, "keepalive_s": 2, "reconnect_max_s": 0.5},
            }
        }
    )
    engine = edge_engine(config)
    runner = asyncio.create_task(engine.run())
    try:
        await asyncio.wait_for(engine.wait_ready(), 20)

        async def run(task_id: str, accel: int = 0, accel_slices: int = 0) -> str:
            spec = TaskSpec(
                id=task_id, command=("sh", "-c", SHOW), accel=accel, accel_slices=accel_slices
            )
            await engine.submit(spec)
            await _running(engine, task_id)
            return await _unit(state, task_id)

        # two devices whole, then two sliced: a 3 + 1 on device 2, b 3 on device 3
        assert await run("w", accel=2) == "0,1|0:0,1,2,3/4;1:0,1,2,3/4"
        assert await run("a", accel_slices=3) == "2|2:0,1,2/4"
        assert await run("b", accel_slices=3) == "3|3:0,1,2/4"
        assert await run("c", accel_slices=1) == "2|2:3/4"
        await engine.cancel("a")
        # a replay of b then c (b on device 2, c beside it) finds device 3 whole; it is not
        # (b holds it, c holds device 2's last slot)
        await engine.submit(TaskSpec(id="x", command=("sh", "-c", SHOW), accel=1))
        await asyncio.sleep(1.0)
        x = await engine.store.get_task("x")
        assert x is not None and x.state is TaskState.ACCEPTED
        assert not (state / "run" / "x.log").exists()
        await engine.cancel("c")  # device 2 whole again
        await _running(engine, "x")
        assert await _unit(state, "x") == "2|2:0,1,2,3/4"
    finally:
        engine.stop()
        await asyncio.wait_for(runner, 20)
        kill_task_processes(state)
