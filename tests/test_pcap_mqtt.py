"""bench/pcap_mqtt.py against a real capture: tcpdump records an MQTT 5 client's QoS 1
publishes to Mosquitto on loopback, and the reader finds each publish and its PUBACK, with
the three parts of the wait adding up to what the client measured."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiomqtt
import pytest
from conftest import Broker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import pcap_mqtt


def _tcpdump_or_skip() -> str:
    found = shutil.which("tcpdump")
    if found is None:
        pytest.fail("tcpdump is missing: run `make setup` (as root it apt-installs tcpdump)")
    return found


async def test_each_publish_is_found_with_its_puback(broker: Broker, tmp_path: Path) -> None:
    tcpdump = _tcpdump_or_skip()
    capture = tmp_path / "central.pcap"
    proc = subprocess.Popen(
        [*pcap_mqtt.tcpdump_command(tcpdump, capture), f"tcp port {broker.port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()  # "listening on lo, ..." once it captures
        if "listening" not in line:
            pytest.skip(f"tcpdump cannot capture here: {line.strip()}")
        handed: dict[str, float] = {}
        published: dict[str, float] = {}
        async with aiomqtt.Client(
            "127.0.0.1", broker.port, protocol=aiomqtt.ProtocolVersion.V5, identifier="central"
        ) as client:
            sock = client._client.socket()
            assert isinstance(sock, socket.socket)
            port = sock.getsockname()[1]
            for k in range(20):
                task_id = f"sub-{k:04d}"
                handed[task_id] = time.time()
                payload = b"\x00frame " + task_id.encode() + b" " * (k * 500)
                await client.publish("edgesched/v1/doc/desired-gw-1/sync/central", payload, qos=1)
                published[task_id] = time.time()
            await client.publish("edgesched/v1/other", b"sub-0003", qos=1)  # not a desired doc
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
    splits = pcap_mqtt.puback_split(capture, port, handed, published)
    assert [s.task_id for s in splits] == sorted(published)
    for s in splits:
        total = (published[s.task_id] - handed[s.task_id]) * 1e3
        assert min(s.to_wire_ms, s.broker_ms, s.back_ms) > -1.0, s  # (two clocks: ms apart)
        assert 0.0 <= s.spread_ms <= s.broker_ms, s
        assert abs(s.to_wire_ms + s.broker_ms + s.back_ms - total) < 0.01, (s, total)
    packets = list(
        pcap_mqtt.packets(
            pcap_mqtt.ordered([g for g in pcap_mqtt.segments(capture) if g.src == port]), True
        )
    )
    kinds = [p.kind for p in packets]
    assert kinds[0] == 1 and kinds.count(3) == 21  # CONNECT, then every PUBLISH


def test_a_gap_in_the_capture_loses_only_the_packets_in_it() -> None:
    """Three PUBACKs in three segments; the kernel dropped the middle one: the first and the
    last are still read (the run after the gap starts at a packet), none is invented."""

    def puback(packet_id: int) -> bytes:
        return bytes([0x40, 0x02]) + packet_id.to_bytes(2, "big")

    segs = [
        pcap_mqtt.Segment(1.0, 1883, 5000, 100, puback(7)),
        pcap_mqtt.Segment(3.0, 1883, 5000, 108, puback(9)),
        pcap_mqtt.Segment(3.0, 1883, 5000, 108, puback(9)),  # (a retransmission)
    ]
    chunks = pcap_mqtt.ordered(segs)
    assert len(chunks) == 2
    got = [(p.at, p.kind, p.packet_id) for p in pcap_mqtt.packets(chunks, True)]
    assert got == [(1.0, 4, 7), (3.0, 4, 9)]
    # a run that starts inside a packet is skipped, not misread
    torn = [pcap_mqtt.Segment(1.0, 1883, 5000, 0, puback(1)),
            pcap_mqtt.Segment(2.0, 1883, 5000, 9, b"\x00\x00\x05")]  # fmt: skip
    assert [p.packet_id for p in pcap_mqtt.packets(pcap_mqtt.ordered(torn), True)] == [1]


def test_a_file_that_is_not_a_capture_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"not a pcap at all, not at all")
    with pytest.raises(ValueError, match="not a classic pcap"):
        list(pcap_mqtt.segments(bad))
