"""A document's write-ahead journal: every local update in SQLite before it leaves.

The writer of a document must persist each local update before it is published or acted
on: an update published but not persisted would be issued again, under the same client
clock, after a crash, and the replicas would diverge silently. :class:`DocJournal` takes the
document's local updates (queued by the doc callback, never written from inside it) and
appends them to the store in order, two ways:

* :meth:`DocJournal.transaction`: a store transaction (:meth:`Store.transaction`) whose end
  also logs every update queued so far, the ones the block itself made included, so a state
  change commits its rows and its document update together, with one fsync;
* :meth:`DocJournal.run`: a background task that logs whatever is still queued, its appends
  in one store job and one commit (a call outside any block, which waits for no other
  call's turn of the event loop: :meth:`Store.append_updates`), retrying while the store
  fails (e.g. a full disk).

Either way an update leaves the queue only once its transaction committed, and
:meth:`DocJournal.flushed` is the peer's ``before_publish``: it returns once everything queued
so far is on disk.

A writer of many documents (central and its per-node desired-state documents) keeps their
journals in one :class:`JournalSet`, whose single task logs every journal with queued updates
in one store job and commit: one fsync for a control step's writes to a thousand documents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

from edgesched.sync.store import StoreError

if TYPE_CHECKING:
    from edgesched.sync.doc import SyncedDoc
    from edgesched.sync.store import Store

log = logging.getLogger("edgesched.sync.journal")


class DocJournal:
    """Owns the queue of a document's unlogged local updates and the task that logs them."""

    def __init__(
        self,
        doc: SyncedDoc,
        store: Store,
        *,
        on_error: Callable[[StoreError], None] | None = None,
        retry_s: float = 1.0,
    ) -> None:
        self.doc = doc
        self.store = store
        self.on_error = on_error
        self.retry_s = retry_s
        # (a list, not a deque, and the waiters' condition and event made when first waited
        # on: central holds a journal per desired document, and an empty deque, a condition
        # and an event cost ~2 KiB a journal, while almost every journal is idle)
        self._pending: list[bytes] = []
        self._queued = 0  # updates ever queued
        self._logged = 0  # updates ever committed to the store (a prefix of the queue)
        self._changed: asyncio.Condition | None = None
        self._arrived: asyncio.Event | None = None
        self._lock = asyncio.Lock()  # one logger at a time: updates go in in order
        #: Called (outside the commit) when an update is queued: a JournalSet's wake-up.
        self.on_queued: Callable[[DocJournal], None] | None = None
        doc.on_local_update(self._enqueue)  # queue only: no doc access in a commit

    def _enqueue(self, update: bytes) -> None:
        self._pending.append(update)
        self._queued += 1
        if self._arrived is not None:
            self._arrived.set()
        if self.on_queued is not None:
            self.on_queued(self)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def mark(self) -> int:
        """How many updates were ever queued: :meth:`flushed_to` this returns once every one
        of them is in the store, whatever is queued after."""
        return self._queued

    async def flushed(self) -> None:
        """Return once every update queued so far is in the store."""
        await self.flushed_to(self._queued)

    async def flushed_to(self, target: int) -> None:
        """Return once the first ``target`` updates ever queued (a :meth:`mark`) are in the
        store; at once if they already are."""
        if self._logged >= target:
            return
        if self._changed is None:
            self._changed = asyncio.Condition()
        changed = self._changed
        async with changed:
            await changed.wait_for(lambda: self._logged >= target)

    async def _committed(self, n: int) -> None:
        del self._pending[:n]
        self._logged += n
        changed = self._changed
        if changed is not None:  # (None: nobody ever waited)
            async with changed:
                changed.notify_all()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """A store transaction that also logs the queued updates, those the block made
        included, before it commits: one commit for the block's rows and its document change.

        If the block or the commit fails, nothing of it is in the store and the updates stay
        queued (:meth:`run` logs them later, retrying): the document may then hold a change
        the store does not, which the caller undoes with a new change if it must.
        """
        async with self._lock, self._logging():
            yield

    @contextlib.asynccontextmanager
    async def _logging(self) -> AsyncIterator[None]:
        """:meth:`transaction`'s body, the journal's lock held."""
        saved = _log_position(self.doc)
        logged = {self.doc.name: 0}
        try:
            async with self.store.transaction():
                yield
                await _log_queued(self.store, {self.doc.name: self}, logged)
        except BaseException:
            _restore_log_position(self.doc, saved)  # the store did not move
            raise
        await self._committed(logged[self.doc.name])

    async def _log_now(self) -> None:
        """Log everything queued, outside any block: its appends one store job and one
        commit, however many (see :func:`_log_queued`); on a store error what committed
        before it stays logged and the rest queued."""
        logged = {self.doc.name: 0}
        try:
            await _log_queued(self.store, {self.doc.name: self}, logged)
        finally:
            await self._committed(logged[self.doc.name])

    async def run(self) -> None:
        """Forever: log what is queued, its appends in one job and one commit (one fsync
        however many updates waited: each one its own commit left a writer waiting behind as
        many turns of the store as it had updates queued); on a store error wait and
        retry. A rotation a large document asks for (:attr:`SyncedDoc.rotation_wanted`) runs
        beside it, in slices, in a task of its own: the document's writes are logged at the
        old epoch meanwhile, and the rotation's state after them."""
        async with asyncio.TaskGroup() as group:
            rotation: asyncio.Task[None] | None = None
            while True:
                if self.doc.rotation_wanted is not None and (rotation is None or rotation.done()):
                    rotation = group.create_task(self._rotate(), name=f"rotate {self.doc.name}")
                await self._log_round()

    async def _rotate(self) -> None:
        below, self.doc.rotation_wanted = self.doc.rotation_wanted, None
        try:
            await self.doc.rotate_in_slices(below=below)
        except Exception:  # (the document stays as it was: the next compaction asks again)
            log.exception("%s: rotation failed", self.doc.name)

    async def _log_round(self) -> None:
        """One turn of :meth:`run`: wait for an update, or log what is queued."""
        if not self._pending:
            if self._arrived is None:
                self._arrived = asyncio.Event()
            self._arrived.clear()
            await self._arrived.wait()
            return
        async with self._lock:
            if not self._pending:  # (a transaction logged them while we waited)
                return
            try:
                await self._log_now()
                failed = None
            except StoreError as exc:
                failed = exc
        if failed is not None:
            if self.on_error is not None:
                self.on_error(failed)
            log.error("%s: update not logged yet (publishing waits): %s", self.doc.name, failed)
            await asyncio.sleep(self.retry_s)


class JournalSet:
    """The journals of many documents of one store, logged by one task, batched."""

    def __init__(self, store: Store, *, retry_s: float = 1.0) -> None:
        self.store = store
        self.retry_s = retry_s
        self.journals: dict[str, DocJournal] = {}
        self._due: dict[str, DocJournal] = {}
        self._arrived = asyncio.Event()
        self.batches = 0  # store transactions committed

    def add(self, doc: SyncedDoc) -> DocJournal:
        """A journal for ``doc`` (its updates are logged by :meth:`run`, not its own task)."""
        journal = DocJournal(doc, self.store, retry_s=self.retry_s)
        journal.on_queued = self._queued
        self.journals[doc.name] = journal
        return journal

    def _queued(self, journal: DocJournal) -> None:
        self._due[journal.doc.name] = journal
        self._arrived.set()

    async def flush(self) -> int:
        """Log every queued update of every journal: their appends in one store job and one
        commit (then a compaction or rotation that is due, each a write of its own); returns
        how many journals were written. On a store error what committed before it stays
        logged and the rest stays queued (the appends are all or none). The set's journals
        are logged only here (never by their own run or transaction)."""
        due, self._due = self._due, {}
        if not due:
            return 0
        logged = dict.fromkeys(due, 0)
        try:
            await _log_queued(self.store, due, logged)
        except BaseException:
            self._due = {n: j for n, j in due.items() if logged[n] < len(j._pending)} | self._due
            raise
        finally:
            for name, journal in due.items():
                await journal._committed(logged[name])
        self.batches += 1
        return len(due)

    async def run(self) -> None:
        """Forever: log what is queued, a batch at a time; on a store error wait, retry."""
        while True:
            if not self._due:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            try:
                await self.flush()
            except StoreError as exc:
                log.error("desired-state documents not logged yet (publishing waits): %s", exc)
                await asyncio.sleep(self.retry_s)


async def _log_queued(
    store: Store, journals: Mapping[str, DocJournal], logged: dict[str, int]
) -> None:
    """Log every queued update of ``journals`` (``logged[name]`` of each already logged,
    counted on as each store call returns), until every queue is drained (a compaction may
    queue a rotation): inside the caller's store transaction, or, outside one, each call
    its own. Updates that are only appended (the store's epoch, no rotation: nearly all) go
    in one store call for all the journals, then each document compacts if it is due; a
    rotation or an update of another epoch is logged on its own, in its place in its
    queue. A document's log position moves only once its call has returned."""
    while True:
        runs: dict[str, list[bytes]] = {}
        for name, journal in journals.items():
            pending, doc = journal._pending, journal.doc
            end = start = logged[name]
            while end < len(pending) and doc.appendable(pending[end]):
                end += 1
            if end > start:
                runs[name] = pending[start:end]
        if runs:
            last = await store.append_updates(runs)
            for name, run in runs.items():
                logged[name] += len(run)
                journals[name].doc.appended(run)
            for name in runs:  # (each compaction's snapshot covers its document's run)
                await journals[name].doc.compact_if_due(store, last[name])
        alone = [n for n, j in journals.items() if logged[n] < len(j._pending)]
        if not alone:
            return
        for name in alone:  # a rotation, an older epoch's: on its own (new ones: next turn)
            journal = journals[name]
            if not journal.doc.appendable(journal._pending[logged[name]]):
                await journal.doc.log_update(store, journal._pending[logged[name]])
                logged[name] += 1


def _log_position(doc: SyncedDoc) -> tuple[int, int, int, int]:
    """What :meth:`SyncedDoc.log_update` advances as it writes (the updates logged since the
    last compaction and their bytes, the snapshot's bytes, the store's epoch): restored when
    its transaction rolls back."""
    return doc._logged, doc._logged_bytes, doc._compacted_bytes, doc._stored_epoch


def _restore_log_position(doc: SyncedDoc, saved: tuple[int, int, int, int]) -> None:
    doc._logged, doc._logged_bytes, doc._compacted_bytes, doc._stored_epoch = saved
