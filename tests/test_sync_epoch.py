"""Document epochs: rotation, replicas following it, the wire's epoch, persistence and crashes."""

from __future__ import annotations

import gc
import random
import sqlite3
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pycrdt import YSyncMessageType

from edgesched.core.model import Arch, ServerClass
from edgesched.core.policy import PolicyMode
from edgesched.core.task import TaskState
from edgesched.sync import epochs, wire
from edgesched.sync.doc import (
    EpochError,
    LocalUpdate,
    NodeDoc,
    PolicyDoc,
    RotationPolicy,
    SiteDoc,
    client_id_for,
)
from edgesched.sync.schema import Registration, TaskReport
from edgesched.sync.store import (
    _TABLES,
    MIGRATIONS,
    SCHEMA_VERSION,
    Store,
    StoreError,
    _readable_rows,
)
from edgesched.sync.wire import FrameError, Kind, Reassembler

WRITER = client_id_for("edge-1")
CENTRAL = client_id_for("central")
NAME = "node-edge-1"
TASK_IDS = st.integers(0, 40).map(lambda i: f"t{i}")
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), TASK_IDS, st.integers(0, 5)),
        st.tuples(st.just("remove"), TASK_IDS, st.just(0)),
        st.tuples(st.just("rotate"), st.just(""), st.just(0)),
    ),
    max_size=60,
)


REGISTRATION = Registration(arch=Arch.X86_64, server_class=ServerClass.GENERAL, cpu=16)


def report(state: str = "running", at: float = 1.0, **kw: Any) -> TaskReport:
    """A node's report of one task (the generic content of a node document in these tests)."""
    return TaskReport(state=TaskState(state), updated_at=at, **kw)


def writer_doc(policy: RotationPolicy | None = None) -> NodeDoc:
    doc = NodeDoc(NAME, WRITER, rotation_policy=policy)
    doc.set_registration(REGISTRATION)
    return doc


def apply_op(doc: NodeDoc, op: tuple[str, str, int]) -> None:
    kind, task, value = op
    if kind == "put":
        doc.put_task(task, report("running", priority=value, cpu=value / 2))
    elif kind == "remove":
        doc.remove_task(task)
    else:
        doc.rotate()


def churn(doc: NodeDoc, n: int, start: int = 0) -> None:
    """Add and remove ``n`` tasks: tombstones only, the live content stays the same."""
    for i in range(start, start + n):
        doc.put_task(f"gone-{i:06d}", report("exited", at=float(i)))
        doc.remove_task(f"gone-{i:06d}")


# ---------------------------------------------------------------------- rotation


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_rotation_preserves_content_and_callbacks(ops: list[tuple[str, str, int]]) -> None:
    doc = writer_doc()
    got: list[bytes] = []
    doc.on_local_update(got.append)
    epochs: list[int] = []
    doc.on_epoch_change(epochs.append)
    for op in ops:
        apply_op(doc, op)
    before, epoch, size = doc.content_hash(), doc.epoch, len(doc.snapshot())
    got.clear()
    state = doc.rotate()
    assert doc.epoch == epoch + 1 and epochs[-1] == epoch + 1
    assert doc.content_hash() == before  # equal content, equal hash, across epochs
    assert len(doc.snapshot()) <= size
    # The rotation reached the callbacks as one tagged update holding the whole new state.
    assert got == [state] and isinstance(got[0], LocalUpdate)
    assert state.rotation and state.epoch == epoch + 1
    assert NodeDoc.restore(NAME, CENTRAL, state, [], epoch=epoch + 1).content_hash() == before
    # Callbacks keep working on the new pycrdt document, tagged with the new epoch.
    doc.put_task("after", report("placed"))
    assert len(got) == 2 and isinstance(got[1], LocalUpdate)
    assert got[1].epoch == epoch + 1 and not got[1].rotation


def test_rotation_drops_tombstones_and_frees_the_old_document() -> None:
    doc = writer_doc()
    doc.put_task("keep", report("running"))
    churn(doc, 500)
    big = len(doc.snapshot())
    old = weakref.ref(doc.doc)
    doc.rotate(min_epoch=7)
    assert doc.epoch == 7
    assert len(doc.snapshot()) < big / 10
    assert doc.tasks() == {"keep": report("running")}
    gc.collect()
    assert old() is None  # no reference cycle keeps rotated-away documents alive


def test_a_write_through_a_stale_reference_is_not_reported() -> None:
    doc = writer_doc()
    got: list[bytes] = []
    doc.on_local_update(got.append)
    stale = doc.root("tasks")
    doc.rotate()
    got.clear()
    stale["ghost"] = report("running").to_entry()  # writes the old pycrdt doc, no longer observed
    assert got == [] and doc.task("ghost") is None


def test_multi_writer_documents_never_start_an_epoch() -> None:
    """Several writers cannot agree on a cut: such a document never rotates. It may hold an
    epoch a sole writer left (central's fleet document, rotated while central ran alone) and
    adopt a fellow writer's newer one while it holds no operations of its own
    (tests/test_sole_fleet.py)."""
    for doc in (PolicyDoc("policy", 3), SiteDoc("site-a", 4)):
        assert doc.rotation_policy is None and not doc.should_rotate()
        with pytest.raises(EpochError, match="several writers"):
            doc.rotate()
        if isinstance(doc, SiteDoc):
            doc.set("mine", 1)
        else:
            doc.set_mode(PolicyMode.ENERGY)
        with pytest.raises(EpochError, match="operations of its own"):
            doc.reset_to_epoch(1)
        assert doc.epoch == 0
    assert PolicyDoc("policy", 3, epoch=2).epoch == 2


def test_epoch_bounds() -> None:
    doc = writer_doc()
    with pytest.raises(EpochError):
        doc.rotate(min_epoch=2**32)
    doc.reset_to_epoch(3)
    for bad in (3, 2, 2**31 + 4):
        with pytest.raises(EpochError, match="cannot reset"):
            doc.reset_to_epoch(bad)
    with pytest.raises(EpochError):
        NodeDoc(NAME, WRITER, epoch=-1)
    with pytest.raises(ValueError):
        RotationPolicy(ratio=1.0)


def test_should_rotate_policy() -> None:
    policy = RotationPolicy(min_bytes=4096, ratio=2.0)
    doc = writer_doc(policy)
    assert not doc.should_rotate()  # small
    for i in range(100):  # large live content (~18 KB), no garbage: never worth a rotation
        doc.put_task(f"live-{i}", report("running", priority=i))
    assert len(doc.snapshot()) > policy.min_bytes and not doc.should_rotate()
    live = len(NodeDoc.restore(NAME, WRITER, doc.rotate(), []).snapshot())
    churn(doc, 100)
    assert len(doc.snapshot()) < 2 * live and not doc.should_rotate()
    churn(doc, 2000, start=100)
    assert len(doc.snapshot()) > 2 * live and doc.should_rotate()
    assert NodeDoc(NAME, WRITER, rotation_policy=RotationPolicy(min_bytes=10**9)).rotation_policy


# ---------------------------------------------------------------------- the receive rule


def test_epoch_action_table() -> None:
    act = wire.epoch_action
    assert act(3, 3, from_writer=True) == "apply"
    assert act(3, 3, from_writer=False) == "apply"
    assert act(3, 2, from_writer=True) == "announce"
    assert act(3, 2, from_writer=False, is_writer=True) == "announce"
    assert act(3, 4, from_writer=True) == "adopt"
    assert act(3, 4, from_writer=False) == "drop"
    assert act(3, 9, from_writer=False, is_writer=True) == "rotate_past"
    # serial numbers: 2**32 - 1 lies just behind 3 (the epoch after it is 0)...
    assert act(3, 2**32 - 1, from_writer=True) == "announce"
    assert act(2**32 - 1, 3, from_writer=True) == "adopt"  # ...and 3 just ahead of it
    assert act(3, 2**31 + 2, from_writer=False, is_writer=True) == "rotate_past"
    assert act(3, 2**31 + 4, from_writer=False, is_writer=True) == "announce"
    for bad in (-1, 2**32):
        with pytest.raises(ValueError):
            act(bad, 0, from_writer=True)
        with pytest.raises(ValueError):
            act(0, bad, from_writer=True)


@given(
    local=st.integers(0, 2**32 - 1),
    remote=st.integers(0, 2**32 - 1),
    from_writer=st.booleans(),
    is_writer=st.booleans(),
)
def test_epoch_action_properties(
    local: int, remote: int, from_writer: bool, is_writer: bool
) -> None:
    action = wire.epoch_action(local, remote, from_writer=from_writer, is_writer=is_writer)
    assert (action == "apply") == (local == remote)  # two epochs are never merged
    assert (action == "announce") == epochs.newer(local, remote)
    if action == "adopt":
        assert from_writer and not is_writer and epochs.newer(remote, local)
    if action == "rotate_past":
        assert is_writer and epochs.newer(remote, local)
        assert epochs.newer(epochs.after(remote), remote)  # always somewhere past it
    # of two peers at different epochs exactly one is ahead: no pair refuses each other
    assert local == remote or epochs.newer(local, remote) != epochs.newer(remote, local)


@given(a=st.integers(0, 2**32 - 1), step=st.integers(1, 2**31 - 1))
def test_serial_epochs_are_newer_within_half_the_circle(a: int, step: int) -> None:
    b = (a + step) % 2**32
    assert epochs.newer(b, a) and not epochs.newer(a, b)
    assert epochs.newer(epochs.after(a), a)


def test_a_writer_past_the_last_epoch_wraps_to_0() -> None:
    """A replica that took 2**32 - 1 (a gateway's credentials announce any epoch of its own
    document) follows its writer again: the writer rotates past it to 0, which is newer."""
    writer = writer_doc()
    writer.put_task("a", report("running"))
    writer.rotate(min_epoch=2**31)  # half the circle on: the last epoch is ahead of it
    replica = NodeDoc(NAME, CENTRAL)
    replica.reset_to_epoch(2**31 - 1)  # the farthest ahead of 0 a replica takes in one step
    replica.reset_to_epoch(2**32 - 1)  # and on to the last epoch, emptied
    resync(writer, replica)
    assert writer.epoch == 0 and replica.epoch == 0  # rotated past it, to the epoch after
    assert replica.content_hash() == writer.content_hash() and replica.task("a") is not None
    writer.rotate()
    assert writer.epoch == 1


# ---------------------------------------------------------------------- replicas following


def frames_of(doc: NodeDoc, updates: list[bytes], *, max_packet: int = 1024) -> list[bytes]:
    """What an epoch-aware peer publishes for the updates queued since the last flush: the
    epoch read with the state vector, in the same synchronous step."""
    out: list[bytes] = []
    for update in updates:
        epoch = update.epoch if isinstance(update, LocalUpdate) else doc.epoch
        payload = wire.update_payload(update, doc.state_vector())
        out += wire.encode(Kind.UPDATE, doc.name, doc.client_id, payload, max_packet, epoch=epoch)
    return out


def receive(
    doc: NodeDoc, message: wire.Message, *, from_writer: bool, is_writer: bool = False
) -> str:
    """The receive rule as a peer applies it (sync/peer.py is to do the same)."""
    action = wire.epoch_action(
        doc.epoch, message.epoch, from_writer=from_writer, is_writer=is_writer
    )
    if action == "adopt":
        doc.reset_to_epoch(message.epoch)
    elif action == "rotate_past":
        doc.rotate(min_epoch=epochs.after(message.epoch))
    if action not in ("apply", "adopt"):
        return action
    sync = wire.decode_sync(message.kind, message.payload)
    if sync.step == YSyncMessageType.SYNC_STEP1:
        return "step1"
    if sync.data != b"\x00\x00":
        doc.apply_remote(sync.data, sender="peer")
    return action


def resync(writer: NodeDoc, replica: NodeDoc) -> None:
    """Step 1 / step 2 both ways until equal, with epochs, as the peers do on a reconnect."""
    at_writer, at_replica = Reassembler(), Reassembler()

    def send(src: NodeDoc, kind: Kind, payload: bytes, to: Reassembler) -> wire.Message:
        [frame] = wire.encode(kind, src.name, src.client_id, payload, 1 << 20, epoch=src.epoch)
        message = to.feed(frame)
        assert message is not None
        return message

    for _ in range(4):
        # The replica's step 1: the writer announces a newer epoch or answers with a diff.
        ask = send(replica, Kind.SYNC, wire.step1_payload(replica.state_vector()), at_writer)
        action = receive(writer, ask, from_writer=False, is_writer=True)
        if action == "step1":
            diff = writer.diff(wire.decode_sync(ask.kind, ask.payload).data)
            answer = send(writer, Kind.SYNC, wire.step2_payload(diff), at_replica)
        else:  # a stale replica, or a writer that just rotated past the replica's epoch
            assert action in ("announce", "rotate_past")
            answer = send(writer, Kind.SYNC, wire.step1_payload(writer.state_vector()), at_replica)
        receive(replica, answer, from_writer=True)
        if replica.epoch == writer.epoch and replica.content_hash() == writer.content_hash():
            return
    raise AssertionError("no convergence after 4 rounds")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, seed=st.integers(0, 2**32), loss=st.sampled_from([0.0, 0.2, 0.6]))
def test_replica_follows_rotations_and_converges(
    ops: list[tuple[str, str, int]], seed: int, loss: float
) -> None:
    rng = random.Random(seed)
    writer = writer_doc()
    replica = NodeDoc(NAME, CENTRAL)
    queued: list[bytes] = []
    writer.on_local_update(queued.append)
    in_flight: list[bytes] = []
    reassembler = Reassembler()
    stale = 0
    for op in ops:
        apply_op(writer, op)
        in_flight += [f for f in frames_of(writer, queued) if rng.random() >= loss]
        queued.clear()
        rng.shuffle(in_flight)  # any order: old epochs may arrive after new ones
        for frame in in_flight[: rng.randint(0, len(in_flight))]:
            in_flight.remove(frame)
            message = reassembler.feed(frame)
            if message is None:
                continue
            epoch = replica.epoch
            action = receive(replica, message, from_writer=True)
            assert replica.epoch >= epoch  # a replica never goes back
            if message.epoch < epoch:
                assert action == "announce"  # dropped, never merged
                stale += 1
    resync(writer, replica)
    assert replica.epoch == writer.epoch
    assert replica.to_json() == writer.to_json()


def test_old_epoch_frames_are_dropped_and_new_ones_adopted() -> None:
    writer = writer_doc()
    writer.put_task("a", report("running"))
    old = frames_of(writer, [writer.diff()])
    writer.remove_task("a")
    writer.put_task("b", report("placed"))
    rotation = frames_of(writer, [writer.rotate()])
    replica = NodeDoc(NAME, CENTRAL)
    r = Reassembler()
    [message] = [m for f in rotation if (m := r.feed(f)) is not None]
    assert message.epoch == 1
    assert receive(replica, message, from_writer=True) == "adopt"
    assert replica.epoch == 1 and replica.content_hash() == writer.content_hash()
    before = replica.content_hash()
    [stale] = [m for f in old if (m := r.feed(f)) is not None]
    assert stale.epoch == 0
    assert receive(replica, stale, from_writer=True) == "announce"
    assert replica.content_hash() == before and replica.task("a") is None
    # A newer epoch from someone who is not the writer changes nothing.
    bogus = wire.encode(Kind.SYNC, NAME, 77, wire.step1_payload(b"\x00"), epoch=9)
    [claim] = [m for f in bogus if (m := r.feed(f)) is not None]
    assert receive(replica, claim, from_writer=False) == "drop"
    assert replica.epoch == 1 and replica.content_hash() == before


def test_writer_rotates_past_an_epoch_it_lost() -> None:
    writer = writer_doc()
    writer.put_task("a", report("running"))
    replica = NodeDoc.restore(NAME, CENTRAL, writer.diff(), [])
    replica.reset_to_epoch(5)  # as if it had adopted an epoch 5 the writer's store lost
    replica.apply_remote(writer.diff(), sender="edge-1")
    resync(writer, replica)
    assert writer.epoch == 6 and replica.epoch == 6
    assert replica.content_hash() == writer.content_hash()


# ---------------------------------------------------------------------- the wire's epoch


@settings(max_examples=50, deadline=None)
@given(payload=st.binary(max_size=5000), epoch=st.integers(0, 2**32 - 1), seed=st.integers())
def test_epoch_round_trips_through_chunks(payload: bytes, epoch: int, seed: int) -> None:
    frames = wire.encode(Kind.SYNC, NAME, 5, payload, 600, epoch=epoch)
    random.Random(seed).shuffle(frames)
    r = Reassembler()
    done = [m for f in frames if (m := r.feed(f)) is not None]
    assert len(done) == 1 and done[0].payload == payload and done[0].epoch == epoch
    assert all(wire.decode_frame(f).epoch == epoch for f in frames)


def test_chunks_of_one_message_with_two_epochs_are_rejected() -> None:
    payload = bytes(range(256)) * 8
    a = wire.encode(Kind.UPDATE, NAME, 5, payload, 700, msg_id=42, epoch=1)
    b = wire.encode(Kind.UPDATE, NAME, 5, payload, 700, msg_id=42, epoch=2)
    assert len(a) > 2
    r = Reassembler()
    assert r.feed(a[0]) is None
    with pytest.raises(FrameError, match="disagrees"):
        r.feed(b[1])
    assert r.stats["rejected"] == 1
    for frame in a[1:]:  # the message still completes from its consistent chunks
        message = r.feed(frame)
    assert message is not None and message.epoch == 1 and message.payload == payload


def test_garbage_and_forged_epoch_frames_are_rejected() -> None:
    [frame] = wire.encode(Kind.SYNC, NAME, 5, b"hello", epoch=3)
    r = Reassembler()
    flipped = bytearray(frame)
    flipped[8] ^= 0x01  # a bit of the epoch field: the frame CRC catches it
    with pytest.raises(FrameError, match="CRC"):
        r.feed(bytes(flipped))
    v1 = frame[:2] + b"\x01" + frame[3:]
    with pytest.raises(FrameError, match="version 1"):
        r.feed(v1)
    with pytest.raises(ValueError, match="u32"):
        wire.encode(Kind.SYNC, NAME, 5, b"x", epoch=2**32)
    assert r.stats["rejected"] == 2
    message = r.feed(frame)
    assert message is not None and message.epoch == 3


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=0, max_size=200))
def test_random_bytes_never_pass_as_frames(data: bytes) -> None:
    with pytest.raises(FrameError):
        Reassembler().feed(data)


# ---------------------------------------------------------------------- persistence


async def log_all(doc: NodeDoc, store: Store, queue: list[bytes], **kw: Any) -> None:
    """The engine's log loop: every local update, in order (rotations included)."""
    while queue:
        await doc.log_update(store, queue.pop(0), **kw)


async def test_persist_and_restore_across_rotations(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "edge.db")
    try:
        doc = await NodeDoc.load_from(store, NAME, WRITER)
        doc.rotation_policy = RotationPolicy(min_bytes=2048, ratio=2.0)
        assert doc.epoch == 0
        queue: list[bytes] = []
        doc.on_local_update(queue.append)
        doc.set_registration(REGISTRATION)
        for i in range(600):
            doc.put_task(f"t{i}", report("running", priority=i))
            if i >= 5:
                doc.remove_task(f"t{i - 5}")
            await log_all(doc, store, queue, compact_after=16)
        assert doc.epoch >= 2  # the policy rotated, through log_update alone
        stored = await store.snapshot_with_epoch(NAME)
        assert stored is not None and stored[2] == doc.epoch
        assert len(stored[1]) < 4 * 2048
        loaded = await NodeDoc.load_from(store, NAME, WRITER)
        assert loaded.epoch == doc.epoch
        assert loaded.content_hash() == doc.content_hash()
        assert sorted(loaded.tasks()) == [f"t{i}" for i in range(595, 600)]
        # The restored node carries on at that epoch.
        loaded.on_local_update(queue.append)
        loaded.put_task("after", report("placed"))
        await log_all(loaded, store, queue)
        again = await NodeDoc.load_from(store, NAME, WRITER)
        assert (again.epoch, again.content_hash()) == (loaded.epoch, loaded.content_hash())
    finally:
        await store.close()


async def test_updates_queued_across_a_rotation(tmp_path: Path) -> None:
    """Updates made before a rotation but logged after it: appended at their epoch while the
    store is there, dropped with the old log by the rotation, skipped once it is persisted."""
    store = await Store.open(tmp_path / "edge.db")
    try:
        doc = await NodeDoc.load_from(store, NAME, WRITER)
        queue: list[bytes] = []
        doc.on_local_update(queue.append)
        doc.put_task("a", report("running"))
        doc.put_task("b", report("running"))
        doc.rotate()
        doc.put_task("c", report("placed"))
        assert [getattr(u, "epoch", None) for u in queue] == [0, 0, 1, 1]
        assert await doc.log_update(store, queue[0]) == 1
        assert await doc.log_update(store, queue[2]) == 1  # the rotation: snapshot at seq 1
        assert await store.updates(NAME) == []
        assert await doc.log_update(store, queue[1]) == 0  # old epoch: in the snapshot
        assert await doc.log_update(store, queue[2]) == 0  # the rotation again: no-op
        assert await doc.log_update(store, queue[3]) == 2
        loaded = await NodeDoc.load_from(store, NAME, WRITER)
        assert loaded.epoch == 1 and loaded.content_hash() == doc.content_hash()
    finally:
        await store.close()


async def test_replica_adopting_an_epoch_persists_it(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "central.db")
    try:
        writer = writer_doc()
        writer.put_task("a", report("running"))
        replica = NodeDoc(NAME, CENTRAL)
        replica.apply_remote(writer.diff(), sender="edge-1")
        await replica.persist_to(store)
        state = writer.rotate()
        replica.reset_to_epoch(writer.epoch)
        replica.apply_remote(state, sender="edge-1")
        await replica.persist_to(store)
        loaded = await NodeDoc.load_from(store, NAME, CENTRAL)
        assert loaded.epoch == 1 and loaded.content_hash() == writer.content_hash()
        with pytest.raises(EpochError, match="newer"):
            await NodeDoc(NAME, CENTRAL).persist_to(store)  # a stale copy never overwrites
        with pytest.raises(StoreError, match="epoch 1"):
            await store.rotate_doc(NAME, b"\x00\x00", 1)  # an epoch is started once
    finally:
        await store.close()


class FailingConnection:
    """A store's connection whose statements starting with ``sql_start`` fail (each job of
    the store takes the connection it runs on from ``Store._conn`` when it is handed over)."""

    def __init__(self, real: sqlite3.Connection, sql_start: str) -> None:
        self.real = real
        self.sql_start = sql_start

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith(self.sql_start):
            raise sqlite3.OperationalError("injected failure")
        return self.real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def fail_on(store: Store, sql_start: str) -> Callable[[], None]:
    """Make the store's connection fail the next statement starting with ``sql_start``
    (inside the rotation's transaction); returns the undo."""
    real = store._connection()
    store._conn = FailingConnection(real, sql_start)  # type: ignore[assignment]
    return lambda: setattr(store, "_conn", real)


@pytest.mark.parametrize(
    "step",
    ["INSERT OR REPLACE INTO doc_snapshots", "DELETE FROM doc_updates WHERE doc = ?", "COMMIT"],
)
async def test_a_crash_during_rotation_leaves_a_consistent_store(tmp_path: Path, step: str) -> None:
    path = tmp_path / "edge.db"
    store = await Store.open(path)
    try:
        doc = await NodeDoc.load_from(store, NAME, WRITER)
        queue: list[bytes] = []
        doc.on_local_update(queue.append)
        for i in range(40):
            doc.put_task(f"t{i}", report("running"))
            doc.remove_task(f"t{i - 1}")
        await log_all(doc, store, queue, compact_after=10)
        before = await store.snapshot_with_epoch(NAME), await store.updates(NAME)
        rotation = doc.rotate()
        undo = fail_on(store, step)
        with pytest.raises(StoreError):
            await doc.log_update(store, queue.pop(0))
        undo()
        # Nothing of the rotation is in the store: the old epoch, whole.
        assert (await store.snapshot_with_epoch(NAME), await store.updates(NAME)) == before
        crashed = await NodeDoc.load_from(store, NAME, WRITER)
        assert crashed.epoch == 0 and crashed.content_hash() == doc.content_hash()
        # The owner retries (the engine's log loop does): now the store is at epoch 1.
        assert await doc.log_update(store, rotation) >= 1
    finally:
        await store.close()
    store = await Store.open(path)  # and after a restart
    try:
        loaded = await NodeDoc.load_from(store, NAME, WRITER)
        assert loaded.epoch == 1 and loaded.content_hash() == doc.content_hash()
        assert await store.updates(NAME) == []
    finally:
        await store.close()


async def test_a_crash_before_the_rotation_is_logged(tmp_path: Path) -> None:
    """The process dies after rotating in memory: the store still holds epoch 0, whole."""
    store = await Store.open(tmp_path / "edge.db")
    try:
        doc = await NodeDoc.load_from(store, NAME, WRITER)
        queue: list[bytes] = []
        doc.on_local_update(queue.append)
        doc.put_task("a", report("running"))
        await log_all(doc, store, queue)
        doc.rotate()  # then the power goes
        loaded = await NodeDoc.load_from(store, NAME, WRITER)
        assert loaded.epoch == 0 and loaded.content_hash() == doc.content_hash()
    finally:
        await store.close()


async def test_compaction_keeps_the_epoch(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "edge.db")
    try:
        await store.rotate_doc(NAME, b"S", 4)
        await store.append_update(NAME, b"u")
        await store.compact(NAME, b"T", 1)
        assert await store.snapshot_with_epoch(NAME) == (1, b"T", 4)
        assert await store.snapshot(NAME) == (1, b"T")
    finally:
        await store.close()


def schema2_file(path: Path) -> None:
    """A store file as schema 2 wrote it (no epochs), holding one document snapshot."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for step in MIGRATIONS[:2]:
            for statement in step:
                conn.execute(statement)
        conn.execute("INSERT INTO doc_snapshots (doc, seq, data) VALUES (?, 3, x'0000')", (NAME,))
        conn.execute("PRAGMA user_version = 2")
    finally:
        conn.close()


async def test_a_schema_2_store_migrates_to_epoch_0(tmp_path: Path) -> None:
    schema2_file(tmp_path / "edge.db")
    store = await Store.open(tmp_path / "edge.db")
    try:
        assert store.schema_version == SCHEMA_VERSION
        assert await store.snapshot_with_epoch(NAME) == (3, b"\x00\x00", 0)
        assert (await NodeDoc.load_from(store, NAME, WRITER)).epoch == 0
    finally:
        await store.close()


def test_salvage_reads_snapshots_of_either_schema(tmp_path: Path) -> None:
    [table] = [t for t in _TABLES if t.name == "doc_snapshots"]
    schema2_file(tmp_path / "old.db")
    src = sqlite3.connect(tmp_path / "old.db")
    try:
        assert list(_readable_rows(src, table)) == [(NAME, 3, b"\x00\x00", 0)]
        src.execute("ALTER TABLE doc_snapshots ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")
        src.execute("UPDATE doc_snapshots SET epoch = 9")
        assert list(_readable_rows(src, table)) == [(NAME, 3, b"\x00\x00", 9)]
    finally:
        src.close()
