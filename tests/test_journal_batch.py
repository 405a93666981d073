"""A journal logs its queue in one store job (edgesched.sync.journal, Store.append_updates).

A document's journal (and a JournalSet of many) used to append each queued update as its own
job of the store's thread, the store's lock held across them all, each a turn of a busy event
loop: at 10,000 nodes a submission's write to the fleet document waited behind them. Now the
updates that are only appended go in one job for every journal of the batch; a compaction, a
rotation or an update of an older epoch is still done on its own, in its place in its queue.

Checked against the reference, one :meth:`SyncedDoc.log_update` per update into a second
SQLite file: on random edits with rotations and compactions and random flush points, the
batched store restores the live document exactly (content and epoch), as the reference does,
in no more jobs. Real SQLite files in ``tmp_path``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edgesched.core.task import TaskState
from edgesched.sync.doc import NodeDoc, RotationPolicy, client_id_for
from edgesched.sync.journal import DocJournal, JournalSet
from edgesched.sync.schema import TaskReport
from edgesched.sync.store import Store

WRITER = client_id_for("edge-1")


def report(i: int) -> TaskReport:
    return TaskReport(state=TaskState.RUNNING, updated_at=float(i), priority=i % 7)


async def test_append_updates_is_one_job_and_seqs_go_on(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "log.db") as store:
        assert await store.append_update("a", b"a1") == 1
        assert await store.append_update("a", b"a2") == 2
        before = store.jobs
        last = await store.append_updates({"a": [b"a3", b"a4"], "b": [b"b1"], "c": []})
        assert store.jobs - before == 1
        assert last == {"a": 4, "b": 1}
        assert await store.updates("a") == [(1, b"a1"), (2, b"a2"), (3, b"a3"), (4, b"a4")]
        assert await store.updates("b") == [(1, b"b1")]
        await store.compact("a", b"snap", 3)  # seqs keep counting past a snapshot
        assert await store.append_updates({"a": [b"a5"]}) == {"a": 5}
        assert await store.append_updates({}) == {}


async def test_a_journal_of_many_updates_logs_them_in_one_job(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "log.db") as store:
        doc = NodeDoc("node-edge-1", WRITER)
        journal = DocJournal(doc, store)
        for i in range(50):
            doc.put_task(f"t{i}", report(i))
        assert journal.pending == 50
        before = store.jobs
        async with journal.transaction():
            pass
        assert store.jobs - before == 2  # in a block: the appends, then COMMIT
        assert journal.pending == 0
        for i in range(50, 80):
            doc.put_task(f"t{i}", report(i))
        before = store.jobs
        running = asyncio.create_task(journal.run())  # its own: BEGIN, the appends, COMMIT
        await journal.flushed()
        running.cancel()
        assert store.jobs - before == 1
        loaded = await NodeDoc.load_from(store, doc.name, WRITER)
        assert loaded.content_hash() == doc.content_hash()


#: One step: edit ``n`` tasks (put, or remove every third), then flush or not.
STEPS = st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=1, max_size=30)


def test_batched_journal_restores_what_one_by_one_does_property(tmp_path: Path) -> None:
    """Random edits of a single-writer document that rotates (small policy) and compacts
    (every 8 updates), logged at random points by its journal; the same updates logged one
    by one (the reference). Both stores restore the live document, at its epoch."""
    loop = asyncio.new_event_loop()
    runs = [0]

    async def run(steps: list[tuple[int, bool]]) -> None:
        runs[0] += 1
        base = tmp_path / f"run{runs[0]}"
        base.mkdir()
        async with (
            await Store.open(base / "batched.db") as batched,
            await Store.open(base / "reference.db") as reference,
        ):
            docs = [NodeDoc("node-edge-1", WRITER) for _ in range(2)]  # batched, reference
            for doc in docs:  # (a document tracks what one store holds: one each)
                doc.rotation_policy = RotationPolicy(min_bytes=1024, ratio=1.5)
                doc.compact_after = 8
            queue: list[bytes] = []
            docs[1].on_local_update(queue.append)
            journal = DocJournal(docs[0], batched)
            one_by_one_jobs = batched_jobs = commits = 0
            k = 0

            async def flush() -> None:
                nonlocal one_by_one_jobs, batched_jobs, commits
                commits += journal.pending > 0
                before = batched.jobs
                async with journal.transaction():
                    pass
                batched_jobs += batched.jobs - before
                before = reference.jobs
                while queue:  # (a rotation queues one more)
                    await docs[1].log_update(reference, queue.pop(0))
                one_by_one_jobs += reference.jobs - before

            for n, then_flush in steps:
                for _ in range(n):
                    k += 1
                    for doc in docs:
                        if k % 3 == 0:
                            doc.remove_task(f"t{(k - 2) % 25}")
                        else:
                            doc.put_task(f"t{k % 25}", report(k))
                if then_flush:
                    await flush()
            await flush()
            assert journal.pending == 0 and queue == []
            for doc, store in zip(docs, (batched, reference), strict=True):
                loaded = await NodeDoc.load_from(store, doc.name, WRITER)
                assert (loaded.epoch, loaded.content_hash()) == (doc.epoch, doc.content_hash())
            assert docs[0].content_hash() == docs[1].content_hash()
            # one job per update (each its own commit) against one per flush and its COMMIT,
            # and the compactions and rotations as before
            assert batched_jobs <= one_by_one_jobs + commits

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(STEPS)
    @example([(40, True)] * 30)  # rotations and compactions in most flushes
    def check(steps: list[tuple[int, bool]]) -> None:
        loop.run_until_complete(run(steps))

    try:
        check()
    finally:
        loop.close()


async def test_a_journal_set_logs_every_document_in_one_job(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "log.db") as store:
        journals = JournalSet(store)
        docs = [NodeDoc(f"node-n{i}", client_id_for(f"n{i}")) for i in range(20)]
        for i, doc in enumerate(docs):
            journals.add(doc)
            for t in range(3):
                doc.put_task(f"t{t}", report(i + t))
        before = store.jobs
        assert await journals.flush() == 20
        assert store.jobs - before == 1  # BEGIN, the appends of all 60 updates, COMMIT
        for doc in docs:
            loaded = await NodeDoc.load_from(store, doc.name, doc.client_id)
            assert loaded.content_hash() == doc.content_hash()
