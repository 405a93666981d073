"""A central that runs alone rotates each node's ``desired-<node>`` document (issue 19: what
grows with time): every task of a node that central forgets left a tombstone in it, ~26 B
encoded, for as long as the fleet ran, in the node's live replica, its SQLite and central's.

Central's real :class:`~edgesched.central.desired.DesiredDocs` (journal set, SQLite store,
session with the replicas' wildcard subscription) and a real edge engine, over a real
Mosquitto: the document rotates once its garbage outweighs it, the node adopts the new epoch
and keeps running what it runs, and both sides restore the new epoch from their stores. With
a fellow central configured the documents are co-written and keep growing (the control)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiomqtt
from conftest import Broker, cancel_all, kill_task_processes
from test_edge_history import NODE, engine_for, running, until

from edgesched.central.desired import DesiredDocs
from edgesched.central.replicas import NodeReplicas
from edgesched.core.task import TaskRecord, TaskSpec, TaskState
from edgesched.edge.engine import EdgeEngine
from edgesched.fieldtest.attacks import Attacker, desired_epoch_jump
from edgesched.sync.doc import (
    PolicyDoc,
    RotationPolicy,
    SoleDesiredDoc,
    client_id_for,
    desired_doc_name,
)
from edgesched.sync.schema import AssignmentEntry
from edgesched.sync.session import Endpoint, MqttSession
from edgesched.sync.store import Store

LIVE = ("live-0", "live-1", "live-2")
MIN_BYTES = RotationPolicy().min_bytes


def entry(task_id: str, command: tuple[str, ...] = ("true",)) -> AssignmentEntry:
    spec = TaskSpec(id=task_id, command=command, cpu=0.05, mem_gib=0.05)
    return AssignmentEntry(spec=spec, node=NODE, epoch=1, central="central", at=time.time())


def churn(desired: DesiredDocs, batch: int, size: int = 10) -> None:
    """``size`` tasks assigned to the node and forgotten, in one step (one transaction: the
    node never sees them as assignments, its document keeps their tombstones). The journal
    looks at rotating when it compacts, every 256 updates: a step is one update."""
    with desired.batch():
        for k in range(size):
            task_id = f"gone-{batch:04d}-{k:03d}"
            made = entry(task_id)
            desired.assignment(task_id, None, made)
            desired.assignment(task_id, made, None)


@asynccontextmanager
async def central_side(store: Store, port: int) -> AsyncIterator[DesiredDocs]:
    """The desired documents of a central alone, journaled and synced as the engine does."""
    session = MqttSession(Endpoint("127.0.0.1", port, "central"))
    session.fallback = NodeReplicas("central", session)  # its wildcard carries their topics
    desired = DesiredDocs("central", session, store)
    tasks = [asyncio.create_task(session.run()), asyncio.create_task(desired.journals.run())]
    try:
        yield desired
    finally:
        await cancel_all(tasks)


async def rotate_by_churn(desired: DesiredDocs) -> int:
    """Forget tasks of the node until its document rotates; returns the largest encoded
    size it reached before."""
    doc = desired.doc(NODE)
    epoch, batch, grown = doc.epoch, 0, 0
    while doc.epoch == epoch:
        assert batch < 600, f"no rotation after {batch * 10} forgotten tasks"
        churn(desired, batch + 1000 * epoch)
        batch += 1
        await desired.journals.flush()
        if doc.epoch == epoch:
            grown = max(grown, len(doc.snapshot()))
    return grown


async def running_live(node: EdgeEngine, tasks: tuple[str, ...]) -> dict[str, TaskRecord]:
    async def check() -> dict[str, TaskRecord] | None:
        records = {t: await node.store.get_task(t) for t in tasks}
        if all(r is not None and r.state is TaskState.RUNNING for r in records.values()):
            return {t: r for t, r in records.items() if r is not None}
        return None

    found: dict[str, TaskRecord] = await until(f"{tasks} running", check, timeout=30)
    return found


def same_runs(before: dict[str, TaskRecord], after: dict[str, TaskRecord]) -> None:
    """Nothing restarted: the same processes, the same records."""
    for task_id, record in before.items():
        assert after[task_id].pid == record.pid is not None, task_id
        assert after[task_id].submitted_at == record.submitted_at, task_id
        assert after[task_id].restarts == 0, task_id


async def test_a_sole_centrals_desired_document_rotates_and_its_node_follows(
    tmp_path: Path, broker: Broker
) -> None:
    """Rotated while the node is connected (the node adopts the epoch from central's update),
    then again while the node is down (restarted at the old epoch from its store, it hears
    central's newer epoch in answer to its step 1 and adopts it): each time the node keeps
    its runs, and what central writes after reaches it."""
    state = tmp_path / "node"
    name = desired_doc_name(NODE)
    try:
        async with (
            await Store.open(tmp_path / "central.db") as store,
            central_side(store, broker.port) as desired,
        ):
            doc = desired.doc(NODE)
            assert isinstance(doc, SoleDesiredDoc) and doc.writer == "central"

            async def followed(node: EdgeEngine) -> bool:
                replica = node.desired
                return replica.epoch == doc.epoch and (replica.content_hash() == doc.content_hash())

            async with running(engine_for(state, mqtt={"port": broker.port})) as node:
                with desired.batch():
                    for task_id in LIVE:
                        desired.assignment(task_id, None, entry(task_id, ("sleep", "600")))
                first = await running_live(node, LIVE)
                grown = await rotate_by_churn(desired)
                # once the garbage outweighed the live content, past the minimum
                assert grown >= MIN_BYTES * 0.9, grown
                assert len(doc.snapshot()) < 4096  # three live assignments, no tombstones
                assert doc.epoch == 1 and set(doc.assignments()) == set(LIVE)
                await until("the node at central's new epoch", lambda: followed(node))
                assert node._peers["desired"].stats["epoch_adopted"] == 1
                assert len(node.desired.snapshot()) < 4096  # the node's replica shed them too
                same_runs(first, await running_live(node, LIVE))
                desired.assignment("late", None, entry("late", ("sleep", "600")))
                await until("the late assignment on the node", lambda: followed(node))
                await until(  # the node persists its replica each cycle
                    "the node's store at epoch 1", lambda: _stored_epoch(node.store, name, 1)
                )
                first |= await running_live(node, ("late",))
            # the node is down (its tasks go on): central rotates again, assigns one more
            await rotate_by_churn(desired)
            desired.assignment("later", None, entry("later", ("sleep", "600")))
            await desired.journals.flush()
            assert doc.epoch == 2
            async with running(engine_for(state, mqtt={"port": broker.port})) as node:
                assert node.desired.epoch <= 1  # (restored from its store: 1, or 0 if not saved)
                await until("the restarted node at epoch 2", lambda: followed(node))
                assert set(node.desired.assignments()) == {*LIVE, "late", "later"}
                same_runs(first, await running_live(node, (*LIVE, "late")))
                await running_live(node, ("later",))
                await until(
                    "the node's store at epoch 2", lambda: _stored_epoch(node.store, name, 2)
                )
        # central's store restores the last epoch with the same content
        async with await Store.open(tmp_path / "central.db") as store:
            back = await SoleDesiredDoc.load_from(store, name, client_id_for("central"))
            assert back.epoch == 2
            assert set(back.assignments()) == {*LIVE, "late", "later"}
            assert len(back.snapshot()) < 4096
    finally:
        kill_task_processes(state)


async def _stored_epoch(store: Store, name: str, epoch: int) -> bool:
    held = await store.snapshot_with_epoch(name)
    return held is not None and held[2] == epoch


async def test_with_a_fellow_central_the_desired_documents_keep_their_tombstones(
    tmp_path: Path,
) -> None:
    """The control: co-written by two centrals, the same churn leaves the document growing
    past where the sole central's rotated (the co-writers cannot agree on a cut)."""
    session = MqttSession(Endpoint("127.0.0.1", 1883, "central"))  # never started
    async with await Store.open(tmp_path / "central.db") as store:
        desired = DesiredDocs("central", session, store, centrals=("central-b",))
        desired.assignment("live", None, entry("live"))
        doc = desired.doc(NODE)
        assert type(doc) is PolicyDoc and doc.rotation_policy is None
        sizes = []
        for batch in range(400):
            churn(desired, batch)
            await desired.journals.flush()
            sizes.append(len(doc.snapshot()))
        assert doc.epoch == 0
        assert sizes[-1] > 1.5 * MIN_BYTES  # ~26 B a forgotten task, never shed
        assert sizes[-1] > 3 * sizes[99]
        back = await PolicyDoc.load_from(store, desired_doc_name(NODE), 5)
        assert back.epoch == 0 and set(back.assignments()) == {"live"}


async def test_restored_desired_documents_keep_the_class_of_their_central(
    tmp_path: Path,
) -> None:
    """A central restarted alone restores sole (rotating) documents naming it their writer;
    restarted with a fellow, co-written ones."""
    session = MqttSession(Endpoint("127.0.0.1", 1883, "central"))
    async with await Store.open(tmp_path / "central.db") as store:
        first = DesiredDocs("central", session, store)
        first.assignment("t", None, entry("t"))
        await first.journals.flush()
        alone = DesiredDocs("central", session, store)
        assert await alone.load() == 1
        doc = alone.docs[NODE]
        assert isinstance(doc, SoleDesiredDoc) and doc.writer == "central"
        assert alone.peers[NODE].writer == "central"
        shared = DesiredDocs("central", session, store, centrals=("central-b",))
        assert await shared.load() == 1
        assert type(shared.docs[NODE]) is PolicyDoc and shared.peers[NODE].writer is None


async def test_a_gateway_claiming_newer_epochs_gets_one_rotation_a_minute(
    tmp_path: Path, broker: Broker
) -> None:
    """An adversary holding the node's credentials claims ever newer epochs of its own
    desired document. Central, its writer, takes the first claim for an epoch its store lost
    and rotates past it (content kept, the decoy never merged); the claims after it within
    ``ROTATE_PAST_EVERY_S`` are dropped and counted, so ~50-byte frames cannot make central
    write and send a snapshot each."""
    async with (
        await Store.open(tmp_path / "central.db") as store,
        central_side(store, broker.port) as desired,
        aiomqtt.Client("127.0.0.1", broker.port, identifier=NODE) as client,
    ):
        desired.assignment("kept", None, entry("kept"))
        await desired.journals.flush()
        doc = desired.doc(NODE)
        peer = desired.peers[NODE]
        before = doc.content_hash()
        attacker = Attacker(client, NODE, "central")
        await attacker.fetch(desired_doc_name(NODE))  # (central hears the node's topic now)
        claims = 20
        for k in range(claims):
            await attacker.send(desired_epoch_jump(NODE, doc.epoch + 1000 + k))

        async def all_heard() -> bool:
            counted = peer.stats["epoch_rotated"] + peer.stats["epoch_rotate_limited"]
            return counted >= claims

        await until("every claim counted", all_heard)
        assert peer.stats["epoch_rotated"] == 1
        assert peer.stats["epoch_rotate_limited"] == claims - 1
        assert doc.epoch == 1001  # past the first claim, not the later ones
        assert doc.content_hash() == before and "decoy" not in doc.assignments()
        await desired.journals.flush()
        back = await SoleDesiredDoc.load_from(store, desired_doc_name(NODE), 5)
        assert back.epoch == 1001 and set(back.assignments()) == {"kept"}
