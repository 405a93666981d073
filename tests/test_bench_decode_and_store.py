"""The decode and store-contention benchmarks at a tiny size: they run, measure what they say,
and leave the process as they found it (paho's class, the switch interval)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from paho.mqtt import _packet
from paho.mqtt.properties import Properties

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_mqtt_decode
import bench_store_contention

from edgesched.sync.pahofast import SharedTableProperties


def test_the_decode_benchmark_times_both_classes_and_restores_paho_s() -> None:
    before = getattr(_packet, "Properties")  # noqa: B009
    data = bench_mqtt_decode.packet(b"\x00")
    try:
        theirs = bench_mqtt_decode.per_message_us(Properties, data, 200)
        ours = bench_mqtt_decode.per_message_us(SharedTableProperties, data, 200)
    finally:
        setattr(_packet, "Properties", before)  # noqa: B010
    assert theirs > 0 and ours > 0


def test_the_store_contention_benchmark_writes_while_the_loop_is_busy() -> None:
    interval = sys.getswitchinterval()
    args = argparse.Namespace(turn_ms=2.0, repeats=2)
    batch_p50, batch_max, journal_p50, journal_max = asyncio.run(
        bench_store_contention.holds(0.001, 4, args)
    )
    sys.setswitchinterval(interval)
    assert 0 < batch_p50 <= batch_max and 0 < journal_p50 <= journal_max
