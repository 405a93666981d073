"""Central's per-node desired-state documents and the journal set that logs them, over a
real SQLite store: the projection moves entries between nodes' documents, ``match`` brings
restored documents up to date writing only what differs, and a batch that fails to commit
leaves every update queued and nothing half-written."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgesched.central.desired import DesiredDocs
from edgesched.core.task import TaskSpec
from edgesched.sync.doc import PolicyDoc, client_id_for, desired_doc_name
from edgesched.sync.journal import DocJournal, JournalSet
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import AssignmentEntry, PowerOrder, StopOrder
from edgesched.sync.session import Endpoint, MqttSession
from edgesched.sync.store import Store, StoreError


def entry(task_id: str, node: str, epoch: int = 1) -> AssignmentEntry:
    spec = TaskSpec(id=task_id, command=("true",), cpu=0.5)
    return AssignmentEntry(spec=spec, node=node, epoch=epoch, central="central", at=1.0)


def session() -> MqttSession:
    return MqttSession(Endpoint("127.0.0.1", 1883, "central"))


async def test_the_projection_follows_assignments_stops_and_power(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "central.db") as store:
        desired = DesiredDocs("central", session(), store)
        first = entry("t1", "gw-a")
        desired.assignment("t1", None, first)
        assert set(desired.doc("gw-a").assignments()) == {"t1"}
        moved = entry("t1", "gw-b", epoch=2)  # a failover: gw-a's document no longer has it
        desired.assignment("t1", first, moved)
        assert desired.doc("gw-a").assignments() == {}
        assert desired.doc("gw-b").assignments()["t1"] == moved
        stop = StopOrder(epoch=1, winner="gw-b", at=2.0)
        desired.stop("t1@gw-a", stop)  # the loser hears in its own document
        assert desired.doc("gw-a").stops() == {"t1@gw-a": stop}
        assert desired.doc("gw-b").stops() == {}
        desired.stop("t1@gw-a", None)
        assert desired.doc("gw-a").stops() == {}
        order = PowerOrder(state="parked", reason="idle", at=3.0)
        desired.power("gw-c", order)
        assert desired.doc("gw-c").power() == {"gw-c": order}
        desired.power("gw-c", None)
        assert desired.doc("gw-c").power() == {}
        desired.assignment("t1", moved, None)  # forgotten
        assert desired.doc("gw-b").assignments() == {}
        # Each document went to SQLite through the one journal set, in one transaction.
        assert await desired.journals.flush() == 3
        assert desired.journals.batches == 1
        restored = await PolicyDoc.load_from(store, desired_doc_name("gw-a"), 7)
        assert restored.content_hash() == desired.doc("gw-a").content_hash()


async def test_match_writes_only_what_differs(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "central.db") as store:
        before = DesiredDocs("central", session(), store)
        before.assignment("keep", None, entry("keep", "gw-a"))
        before.assignment("stale", None, entry("stale", "gw-a"))
        await before.journals.flush()
        after = DesiredDocs("central", session(), store)
        assert await after.load() == 1
        want = {"keep": entry("keep", "gw-a"), "new": entry("new", "gw-b")}
        stops = {"keep@gw-c": StopOrder(epoch=1, winner="gw-a", at=1.0)}
        assert after.match(want, stops, {}) == 3  # drop "stale", add "new", the stop
        assert set(after.doc("gw-a").assignments()) == {"keep"}
        assert set(after.doc("gw-b").assignments()) == {"new"}
        assert set(after.doc("gw-c").stops()) == {"keep@gw-c"}
        assert after.match(want, stops, {}) == 0  # nothing differs any more


async def test_a_failed_batch_keeps_every_update_queued(tmp_path: Path) -> None:
    """The batch is one store job for every journal's updates: SQLite failing on the third
    document's row (a trigger, as a constraint or a full disk would) rolls back the other
    two, every update stays queued, and the next flush logs them all."""
    async with await Store.open(tmp_path / "central.db") as store:
        journals = JournalSet(store)
        docs = [PolicyDoc(f"desired-n{i}", client_id_for("central")) for i in range(3)]
        for doc in docs:
            journals.add(doc)
            doc.assign("t", entry("t", doc.name))
        refuse_n2 = (
            "CREATE TRIGGER refuse_n2 BEFORE INSERT ON doc_updates WHEN NEW.doc = 'desired-n2' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        await store._job(lambda conn: conn.execute(refuse_n2))
        with pytest.raises(StoreError, match="refused"):
            await journals.flush()
        assert all(journals.journals[d.name].pending == 1 for d in docs)
        assert await store.doc_names() == []  # n0 and n1 rolled back with n2
        await store._job(lambda conn: conn.execute("DROP TRIGGER refuse_n2"))
        assert await journals.flush() == 3
        assert all(journals.journals[d.name].pending == 0 for d in docs)
        for doc in docs:
            again = await PolicyDoc.load_from(store, doc.name, 9)
            assert again.content_hash() == doc.content_hash()


def test_an_older_centrals_assignments_move_from_policy_to_fleet() -> None:
    from edgesched.central.engine import _move_desired_state
    from edgesched.core.policy import PolicyMode

    policy = PolicyDoc("policy", client_id_for("central"))
    policy.set_mode(PolicyMode.ENERGY)
    policy.assign("old-1", entry("old-1", "gw-a"))
    policy.order_stop("old-1", "gw-b", StopOrder(epoch=1, winner="gw-a", at=1.0))
    policy.set_power("gw-c", PowerOrder(state="parked", reason="idle", at=2.0))
    fleet = PolicyDoc("fleet", client_id_for("central"))
    fleet.assign("new-1", entry("new-1", "gw-b"))  # the fleet's own entries stay
    assert _move_desired_state(policy, fleet) == 3
    assert set(fleet.assignments()) == {"old-1", "new-1"}
    assert fleet.assignments()["old-1"] == entry("old-1", "gw-a")
    assert set(fleet.stops()) == {"old-1@gw-b"} and set(fleet.power()) == {"gw-c"}
    # the policy document keeps only the fleet-wide settings
    assert policy.assignments() == {} and policy.stops() == {} and policy.power() == {}
    assert policy.mode() is PolicyMode.ENERGY
    assert _move_desired_state(policy, fleet) == 0  # once


async def test_a_node_that_reads_packed_entries_gets_them_packed(tmp_path: Path) -> None:
    """Central writes a node's desired document as JSON text only once the node's
    registration says it reads it; an older node keeps nested values. Either reads the same
    assignments, and a node that starts reading packed keeps its nested entries (equal)."""
    reads = {"gw-new"}
    async with await Store.open(tmp_path / "central.db") as store:
        desired = DesiredDocs("central", session(), store, reads_packed=reads.__contains__)
        for node in ("gw-new", "gw-old"):
            desired.assignment("t-" + node, None, entry("t-" + node, node))
            desired.stop(f"s-{node}@{node}", StopOrder(epoch=1, winner="gw-x", at=2.0))
        new, old = desired.doc("gw-new"), desired.doc("gw-old")
        assert isinstance(new.root("assignments").get("t-gw-new"), str)
        assert isinstance(new.root("stops").get("s-gw-new@gw-new"), str)
        assert isinstance(old.root("assignments").get("t-gw-old"), dict)
        assert isinstance(old.root("stops").get("s-gw-old@gw-old"), dict)
        for node, doc in (("gw-new", new), ("gw-old", old)):  # what each node reads
            replica = PolicyDoc(desired_doc_name(node), client_id_for(node))
            replica.apply_remote(doc.snapshot(), sender="central")
            assert replica.assignments() == {"t-" + node: entry("t-" + node, node)}
        reads.add("gw-old")  # it was upgraded: what it holds matches, nothing is rewritten
        assert (
            desired.match(
                {"t-gw-old": entry("t-gw-old", "gw-old"), "t-gw-new": entry("t-gw-new", "gw-new")},
                {
                    k: StopOrder(epoch=1, winner="gw-x", at=2.0)
                    for k in ("s-gw-new@gw-new", "s-gw-old@gw-old")
                },
                {},
            )
            == 0
        )
        desired.assignment("t2", None, entry("t2", "gw-old"))  # its next entry is packed
        assert isinstance(old.root("assignments").get("t2"), str)


async def test_a_projection_leaves_only_once_its_source_is_on_disk(tmp_path: Path) -> None:
    """A desired-state update may be written and journaled while the fleet document's write
    it was projected from is still on its way (central projects a submission at once, so
    the two journal writes overlap), but its peer publishes nothing until both are on disk:
    a crash of central never leaves a node holding an assignment central lost."""
    async with await Store.open(tmp_path / "central.db") as store:
        fleet = PolicyDoc("fleet", client_id_for("central"))
        fleet_journal = DocJournal(fleet, store)
        sessions = session()
        desired = DesiredDocs("central", sessions, store, source=fleet_journal)
        placed = entry("t1", "gw-a")
        fleet.assign("t1", placed)  # the source, queued in its journal
        desired.assignment("t1", None, placed)  # the projection, queued in its own
        [peer] = [c for c in sessions.channels if isinstance(c, DocPeer)]
        before_publish = peer.before_publish
        assert before_publish is not None

        async def leave() -> None:
            await before_publish()

        leaving = asyncio.create_task(leave())
        assert await desired.journals.flush() == 1  # the projection is on disk ...
        for _ in range(5):
            await asyncio.sleep(0)
        assert not leaving.done()  # ... its source is not: nothing leaves yet
        async with fleet_journal.transaction():
            pass  # the fleet's write
        await asyncio.wait_for(leaving, 5)
        restored = await PolicyDoc.load_from(store, "fleet", 7)
        assert restored.assignment("t1") == placed


async def test_a_document_waits_only_for_the_source_writes_projected_into_it(
    tmp_path: Path,
) -> None:
    """The source's writes that a document's projections did not draw on hold nothing of
    it back: with the fleet document's write for another node still on its way, the first
    node's document (its own projection's source on disk) leaves at once. During a heal
    central answers a thousand nodes' step 1s while the fleet document keeps changing."""
    async with await Store.open(tmp_path / "central.db") as store:
        fleet = PolicyDoc("fleet", client_id_for("central"))
        fleet_journal = DocJournal(fleet, store)
        sessions = session()
        desired = DesiredDocs("central", sessions, store, source=fleet_journal)
        desired.doc("gw-c")  # a document nothing was projected into
        first = entry("t1", "gw-a")
        fleet.assign("t1", first)
        desired.assignment("t1", None, first)
        async with fleet_journal.transaction():
            pass  # t1's source on disk
        second = entry("t2", "gw-b")
        fleet.assign("t2", second)  # queued, not on disk
        desired.assignment("t2", None, second)
        assert await desired.journals.flush() == 2
        peers = {c.doc.name: c for c in sessions.channels if isinstance(c, DocPeer)}
        gates = {
            node: peers[desired_doc_name(node)].before_publish for node in ("gw-a", "gw-b", "gw-c")
        }

        async def leave(node: str) -> None:
            gate = gates[node]
            assert gate is not None
            await gate()

        waiting = {node: asyncio.create_task(leave(node)) for node in gates}
        assert len(waiting) == 3
        for _ in range(5):
            await asyncio.sleep(0)
        assert waiting["gw-a"].done() and waiting["gw-c"].done()
        assert not waiting["gw-b"].done()  # t2's source is not on disk yet
        async with fleet_journal.transaction():
            pass
        await asyncio.wait_for(waiting["gw-b"], 5)
        # a later projection into gw-a needs the source as written then
        third = entry("t3", "gw-a")
        fleet.assign("t3", third)
        desired.assignment("t3", None, third)
        later = asyncio.create_task(leave("gw-a"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert await desired.journals.flush() == 1
        for _ in range(5):
            await asyncio.sleep(0)
        assert not later.done()  # its own write is on disk, t3's source is not
        async with fleet_journal.transaction():
            pass
        await asyncio.wait_for(later, 5)
        assert fleet_journal.pending == 0
