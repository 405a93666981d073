"""Central's desired-state documents, one per node: what that node must run, stop and be.

The fleet's assignments, stop orders and power orders live in central's own ``fleet``
document, which only central replicas replicate. Each node replicates just its own shard of
them, ``desired-<node>`` (a :class:`~edgesched.sync.doc.PolicyDoc`: the same ``assignments``,
``stops`` and ``power`` maps, holding only the entries of that node), plus the small
fleet-wide ``policy`` document (mode, tidal profile, models). So a node's traffic and its
document's size follow its own work, not the fleet's: before, every node replicated every
assignment of the fleet, and each change fanned out to every node.

Central projects: each change the fleet index learns of the ``fleet`` document (an
assignment made, moved, finished or forgotten; a stop order; a power order) is mirrored into
the desired documents it concerns, from the validated entry (a bad entry in ``fleet`` never
reaches a node). A failover moves an assignment from the old node's document to the new one's;
the old node, cut off, keeps running its copy until a stop order reaches it in its own
document (nodes stop a copy only on an explicit order). All desired documents are journaled
by one :class:`~edgesched.sync.journal.JournalSet`: a step's writes to any number of them cost
one SQLite transaction, and each goes out only once it is on disk.

A central that runs alone (no fellow replicas) is each desired document's one writer: the
documents are :class:`~edgesched.sync.doc.SoleDesiredDoc`, which rotate to a fresh epoch of
their live content once the tombstones of the node's forgotten tasks outweigh it (the
journal's compaction decides; the node adopts the new epoch from central). With fellow
centrals they are co-written and keep their tombstones.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping

from edgesched.sync.doc import (
    DESIRED_PREFIX,
    PolicyDoc,
    SoleDesiredDoc,
    client_id_for,
    desired_doc_name,
)
from edgesched.sync.freezer import Freezer
from edgesched.sync.journal import DocJournal, JournalSet
from edgesched.sync.pacer import ResyncPacer
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import AssignmentEntry, PowerOrder, StopOrder
from edgesched.sync.security import sender_check
from edgesched.sync.session import MqttSession
from edgesched.sync.signing import FrameSigning
from edgesched.sync.store import Store

log = logging.getLogger("edgesched.central.desired")


class DesiredDocs:
    """The desired-state documents central writes, their peers and their journals."""

    def __init__(
        self,
        central_id: str,
        session: MqttSession,
        store: Store,
        *,
        centrals: Collection[str] = (),
        clock: Callable[[], float] = time.time,
        freezer: Freezer | None = None,
        reads_packed: Callable[[str], bool] = lambda _node: False,
        pacer: ResyncPacer | None = None,
        source: DocJournal | None = None,
        signing: FrameSigning | None = None,
    ) -> None:
        """``freezer``: watches every desired-state document (frozen while unused);
        ``reads_packed``: whether a node reads packed entries (its registration says), which
        its document is then written with; ``pacer``: paces each peer's own step 1s;
        ``source``: the journal of what the documents are projected from (central's fleet
        document). A projection into a node's document marks how far the source was written
        then, and nothing of that document leaves before the source is on disk that far, so
        a node never holds an assignment that a crash of central would then lose. A
        projection may so be written (and journaled) while its source's write is still on
        its way: the two journal writes overlap. A document with no such projection waits
        for nothing of the source's (the answers to a heal's thousand step 1s do not queue
        behind the fleet document's writes)."""
        self.central_id = central_id
        self.client_id = client_id_for(central_id)
        self.session = session
        self.store = store
        self.centrals = frozenset(centrals) | {central_id}
        #: Central is every document's one writer (no fellow replicas): they rotate.
        self.sole = self.centrals == {central_id}
        self.clock = clock
        self.freezer = freezer
        self.reads_packed = reads_packed
        self.pacer = pacer
        self.source = source
        self.signing = signing  # every document's peer signs and checks with it
        #: node -> the source's mark its document's latest projection needs on disk
        self._source_marks: dict[str, int] = {}
        self.docs: dict[str, PolicyDoc] = {}
        self.peers: dict[str, DocPeer] = {}  # (for their refusal counters)
        self.journals = JournalSet(store)
        self.writes = 0  # entries written or removed by the projection
        self._batch: contextlib.ExitStack | None = None
        self._open: set[str] = set()  # documents with a transaction open in the batch

    def doc(self, node_id: str, restored: PolicyDoc | None = None) -> PolicyDoc:
        """Node ``node_id``'s desired-state document (made, journaled and synced on first
        use; ``restored``: one loaded from SQLite)."""
        doc = self.docs.get(node_id)
        if doc is not None:
            return doc
        doc = restored or self._doc_class()(desired_doc_name(node_id), self.client_id)
        if isinstance(doc, SoleDesiredDoc):
            doc.sole_writer = self.central_id  # (before its peer: the peer reads it)
        journal = self.journals.add(doc)
        self.peers[node_id] = peer = DocPeer(
            doc,
            self.central_id,
            before_publish=self._on_disk(node_id, journal),  # on disk before it leaves
            accept=sender_check(node_id, self.centrals),
            writers=frozenset(client_id_for(c) for c in self.centrals),
            relays=self.centrals,  # the node itself delivers nothing here
            signing=self.signing,
            subscribe=False,  # central's wildcard subscription carries its messages
            clock=self.clock,
            pacer=self.pacer,
        )
        self.session.add(peer)
        self.docs[node_id] = doc
        if self.freezer is not None:
            self.freezer.watch(doc)
        return doc

    def _doc_class(self) -> type[PolicyDoc]:
        return SoleDesiredDoc if self.sole else PolicyDoc

    def _on_disk(self, node_id: str, journal: DocJournal) -> Callable[[], Awaitable[object]]:
        """What node ``node_id``'s document's peer awaits before anything leaves: its
        journal's write, and the source's as far as the document's projections need it."""
        source = self.source
        if source is None:
            return journal.flushed
        marks = self._source_marks

        async def both() -> None:
            mark = marks.get(node_id)
            if mark is not None:
                await source.flushed_to(mark)
                if marks.get(node_id) == mark:  # (no later projection meanwhile)
                    del marks[node_id]
            await journal.flushed()

        return both

    async def load(self) -> int:
        """Restore every desired-state document kept in SQLite; returns how many."""
        count = 0
        for name in await self.store.doc_names():
            if not name.startswith(DESIRED_PREFIX):
                continue
            doc = await self._doc_class().load_from(self.store, name, self.client_id)
            self.doc(name[len(DESIRED_PREFIX) :], doc)
            if self.freezer is not None:
                doc.freeze()  # until used: restoring all of them live would be the peak
            count += 1
        return count

    # --- the projection -------------------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Every projection write inside lands in one transaction per document: one update
        per document and step, not one per entry (an update per entry costs a journal row
        and a message each, and pycrdt keeps ~3x the memory for entries written apart)."""
        if self._batch is not None:  # nested: the outer batch commits
            yield
            return
        with contextlib.ExitStack() as stack:
            self._batch = stack
            try:
                yield
            finally:
                self._batch = None
                self._open = set()

    def _writing(self, node_id: str) -> PolicyDoc:
        """Node ``node_id``'s document, inside the batch's transaction for it if batching,
        writing entries in the form its node reads."""
        doc = self.doc(node_id)
        doc.packed = self.reads_packed(node_id)
        if self.source is not None:  # what this projects is the source as written so far
            self._source_marks[node_id] = self.source.mark()
        if self._batch is not None and doc.name not in self._open:
            self._batch.enter_context(doc.doc.transaction())
            self._open.add(doc.name)
        return doc

    def assignment(
        self, task_id: str, old: AssignmentEntry | None, new: AssignmentEntry | None
    ) -> None:
        """The fleet's assignment of ``task_id`` went from ``old`` to ``new``."""
        if old is not None and old.node and (new is None or new.node != old.node):
            doc = self.docs.get(old.node)
            if doc is not None and doc.root("assignments").get(task_id) is not None:
                self._writing(old.node).drop_assignment(task_id)
                self.writes += 1
        if new is not None and new.node:
            self._writing(new.node).assign(task_id, new)
            self.writes += 1

    def stop(self, key: str, order: StopOrder | None) -> None:
        """The stop order ``task@node`` was given (or is done: None)."""
        task_id, _, node_id = key.rpartition("@")
        if not task_id or not node_id:
            return
        if order is None:
            doc = self.docs.get(node_id)
            if doc is not None and doc.root("stops").get(key) is not None:
                self._writing(node_id).drop_stop(task_id, node_id)
                self.writes += 1
            return
        self._writing(node_id).order_stop(task_id, node_id, order)
        self.writes += 1

    def power(self, node_id: str, order: PowerOrder | None) -> None:
        """Central's power order to ``node_id`` changed."""
        if order is None:
            doc = self.docs.get(node_id)
            if doc is not None and doc.root("power").get(node_id) is not None:
                del self._writing(node_id).root("power")[node_id]
                self.writes += 1
            return
        self._writing(node_id).set_power(node_id, order)
        self.writes += 1

    def match(
        self,
        assignments: Mapping[str, AssignmentEntry],
        stops: Mapping[str, StopOrder],
        orders: Mapping[str, PowerOrder],
    ) -> int:
        """Make every desired document hold exactly the fleet's entries for its node (at
        start, over what SQLite restored): writes only what differs; returns how many."""
        want: dict[str, tuple[dict[str, AssignmentEntry], dict[str, StopOrder]]] = {}
        for task_id, entry in assignments.items():
            if entry.node:
                want.setdefault(entry.node, ({}, {}))[0][task_id] = entry
        for key, order in stops.items():
            node_id = key.rpartition("@")[2]
            if node_id:
                want.setdefault(node_id, ({}, {}))[1][key] = order
        before = self.writes
        for node_id in sorted(set(want) | set(self.docs) | set(orders)):
            held_a, held_s = want.get(node_id, ({}, {}))
            doc = self.doc(node_id)
            with doc.doc.transaction():  # one update per document
                self._match_one(node_id, held_a, held_s, orders.get(node_id))
            if self.freezer is not None:
                doc.freeze()  # one live at a time: the node's first step 1 thaws it
        return self.writes - before

    def _match_one(
        self,
        node_id: str,
        held_a: Mapping[str, AssignmentEntry],
        held_s: Mapping[str, StopOrder],
        standing: PowerOrder | None,
    ) -> None:
        """Make node ``node_id``'s document hold exactly these entries."""
        doc = self.doc(node_id)
        doc.packed = self.reads_packed(node_id)
        # decoded one by one and kept nowhere: a decoded view cached in every desired
        # document would hold a second copy of the fleet's assignments
        have_a = dict(doc.each("assignments", AssignmentEntry))
        for task_id in sorted(set(have_a) - set(held_a)):
            doc.drop_assignment(task_id)
            self.writes += 1
        for task_id, entry in sorted(held_a.items()):
            if have_a.get(task_id) != entry:
                doc.assign(task_id, entry)
                self.writes += 1
        have_s = dict(doc.each("stops", StopOrder))
        for key in sorted(set(have_s) - set(held_s)):
            task_id, _, stop_node = key.rpartition("@")
            doc.drop_stop(task_id, stop_node)
            self.writes += 1
        for key, order in sorted(held_s.items()):
            if have_s.get(key) != order:
                task_id, _, stop_node = key.rpartition("@")
                doc.order_stop(task_id, stop_node, order)
                self.writes += 1
        if doc.power_order(node_id) != standing:
            self.power(node_id, standing)
