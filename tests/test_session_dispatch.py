"""The session's dispatcher: a burst read from the socket is handed out as one batch (what the
messages wake runs once after it, not between every two), every message in order, and the end
of the connection still ends the dispatcher (so the session reconnects)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import paho.mqtt.client as mqtt
from conftest import Broker
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import Endpoint, Listener, MqttSession

BURST = 200


class Burst(Listener):
    """Records what arrives on ``burst/+``; the first message blocks the event loop for a
    moment (as a long control step would), so the rest of the burst piles up meanwhile."""

    def __init__(self) -> None:
        self.routes: tuple[str, ...] = ("burst/+",)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            ("burst/+", SubscribeOptions(qos=1)),
        )
        self.got: list[bytes] = []
        self.woken = asyncio.Event()
        self.block_s = 0.0

    def handle(self, topic: str, payload: bytes) -> None:
        self.got.append(payload)
        self.woken.set()  # as a replica's change wakes central's control loop
        if self.block_s:
            time.sleep(self.block_s)
            self.block_s = 0.0


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def publish_burst(port: int, count: int) -> None:
    """``count`` QoS 1 messages from a client of its own (its own thread), every PUBACK in."""
    acked = threading.Event()
    done = 0

    def on_publish(client: object, userdata: object, mid: int, *_: object) -> None:
        nonlocal done
        done += 1
        if done == count:
            acked.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="burst-pub", protocol=mqtt.MQTTv5)
    client.on_publish = on_publish
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for i in range(count):
            client.publish(f"burst/{i % 7}", i.to_bytes(4, "big"), qos=1)
        assert acked.wait(20), f"{done} of {count} acknowledged"
    finally:
        client.disconnect()
        client.loop_stop()


async def test_a_burst_is_handed_out_in_batches_in_order(broker: Broker) -> None:
    channel = Burst()
    session = MqttSession(Endpoint("127.0.0.1", broker.port, "burst-sub"))
    session.add(channel)
    woken = 0

    async def wakes() -> None:  # a task woken by every message, as central's control loop
        nonlocal woken
        while True:
            await channel.woken.wait()
            channel.woken.clear()
            woken += 1

    tasks = [asyncio.create_task(session.run()), asyncio.create_task(wakes())]
    try:
        await until(lambda: session.connected)
        await asyncio.sleep(0.2)  # (subscribed)
        channel.block_s = 0.5
        await asyncio.to_thread(publish_burst, broker.port, BURST)
        await until(lambda: len(channel.got) == BURST)
        await asyncio.sleep(0.1)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert [int.from_bytes(p, "big") for p in channel.got] == list(range(BURST))
    # One message per event-loop iteration would wake it about once per message; the
    # broker lets 20 in flight to a subscriber, so batches of ~20 wake it ~BURST / 20 times.
    assert woken <= BURST // 4, woken
    assert session.stats["messages_in"] == BURST and session.stats["unrouted"] == 0


async def test_the_dispatcher_ends_with_the_connection(broker: Broker) -> None:
    """Nothing but the dispatcher watches this connection (the channel never publishes): the
    session must still see it go, reconnect, and receive again."""
    channel = Burst()
    session = MqttSession(
        Endpoint("127.0.0.1", broker.port, "burst-sub"), backoff_initial_s=0.1, backoff_max_s=0.2
    )
    session.add(channel)
    run = asyncio.create_task(session.run())
    try:
        await until(lambda: session.connected)
        broker.stop()
        await until(lambda: not session.connected, 5)
        broker.start()
        await until(lambda: session.connected and session.stats["connects"] == 2)
        await asyncio.sleep(0.2)  # (subscribed again)
        await asyncio.to_thread(publish_burst, broker.port, 3)
        await until(lambda: len(channel.got) == 3)
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
