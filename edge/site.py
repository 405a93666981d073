"""A site member's part in site autonomy: its peers' documents and liveness, the vote, the plan.

A node with ``[edge] site_peers`` is a member of a site: the nodes behind one site broker
(bridged to central's). While central is unreachable the live members elect a coordinator by
the pure rule of :mod:`edgesched.core.site`, and the coordinator runs the core over the whole
site. Everything a member says of the site it writes in **its own node document** (the
``site``, ``site_orders``, ``site_stops`` and ``site_specs`` maps of
:class:`~edgesched.sync.doc.NodeDoc`): its vote, its lease while it coordinates, the peers it
sees, the coordinator's orders, and the specs of its tasks a peer may need. So the site's shared
state is the union of its members' documents, each with one writer, authorship checked per
operation as for any node document: no member can write another's vote or forge its orders,
and the documents rotate (epochs), so the site's churn does not grow them for ever (a
multi-writer document never rotates). Central replicates every node document already, so it
reads the site's decisions after a heal without anything more.

:class:`SitePresence` follows the peers' retained status (``node/<peer>/status``: ``online``
on connect, the broker's ``offline`` last will when the connection dies) on the site broker;
:class:`SiteMember` holds a read-only replica of each peer's node document (synced on the site
broker, persisted in the node's SQLite so a member restarted during a cut still knows its
dead peers' replicas) and turns the rule's answers into entries of our document and into
:class:`SiteActions` for the engine to carry out under its lock.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.core.model import Node, Placement, Resources, Task
from edgesched.core.policy import PolicyConfig
from edgesched.core.site import (
    SITE_PREFIX,
    Copy,
    MemberState,
    Offer,
    SiteOrder,
    Term,
    acting_term,
    followed_term,
    next_vote,
    plan_site,
)
from edgesched.core.task import Assignment, RestartPolicy, TaskRecord, TaskSpec, TaskState
from edgesched.sync.doc import NodeDoc, SiteNodeDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.reconcile import Claim, winner
from edgesched.sync.schema import (
    SchemaError,
    SiteLease,
    SiteOrderEntry,
    SiteSeen,
    SiteSpec,
    SiteStop,
    SiteVote,
    TaskReport,
)
from edgesched.sync.signing import FrameSigning
from edgesched.sync.store import Store
from edgesched.sync.topics import status_topic

log = logging.getLogger("edgesched.edge.site")

_RUNS = frozenset({TaskState.RUNNING, TaskState.PLACED})


class SitePresence:
    """The site peers' liveness, from their retained status on the site broker: a channel of
    the node's MQTT session. A peer is live while its status says ``online`` and our own
    connection is up (without it we see nobody: we are alone)."""

    def __init__(self, peers: Collection[str], clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.peers = tuple(sorted(peers))
        self._topics = {status_topic(p): p for p in self.peers}
        self.routes: tuple[str, ...] = tuple(self._topics)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = tuple(
            (t, SubscribeOptions(qos=1)) for t in self._topics
        )
        self.connected = False
        self._online: dict[str, bool] = {}
        started = clock()
        #: peer -> since when (our clock) we have not seen it live
        self.down_since: dict[str, float] = dict.fromkeys(self.peers, started)
        self.rejected = 0

    def live(self) -> frozenset[str]:
        if not self.connected:
            return frozenset()
        return frozenset(p for p, up in self._online.items() if up)

    async def serve(self, client: aiomqtt.Client) -> None:
        self.connected = True

    def disconnected(self) -> None:
        now = self.clock()
        for peer, up in self._online.items():
            if up:
                self.down_since[peer] = now
        self._online.clear()
        self.connected = False

    def handle(self, topic: str, payload: bytes) -> None:
        peer = self._topics.get(topic)
        if peer is None:
            return
        try:
            status = json.loads(payload)
            state = status["state"] if isinstance(status, dict) else None
        except (ValueError, KeyError, TypeError):
            state = None
        if state not in ("online", "offline"):
            self.rejected += 1
            log.warning("dropped a malformed status of site peer %s: %r", peer, payload[:64])
            return
        up = state == "online"
        was = self._online.get(peer, False)
        self._online[peer] = up
        if was and not up:
            self.down_since[peer] = self.clock()
            log.warning("site peer %s went offline", peer)
        elif up and not was:
            log.info("site peer %s is online", peer)


@dataclass
class SiteActions:
    """What the engine does for the site at one cycle (under its lock)."""

    #: orders of our coordinator to run a task here: (spec, its assignment, why)
    take: list[tuple[TaskSpec, Assignment, str]] = field(default_factory=list)
    #: our offered submissions the coordinator gave back to us (schedule them here)
    take_back: list[str] = field(default_factory=list)
    #: our offered submissions running on a peer now: (task id, the peer) to cancel here
    handed: list[tuple[str, str]] = field(default_factory=list)
    #: our copies the coordinator ordered stopped: (task id, why)
    stop: list[tuple[str, str]] = field(default_factory=list)


class SiteMember:
    """This node's membership of its site (see the module docstring). Owned by the engine."""

    def __init__(
        self,
        me: str,
        peers: Sequence[str],
        *,
        client_id: int,
        centrals: Sequence[str],
        signing: FrameSigning | None,
        failover_after_s: float,
        offer_after_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.me = me
        self.peers = tuple(sorted(peers))
        self.members = tuple(sorted((me, *peers)))
        self.client_id = client_id
        self.centrals = tuple(centrals)
        self.signing = signing
        self.failover_after_s = failover_after_s
        self.offer_after_s = offer_after_s
        #: Offered submissions our coordinator gave back to us: not offered again (until
        #: central is back).
        self.taken_back: set[str] = set()
        self.clock = clock
        self.presence = SitePresence(self.peers, clock)
        self.replicas: dict[str, NodeDoc] = {}
        self._saved: dict[str, str] = {}
        self.acting: Term | None = None
        #: member -> its tasks as the coordinator uses them (see :meth:`_member`)
        self._cache: dict[str, _MemberTasks] = {}
        self._settled: object = None  # what the last settling looked at
        self.followed: Term | None = None
        #: called when this member begins a term as its site's coordinator (a metric)
        self.on_term: Callable[[Term], None] = lambda _term: None

    async def open(self, store: Store) -> None:
        """Our replicas of the peers' documents, as we last persisted them."""
        for peer in self.peers:
            doc = await SiteNodeDoc.load_from(store, f"node-{peer}", self.client_id)
            self.replicas[peer] = doc
            self._saved[peer] = doc.content_hash()

    async def persist(self, store: Store) -> None:
        """Keep each replica that changed in SQLite (a member restarted while the site is cut
        off still knows what its dead peers ran)."""
        for peer, doc in self.replicas.items():
            digest = doc.content_hash()
            if digest != self._saved.get(peer):
                await doc.persist_to(store)
                self._saved[peer] = digest

    def channels(self) -> list[SitePresence | DocPeer]:
        """The session channels: the peers' status, and a read-only peer of each one's
        document that hears only that peer (and the centrals), answered on our reply topic."""
        out: list[SitePresence | DocPeer] = [self.presence]
        for peer, doc in sorted(self.replicas.items()):
            out.append(
                DocPeer(
                    doc,
                    self.me,
                    writers=frozenset({client_id_for(peer)}),
                    relays=self.centrals,
                    listen_to=(peer, *self.centrals),
                    signing=self.signing,
                )
            )
        return out

    def doc_of(self, node: str, own: NodeDoc) -> NodeDoc | None:
        return own if node == self.me else self.replicas.get(node)

    def states(self, own: NodeDoc) -> dict[str, MemberState]:
        out = {}
        for member in self.members:
            doc = self.doc_of(member, own)
            if doc is None:
                continue
            vote, lease = doc.site_vote(), doc.site_lease()
            out[member] = MemberState(
                None if vote is None else Term(vote.epoch, vote.holder),
                None if lease is None else lease.epoch,
            )
        return out

    # --- the election ---------------------------------------------------------------------

    def elect(self, own: NodeDoc, now: float, autonomous: bool) -> None:
        """Cast our vote, take or drop the lease, note whom we follow (our document's ``site``
        map, written only when it changes). Not ``autonomous`` (central is live): no
        coordinator, our lease and our orders dropped."""
        live = self.presence.live()
        if not autonomous:
            self.acting = self.followed = None
            own.set_site_entry("lease", None)
            own.drop_site_keys("site_orders", list(own.site_orders()))
            own.drop_site_keys("site_stops", list(own.site_stops()))
            self._see(own, live, now)
            return
        states = self.states(own)
        vote = next_vote(self.me, self.members, live, states)
        if vote is not None:
            own.set_site_entry("vote", SiteVote(vote.epoch, vote.holder, now))
            states[self.me] = MemberState(vote, states.get(self.me, MemberState()).acting)
            log.warning("site: voting for %s at epoch %d", vote.holder, vote.epoch)
        acting = acting_term(self.me, self.members, live, states)
        lease = own.site_lease()
        if acting is None:
            if lease is not None:
                log.warning("site: no longer coordinating (epoch %d)", lease.epoch)
                own.set_site_entry("lease", None)
        else:
            members = tuple(sorted(live | {self.me}))
            if lease is None or lease.epoch != acting.epoch:
                log.warning("site: coordinating at epoch %d over %s", acting.epoch, members)
                self.on_term(acting)
                # a new term: the orders of our older terms are void
                orders, stops = own.site_orders(), own.site_stops()
                own.drop_site_keys(
                    "site_orders", [t for t, o in orders.items() if o.term != acting.epoch]
                )
                own.drop_site_keys("site_stops", [k for k, x in stops.items()
                                                  if x.term != acting.epoch])  # fmt: skip
                own.set_site_entry("lease", SiteLease(acting.epoch, now, members))
            elif lease.members != members:
                own.set_site_entry("lease", SiteLease(acting.epoch, lease.since, members))
        states[self.me] = MemberState(
            states.get(self.me, MemberState()).vote, None if acting is None else acting.epoch
        )
        self.acting = acting
        self.followed = followed_term(self.me, live, states)
        self._see(own, live, now)

    def _see(self, own: NodeDoc, live: frozenset[str], now: float) -> None:
        followed = self.followed
        seen = own.site_seen()
        peers = tuple(sorted(live))
        coordinator = "" if followed is None else followed.holder
        epoch = 0 if followed is None else followed.epoch
        if seen is None or (seen.peers, seen.coordinator, seen.epoch) != (
            peers,
            coordinator,
            epoch,
        ):
            own.set_site_entry("seen", SiteSeen(peers, coordinator, epoch, now))

    # --- the coordinator ------------------------------------------------------------------

    def _member(self, member: str, doc: NodeDoc) -> _MemberTasks:
        """What ``member``'s document says of its tasks, kept until its task or spec map
        changes (the decoded views are new objects then): a cycle where nothing changed costs
        a lookup per member, not a walk of every report (bench/bench_site_coordinator.py)."""
        tasks, specs = doc.tasks(), doc.site_specs()
        hit = self._cache.get(member)
        if hit is not None and hit.tasks is tasks and hit.specs is specs:
            return hit
        fresh = _MemberTasks.of(member, tasks, specs)
        self._cache[member] = fresh
        return fresh

    def plan(self, own: NodeDoc, node: Node, now: float, policy: PolicyConfig) -> int:
        """As the acting coordinator: order what needs a node (a dead member's replicas after
        the failover time, offered submissions) and settle tasks running on two members.
        Writes the orders into our document; returns how many it gave. The core runs only
        when something needs a node, and the settling only when a live member's tasks
        changed."""
        term = self.acting
        if term is None:
            return 0
        live = self.presence.live() & set(self.peers)
        docs = {m: d for m in self.members if (d := self.doc_of(m, own)) is not None}
        held = {m: self._member(m, d) for m, d in docs.items()}
        usable = {self.me} | {p for p in live if p in held}
        dead = {p: self.presence.down_since[p] for p in self.peers if p not in live}
        standing = {
            t: SiteOrder(t, o.node, o.origin, o.term, o.epoch, o.replacement, o.score, o.at,
                         o.reason)
            for t, o in own.site_orders().items()
            if o.term == term.epoch
        }  # fmt: skip
        # What may need a node: the replicas of members dead long enough, the offers.
        wanted: set[str] = set()
        for member, since in dead.items():
            if member in held and now - since > self.failover_after_s:
                wanted |= {
                    t for t in held[member].movable if not any(t in held[m].active for m in usable)
                }
        offers = [o for m in sorted(usable) for o in held[m].offers]
        wanted |= {o.task.id for o in offers}
        orders = 0
        if wanted - {t for t, o in standing.items() if o.node in usable}:
            orders = self._place(own, term, node, docs, held, usable, dead, standing, offers,
                                 wanted, now, policy)  # fmt: skip
        signature = (term, tuple(sorted((m, id(held[m])) for m in usable)))
        if signature != self._settled:
            self._settled = signature
            self._settle(own, term, {m: held[m] for m in usable}, now)
        return orders

    def _place(
        self,
        own: NodeDoc,
        term: Term,
        node: Node,
        docs: Mapping[str, NodeDoc],
        held: Mapping[str, _MemberTasks],
        usable: Collection[str],
        dead: Mapping[str, float],
        standing: Mapping[str, SiteOrder],
        offers: Sequence[Offer],
        wanted: Collection[str],
        now: float,
        policy: PolicyConfig,
    ) -> int:
        nodes = [node]
        for peer in sorted(usable):
            if peer == self.me:
                continue
            registration = docs[peer].registration()
            if registration is None:
                continue
            try:
                nodes.append(registration.to_node(peer))
            except SchemaError:
                continue
        ids = set(wanted) | set(standing)
        copies = {t: [c for m in held.values() if (c := m.copies.get(t)) is not None]
                  for t in sorted(ids)}  # fmt: skip
        running = [p for m in sorted(usable) for p in held[m].running]
        result = plan_site(
            term,
            nodes,
            {t: group for t, group in copies.items() if group},
            offers,
            standing,
            dead_since=dead,
            now=now,
            failover_after_s=self.failover_after_s,
            policy=policy,
            running=running,
        )
        for order in result.orders:
            own.put_site_order(
                order.task_id,
                SiteOrderEntry(
                    node=order.node,
                    origin=order.origin,
                    term=order.term,
                    epoch=order.epoch,
                    replacement=order.replacement,
                    score=round(order.score, 6),
                    at=order.at,
                    reason=order.reason,
                ),
            )
            log.warning("site: %s", order.reason)
        return len(result.orders)

    def _settle(
        self, own: NodeDoc, term: Term, held: Mapping[str, _MemberTasks], now: float
    ) -> None:
        """A task running on two live members (a dead member came back with it, or an order
        crossed an offer's take-back): the reconcile rule's winner keeps it, the others get a
        stop order, as central's would."""
        seen: dict[str, int] = {}
        for tasks in held.values():
            for task_id in tasks.claims:
                seen[task_id] = seen.get(task_id, 0) + 1
        stops = own.site_stops()
        for task_id in sorted(t for t, n in seen.items() if n > 1):
            group = [c for m in held.values() if (c := m.claims.get(task_id)) is not None]
            best = winner(group)
            for loser in group:
                key = f"{task_id}@{loser.node_id}"
                if loser.node_id == best.node_id or key in stops:
                    continue
                own.put_site_stop(
                    task_id,
                    loser.node_id,
                    SiteStop(term.epoch, loser.epoch, best.node_id, now,
                             f"site {term.holder}@{term.epoch}: {best.node_id} keeps it"),
                )  # fmt: skip
                log.warning("site: %s runs on %s and %s: %s keeps it", task_id,
                            best.node_id, loser.node_id, best.node_id)  # fmt: skip

    # --- a member following its coordinator -----------------------------------------------

    def actions(self, own: NodeDoc, records: Mapping[str, TaskRecord]) -> SiteActions:
        """What our coordinator's orders ask of us now (``records``: our tasks by id)."""
        out = SiteActions()
        out.handed = self._taken_by_peers(records)
        term = self.followed
        if term is None:
            return out
        coordinator = self.doc_of(term.holder, own)
        if coordinator is None:
            return out
        mine = own.site_specs()
        for task_id, order in sorted(coordinator.site_orders().items()):
            if order.term != term.epoch:
                continue  # an older term's: fenced
            record = records.get(task_id)
            offered = mine.get(task_id)
            if order.origin == self.me and offered is not None and offered.offered:
                if order.node == self.me:
                    out.take_back.append(task_id)
                else:
                    pass  # handed over once the target reports it (_taken_by_peers)
                continue
            if order.node != self.me or (record is not None and not record.state.terminal):
                continue  # not ours, or we hold a copy (the stop orders settle two)
            origin = self.doc_of(order.origin, own)
            spec_entry = None if origin is None else origin.site_specs().get(task_id)
            if spec_entry is None or spec_entry.spec.id != task_id:
                continue  # its spec has not reached us yet
            assignment = Assignment(
                f"{SITE_PREFIX}{term.holder}", order.epoch, order.replacement, order.score
            )
            out.take.append((spec_entry.spec, assignment, order.reason))
        for key, stop in sorted(coordinator.site_stops().items()):
            task_id, _, node = key.rpartition("@")
            if node != self.me or stop.term != term.epoch:
                continue
            record = records.get(task_id)
            if (
                record is not None
                and not record.state.terminal
                and record.assignment is not None
                and record.assignment.epoch == stop.epoch
            ):
                out.stop.append((task_id, stop.reason))
        return out

    def _taken_by_peers(self, records: Mapping[str, TaskRecord]) -> list[tuple[str, str]]:
        """Our local submissions (no assignment) a live peer reports running under a site
        order: handed over, whether or not we still follow the coordinator that ordered it
        (it may be gone by the time the peer reports), so they never run twice."""
        local = {t for t, r in records.items() if not r.state.terminal and r.assignment is None}
        out = []
        for peer in sorted(self.presence.live()):
            doc = self.replicas.get(peer)
            if doc is None or not local:
                continue
            tasks = self._member(peer, doc)
            for task_id in sorted(local & tasks.active):
                claim = tasks.claims.get(task_id)
                if claim is not None and claim.decided_by.startswith(SITE_PREFIX):
                    out.append((task_id, peer))
                    local.discard(task_id)
        return out

    def offers(self, records: Mapping[str, TaskRecord], now: float, autonomous: bool) -> set[str]:
        """Our local submissions to offer to the site now: queued, no assignment, waiting
        ``offer_after_s`` or longer, not given back to us, while we follow a coordinator
        (none while central is live, and what was given back may be offered again later)."""
        if not autonomous:
            self.taken_back.clear()
            return set()
        if self.followed is None:
            return set()
        return {
            r.spec.id
            for r in records.values()
            if r.state is TaskState.ACCEPTED
            and r.assignment is None
            and r.spec.id not in self.taken_back
            and now - r.submitted_at >= self.offer_after_s
        }

    def keep_specs(
        self, own: NodeDoc, records: Mapping[str, TaskRecord], offer: Collection[str]
    ) -> None:
        """Our ``site_specs``: each active service replica's spec (a peer restarts it if we
        die while the site is cut off), ``offer``'s as offered; the rest dropped."""
        want: dict[str, SiteSpec] = {}
        current = own.site_specs()
        for task_id, record in records.items():
            if record.state.terminal:
                continue
            if task_id in offer:
                want[task_id] = SiteSpec(record.spec, offered=True)
            elif record.spec.restart is RestartPolicy.ALWAYS:
                want[task_id] = SiteSpec(record.spec)
        own.drop_site_keys("site_specs", [t for t in current if t not in want])
        for task_id, entry in want.items():
            own.put_site_spec(task_id, entry)

    def offered(self, own: NodeDoc) -> frozenset[str]:
        return frozenset(t for t, e in own.site_specs().items() if e.offered)


@dataclass(frozen=True)
class _MemberTasks:
    """One member's tasks as the coordinator uses them, built from its decoded task and spec
    maps (``tasks``, ``specs``: the views it was built from, to tell when to build it again)."""

    tasks: Mapping[str, TaskReport]
    specs: Mapping[str, SiteSpec]
    active: frozenset[str]  # its active tasks
    movable: frozenset[str]  # active service replicas whose spec it published
    copies: Mapping[str, Copy]  # task id -> its copy, for every active task
    running: tuple[Placement, ...]  # what holds its resources
    offers: tuple[Offer, ...]  # its offered submissions, still queued
    claims: Mapping[str, Claim]  # its active copies that follow an assignment

    @classmethod
    def of(cls, member: str, tasks: Mapping[str, TaskReport],
           specs: Mapping[str, SiteSpec]) -> _MemberTasks:  # fmt: skip
        active: set[str] = set()
        movable: set[str] = set()
        copies: dict[str, Copy] = {}
        running: list[Placement] = []
        offers: list[Offer] = []
        claims: dict[str, Claim] = {}
        for task_id, report in tasks.items():
            if not report.active:
                continue
            active.add(task_id)
            entry = specs.get(task_id)
            task = _task(task_id, report, entry)
            if entry is not None and entry.offered and report.state is TaskState.ACCEPTED:
                offers.append(Offer(task, member))
                continue
            runs = report.state in _RUNS
            if (
                entry is not None
                and not entry.offered
                and entry.spec.restart is RestartPolicy.ALWAYS
            ):
                movable.add(task_id)
            a = report.assignment
            copies[task_id] = Copy(task, member, runs, 0 if a is None else a.epoch,
                                   task_id in movable)  # fmt: skip
            if runs:
                running.append(Placement(task, member, task.submitted_at))
            if a is not None:
                started = report.started_at if report.started_at is not None else report.updated_at
                claims[task_id] = Claim(task_id, member, a.epoch, a.central, started,
                                        a.score if math.isfinite(a.score) else 0.0,
                                        a.replacement, runs)  # fmt: skip
        return cls(tasks, specs, frozenset(active), frozenset(movable), copies,
                   tuple(running), tuple(offers), claims)  # fmt: skip


def _task(task_id: str, report: TaskReport, entry: SiteSpec | None) -> Task:
    """The core's task of a member's report (its spec's, with its constraints, if we have it)."""
    if entry is not None and entry.spec.id == task_id:
        return entry.spec.to_task(report.accepted_at)
    return Task(
        id=task_id,
        workload=report.workload,
        priority=report.priority,
        demand=Resources.shared(report.cpu, report.mem_gib, report.accel),
        submitted_at=report.updated_at,
    )
