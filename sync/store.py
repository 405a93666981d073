"""The edge node's durable store: one SQLite file (WAL, ``synchronous=FULL``) per node.

It keeps what an edge node must not lose when the power goes: task records, the decisions taken
(committed before they are acted on), telemetry samples with bounded growth (raw samples are
rolled up into fixed buckets, then expire), the append-only CRDT update log per document with
its compacted snapshot, and small metadata (node identity, cached policy, lease).

Every write is one transaction, committed before the call returns, unless it runs inside
:meth:`Store.transaction`: then the writes of that block (task rows, decisions, CRDT updates,
from the asyncio task that opened it) commit together, once, at its end, or not at all. With
``synchronous=FULL`` each commit costs an fsync, so a state change that writes its row, its
decisions and its document update in one transaction pays one instead of three or more. One
:class:`Store` per process, on one SQLite connection used only by the store's own database
thread (one worker, :mod:`edgesched.sync.dbthread`: a document journal's write runs ahead of
the jobs waiting in its normal lane); operations are serialized with an asyncio lock, so a reader
never sees another call's uncommitted rows.

Each call outside a :meth:`Store.transaction` block is one job in that thread (a write's
``BEGIN IMMEDIATE``, its statements and its ``COMMIT`` or ``ROLLBACK`` together), handed back
to the event loop once, at its end: however many statements it runs, a write waits for a busy
loop once, not once per statement (the thread still waits for the GIL around its statements
while the loop computes: central shortens the switch interval for that). Inside a block each
call is one job (the first with the block's ``BEGIN``), and so is the block's end. A caller
cancelled while its job runs waits for the job to end before it raises
:class:`asyncio.CancelledError` (a job cannot be interrupted): a cancelled write may have
committed, as when the process stops right after a ``COMMIT``, and is never left half done nor
leaves a transaction open for the next call.

History stays bounded: :meth:`Store.prune_history` moves finished tasks and old decisions out of
the hot tables in bounded batches, counting them per UTC day (:meth:`Store.history`), and the
per-state task counts are kept by triggers (:meth:`Store.task_counts`), so nothing that runs
every few seconds scans the history.

Opening checks the file (``PRAGMA quick_check``) and migrates an older schema forward in one
transaction (``PRAGMA user_version``); a newer schema is refused. A corrupt file is moved aside
to ``<name>.corrupt-<UTC timestamp>``, a fresh database takes its place, and the rows that can
still be read from the bad copy are salvaged table by table (:attr:`Store.recovery`). A full
disk (``SQLITE_FULL``) raises :class:`StoreFullError` and leaves the store usable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import sqlite3
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeGuard, TypeVar
from urllib.parse import quote

from edgesched.core.model import Decision
from edgesched.core.task import Assignment, TaskRecord, TaskSpec, TaskState
from edgesched.sync import epochs
from edgesched.sync.dbthread import DatabaseThread

log = logging.getLogger("edgesched.sync.store")

_T = TypeVar("_T")

#: How long a statement waits for another process's lock before failing (milliseconds).
BUSY_TIMEOUT_MS = 10_000
#: A write that holds the store longer than this is logged (what, how long, how long it
#: waited): every other writer of the process waits behind it (a submission at central
#: waits for the fleet journal's write).
SLOW_HOLD_S = 0.5
#: The WAL file is truncated back to at most this size after a checkpoint (bytes).
JOURNAL_SIZE_LIMIT = 16 * 1024 * 1024
#: Rows :meth:`Store.prune_history` moves per call and table, at most (one short transaction).
PRUNE_BATCH = 500

#: Ordered schema migrations: ``MIGRATIONS[v]`` takes a database from version ``v`` to ``v + 1``.
#: Never edit a released step; append a new one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: metadata, tasks, decisions, raw telemetry samples
    (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            submitted_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            decided_by TEXT NOT NULL DEFAULT '',
            node_id TEXT,
            pid INTEGER,
            pid_started_at REAL,
            cores TEXT NOT NULL DEFAULT '[]',
            restarts INTEGER NOT NULL DEFAULT 0,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX tasks_by_submitted ON tasks (submitted_at, id)",
        "CREATE INDEX tasks_by_state ON tasks (state, submitted_at, id)",
        """CREATE TABLE decisions (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            node_id TEXT NOT NULL,
            task_id TEXT,
            source TEXT NOT NULL,
            body TEXT NOT NULL
        )""",
        "CREATE INDEX decisions_by_task ON decisions (task_id, seq)",
        "CREATE TABLE samples (id INTEGER PRIMARY KEY, at REAL NOT NULL, payload TEXT NOT NULL)",
        "CREATE INDEX samples_by_at ON samples (at)",
    ),
    # 2: telemetry rollups, CRDT update log and snapshots
    (
        """CREATE TABLE sample_rollups (
            bucket REAL NOT NULL,
            width REAL NOT NULL,
            n INTEGER NOT NULL,
            last_at REAL NOT NULL,
            payload TEXT NOT NULL,
            stats TEXT NOT NULL,
            PRIMARY KEY (bucket, width)
        )""",
        """CREATE TABLE doc_updates (
            doc TEXT NOT NULL,
            seq INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (doc, seq)
        )""",
        """CREATE TABLE doc_snapshots (
            doc TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            data BLOB NOT NULL
        )""",
    ),
    # 3: document epochs (sync/doc.py): the snapshot's epoch; the log after it shares it
    ("ALTER TABLE doc_snapshots ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0",),
    # 4: central's placement of a task (core/task.py Assignment as JSON; '' for local tasks)
    ("ALTER TABLE tasks ADD COLUMN assignment TEXT NOT NULL DEFAULT ''",),
    # 5: bounded history. Finished tasks and old decisions leave the hot tables after the
    # retention (Store.prune_history) and are counted per UTC day in the history tables; the
    # per-state task counts are kept by triggers, so nothing periodic has to scan the tasks.
    (
        "CREATE INDEX tasks_by_state_updated ON tasks (state, updated_at)",
        "CREATE INDEX decisions_by_at ON decisions (at)",
        """CREATE TABLE task_history (
            day TEXT NOT NULL,
            state TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (day, state)
        )""",
        """CREATE TABLE decision_history (
            day TEXT NOT NULL,
            kind TEXT NOT NULL,
            source TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (day, kind, source)
        )""",
        "CREATE TABLE task_state_counts (state TEXT PRIMARY KEY, n INTEGER NOT NULL)",
        "INSERT INTO task_state_counts (state, n) SELECT state, count(*) FROM tasks GROUP BY state",
        """CREATE TRIGGER tasks_count_insert AFTER INSERT ON tasks BEGIN
            INSERT INTO task_state_counts (state, n) VALUES (NEW.state, 1)
            ON CONFLICT (state) DO UPDATE SET n = n + 1;
        END""",
        """CREATE TRIGGER tasks_count_update AFTER UPDATE OF state ON tasks
        WHEN OLD.state IS NOT NEW.state BEGIN
            UPDATE task_state_counts SET n = n - 1 WHERE state = OLD.state;
            INSERT INTO task_state_counts (state, n) VALUES (NEW.state, 1)
            ON CONFLICT (state) DO UPDATE SET n = n + 1;
        END""",
        """CREATE TRIGGER tasks_count_delete AFTER DELETE ON tasks BEGIN
            UPDATE task_state_counts SET n = n - 1 WHERE state = OLD.state;
        END""",
    ),
    # 6: central's history of finished tasks (issue 14): one row per task once its
    # lifecycle is final (core/lifecycle.py), kept past the documents' retention
    (
        """CREATE TABLE finished_tasks (
            id TEXT PRIMARY KEY,
            phase TEXT NOT NULL,
            node TEXT NOT NULL,
            origin TEXT NOT NULL,
            workload TEXT NOT NULL,
            finished_at REAL NOT NULL,
            body TEXT NOT NULL
        )""",
        "CREATE INDEX finished_by_at ON finished_tasks (finished_at, id)",
        "CREATE INDEX finished_by_node ON finished_tasks (node, finished_at)",
    ),
)
#: The schema version this code writes.
SCHEMA_VERSION = len(MIGRATIONS)

_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
_SQLITE_NOTADB = 26
_SIDE_FILES = ("-wal", "-shm", "-journal")
_MAX_ROWID = 2**63 - 1
_MIN_ROWID = -(2**63)


class StoreError(Exception):
    """The store cannot do what was asked; the message is one line, fit for a user."""


class StoreFullError(StoreError):
    """The disk or the database is full (SQLITE_FULL); the failed write was rolled back."""


@dataclass(frozen=True)
class Recovery:
    """What :meth:`Store.open` did with a corrupt file: where it went, rows saved per table."""

    moved_to: Path
    salvaged: dict[str, int]
    reason: str = ""


class _CorruptError(Exception):
    """Internal: the file is corrupt or not a database (triggers recovery)."""


class Store:
    """The edge node's durable SQLite store. Create it with :meth:`Store.open`."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        schema_version: int,
        recovery: Recovery | None,
        *,
        executor: DatabaseThread | None = None,
    ) -> None:
        self._conn: sqlite3.Connection | None = conn
        #: The database thread: the only thread that uses ``conn`` (:meth:`open` made it there).
        self._executor = executor if executor is not None else _database_thread()
        #: Held by a :meth:`transaction` block (and :meth:`close`): one at a time. A call
        #: outside a block does not take it: it waits only while a block is open.
        self._lock = asyncio.Lock()
        #: Set while no block is open (what a call outside a block waits for).
        self._no_block = asyncio.Event()
        self._no_block.set()
        #: The asyncio task inside :meth:`transaction` (its store calls join that transaction).
        self._tx_owner: asyncio.Task[Any] | None = None
        #: Why the open transaction can no longer commit (a write inside it failed).
        self._tx_failed: StoreError | None = None
        #: The open transaction block's state in the database thread (whether it has begun).
        self._tx_block = _Block()
        self.path = path
        self.schema_version = schema_version
        self.recovery = recovery
        #: Jobs handed to the database thread so far, each one hand-back to the event loop: a
        #: call is one, and a :meth:`transaction` block with calls in it one more (its end).
        self.jobs = 0

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def open(cls, path: Path, *, max_page_count: int | None = None) -> Store:
        """Open (creating, migrating or recovering as needed) the store at ``path``.

        ``max_page_count`` caps the database size in pages (SQLite reports SQLITE_FULL past it).
        Raises :class:`StoreError` when the path cannot be opened or the schema is newer. The
        work (checks, migration, a recovery's salvage) is one job in the store's new database
        thread, off the event loop.
        """
        path = Path(path)
        if max_page_count is not None and max_page_count < 1:
            raise ValueError("max_page_count must be >= 1")
        executor = _database_thread()

        def discard(opened: tuple[sqlite3.Connection, int, Recovery | None]) -> None:
            executor.submit(opened[0].close)  # opened, but the caller was cancelled

        try:
            conn, version, recovery = await _in_thread(
                executor, functools.partial(_open, path, max_page_count), discard=discard
            )
        except BaseException:
            executor.shutdown(wait=False)  # (after the discarded connection's close, if any)
            raise
        return cls(conn, path, version, recovery, executor=executor)

    async def close(self) -> None:
        """Close the store (idempotent); later calls raise :class:`StoreError`."""
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            try:
                self.jobs += 1
                await _in_thread(self._executor, functools.partial(_close, conn), droppable=False)
            except sqlite3.Error as exc:
                raise StoreError(f"closing store {self.path}: {exc}") from exc
            finally:
                self._executor.shutdown(wait=False)  # its thread ends once the close has run

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def trace(self, callback: Callable[[str], object] | None) -> None:
        """From now on, call ``callback`` with the text of each SQL statement the store runs
        (None: stop). It runs in the database thread, inside the statement: keep it short and
        thread-safe (appending to a list is). For tests and benchmarks, e.g. to count the
        ``COMMIT``s of a code path; one job, which does not wait for the store's lock."""
        await self._job(lambda conn: conn.set_trace_callback(callback))

    # ------------------------------------------------------------------ tasks

    async def put_task(self, record: TaskRecord) -> None:
        """Insert or replace one task record; committed when this returns."""
        await self.put_tasks([record])

    async def put_tasks(self, records: Sequence[TaskRecord]) -> None:
        """Insert or replace task records in one transaction (all or none)."""
        if not records:
            return
        rows = [_task_row(r) for r in records]
        what = f"cannot store task {records[0].spec.id}" + (
            f" and {len(records) - 1} more" if len(records) > 1 else ""
        )

        def body(conn: sqlite3.Connection) -> None:
            conn.executemany(_UPSERT_TASK, rows)

        await self._write(what, body)

    async def get_task(self, task_id: str) -> TaskRecord | None:
        """The record of ``task_id``, or None."""

        def body(conn: sqlite3.Connection) -> TaskRecord | None:
            rows = conn.execute(
                f"SELECT {_TASK_COLS} FROM tasks WHERE id = ?", (task_id,)
            ).fetchall()
            if not rows:
                return None
            try:
                return _task_from_row(tuple(rows[0]))
            except Exception as exc:
                raise StoreError(f"task {task_id} in the store is unreadable: {exc}") from exc

        return await self._read(f"cannot read task {task_id}", body)

    async def list_tasks(
        self,
        states: Collection[TaskState] | None = None,
        *,
        updated_since: float | None = None,
    ) -> list[TaskRecord]:
        """Task records (all, or those in ``states``, and with ``updated_since``, only those
        updated at or after it) ordered by ``submitted_at``, then id. By state, the query reads
        only those states' rows (an index on state): ask for the active states in anything that
        runs often, never for all.

        A row that no longer decodes is logged and skipped, so one bad row never hides the rest.
        """
        sql = f"SELECT {_TASK_COLS} FROM tasks"
        params: list[object] = []
        where: list[str] = []
        if states is not None:
            wanted = sorted({TaskState(s).value for s in states})
            if not wanted:
                return []
            where.append(f"state IN ({', '.join('?' * len(wanted))})")
            params.extend(wanted)
        if updated_since is not None:
            where.append("updated_at >= ?")
            params.append(updated_since)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY submitted_at, id"

        def body(conn: sqlite3.Connection) -> list[TaskRecord]:
            out: list[TaskRecord] = []
            for row in conn.execute(sql, params).fetchall():
                try:
                    out.append(_task_from_row(tuple(row)))
                except Exception as exc:
                    log.error("skipping unreadable task row %r: %s", row[0], exc)
            return out

        return await self._read("cannot list tasks", body)

    # ------------------------------------------------------------------ decisions

    async def append_decisions(self, decisions: Sequence[Decision], source: str) -> None:
        """Append decisions (one transaction) taken by ``source``, e.g. ``"edge-autonomous"``."""
        if not decisions:
            return
        rows = [
            (d.at, d.kind.value, d.node_id, d.task_id, source, _dumps(d.to_dict()))
            for d in decisions
        ]

        def body(conn: sqlite3.Connection) -> None:
            _insert_rows(
                conn, "INSERT INTO decisions (at, kind, node_id, task_id, source, body)", rows
            )

        await self._write(f"cannot store {len(rows)} decision(s)", body)

    async def recent_decisions(
        self, limit: int = 100, task_id: str | None = None
    ) -> list[dict[str, object]]:
        """The newest ``limit`` decisions (of ``task_id`` if given), newest first.

        Each is :meth:`Decision.to_dict` plus ``"seq"`` (the store's insertion order) and
        ``"source"``.
        """
        if limit <= 0:
            return []
        sql = "SELECT seq, source, body FROM decisions"
        params: tuple[object, ...] = (limit,)
        if task_id is not None:
            sql += " WHERE task_id = ?"
            params = (task_id, limit)
        sql += " ORDER BY seq DESC LIMIT ?"

        def body(conn: sqlite3.Connection) -> list[dict[str, object]]:
            out: list[dict[str, object]] = []
            for seq, src, text in conn.execute(sql, params).fetchall():
                item: dict[str, object] = json.loads(text)
                item["seq"] = seq
                item["source"] = src
                out.append(item)
            return out

        return await self._read("cannot read decisions", body)

    # ------------------------------------------------------------------ history

    async def record_finished(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Central's history: each row (a task view with ``id``, ``phase``, ``node``,
        ``origin``, ``workload`` and ``finished_at``) stored, replacing the task's earlier
        row (a task that ran again finishes again). One transaction per
        :data:`FINISHED_ROWS_PER_JOB` rows (each row stands alone), each encoded here just
        before its write: thousands encoded at once held central's loop ~60 ms, thousands in
        one job held the store 0.7 s (each submission's journal write waiting behind it:
        :mod:`edgesched.sync.dbthread` never interrupts a job), and encoded in the database
        thread they held it as long, its Python taking turns with the loop's for the GIL."""

        def body(data: list[tuple[Any, ...]], conn: sqlite3.Connection) -> None:
            _insert_rows(
                conn,
                "INSERT OR REPLACE INTO finished_tasks "
                "(id, phase, node, origin, workload, finished_at, body)",
                data,
            )

        for start in range(0, len(rows), FINISHED_ROWS_PER_JOB):
            data: list[tuple[Any, ...]] = [
                (
                    str(r["id"]),
                    str(r["phase"]),
                    str(r.get("node") or ""),
                    str(r["origin"]),
                    str(r.get("workload") or "default"),
                    float(r["finished_at"]),
                    json.dumps(r, sort_keys=True, separators=(",", ":"), allow_nan=False),
                )
                for r in rows[start : start + FINISHED_ROWS_PER_JOB]
            ]
            await self._write("cannot record finished tasks", functools.partial(body, data))

    async def finished_marks(self, ids: Sequence[str]) -> dict[str, tuple[str, float]]:
        """Of ``ids``, those central's history holds: each one's phase and when it finished
        (what tells a row already recorded as it is from one to write again). One statement
        and one job of the database thread per 500 ids (thousands in one job held the store
        110 ms while central's loop was busy, a submission's journal write waiting)."""

        def body(chunk: list[str], conn: sqlite3.Connection) -> dict[str, tuple[str, float]]:
            marks = ", ".join("?" * len(chunk))
            query = f"SELECT id, phase, finished_at FROM finished_tasks WHERE id IN ({marks})"
            return {
                str(task_id): (str(phase), float(at))
                for task_id, phase, at in conn.execute(query, chunk).fetchall()
            }

        out: dict[str, tuple[str, float]] = {}
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = list(ids[start : start + _IN_CHUNK])
            out.update(
                await self._read("cannot read central's history", functools.partial(body, chunk))
            )
        return out

    async def finished_tasks(
        self,
        *,
        phase: str | None = None,
        node: str | None = None,
        origin: str | None = None,
        workload: str | None = None,
        since: float | None = None,
        until: float | None = None,
        before: tuple[float, str] | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Finished tasks, newest first (by ``finished_at``, then id), filtered; ``before``:
        the ``(finished_at, id)`` of the last row of the page before."""
        where: list[str] = []
        params: list[object] = []
        for column, value in (("phase", phase), ("node", node), ("origin", origin),
                              ("workload", workload)):  # fmt: skip
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if since is not None:
            where.append("finished_at >= ?")
            params.append(since)
        if until is not None:
            where.append("finished_at < ?")
            params.append(until)
        if before is not None:
            where.append("(finished_at < ? OR (finished_at = ? AND id > ?))")
            params += [before[0], before[0], before[1]]
        sql = "SELECT body FROM finished_tasks"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY finished_at DESC, id LIMIT ?"
        params.append(limit)

        def body(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return [json.loads(text) for (text,) in conn.execute(sql, params).fetchall()]

        return await self._read("cannot read finished tasks", body)

    async def task_counts(self) -> dict[TaskState, int]:
        """Tasks in the hot table per state (kept by triggers: no scan of the tasks)."""

        def body(conn: sqlite3.Connection) -> dict[TaskState, int]:
            out: dict[TaskState, int] = {}
            for state, n in conn.execute(
                "SELECT state, n FROM task_state_counts WHERE n > 0"
            ).fetchall():
                with contextlib.suppress(ValueError):  # a state of a newer release: skipped
                    out[TaskState(state)] = int(n)
            return out

        return await self._read("cannot count tasks", body)

    async def prune_history(
        self, before: float, *, batch: int = PRUNE_BATCH, keep: Collection[str] = ()
    ) -> tuple[int, int]:
        """Move at most ``batch`` finished tasks and ``batch`` decisions last updated (taken)
        before ``before`` out of the hot tables, counting them per UTC day and state (kind and
        source) in the history tables (:meth:`history`); one transaction. Tasks in ``keep``
        stay (e.g. those central still assigns: a pruned one would be taken anew). Only the
        terminal states are ever pruned, never an active task. Returns ``(tasks, decisions)``
        removed: call again while either equals ``batch`` to catch up."""
        if batch < 1:
            raise ValueError("batch must be >= 1")
        terminal = [s.value for s in TaskState if s.terminal]
        kept = _dumps(sorted(set(keep)))

        def body(conn: sqlite3.Connection) -> tuple[int, int]:
            tasks: list[tuple[int, str, float]] = []
            for state in terminal:  # one index range per state: bounded by the batch
                if len(tasks) >= batch:
                    break
                rows = conn.execute(
                    "SELECT rowid, state, updated_at FROM tasks INDEXED BY tasks_by_state_updated "
                    "WHERE state = ? AND updated_at < ? "
                    "AND id NOT IN (SELECT value FROM json_each(?)) "
                    "ORDER BY updated_at LIMIT ?",
                    (state, before, kept, batch - len(tasks)),
                ).fetchall()
                tasks.extend((int(r[0]), str(r[1]), float(r[2])) for r in rows)
            per_day: dict[tuple[str, str], int] = {}
            for _, state, at in tasks:
                key = (_day(at), state)
                per_day[key] = per_day.get(key, 0) + 1
            conn.executemany(
                "INSERT INTO task_history (day, state, n) VALUES (?, ?, ?) "
                "ON CONFLICT (day, state) DO UPDATE SET n = n + excluded.n",
                [(day, state, n) for (day, state), n in per_day.items()],
            )
            conn.executemany("DELETE FROM tasks WHERE rowid = ?", [(r,) for r, _, _ in tasks])
            decisions = conn.execute(
                "SELECT seq, at, kind, source FROM decisions INDEXED BY decisions_by_at "
                "WHERE at < ? ORDER BY at LIMIT ?",
                (before, batch),
            ).fetchall()
            per_kind: dict[tuple[str, str, str], int] = {}
            for _, at, kind, source in decisions:
                dkey = (_day(float(at)), str(kind), str(source))
                per_kind[dkey] = per_kind.get(dkey, 0) + 1
            conn.executemany(
                "INSERT INTO decision_history (day, kind, source, n) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (day, kind, source) DO UPDATE SET n = n + excluded.n",
                [(day, kind, source, n) for (day, kind, source), n in per_kind.items()],
            )
            conn.executemany("DELETE FROM decisions WHERE seq = ?", [(d[0],) for d in decisions])
            return len(tasks), len(decisions)

        return await self._write("cannot prune the history", body)

    async def history(self) -> dict[str, Any]:
        """What left the hot tables, per UTC day: ``{"tasks": {day: {state: n}}, "decisions":
        {day: {kind: n}}}``, plus ``"totals"``: every task the store has known per state, the
        hot table's counts and the pruned ones together."""

        def body(conn: sqlite3.Connection) -> dict[str, Any]:
            tasks: dict[str, dict[str, int]] = {}
            totals: dict[str, int] = {}
            for day, state, n in conn.execute(
                "SELECT day, state, n FROM task_history ORDER BY day, state"
            ).fetchall():
                tasks.setdefault(str(day), {})[str(state)] = int(n)
                totals[str(state)] = totals.get(str(state), 0) + int(n)
            for state, n in conn.execute(
                "SELECT state, n FROM task_state_counts WHERE n > 0"
            ).fetchall():
                totals[str(state)] = totals.get(str(state), 0) + int(n)
            decisions: dict[str, dict[str, int]] = {}
            for day, kind, n in conn.execute(
                "SELECT day, kind, sum(n) FROM decision_history GROUP BY day, kind "
                "ORDER BY day, kind"
            ).fetchall():
                decisions.setdefault(str(day), {})[str(kind)] = int(n)
            return {"tasks": tasks, "decisions": decisions, "totals": totals}

        return await self._read("cannot read the history", body)

    # ------------------------------------------------------------------ telemetry

    async def add_sample(self, at: float, payload: Mapping[str, object]) -> None:
        """Store one telemetry sample taken at ``at`` (a JSON-serializable mapping)."""
        if not math.isfinite(at):
            raise ValueError(f"sample time must be a finite number, got {at!r}")
        text = _dumps(dict(payload))

        def body(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO samples (at, payload) VALUES (?, ?)", (at, text))

        await self._write("cannot store sample", body)

    async def samples(
        self, since: float, until: float | None = None
    ) -> list[tuple[float, dict[str, object]]]:
        """Raw samples with ``since <= at < until`` (no upper bound if None), oldest first."""
        sql = "SELECT at, payload FROM samples WHERE at >= ?"
        params: tuple[float, ...] = (since,)
        if until is not None:
            sql += " AND at < ?"
            params = (since, until)
        sql += " ORDER BY at, id"

        def body(conn: sqlite3.Connection) -> list[tuple[float, dict[str, object]]]:
            return [(at, json.loads(p)) for at, p in conn.execute(sql, params).fetchall()]

        return await self._read("cannot read samples", body)

    async def rollups(
        self, since: float, until: float | None = None
    ) -> list[tuple[float, dict[str, object]]]:
        """Rollups ``(bucket start, averaged payload)`` with ``since <= bucket < until``."""
        sql = "SELECT bucket, payload FROM sample_rollups WHERE bucket >= ?"
        params: tuple[float, ...] = (since,)
        if until is not None:
            sql += " AND bucket < ?"
            params = (since, until)
        sql += " ORDER BY bucket, width"

        def body(conn: sqlite3.Connection) -> list[tuple[float, dict[str, object]]]:
            return [(b, json.loads(p)) for b, p in conn.execute(sql, params).fetchall()]

        return await self._read("cannot read sample rollups", body)

    async def downsample(
        self,
        now: float,
        raw_retention_s: float = 3600,
        rollup_s: float = 300,
        rollup_retention_s: float = 30 * 86400,
    ) -> int:
        """Roll raw samples older than ``raw_retention_s`` into ``rollup_s`` buckets; expire.

        Numeric fields are averaged over a bucket, other fields keep their latest value; a
        bucket rolled up twice (samples arriving late) is merged exactly. Rollups whose bucket
        starts more than ``rollup_retention_s`` before ``now`` are deleted. One transaction.
        Returns the number of rows removed (raw samples plus expired rollups).
        """
        if not (math.isfinite(now) and rollup_s > 0 and math.isfinite(rollup_s)):
            raise ValueError("downsample: now must be finite and rollup_s a finite number > 0")
        if raw_retention_s < 0 or rollup_retention_s < 0:
            raise ValueError("downsample: retention periods must be >= 0")
        raw_cutoff = now - raw_retention_s
        rollup_cutoff = now - rollup_retention_s

        def body(conn: sqlite3.Connection) -> int:
            buckets: dict[float, _Bucket] = {}
            cursor = conn.execute(
                "SELECT at, payload FROM samples WHERE at < ? ORDER BY at, id", (raw_cutoff,)
            )
            for at, text in cursor:  # streamed: the whole scan is not held in memory
                start = math.floor(at / rollup_s) * rollup_s
                if start < rollup_cutoff:
                    continue  # would expire at once
                payload = json.loads(text)
                if isinstance(payload, dict):
                    buckets.setdefault(start, _Bucket()).add(at, payload)
            for start, bucket in buckets.items():
                rows = conn.execute(
                    "SELECT n, last_at, payload, stats FROM sample_rollups "
                    "WHERE bucket = ? AND width = ?",
                    (start, rollup_s),
                ).fetchall()
                if rows:
                    n, last_at, payload, stats = rows[0]
                    bucket.merge_stored(n, last_at, json.loads(payload), json.loads(stats))
                conn.execute(
                    "INSERT OR REPLACE INTO sample_rollups "
                    "(bucket, width, n, last_at, payload, stats) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        start,
                        rollup_s,
                        bucket.n,
                        bucket.last_at,
                        _dumps(bucket.payload()),
                        _dumps({"sums": bucket.sums, "counts": bucket.counts}),
                    ),
                )
            raw = conn.execute("DELETE FROM samples WHERE at < ?", (raw_cutoff,))
            old = conn.execute("DELETE FROM sample_rollups WHERE bucket < ?", (rollup_cutoff,))
            return max(raw.rowcount, 0) + max(old.rowcount, 0)

        return await self._write("cannot downsample samples", body)

    # ------------------------------------------------------------------ CRDT update log

    async def append_update(self, doc: str, update: bytes) -> int:
        """Append one CRDT update to ``doc``'s log; returns its sequence number (1, 2, ...)."""
        data = bytes(update)

        def body(conn: sqlite3.Connection) -> int:
            # one statement: the next seq is found and taken at once
            rows = conn.execute(_APPEND_UPDATE, (doc, data)).fetchall()
            return int(next(iter(rows))[0])

        return await self._write(f"cannot append an update to document {doc}", body, urgent=True)

    async def append_updates(
        self, runs: Mapping[str, Sequence[bytes]], *, epochs: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """Append each document's updates to its log, in order, all in one job of the
        database thread (one transaction, or the caller's open one); returns each document's
        last seq. A journal's queue of many updates, or a batch of many documents' journals,
        used to cost a job (a turn of the thread and of a busy event loop) per update, the
        store's lock held throughout, and a submission's write waited behind them. The
        statements are a few per 500 documents and per 500 updates (:func:`_insert_rows`),
        not one per update; the job is urgent (:mod:`edgesched.sync.dbthread`).

        ``epochs``: the epoch each document's updates belong to; a document the store holds
        at another epoch is left as it is and out of the answer (its updates would continue
        no state of it)."""
        rows = [(doc, [bytes(u) for u in updates]) for doc, updates in runs.items() if updates]

        def body(conn: sqlite3.Connection) -> dict[str, int]:
            kept = rows
            if epochs is not None:
                held = _snapshot_epochs(conn, [doc for doc, _ in rows])
                kept = [(d, u) for d, u in rows if held.get(d, 0) == epochs.get(d, 0)]
            last = _last_seqs(conn, [doc for doc, _ in kept])
            values: list[tuple[str, int, bytes]] = []
            for doc, datas in kept:
                seq = last[doc]
                for data in datas:
                    seq += 1
                    values.append((doc, seq, data))
                last[doc] = seq
            _insert_rows(conn, "INSERT INTO doc_updates (doc, seq, data)", values)
            return last

        if not rows:
            return {}
        what = f"cannot append updates to {len(rows)} document(s)"
        return await self._write(what, body, urgent=True)

    async def updates(self, doc: str, after_seq: int = 0) -> list[tuple[int, bytes]]:
        """``doc``'s logged updates with ``seq > after_seq``, in order.

        Updates folded into the snapshot (see :meth:`compact`) are no longer listed: load the
        snapshot first, then the updates after its seq.
        """

        def body(conn: sqlite3.Connection) -> list[tuple[int, bytes]]:
            rows = conn.execute(
                "SELECT seq, data FROM doc_updates WHERE doc = ? AND seq > ? ORDER BY seq",
                (doc, after_seq),
            ).fetchall()
            return [(seq, bytes(data)) for seq, data in rows]

        return await self._read(f"cannot read updates of document {doc}", body)

    async def compact(self, doc: str, snapshot: bytes, upto_seq: int) -> None:
        """Replace ``doc``'s updates with ``seq <= upto_seq`` by ``snapshot``, atomically.

        ``upto_seq`` must not exceed the last appended seq nor go back before the current
        snapshot; later updates stay in the log and seqs keep counting from where they were.
        """
        data = bytes(snapshot)

        def body(conn: sqlite3.Connection) -> None:
            last = _last_seq(conn, doc)
            if upto_seq > last:
                raise StoreError(
                    f"cannot compact document {doc} up to seq {upto_seq}: "
                    f"its last update is seq {last}"
                )
            current = _snapshot_seq(conn, doc)
            if current is not None and upto_seq < current:
                raise StoreError(
                    f"cannot compact document {doc} up to seq {upto_seq}: "
                    f"its snapshot already covers seq {current}"
                )
            conn.execute(
                "INSERT INTO doc_snapshots (doc, seq, data) VALUES (?, ?, ?) "
                "ON CONFLICT (doc) DO UPDATE SET seq = excluded.seq, data = excluded.data",
                (doc, upto_seq, data),
            )  # the epoch stays
            conn.execute("DELETE FROM doc_updates WHERE doc = ? AND seq <= ?", (doc, upto_seq))

        await self._write(f"cannot compact document {doc}", body)

    async def rotate_doc(self, doc: str, snapshot: bytes, epoch: int) -> int:
        """Start ``doc``'s ``epoch``: ``snapshot`` replaces the snapshot and the whole log.

        One transaction: a crash leaves the old epoch (snapshot and log) or the new one. The
        snapshot's seq is the last seq so far, so seqs keep counting. ``epoch`` must be newer
        than the stored one. Returns the snapshot's seq.
        """
        data = bytes(snapshot)

        def body(conn: sqlite3.Connection) -> int:
            current = _snapshot_epoch(conn, doc)
            if current is not None and not epochs.newer(epoch, current):
                raise StoreError(
                    f"cannot rotate document {doc} to epoch {epoch}: it is at epoch {current}"
                )
            last = _last_seq(conn, doc)
            conn.execute(
                "INSERT OR REPLACE INTO doc_snapshots (doc, seq, data, epoch) VALUES (?, ?, ?, ?)",
                (doc, last, data, epoch),
            )
            conn.execute("DELETE FROM doc_updates WHERE doc = ?", (doc,))
            return last

        return await self._write(f"cannot rotate document {doc}", body)

    async def replace_docs(self, docs: Sequence[tuple[str, bytes, int]]) -> list[str]:
        """Store each ``(doc, snapshot, epoch)`` as that document's whole state, all in one
        transaction (one commit, one fsync, however many documents); returns the names left
        as they were because the store holds a newer epoch of them.

        Each snapshot replaces the document's snapshot and its whole log (its seq is the last
        seq so far, so seqs keep counting), at ``epoch`` (the same or newer than the stored
        one). For documents with no writer of their own in this store (central's replicas of
        the nodes' documents, written only as snapshots): an update another task logged after
        the snapshot was taken would be dropped with the log.
        """
        rows = [(name, bytes(snapshot), int(epoch)) for name, snapshot, epoch in docs]

        def body(conn: sqlite3.Connection) -> list[str]:
            # A few statements per 500 documents, not two per document: each statement is
            # a wait for the GIL while central's loop computes (:func:`_insert_rows`).
            names = list(dict.fromkeys(name for name, _, _ in rows))
            stored: dict[str, int] = {}
            for start in range(0, len(names), _IN_CHUNK):
                chunk = names[start : start + _IN_CHUNK]
                marks = ", ".join("?" * len(chunk))
                query = f"SELECT doc, epoch FROM doc_snapshots WHERE doc IN ({marks})"
                found = conn.execute(query, chunk).fetchall()
                stored.update((str(doc), int(epoch)) for doc, epoch in found)
            refused = [
                name
                for name, _, epoch in rows
                if name in stored and epochs.newer(stored[name], epoch)
            ]
            kept = [
                row
                for row in rows
                if not (row[0] in stored and epochs.newer(stored[row[0]], row[2]))
            ]
            kept_names = list(dict.fromkeys(name for name, _, _ in kept))
            last = _last_seqs(conn, kept_names)
            _insert_rows(
                conn,
                "INSERT OR REPLACE INTO doc_snapshots (doc, seq, data, epoch)",
                [(name, last[name], data, epoch) for name, data, epoch in kept],
            )
            for start in range(0, len(kept_names), _IN_CHUNK):
                chunk = kept_names[start : start + _IN_CHUNK]
                marks = ", ".join("?" * len(chunk))
                conn.execute(f"DELETE FROM doc_updates WHERE doc IN ({marks})", chunk)
            return refused

        if not rows:
            return []
        return await self._write(f"cannot store {len(rows)} document snapshot(s)", body)

    async def snapshot(self, doc: str) -> tuple[int, bytes] | None:
        """``(upto_seq, snapshot)`` of ``doc``'s last compaction, or None."""

        def body(conn: sqlite3.Connection) -> tuple[int, bytes] | None:
            rows = conn.execute(
                "SELECT seq, data FROM doc_snapshots WHERE doc = ?", (doc,)
            ).fetchall()
            return (rows[0][0], bytes(rows[0][1])) if rows else None

        return await self._read(f"cannot read the snapshot of document {doc}", body)

    async def doc_names(self) -> list[str]:
        """Every document with a snapshot or a logged update, sorted."""

        def body(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT doc FROM doc_snapshots UNION SELECT doc FROM doc_updates ORDER BY 1"
            ).fetchall()
            return [str(r[0]) for r in rows]

        return await self._read("cannot list the stored documents", body)

    async def snapshot_with_epoch(self, doc: str) -> tuple[int, bytes, int] | None:
        """``(upto_seq, snapshot, epoch)`` of ``doc``'s snapshot, or None (epoch 0 then)."""

        def body(conn: sqlite3.Connection) -> tuple[int, bytes, int] | None:
            rows = conn.execute(
                "SELECT seq, data, epoch FROM doc_snapshots WHERE doc = ?", (doc,)
            ).fetchall()
            return (int(rows[0][0]), bytes(rows[0][1]), int(rows[0][2])) if rows else None

        return await self._read(f"cannot read the snapshot of document {doc}", body)

    # ------------------------------------------------------------------ metadata

    async def get_meta(self, key: str) -> str | None:
        def body(conn: sqlite3.Connection) -> str | None:
            rows = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchall()
            return str(rows[0][0]) if rows else None

        return await self._read(f"cannot read metadata {key}", body)

    async def set_meta(self, key: str, value: str) -> None:
        def body(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

        await self._write(f"cannot store metadata {key}", body)

    # ------------------------------------------------------------------ plumbing

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"store {self.path} is closed")
        return self._conn

    async def _job(
        self,
        fn: Callable[[sqlite3.Connection], _T],
        *,
        droppable: bool = True,
        urgent: bool = False,
    ) -> _T:
        """``fn(conn)``, run in the database thread: one job, one hand-back to the loop. A
        cancelled caller still waits for a job that has started, and for one that has not
        unless ``droppable`` (see :func:`_in_thread`). ``urgent``: in the thread's urgent
        lane, ahead of the normal jobs not yet started (a whole transaction only, never a
        job of a block: see :mod:`edgesched.sync.dbthread`)."""
        conn = self._connection()
        self.jobs += 1
        return await _in_thread(
            self._executor, functools.partial(fn, conn), droppable=droppable, urgent=urgent
        )

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """One ``BEGIN IMMEDIATE`` transaction for every store call made inside the block.

        The calls the opening asyncio task makes inside it (writes and reads) join it instead
        of committing on their own; the block's end commits them all, once (one fsync), and an
        exception out of the block rolls them all back. Other tasks' calls wait until it ends.
        A write that fails inside the block (e.g. :class:`StoreFullError`) raises as usual and
        dooms the transaction: the block's end then rolls back and raises that error again,
        even if the block caught it. Nested blocks of the same task join the outer one. Keep
        the block short: no process spawns or sleeps inside it.

        Each call inside the block is one job in the database thread, the first one with the
        ``BEGIN IMMEDIATE`` in front of it, and the block's end (``COMMIT``, or ``ROLLBACK``)
        is one more, each a hand-back to the event loop: the block's own code runs on the loop
        in between, the store held (its lock is taken on entering the block, so nothing of
        this process writes between the entry and the ``BEGIN``). A block without calls costs
        no job. A block cancelled during its ``COMMIT`` raises
        :class:`asyncio.CancelledError` once the COMMIT has ended: it may have committed.
        """
        task = asyncio.current_task()
        if task is not None and self._tx_owner is task:
            yield  # nested: the outer block commits
            return
        async with self._holding(f"a transaction of task {_task_name(task)}"):
            block = _Block()
            try:
                self._tx_owner, self._tx_failed, self._tx_block = task, None, block
                self._no_block.clear()
                try:
                    yield
                finally:
                    failed, self._tx_failed = self._tx_failed, None
                if failed is not None:
                    raise failed
                if block.begun:
                    await self._job(_commit)
            except BaseException as exc:
                if block.begun:  # (up to date: a job has always ended when its caller goes on)
                    await self._job(_rollback, droppable=False)
                if isinstance(exc, sqlite3.Error):
                    raise _error("cannot commit", exc) from exc
                raise
            finally:
                # Only now may calls outside the block queue their jobs: once its COMMIT or
                # ROLLBACK has run. A journal's write, queued in the thread's urgent lane,
                # would otherwise run ahead of the queued COMMIT and begin by rolling the
                # block's open transaction back (the lanes test caught it on a loaded CI).
                self._tx_owner = None
                self._no_block.set()

    @contextlib.asynccontextmanager
    async def _holding(self, what: str) -> AsyncIterator[None]:
        """The store's lock, for a transaction block; a hold past :data:`SLOW_HOLD_S` is
        logged, with how long it waited. Raises :class:`StoreError` if the store is closed."""
        asked = time.monotonic()
        async with self._lock:
            with self._held(what, asked):
                yield

    @contextlib.asynccontextmanager
    async def _outside_blocks(self, what: str) -> AsyncIterator[None]:
        """For a call outside any block: wait while another task's block is open (its jobs
        must not interleave with the block's), then go on without awaiting: the caller's job
        enters the database thread's queue in this same turn of the loop, behind the jobs
        already there and ahead of any block opened later. Unlike a lock, nothing waits for
        this call's hand-back (a turn of a busy loop) before the next call's job can run: at
        10,000 nodes a submission's write to the fleet journal waited a turn behind each
        write of the replicas' snapshots, then a turn of its own to take the lock. A wait and
        a job past :data:`SLOW_HOLD_S` are logged. Raises :class:`StoreError` if the store is
        closed."""
        asked = time.monotonic()
        while self._tx_owner is not None:
            await self._no_block.wait()
        with self._held(what, asked):
            yield

    @contextlib.contextmanager
    def _held(self, what: str, asked: float) -> Iterator[None]:
        """The store held from now (it was asked for at ``asked``) until the block's end; a
        hold past :data:`SLOW_HOLD_S` is logged. Raises :class:`StoreError` if it is closed."""
        got = time.monotonic()
        self._connection()
        try:
            yield
        finally:
            held = time.monotonic() - got
            if held > SLOW_HOLD_S:
                log.warning(
                    "SQLite held %.2f s by %s (it waited %.2f s for the store)",
                    held,
                    what.removeprefix("cannot "),
                    got - asked,
                )

    def _joined(self) -> bool:
        """Whether the calling asyncio task is inside its own :meth:`transaction`."""
        return self._tx_owner is not None and self._tx_owner is asyncio.current_task()

    async def _write(
        self, what: str, body: Callable[[sqlite3.Connection], _T], *, urgent: bool = False
    ) -> _T:
        """Run ``body`` (in the database thread) in one ``BEGIN IMMEDIATE`` transaction,
        committed before returning: ``BEGIN``, ``body``, ``COMMIT`` (or ``ROLLBACK``) are one
        job. Inside the caller's open :meth:`transaction`, ``body`` is the job (the block's
        first call begins its transaction; it commits at the block's end).

        A caller cancelled while its job runs gets :class:`asyncio.CancelledError` once the job
        has ended, never before: the write then either committed (as if the process had
        stopped just after its COMMIT) or rolled back, never half; inside a transaction it
        dooms the block. Outside a block it waits only while another task's block is open.
        ``urgent`` (outside a block): its job goes ahead of the normal jobs not yet started.
        """
        if self._joined():
            try:
                return await self._job(functools.partial(_in_block, self._tx_block, what, body))
            except BaseException as exc:
                failure = _failure(what, exc)
                if self._tx_failed is None:  # the transaction cannot commit any more
                    doomed = exc if isinstance(exc, StoreError) else None
                    self._tx_failed = failure or doomed or StoreError(f"{what}: {exc!r}")
                if failure is not None:
                    raise failure from exc
                raise
        async with self._outside_blocks(what):
            try:
                job = functools.partial(_one_transaction, body)
                return await self._job(job, urgent=urgent)
            except BaseException as exc:
                failure = _failure(what, exc)
                if failure is not None:
                    raise failure from exc
                raise

    async def _read(self, what: str, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``body`` in the database thread, one job; inside the caller's open
        :meth:`transaction` it sees that transaction's own writes."""
        if self._joined():
            try:
                return await self._job(functools.partial(_in_block, self._tx_block, what, body))
            except sqlite3.Error as exc:
                raise _error(what, exc) from exc
        async with self._outside_blocks(what):
            try:
                return await self._job(functools.partial(_outside_transaction, body))
            except sqlite3.Error as exc:
                raise _error(what, exc) from exc


# ---------------------------------------------------------------------- the database thread


def _database_thread() -> DatabaseThread:
    """A store's database thread: one worker, which runs every job of the store in turn (a
    journal's write ahead of the jobs waiting in the normal lane)."""
    return DatabaseThread("edgesched-sqlite")


async def _in_thread(
    executor: Executor,
    fn: Callable[[], _T],
    *,
    droppable: bool = True,
    discard: Callable[[_T], object] | None = None,
    urgent: bool = False,
) -> _T:
    """``fn()``, run in ``executor``'s thread, its result (or exception) handed back to the
    event loop once.

    A job cannot be interrupted. If the awaiting task is cancelled before the job starts, the
    job is dropped if ``droppable``; otherwise, and once it has started, this waits for it to
    end (through further cancellations), hands a result to ``discard`` and raises
    :class:`asyncio.CancelledError`: the caller (and the store's lock it holds) never moves on
    while its job still runs. The wait is on a plain future that the job itself completes,
    last thing in the worker, not :func:`asyncio.shield`, whose second future costs another
    turn of a busy loop per job.
    """
    loop = asyncio.get_running_loop()
    waiter: list[asyncio.Future[None]] = [loop.create_future()]
    #: What the job ended with, (True, result) or (False, exception): set in the worker
    #: before its hand-back, so whoever the hand-back wakes finds it there.
    outcome: list[tuple[bool, Any]] = []

    def wake() -> None:  # in the loop
        if not waiter[0].done():
            waiter[0].set_result(None)

    def run() -> None:  # in the worker: the job, then its one hand-back to the loop
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller as it is
            outcome.append((False, exc))
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(wake)

    # (the hand-back is the job's own last step, not a done callback of the executor's
    # future: one added after the job ended runs in the submitting thread)
    if urgent and isinstance(executor, DatabaseThread):
        job = executor.submit_urgent(run)
    else:
        job = executor.submit(run)
    try:
        await waiter[0]
    except asyncio.CancelledError:
        if not (droppable and job.cancel()):  # running (or done): wait until it ends
            while not outcome:
                waiter[0] = loop.create_future()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter[0]
            ok, value = outcome[0]
            if discard is not None and ok:
                discard(value)
        raise
    ok, value = outcome[0]
    if not ok:
        raise value
    result: _T = value
    return result


def _end_leftover(conn: sqlite3.Connection) -> None:
    """Roll back a transaction left open on the connection, so that no job inherits one.
    Never expected (every job that begins a transaction ends it, and so does the end of a
    :meth:`Store.transaction` block), unless a ROLLBACK failed."""
    if conn.in_transaction:
        log.warning("rolling back a transaction left open on the store's connection")
        conn.execute("ROLLBACK")


def _begin(conn: sqlite3.Connection) -> None:
    _end_leftover(conn)
    conn.execute("BEGIN IMMEDIATE")


def _commit(conn: sqlite3.Connection) -> None:
    conn.execute("COMMIT")


@dataclass
class _Block:
    """A :meth:`Store.transaction` block, as its jobs in the database thread see it."""

    begun: bool = False


def _in_block(
    block: _Block, what: str, body: Callable[[sqlite3.Connection], _T], conn: sqlite3.Connection
) -> _T:
    """``body`` inside ``block``'s transaction: the block's first call begins it. A call
    that finds it ended (SQLite may roll a transaction back by itself after an error, e.g.
    SQLITE_FULL) raises rather than run on its own and commit at once."""
    if not block.begun:
        _begin(conn)
        block.begun = True
    elif not conn.in_transaction:
        raise StoreError(f"{what}: the transaction was rolled back after an earlier error")
    return body(conn)


def _one_transaction(body: Callable[[sqlite3.Connection], _T], conn: sqlite3.Connection) -> _T:
    """``body`` in a transaction of its own: BEGIN, body, COMMIT; ROLLBACK if any fails."""
    try:
        _begin(conn)
        result = body(conn)
        _commit(conn)
        return result
    except BaseException:
        _rollback(conn)
        raise


def _outside_transaction(body: Callable[[sqlite3.Connection], _T], conn: sqlite3.Connection) -> _T:
    _end_leftover(conn)
    return body(conn)


def _close(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        conn.execute("PRAGMA optimize")
    conn.close()


def _task_name(task: asyncio.Task[Any] | None) -> str:
    return "-" if task is None else task.get_name()


# ---------------------------------------------------------------------- rows


_TASK_COLUMNS = (
    "id", "spec", "state", "submitted_at", "updated_at", "decided_by", "node_id", "pid",
    "pid_started_at", "cores", "restarts", "exit_code", "reason", "assignment",
)  # fmt: skip
_TASK_COLS = ", ".join(_TASK_COLUMNS)
_UPSERT_TASK = (
    f"INSERT INTO tasks ({_TASK_COLS}) VALUES ({', '.join('?' * len(_TASK_COLUMNS))}) "
    "ON CONFLICT (id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in _TASK_COLUMNS[1:])
)


#: Rows of central's history one job of the database thread writes
#: (:meth:`Store.record_finished`).
FINISHED_ROWS_PER_JOB = 250

#: Names per ``IN (...)`` list: well under SQLite's bound parameters per statement.
_IN_CHUNK = 500


def _day(at: float) -> str:
    """The UTC day of ``at`` (seconds since the epoch), ``YYYY-MM-DD``."""
    try:
        return datetime.fromtimestamp(at, UTC).date().isoformat()
    except (OverflowError, OSError, ValueError):  # beyond what datetime holds
        return "invalid"


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _task_row(r: TaskRecord) -> tuple[object, ...]:
    return (
        r.spec.id,
        json.dumps(r.spec.to_json(), separators=(",", ":"), sort_keys=True),
        r.state.value,
        r.submitted_at,
        r.updated_at,
        r.decided_by,
        r.node_id,
        r.pid,
        r.pid_started_at,
        _dumps(list(r.cores)),
        r.restarts,
        r.exit_code,
        r.reason,
        "" if r.assignment is None else _dumps(r.assignment.to_json()),
    )


def _opt_float(value: object) -> float | None:
    return None if value is None else _float(value)


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _opt_int(value: object) -> int | None:
    return None if value is None else _int(value)


def _str(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def _opt_str(value: object) -> str | None:
    return None if value is None else _str(value)


def _task_from_row(row: tuple[Any, ...]) -> TaskRecord:
    (tid, spec, state, submitted, updated, decided_by, node_id, pid, pid_started, cores,
     restarts, exit_code, reason, assignment) = row  # fmt: skip
    assigned = _str(assignment)
    record = TaskRecord(
        spec=TaskSpec.from_json(json.loads(_str(spec))),
        state=TaskState(_str(state)),
        submitted_at=_float(submitted),
        updated_at=_float(updated),
        decided_by=_str(decided_by),
        node_id=_opt_str(node_id),
        pid=_opt_int(pid),
        pid_started_at=_opt_float(pid_started),
        cores=tuple(_int(c) for c in json.loads(_str(cores))),
        restarts=_int(restarts),
        exit_code=_opt_int(exit_code),
        reason=_str(reason),
        assignment=Assignment.from_json(json.loads(assigned)) if assigned else None,
    )
    if record.spec.id != _str(tid):
        raise ValueError(f"row id {tid!r} does not match its spec id {record.spec.id!r}")
    return record


@dataclass
class _Bucket:
    """Running aggregate of the samples in one rollup bucket."""

    n: int = 0
    last_at: float = -math.inf
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    last: dict[str, tuple[float, object]] = field(default_factory=dict)

    def add(self, at: float, payload: Mapping[str, object]) -> None:
        self.n += 1
        self.last_at = max(self.last_at, at)
        for key, value in payload.items():
            if _is_number(value):
                self.sums[key] = self.sums.get(key, 0.0) + value
                self.counts[key] = self.counts.get(key, 0) + 1
            elif key not in self.last or self.last[key][0] <= at:
                self.last[key] = (at, value)

    def merge_stored(
        self, n: int, last_at: float, payload: Mapping[str, object], stats: Mapping[str, Any]
    ) -> None:
        """Fold in a rollup row stored by an earlier downsample of the same bucket."""
        self.n += n
        for key, total in dict(stats.get("sums", {})).items():
            self.sums[key] = self.sums.get(key, 0.0) + float(total)
        for key, count in dict(stats.get("counts", {})).items():
            self.counts[key] = self.counts.get(key, 0) + int(count)
        for key, value in payload.items():
            if key in stats.get("counts", {}):
                continue
            if key not in self.last or self.last[key][0] < last_at:
                self.last[key] = (last_at, value)
        self.last_at = max(self.last_at, last_at)

    def payload(self) -> dict[str, object]:
        out: dict[str, object] = {k: v for k, (_, v) in self.last.items() if k not in self.sums}
        for key, total in self.sums.items():
            out[key] = total / self.counts[key]
        return out


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


#: A document's last seq (parameter ``?1``: its name), in SQL: the larger of its log's last
#: and its snapshot's, so seqs keep counting across compactions and rotations.
_LAST_SEQ = (
    "max(coalesce((SELECT max(seq) FROM doc_updates WHERE doc = ?1), 0), "
    "coalesce((SELECT seq FROM doc_snapshots WHERE doc = ?1), 0))"
)
#: One update appended to a document's log (?1 the document, ?2 the update): the next seq is
#: found and taken in one statement.
_APPEND_UPDATE = (
    f"INSERT INTO doc_updates (doc, seq, data) VALUES (?1, 1 + {_LAST_SEQ}, ?2) RETURNING seq"
)


def _snapshot_epochs(conn: sqlite3.Connection, docs: Sequence[str]) -> dict[str, int]:
    """The epoch of each document's snapshot (absent: none, epoch 0)."""
    out: dict[str, int] = {}
    for start in range(0, len(docs), _IN_CHUNK):
        chunk = docs[start : start + _IN_CHUNK]
        marks = ", ".join("?" * len(chunk))
        query = f"SELECT doc, epoch FROM doc_snapshots WHERE doc IN ({marks})"
        out.update((doc, int(epoch)) for doc, epoch in conn.execute(query, chunk).fetchall())
    return out


def _last_seqs(conn: sqlite3.Connection, docs: Sequence[str]) -> dict[str, int]:
    """Each document's last seq so far (its log's, or its snapshot's; 0 for neither): two
    statements per :data:`_IN_CHUNK` documents."""
    last = dict.fromkeys(docs, 0)
    for start in range(0, len(docs), _IN_CHUNK):
        chunk = docs[start : start + _IN_CHUNK]
        marks = ", ".join("?" * len(chunk))
        for query in (
            f"SELECT doc, max(seq) FROM doc_updates WHERE doc IN ({marks}) GROUP BY doc",
            f"SELECT doc, seq FROM doc_snapshots WHERE doc IN ({marks})",
        ):
            for doc, seq in conn.execute(query, chunk).fetchall():
                last[doc] = max(last[doc], int(seq))
    return last


#: Rows in one statement of :func:`_insert_rows` (and no more parameters than the linked
#: SQLite binds in one statement: 32,766 since 3.32, 999 before).
_ROWS_PER_STATEMENT = 500


def _insert_rows(conn: sqlite3.Connection, head: str, rows: Sequence[Sequence[object]]) -> None:
    """``head VALUES (?, ...), (?, ...), ...`` for ``rows`` (all as wide): one statement per
    :data:`_ROWS_PER_STATEMENT` rows, where ``executemany`` runs one per row. The database
    thread gives up the GIL around each statement and waits to get it back while the event
    loop's thread computes (up to the switch interval): 250 replica snapshots written as
    ``executemany`` (two statements a row) waited ~500 times, ~250 ms at central's 0.5 ms
    interval (``bench/bench_store_contention.py``)."""
    if not rows:
        return
    width = len(rows[0])
    marks = "(" + ", ".join("?" * width) + ")"
    params_max = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    per = max(1, min(_ROWS_PER_STATEMENT, params_max // width))
    for start in range(0, len(rows), per):
        chunk = rows[start : start + per]
        params = [value for row in chunk for value in row]
        conn.execute(f"{head} VALUES {', '.join([marks] * len(chunk))}", params)


def _last_seq(conn: sqlite3.Connection, doc: str) -> int:
    rows = conn.execute(f"SELECT {_LAST_SEQ}", (doc,)).fetchall()
    return int(rows[0][0])


def _snapshot_epoch(conn: sqlite3.Connection, doc: str) -> int | None:
    rows = conn.execute("SELECT epoch FROM doc_snapshots WHERE doc = ?", (doc,)).fetchall()
    return int(rows[0][0]) if rows else None


def _snapshot_seq(conn: sqlite3.Connection, doc: str) -> int | None:
    rows = conn.execute("SELECT seq FROM doc_snapshots WHERE doc = ?", (doc,)).fetchall()
    return int(rows[0][0]) if rows else None


# ---------------------------------------------------------------------- errors


def _error(what: str, exc: sqlite3.Error) -> StoreError:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == _SQLITE_FULL:
        return StoreFullError(f"database full: {what} ({exc})")
    return StoreError(f"{what}: {exc}")


def _failure(what: str, exc: BaseException) -> StoreError | None:
    """The StoreError a failed write raises for ``exc`` (None: re-raise ``exc`` itself)."""
    if isinstance(exc, sqlite3.Error):
        return _error(what, exc)
    if isinstance(exc, UnicodeError):
        return StoreError(f"{what}: text is not valid Unicode ({exc})")
    return None


def _is_corrupt(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)


def _one_line(text: str, limit: int = 300) -> str:
    flat = "; ".join(part.strip() for part in text.splitlines() if part.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:  # (ProgrammingError: the connection is already closed)
        log.error("rollback failed: %s", exc)


# ---------------------------------------------------------------------- opening
# All of it runs in the store's database thread (Store.open: one job).


def _open(
    path: Path, max_page_count: int | None
) -> tuple[sqlite3.Connection, int, Recovery | None]:
    """Open, check and migrate the store at ``path``; a corrupt file is moved aside and its
    readable rows salvaged into a fresh one. Raises StoreError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot open store {path}: {_os_reason(exc)}") from None
    if path.is_dir():
        raise StoreError(f"cannot open store {path}: it is a directory")
    try:
        conn, version = _connect(path, max_page_count)
        return conn, version, None
    except _CorruptError as exc:
        reason = str(exc)
    moved_to = _move_aside(path)
    try:
        conn, version = _connect(path, max_page_count)
    except _CorruptError as exc:
        raise StoreError(f"cannot create a fresh store at {path}: {exc}") from None
    try:
        salvaged = _salvage(moved_to, path, max_page_count)
    except Exception as exc:  # salvage is best effort: the fresh store is still usable
        log.error("salvaging rows from %s failed: %s", moved_to, exc)
        salvaged = {}
    log.warning(
        "store %s was corrupt (%s): moved aside to %s, fresh database created, rows salvaged: %s",
        path,
        reason,
        moved_to,
        ", ".join(f"{t}={n}" for t, n in salvaged.items()) or "none",
    )
    return conn, version, Recovery(moved_to=moved_to, salvaged=salvaged, reason=reason)


def _connect(path: Path, max_page_count: int | None) -> tuple[sqlite3.Connection, int]:
    """Open, configure, check and migrate; raises StoreError or _CorruptError.

    The connection keeps sqlite3's same-thread check: made in the database thread, it is
    used there only, and a use from any other thread would raise rather than race.
    """
    try:
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from None
    try:
        version = _prepare(conn, path, max_page_count)
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        raise
    return conn, version


def _prepare(conn: sqlite3.Connection, path: Path, max_page_count: int | None) -> int:
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        mode = _scalar(conn, "PRAGMA journal_mode = WAL")
        if str(mode).lower() != "wal":
            log.warning("store %s: WAL mode unavailable, using journal mode %s", path, mode)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
        if max_page_count is not None:
            conn.execute(f"PRAGMA max_page_count = {int(max_page_count)}")
        check = [str(r[0]) for r in conn.execute("PRAGMA quick_check").fetchall()]
        if check != ["ok"]:
            raise _CorruptError(_one_line("quick_check: " + "; ".join(check)))
        return _migrate(conn, path)
    except sqlite3.Error as exc:
        if _is_corrupt(exc):
            raise _CorruptError(_one_line(str(exc))) from None
        raise _open_error(path, exc) from None


def _open_error(path: Path, exc: sqlite3.Error) -> StoreError:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == _SQLITE_CANTOPEN:
        if not os.access(path.parent, os.W_OK | os.X_OK):
            return StoreError(
                f"cannot open store {path}: {exc} (directory {path.parent} is not writable)"
            )
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            return StoreError(f"cannot open store {path}: {exc} (file is not read-writable)")
    return _error(f"cannot open store {path}", exc)


def _scalar(conn: sqlite3.Connection, sql: str) -> Any:
    rows = conn.execute(sql).fetchall()
    return rows[0][0] if rows else None


def _migrate(conn: sqlite3.Connection, path: Path) -> int:
    """Bring the schema to SCHEMA_VERSION in one transaction; returns it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(_scalar(conn, "PRAGMA user_version"))
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store {path} has schema version {version}, newer than the version "
                f"{SCHEMA_VERSION} this edgesched supports; upgrade edgesched (the file is "
                "left untouched)"
            )
        if version == 0:
            tables = _scalar(conn, "SELECT count(*) FROM sqlite_master")
            if tables:
                raise StoreError(
                    f"store {path} is an SQLite database but not an edgesched store "
                    "(it has tables but no schema version)"
                )
        if version == SCHEMA_VERSION:
            # A write rolled back at once: proves the file is writable, changes nothing.
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("ROLLBACK")
            return SCHEMA_VERSION
        try:
            for step in MIGRATIONS[version:]:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if _is_corrupt(exc):
                raise
            raise _error(
                f"cannot migrate store {path} from schema version {version} to {SCHEMA_VERSION}",
                exc,
            ) from None
        if version:
            log.info("store %s migrated from schema %d to %d", path, version, SCHEMA_VERSION)
        return SCHEMA_VERSION
    except BaseException:
        _rollback(conn)
        raise


# ---------------------------------------------------------------------- recovery


def _side(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _move_aside(path: Path) -> Path:
    """Move ``path`` and its -wal/-shm/-journal to ``<name>.corrupt-<UTC time>``."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = _side(path, f".corrupt-{stamp}")
    n = 1
    while any(_side(target, s).exists() for s in ("", *_SIDE_FILES)):
        n += 1
        target = _side(path, f".corrupt-{stamp}-{n}")
    try:
        for suffix in ("", *_SIDE_FILES):
            source = _side(path, suffix)
            if source.exists():
                os.replace(source, _side(target, suffix))
    except OSError as exc:
        raise StoreError(
            f"store {path} is corrupt and cannot be moved aside: {_os_reason(exc)}"
        ) from None
    return target


@dataclass(frozen=True)
class _Table:
    name: str
    columns: tuple[str, ...]
    clean: Callable[[tuple[Any, ...]], tuple[object, ...]]  # raises on a bad row
    #: What to select instead from a file of an older schema that lacks some columns.
    older: tuple[str, ...] = ()


def _clean_task(row: tuple[Any, ...]) -> tuple[object, ...]:
    return _task_row(_task_from_row(row))


def _clean_json_dict(value: object) -> str:
    data = json.loads(_str(value))
    if not isinstance(data, dict):
        raise TypeError("expected a JSON object")
    return _dumps(data)


def _clean_blob(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError("expected bytes")
    return value


def _finite(value: object) -> float:
    out = _float(value)
    if not math.isfinite(out):
        raise ValueError("not finite")
    return out


def _each(*convert: Callable[[Any], object]) -> Callable[[tuple[Any, ...]], tuple[object, ...]]:
    """A row cleaner applying one converter per column."""

    def clean(row: tuple[Any, ...]) -> tuple[object, ...]:
        if len(row) != len(convert):
            raise ValueError("wrong number of columns")
        return tuple(f(v) for f, v in zip(convert, row, strict=True))

    return clean


_TABLES = (
    _Table("meta", ("key", "value"), _each(_str, _str)),
    _Table("tasks", _TASK_COLUMNS, _clean_task, older=(*_TASK_COLUMNS[:-1], "''")),
    _Table(
        "decisions",
        ("seq", "at", "kind", "node_id", "task_id", "source", "body"),
        _each(_int, _float, _str, _str, _opt_str, _str, _clean_json_dict),
    ),
    _Table("samples", ("id", "at", "payload"), _each(_int, _finite, _clean_json_dict)),
    _Table(
        "sample_rollups",
        ("bucket", "width", "n", "last_at", "payload", "stats"),
        _each(_finite, _finite, _int, _float, _clean_json_dict, _clean_json_dict),
    ),
    _Table("doc_updates", ("doc", "seq", "data"), _each(_str, _int, _clean_blob)),
    _Table(
        "doc_snapshots",
        ("doc", "seq", "data", "epoch"),
        _each(_str, _int, _clean_blob, _int),
        older=("doc", "seq", "data", "0"),  # schema 2: no epochs yet
    ),
    # schema 5; task_state_counts is not copied: the fresh file's triggers count the salvaged
    # task rows as they go in
    _Table("task_history", ("day", "state", "n"), _each(_str, _str, _int)),
    _Table("decision_history", ("day", "kind", "source", "n"), _each(_str, _str, _str, _int)),
)


def _salvage(bad: Path, target: Path, max_page_count: int | None) -> dict[str, int]:
    """Copy every row still readable (and valid) from ``bad`` into ``target``, per table."""
    counts = {t.name: 0 for t in _TABLES}
    try:
        src = sqlite3.connect(f"file:{quote(str(bad))}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        log.warning("cannot read corrupt store %s: %s", bad, exc)
        return counts
    try:
        src.text_factory = bytes  # bad UTF-8 then fails one row, not the scan
        try:
            # Trust the file's real size over a damaged header's (reads a truncated file).
            src.execute("PRAGMA writable_schema = ON")
            src.execute("PRAGMA query_only = ON")
        except sqlite3.Error:
            pass
        dst = sqlite3.connect(str(target), isolation_level=None)
        try:
            dst.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            dst.execute("PRAGMA synchronous = FULL")
            if max_page_count is not None:
                dst.execute(f"PRAGMA max_page_count = {int(max_page_count)}")
            for table in _TABLES:
                counts[table.name] = _salvage_table(src, dst, table)
        finally:
            dst.close()
    finally:
        src.close()
    return counts


def _salvage_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: _Table) -> int:
    cols = ", ".join(table.columns)
    insert = (
        f"INSERT OR IGNORE INTO {table.name} ({cols}) "
        f"VALUES ({', '.join('?' * len(table.columns))})"
    )
    saved = 0
    try:
        dst.execute("BEGIN IMMEDIATE")
        for row in _readable_rows(src, table):
            saved += max(dst.execute(insert, row).rowcount, 0)
        dst.execute("COMMIT")
    except sqlite3.Error as exc:
        log.warning("salvaging table %s failed: %s", table.name, exc)
        if dst.in_transaction:
            dst.execute("ROLLBACK")
        return 0
    return saved


def _readable_rows(src: sqlite3.Connection, table: _Table) -> Iterator[tuple[object, ...]]:
    """Scan ``table`` by rowid, stepping over unreadable stretches; yield cleaned rows."""
    for columns in (table.columns, table.older):
        if not columns:
            continue
        try:
            src.execute(f"SELECT {', '.join(columns)} FROM {table.name} LIMIT 0")
            break
        except sqlite3.Error:
            continue  # table or column missing (older schema) or schema unreadable
    else:
        return
    sql = f"SELECT rowid, {', '.join(columns)} FROM {table.name} WHERE rowid >= ? ORDER BY rowid"
    start = _MIN_ROWID
    for _ in range(10_000):  # bound on unreadable stretches
        try:
            for row in src.execute(sql, (start,)):
                rowid = int(row[0])
                if rowid >= _MAX_ROWID:
                    return
                start = max(start, rowid + 1)
                try:
                    yield table.clean(tuple(row[1:]))
                except Exception:  # a garbled row: skip it
                    continue
            return
        except sqlite3.Error:
            resume = _next_readable(src, table.name, start)
            if resume is None:
                return
            start = resume
    return


def _next_readable(src: sqlite3.Connection, name: str, start: int) -> int | None:
    """The smallest rowid after ``start`` from which a scan can read again (gallop + bisect)."""

    def readable(at: int) -> bool:
        try:
            src.execute(
                f"SELECT rowid FROM {name} WHERE rowid >= ? ORDER BY rowid LIMIT 1", (at,)
            ).fetchall()
        except sqlite3.Error:
            return False
        return True

    bad, step = start, 1
    while True:
        probe = start + step
        if probe > _MAX_ROWID:
            return None
        if readable(probe):
            break
        bad, step = probe, step * 2
    good = probe
    while good - bad > 1:
        mid = (bad + good) // 2
        if readable(mid):
            good = mid
        else:
            bad = mid
    return good
