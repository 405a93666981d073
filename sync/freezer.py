"""Which documents stay live in memory: the ones used lately; the rest are frozen.

Central holds a replica of every node's document and every node's desired-state document:
at 10,000 nodes of 100 tasks, two million live pycrdt entries, most of them unchanged for
hours. A live entry costs about ten times its encoded form (:meth:`SyncedDoc.freeze`).
A :class:`Freezer` watches a set of documents and, at each :meth:`Freezer.sweep`, freezes
those nobody used since the previous sweep (the second-chance rule of a page cache: a
document is frozen after one to two sweep periods of silence). A frozen document thaws by
itself on its next use; the freezer hears of it and watches it again.

A sweep costs O(live documents), not O(documents): frozen ones are not visited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgesched.sync.doc import SyncedDoc

#: Most documents a sweep visits between two turns of the event loop
#: (:meth:`Freezer.sweep_in_turns`), and the longest it visits for: a freeze costs ~0.7 ms
#: (encode, compress, drop the live document), so 200 a turn held central's loop up to 160 ms
#: at 10,000 nodes (bench_central_scale --hold-sample: half of the time its loop was late,
#: each submission waiting behind it).
VISITS_PER_TURN = 200
TURN_S = 0.005


@dataclass(frozen=True)
class Sweep:
    """What one :meth:`Freezer.sweep` did."""

    frozen: int  # documents frozen by this sweep
    live: int  # documents left live (used since the previous sweep)
    frozen_total: int  # documents frozen now, in all
    frozen_bytes: int  # bytes the frozen documents hold (their encoded state, compressed)


class Freezer:
    """Freezes the watched documents that went unused for a whole sweep period."""

    def __init__(self, on_unsettled: Callable[[SyncedDoc], None] | None = None) -> None:
        """``on_unsettled(doc)``: a sweep found ``doc`` unused but unable to freeze, since it
        may hold updates pycrdt keeps pending (:attr:`SyncedDoc.unsettled`); its owner asks
        the writer for a full answer (a resync), which settles it for the next sweep."""
        self.on_unsettled = on_unsettled
        self._watched: dict[str, SyncedDoc] = {}
        self._live: dict[str, SyncedDoc] = {}
        self._sizes: dict[str, int] = {}  # name -> encoded bytes, for the frozen ones
        self._bytes = 0  # their sum
        self.thaws = 0

    def watch(self, doc: SyncedDoc) -> None:
        """Watch ``doc`` (by its name; watching another document of the same name replaces
        it). It is not frozen before it has gone a whole sweep period unused."""
        if self._watched.get(doc.name) is doc:
            return
        self.forget(doc.name)
        self._watched[doc.name] = doc
        doc.on_thaw(self._thawed)
        if doc.frozen:
            self._hold(doc.name, len(doc.snapshot()))
        else:
            self._live[doc.name] = doc

    def forget(self, name: str) -> None:
        """Stop watching document ``name`` (it stays as it is, frozen or live)."""
        self._watched.pop(name, None)
        self._live.pop(name, None)
        self._bytes -= self._sizes.pop(name, 0)

    def _hold(self, name: str, size: int) -> None:
        self._bytes += size - self._sizes.get(name, 0)
        self._sizes[name] = size

    def _thawed(self, doc: SyncedDoc) -> None:
        if self._watched.get(doc.name) is not doc:
            return  # a document replaced since: not ours to watch
        self.thaws += 1
        self._bytes -= self._sizes.pop(doc.name, 0)
        self._live[doc.name] = doc

    def sweep(self, only: Callable[[str], bool] | None = None) -> Sweep:
        """Freeze every live document unused since the last sweep; mark the rest unused.
        ``only``: sweep just the documents whose name it accepts (a group swept on a period
        of its own: central's node replicas); the others are left as they are."""
        frozen = sum(self._visit(name, doc, only) for name, doc in list(self._live.items()))
        return self._swept(frozen)

    async def sweep_in_turns(
        self,
        only: Callable[[str], bool] | None = None,
        per_turn: int = VISITS_PER_TURN,
        turn_s: float = TURN_S,
    ) -> Sweep:
        """:meth:`sweep`, giving the event loop a turn every ``per_turn`` documents or
        ``turn_s`` seconds, whichever comes first (a sweep of thousands held central's loop
        for a second). A document used meanwhile is kept: a use marks it, and only unmarked
        documents freeze."""
        frozen = 0
        visits, since = 0, time.monotonic()
        for name, doc in list(self._live.items()):
            if visits >= per_turn or time.monotonic() - since >= turn_s:
                await asyncio.sleep(0)
                visits, since = 0, time.monotonic()
            visits += 1
            if self._live.get(name) is doc:  # (not frozen, forgotten or replaced meanwhile)
                frozen += self._visit(name, doc, only)
        return self._swept(frozen)

    def _visit(self, name: str, doc: SyncedDoc, only: Callable[[str], bool] | None) -> int:
        """One live document's turn in a sweep: 1 if it froze now."""
        if only is not None and not only(name):
            return 0
        if doc.frozen:  # frozen by someone else
            self._hold(name, len(doc.snapshot()))
            del self._live[name]
            return 0
        if doc.touched:
            doc.touched = False
            return 0
        size = doc.freeze()
        if size:
            del self._live[name]
            self._hold(name, size)
            return 1
        if doc.unsettled and self.on_unsettled is not None:
            self.on_unsettled(doc)
        return 0

    def _swept(self, frozen: int) -> Sweep:
        return Sweep(
            frozen=frozen,
            live=len(self._live),
            frozen_total=len(self._sizes),
            frozen_bytes=self._bytes,
        )

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def frozen(self) -> int:
        return len(self._sizes)
