"""Central's own step 1s, paced (``edgesched.sync.pacer``): the schedule itself on a fake
clock, and many documents' peers on one connection to a real Mosquitto, counted by a raw
subscriber: after a connect no more step 1s leave than the burst and the rate allow, every
document still converges, and an answer to another peer's step 1 never waits for a slot."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import aiomqtt
import pytest
from conftest import Broker
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import YSyncMessageType

from edgesched.core.policy import PolicyMode
from edgesched.sync import wire
from edgesched.sync.doc import PolicyDoc, client_id_for
from edgesched.sync.pacer import ResyncPacer
from edgesched.sync.peer import DocPeer
from edgesched.sync.session import Endpoint, MqttSession
from edgesched.sync.topics import DOC_SYNC_FILTER


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_goes_at_once_then_one_slot_per_interval() -> None:
    clock = FakeClock()
    pacer = ResyncPacer(rate=10.0, burst=3, clock=clock)
    slots = [pacer.reserve() for _ in range(6)]
    assert slots[:3] == [1000.0] * 3
    assert slots[3:] == pytest.approx([1000.1, 1000.2, 1000.3])
    assert pacer.backlog_s() == pytest.approx(0.3)


def test_an_idle_pacer_refills_its_burst() -> None:
    clock = FakeClock()
    pacer = ResyncPacer(rate=10.0, burst=3, clock=clock)
    for _ in range(5):
        pacer.reserve()
    clock.now += 10.0  # long idle: the line is gone and the burst is whole again
    assert [pacer.reserve() for _ in range(3)] == [clock.now] * 3
    assert pacer.reserve() > clock.now


def test_a_lost_connection_voids_the_line() -> None:
    clock = FakeClock()
    pacer = ResyncPacer(rate=1.0, burst=1, clock=clock)
    for _ in range(100):
        pacer.reserve()
    assert pacer.backlog_s() == pytest.approx(99.0)
    pacer.disconnected()
    assert pacer.voided == 1
    assert pacer.reserve() == clock.now  # the next connection starts a new line


@pytest.mark.parametrize("rate, burst", [(0.0, 1), (float("inf"), 1), (float("nan"), 1), (1, 0)])
def test_a_bad_rate_or_burst_is_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        ResyncPacer(rate=rate, burst=burst)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 1000.0),
    burst=st.integers(1, 50),
    steps=st.lists(st.tuples(st.floats(0.0, 2.0), st.integers(1, 20)), max_size=30),
)
def test_no_window_holds_more_slots_than_burst_and_rate_allow(
    rate: float, burst: int, steps: list[tuple[float, int]]
) -> None:
    """Any stretch of time [a, b] holds at most burst + rate * (b - a) slots, and no slot is
    in the past of when it was asked for (a token bucket's promise)."""
    clock = FakeClock()
    pacer = ResyncPacer(rate=rate, burst=burst, clock=clock)
    slots = []
    for advance, count in steps:
        clock.now += advance
        for _ in range(count):
            slot = pacer.reserve()
            assert slot >= clock.now
            slots.append(slot)
    slots.sort()
    for i in range(len(slots)):
        for j in range(i, len(slots)):
            assert j - i + 1 <= burst + rate * (slots[j] - slots[i]) + 1e-6


# --- through a real broker ------------------------------------------------------------------

DOCS = 40
CENTRAL = "central"


async def _count_step1s(port: int, seen: list[float], ready: asyncio.Event) -> None:
    """A raw subscriber to every document's sync topics: when each step 1 from ``central``
    arrived (time.monotonic)."""
    async with aiomqtt.Client("127.0.0.1", port, identifier="ear") as client:
        await client.subscribe(DOC_SYNC_FILTER, qos=1)
        ready.set()
        reassembler = wire.Reassembler()
        async for message in client.messages:
            if not message.topic.value.endswith(f"/{CENTRAL}"):
                continue
            assert isinstance(message.payload, bytes)
            frame = reassembler.feed(message.payload)
            if frame is None:
                continue
            sync = wire.decode_sync(frame.kind, frame.payload)
            if sync.step == YSyncMessageType.SYNC_STEP1:
                seen.append(time.monotonic())


async def _until(pred: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_many_documents_resync_at_the_pacers_rate_and_all_converge(broker: Broker) -> None:
    """Central's side: DOCS documents on one session, each with content the node lacks.
    The node's side: one peer per document, each on a connection of its own, listening to
    central only. Central's step 1s arrive no faster than the pacer allows; every node's
    copy still converges to central's."""
    seen: list[float] = []
    ready = asyncio.Event()
    ear = asyncio.create_task(_count_step1s(broker.port, seen, ready))
    await asyncio.wait_for(ready.wait(), 10)
    rate, burst = 20.0, 5
    pacer = ResyncPacer(rate=rate, burst=burst)
    session = MqttSession(Endpoint("127.0.0.1", broker.port, "central-session", keepalive_s=5))
    session.add(pacer)
    central_docs, node_docs, node_tasks = [], [], []
    writers = frozenset({client_id_for(CENTRAL)})
    for i in range(DOCS):
        doc = PolicyDoc(f"paced-{i}", client_id_for(CENTRAL))
        doc.set_mode(PolicyMode.ENERGY if i % 2 else PolicyMode.BALANCE)
        central_docs.append(doc)
        session.add(DocPeer(doc, CENTRAL, writers=writers, pacer=pacer))
        mine = PolicyDoc(f"paced-{i}", client_id_for(f"node-{i}"))
        node_docs.append(mine)
        peer = DocPeer(mine, f"node-{i}", "127.0.0.1", broker.port, writers=writers,
                       listen_to=[CENTRAL])  # fmt: skip
        node_tasks.append(asyncio.create_task(peer.run()))
    connected_at = time.monotonic()
    runner = asyncio.create_task(session.run())
    try:
        await _until(
            lambda: all(
                n.content_hash() == c.content_hash()
                for n, c in zip(node_docs, central_docs, strict=True)
            ),
            timeout=30,
        )
        await _until(lambda: len(seen) >= DOCS, timeout=10)
        seen.sort()
        # Never more than the burst plus the rate's share of the time since the connect:
        # arrival times at the ear only lag the sending, so the bound is safe on a slow
        # machine (fewer arrive, later).
        for k, at in enumerate(seen, start=1):
            assert k <= burst + rate * (at - connected_at) + 1, (k, at - connected_at)
        # and it took the line's length: DOCS step 1s cannot all have gone in the burst
        assert seen[DOCS - 1] - connected_at >= (DOCS - burst) / rate * 0.9
        assert pacer.reserved >= DOCS
    finally:
        for task in (runner, ear, *node_tasks):
            task.cancel()
        for task in (runner, ear, *node_tasks):
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await task


async def test_an_answer_does_not_wait_for_a_slot(broker: Broker) -> None:
    """A peer whose own step 1 waits far down the pacer's line still answers a node's step 1
    at once: the node converges in well under the line's length."""
    pacer = ResyncPacer(rate=0.01, burst=1)  # one slot per 100 s
    central = PolicyDoc("answers", client_id_for(CENTRAL))
    central.set_mode(PolicyMode.ENERGY)
    writers = frozenset({client_id_for(CENTRAL)})
    session = MqttSession(Endpoint("127.0.0.1", broker.port, "central-session", keepalive_s=5))
    session.add(pacer)
    blocker = PolicyDoc("blocker", client_id_for(CENTRAL))
    session.add(DocPeer(blocker, CENTRAL, writers=writers, pacer=pacer))  # takes the one slot
    central_peer = DocPeer(central, CENTRAL, writers=writers, pacer=pacer)
    session.add(central_peer)
    runner = asyncio.create_task(session.run())
    node = PolicyDoc("answers", client_id_for("node-1"))
    node_peer = DocPeer(node, "node-1", "127.0.0.1", broker.port, writers=writers,
                        listen_to=[CENTRAL])  # fmt: skip
    node_task: asyncio.Task[None] | None = None
    try:
        await _until(lambda: session.connected and central_peer.connected, timeout=10)
        await _until(lambda: pacer.backlog_s() > 50, timeout=10)  # central's step 1 in line
        node_task = asyncio.create_task(node_peer.run())
        await _until(lambda: node.content_hash() == central.content_hash(), timeout=20)
        assert central_peer.stats["step1_out"] == 0  # its own step 1 is still waiting
        assert central_peer.stats["step2_out"] >= 1
    finally:
        tasks = [t for t in (runner, node_task) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await task
