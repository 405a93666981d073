"""DocPeer against a real Mosquitto: convergence, offline edits, chunked large docs, garbage."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from conftest import Broker, free_port

from edgesched.core.task import TaskState
from edgesched.sync import wire
from edgesched.sync.doc import SiteDoc, UpdateRejected
from edgesched.sync.peer import DocPeer, wait_converged
from edgesched.sync.schema import TaskReport

log = logging.getLogger("test_sync_peer")


def report(state: str = "running", at: float = 1.0, **kw: Any) -> TaskReport:
    """A node's report of one task (the generic content of a node document in these tests)."""
    return TaskReport(state=TaskState(state), updated_at=at, **kw)


DOC = "site-a"

Factory = Callable[..., tuple[SiteDoc, DocPeer]]
Peers = tuple[Broker, Factory, list[asyncio.Task[None]]]


@pytest.fixture
async def peers(broker: Broker) -> AsyncIterator[Peers]:
    tasks: list[asyncio.Task[None]] = []

    def make(
        peer_id: str, client_id: int, *, b: Broker | None = None, **kw: object
    ) -> tuple[SiteDoc, DocPeer]:
        doc = SiteDoc(DOC, client_id)
        peer = DocPeer(
            doc,
            peer_id,
            "127.0.0.1",
            (b or broker).port,
            keepalive=2,
            backoff_initial_s=0.1,
            backoff_max_s=0.5,
            **kw,  # type: ignore[arg-type]
        )
        tasks.append(asyncio.create_task(peer.run()))
        return doc, peer

    yield broker, make, tasks
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


async def until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


async def test_two_peers_converge_after_concurrent_edits(peers: Peers) -> None:
    _, make, _ = peers
    a, pa = make("node-a", 1)
    b, pb = make("node-b", 2)
    a.set("before", 0)  # edited before connecting: the step 1 / step 2 exchange carries it
    await until(lambda: pa.connected and pb.connected)
    for i in range(50):
        a.set(f"a{i}", i)
        b.set(f"b{i}", i)
        a.set("shared", f"a{i}")
        b.set("shared", f"b{i}")
        if i % 10 == 0:
            await asyncio.sleep(0)
    await wait_converged([a, b], timeout=5)
    assert a.get("a49") == 49 and a.get("b49") == 49 and a.get("before") == 0
    assert a.get("shared") == b.get("shared")
    assert pa.stats["rejected_frames"] == pb.stats["rejected_frames"] == 0
    assert pa.stats["updates_out"] >= 1 and pb.stats["updates_in"] >= 1
    assert pa.stats["own_dropped"] == 0  # no-local: the broker does not send our own back


async def test_three_peers_converge(peers: Peers) -> None:
    _, make, _ = peers
    docs = [make(f"node-{i}", 10 + i) for i in range(3)]
    await until(lambda: all(p.connected for _, p in docs))
    for round_ in range(20):
        for i, (d, _) in enumerate(docs):
            d.set(f"k{i}-{round_}", round_)
            d.set("hot", f"{i}-{round_}")
            if round_ % 5 == 0:
                d.delete(f"k{i}-{round_ - 5}")
        await asyncio.sleep(0.005)
    await wait_converged([d for d, _ in docs], timeout=5)
    d0 = docs[0][0]
    assert d0.get("k2-19") == 19 and d0.get("k1-5") is None


async def test_late_joiner_gets_everything(peers: Peers) -> None:
    _, make, _ = peers
    a, pa = make("node-a", 1)
    for i in range(100):
        a.set(f"k{i}", i)
    await until(lambda: pa.connected)
    await asyncio.sleep(0.2)
    c, _ = make("node-c", 3)
    await wait_converged([a, c], timeout=5)
    assert c.get("k99") == 99


def _send_loop_chain(peer: DocPeer) -> list[Any]:
    """The frames of ``peer``'s send loop and of the coroutines it awaits now."""
    for task in asyncio.all_tasks():
        coro: Any = task.get_coro()
        frames = []
        while coro is not None and getattr(coro, "cr_frame", None) is not None:
            frames.append(coro.cr_frame)
            coro = getattr(coro, "cr_await", None)
        for i, frame in enumerate(frames):
            code = frame.f_code.co_qualname
            if code == "DocPeer._send_loop" and frame.f_locals.get("self") is peer:
                return frames[i:]
    return []


async def test_an_idle_send_loop_holds_no_payload(peers: Peers) -> None:
    """A peer that answered a late joiner's step 1 with its whole document keeps none of
    that answer once idle: central has a peer per node document, 20,000 at 10,000 nodes, and
    each one's last answer (its whole document) was kept by a local of the send loop."""
    _, make, _ = peers
    a, pa = make("node-a", 1)
    for i in range(300):
        a.set(f"k{i}", "x" * 40)
    await until(lambda: pa.connected)
    await asyncio.sleep(0.2)
    c, _ = make("node-c", 3)
    await wait_converged([a, c], timeout=5)
    await until(lambda: pa.stats["step2_out"] >= 1)
    await asyncio.sleep(0.2)  # (idle: the send loop waits to be woken)
    frames = _send_loop_chain(pa)
    assert frames, "no send loop found"
    held = [
        (frame.f_code.co_qualname, name, len(value))
        for frame in frames
        for name, value in frame.f_locals.items()
        if isinstance(value, bytes | bytearray) and len(value) > 1024
    ]
    assert held == []


async def test_offline_edits_converge_after_broker_restart(peers: Peers) -> None:
    broker, make, _ = peers
    a, pa = make("node-a", 1)
    b, pb = make("node-b", 2)
    await until(lambda: pa.connected and pb.connected)
    a.set("x", 1)
    await wait_converged([a, b], timeout=5)

    broker.stop()
    await until(lambda: not pa.connected and not pb.connected)
    for i in range(30):  # both keep editing while cut off
        a.set(f"a{i}", i)
        b.set(f"b{i}", i)
        a.set("x", "a-offline")
    b.delete("x")
    assert a.content_hash() != b.content_hash()

    broker.start()
    t0 = time.monotonic()
    await until(lambda: pa.connected and pb.connected)
    took = await wait_converged([a, b], timeout=8)
    log.warning("healed after broker restart in %.3fs (+%.3fs)", time.monotonic() - t0, took)
    assert a.get("b29") == 29 and b.get("a29") == 29
    assert pa.stats["connects"] >= 2 and pb.stats["connects"] >= 2


async def test_cancelled_peer_restarts_and_converges(peers: Peers) -> None:
    _, make, tasks = peers
    a, pa = make("node-a", 1)
    b, pb = make("node-b", 2)
    await until(lambda: pa.connected and pb.connected)
    a.set("k", 0)
    await wait_converged([a, b], timeout=5)

    # Cut b off (its task cancelled); both keep editing; b comes back with the same session.
    tb = tasks[1]
    tb.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await tb
    for i in range(20):
        a.set(f"a{i}", i)  # QoS 1: the broker queues these for b's persistent session
        b.set(f"b{i}", i)
    await asyncio.sleep(0.3)
    tasks[1] = asyncio.create_task(pb.run())
    await wait_converged([a, b], timeout=5)
    assert b.get("a19") == 19 and a.get("b19") == 19


@pytest.fixture
def small_broker(tmp_path: Path) -> Iterator[Broker]:
    """Mosquitto refusing any packet/message above 64 KiB."""
    port = free_port()
    conf = tmp_path / "mosquitto-64k.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest none\n"
        "max_packet_size 65536\nmessage_size_limit 65536\n"
    )
    b = Broker(port, None, conf)  # type: ignore[arg-type]
    b.start()
    try:
        yield b
    finally:
        b.stop()


async def test_large_doc_syncs_through_64k_broker(peers: Peers, small_broker: Broker) -> None:
    _, make, _ = peers
    a, pa = make("node-a", 1, b=small_broker, max_packet=65536)
    for i in range(1000):
        a.set(f"key-{i:04d}", "v" * 200)
    size = len(a.diff())
    assert size > 200_000
    await until(lambda: pa.connected)

    # Unchunked, the same state never arrives: the broker drops the client instead.
    raw = aiomqtt.Client("127.0.0.1", small_broker.port, protocol=aiomqtt.ProtocolVersion.V5)
    with pytest.raises(aiomqtt.MqttError):
        async with raw:
            await raw.publish(wire.sync_topic(DOC, "raw"), a.diff(), qos=0)
            async for _ in raw.messages:  # the broker cuts us off: "Packet too large"
                break

    t0 = time.monotonic()
    b, pb = make("node-b", 2, b=small_broker, max_packet=65536)
    took = await wait_converged([a, b], timeout=8)
    log.warning(
        "%d-byte doc synced in %.3fs from start (%.3fs waiting); a: %s; b: %s",
        size,
        time.monotonic() - t0,
        took,
        {k: v for k, v in pa.stats.items() if v},
        {k: v for k, v in pb.stats.items() if v},
    )
    assert b.get("key-0999") == "v" * 200
    assert pa.stats["frames_out"] >= 4  # the step 2 went out in chunks
    assert pa.stats["connects"] == 1 and pb.stats["connects"] == 1  # nobody was dropped


async def test_garbage_is_dropped_and_counted(peers: Peers) -> None:
    broker, make, _ = peers
    a, pa = make("node-a", 1)
    b, pb = make("node-b", 2)
    await until(lambda: pa.connected and pb.connected)
    a.set("k", 1)
    await wait_converged([a, b], timeout=5)

    topic = wire.sync_topic(DOC, "evil")
    valid_frame_bad_update = wire.encode(
        wire.Kind.UPDATE, DOC, 66, wire.update_payload(b"\xff\xfe garbage", b"\x00")
    )[0]
    valid_frame_bad_sync = wire.encode(wire.Kind.SYNC, DOC, 66, b"\x07\x07")[0]
    bad_sv = wire.encode(wire.Kind.SYNC, DOC, 66, wire.step1_payload(b"\xff\xff"))[0]
    flipped = bytearray(valid_frame_bad_sync)
    flipped[-1] ^= 0x10
    async with aiomqtt.Client("127.0.0.1", broker.port, protocol=aiomqtt.ProtocolVersion.V5) as c:
        for payload in (
            b"not a frame at all",
            b"ES" + bytes(100),
            bytes(flipped),
            valid_frame_bad_sync,
            valid_frame_bad_update,
            bad_sv,
        ):
            await c.publish(topic, payload, qos=1)
    await until(
        lambda: all(
            p.stats["rejected_frames"] >= 3
            and p.stats["rejected_payloads"] >= 1
            and p.stats["rejected_updates"] >= 2
            for p in (pa, pb)
        )
    )
    # Still connected, still syncing.
    b.set("after", 2)
    await wait_converged([a, b], timeout=5)
    assert a.get("after") == 2
    assert pa.connected and pb.connected
    assert pa.stats["connects"] == 1 and pb.stats["connects"] == 1
    with pytest.raises(UpdateRejected):
        a.apply_remote(b"\xff\xfe garbage", sender="evil")


async def test_cancel_stops_a_peer_promptly_connected_or_not(broker: Broker) -> None:
    """Cancelling run() is never swallowed: not mid-session, not while reconnecting, not
    while the session is tearing down after a lost broker."""
    from edgesched.sync.doc import client_id_for

    for phase in ("connected", "broker-lost"):
        doc = SiteDoc("site-cancel", client_id_for(f"cancel-{phase}"))
        peer = DocPeer(doc, f"p-{phase}", "127.0.0.1", broker.port, backoff_max_s=0.2)
        task = asyncio.create_task(peer.run())
        for _ in range(100):
            if peer.connected:
                break
            await asyncio.sleep(0.05)
        assert peer.connected
        if phase == "broker-lost":
            broker.stop()
            await asyncio.sleep(0.3)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 2.0)
        assert task.done()
        if phase == "broker-lost":
            broker.start()


def test_central_refuses_operations_of_anyone_but_the_writer() -> None:
    """A node's document accepts only the node's own operations, whoever relays them: an
    update carrying another client id's items is refused whole and counted."""
    from edgesched.sync.doc import NodeDoc, client_id_for

    writer = NodeDoc("node-gw1", client_id_for("gw1"))
    forger = NodeDoc("node-gw1", client_id_for("gw2"))
    replica = NodeDoc("node-gw1", client_id_for("central"))
    peer = DocPeer(replica, "central", writers=frozenset({writer.client_id}))

    def frame(doc: NodeDoc, update: bytes) -> bytes:
        payload = wire.update_payload(update, doc.state_vector())
        (only,) = wire.encode(wire.Kind.UPDATE, doc.name, doc.client_id, payload, 65536)
        return only

    writer.put_task("t1", report("running"))
    peer.handle(wire.sync_topic("node-gw1", "gw1"), frame(writer, writer.diff()))
    assert replica.task("t1") == report("running")

    forger.put_task("t1", report("cancelled"))  # gw2 forging gw1's task
    forger.put_task("evil", report("running"))
    for sender in ("gw2", "gw1"):  # on its own topic, or relayed under the writer's name
        peer.handle(wire.sync_topic("node-gw1", sender), frame(forger, forger.diff()))
    assert peer.stats["rejected_authorship"] == 2
    assert replica.task("evil") is None and replica.task("t1") == report("running")
    assert replica.content_hash() == writer.content_hash()

    garbage = frame(writer, b"\xff\xfe not an update")
    peer.handle(wire.sync_topic("node-gw1", "gw1"), garbage)
    assert peer.stats["rejected_updates"] == 1
    assert peer.stats["rejected_authorship"] == 2


def test_an_update_that_leaves_the_replica_behind_its_sender_marks_it_unsettled() -> None:
    """An update applied while something of the writer's is missing (its carried state
    vector is ahead of ours after it) may complete pending updates later without map events:
    the peer marks the document, so the writer's next full answer reads it all again."""
    from pycrdt import merge_updates

    from edgesched.sync.doc import NodeDoc, client_id_for

    writer = NodeDoc("node-gw1", client_id_for("gw1"))
    replica = NodeDoc("node-gw1", client_id_for("central"))
    peer = DocPeer(replica, "central", writers=frozenset({writer.client_id}))
    updates: list[bytes] = []
    writer.on_local_update(updates.append)

    def frame(update: bytes) -> bytes:
        payload = wire.update_payload(update, writer.state_vector())
        (only,) = wire.encode(wire.Kind.UPDATE, writer.name, writer.client_id, payload, 65536)
        return only

    topic = wire.sync_topic("node-gw1", "gw1")
    writer.put_task("t1", report("running"))
    peer.handle(topic, frame(updates[0]))
    assert not replica.unsettled  # in order, whole
    writer.put_task("t2", report("running"))  # (lost on the way)
    writer.remove_task("t1")
    writer.put_task("t3", report("running"))
    # t1's removal applies (a change pycrdt reports) while t3's struct waits for t2 (the
    # replica's state vector stays behind): the document alone cannot tell (the update's
    # structs start past clock 0); the state vector the update carries can
    before = replica.state_vector()
    peer.handle(topic, frame(merge_updates(updates[2], updates[3])))
    assert replica.task("t1") is None and replica.state_vector() == before
    assert bool(getattr(replica, "unsettled"))  # noqa: B009 (mypy narrowed the property)
    replica.track_changes("tasks")
    replica.drain_changes("tasks")
    answer = wire.step2_payload(writer.diff(replica.state_vector()))
    (only,) = wire.encode(wire.Kind.SYNC, writer.name, writer.client_id, answer, 65536)
    peer.handle(topic, only)  # the writer's full answer: read again, settled
    assert replica.drain_changes("tasks") is None and not replica.unsettled
    assert sorted(replica.tasks()) == ["t2", "t3"]


async def test_replicas_follow_the_writer_across_epochs(peers: Peers) -> None:
    """A rotation (fresh document of the live content, epoch + 1) reaches the replicas over
    Mosquitto: an online replica adopts it at once, one that was away across two rotations
    adopts the latest when it returns; neither ever merges two epochs."""
    from edgesched.sync.doc import NodeDoc, client_id_for

    broker, _, tasks = peers

    def peer(doc: NodeDoc, name: str) -> DocPeer:
        p = DocPeer(
            doc,
            name,
            "127.0.0.1",
            broker.port,
            keepalive=2,
            backoff_initial_s=0.1,
            backoff_max_s=0.5,
        )
        tasks.append(asyncio.create_task(p.run()))
        return p

    writer = NodeDoc("node-gw1", client_id_for("gw1"))
    online = NodeDoc("node-gw1", client_id_for("central"))
    late = NodeDoc("node-gw1", client_id_for("central-2"))
    pw, po = peer(writer, "gw1"), peer(online, "central")
    await until(lambda: pw.connected and po.connected)
    for i in range(50):
        writer.put_task(f"t{i}", report("running", workload="x" * 200))
    await wait_converged([writer, online], timeout=5)

    for round_ in range(2):
        for i in range(1, 50, 2):
            writer.remove_task(f"t{i}")
        writer.rotate()
        writer.put_task(f"after-{round_}", report("running"))
        await wait_converged([writer, online], timeout=5)
        assert online.epoch == writer.epoch == round_ + 1
    assert po.stats["epoch_adopted"] == 2 and po.stats["rejected_updates"] == 0

    pl = peer(late, "central-2")  # was away for both rotations
    await until(lambda: pl.connected)
    await wait_converged([writer, online, late], timeout=5)
    assert late.epoch == writer.epoch == 2
    assert late.task("after-1") == report("running") and late.task("t1") is None


def test_updates_whose_dependencies_never_arrive_are_bounded() -> None:
    """pycrdt holds an update whose dependencies are missing, with no way to drop it. Past
    ``max_pending_bytes`` of such updates a replica that authored nothing is dropped and
    refilled by a resync; its content then converges with the writer's."""
    from edgesched.sync.doc import NodeDoc, client_id_for

    writer = NodeDoc("node-gw1", client_id_for("gw1"))
    replica = NodeDoc("node-gw1", client_id_for("central"))
    peer = DocPeer(replica, "central", max_pending_bytes=4000)
    topic = wire.sync_topic("node-gw1", "gw1")
    updates: list[bytes] = []
    writer.on_local_update(updates.append)
    for i in range(60):
        writer.put_task(f"t{i}", report("running", workload="x" * 100))

    def frame(kind: wire.Kind, payload: bytes) -> bytes:
        (only,) = wire.encode(kind, writer.name, writer.client_id, payload, 65536)
        return only

    for update in updates[1:]:  # the first never arrives: everything after it waits on it
        peer.handle(
            topic, frame(wire.Kind.UPDATE, wire.update_payload(update, writer.state_vector()))
        )
    assert peer.stats["replica_drops"] >= 1
    assert peer.stats["rejected_updates"] == 0
    assert replica.content_hash() != writer.content_hash()
    # the resync it asked for: the writer's answer to an empty state vector
    peer.handle(
        topic, frame(wire.Kind.SYNC, wire.step2_payload(writer.diff(replica.state_vector())))
    )
    assert replica.content_hash() == writer.content_hash()


def test_a_replica_that_authored_content_is_never_dropped() -> None:
    a, b = SiteDoc("site-x", 1), SiteDoc("site-x", 2)
    peer = DocPeer(b, "b", max_pending_bytes=100)
    b.set("mine", 1)  # b authored something: dropping it would lose it
    updates: list[bytes] = []
    a.on_local_update(updates.append)
    for i in range(20):
        a.set(f"k{i}", "y" * 50)
    for update in updates[1:]:
        payload = wire.update_payload(update, a.state_vector())
        (only,) = wire.encode(wire.Kind.UPDATE, a.name, a.client_id, payload, 65536)
        peer.handle(wire.sync_topic("site-x", "a"), only)
    assert peer.stats["replica_drops"] == 0 and b.get("mine") == 1


def test_an_update_merging_the_writer_and_another_is_refused() -> None:
    """The writer's operations and a forger's in one update (the shortcut sees two
    entries): refused whole, as before."""
    from pycrdt import merge_updates

    from edgesched.sync.doc import NodeDoc, client_id_for

    writer = NodeDoc("node-gw1", client_id_for("gw1"))
    forger = NodeDoc("node-gw1", client_id_for("gw2"))
    replica = NodeDoc("node-gw1", client_id_for("central"))
    peer = DocPeer(replica, "central", writers=frozenset({writer.client_id}))
    writer.put_task("t1", report("running"))
    forger.put_task("evil", report("running"))
    merged = merge_updates(writer.diff(), forger.diff())
    payload = wire.update_payload(merged, writer.state_vector())
    (frame,) = wire.encode(wire.Kind.UPDATE, writer.name, writer.client_id, payload, 65536)
    peer.handle(wire.sync_topic("node-gw1", "gw1"), frame)
    assert peer.stats["rejected_authorship"] == 1
    assert replica.task("t1") is None and replica.task("evil") is None


def test_a_sender_at_our_state_asks_no_resync_and_one_ahead_does() -> None:
    from edgesched.sync.doc import NodeDoc, client_id_for

    writer = NodeDoc("node-gw1", client_id_for("gw1"))
    replica = NodeDoc("node-gw1", client_id_for("central"))
    peer = DocPeer(replica, "central", writers=frozenset({writer.client_id}))
    writer.put_task("t1", report("running"))
    first = writer.diff()
    writer.put_task("t2", report("running"))

    def send(update: bytes, state_vector: bytes) -> None:
        payload = wire.update_payload(update, state_vector)
        for frame in wire.encode(wire.Kind.UPDATE, writer.name, writer.client_id, payload):
            peer.handle(wire.sync_topic("node-gw1", "gw1"), frame)

    send(first, writer.state_vector())  # the writer holds t2 too: we are behind
    assert peer.stats["resync_requests"] == 1
    send(writer.diff(), writer.state_vector())  # now we hold what it holds
    assert peer.stats["resync_requests"] == 1
    assert replica.state_vector() == writer.state_vector()


def _update_frame(doc_name: str, header_id: int, update: bytes, state: bytes) -> bytes:
    payload = wire.update_payload(update, state)
    (only,) = wire.encode(wire.Kind.UPDATE, doc_name, header_id, payload, 65536)
    return only


def test_a_node_delivers_no_content_on_the_policy_whoever_authored_it() -> None:
    """Channels bound to writers: on the policy (written by the centrals), a node's sender
    topic carries step 1s only. An update authored under central's client id, continuing its
    clocks (a state vector naming nobody), is refused from a node and taken from a central."""
    from pycrdt import Doc, Map

    from edgesched.core.policy import PolicyMode
    from edgesched.sync.doc import PolicyDoc, client_id_for

    central = PolicyDoc("policy", client_id_for("central"))
    central.set_mode(PolicyMode("priority"))
    replica = PolicyDoc("policy", client_id_for("central-2"))
    replica.apply_remote(central.diff(), sender="central")
    peer = DocPeer(
        replica,
        "central-2",
        writers=frozenset({client_id_for("central"), client_id_for("central-2")}),
        relays=("central", "central-2"),
    )
    forger: Doc[Any] = Doc(client_id=client_id_for("central"))
    forger.apply_update(central.diff())
    before = forger.get_state()
    forger.get("policy", type=Map)["mode"] = "energy"
    update = forger.get_update(before)
    frame = _update_frame("policy", client_id_for("gw-a"), update, forger.get_state())
    peer.handle(wire.sync_topic("policy", "gw-a"), frame)
    assert peer.stats["rejected_authorship"] == 1
    assert replica.mode() == PolicyMode("priority")
    # the same bytes from a central replica (relaying what it holds) are taken
    frame = _update_frame("policy", client_id_for("central"), update, forger.get_state())
    peer.handle(wire.sync_topic("policy", "central"), frame)
    assert peer.stats["rejected_authorship"] == 1
    assert replica.mode() == PolicyMode("energy")


def test_a_node_takes_only_its_own_operations_into_its_document_even_from_central() -> None:
    """The edge tier: a node's own document accepts, from a relay (a central answering after
    the node lost its store), the node's own operations and nobody else's; a sender that is
    no relay (a forged topic) delivers nothing."""
    from edgesched.sync.doc import NodeDoc, client_id_for

    mine = client_id_for("gw1")
    past = NodeDoc("node-gw1", mine)  # what central holds of us
    past.put_task("t1", report("running"))
    stranger = NodeDoc("node-gw1", client_id_for("gw2"))
    stranger.put_task("evil", report("running"))
    fresh = NodeDoc("node-gw1", mine)  # our store was lost
    peer = DocPeer(fresh, "gw1", writers=frozenset({mine}), relays=("central",))

    central_id = client_id_for("central")
    peer.handle(
        wire.sync_topic("node-gw1", "central"),
        _update_frame("node-gw1", central_id, stranger.diff(), stranger.state_vector()),
    )
    assert peer.stats["rejected_authorship"] == 1 and fresh.task("evil") is None
    peer.handle(
        wire.sync_topic("node-gw1", "gw2"),
        _update_frame("node-gw1", client_id_for("gw2"), past.diff(), past.state_vector()),
    )
    assert peer.stats["rejected_authorship"] == 2 and fresh.task("t1") is None
    peer.handle(
        wire.sync_topic("node-gw1", "central"),
        _update_frame("node-gw1", central_id, past.diff(), past.state_vector()),
    )
    assert peer.stats["rejected_authorship"] == 2
    assert fresh.task("t1") == report("running")


def test_a_pure_delete_of_a_writers_item_from_a_non_writer_is_refused() -> None:
    """A delete set alone (no structs, an empty state vector) deleting central's assignment,
    sent by the node on its desired document: refused, the assignment stays."""
    from pycrdt import Doc, Map

    from edgesched.sync.doc import PolicyDoc, client_id_for

    central = PolicyDoc("desired-gw1", client_id_for("central"))
    central.root("assignments")["t1"] = "{}"
    replica = PolicyDoc("desired-gw1", client_id_for("central-2"))
    replica.apply_remote(central.diff(), sender="central")
    peer = DocPeer(
        replica, "central-2", writers=frozenset({client_id_for("central")}), relays=("central",)
    )
    node: Doc[Any] = Doc(client_id=client_id_for("gw1"))
    node.apply_update(central.diff())
    before = node.get_state()
    del node.get("assignments", type=Map)["t1"]
    update = node.get_update(before)
    assert node.get_state() == before  # a delete set only
    peer.handle(
        wire.sync_topic("desired-gw1", "gw1"),
        _update_frame("desired-gw1", client_id_for("gw1"), update, node.get_state()),
    )
    assert peer.stats["rejected_authorship"] == 1
    assert "t1" in replica.root("assignments")


def test_a_readers_echo_of_what_the_writer_holds_is_dropped_not_refused() -> None:
    """The crossing: central asks a node for what it lacks (a step 1 naming its state then),
    writes again, and the node, having heard the new write first, answers with it (and
    every deletion it holds). Central holds all of that: the answer is an echo, dropped
    and counted, not an authorship refusal. One operation in it that central lacks (a
    deletion of central's item by the node) makes it a refusal again."""
    from pycrdt import Doc, Map

    from edgesched.sync.doc import PolicyDoc, client_id_for

    central = PolicyDoc("desired-gw1", client_id_for("central"))
    central.root("assignments")["t0"] = "{}"
    central.root("assignments")["t1"] = "{}"
    del central.root("assignments")["t0"]  # a deletion in the delete set
    peer = DocPeer(
        central, "central", writers=frozenset({client_id_for("central")}), relays=("central",)
    )
    node: Doc[Any] = Doc(client_id=client_id_for("gw1"))
    node.apply_update(central.diff())
    asked = central.state_vector()  # central's step 1, on its way
    central.root("assignments")["t2"] = "{}"  # central writes again
    node.apply_update(central.diff(asked))  # the node hears the write first
    answer = node.get_update(asked)  # ... then answers the step 1
    before = central.content_hash()
    topic = wire.sync_topic("desired-gw1", "gw1")
    payload = wire.step2_payload(answer)
    (frame,) = wire.encode(wire.Kind.SYNC, "desired-gw1", client_id_for("gw1"), payload, 65536)
    peer.handle(topic, frame)
    assert peer.stats["echoes_dropped"] == 1 and peer.stats["rejected_authorship"] == 0
    assert central.content_hash() == before

    del node.get("assignments", type=Map)["t1"]  # now something central lacks
    answer = node.get_update(asked)
    payload = wire.step2_payload(answer)
    (frame,) = wire.encode(wire.Kind.SYNC, "desired-gw1", client_id_for("gw1"), payload, 65536)
    peer.handle(topic, frame)
    assert peer.stats["echoes_dropped"] == 1 and peer.stats["rejected_authorship"] == 1
    assert central.root("assignments").get("t1") == "{}"
