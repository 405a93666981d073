"""Central's node replicas persisted by their changes (``central/replicas.py``): a snapshot
pass appends the remote updates each replica applied to its log in SQLite and writes a whole
snapshot only when the log is due to be folded, after a new epoch or a dropped replica, or
after a failed write. Whatever the order of deliveries (out of order, duplicated, held
pending), epochs, drops, failed and cancelled writes, a replica restored from the store
holds what the live replica holds, over a real SQLite store."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.central.replicas import NodeReplicas, Replica
from edgesched.core.task import TaskState
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.schema import TaskReport
from edgesched.sync.session import Endpoint, MqttSession
from edgesched.sync.store import Store, StoreError

NODE = "gw-1"
NAME = f"node-{NODE}"


def report(i: int) -> TaskReport:
    states = (TaskState.RUNNING, TaskState.EXITED, TaskState.ACCEPTED)
    return TaskReport(state=states[i % 3], updated_at=float(i), node=NODE, cpu=0.25)


def replicas_on(store: Store) -> NodeReplicas:
    session = MqttSession(Endpoint("127.0.0.1", 1883, "central"))  # never started
    return NodeReplicas("central", session, store=store)


class Node:
    """The node's own document (its writer) and the updates it sent, in order."""

    def __init__(self) -> None:
        self.doc = NodeDoc(NAME, client_id_for(NODE))
        self.sent: list[bytes] = []
        self.doc.on_local_update(self.sent.append)

    def write(self, key: int, value: int | None) -> None:
        if value is None:
            self.doc.remove_task(f"t{key}")
        else:
            self.doc.put_task(f"t{key}", report(value))


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 6), st.none() | st.integers(0, 50)),
        st.tuples(st.just("deliver"), st.integers(0, 3), st.booleans()),  # (from the end, dup)
        st.tuples(st.just("resync"), st.just(0), st.just(False)),
        st.tuples(st.just("persist"), st.just(0), st.just(False)),
        st.tuples(st.just("fail"), st.just(0), st.just(False)),
        st.tuples(st.just("cancel"), st.just(0), st.just(False)),
        st.tuples(st.just("rotate"), st.just(0), st.just(False)),
        st.tuples(st.just("drop"), st.just(0), st.just(False)),
    ),
    max_size=40,
)


def seeded(store: Store, tasks: int) -> tuple[NodeReplicas, Replica, Node]:
    """Central's replicas over ``store``, holding the node's document of ``tasks`` tasks."""
    replicas = replicas_on(store)
    replica = replicas.add(NODE)
    node = Node()
    for i in range(tasks):
        node.write(i, i)
    replica.doc.apply_remote(node.doc.snapshot(), sender=NODE)
    return replicas, replica, node


async def play(store: Store, ops: list[tuple[str, int, Any]]) -> None:
    replicas = replicas_on(store)
    replica = replicas.add(NODE)
    node = Node()
    delivered = 0

    def deliver(update: bytes) -> None:
        replica.doc.apply_remote(update, sender=NODE)

    for op, arg, flag in ops:
        if op == "write":
            node.write(arg, flag)
        elif op == "deliver" and delivered < len(node.sent):
            # the next one, or one a few ahead of it (out of order: held pending)
            index = min(len(node.sent) - 1, delivered + arg)
            deliver(node.sent[index])
            if flag:
                deliver(node.sent[index])  # a duplicate
            if index == delivered:
                delivered += 1
        elif op == "resync":  # the node's answer to our step 1: all we lack
            deliver(node.doc.diff(replica.doc.state_vector()))
            delivered = len(node.sent)
        elif op == "persist":
            await replicas.persist_changed()
        elif op == "fail":  # a full disk for one pass: nothing of it lands

            async def refuse(*_args: Any, **_kwargs: Any) -> Any:
                raise StoreError("disk full")

            saved = store.append_updates, store.replace_docs
            store.append_updates, store.replace_docs = refuse, refuse  # type: ignore[method-assign]
            try:
                await replicas.persist_changed()
            finally:
                store.append_updates, store.replace_docs = saved  # type: ignore[method-assign]
        elif op == "cancel":  # central stopping in the middle of a pass
            task = asyncio.ensure_future(replicas.persist_changed())
            await asyncio.sleep(0)  # (it is at its first write, if it has one)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        elif op == "rotate":  # the node starts a new epoch; the replica adopts it (its peer)
            node.doc.rotate()
            node.sent.clear()
            delivered = 0
            replica.doc.reset_to_epoch(node.doc.epoch)
            deliver(node.doc.diff(replica.doc.state_vector()))
        elif op == "drop" and not replica.doc.authored_here():
            replica.doc.drop_replica()  # (refilled by the next resync)
    await replicas.persist_changed()
    restored = await NodeDoc.load_from(store, NAME, client_id_for("central"))
    assert restored.epoch == replica.doc.epoch
    assert restored.content_hash() == replica.doc.content_hash()
    # and both become the node's own content once it answers
    for doc in (restored, replica.doc):
        doc.apply_remote(node.doc.diff(doc.state_vector()), sender=NODE)
        assert doc.content_hash() == node.doc.content_hash()


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
def test_a_replica_restored_from_its_log_holds_what_the_live_one_holds(
    ops: list[tuple[str, int, Any]],
) -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with await Store.open(Path(tmp) / "central.db") as store:
                await play(store, ops)

    asyncio.run(run())


async def test_changes_append_and_the_log_folds_into_a_snapshot(tmp_path: Path) -> None:
    """Each change after the first snapshot is appended (a few hundred bytes), until the log
    reaches half the snapshot's bytes: then one snapshot folds it."""
    async with await Store.open(tmp_path / "central.db") as store:
        replicas, replica, node = seeded(store, 100)
        snapshots: list[int] = []
        appended: list[int] = []
        replace, append = store.replace_docs, store.append_updates

        async def counted_replace(docs: Any) -> list[str]:
            snapshots.extend(len(s) for _, s, _ in docs)
            return await replace(docs)

        async def counted_append(runs: Any, **kwargs: Any) -> dict[str, int]:
            appended.extend(len(u) for run in runs.values() for u in run)
            return await append(runs, **kwargs)

        store.replace_docs, store.append_updates = counted_replace, counted_append  # type: ignore[method-assign]
        assert await replicas.persist_changed() == 1
        assert len(snapshots) == 1 and not appended
        first = snapshots[0]
        changes = 0
        while len(snapshots) == 1:
            node.sent.clear()
            node.write(changes % 100, changes + 1000)
            for update in node.sent:
                replica.doc.apply_remote(update, sender=NODE)
            changes += 1
            assert await replicas.persist_changed() == 1
            assert changes < 500, "the log never folded"
        assert len(appended) == changes - 1  # every change before the fold: appended
        assert max(appended) < first / 20  # a change costs a sliver of the document
        # folded at the pass whose change took the log to half the snapshot's bytes
        assert sum(appended) < first / 2 <= sum(appended) + 2 * max(appended)
        updates = await store.updates(NAME)
        assert updates == []  # the fold dropped the log
        restored = await NodeDoc.load_from(store, NAME, client_id_for("central"))
        assert restored.content_hash() == replica.doc.content_hash()


async def test_a_node_resending_one_update_grows_nothing_without_bound(tmp_path: Path) -> None:
    """An update that changes nothing moves no change count, so the pass does not write it
    until the next change: a gateway resending one update without end would grow the log
    in memory. Past twice the fold it is dropped and the replica written whole."""
    async with await Store.open(tmp_path / "central.db") as store:
        replicas, replica, node = seeded(store, 20)
        assert await replicas.persist_changed() == 1
        node.sent.clear()
        node.write(1, 99)
        [update] = node.sent
        for _ in range(20_000):
            replica.doc.apply_remote(update, sender=NODE)  # (the first changes; then repeats)
            assert replica.log_bytes <= 2 * replica.fold_at() + len(update)
        assert replica.whole_next  # dropped, to be written whole
        node.write(2, 100)
        replica.doc.apply_remote(node.sent[-1], sender=NODE)
        assert await replicas.persist_changed() == 1
        restored = await NodeDoc.load_from(store, NAME, client_id_for("central"))
        assert restored.content_hash() == replica.doc.content_hash() == node.doc.content_hash()


async def test_a_pass_appends_many_replicas_a_group_per_store_call(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Seven replicas with a change each, groups of two: four store calls (one pass's
    appends in one call held the store's thread up to 119 ms). A group the store refuses
    (a full disk, say) leaves only its replicas to be written whole at the next pass; every
    replica restored from the store then holds what the live one holds."""
    monkeypatch.setattr("edgesched.central.replicas.SNAPSHOT_BATCH_DOCS", 2)
    async with await Store.open(tmp_path / "central.db") as store:
        replicas = replicas_on(store)
        nodes: dict[str, tuple[Replica, NodeDoc]] = {}
        for k in range(7):
            node_id = f"gw-{k}"
            writer = NodeDoc(f"node-{node_id}", client_id_for(node_id))
            writer.put_task("t0", report(0))
            replica = replicas.add(node_id)
            replica.doc.apply_remote(writer.snapshot(), sender=node_id)
            nodes[node_id] = (replica, writer)
        assert await replicas.persist_changed() == 7  # whole snapshots first
        calls: list[list[str]] = []
        append = store.append_updates

        async def counted_append(runs: Any, **kwargs: Any) -> dict[str, int]:
            calls.append(sorted(runs))
            if len(calls) == 2:
                raise StoreError("disk full")
            return await append(runs, **kwargs)

        store.append_updates = counted_append  # type: ignore[method-assign]
        for replica, writer in nodes.values():
            sent: list[bytes] = []
            writer.on_local_update(sent.append)
            writer.put_task("t1", report(1))
            for update in sent:
                replica.doc.apply_remote(update, sender=writer.name[5:])
        assert await replicas.persist_changed() == 5  # the refused group's two: not now
        assert [len(c) for c in calls] == [2, 2, 2, 1]
        refused = calls[1]
        assert all(replicas.replicas[n[5:]].whole_next for n in refused)
        store.append_updates = append  # type: ignore[method-assign]
        assert await replicas.persist_changed() == 2  # written whole
        for node_id, (replica, _) in nodes.items():
            restored = await NodeDoc.load_from(store, f"node-{node_id}", client_id_for("central"))
            assert restored.content_hash() == replica.doc.content_hash()
