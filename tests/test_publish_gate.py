"""What central sends, in what order, when it has much to send: the publish gate
(sync/session.py ``PublishGate``: a bounded number of publishes pending per connection, urgent
ones, a writer's fresh update, ahead of the sync protocol's answers); a peer's own send loop,
which sends a fresh write ahead of the answers it still owes; and a healed node asked for its
document once, not twice.
In process for the gate's rules (hypothesis on random schedules), through a real Mosquitto
for the order the broker delivers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import aiomqtt
import pytest
from conftest import Broker
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import YSyncMessageType

from edgesched.core.task import TaskState
from edgesched.sync import session as session_module
from edgesched.sync import wire
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.pacer import ResyncPacer
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import TaskReport
from edgesched.sync.session import PublishGate


async def _spin() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_freed_slot_goes_to_the_first_urgent_waiter_then_in_order() -> None:
    gate = PublishGate(2)
    order: list[str] = []
    release = {name: asyncio.Event() for name in ("h1", "h2", "a", "b", "u1", "u2")}

    async def hold(name: str, urgent: bool) -> None:
        async with gate.turn(urgent=urgent):
            order.append(name)
            await release[name].wait()

    tasks = [asyncio.create_task(hold("h1", False)), asyncio.create_task(hold("h2", False))]
    await _spin()
    assert gate.pending == 2 and order == ["h1", "h2"]
    for name, urgent in (("a", False), ("b", False), ("u1", True), ("u2", True)):
        tasks.append(asyncio.create_task(hold(name, urgent)))
        await _spin()
    assert gate.waiting == (2, 2) and gate.pending == 2
    for name in ("h1", "h2", "u1", "u2", "a", "b"):
        release[name].set()
        await _spin()
    await asyncio.gather(*tasks)
    assert order == ["h1", "h2", "u1", "u2", "a", "b"]
    assert gate.pending == 0 and gate.waiting == (0, 0)


async def test_a_cancelled_waiter_leaves_the_queue_and_a_cancelled_grant_passes_it_on() -> None:
    gate = PublishGate(1)
    free = asyncio.Event()
    got: list[str] = []

    async def take(name: str, urgent: bool = False) -> None:
        async with gate.turn(urgent=urgent):
            got.append(name)
            if name == "first":
                await free.wait()

    first = asyncio.create_task(take("first"))
    await _spin()
    gone = asyncio.create_task(take("gone", urgent=True))
    granted = asyncio.create_task(take("granted", urgent=True))
    last = asyncio.create_task(take("last"))
    await _spin()
    assert gate.waiting == (2, 1)
    gone.cancel()  # cancelled while waiting: removed, nothing handed to it
    await _spin()
    assert gate.waiting == (1, 1)
    free.set()
    # "first" releases: the slot is handed to "granted"; cancel it before it resumes, so
    # the slot it was given must reach "last" instead of being lost.
    while not first.done():
        await asyncio.sleep(0)
    granted.cancel()
    await asyncio.gather(first, last)
    for task in (gone, granted):
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
    assert got == ["first", "last"]
    assert gate.pending == 0 and gate.waiting == (0, 0)


def test_a_gate_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        PublishGate(0)


#: A random schedule: per publish, whether it is urgent, how many loop turns it holds its
#: slot, after how many turns it asks, and whether it is cancelled (and after how many turns).
_schedule = st.lists(
    st.tuples(
        st.booleans(),
        st.integers(0, 4),
        st.integers(0, 6),
        st.one_of(st.none(), st.integers(0, 8)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(slots=st.integers(1, 4), bulk=st.integers(1, 4), schedule=_schedule)
def test_the_gate_never_exceeds_its_slots_loses_none_and_puts_urgent_first(
    slots: int, bulk: int, schedule: list[tuple[bool, int, int, int | None]]
) -> None:
    """Whatever the arrivals, holds and cancellations: never more than ``slots`` pending nor
    more than ``bulk_slots`` normal ones, every slot back at the end (none lost to a cancel,
    every publish served or cancelled: none left waiting), each lane's turns in the order it
    asked, and no turn handed to a normal publish while an urgent one that got a turn later
    was already waiting. (Turns are numbered when handed out: a waiter handed one resumes a
    little later, possibly after a later arrival took a free slot.)"""

    async def run() -> None:
        bulk_slots = min(bulk, slots)
        gate = PublishGate(slots, bulk_slots)
        holding = [0]  # normal publishes holding a slot now
        asked_at: dict[int, int] = {}  # publish -> turns handed out when it asked
        turn_of: dict[int, int] = {}
        lane: dict[int, bool] = {}
        asked_order: list[int] = []

        async def one(i: int, urgent: bool, hold: int, delay: int) -> None:
            for _ in range(delay):
                await asyncio.sleep(0)
            asked_at[i], lane[i] = gate.grants, urgent
            asked_order.append(i)
            async with gate.turn(urgent=urgent) as ticket:
                holding[0] += not urgent
                try:
                    assert gate.pending <= slots and holding[0] <= bulk_slots
                    turn_of[i] = ticket
                    for _ in range(hold):
                        await asyncio.sleep(0)
                finally:
                    holding[0] -= not urgent

        async def cancel_later(task: asyncio.Task[None], after: int) -> None:
            for _ in range(after):
                await asyncio.sleep(0)
            task.cancel()

        tasks = []
        for i, (urgent, hold, delay, cancel_at) in enumerate(schedule):
            task = asyncio.create_task(one(i, urgent, hold, delay))
            tasks.append(task)
            if cancel_at is not None:
                tasks.append(asyncio.create_task(cancel_later(task, cancel_at)))
        async with asyncio.timeout(30):  # (a publish left waiting would hang here)
            results = await asyncio.gather(*tasks, return_exceptions=True)
        assert not [r for r in results if isinstance(r, AssertionError)]
        assert gate.pending == 0 and gate.waiting == (0, 0)
        assert len(set(turn_of.values())) == len(turn_of)  # one publish a turn
        for urgent in (True, False):  # within a lane: first come, first served
            served = [turn_of[i] for i in asked_order if lane[i] is urgent and i in turn_of]
            assert served == sorted(served)
        for n in turn_of:  # a normal turn never went past an urgent publish waiting then
            if lane[n]:
                continue
            for u in turn_of:
                if lane[u] and asked_at[u] <= turn_of[n] < turn_of[u]:
                    raise AssertionError(f"normal {n} (turn {turn_of[n]}) before urgent {u}")

    asyncio.run(run())


async def _listen(port: int, into: list[bytes], ready: asyncio.Event, topic: str) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"ear-{id(into)}") as client:
        await client.subscribe(topic, qos=1)
        ready.set()
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            into.append(message.payload)


async def _stop(*tasks: asyncio.Task[None]) -> None:
    """Cancel ``tasks`` (a peer, a listener) and wait for each to end."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
            await task


async def _wait_for(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.02)


async def test_an_urgent_publish_overtakes_a_backlog_through_mosquitto(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 answers queued on one connection, then one fresh update: the broker delivers the
    update among the first few dozen (at most a gate's worth of answers plus paho's window are
    ahead of it), not after all 300 as a single first-come lane did."""
    monkeypatch.setattr(session_module, "MAX_PENDING_PUBLISHES", 8)
    received: list[bytes] = []
    ready = asyncio.Event()
    ear = asyncio.create_task(_listen(broker.port, received, ready, "gate/#"))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="gate-pub") as client:
            backlog = [
                asyncio.create_task(session_module.publish(client, "gate/a", b"a%03d" % i, qos=1))
                for i in range(300)
            ]
            await asyncio.sleep(0)  # they all asked: a few hold slots, the rest wait
            await session_module.publish(client, "gate/u", b"urgent", qos=1, urgent=True)
            await asyncio.gather(*backlog)
            await _wait_for(lambda: len(received) == 301, f"all delivered ({len(received)})")
        at = received.index(b"urgent")
        assert at < 40, at  # FIFO would have put it last (300)
        answers = [p for p in received if p != b"urgent"]
        assert answers == [b"a%03d" % i for i in range(300)]  # the backlog kept its order
    finally:
        await _stop(ear)


async def test_a_peer_sends_a_fresh_write_ahead_of_the_answers_it_owes(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's peer (central's) asked for step 2 by 200 askers at once (a heal), then
    writing an entry: the update reaches the broker before most of the answers, where the
    send loop used to drain every answer first."""
    monkeypatch.setattr(session_module, "MAX_PENDING_PUBLISHES", 4)
    doc = NodeDoc("node-gate", client_id_for("central"))
    for i in range(50):  # something to answer with
        doc.put_task(f"t{i}", TaskReport(state=TaskState.RUNNING, updated_at=1.0))
    peer = DocPeer(doc, "central", "127.0.0.1", broker.port)
    received: list[tuple[wire.Kind, bytes]] = []
    ready = asyncio.Event()

    async def ear() -> None:
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="peer-ear") as client:
            await client.subscribe(f"edgesched/v1/doc/{doc.name}/#", qos=1)
            ready.set()
            reassembler = wire.Reassembler()
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                got = reassembler.feed(message.payload)
                if got is not None:
                    received.append((got.kind, got.payload))

    listening = asyncio.create_task(ear())
    await asyncio.wait_for(ready.wait(), 10)
    running = asyncio.create_task(peer.run())
    try:
        await _wait_for(lambda: peer.connected and peer.stats["step1_out"] >= 1, "connected")
        await _wait_for(lambda: len(received) >= 1, "central's own step 1 heard")
        received.clear()
        empty_sv = b"\x00"
        for i in range(200):  # askers that have nothing: each is owed the whole document
            payload = wire.step1_payload(empty_sv, replies=True)  # each its own reply topic
            for frame in wire.encode(wire.Kind.SYNC, doc.name, 1000 + i, payload, 1 << 20):
                peer.handle(f"edgesched/v1/doc/{doc.name}/sync/asker-{i}", frame)
        # the send loop is now working through the answers: write while most are still owed
        await _wait_for(lambda: peer.stats["step2_out"] >= 5, "answering", timeout=15)
        doc.put_task("fresh", TaskReport(state=TaskState.ACCEPTED, updated_at=2.0))
        answered = peer.stats["step2_out"]
        assert answered < 150, answered  # (else the test proves nothing: rerun slower)
        await _wait_for(
            lambda: any(kind is wire.Kind.UPDATE for kind, _ in received), "the update heard"
        )
        at = next(n for n, (kind, _) in enumerate(received) if kind is wire.Kind.UPDATE)
        await _wait_for(lambda: peer.stats["step2_out"] >= 200, "every answer sent")
        # behind every answer owed it would be at 200; ahead of them, it waits at most for
        # the gate's 4 slots and paho's window of 20 (answers already handed to paho)
        assert at <= answered + 4 + 20 + 1, (at, answered)
    finally:
        await _stop(running, listening)


@pytest.mark.parametrize("sole_asker", [True, False])
async def test_a_step1_back_to_the_sole_writer_stands_for_a_pending_resync(
    broker: Broker, sole_asker: bool
) -> None:
    """Central's replica of a node's document when the node comes back: the node's status
    asked a resync (a step 1 waiting for its paced slot) and the node's own step 1 shows it
    holds what central lacks, so central sends its step 1 back on the node's reply topic at
    once. Alone with the node (``sole_asker``), that one stands for the paced one: the node
    answers once, not twice. With fellow centrals the paced one still goes (they hear it)."""
    node = NodeDoc("node-gw1", client_id_for("gw1"))
    node.put_task("t1", TaskReport(state=TaskState.RUNNING, updated_at=1.0))
    replica = NodeDoc("node-gw1", client_id_for("central"))
    pacer = ResyncPacer(rate=1.0, burst=1)
    pacer.reserve()  # the slot now is taken: the connect-time step 1 waits ~1 s
    peer = DocPeer(
        replica,
        "central",
        "127.0.0.1",
        broker.port,
        writers=frozenset({node.client_id}),
        pacer=pacer,
        sole_asker=sole_asker,
    )
    heard: list[str] = []  # the topics central's step 1s went to
    ready = asyncio.Event()

    async def ear() -> None:
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="step1-ear") as client:
            await client.subscribe("edgesched/v1/doc/node-gw1/#", qos=1)
            ready.set()
            reassembler = wire.Reassembler()
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                got = reassembler.feed(message.payload)
                if got is None or got.sender != replica.client_id:
                    continue
                if wire.decode_sync(got.kind, got.payload).step == YSyncMessageType.SYNC_STEP1:
                    heard.append(message.topic.value)

    listening = asyncio.create_task(ear())
    await asyncio.wait_for(ready.wait(), 10)
    running = asyncio.create_task(peer.run())
    try:
        await _wait_for(lambda: peer.connected, "connected")
        ask = wire.step1_payload(node.state_vector(), replies=True)
        (frame,) = wire.encode(wire.Kind.SYNC, node.name, node.client_id, ask, 1 << 20)
        peer.handle("edgesched/v1/doc/node-gw1/sync/gw1", frame)
        reply = wire.reply_topic(node.name, "gw1", "central")
        await _wait_for(lambda: reply in heard, "the step 1 back on the node's reply topic")
        await asyncio.sleep(2.0)  # past the paced slot
        own = wire.sync_topic(node.name, "central")
        assert heard.count(reply) == 1
        assert heard.count(own) == (0 if sole_asker else 1), heard
    finally:
        await _stop(running, listening)


async def test_bulk_publishes_hold_at_most_their_slots_and_leave_the_rest_to_urgent() -> None:
    """With 4 slots, 2 for bulk: a third bulk publish waits although slots are free, an
    urgent one takes a free slot at once, and the bulk waiter goes on when a bulk slot
    frees (an urgent one freeing a slot does not let it past its bound)."""
    gate = PublishGate(4, bulk_slots=2)
    release = {name: asyncio.Event() for name in ("b1", "b2", "b3", "u1")}
    order: list[str] = []

    async def hold(name: str, urgent: bool) -> None:
        async with gate.turn(urgent=urgent):
            order.append(name)
            await release[name].wait()

    tasks = [asyncio.create_task(hold(n, False)) for n in ("b1", "b2", "b3")]
    await _spin()
    assert order == ["b1", "b2"] and gate.pending == 2 and gate.waiting == (0, 1)
    tasks.append(asyncio.create_task(hold("u1", True)))
    await _spin()
    assert order == ["b1", "b2", "u1"] and gate.pending == 3
    release["u1"].set()
    await _spin()
    assert order == ["b1", "b2", "u1"] and gate.waiting == (0, 1)  # still bound: 2 bulk held
    release["b1"].set()
    await _spin()
    assert order == ["b1", "b2", "u1", "b3"]
    for name in ("b2", "b3"):
        release[name].set()
    await asyncio.gather(*tasks)
    assert gate.pending == 0 and gate.waiting == (0, 0)
    with pytest.raises(ValueError, match="bulk_slots"):
        PublishGate(4, bulk_slots=5)
