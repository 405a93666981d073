"""The store's database thread (edgesched.sync.store): each call is one job.

A write outside a transaction block (``BEGIN``, its statements, ``COMMIT``) and a read are one
job each in the store's thread, handed back to the event loop once; inside a block each call
is one job (the first begins the block's transaction), and so is the block's end. Counted
exactly (``Store.jobs`` and the callbacks the thread hands to the loop); what that saves under
a busy loop is timed by ``bench/bench_store_contention.py``, not asserted here. A caller
cancelled mid-job gets control back only once the job has ended (a started write commits, a
block rolls back) and never leaves a transaction open; a statement failing anywhere in a
multi-statement write rolls back the statements before it. Real SQLite files in ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.core.task import TaskRecord, TaskSpec, TaskState
from edgesched.sync import store as store_module
from edgesched.sync.store import Store, StoreError

THREAD = "edgesched-sqlite"


def record(i: int, pad: int = 0) -> TaskRecord:
    spec = TaskSpec(id=f"t{i:05d}", command=("true",), env={"PAD": "x" * pad} if pad else {})
    return TaskRecord(spec=spec, state=TaskState.ACCEPTED, submitted_at=i, updated_at=i)


def visible(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """What another connection sees: only what the store has committed."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def no_write_transaction_open(path: Path) -> bool:
    """Whether another connection can take the write lock at once (the store holds none)."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "edge.db")
    yield s
    await s.close()


class HandBacks:
    """Counts the callbacks the store's thread hands to the event loop, while entered."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.n = 0

    def __enter__(self) -> HandBacks:
        real = self.loop.call_soon_threadsafe

        def counting(callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
            if threading.current_thread().name.startswith(THREAD):
                self.n += 1
            return real(callback, *args, **kw)

        self.loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.loop.call_soon_threadsafe  # (the instance attribute: the class's is back)


async def add_samples(store: Store, buckets: int) -> None:
    """Samples in ``buckets`` rollup buckets of 10 s, two each."""
    for i in range(buckets * 2):
        await store.add_sample(i * 5.0, {"cpu": float(i)})


async def statements_of(store: Store, call: Callable[[], Any]) -> list[str]:
    """The SQL statements ``call()`` makes the store run."""
    seen: list[str] = []
    await store.trace(seen.append)
    try:
        await call()
    finally:
        await store.trace(None)
    return seen


# ---------------------------------------------------------------------- one job per call


async def test_a_many_statement_write_is_one_job_and_one_hand_back(store: Store) -> None:
    await add_samples(store, 8)
    with HandBacks(asyncio.get_running_loop()) as handed:
        jobs = store.jobs
        statements = await statements_of(
            store, lambda: store.downsample(now=1000.0, raw_retention_s=0, rollup_s=10)
        )
        # BEGIN, the scan, a lookup and an insert per bucket, two deletes, COMMIT: one job
        assert len(statements) >= 20 and statements[0].startswith("BEGIN")
        assert statements[-1] == "COMMIT"
        assert store.jobs - jobs == 3  # (and the trace's two)
        assert handed.n == 3
        handed.n, jobs = 0, store.jobs
        await store.put_tasks([record(i) for i in range(200)])
        await store.prune_history(1e9)
        assert len(await store.list_tasks()) == 200
        assert store.jobs - jobs == handed.n == 3


_calls = st.lists(st.sampled_from(["write", "read"]), max_size=5)
_ops = st.lists(
    st.tuples(st.sampled_from(["call", "block", "failed block", "nested"]), _calls),
    min_size=1,
    max_size=8,
)


def test_jobs_are_one_per_call_and_two_per_block_property(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(Store.open(tmp_path / "jobs.db"))
    counter = [0]

    async def call(kind: str) -> None:
        counter[0] += 1
        if kind == "write":
            await store.set_meta(f"k{counter[0]}", "v")
        else:
            await store.get_meta("k1")

    async def run(ops: list[tuple[str, list[str]]]) -> None:
        for op, calls in ops:
            before = store.jobs
            with HandBacks(loop) as handed:
                expected = await one(op, calls)
            assert store.jobs - before == expected, (op, calls)
            assert handed.n == expected, (op, calls)

    async def one(op: str, calls: list[str]) -> int:
        """Runs ``op``; returns the jobs it should take."""
        if op == "call":
            for kind in calls:
                await call(kind)
            return len(calls)
        if op == "block":  # BEGIN with the first call, the others, COMMIT
            async with store.transaction():
                for kind in calls:
                    await call(kind)
        elif op == "nested":  # the inner block joins the outer one: no jobs of its own
            async with store.transaction(), store.transaction():
                for kind in calls:
                    await call(kind)
        else:  # BEGIN with the first call, the others, ROLLBACK
            with pytest.raises(RuntimeError):
                async with store.transaction():
                    for kind in calls:
                        await call(kind)
                    raise RuntimeError("the block fails")
        return len(calls) + 1 if calls else 0  # a block without calls: nothing to begin

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_ops)
    def check(ops: list[tuple[str, list[str]]]) -> None:
        loop.run_until_complete(run(ops))

    try:
        check()
    finally:
        loop.run_until_complete(store.close())
        loop.close()


async def test_a_block_begins_with_its_first_call(store: Store, tmp_path: Path) -> None:
    statements: list[str] = []
    await store.trace(statements.append)
    jobs = store.jobs
    async with store.transaction():
        assert no_write_transaction_open(tmp_path / "edge.db")  # (the lock: this process's)
        await store.set_meta("a", "1")
        assert not no_write_transaction_open(tmp_path / "edge.db")
        await store.append_update("node", b"u1")
    assert store.jobs - jobs == 3
    assert [s.split()[0] for s in statements] == ["BEGIN", "INSERT", "INSERT", "COMMIT"]
    async with store.transaction():
        pass
    assert store.jobs - jobs == 3 and len(statements) == 4  # an empty block: nothing
    assert await store.get_meta("a") == "1" and await store.updates("node") == [(1, b"u1")]


async def test_a_call_never_runs_outside_its_blocks_transaction(
    store: Store, tmp_path: Path
) -> None:
    """SQLite may roll a transaction back by itself after an error (SQLITE_FULL can): the
    block's next call then fails (and dooms the block) rather than commit on its own."""
    with pytest.raises(StoreError, match="rolled back after an earlier error"):
        async with store.transaction():
            await store.set_meta("a", "1")
            await store._job(lambda conn: conn.execute("ROLLBACK"))  # as SQLite would
            with pytest.raises(StoreError, match="rolled back after an earlier error"):
                await store.set_meta("b", "1")
            await store.set_meta("c", "1")  # the block goes on: its end raises
    assert no_write_transaction_open(tmp_path / "edge.db")
    assert [await store.get_meta(k) for k in "abc"] == [None, None, None]


async def test_the_connection_refuses_use_from_the_event_loops_thread(store: Store) -> None:
    with pytest.raises(sqlite3.ProgrammingError, match="thread"):
        store._connection().execute("SELECT 1")
    assert await store.get_meta("x") is None  # (its own thread still uses it)


# ---------------------------------------------------------------------- cancellation


async def started_statement(store: Store, prefix: str) -> threading.Event:
    """An event set (in the store's thread) when a statement starting with ``prefix`` starts."""
    started = threading.Event()

    def trace(sql: str) -> None:
        if sql.startswith(prefix):
            started.set()

    await store.trace(trace)
    return started


async def wait_for(event: threading.Event) -> None:
    deadline = time.monotonic() + 30
    while not event.is_set():
        assert time.monotonic() < deadline, "the statement never started"
        await asyncio.sleep(0.001)


BIG = [record(i, pad=2000) for i in range(20_000)]  # ~40 MB: a put_tasks of a few 100 ms


async def test_a_write_cancelled_mid_job_ends_before_its_caller_moves_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "edge.db"
    async with await Store.open(path) as store:
        started = await started_statement(store, "INSERT INTO tasks")
        writer = asyncio.create_task(store.put_tasks(BIG))
        queued = asyncio.create_task(store.set_meta("queued", "1"))  # waits for the lock
        await wait_for(started)
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer
        # Nothing awaited since: the job had ended (committed: it had started, and a job
        # cannot be interrupted) before the cancelled caller got control back.
        assert visible(path, "SELECT count(*) FROM tasks") == [(len(BIG),)]
        await queued  # (its job may be running now: it had the lock next)
        await store.put_task(record(99_999))  # the next write: its own transaction
        assert visible(path, "SELECT value FROM meta WHERE key = 'queued'") == [("1",)]
        assert visible(path, "SELECT count(*) FROM tasks") == [(len(BIG) + 1,)]
        assert no_write_transaction_open(path)
        assert len(await store.list_tasks()) == len(BIG) + 1


async def test_a_write_timed_out_mid_job_leaves_the_store_consistent(tmp_path: Path) -> None:
    path = tmp_path / "edge.db"
    async with await Store.open(path) as store:
        await store.put_task(record(99_999))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(store.put_tasks(BIG), 0.01)
        counts = visible(path, "SELECT count(*) FROM tasks")
        assert counts in ([(1,)], [(len(BIG) + 1,)])  # not started, or committed: never half
        assert no_write_transaction_open(path)
        await store.set_meta("after", "1")
        assert visible(path, "SELECT value FROM meta WHERE key = 'after'") == [("1",)]
        assert no_write_transaction_open(path)


async def test_a_block_cancelled_mid_job_rolls_back_and_leaves_no_transaction(
    tmp_path: Path,
) -> None:
    path = tmp_path / "edge.db"
    async with await Store.open(path) as store:
        await store.set_meta("before", "1")
        started = await started_statement(store, "INSERT INTO tasks")
        reached: list[str] = []

        async def block() -> None:
            async with store.transaction():
                await store.append_update("node", b"u1")
                await store.put_tasks(BIG)
                reached.append("after the big write")  # never: cancelled in it
                await store.set_meta("inside", "1")

        task = asyncio.create_task(block())
        await wait_for(started)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert reached == []
        assert no_write_transaction_open(path)  # rolled back before the caller moved on
        assert visible(path, "SELECT count(*) FROM tasks") == [(0,)]
        assert visible(path, "SELECT count(*) FROM doc_updates") == [(0,)]
        await store.put_task(record(1))
        assert await store.updates("node") == []
        assert [r.spec.id for r in await store.list_tasks()] == ["t00001"]
        assert await store.get_meta("before") == "1" and await store.get_meta("inside") is None
        assert no_write_transaction_open(path)


async def test_a_cancelled_open_closes_what_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "edge.db"
    async with await Store.open(path) as store:
        await store.put_task(record(1))
    started, release = threading.Event(), threading.Event()
    opened: list[sqlite3.Connection] = []
    threads: list[threading.Thread] = []
    real_open = store_module._open

    def slow_open(*args: Any) -> Any:  # in the new store's thread
        threads.append(threading.current_thread())
        started.set()
        release.wait(10)
        result = real_open(*args)
        opened.append(result[0])
        return result

    monkeypatch.setattr(store_module, "_open", slow_open)
    opening = asyncio.create_task(Store.open(path))
    await wait_for(started)
    opening.cancel()
    await asyncio.sleep(0.05)
    assert not opening.done()  # it waits for its job, which cannot be interrupted
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await opening
    (conn,) = opened
    (thread,) = threads
    await asyncio.to_thread(thread.join, 10)  # the executor was shut down, after the close
    assert not thread.is_alive()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.in_transaction  # noqa: B018
    async with await Store.open(path) as store:
        assert [r.spec.id for r in await store.list_tasks()] == ["t00001"]


# ---------------------------------------------------------------------- errors


class FailingConnection:
    """The store's connection, whose ``fail_at``-th statement (BEGIN and ROLLBACK not
    counted) fails; ``ran`` counts the statements that ran."""

    def __init__(self, real: sqlite3.Connection, fail_at: int) -> None:
        self.real = real
        self.fail_at = fail_at
        self.ran = 0

    def _step(self, sql: str) -> None:
        if sql.startswith(("BEGIN", "ROLLBACK")):
            return
        if self.ran + 1 == self.fail_at:
            raise sqlite3.OperationalError("injected failure")
        self.ran += 1

    def execute(self, sql: str, *args: Any) -> Any:
        self._step(sql)
        return self.real.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        self._step(sql)
        return self.real.executemany(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def contents(store: Store) -> tuple[object, ...]:
    return (
        await store.samples(0.0),
        await store.rollups(0.0),
        await store.list_tasks(),
        await store.history(),
        await store.recent_decisions(),
    )


_samples = st.lists(
    st.tuples(st.integers(0, 99), st.floats(-1e6, 1e6, allow_nan=False)), max_size=30
)


async def fill(store: Store, samples: list[tuple[int, float]]) -> None:
    """Samples, and as many exited tasks (last updated when each sample was taken)."""
    async with store.transaction():  # one commit
        for at, cpu in samples:
            await store.add_sample(float(at), {"cpu": cpu})
        await store.put_tasks(
            [
                TaskRecord(TaskSpec(id=f"t{i}", command=("true",)), TaskState.EXITED, i, at)
                for i, (at, _) in enumerate(samples)
            ]
        )


async def the_write(store: Store, which: str) -> object:
    if which == "downsample":  # a lookup and an insert per bucket, then two deletes
        return await store.downsample(now=100.0, raw_retention_s=50, rollup_s=10)
    return await store.prune_history(60.0, batch=7)  # scans, then inserts and deletes


def test_a_failing_statement_rolls_back_the_whole_write_property(tmp_path: Path) -> None:
    """Downsampling (a lookup and an insert per bucket, then two deletes) and pruning (three
    scans, then inserts and deletes) fail at their k-th statement, COMMIT included: the store
    is as before, usable, and no transaction is left open; the retry does the whole write."""
    loop = asyncio.new_event_loop()
    n = [0]

    async def run(samples: list[tuple[int, float]], which: str, fail_at: int) -> None:
        n[0] += 1
        path = tmp_path / f"f{n[0]}.db"
        async with await Store.open(path) as store:
            await fill(store, samples)

            async def write() -> object:
                return await the_write(store, which)

            before = await contents(store)
            real = store._connection()
            failing = FailingConnection(real, fail_at)
            store._conn = failing  # type: ignore[assignment]
            try:
                try:
                    result = await write()
                except StoreError as exc:
                    assert "injected failure" in str(exc)
                    failed = True
                else:
                    failed = False
            finally:
                store._conn = real
            assert no_write_transaction_open(path)
            if failed:
                assert await contents(store) == before  # nothing of it
                result = await write()
            else:
                assert failing.ran < fail_at  # (it had fewer statements)
            after = await contents(store)
        async with await Store.open(tmp_path / f"r{n[0]}.db") as ref:  # the same, unfailed
            await fill(ref, samples)
            assert result == await the_write(ref, which)
            assert after == await contents(ref)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_samples, st.sampled_from(["downsample", "prune"]), st.integers(1, 25))
    def check(samples: list[tuple[int, float]], which: str, fail_at: int) -> None:
        loop.run_until_complete(run(samples, which, fail_at))

    try:
        check()
    finally:
        loop.close()


async def test_a_failing_commit_rolls_the_write_back(store: Store, tmp_path: Path) -> None:
    await store.set_meta("kept", "1")
    real = store._connection()

    class FailingCommit(FailingConnection):
        def _step(self, sql: str) -> None:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("injected failure")

    store._conn = FailingCommit(real, 0)  # type: ignore[assignment]
    try:
        with pytest.raises(StoreError, match="cannot store 3 document snapshot"):
            await store.replace_docs([(f"d{i}", b"x", 0) for i in range(3)])
    finally:
        store._conn = real
    assert no_write_transaction_open(tmp_path / "edge.db")
    assert await store.doc_names() == []
    assert await store.get_meta("kept") == "1"


async def test_calls_outside_blocks_queue_without_waiting_for_a_turn_of_the_loop(
    store: Store,
) -> None:
    """Two tasks' writes outside any block: each job enters the database thread's queue when
    its task first runs, so the second runs while the loop is still busy (held here,
    synchronously), not after the loop has taken the first one's hand-back, as it did when
    every call took the store's lock: at 10,000 nodes a submission's write waited a turn of
    the busy loop behind each snapshot write."""
    ran = threading.Event()

    def second(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO meta (key, value) VALUES ('second', '2')")
        ran.set()

    first = asyncio.create_task(store.set_meta("first", "1"))
    after = asyncio.create_task(store._write("cannot write the second", second))
    await asyncio.sleep(0)  # both tasks take their first step: each queues its job
    assert ran.wait(30)  # the loop is held: no hand-back of the first can be taken
    await asyncio.gather(first, after)
    assert await store.get_meta("first") == "1" and await store.get_meta("second") == "2"


async def test_a_call_waiting_for_a_block_runs_after_its_commit(store: Store) -> None:
    """A call made while another task's block is open waits for the block's end and runs
    after its COMMIT: never inside the block's transaction (which would commit or roll back
    with it)."""
    statements: list[str] = []
    await store.trace(statements.append)
    inside, release = asyncio.Event(), asyncio.Event()

    async def block() -> None:
        async with store.transaction():
            await store.set_meta("in-block", "1")
            inside.set()
            await release.wait()

    holder = asyncio.create_task(block())
    await inside.wait()
    waiting = asyncio.create_task(store.set_meta("outside", "1"))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(holder, waiting)
    await store.trace(None)
    words = [sql.split()[0] for sql in statements]
    assert words == ["BEGIN", "INSERT", "COMMIT", "BEGIN", "INSERT", "COMMIT"], statements
    assert "in-block" in statements[1] and "outside" in statements[4], statements
