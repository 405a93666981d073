"""The store's database thread has two lanes (edgesched.sync.dbthread), and its bulk writes
are a few multi-row statements (edgesched.sync.store ``_insert_rows``).

A document journal's write (what a submission at central waits for) goes ahead of the jobs
waiting in the normal lane (replica snapshots, the finished tasks' history), each lane in its
order, never inside another job's transaction. Bulk writes run one statement per 500 rows,
not one per row: the database thread waits for the GIL around each statement while central's
loop computes (what that costs is timed by ``bench/bench_store_contention.py``, not here).
The multi-row writes are checked against a plain model of the log on random runs. Real
SQLite files in ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from concurrent.futures import CancelledError
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.sync.dbthread import DatabaseThread
from edgesched.sync.store import Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "central.db")
    yield s
    await s.close()


# ---------------------------------------------------------------------- the lanes


@given(st.lists(st.booleans(), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_urgent_jobs_run_before_the_waiting_normal_ones_each_lane_in_order(
    lanes: list[bool],
) -> None:
    """While the worker is busy, jobs queue; then every urgent one runs before every
    normal one, each lane first-in first-out."""
    thread = DatabaseThread("test-lanes")
    gate, started = threading.Event(), threading.Event()
    ran: list[int] = []

    def hold() -> None:
        started.set()
        gate.wait(30)

    try:
        thread.submit(hold)
        assert started.wait(30)  # the worker is busy: what follows queues
        futures = [
            (thread.submit_urgent if urgent else thread.submit)(ran.append, i)
            for i, urgent in enumerate(lanes)
        ]
        gate.set()
        for future in futures:
            future.result(30)
    finally:
        thread.shutdown()
    urgent = [i for i, u in enumerate(lanes) if u]
    normal = [i for i, u in enumerate(lanes) if not u]
    assert ran == urgent + normal
    assert thread.overtakes == (len(urgent) if normal else 0)


def test_a_cancelled_job_is_skipped_and_errors_reach_their_caller() -> None:
    thread = DatabaseThread("test-lanes")
    gate = threading.Event()
    ran: list[str] = []
    try:
        thread.submit(gate.wait, 30)
        dropped = thread.submit(ran.append, "dropped")
        failing = thread.submit_urgent(lambda: 1 / 0)
        kept = thread.submit(ran.append, "kept")
        assert dropped.cancel()
        gate.set()
        kept.result(30)
        with pytest.raises(ZeroDivisionError):
            failing.result(30)
        with pytest.raises(CancelledError):
            dropped.result(0)
    finally:
        thread.shutdown()
    assert ran == ["kept"]
    with pytest.raises(RuntimeError):
        thread.submit(ran.append, "late")  # shut down: refused, as a ThreadPoolExecutor does
    with pytest.raises(RuntimeError):
        thread.submit_urgent(ran.append, "late")


def test_shutdown_runs_what_is_queued_or_cancels_it() -> None:
    thread = DatabaseThread("test-lanes")
    gate = threading.Event()
    ran: list[int] = []
    thread.submit(gate.wait, 30)
    queued = [thread.submit(ran.append, i) for i in range(3)]
    threading.Timer(0.05, gate.set).start()
    thread.shutdown(wait=True)
    assert ran == [0, 1, 2] and all(f.done() for f in queued)

    other = DatabaseThread("test-lanes")
    gate2 = threading.Event()
    other.submit(gate2.wait, 30)
    later = other.submit(ran.append, 99)
    threading.Timer(0.05, gate2.set).start()
    other.shutdown(wait=True, cancel_futures=True)
    assert later.cancelled() and 99 not in ran


async def test_a_journal_write_goes_ahead_of_queued_snapshots_and_history(
    store: Store,
) -> None:
    """Snapshot batches and the history are queued behind a running job; a journal's write
    queued after them runs first (its statements come first in the thread's trace), and the
    store ends with all of it."""
    statements: list[str] = []
    await store.trace(statements.append)
    gate = threading.Event()
    running = asyncio.create_task(store._write("cannot hold", lambda conn: gate.wait(30)))
    await asyncio.sleep(0)  # its job runs, the worker waits on the gate
    snapshots = asyncio.create_task(
        store.replace_docs([(f"node-gw{i}", b"s" * 10, 0) for i in range(3)])
    )
    history = asyncio.create_task(
        store.record_finished(
            [
                {"id": "t1", "phase": "succeeded", "node": "gw0", "origin": "central",
                 "workload": "default", "finished_at": 5.0}
            ]
        )
    )  # fmt: skip
    await asyncio.sleep(0)
    journal = asyncio.create_task(store.append_updates({"fleet": [b"u1", b"u2"]}))
    await asyncio.sleep(0)  # all three queued behind the running job
    gate.set()
    assert await journal == {"fleet": 2}
    await asyncio.gather(running, snapshots, history)
    await store.trace(None)
    inserts = [s for s in statements if s.startswith("INSERT")]
    assert "doc_updates" in inserts[0], inserts  # the journal first
    assert "doc_snapshots" in inserts[1] and "finished_tasks" in inserts[2], inserts
    assert [seq for seq, _ in await store.updates("fleet")] == [1, 2]
    assert await store.snapshot("node-gw2") == (0, b"s" * 10)


async def test_a_blocks_jobs_stay_in_order_with_urgent_calls_around_it(store: Store) -> None:
    """A journal write inside a block is one of the block's jobs (normal lane, in order),
    and a journal write from another task waits for the block's COMMIT."""
    statements: list[str] = []
    await store.trace(statements.append)
    inside, release = asyncio.Event(), asyncio.Event()

    async def block() -> None:
        async with store.transaction():
            await store.set_meta("in-block", "1")
            await store.append_updates({"fleet": [b"a"]})
            inside.set()
            await release.wait()

    holder = asyncio.create_task(block())
    await inside.wait()
    outside = asyncio.create_task(store.append_updates({"fleet": [b"b"]}))
    await asyncio.sleep(0)
    # The worker busy while the block ends: its COMMIT queues, and the outside write must
    # not queue ahead of it in the urgent lane (it began by rolling the block back).
    gate, busy = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        gate.wait(30)

    store._executor.submit(hold)
    assert busy.wait(30)
    release.set()
    for _ in range(20):
        await asyncio.sleep(0)  # (the block's end queues its COMMIT; the outside call wakes)
    gate.set()
    assert await outside == {"fleet": 2}
    await holder
    await store.trace(None)
    words = [s.split()[0] for s in statements]
    commit = words.index("COMMIT")
    assert words[:commit].count("BEGIN") == 1
    assert sum("doc_updates (doc" in s for s in statements[:commit]) == 1
    assert words[commit + 1] == "BEGIN" and "doc_updates (doc" in statements[-2]


# ---------------------------------------------------------------------- multi-row writes


async def test_bulk_writes_are_a_few_statements_not_one_per_row(store: Store) -> None:
    statements: list[str] = []
    await store.trace(statements.append)
    await store.replace_docs([(f"node-gw{i:04d}", b"x" * 20, 0) for i in range(1200)])
    # BEGIN and COMMIT; per 500 documents the epochs, two for the seqs, the rows, the deletes
    assert len(statements) == 2 + 5 * 3, statements[:3]
    statements.clear()
    await store.append_updates({f"desired-gw{i}": [b"u1", b"u2"] for i in range(700)})
    assert len(statements) == 2 + 2 * 2 + 3  # 1,400 rows: three statements of them
    statements.clear()
    rows = [
        {"id": f"t{i}", "phase": "succeeded", "node": "gw", "origin": "central",
         "workload": "default", "finished_at": float(i)}
        for i in range(1100)
    ]  # fmt: skip
    await store.record_finished(rows)
    # one job (a transaction) per 250 rows, so a journal write waits for one of them only
    assert len(statements) == 5 * (2 + 1), statements[:3]
    assert sum(s.startswith("BEGIN") for s in statements) == 5
    await store.trace(None)
    assert (await store.snapshot("node-gw1199")) == (0, b"x" * 20)
    assert (await store.updates("desired-gw699")) == [(1, b"u1"), (2, b"u2")]
    page = await store.finished_tasks(limit=2000)
    assert len(page) == 1100


_doc = st.sampled_from(["fleet", "desired-a", "desired-b", "node-c"])
_op = st.one_of(
    st.tuples(st.just("append"), st.dictionaries(_doc, st.lists(st.binary(max_size=6),
                                                               max_size=4), max_size=3)),
    st.tuples(st.just("one"), _doc, st.binary(max_size=6)),
    st.tuples(st.just("replace"), st.lists(st.tuples(_doc, st.binary(max_size=6)),
                                           max_size=3)),
    st.tuples(st.just("compact"), _doc),
)  # fmt: skip


@given(st.lists(_op, min_size=1, max_size=14))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_log_and_snapshots_match_a_plain_model_property(
    tmp_path: Path, ops: list[tuple[object, ...]]
) -> None:
    """Random appends (one, many), snapshot replacements and compactions: seqs keep counting
    from where each document's log or snapshot left them, a snapshot replaces its document's
    log, and each call returns the seqs the model says."""

    async def run() -> None:
        path = tmp_path / f"model-{abs(hash(repr(ops)))}.db"
        path.unlink(missing_ok=True)
        store = await Store.open(path)
        log: dict[str, list[tuple[int, bytes]]] = {}
        snap: dict[str, tuple[int, bytes]] = {}

        def last(doc: str) -> int:
            seqs = (
                [s for s, _ in log.get(doc, [])] + [snap[doc][0]]
                if doc in snap
                else [s for s, _ in log.get(doc, [])]
            )
            return max(seqs, default=0)

        try:
            for op in ops:
                if op[0] == "append":
                    runs = op[1]
                    assert isinstance(runs, dict)
                    want = {}
                    for doc, updates in runs.items():
                        for u in updates:
                            log.setdefault(doc, []).append((last(doc) + 1, u))
                        if updates:
                            want[doc] = last(doc)
                    assert await store.append_updates(runs) == want
                elif op[0] == "one":
                    doc, data = str(op[1]), op[2]
                    assert isinstance(data, bytes)
                    seq = last(doc) + 1
                    log.setdefault(doc, []).append((seq, data))
                    assert await store.append_update(doc, data) == seq
                elif op[0] == "replace":
                    pairs = op[1]
                    assert isinstance(pairs, list)
                    for doc, data in pairs:
                        snap[doc] = (last(doc), data)
                        log[doc] = []
                    assert await store.replace_docs([(d, b, 0) for d, b in pairs]) == []
                else:
                    doc = str(op[1])
                    if log.get(doc):
                        upto = log[doc][-1][0]
                        await store.compact(doc, b"c", upto)
                        snap[doc] = (upto, b"c")
                        log[doc] = []
                for doc in ("fleet", "desired-a", "desired-b", "node-c"):
                    assert await store.updates(doc) == log.get(doc, [])
                    assert await store.snapshot(doc) == snap.get(doc)
        finally:
            await store.close()

    asyncio.run(run())


def test_a_statement_of_rows_stays_within_the_linked_sqlites_parameter_limit(
    tmp_path: Path,
) -> None:
    """With SQLite's parameter limit lowered to 999 (its default before 3.32), a write of
    1,200 rows of 7 values still goes in, as statements of at most 142 rows."""
    from edgesched.sync import store as store_module

    conn = sqlite3.connect(tmp_path / "limit.db")
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    conn.execute("CREATE TABLE t (a, b, c, d, e, f, g)")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    store_module._insert_rows(conn, "INSERT INTO t", [tuple(range(i, i + 7)) for i in range(1200)])
    assert conn.execute("SELECT count(*), sum(a) FROM t").fetchone() == (1200, sum(range(1200)))
    inserts = [sql for sql in statements if sql.startswith("INSERT")]
    assert len(inserts) == 9  # ceil(1,200 / 142)
