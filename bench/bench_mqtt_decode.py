"""What decoding a received MQTT v5 PUBLISH costs with paho's own property tables and with
:mod:`edgesched.sync.pahofast`'s shared ones (central decodes ~2,500 a second at 10,000 nodes).

Decodes the same telemetry-sized PUBLISH (no properties, as the nodes send them) and one with a
user property, ``--messages`` times and ten times as many, with paho's ``Properties`` and with
:class:`~edgesched.sync.pahofast.SharedTableProperties` in turn, in this process; prints the
cost per message, the shared tables' speed-up (the ratio), and how the cost grows with the count.

    .venv/bin/python bench/bench_mqtt_decode.py [--messages 20000]
"""

from __future__ import annotations

import argparse
import struct
import time

from paho.mqtt import _packet
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgesched.sync.pahofast import SharedTableProperties


def packet(props: bytes) -> bytes:
    topic = b"edgesched/v1/node/gw-0042/telemetry"
    payload = b'{"at": 1764676800.0, "cpu_util": 0.42, "mem_util": 0.31, "power_w": 88.5}'
    return struct.pack("!H", len(topic)) + topic + struct.pack("!H", 7) + props + payload


def per_message_us(cls: type[Properties], data: bytes, count: int) -> float:
    setattr(_packet, "Properties", cls)  # noqa: B010 (what pahofast.install does)
    started = time.perf_counter()
    for _ in range(count):
        _packet.decode_publish(0x32, data, MQTTProtocolVersion.MQTTv5)
    return (time.perf_counter() - started) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    user = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    user.UserProperty = ("trace", "abc123")
    cases = {"no properties": packet(b"\x00"), "a user property": packet(user.pack())}  # type: ignore[no-untyped-call]
    original = getattr(_packet, "Properties")  # noqa: B009
    print(f"{'packet':<18}{'messages':>10}{'paho (us)':>11}{'shared (us)':>13}{'speed-up':>10}")
    try:
        for name, data in cases.items():
            costs = []
            for count in (args.messages, args.messages * 10):
                theirs = per_message_us(Properties, data, count)
                ours = per_message_us(SharedTableProperties, data, count)
                costs.append(ours)
                print(f"{name:<18}{count:>10,}{theirs:>11.2f}{ours:>13.2f}{theirs / ours:>9.1f}x")
            print(f"{'':<18}growth of the shared cost per message, x10 messages: "
                  f"{costs[1] / costs[0]:.2f}x")  # fmt: skip
    finally:
        setattr(_packet, "Properties", original)  # noqa: B010


if __name__ == "__main__":
    main()
