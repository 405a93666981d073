"""Cold documents: a frozen document answers like the live one, and thaws into the same one.

The property test drives two replicas of a node's document through the same random run of
remote updates (in any order: some arrive before what they depend on), epoch resets and
reads; one replica is frozen at random points. Both must agree at every step on the content
hash, the state vector, the diff for any state vector, the changed keys their consumer
drains and the decoded tasks. A central-written document (several writers: the desired
state) is checked the same way, with local writes between freezes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pycrdt
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edgesched.core.task import TaskState
from edgesched.sync.doc import NodeDoc, PolicyDoc, SyncedDoc, client_id_for, decode_state_vector
from edgesched.sync.freezer import Freezer
from edgesched.sync.schema import StopOrder, TaskReport

STATES = [TaskState.RUNNING, TaskState.EXITED, TaskState.FAILED]


def report(i: int) -> TaskReport:
    return TaskReport(state=STATES[i % len(STATES)], updated_at=float(i), cpu=0.5)


def is_frozen(doc: SyncedDoc) -> bool:
    """``doc.frozen``, read through a call (mypy narrows a property across asserts)."""
    return doc.frozen


def clocks(state_vector: bytes) -> dict[int, int]:
    """A state vector's clocks (a client at clock 0 is one with nothing: the same as absent,
    and pycrdt writes it in some encodings and not in others)."""
    return {c: k for c, k in decode_state_vector(state_vector).items() if k}


def applied(update: bytes) -> tuple[str, dict[int, int]]:
    """What ``update`` holds: the content hash and state vector of a document made of it."""
    doc = NodeDoc("node-gw", client_id_for("probe"))
    if update != b"\x00\x00":
        doc.apply_remote(update, sender="probe")
    return doc.content_hash(), clocks(doc.state_vector())


def same(a: SyncedDoc, b: SyncedDoc) -> None:
    assert a.content_hash() == b.content_hash()
    assert a.state_vector() == b.state_vector()
    assert a.epoch == b.epoch


# one step of the run: ("write", key, value) at the writer; ("deliver", i) of the i-th
# pending update; ("freeze",) the frozen replica; ("read",) both replicas' tasks;
# ("rotate",) the writer starts a new epoch
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 5), st.integers(0, 50)),
        st.tuples(st.just("remove"), st.integers(0, 5)),
        st.tuples(st.just("deliver"), st.integers(0, 10)),
        st.tuples(st.just("freeze")),
        st.tuples(st.just("read")),
        st.tuples(st.just("rotate")),
        st.tuples(st.just("resync")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_a_frozen_replica_answers_and_thaws_as_the_live_one(steps: list[tuple[Any, ...]]) -> None:
    writer = NodeDoc("node-gw", client_id_for("gw"))
    live = NodeDoc("node-gw", client_id_for("central"))
    cold = NodeDoc("node-gw", client_id_for("central"))
    for doc in (live, cold):
        doc.track_changes("tasks")
    queue: list[bytes] = []
    writer.on_local_update(queue.append)
    seen: dict[str, set[str]] = {"live": set(), "cold": set()}

    def deliver(update: bytes) -> None:
        """One of the writer's updates, to both replicas (a newer epoch resets them first)."""
        epoch = getattr(update, "epoch", writer.epoch)
        for doc in (live, cold):
            if epoch > doc.epoch:
                doc.reset_to_epoch(epoch)
            if epoch == doc.epoch:
                doc.apply_remote(update, sender="gw")

    def drain(name: str, doc: NodeDoc) -> None:
        keys = doc.drain_changes("tasks")
        seen[name] |= set(doc.tasks()) if keys is None else keys

    for step in steps:
        match step:
            case ("write", key, value):
                writer.put_task(f"t{key}", report(value))
            case ("remove", key):
                writer.remove_task(f"t{key}")
            case ("rotate",):
                writer.rotate()
            case ("deliver", i) if queue:
                deliver(queue.pop(i % len(queue)))
            case ("resync",):  # the writer's step 2 for each replica's state vector
                for doc in (live, cold):
                    if writer.epoch > doc.epoch:
                        doc.reset_to_epoch(writer.epoch)
                    answer = writer.diff(doc.state_vector())
                    if answer != b"\x00\x00":
                        doc.apply_remote(answer, sender="gw")
                    doc.settle()
            case ("freeze",):
                # refused only while it holds updates pending for a missing dependency
                assert (cold.freeze() > 0) == is_frozen(cold)
            case ("read",):
                assert dict(cold.tasks()) == dict(live.tasks())
                drain("live", live)
                drain("cold", cold)
                assert seen["live"] == seen["cold"]
        # answers from the bytes of a frozen replica equal the live replica's
        was_frozen = is_frozen(cold)
        same(live, cold)
        theirs = writer.state_vector()
        assert cold.missing_from(theirs) == live.missing_from(theirs)
        for vector in (theirs, b"\x00"):
            # The bytes may differ, and the frozen answer may carry more: the operations
            # held pending for a missing dependency (the live document leaves them out of a
            # diff, its encoded state keeps them). It never carries less.
            frozen_diff, live_diff = cold.diff(vector), live.diff(vector)
            both = pycrdt.merge_updates(frozen_diff, live_diff)
            assert applied(both) == applied(frozen_diff)
        assert applied(cold.snapshot()) == applied(live.snapshot())
        assert is_frozen(cold) == was_frozen  # none of these thawed it
    # what is left arrives, in order: both end equal to the writer
    for update in queue:
        deliver(update)
    cold.freeze()
    cold.apply_remote(writer.diff(cold.state_vector()), sender="gw")
    live.apply_remote(writer.diff(live.state_vector()), sender="gw")
    same(live, cold)
    assert cold.content_hash() == writer.content_hash()
    assert dict(cold.tasks()) == dict(writer.tasks())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 6), st.booleans(), st.booleans()), max_size=30))
def test_a_frozen_document_keeps_writing_under_its_own_client_id(
    steps: list[tuple[int, bool, bool]],
) -> None:
    """Central's desired-state document: written locally, frozen, thawed, written again;
    a node's replica that follows every update ends equal, and the clock never repeats (a
    repeated clock would be a different operation under an id the node already has)."""
    central = PolicyDoc("desired-gw", client_id_for("central"))
    node = PolicyDoc("desired-gw", client_id_for("gw"))
    updates: list[bytes] = []
    central.on_local_update(updates.append)
    for key, drop, freeze in steps:
        name = f"t{key}"
        if drop:
            central.drop_stop(name, "gw")
        else:
            central.order_stop(name, "gw", StopOrder(epoch=1, winner="gw-b", at=float(key)))
        if freeze:
            central.freeze()
    for update in updates:
        assert node.apply_remote(update, sender="central") or update == b"\x00\x00"
    assert node.content_hash() == central.content_hash()
    assert node.state_vector() == central.state_vector()
    assert dict(node.stops()) == dict(central.stops())


def test_a_document_holding_pending_updates_stays_live_until_they_apply() -> None:
    """pycrdt encodes updates held for a missing dependency, but a document rebuilt from
    those bytes integrates them wrongly once it arrives (the older value of a key wins, for
    good): such a document is not frozen."""
    writer = NodeDoc("node-gw", client_id_for("gw"))
    replica = NodeDoc("node-gw", client_id_for("central"))
    updates: list[bytes] = []
    writer.on_local_update(updates.append)
    writer.put_task("t", report(1))
    writer.put_task("t", report(2))  # the same key again: its origin is the first value
    replica.apply_remote(updates[1], sender="gw")  # waits for updates[0]
    assert replica.freeze() == 0 and not is_frozen(replica)
    replica.apply_remote(updates[0], sender="gw")
    assert replica.content_hash() == writer.content_hash()
    assert replica.freeze() == 0  # (pycrdt cannot say nothing waits any more)
    replica.settle()  # the writer's step 2 says so
    assert replica.freeze() > 0 and is_frozen(replica)
    # what a rebuilt document would have done, for the record: it diverges
    rebuilt = NodeDoc("node-gw", client_id_for("central"))
    rebuilt.apply_remote(updates[1], sender="gw")
    raw: pycrdt.Doc[Any] = pycrdt.Doc(client_id=client_id_for("central"))
    raw.apply_update(rebuilt.doc.get_update())
    raw.apply_update(updates[0])
    fresh = NodeDoc("node-gw", client_id_for("probe"))
    fresh.apply_remote(raw.get_update(), sender="probe")
    assert fresh.content_hash() != writer.content_hash()


def test_the_freezer_freezes_what_went_unused_for_a_whole_period() -> None:
    freezer = Freezer()
    docs = [NodeDoc(f"node-{i}", client_id_for("central")) for i in range(3)]
    writer = NodeDoc("node-0", client_id_for("0"))
    writer.put_task("t", report(1))
    docs[0].apply_remote(writer.snapshot(), sender="0")
    for doc in docs:
        freezer.watch(doc)
    first = freezer.sweep()  # all were used (made, written): none frozen, all marked unused
    assert (first.frozen, first.live) == (0, 3)
    docs[1].state_vector()  # a use that needs no live document does not count ...
    docs[2].tasks()  # ... a read of the content does
    second = freezer.sweep()
    assert (second.frozen, second.live, second.frozen_total) == (2, 1, 2)
    assert is_frozen(docs[0]) and is_frozen(docs[1]) and not is_frozen(docs[2])
    # what the frozen ones keep: their encoded state, compressed (freeze() of a frozen
    # document answers the bytes it keeps), smaller than the state for any real content
    assert second.frozen_bytes == docs[0].freeze() + docs[1].freeze()
    assert docs[0].freeze() < len(docs[0].snapshot())
    assert dict(docs[0].tasks()) == {"t": report(1)}  # thaws, the freezer hears of it
    assert not is_frozen(docs[0]) and freezer.thaws == 1 and freezer.live == 2
    third = freezer.sweep()  # docs[0] was used since: stays; docs[2] went unused: frozen
    assert is_frozen(docs[2]) and not is_frozen(docs[0])
    assert (third.frozen, third.frozen_total) == (1, 2)
    freezer.forget("node-0")
    assert freezer.live == 0 and freezer.frozen == 2
    replaced = NodeDoc("node-1", client_id_for("central"))
    freezer.watch(replaced)  # a new document under a watched name replaces the old one
    docs[1].tasks()  # the old one thawing is no longer the freezer's business
    assert freezer.live == 1 and freezer.frozen == 1 and freezer.thaws == 1


def test_a_frozen_document_cannot_freeze_inside_a_transaction() -> None:
    doc = PolicyDoc("desired-gw", client_id_for("central"))
    with doc.doc.transaction():
        doc.order_stop("t", "gw", StopOrder(epoch=1, winner="gw-b", at=1.0))
        assert doc.freeze() == 0 and not is_frozen(doc)
    assert doc.freeze() > 0 and is_frozen(doc)


def test_a_deletion_after_a_pending_update_reaches_the_decoded_view() -> None:
    """Found by the property test above (live documents, no freezing involved): an update
    applied before what it depends on, then the writer's step 2 deleting that task; the
    map's events never name the deleted key, so without :meth:`SyncedDoc.settle` reading it
    all again the decoded view and central's index kept the task for good."""
    writer = NodeDoc("node-gw", client_id_for("gw"))
    replica = NodeDoc("node-gw", client_id_for("central"))
    queue: list[bytes] = []
    writer.on_local_update(queue.append)
    writer.put_task("t0", report(18))
    writer.rotate()
    writer.put_task("t4", report(34))
    writer.put_task("t3", report(4))
    writer.remove_task("t3")
    waiting = queue.pop(3)  # t3 written, before what it depends on
    replica.reset_to_epoch(waiting.epoch)  # type: ignore[attr-defined]
    replica.apply_remote(waiting, sender="gw")
    # pycrdt reports this update as a change (its structs start past clock 0, so the
    # update's own state vector names nothing to check): the peer tells, from the sender's
    # state vector the update carries (tests/test_sync_peer.py)
    replica.may_hold_pending()
    replica.tasks()
    replica.track_changes("tasks")
    replica.drain_changes("tasks")
    replica.apply_remote(writer.diff(replica.state_vector()), sender="gw")  # step 2 ...
    assert sorted(replica.tasks()) != sorted(writer.tasks())  # (the events missed it)
    replica.settle()  # ... as DocPeer follows it
    assert replica.drain_changes("tasks") is None  # the index reads it all again
    for update in queue:  # the rest, as redelivered
        if getattr(update, "epoch", 0) == replica.epoch:
            replica.apply_remote(update, sender="gw")
    assert replica.content_hash() == writer.content_hash()
    assert sorted(replica.tasks()) == sorted(writer.tasks())


def is_unsettled(doc: NodeDoc) -> bool:
    return doc.unsettled


def test_an_answer_to_a_replica_that_took_everything_in_order_is_not_read_again() -> None:
    """The full read on :meth:`SyncedDoc.settle` is for documents that may hold pending
    updates; one that took every update whole, in order, keeps its decoded view and the
    changed keys its events named (a full decode per resync was a third of central's CPU
    at 10,000 nodes)."""
    writer = NodeDoc("node-gw", client_id_for("gw"))
    replica = NodeDoc("node-gw", client_id_for("central"))
    updates: list[bytes] = []
    writer.on_local_update(updates.append)
    replica.track_changes("tasks")
    for i in range(3):
        writer.put_task(f"t{i}", report(i))
    for update in updates:
        replica.apply_remote(update, sender="gw")
    assert replica.drain_changes("tasks") is None  # (the first drain reads it all)
    writer.put_task("t1", report(7))
    replica.apply_remote(updates[-1], sender="gw")
    assert not replica.unsettled
    replica.settle()  # the writer's answer: nothing was missing
    assert replica.drain_changes("tasks") == {"t1"}
    replica.apply_remote(updates[-1], sender="gw")  # a duplicate: pycrdt may hold something
    assert is_unsettled(replica)
    replica.settle()
    assert replica.drain_changes("tasks") is None and not replica.unsettled


def test_a_sweep_asks_for_a_full_answer_for_what_cannot_freeze_yet() -> None:
    """A quiet replica that may hold pending updates is not frozen; its owner is told, asks
    the writer for a full answer, and the next sweeps freeze it."""
    asked: list[str] = []
    freezer = Freezer(on_unsettled=lambda doc: asked.append(doc.name))
    writer = NodeDoc("node-gw", client_id_for("gw"))
    replica = NodeDoc("node-gw", client_id_for("central"))
    updates: list[bytes] = []
    writer.on_local_update(updates.append)
    writer.put_task("t", report(1))
    replica.apply_remote(updates[0], sender="gw")
    replica.apply_remote(updates[0], sender="gw")  # a duplicate: pycrdt may hold something
    freezer.watch(replica)
    freezer.sweep()
    assert freezer.sweep().frozen == 0 and asked == ["node-gw"] and not is_frozen(replica)
    replica.apply_remote(writer.diff(replica.state_vector()), sender="gw")  # the answer
    replica.settle()
    freezer.sweep()  # (the answer was a use)
    assert freezer.sweep().frozen == 1 and is_frozen(replica) and asked == ["node-gw"]


def test_a_frozen_replica_reset_to_a_new_epoch_is_watched_live_again() -> None:
    freezer = Freezer()
    replica = NodeDoc("node-gw", client_id_for("central"))
    freezer.watch(replica)
    freezer.sweep()
    assert freezer.sweep().frozen == 1 and is_frozen(replica)
    replica.reset_to_epoch(1)  # the writer started a new epoch: a new live document
    assert not is_frozen(replica) and freezer.live == 1 and freezer.frozen == 0
    freezer.sweep()
    assert freezer.sweep().frozen == 1 and is_frozen(replica)  # and frozen again once quiet


def test_a_sweep_of_one_group_leaves_the_others_as_they_are() -> None:
    """``only``: a group on a period of its own (central's replicas); the rest keep their
    second chance for their own sweeps."""
    freezer = Freezer()
    replica, desired = NodeDoc("node-gw", client_id_for("c")), NodeDoc("desired-gw", 1)
    for doc in (replica, desired):
        freezer.watch(doc)
    replicas_only = freezer.sweep(only=lambda name: name.startswith("node-"))
    assert (replicas_only.frozen, replicas_only.live) == (0, 2)  # both were new: used
    assert freezer.sweep(only=lambda name: name.startswith("node-")).frozen == 1
    assert is_frozen(replica) and not is_frozen(desired)
    assert freezer.sweep().frozen == 0  # desired's first sweep: it was used (made)
    assert freezer.sweep().frozen == 1 and is_frozen(desired)


async def test_a_sweep_in_turns_lets_the_loop_run_and_keeps_what_was_used_meanwhile() -> None:
    """The engine's sweep gives the loop a turn every few documents; a document used in
    such a turn (a node's change arriving) is not frozen by that sweep."""
    import asyncio

    freezer = Freezer()
    docs = [NodeDoc(f"node-{i}", client_id_for("central")) for i in range(10)]
    for doc in docs:
        freezer.watch(doc)
    assert (await freezer.sweep_in_turns(per_turn=3)).frozen == 0  # all new: used
    turns: list[int] = []

    async def meanwhile() -> None:
        while True:
            turns.append(freezer.frozen)
            docs[9].tasks()  # used while the sweep runs: before the sweep reaches it
            await asyncio.sleep(0)

    other = asyncio.create_task(meanwhile())
    await asyncio.sleep(0)
    try:
        sweep = await freezer.sweep_in_turns(per_turn=3)
    finally:
        other.cancel()
    assert len(turns) >= 3 and turns[1] < 9  # the loop ran between the sweep's turns
    assert sweep.frozen == 9 and not is_frozen(docs[9])
    assert all(is_frozen(d) for d in docs[:9]) and (sweep.live, sweep.frozen_total) == (1, 9)


# one step of a sole writer's run as central's replica sees it: ("write", key, value),
# ("remove", key) at the writer; ("deliver", i) the i-th queued update (any order);
# ("again", i) one already delivered, again (QoS 1 redelivery, a healed node's queued updates
# inside its answer); ("answer",) the writer's step 2 for the replica's state vector, as to
# central's step 1; ("stale",) its step 2 for a state vector the replica had earlier (an
# answer overtaken by updates); ("read",) the consumer drains the changed keys
SOLE_WRITER_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 5), st.integers(0, 50)),
        st.tuples(st.just("remove"), st.integers(0, 5)),
        st.tuples(st.just("deliver"), st.integers(0, 10)),
        st.tuples(st.just("again"), st.integers(0, 10)),
        st.tuples(st.just("answer")),
        st.tuples(st.just("stale"), st.integers(0, 10)),
        st.tuples(st.just("read")),
        st.tuples(st.just("rotate")),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SOLE_WRITER_STEPS)
@example(  # the case test_a_deletion_after_a_pending_update_reaches_the_decoded_view found
    [("write", 0, 18), ("rotate",), ("write", 4, 34), ("write", 3, 4), ("remove", 3),
     ("deliver", 3), ("read",), ("answer",), ("read",)]
)  # fmt: skip
def test_duplicates_of_a_sole_writer_keep_the_consumers_view_exact(
    steps: list[tuple[Any, ...]],
) -> None:
    """Central alone with a node's document (``DocPeer(sole_asker=True)``): a duplicate of the
    writer's (an update whose carried state vector we already hold, or a step 2 answering a
    state vector of ours) is not taken for an update pycrdt holds pending, so it costs no full
    read. Whatever the order, loss and duplication of deliveries, what the consumer (central's
    fleet index) builds from the drained keys equals the document decoded from scratch, as
    the peer's own rules (``may_hold_pending`` when still behind the sender, ``settle`` after
    each step 2) drive it."""
    writer = NodeDoc("node-gw", client_id_for("gw"))
    replica = NodeDoc("node-gw", client_id_for("central"))
    replica.track_changes("tasks")
    queue: list[tuple[bytes, bytes]] = []  # (update, the writer's state vector after it)
    delivered: list[tuple[bytes, bytes]] = []
    vectors: list[bytes] = [replica.state_vector()]  # the replica's, as its step 1s said
    writer.on_local_update(lambda u: queue.append((u, b"")))
    mirror: dict[str, TaskReport] = {}
    full_reads = 0

    def update(data: bytes, state: bytes) -> None:  # DocPeer._handle_sync, Kind.UPDATE
        epoch = getattr(data, "epoch", writer.epoch)
        if epoch > replica.epoch:  # the writer's new epoch: the replica follows it
            replica.reset_to_epoch(epoch)
        if epoch != replica.epoch:
            return  # (of an epoch the replica left: dropped)
        replica.apply_remote(data, sender="gw", writer_state=state)
        if replica.missing_from(state):
            replica.may_hold_pending()

    def answer(vector: bytes) -> None:  # DocPeer._handle_sync, a step 2 of the writer
        if writer.epoch > replica.epoch:
            replica.reset_to_epoch(writer.epoch)
            vector = replica.state_vector()  # (its step 1 of the new epoch)
        diff = writer.diff(vector)
        if diff != b"\x00\x00":
            replica.apply_remote(diff, sender="gw", writer_whole=True)
        replica.settle(complete=True)

    def read() -> None:
        nonlocal full_reads
        keys = replica.drain_changes("tasks")
        if keys is None:
            full_reads += 1
            mirror.clear()
            mirror.update(replica.tasks())
        else:
            for key in keys:
                got = replica.task(key)
                if got is None:
                    mirror.pop(key, None)
                else:
                    mirror[key] = got
        scratch = NodeDoc("node-gw", client_id_for("probe"))
        scratch.apply_remote(replica.snapshot(), sender="probe")
        assert mirror == dict(scratch.tasks())
        assert dict(replica.tasks()) == mirror  # the document's own decoded view too

    def write(change: Callable[[], object]) -> None:
        """A write of the writer's; its update (if it made one) carries its state after."""
        made = len(queue)
        change()
        if len(queue) > made:
            queue[-1] = (queue[-1][0], writer.state_vector())

    read()
    for step in steps:
        match step:
            case ("write", key, value):
                write(lambda: writer.put_task(f"t{key}", report(value)))
            case ("remove", key):
                write(lambda: writer.remove_task(f"t{key}"))
            case ("deliver", i) if queue:
                data, state = queue.pop(i % len(queue))
                update(data, state)
                delivered.append((data, state))
            case ("again", i) if delivered:
                update(*delivered[i % len(delivered)])
            case ("answer",):
                vectors.append(replica.state_vector())
                answer(vectors[-1])
            case ("stale", i):
                answer(vectors[i % len(vectors)])
            case ("read",):
                read()
            case ("rotate",):
                write(writer.rotate)
                vectors = [b"\x00"]  # (answers to the old epoch's vectors are void)
    answer(replica.state_vector())  # the end: a full answer, then the consumer reads
    read()
    assert replica.content_hash() == writer.content_hash()
    assert mirror == dict(writer.tasks())


def test_a_duplicate_of_the_sole_writer_costs_no_full_read_and_a_pending_one_still_does() -> None:
    """The rule in three cases: the writer's update delivered twice, and its step 2 to a state
    vector of ours that the update already brought, are duplicates (the consumer reads just
    the changed key); an update waiting for one that was lost changes nothing either, but the
    state vector it carries is ahead of ours: pending, read in full after the answer."""
    writer = NodeDoc("node-gw", client_id_for("gw"))
    replica = NodeDoc("node-gw", client_id_for("central"))
    updates: list[bytes] = []
    writer.on_local_update(updates.append)
    replica.track_changes("tasks")
    replica.drain_changes("tasks")  # (the first drain reads it all)
    before = replica.state_vector()
    writer.put_task("t1", report(1))
    state = writer.state_vector()
    replica.apply_remote(updates[0], sender="gw", writer_state=state)
    replica.apply_remote(updates[0], sender="gw", writer_state=state)  # redelivered
    assert not is_unsettled(replica)
    replica.apply_remote(writer.diff(before), sender="gw", writer_whole=True)  # stale answer
    replica.settle()
    assert not is_unsettled(replica) and replica.drain_changes("tasks") == {"t1"}
    # without the writer's word (another peer's answer, or an update with no state vector)
    # the same duplicate is taken for a pending one, as before
    replica.apply_remote(writer.diff(before), sender="gw")
    assert is_unsettled(replica)
    replica.settle()
    assert replica.drain_changes("tasks") is None
    writer.put_task("t2", report(2))  # lost on the way
    writer.put_task("t3", report(3))
    # waits for t2: pycrdt reports no change (no event, the state vector stays), so only
    # the writer's state vector it carries tells it from a duplicate
    assert not replica.apply_remote(updates[2], sender="gw", writer_state=writer.state_vector())
    assert is_unsettled(replica)
    replica.apply_remote(writer.diff(replica.state_vector()), sender="gw", writer_whole=True)
    replica.settle()
    assert replica.drain_changes("tasks") is None  # read in full: t3 came without an event
    assert sorted(replica.tasks()) == ["t1", "t2", "t3"]


@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=12))
@settings(max_examples=30, deadline=None)
def test_content_hash_of_a_state_is_the_documents_own(ops: list[tuple[int, bool]]) -> None:
    """``content_hash_of(doc.snapshot())``, computed from the bytes alone (in the scale
    harness's simulators), is the document's ``content_hash``, live or frozen; and another
    content gives another digest."""
    from edgesched.sync.doc import content_hash_of

    doc = NodeDoc("node-h", client_id_for("h"))
    for i, done in ops:
        report = TaskReport(
            state=TaskState.EXITED if done else TaskState.RUNNING, updated_at=float(i)
        )
        doc.put_task(f"t{i}", report)
    live = doc.content_hash()
    assert content_hash_of(doc.snapshot()) == live
    doc.freeze()
    assert content_hash_of(doc.snapshot()) == live == doc.content_hash()
    doc.put_task("another", TaskReport(state=TaskState.RUNNING, updated_at=99.0))
    assert content_hash_of(doc.snapshot()) == doc.content_hash() != live


async def test_a_sweep_in_turns_yields_on_time_not_only_on_count() -> None:
    """With no count bound, a turn ends after ``turn_s``: at 0 the loop runs between every
    two documents (a freeze costs ~0.7 ms; 200 a turn held central's loop 160 ms)."""
    import asyncio
    import itertools

    freezer = Freezer()
    docs = [NodeDoc(f"node-{i}", client_id_for("central")) for i in range(6)]
    for doc in docs:
        freezer.watch(doc)
    await freezer.sweep_in_turns()  # all new: used
    seen: list[int] = []

    async def meanwhile() -> None:
        while True:
            seen.append(freezer.frozen)
            await asyncio.sleep(0)

    other = asyncio.create_task(meanwhile())
    await asyncio.sleep(0)
    try:
        sweep = await freezer.sweep_in_turns(per_turn=10**9, turn_s=0.0)
    finally:
        other.cancel()
    assert sweep.frozen == 6
    steps = [b - a for a, b in itertools.pairwise(seen)]
    assert set(steps) <= {0, 1} and max(seen) == 5  # at most one document frozen a turn
