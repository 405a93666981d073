"""The node side of ``bench_central_fanin.py --broker``: pre-encoded frames through the broker.

Run by the benchmark as a process of its own (nothing of pycrdt or edgesched is imported
here, so publishing costs central's process nothing and this one only the MQTT client):
reads the ``(topic, frame)`` pairs the parent pickled, in the order to publish them, connects
to the broker with paho-mqtt (MQTT 5, clean start, as ``--client-id``), prints ``ready``,
waits for a line on stdin, publishes every frame QoS 1 on its topic (a node's sync topic, as
its ``DocPeer`` publishes), as fast as the client goes or at ``--rate`` frames per second, waits
for every PUBACK and prints one JSON line: frames published and acknowledged, the
``time.monotonic()`` of the first publish and of the last PUBACK (the parent's clock too:
one machine), and this process's CPU seconds over that window.

    python bench/fanin_publisher.py --port PORT --frames FILE [--rate 0]
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--frames", type=Path, required=True, help="pickled [(topic, frame)]")
    parser.add_argument("--rate", type=float, default=0.0, help="frames/s (0: as fast as it can)")
    parser.add_argument("--client-id", default="bench-fanin-pub")
    args = parser.parse_args()
    frames: list[tuple[str, bytes]] = pickle.loads(args.frames.read_bytes())

    acked = 0
    all_acked = threading.Event()
    last_ack = 0.0
    connected = threading.Event()

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        connected.set()

    def on_publish(client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        nonlocal acked, last_ack
        acked += 1
        if acked == len(frames):
            last_ack = time.monotonic()
            all_acked.set()

    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=args.client_id, protocol=mqtt.MQTTv5
    )
    client.on_connect = on_connect
    client.on_publish = on_publish
    client.connect(args.host, args.port, keepalive=30, clean_start=True)
    client.loop_start()
    if not connected.wait(10):
        raise SystemExit("publisher: no CONNACK within 10 s")
    print("ready", flush=True)
    sys.stdin.readline()  # the parent's go
    cpu0 = time.process_time()
    first = time.monotonic()
    for i, (topic, frame) in enumerate(frames):
        if args.rate > 0:  # frame i is due at first + i / rate
            ahead = first + i / args.rate - time.monotonic()
            if ahead > 0.001:
                time.sleep(ahead)
        client.publish(topic, frame, qos=1)
    if frames and not all_acked.wait(600):
        raise SystemExit(f"publisher: {acked} of {len(frames)} acknowledged after 600 s")
    cpu = time.process_time() - cpu0
    client.disconnect()
    client.loop_stop()
    report = {
        "published": acked,
        "first": first,
        "last_ack": last_ack if frames else first,
        "cpu_s": cpu,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
