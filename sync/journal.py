"""A document's write-ahead journal: every local update in SQLite before it leaves.

The writer of a document must persist each local update before it is published or acted
on: an update published but not persisted would be issued again, under the same client
clock, after a crash, and the replicas would diverge silently. :class:`DocJournal` takes the
document's local updates (queued by the doc callback, never written from inside it), appends
them to the store in order (retrying while the store fails, e.g. a full disk), and
:meth:`DocJournal.flushed` is the peer's ``before_publish``: it returns once everything queued
so far is on disk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
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
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        doc.on_local_update(self._queue.put_nowait)  # queue only: no doc access in a commit

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    async def flushed(self) -> None:
        """Return once every update queued so far is in the store."""
        await self._queue.join()

    async def run(self) -> None:
        """Forever: append each queued update, in order; on a store error wait and retry."""
        while True:
            update = await self._queue.get()
            while True:
                try:
                    await self.doc.log_update(self.store, update)
                    break
                except StoreError as exc:
                    if self.on_error is not None:
                        self.on_error(exc)
                    log.error(
                        "%s: update not logged yet (publishing waits): %s", self.doc.name, exc
                    )
                    await asyncio.sleep(self.retry_s)
            self._queue.task_done()
