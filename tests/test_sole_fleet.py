"""The fleet document of a central that runs alone rotates (``SoleFleetDoc``), so the tasks it
placed and forgot do not stay in it as tombstones for as long as central runs; and a central
replica that joins later adopts the epoch it finds, while it has written nothing of its own.

Before, the fleet document was multi-writer whatever the deployment and never rotated:
``bench/bench_document_garbage.py`` measured ~300 B of central's memory per finished task,
+51 MB a day at 2 tasks a second.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Broker, cancel_all
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Doc

from edgesched.central.engine import FLEET_DOC, CentralEngine
from edgesched.central.placement import assignment_entry
from edgesched.config import parse_config
from edgesched.core.task import TaskSpec
from edgesched.sync import doc as doc_module
from edgesched.sync.doc import (
    EpochError,
    PolicyDoc,
    RotationPolicy,
    SoleFleetDoc,
    client_id_for,
)
from edgesched.sync.journal import DocJournal
from edgesched.sync.peer import DocPeer, wait_converged
from edgesched.sync.schema import AssignmentEntry, StopOrder
from edgesched.sync.store import Store

A, B = "central-a", "central-b"


def entry(task_id: str, node: str = "gw-1", at: float = 1.0) -> AssignmentEntry:
    spec = TaskSpec(id=task_id, command=("sleep", "30"), cpu=0.5, mem_gib=0.25, priority=40)
    return assignment_entry(
        spec, node, central=A, epoch=1, replacement=False, score=0.5, at=at, reason="placed"
    )


@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "in-slices"])
async def test_a_sole_centrals_fleet_rotates_away_forgotten_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sliced: bool
) -> None:
    """Through central's journal and store (compaction asks the rotation policy): the
    document's size stays bounded by its live content however many tasks finish, the
    changed-key record its consumer (the fleet index) reads is not reset by a rotation, and a
    restart restores the same content at the same epoch. ``in-slices``: every rotation is a
    copy in slices by the journal's own task while the writes go on (as a document past
    ROTATE_IN_SLICES_BYTES rotates)."""
    if sliced:
        monkeypatch.setattr(doc_module, "ROTATE_IN_SLICES_BYTES", 0)
        monkeypatch.setattr(doc_module, "ROTATION_SLICE", 7)
    monkeypatch.setattr(PolicyDoc, "compact_after", 16)
    store = await Store.open(tmp_path / "central.db")
    try:
        fleet = await SoleFleetDoc.load_from(store, FLEET_DOC, client_id_for(A))
        fleet.sole_writer = A
        fleet.packed = True
        fleet.rotation_policy = RotationPolicy(min_bytes=4096, ratio=2.0)
        fleet.track_changes("assignments")
        assert fleet.drain_changes("assignments") is None  # (the first drain: read it all)
        journal = DocJournal(fleet, store)
        logging = asyncio.create_task(journal.run())
        for i in range(20):
            fleet.assign(f"live-{i}", entry(f"live-{i}"))
        sizes, epochs = [], set()
        for i in range(600):
            fleet.assign(f"t{i}", entry(f"t{i}", at=float(i)))
            fleet.drop_assignment(f"t{i}")
            await journal.flushed()
            await asyncio.sleep(0)
            sizes.append(len(fleet.snapshot()))
            epochs.add(fleet.epoch)
            assert fleet.drain_changes("assignments") is not None  # never "all changed"
        await journal.flushed()
        logging.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await logging
        assert len(epochs) >= 3  # (rotated twice or more)
        fresh = len(fleet._fresh().get_update())
        assert max(sizes[-100:]) <= 2 * max(fresh, 4096) + 2048
        assert sorted(fleet.assignments()) == sorted(f"live-{i}" for i in range(20))
        loaded = await SoleFleetDoc.load_from(store, FLEET_DOC, client_id_for(A))
        assert (loaded.epoch, loaded.content_hash()) == (fleet.epoch, fleet.content_hash())
    finally:
        await store.close()


async def test_the_same_tasks_leave_a_multi_writer_fleet_growing(tmp_path: Path) -> None:
    """The control: the co-written fleet document (central replicas) never rotates, and the
    same run leaves it several times its live content."""
    fleet = PolicyDoc(FLEET_DOC, client_id_for(A))
    fleet.packed = True
    for i in range(20):
        fleet.assign(f"live-{i}", entry(f"live-{i}"))
    for i in range(600):
        fleet.assign(f"t{i}", entry(f"t{i}", at=float(i)))
        fleet.drop_assignment(f"t{i}")
    assert not fleet.should_rotate() and fleet.epoch == 0
    assert len(fleet.snapshot()) > 3 * len(fleet._fresh().get_update())


def test_multi_writer_documents_adopt_an_epoch_only_while_they_wrote_nothing() -> None:
    empty = PolicyDoc(FLEET_DOC, client_id_for(B))
    empty.reset_to_epoch(3)
    assert empty.epoch == 3
    written = PolicyDoc(FLEET_DOC, client_id_for(B))
    written.assign("mine", entry("mine"))
    with pytest.raises(EpochError, match="operations of its own"):
        written.reset_to_epoch(3)
    assert written.epoch == 0 and written.assignments()
    with pytest.raises(EpochError, match="several writers"):
        written.rotate()


def test_central_alone_writes_a_sole_fleet_and_with_peers_a_shared_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def open_fleet(peers: list[str]) -> PolicyDoc:
        state = tmp_path / f"state-{len(peers)}"
        config = parse_config({"central": {"central_id": A, "state_dir": str(state),
                                           "peers": peers}})  # fmt: skip
        engine = CentralEngine(config)
        # (the engine's gc.freeze at start would keep this test's garbage for the session)
        monkeypatch.setattr(engine, "settle_heap", lambda full=False: None)
        state.mkdir()
        engine._store = await Store.open(state / "central.db")
        try:
            engine.policy = PolicyDoc("policy", client_id_for(A))
            await engine._open_fleet()
            assert engine.fleet is not None
            peer = engine._central_peers[FLEET_DOC]
            assert peer.writer == (None if peers else A)
            return engine.fleet
        finally:
            await engine.store.close()

    alone = asyncio.run(open_fleet([]))
    assert isinstance(alone, SoleFleetDoc) and alone.rotation_policy is not None
    shared = asyncio.run(open_fleet([B]))
    assert not isinstance(shared, SoleFleetDoc) and shared.rotation_policy is None


@contextlib.asynccontextmanager
async def synced(*pairs: tuple[PolicyDoc, str], port: int) -> AsyncIterator[list[DocPeer]]:
    """Each document synced by its central's DocPeer on a connection of its own, as
    central's fleet peer is (writers and relays: both centrals)."""
    writers = frozenset({client_id_for(A), client_id_for(B)})
    peers = [
        DocPeer(doc, me, "127.0.0.1", port, keepalive=2, writers=writers, relays=(A, B))
        for doc, me in pairs
    ]
    tasks = [asyncio.create_task(p.run()) for p in peers]
    try:
        yield peers
    finally:
        await cancel_all(tasks)


async def test_a_replica_joining_adopts_the_epoch_of_a_central_that_rotated_alone(
    broker: Broker,
) -> None:
    """Central A ran alone and rotated its fleet to epoch 3; configured with a fellow replica
    now, it holds that epoch in a shared document. B starts empty at epoch 0: it adopts 3 from
    A, converges, and what it writes afterwards reaches A."""
    alone = SoleFleetDoc(FLEET_DOC, client_id_for(A))
    alone.sole_writer = A
    for i in range(5):
        alone.assign(f"t{i}", entry(f"t{i}"))
    for _ in range(3):
        alone.rotate()
    a = PolicyDoc.restore(FLEET_DOC, client_id_for(A), alone.snapshot(), [], epoch=3)
    b = PolicyDoc(FLEET_DOC, client_id_for(B))
    async with synced((a, A), (b, B), port=broker.port) as (_, pb):
        await wait_converged([a, b], timeout=10)
        assert b.epoch == 3 and sorted(b.assignments()) == [f"t{i}" for i in range(5)]
        assert pb.stats["epoch_adopted"] == 1
        b.assign("from-b", entry("from-b", at=9.0))
        await wait_converged([a, b], timeout=10)
        assert "from-b" in a.assignments() and a.epoch == 3


async def test_a_replica_that_wrote_does_not_adopt(broker: Broker) -> None:
    """A replica holding operations of its own at epoch 0 would lose them to a fellow's newer
    epoch: it refuses it (counted, logged) and keeps what it wrote."""
    alone = SoleFleetDoc(FLEET_DOC, client_id_for(A))
    alone.sole_writer = A
    alone.assign("t0", entry("t0"))
    alone.rotate()
    a = PolicyDoc.restore(FLEET_DOC, client_id_for(A), alone.snapshot(), [], epoch=1)
    b = PolicyDoc(FLEET_DOC, client_id_for(B))
    b.assign("mine", entry("mine"))
    async with synced((a, A), (b, B), port=broker.port) as (_, pb):
        deadline = asyncio.get_running_loop().time() + 10
        while pb.stats["epoch_refused"] == 0:
            assert asyncio.get_running_loop().time() < deadline, dict(pb.stats)
            await asyncio.sleep(0.05)
    assert b.epoch == 0 and "mine" in b.assignments() and "t0" not in b.assignments()


# --- a rotation in slices, with the writer writing meanwhile ---------------------------------

KEYS = st.integers(0, 30).map(lambda i: f"k{i}")
WRITES = st.lists(
    st.tuples(st.sampled_from(["assign", "drop", "stop"]), KEYS, st.integers(0, 1000)),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    start=st.sets(KEYS, max_size=25),
    writes=WRITES,
    slice_entries=st.integers(1, 8),
    yields=st.integers(1, 3),
)
def test_a_rotation_in_slices_keeps_every_write_made_while_it_copies(
    start: set[str], writes: list[tuple[str, str, int]], slice_entries: int, yields: int
) -> None:
    """Writes (new keys, changed values, removals, a second root) made between the slices of
    a rotation are all in the new epoch: its content equals a plain model's, and a replica
    that takes the rotation's state and then the updates after it equals the writer."""

    async def run() -> None:
        fleet = SoleFleetDoc(FLEET_DOC, client_id_for(A))
        fleet.sole_writer = A
        fleet.packed = True
        model: dict[str, AssignmentEntry] = {}
        for key in sorted(start):
            model[key] = entry(key)
            fleet.assign(key, model[key])
        sent: list[bytes] = []
        fleet.on_local_update(sent.append)
        rotation = asyncio.create_task(fleet.rotate_in_slices(slice_entries=slice_entries))
        stops: set[str] = set()
        for verb, key, at in writes:
            if verb == "assign":
                model[key] = entry(key, at=float(at))
                fleet.assign(key, model[key])
            elif verb == "drop":
                model.pop(key, None)
                fleet.drop_assignment(key)
            else:
                fleet.order_stop(key, "gw-1", StopOrder(epoch=1, winner="gw-2", at=float(at)))
                stops.add(f"{key}@gw-1")
            for _ in range(yields):
                await asyncio.sleep(0)
        update = await rotation
        assert update is not None and update.rotation and fleet.epoch == 1
        assert dict(fleet.assignments()) == model
        assert set(fleet.stops()) == stops
        replica: Doc[Any] = Doc()
        after = sent[sent.index(update) :]
        for part in after:
            replica.apply_update(part)
        assert doc_module._json_of(replica) == fleet.to_json()

    asyncio.run(run())


def test_a_rotation_in_slices_gives_way_to_a_replaced_document() -> None:
    """A document replaced while the copy runs (a restore, another rotation) ends the copy
    with nothing changed."""

    async def run() -> None:
        fleet = SoleFleetDoc(FLEET_DOC, client_id_for(A))
        fleet.sole_writer = A
        for i in range(20):
            fleet.assign(f"t{i}", entry(f"t{i}"))
        rotation = asyncio.create_task(fleet.rotate_in_slices(slice_entries=3))
        await asyncio.sleep(0)
        fleet.rotate()  # (the whole way, meanwhile: epoch 1)
        assert await rotation is None
        assert fleet.epoch == 1 and len(fleet.assignments()) == 20

    asyncio.run(run())


def test_a_copy_in_slices_that_would_not_shrink_the_document_is_only_measured() -> None:
    """A large document's compaction measures its live content by the same sliced copy; with
    little garbage the copy is not kept (same epoch, same document) and the size it found is
    what the next check counts from."""

    async def run() -> None:
        fleet = SoleFleetDoc(FLEET_DOC, client_id_for(A))
        fleet.sole_writer = A
        for i in range(50):
            fleet.assign(f"t{i}", entry(f"t{i}"))
        live, size = fleet.doc, len(fleet.snapshot())
        assert await fleet.rotate_in_slices(slice_entries=7, below=size / 2) is None
        assert fleet.epoch == 0 and fleet.doc is live
        assert size / 2 < fleet._fresh_size <= size

    asyncio.run(run())
