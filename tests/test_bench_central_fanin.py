"""The fan-in benchmark at a tiny size: node-authored frames through central's routing and
replica channels all land in central's index, none refused; and the same through a real
Mosquitto, published by a process of its own, none dropped."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_central_fanin as bench

from edgesched.sync import security as sec


@pytest.mark.parametrize("cold", [False, True], ids=["live", "cold"])
def test_every_node_update_reaches_the_index(cold: bool) -> None:
    args = argparse.Namespace(tasks=20, updates=3, batch=7, cold=cold)
    row = asyncio.run(bench.measure(12, args))
    assert row["frames"] == 12 * 3  # one frame per change at this size
    assert row["exited"] == row["frames"] and row["rejected"] == 0
    assert row["steps"] == row["frames"] // 7 and row["rate"] > 0
    # a frozen replica thaws at its node's first frame, and only then
    assert row["thaws"] == (12 if cold else 0)


def test_signed_frames_all_reach_the_index() -> None:
    """The signed mode: every frame sealed by its node's key and checked by central lands;
    the unchecked baseline lands too."""
    args = argparse.Namespace(tasks=20, updates=3, batch=7, cold=False)
    signed = asyncio.run(bench.measure(12, args, signed=True))
    assert signed["exited"] == signed["frames"] == 36 and signed["rejected"] == 0
    unchecked = asyncio.run(bench.measure(12, args, authorship=False))
    assert unchecked["exited"] == unchecked["frames"] == 36


@pytest.mark.parametrize("cold", [False, True], ids=["live", "cold"])
def test_through_the_broker_every_update_reaches_the_index(cold: bool) -> None:
    args = argparse.Namespace(
        tasks=20, updates=3, batch=7, cold=cold, rate=0.0, broker_queue=None, quiet_s=1.0,
        step_gap_s=0.0, profile=0,
    )  # fmt: skip
    row = asyncio.run(bench.measure_broker(12, args))
    frames = 12 * 3
    assert row["frames"] == row["published"] == frames  # every PUBACK in
    # every frame reached central through its session, was merged and acted on
    assert row["received"] == row["applied"] == row["exited"] == frames
    assert row["dropped"] == 0 and row["broker_dropped"] == 0 and row["behind_nodes"] == 0
    assert row["rejected"] == 0 and row["resyncs"] == 0 and row["reconnects"] == 0
    assert row["steps"] >= 1 and row["rate"] > 0 and row["elapsed"] > 0
    assert row["cpu_s"] >= row["step_cpu_s"] > 0 and row["handle_cpu_s"] > 0
    assert row["thaws"] == (12 if cold else 0)


def test_the_broker_config_sets_the_queues_as_deployed() -> None:
    """As ``sync.security.broker_config`` writes them: the deployed queue limits, unless
    asked for another."""
    conf = bench.broker_conf(1883, None)
    deployed = sec.broker_config(
        port=1883, bind="127.0.0.1", acl_path=Path("/x"), password_file=Path("/p"), tls=False
    )
    for line in sec.queue_settings():
        assert f"{line}\n" in conf and f"{line}\n" in deployed
    assert "max_queued_messages 1000\n" in bench.broker_conf(1883, 1000)
    assert conf.rstrip().endswith("listener 1883 127.0.0.1")
