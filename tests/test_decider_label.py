"""Who decided a task a node placed, right from the first second of a cut (issue 14).

The node's mode follows central's heartbeat with a lease (15 s by default): inside it the
node still follows central through a blip. A decision's label asks more: the broker link up
and at most three of central's heartbeat intervals missed (``CentralLink.live``). A task
placed after central's last heartbeat, while that was not yet known, is relabelled
``edge-autonomous`` once it is. Unit tests of the link's judgement, then a real node over
Mosquitto with a stand-in central beating on the heartbeat topic.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import paho.mqtt.enums as enums
from conftest import Broker, EdgeNode, kill_task_processes, write_edge_config

from edgesched.config import MqttConfig
from edgesched.edge.link import MISSED_BEATS, CentralLink
from edgesched.sync.topics import HEARTBEAT_TOPIC


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def beat(link: CentralLink, **extra: object) -> None:
    link.handle(HEARTBEAT_TOPIC, json.dumps({"central": "c1", **extra}).encode())


def test_live_means_heard_within_three_beats_and_the_broker_up() -> None:
    clock = Clock()
    link = CentralLink("gw", MqttConfig(), clock=clock)
    assert not link.live(15.0)  # never heard
    link.broker_connected = True
    for _ in range(3):
        beat(link, every_s=1.0)
        clock.t += 1.0
    assert link.beat_s() == 1.0 and link.live(15.0)
    clock.t += MISSED_BEATS - 1.0 - 0.01  # (heard 1 s ago, then almost 3 s in all)
    assert link.live(15.0)
    clock.t += 0.02
    assert not link.live(15.0) and link.heard_within(15.0)  # the lease still holds
    link.broker_connected = False
    beat(link, every_s=1.0)
    assert not link.live(15.0)  # (a heartbeat without a broker link cannot be; judged off)


def test_without_every_s_the_median_gap_and_a_hostile_every_s_is_clamped() -> None:
    clock = Clock()
    link = CentralLink("gw", MqttConfig(), clock=clock)
    link.broker_connected = True
    beat(link)
    assert link.beat_s() is None and link.live(5.0)  # one beat: the lease alone
    for gap in (2.0, 2.0, 9.0):
        clock.t += gap
        beat(link)
    assert link.beat_s() == 2.0
    beat(link, every_s=1e-9)
    assert link.beat_s() == 0.05
    beat(link, every_s=1e9)
    assert link.beat_s() == 60.0
    clock.t += 30.0
    assert not link.live(20.0)  # never longer than the lease


def test_a_task_placed_after_the_last_heartbeat_is_autonomous(
    broker: Broker, tmp_path: Path
) -> None:
    config, state = write_edge_config(tmp_path, broker.port, lease_s=30.0)
    node = EdgeNode(config, state, tmp_path / "edge.log")
    node.start()
    central = mqtt.Client(enums.CallbackAPIVersion.VERSION2, client_id="central-test")
    central.connect("127.0.0.1", broker.port)
    central.loop_start()

    def beat_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            central.publish(HEARTBEAT_TOPIC, json.dumps({"central": "c1", "every_s": 1.0}))
            time.sleep(0.2)

    def submit(task_id: str) -> None:
        body = {"id": task_id, "command": ["sleep", "60"], "cpu": 0.05}
        assert node.request("POST", "/v1/tasks", body)[0] == 201

    def label(task_id: str) -> str:
        return str(node.tasks()[task_id]["decided_by"])

    try:
        node.wait(lambda: node.get("/v1/status")[1]["broker_connected"], what="broker link")
        beat_for(1.0)
        assert node.get("/v1/status")[1]["mode"] == "connected"
        submit("before-cut")
        node.wait(lambda: node.tasks()["before-cut"]["state"] == "running", what="placed")
        beat_for(0.6)  # central heard after it: connected, and it stays so
        # The cut: the last heartbeat went out; a task placed at once still reads as live.
        submit("in-first-second")
        node.wait(lambda: node.tasks()["in-first-second"]["state"] == "running", what="placed")
        assert label("in-first-second") == "edge-connected"
        # Three beats missed: it is relabelled, and what is placed now is autonomous at once,
        # while the mode (the 30 s lease) still says connected.
        node.wait(lambda: label("in-first-second") == "edge-autonomous", what="relabel")
        submit("inside-lease")
        node.wait(lambda: node.tasks()["inside-lease"]["state"] == "running", what="placed")
        assert label("inside-lease") == "edge-autonomous"
        assert node.get("/v1/status")[1]["mode"] == "connected"
        assert label("before-cut") == "edge-connected"
    finally:
        central.loop_stop()
        central.disconnect()
        if node.proc is not None and node.proc.poll() is None:
            node.kill(signal.SIGTERM)
        kill_task_processes(state)
