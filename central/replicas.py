"""Central's fan-in: a replica of every node's document, vetted, persisted, discovered live.

Central subscribes once to every document's sync topic (``edgesched/v1/doc/+/sync/+``) as the
session's fallback channel. A message for a node document central does not hold yet
(``node-<id>``) creates the replica, but only when it comes from ``<id>`` itself on its own
topic (the broker's ACL guarantees that only ``<id>`` publishes there) and, if central was
given a node list, only for a listed node. Each replica then gets its own
:class:`~edgesched.sync.peer.DocPeer` channel (it subscribes nothing: the wildcard carries its
messages) that

* accepts a message only from the node's own topic with the node's fixed client id in the
  frame header (:func:`edgesched.sync.security.accept_sender`), or from a fellow central;
* applies an update only if every operation in it is the node's (``writers``), so nobody
  can author content in another node's document, not even by relaying it;
* follows the node's document epochs.

Replicas are caches of what the nodes hold (a node's document is rebuilt from the node's own
SQLite, and every reconnect resyncs by state vector), so they are written to central's SQLite
every ``snapshot_s`` when they changed rather than per update: a central restart loses
nothing that the next resync does not bring back. A pass appends the remote updates each
replica applied since it was last written to its log (:meth:`SyncedDoc.log_remote_updates`,
one store call for all of them), and writes a whole snapshot (folding the log) only when the
log reaches half the last snapshot's bytes, after a new epoch or a dropped replica, or when
the log cannot be used. Writing a ~29 KB snapshot for each change of a node's tasks wrote
~8 MB/s to SQLite at 10,000 nodes (~0.7 TB a day); ``bench/bench_replica_persistence.py``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.freezer import Freezer
from edgesched.sync.pacer import ResyncPacer
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import NodeView
from edgesched.sync.security import sender_check
from edgesched.sync.session import Listener, MqttSession
from edgesched.sync.signing import FrameSigning
from edgesched.sync.store import Store, StoreError
from edgesched.sync.topics import DOC_SYNC_FILTER
from edgesched.sync.wire import TOPIC_ROOT

log = logging.getLogger("edgesched.central.replicas")

NODE_DOC_PREFIX = "node-"
#: A snapshot pass writes its replicas in transactions of up to this many bytes or documents:
#: one commit for many, and short enough that a journal waiting for the store (the fleet's:
#: a submission waits for it) is not held behind a long one. 2 MiB took 14 ms on an idle
#: machine, but up to 325 ms in the thread while a heal saturated central (run 78).
SNAPSHOT_BATCH_BYTES = 512 << 10
SNAPSHOT_BATCH_DOCS = 64


def _batch_full(size: int, docs: int) -> bool:
    """Whether a store call's batch (snapshots, or appended runs) is due to be written."""
    return size >= SNAPSHOT_BATCH_BYTES or docs >= SNAPSHOT_BATCH_DOCS


def parse_sync_topic(topic: str) -> tuple[str, str] | None:
    """``edgesched/v1/doc/<doc>/sync/<sender>`` → ``(doc, sender)``; else None."""
    parts = topic.split("/")
    if len(parts) != 6 or f"{parts[0]}/{parts[1]}" != TOPIC_ROOT:
        return None
    if parts[2] != "doc" or parts[4] != "sync" or not parts[3] or not parts[5]:
        return None
    return parts[3], parts[5]


@dataclass
class Replica:
    """One node's document as central holds it, with its peer and persistence bookkeeping."""

    node_id: str
    doc: NodeDoc
    peer: DocPeer
    first_seen: float
    #: (epoch, blake2b of the snapshot) last written to SQLite (b"": as loaded, not hashed)
    persisted: tuple[int, bytes] = (-1, b"")
    changed_at: float = field(default=0.0)
    #: Bumped by every change; ``saved`` is its value when last written (or loaded), so a
    #: snapshot pass looks only at replicas that moved (not a content hash of each).
    changes: int = 0
    saved: int = 0
    #: The remote updates applied since the store last took this replica (in order), the
    #: bytes logged since its last snapshot (these and those already appended), and whether
    #: the next write must be a whole snapshot (the store's state is not known to be this
    #: replica's minus ``log``: none written yet, a new epoch, a dropped replica, a failed
    #: write).
    log: list[bytes] = field(default_factory=list)
    log_bytes: int = 0
    #: bytes of the snapshot the store holds (0: none written by us yet: the first write is
    #: a snapshot)
    stored_bytes: int = 0
    whole_next: bool = True

    def fold_at(self) -> float:
        """Log bytes past which the next pass writes this replica whole."""
        return max(MIN_FOLD_BYTES, FOLD_SHARE * self.stored_bytes)

    def logged(self, update: bytes) -> None:
        """A remote update applied (:meth:`SyncedDoc.log_remote_updates`). One that changed
        nothing is logged too (pycrdt may hold it pending for a dependency), and moves no
        change count: a node resending the same update without end would grow the log in
        memory until its next change, so past twice the fold the log is dropped and the
        replica written whole instead."""
        if self.whole_next:
            return
        self.log.append(update)
        self.log_bytes += len(update)
        if self.log_bytes > 2 * self.fold_at():
            self.restart_log()

    def restart_log(self, _epoch: int = 0) -> None:
        """What was logged no longer continues the store's state: a snapshot next."""
        self.log = []
        self.log_bytes = 0
        self.whole_next = True


#: A pass writes a replica whole, folding its log, once the log holds this share of the last
#: snapshot's bytes (and at least :data:`MIN_FOLD_BYTES`): a change appends ~0.3-1 KB
#: where a snapshot of a node of 100 tasks is ~29 KB.
FOLD_SHARE = 0.5
MIN_FOLD_BYTES = 4096


class NodeReplicas(Listener):
    """The replica set and the fallback channel that discovers new node documents."""

    def __init__(
        self,
        central_id: str,
        session: MqttSession,
        *,
        store: Store | None = None,
        nodes: Collection[str] = (),
        centrals: Collection[str] = (),
        clock: Callable[[], float] = time.time,
        freezer: Freezer | None = None,
        pacer: ResyncPacer | None = None,
        signing: FrameSigning | None = None,
    ) -> None:
        """``nodes``: accept only these node ids (empty: any node that speaks for itself).
        ``centrals``: fellow central replicas whose relayed messages are accepted too.
        ``freezer``: watches every replica's document (frozen while unused). ``pacer``:
        paces each replica peer's own step 1s (:mod:`edgesched.sync.pacer`)."""
        self.central_id = central_id
        self.client_id = client_id_for(central_id)
        self.session = session
        self.store = store
        self.allowed = frozenset(nodes)
        self.centrals = frozenset(centrals) | {central_id}
        self.clock = clock
        self.freezer = freezer
        self.pacer = pacer
        self.signing = signing  # every replica's peer signs and checks with it
        self.replicas: dict[str, Replica] = {}
        self.routes: tuple[str, ...] = (DOC_SYNC_FILTER,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (DOC_SYNC_FILTER, SubscribeOptions(qos=1, noLocal=True)),
        )
        self.stats: dict[str, int] = {"discovered": 0, "refused_unknown": 0, "ignored": 0}
        self.on_change: Callable[[str], None] | None = None

    # --- the fallback channel: messages for documents no replica routes yet -----------------

    def handle(self, topic: str, payload: bytes) -> None:
        parsed = parse_sync_topic(topic)
        if parsed is None or not parsed[0].startswith(NODE_DOC_PREFIX):
            self.stats["ignored"] += 1  # policy and site documents have channels of their own
            return
        doc_name, sender = parsed
        node_id = doc_name[len(NODE_DOC_PREFIX) :]
        if sender != node_id or (self.allowed and node_id not in self.allowed):
            self.stats["refused_unknown"] += 1
            log.warning("ignored %s: not the node itself, or not a node of this fleet", topic)
            return
        try:
            replica = self.add(node_id)
        except ValueError as exc:
            self.stats["refused_unknown"] += 1
            log.warning("ignored %s: %s", topic, exc)
            return
        self.stats["discovered"] += 1
        log.info("discovered node %s", node_id)
        replica.peer.handle(topic, payload)

    # --- the replica set ------------------------------------------------------------------

    def add(self, node_id: str, doc: NodeDoc | None = None) -> Replica:
        """Hold a replica of ``node-<node_id>`` (``doc``: one restored from SQLite)."""
        if node_id in self.replicas:
            return self.replicas[node_id]
        name = f"{NODE_DOC_PREFIX}{node_id}"
        doc = doc or NodeDoc(name, self.client_id)
        peer = DocPeer(
            doc,
            self.central_id,
            accept=sender_check(node_id, self.centrals),
            writers=frozenset({client_id_for(node_id)}),
            relays=self.centrals,  # another replica answers with the node's operations
            signing=self.signing,
            subscribe=False,  # the wildcard subscription carries its messages
            clock=self.clock,
            pacer=self.pacer,
            # alone, central is the only one asking the node for its document: a duplicate
            # step 2 of the node is then no sign of updates held pending
            sole_asker=self.centrals == {self.central_id},
        )
        replica = Replica(node_id, doc, peer, first_seen=self.clock())
        doc.track_changes("tasks")  # for central's fleet index, the one consumer
        doc.on_remote_change(lambda _sender: self._changed(node_id))
        doc.on_epoch_change(replica.restart_log)  # (first: before the change is counted)
        doc.on_epoch_change(lambda _epoch: self._changed(node_id))
        if self.store is not None:
            doc.log_remote_updates(replica.logged)
        peer.on_synced = lambda _sender: self._synced(node_id)
        self.replicas[node_id] = replica
        self.session.add(peer)
        if self.freezer is not None:
            self.freezer.watch(doc)
        return replica

    def _changed(self, node_id: str) -> None:
        replica = self.replicas.get(node_id)
        if replica is not None:
            replica.changed_at = self.clock()
            replica.changes += 1
        if self.on_change is not None:
            self.on_change(node_id)

    def _synced(self, node_id: str) -> None:
        """A full answer from the node arrived: its replica may be fresh again, even when the
        answer changed nothing."""
        if self.on_change is not None:
            self.on_change(node_id)

    def views(self) -> dict[str, NodeView]:
        """node id -> its document's content, typed (each decoded once per change, by the
        document class's own cache)."""
        return {n: r.doc.typed() for n, r in self.replicas.items()}

    async def load(self, learned: Callable[[str], None] | None = None) -> int:
        """Restore every node replica kept in SQLite; returns how many. ``learned(node_id)``
        runs after each one (the index reads it then: it may be frozen next)."""
        if self.store is None:
            return 0
        count = 0
        for name in await self.store.doc_names():
            if not name.startswith(NODE_DOC_PREFIX):
                continue
            node_id = name[len(NODE_DOC_PREFIX) :]
            if self.allowed and node_id not in self.allowed:
                continue
            doc = await NodeDoc.load_from(self.store, name, self.client_id)
            replica = self.add(node_id, doc)
            replica.persisted = (doc.epoch, b"")  # (its first write is whole: whole_next)
            count += 1
            if learned is not None:
                learned(node_id)
            elif self.on_change is not None:
                self.on_change(node_id)  # (the index learns of restored replicas)
        return count

    async def persist_changed(self) -> int:
        """Write every replica that moved since it was last written: the updates it applied
        appended to its log, all replicas' in one store call, or, where its log is due to
        be folded or cannot continue the store's state, a whole snapshot, many per store
        transaction (:meth:`Store.replace_docs`: one commit and one fsync a batch, not one
        a replica, which left central's other writers, the fleet journal first, waiting
        behind thousands of commits every pass); returns how many replicas were written.

        A write that fails or is cancelled leaves each of its replicas to be written whole
        at the next pass (what it had logged since would continue no stored state)."""
        if self.store is None:
            return 0
        written = 0
        batch: list[tuple[Replica, bytes, int, bytes]] = []
        size = 0
        runs: dict[str, tuple[Replica, list[bytes]]] = {}
        taken: dict[int, Replica] = {}  # (by id) taken from, not yet written or refused
        try:
            for replica in [r for r in self.replicas.values() if r.changes != r.saved]:
                replica.saved = replica.changes
                if not replica.whole_next and replica.log_bytes < replica.fold_at():
                    if replica.log:  # (log_bytes counts them on, in the store's log now)
                        runs[replica.doc.name] = (replica, replica.log)
                        replica.log = []
                        replica.persisted = (-1, b"")  # the store's state is no snapshot now
                        taken[id(replica)] = replica
                    continue
                snapshot = replica.doc.snapshot()
                replica.log, replica.log_bytes = [], 0
                replica.whole_next = False  # (what applies from here continues this snapshot)
                now = (replica.doc.epoch, hashlib.blake2b(snapshot, digest_size=16).digest())
                if now == replica.persisted:
                    continue  # (changed, then changed back; or an epoch's no-op)
                batch.append((replica, snapshot, *now))
                taken[id(replica)] = replica
                size += len(snapshot)
                if _batch_full(size, len(batch)):
                    written += await self._write_batch(batch)  # (the loop turns meanwhile)
                    for done, *_ in batch:
                        del taken[id(done)]
                    batch, size = [], 0
            if batch:
                written += await self._write_batch(batch)
            if runs:
                written += await self._append_runs(runs)
            taken = {}
        finally:
            for replica in taken.values():  # (cancelled: central stopping, say)
                replica.restart_log()
                replica.saved = -1
        return written

    async def _append_runs(self, runs: dict[str, tuple[Replica, list[bytes]]]) -> int:
        """Append each replica's run of updates to its log, a store call per
        :data:`SNAPSHOT_BATCH_BYTES` or :data:`SNAPSHOT_BATCH_DOCS` (all of a pass in one call
        ran up to 119 ms in the store's thread during a heal, run 79, the fleet journal
        waiting); on a store error each replica of the call is written whole at the next pass
        instead (its run is not kept)."""
        written = 0
        group: dict[str, tuple[Replica, list[bytes]]] = {}
        size = 0
        for name, run in runs.items():
            group[name] = run
            size += sum(len(u) for u in run[1])
            if _batch_full(size, len(group)):
                written += await self._append_group(group)
                group, size = {}, 0
        if group:
            written += await self._append_group(group)
        return written

    async def _append_group(self, runs: dict[str, tuple[Replica, list[bytes]]]) -> int:
        assert self.store is not None
        try:
            done = await self.store.append_updates(
                {name: run for name, (_, run) in runs.items()},
                epochs={name: replica.doc.epoch for name, (replica, _) in runs.items()},
            )
        except StoreError as exc:
            log.error("%d node replicas' updates not saved: %s", len(runs), exc)
            for replica, _ in runs.values():
                replica.restart_log()
                replica.saved = -1
            return 0
        for name, (replica, _) in runs.items():
            if name not in done:
                log.error(
                    "replica of %s: updates not saved: the store holds another epoch than "
                    "its %d (written whole next pass)",
                    replica.node_id,
                    replica.doc.epoch,
                )
                replica.restart_log()
                replica.saved = -1
        return len(done)

    async def _write_batch(self, batch: list[tuple[Replica, bytes, int, bytes]]) -> int:
        assert self.store is not None
        try:
            refused = set(
                await self.store.replace_docs([(r.doc.name, s, e) for r, s, e, _ in batch])
            )
        except StoreError as exc:  # a full disk, say: all of them again next pass
            log.error("%d node replicas not saved: %s", len(batch), exc)
            for replica, *_ in batch:
                replica.restart_log()  # (what was logged since continues no stored state)
                replica.saved = -1
            return 0
        for replica, snapshot, epoch, digest in batch:
            if replica.doc.name in refused:
                log.error(
                    "replica of %s not saved: the store holds a newer epoch than its %d",
                    replica.node_id,
                    epoch,
                )
                replica.restart_log()
                replica.saved = -1  # try again next pass
                continue
            replica.doc.stored_as(snapshot, epoch)
            replica.persisted = (epoch, digest)
            replica.stored_bytes = len(snapshot)
        return len(batch) - len(refused)
