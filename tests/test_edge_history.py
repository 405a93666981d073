"""The edge engine's bounded history and its one-transaction state changes, in-process.

Real SQLite files and real task processes (``sleep``), no broker (the MQTT session retries):
the engine prunes finished tasks past ``[edge] history_retention_s`` on its own while their
counts survive, never prunes an active task nor one central still assigns, a restarted engine
on a pruned store recovers its active tasks, and one task goes from submission to running in
at most three SQLite transactions, its document update committed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, kill_task_processes

from edgesched.config import parse_config
from edgesched.core.model import Decision, DecisionKind
from edgesched.core.task import Assignment, TaskRecord, TaskSpec, TaskState
from edgesched.edge.engine import EdgeEngine
from edgesched.sync.doc import NodeDoc, PolicyDoc, client_id_for, desired_doc_name
from edgesched.sync.schema import AssignmentEntry
from edgesched.sync.store import Store

DAY = 86_400.0
NODE = "gw-hist"


def engine_for(state: Path, **edge: Any) -> EdgeEngine:
    settings: dict[str, Any] = {
        "node_id": NODE,
        "state_dir": str(state),
        "api_port": 0,
        "cycle_s": 0.2,
        "sample_s": 0.1,
        "stop_grace_s": 1.0,
        "mqtt": {"port": free_port()},
        **edge,
    }
    return EdgeEngine(parse_config({"edge": settings}))


@contextlib.asynccontextmanager
async def running(engine: EdgeEngine) -> AsyncIterator[EdgeEngine]:
    task = asyncio.create_task(engine.run())
    try:
        await asyncio.wait_for(engine.wait_ready(), 30)
        yield engine
    finally:
        engine.stop()
        await asyncio.wait_for(task, 30)


async def until(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := await check():
            return value
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{what} not reached in {timeout} s")


def finished(task_id: str, state: TaskState, at: float, **extra: Any) -> TaskRecord:
    spec = TaskSpec(id=task_id, command=("true",), cpu=0.1, mem_gib=0.1)
    return TaskRecord(spec, state, at - 10.0, at, decided_by="edge-autonomous", **extra)


async def prefill(state: Path, now: float) -> None:
    """Old finished history, one of them a task central still assigns us, and its decisions."""
    state.mkdir(parents=True)
    async with await Store.open(state / "edge.db") as store:
        old = [
            finished(f"old-{i}", (TaskState.EXITED, TaskState.FAILED)[i % 2], now - 3 * DAY)
            for i in range(6)
        ]
        assigned = finished(
            "central-1",
            TaskState.EXITED,
            now - 3 * DAY,
            assignment=Assignment("central", epoch=1),
        )
        await store.put_tasks([*old, assigned])
        await store.append_decisions(
            [
                Decision(DecisionKind.PLACE, NODE, "r", now - 3 * DAY, task_id=r.spec.id)
                for r in old
            ],
            "edge-autonomous",
        )
        policy = PolicyDoc(desired_doc_name(NODE), client_id_for("central"))
        policy.assign(
            "central-1",
            AssignmentEntry(spec=assigned.spec, node=NODE, epoch=1, central="central", at=now),
        )
        await policy.persist_to(store)


async def test_old_history_is_pruned_counted_and_a_restart_recovers_the_active_tasks(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    now = time.time()
    await prefill(state, now)
    ids = ["live-a", "live-b"]
    try:
        async with running(engine_for(state)) as engine:
            for tid in ids:
                await engine.submit(TaskSpec(id=tid, command=("sleep", "300"), cpu=0.1))

            async def all_running() -> dict[str, int] | None:
                rows = {r.spec.id: r for r in await engine.store.list_tasks([TaskState.RUNNING])}
                ok = all(t in rows and rows[t].pid for t in ids)
                return {t: int(rows[t].pid or 0) for t in ids} if ok else None

            pids = await until("tasks running", all_running)

            async def pruned() -> bool:
                return await engine.store.task_counts() == {
                    TaskState.RUNNING: 2,
                    TaskState.EXITED: 1,  # central-1: central still assigns it
                }

            await until("history pruned by the sample loop", pruned)
            left = {r.spec.id for r in await engine.store.list_tasks()}
            assert left == {*ids, "central-1"}
            assert await engine.store.recent_decisions(task_id="old-0") == []
            history = await engine.store.history()
            assert history["totals"] == {"exited": 4, "failed": 3, "running": 2}
            assert sum(n for day in history["tasks"].values() for n in day.values()) == 6
            assert sum(n for day in history["decisions"].values() for n in day.values()) == 6
        # The engine stopped (its tasks did not); one task's process dies meanwhile.
        os.killpg(pids["live-b"], signal.SIGKILL)
        await asyncio.sleep(0.2)
        async with running(engine_for(state)) as engine:
            after = await until("tasks running again", all_running)
            assert after["live-a"] == pids["live-a"]  # adopted, not started twice
            assert after["live-b"] != pids["live-b"]  # requeued and started again
            history = await engine.store.history()
            assert history["totals"] == {"exited": 4, "failed": 3, "running": 2}
            assert {r.spec.id for r in await engine.store.list_tasks()} == {*ids, "central-1"}
            assert set(engine.doc.tasks()) == set(ids)  # old ones: past the document's retention
    finally:
        kill_task_processes(state)


async def test_a_short_retention_prunes_a_task_soon_after_it_finishes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        async with running(engine_for(state, history_retention_s=0.5)) as engine:
            await engine.submit(TaskSpec(id="quick", command=("true",), cpu=0.1))
            await engine.submit(TaskSpec(id="slow", command=("sleep", "300"), cpu=0.1))

            async def gone() -> bool:
                return await engine.store.get_task("quick") is None

            await until("finished task pruned", gone)
            slow = await engine.store.get_task("slow")
            assert slow is not None and slow.state is TaskState.RUNNING  # active: never pruned
            assert (await engine.store.history())["totals"].get("exited") == 1
            metrics = engine.metrics.render()  # the gauges come from the kept counts
            assert b'edgesched_edge_tasks{state="running"} 1.0' in metrics
            assert b'edgesched_edge_tasks{state="exited"} 0.0' in metrics
    finally:
        kill_task_processes(state)


async def test_submission_to_running_in_three_transactions_with_the_document_update(
    tmp_path: Path,
) -> None:
    commits: list[str] = []

    def counting(sql: str) -> None:  # in the store's database thread
        if sql.lstrip().upper().startswith("COMMIT"):
            commits.append(sql)

    state = tmp_path / "state"
    try:
        async with running(engine_for(state, sample_s=3600.0, cycle_s=3600.0)) as engine:
            await engine.store.trace(counting)  # every statement the store runs from now on
            await asyncio.sleep(0.5)  # the start's own writes settle
            before = len(commits)
            await engine.submit(TaskSpec(id="one", command=("sleep", "300"), cpu=0.1))
            acked = len(commits) - before
            # Acknowledged: the row and the document update that mirrors it are committed.
            doc = await NodeDoc.load_from(engine.store, engine.doc.name, engine.doc.client_id)
            report = doc.task("one")
            assert report is not None and report.state == "accepted"

            async def is_running() -> bool:
                record = await engine.store.get_task("one")
                return record is not None and record.state is TaskState.RUNNING

            await until("running", is_running)
            assert acked == 1
            assert len(commits) - before <= 3, commits[before:]
            doc = await NodeDoc.load_from(engine.store, engine.doc.name, engine.doc.client_id)
            report = doc.task("one")
            assert report is not None and report.state == "running"
    finally:
        kill_task_processes(state)


async def test_a_burst_of_submissions_shares_transactions(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        async with running(engine_for(state, sample_s=3600.0)) as engine:
            specs = [
                TaskSpec(id=f"b{i:03d}", command=("sleep", "300"), cpu=0.001, mem_gib=0.001)
                for i in range(50)
            ]
            dup = TaskSpec(id="b000", command=("sleep", "1"), cpu=0.001)
            results = await asyncio.gather(
                *(engine.submit(s) for s in [*specs, dup]), return_exceptions=True
            )
            assert all(isinstance(r, TaskRecord) for r in results[:50])
            refused = results[50]
            assert getattr(refused, "status", None) == 409  # one id, once: same batch or not
            stored = await engine.store.list_tasks()
            assert sorted(r.spec.id for r in stored) == [s.id for s in specs]
            doc = await NodeDoc.load_from(engine.store, engine.doc.name, engine.doc.client_id)
            assert {s.id for s in specs} <= set(doc.tasks())
    finally:
        kill_task_processes(state)


# ---------------------------------------------------------------------- the journal


async def test_journal_run_logs_everything_queued_in_one_transaction(tmp_path: Path) -> None:
    """The journal's task logs what waited all at once (one commit, one fsync), in order:
    not one transaction per update, each a turn of the store behind its other writers."""
    from edgesched.sync.journal import DocJournal
    from edgesched.sync.schema import TaskReport

    async with await Store.open(tmp_path / "edge.db") as store:
        doc = NodeDoc("node-x", 7)
        journal = DocJournal(doc, store)
        for i in range(5):
            doc.put_task(f"t{i}", TaskReport.of(finished(f"t{i}", TaskState.EXITED, 1000.0 + i)))
        assert journal.pending == 5
        statements: list[str] = []
        await store.trace(statements.append)
        logger = asyncio.create_task(journal.run())
        try:
            await asyncio.wait_for(journal.flushed(), 5)
        finally:
            logger.cancel()
        await store.trace(None)
        words = [sql.split()[0] for sql in statements]
        # one transaction: the log's last seq (its updates', its snapshot's), then the five
        # updates as one multi-row statement
        assert words == ["BEGIN", "SELECT", "SELECT", "INSERT", "COMMIT"], statements
        assert statements[3].count("'node-x'") == 5
        assert journal.pending == 0
        assert [seq for seq, _ in await store.updates("node-x")] == [1, 2, 3, 4, 5]
        loaded = await NodeDoc.load_from(store, "node-x", 7)
        assert sorted(loaded.tasks()) == [f"t{i}" for i in range(5)]


async def test_journal_transaction_commits_the_document_update_with_the_rows(
    tmp_path: Path,
) -> None:
    from edgesched.sync.journal import DocJournal
    from edgesched.sync.schema import TaskReport
    from edgesched.sync.store import StoreFullError

    async with await Store.open(tmp_path / "edge.db", max_page_count=60) as store:
        doc = NodeDoc("node-x", 7)
        errors: list[Exception] = []
        journal = DocJournal(doc, store, on_error=errors.append, retry_s=0.05)
        rec = finished("t1", TaskState.EXITED, 1000.0)
        async with journal.transaction():
            await store.put_task(rec)
            doc.put_task("t1", TaskReport.of(rec))
            assert journal.pending == 1  # logged at the block's end, inside its transaction
        assert journal.pending == 0
        await asyncio.wait_for(journal.flushed(), 1)
        loaded = await NodeDoc.load_from(store, "node-x", 7)
        assert loaded.task("t1") == doc.task("t1")

        # Full disk: the block fails whole, the update stays queued, run() logs it later.
        n = 0
        with pytest.raises(StoreFullError):
            while n < 10_000:
                await store.add_sample(float(n), {"blob": "z" * 2000})
                n += 1
        rec2 = finished("t2", TaskState.FAILED, 2000.0)
        with pytest.raises(StoreFullError):
            async with journal.transaction():
                doc.put_task("t2", TaskReport.of(rec2))
                await store.put_task(rec2)
                for i in range(40):  # more than the space left, if that row fitted
                    await store.set_meta(f"pad-{i}", "p" * 4000)
        assert await store.get_task("t2") is None
        assert journal.pending == 1
        await store.downsample(now=10.0**9, raw_retention_s=0, rollup_retention_s=0)
        # Still full for its first three tries (as a disk that fills up again would be).
        append, fails = store.append_updates, [3]

        async def flaky(
            runs: Mapping[str, Sequence[bytes]], *, epochs: Mapping[str, int] | None = None
        ) -> dict[str, int]:
            if fails[0]:
                fails[0] -= 1
                raise StoreFullError("database full: test")
            return await append(runs, epochs=epochs)

        store.append_updates = flaky  # type: ignore[method-assign]
        logger = asyncio.create_task(journal.run())
        flushed = asyncio.create_task(journal.flushed())
        try:
            await asyncio.sleep(0.02)
            assert not flushed.done()  # publishing waits: the update is not on disk
            await asyncio.wait_for(flushed, 5)
        finally:
            logger.cancel()
        assert len(errors) == 3 and all(isinstance(e, StoreFullError) for e in errors)
        assert journal.pending == 0
        loaded = await NodeDoc.load_from(store, "node-x", 7)
        assert loaded.task("t2") == doc.task("t2") and loaded.task("t2") is not None
