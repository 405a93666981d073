"""Answers only the asker hears: central's step 2 to a node's step 1 of the shared ``policy``
goes to ``doc/policy/reply/<node>/<central>``, against a real Mosquitto.

Counted by what the broker delivers to a raw subscriber holding another node's subscriptions;
convergence by content hash, through a partition, a central change and a delete meanwhile, with
two central replicas and with peers of the older protocol on either side.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
import pycrdt
import pytest
from conftest import Broker
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import YSyncMessageType

from edgesched.core.policy import PolicyMode
from edgesched.sync import wire
from edgesched.sync.doc import PolicyDoc, client_id_for, decode_state_vector
from edgesched.sync.peer import DocPeer, wait_converged
from edgesched.sync.schema import ModelEntry

DOC = "policy"
CENTRALS = ("central-a", "central-b")
CENTRAL_IDS = frozenset(client_id_for(c) for c in CENTRALS)


class OldDocPeer(DocPeer):
    """A peer of the protocol before reply topics: its step 1 carries no mark, it hears no
    reply topic, and it answers a step 1 (marked or not: it reads the vector as it comes) on
    its own sender topic. Its step 1 handling is the older release's, line for line."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, replies=False, **kw)  # type: ignore[arg-type]

    def _handle_sync(
        self, sender: str, sync: wire.SyncPayload, *, from_writer: bool = False
    ) -> None:
        if sync.step != YSyncMessageType.SYNC_STEP1:
            super()._handle_sync(sender, sync, from_writer=from_writer)
            return
        self.stats["step1_in"] += 1
        behind = self._behind(sync.data)  # the marked vector, as an older peer gets it
        asked = (sync.data, self.doc.epoch, self.topic)
        self._answers = [a for a in self._answers if a != asked] + [asked]
        if behind:
            self._request_step1()
        self._wake_up()


@dataclass
class Fleet:
    broker: Broker
    docs: dict[str, PolicyDoc] = field(default_factory=dict)
    peers: dict[str, DocPeer] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def add(self, peer_id: str, *, central: bool = False, old: bool = False) -> PolicyDoc:
        doc = PolicyDoc(DOC, client_id_for(peer_id))
        kind = OldDocPeer if old else DocPeer
        kw: dict[str, object] = {"writers": CENTRAL_IDS, "relays": CENTRALS}
        if not central:
            kw["listen_to"] = CENTRALS
        self.docs[peer_id] = doc
        self.peers[peer_id] = kind(
            doc,
            peer_id,
            "127.0.0.1",
            self.broker.port,
            keepalive=2,
            backoff_initial_s=0.1,
            backoff_max_s=0.5,
            **kw,  # type: ignore[arg-type]
        )
        self.start(peer_id)
        return doc

    def start(self, peer_id: str) -> None:
        self.tasks[peer_id] = asyncio.create_task(self.peers[peer_id].run())

    async def stop(self, peer_id: str) -> None:
        task = self.tasks.pop(peer_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def converged(self, timeout: float = 10.0) -> None:
        await wait_converged(self.docs.values(), timeout=timeout)


@pytest.fixture
async def fleet(broker: Broker) -> AsyncIterator[Fleet]:
    f = Fleet(broker)
    yield f
    for peer_id in list(f.tasks):
        await f.stop(peer_id)


@dataclass
class Ear:
    """A raw subscriber holding a node's subscriptions of the policy: what the broker
    delivers to that node, counted."""

    frames: list[tuple[str, int]] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.frames)


async def listen(port: int, node_id: str, ear: Ear, ready: asyncio.Event) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"ear-{node_id}") as client:
        for central in CENTRALS:
            await client.subscribe(wire.sync_topic(DOC, central), qos=1)
            await client.subscribe(wire.reply_filter(DOC, node_id, central), qos=1)
        ready.set()
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            ear.frames.append((message.topic.value, len(message.payload)))


async def until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


def seed(doc: PolicyDoc) -> None:
    doc.set_mode(PolicyMode.BALANCE)
    for kind in ("forecast", "placement"):
        doc.set_model(kind, ModelEntry(sha256="0" * 64, data="AAAA" * 200, size=600, name=kind))


@pytest.mark.parametrize("old_nodes", [False, True], ids=["new-nodes", "old-nodes"])
async def test_a_reconnect_costs_the_other_nodes_nothing(fleet: Fleet, old_nodes: bool) -> None:
    """With one central and four nodes connected, a node's reconnect (its step 1, central's
    answer) delivers no policy byte to the other nodes; with nodes of the older protocol
    (no mark) it delivers central's answer to every one of them, as before."""
    seed(fleet.add("central-a", central=True))
    nodes = [f"node-{i}" for i in range(4)]
    for n in nodes:
        fleet.add(n, old=old_nodes)
    await fleet.converged()
    await until(lambda: all(fleet.peers[n].stats["step2_in"] >= 1 for n in nodes))
    ears = {n: Ear() for n in nodes}
    ready = {n: asyncio.Event() for n in nodes}
    listeners = [
        asyncio.create_task(listen(fleet.broker.port, n, ears[n], ready[n])) for n in nodes
    ]
    try:
        for event in ready.values():
            await asyncio.wait_for(event.wait(), 5)
        asked = fleet.peers["node-0"]
        answered = asked.stats["step2_in"]
        await fleet.stop("node-0")
        fleet.start("node-0")
        await until(lambda: asked.stats["step2_in"] > answered)
        await asyncio.sleep(0.5)  # anything else the reconnect set off
        others = [ears[n].bytes for n in nodes[1:]]
        to_asker = ears["node-0"].bytes
        assert to_asker > 0
        if old_nodes:
            assert all(b == to_asker for b in others), (others, to_asker)
            assert fleet.peers["central-a"].stats["replies_out"] == 0
        else:
            assert others == [0, 0, 0], [ears[n].frames for n in nodes[1:]]
            [(topic, _)] = ears["node-0"].frames
            assert topic == wire.reply_topic(DOC, "node-0", "central-a")
            assert fleet.peers["central-a"].stats["replies_out"] >= 1
        # a live change still reaches everyone, on central's sender topic
        before = {n: ears[n].bytes for n in nodes}
        fleet.docs["central-a"].set_mode(PolicyMode.ENERGY)
        await fleet.converged()
        await until(lambda: all(ears[n].bytes > before[n] for n in nodes))
    finally:
        for listener in listeners:
            listener.cancel()
        for listener in listeners:
            with contextlib.suppress(asyncio.CancelledError):
                await listener


async def test_replicas_converge_through_a_partition_with_changes_and_a_delete(
    fleet: Fleet,
) -> None:
    """Two central replicas (hearing each other fully) and nodes of both protocols; a node is
    cut off while both centrals change the policy, one deleting a model; after it comes back
    every replica is byte-equal (content hash), the delete included. A central restarted
    meanwhile converges too."""
    seed(fleet.add("central-a", central=True))
    fleet.add("central-b", central=True, old=True)  # an older central replica
    fleet.add("node-new", old=False)
    fleet.add("node-old", old=True)
    fleet.add("node-cut")
    await fleet.converged()
    await fleet.stop("node-cut")
    await fleet.stop("central-b")
    a, b = fleet.docs["central-a"], fleet.docs["central-b"]
    a.set_mode(PolicyMode.ENERGY)
    del a.root("models")["forecast"]  # a delete the cut-off node must learn
    b.set_model("extra", ModelEntry(sha256="1" * 64, data="BBBB", size=3, name="extra"))
    fleet.start("central-b")
    await wait_converged([a, b, fleet.docs["node-new"], fleet.docs["node-old"]])
    fleet.start("node-cut")
    await fleet.converged()
    cut = fleet.docs["node-cut"]
    assert cut.mode() == PolicyMode.ENERGY
    assert set(cut.models()) == {"placement", "extra"}
    # the cut-off node's answers come on its reply topics, from the new central at least
    # (awaited: the node may converge on the older central's answer first, while the new
    # central's still waits for its PUBACK, which is when it is counted)
    await until(lambda: fleet.peers["central-a"].stats["replies_out"] >= 1)


async def test_a_new_node_converges_with_older_centrals_only(fleet: Fleet) -> None:
    """Old centrals read the mark as a client that wrote nothing and answer on their sender
    topics, which a node of this version still hears."""
    seed(fleet.add("central-a", central=True, old=True))
    fleet.add("central-b", central=True, old=True)
    fleet.add("node-new")
    await fleet.converged()
    del fleet.docs["central-b"].root("models")["placement"]
    await fleet.stop("node-new")
    fleet.docs["central-a"].set_mode(PolicyMode.PRIORITY)
    node = fleet.peers["node-new"]
    answered = node.stats["step2_in"]
    fleet.start("node-new")
    await fleet.converged()
    await until(lambda: node.stats["step2_in"] >= answered + 2)  # both answered its step 1
    assert all(fleet.peers[c].stats["replies_out"] == 0 for c in CENTRALS)  # on sender topics
    assert set(fleet.docs["node-new"].models()) == {"forecast"}


async def test_a_central_behind_a_node_does_not_ask_it(fleet: Fleet) -> None:
    """A node holding what central lacks (another central's change central never got) is
    not asked for it: a node delivers no content on the policy (issue 13), so its answer would
    only be refused. Central answers the node's step 1, to it alone, and the change reaches
    central when the central that wrote it is back."""
    seed(fleet.add("central-a", central=True))
    node = fleet.add("node-0")
    await fleet.converged()
    await until(lambda: fleet.peers["node-0"].stats["step2_in"] >= 1)  # answered
    await fleet.stop("node-0")
    b = PolicyDoc(DOC, client_id_for("central-b"))
    b.set_model("extra", ModelEntry(sha256="1" * 64, data="BBBB", size=3, name="extra"))
    node.apply_remote(b.diff(), sender="central-b")  # heard from central-b, now gone
    central = fleet.peers["central-a"]
    sent = Counter(central.stats)  # (a name not counted yet reads 0)
    answered = fleet.peers["node-0"].stats["step2_in"]
    fleet.start("node-0")
    await until(lambda: fleet.peers["node-0"].stats["step2_in"] > answered)
    await asyncio.sleep(0.5)  # (a step 1 of central's would have gone by now)
    assert central.stats["behind_non_writer"] > sent["behind_non_writer"]
    assert central.stats["step1_out"] == sent["step1_out"]  # nothing asked of the node
    assert central.stats["replies_out"] - sent["replies_out"] == 1  # its answer, to it alone
    assert central.stats["rejected_authorship"] == sent["rejected_authorship"]
    assert "extra" not in fleet.docs["central-a"].models()
    fleet.add("central-b", central=True).apply_remote(b.diff(), sender="central-b")
    await fleet.converged()  # central-b, back, brings its change to central-a itself
    assert "extra" in fleet.docs["central-a"].models()


# --- the mark ------------------------------------------------------------------------------


def _doc(ops: list[tuple[int, str, int | None]]) -> pycrdt.Doc[Any]:
    """A pycrdt document built by several clients: (client, key, value or None: delete)."""
    doc: pycrdt.Doc[Any] = pycrdt.Doc(client_id=1)
    for client, key, value in ops:
        other: pycrdt.Doc[Any] = pycrdt.Doc(client_id=client)
        other.apply_update(doc.get_update())
        m = other.get("m", type=pycrdt.Map)
        if value is None:
            if key in m:
                del m[key]
        else:
            m[key] = value
        doc.apply_update(other.get_update(doc.get_state()))
    return doc


ops = st.lists(
    st.tuples(st.integers(1, 2**32 - 1), st.sampled_from("abc"), st.none() | st.integers(0, 9)),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(ours=ops, theirs=ops)
def test_a_marked_state_vector_reads_as_the_unmarked_one(
    ours: list[tuple[int, str, int | None]], theirs: list[tuple[int, str, int | None]]
) -> None:
    """Any document, any asker: the mark comes off whole, and a peer that does not strip it
    (an older one) gets the same diff (live and from the encoded state, as a frozen document
    answers) and the same "the asker has nothing we lack"."""
    doc, asker = _doc(ours), _doc(theirs)
    sv = asker.get_state()
    marked = wire.mark_replies(sv)
    assert wire.split_reply_mark(marked) == (sv, True)
    assert wire.split_reply_mark(sv) == (sv, False)
    assert decode_state_vector(marked) == decode_state_vector(sv) | {wire.REPLY_MARK: 0}
    assert doc.get_update(marked) == doc.get_update(sv)
    assert pycrdt.get_update(doc.get_update(), marked) == pycrdt.get_update(doc.get_update(), sv)
    payload = wire.step1_payload(sv, replies=True)
    decoded = wire.decode_sync(wire.Kind.SYNC, payload)  # as an older peer decodes it
    assert decoded.step == YSyncMessageType.SYNC_STEP1 and decoded.data == marked
