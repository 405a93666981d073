"""Central's site index: each autonomous site, its members, and what their documents say of it.

A member of a site (a node with ``[edge] site_peers``: :mod:`edgesched.edge.site`) writes in
its own node document a ``site`` map: its ``vote`` (the coordinator it votes for, at an
epoch), its ``lease`` while it coordinates the site cut off from central, and what it
``seen``: the site peers it sees live on the site broker and the coordinator it follows. A
task a site's coordinator placed is reported by the node that runs it with ``decided_by``
``site:<coordinator>``. Central replicates every node document already; this index keeps, per
site (the site each member registered), those entries and those decisions, so that
``GET /v1/sites`` and the dashboard answer from it without reading any document:

* :meth:`SiteIndex.learn` is called for each node whose replica changed, where central's
  fleet index learns it (:meth:`edgesched.central.engine.CentralEngine._learn_node`). The
  ``site`` root is read again only when its version moved
  (:meth:`~edgesched.sync.doc.SyncedDoc.root_version`: O(1), no thaw of a frozen replica), and
  only the task reports that changed are looked at (the fleet index's own decoded copies): an
  update costs O(1) plus O(the tasks it changed), never a walk of the fleet.
* the site decisions are kept per site in the order they were taken (when the node accepted
  them), so the newest are read off the end: :meth:`SiteIndex.view` costs O(the sites'
  members + the decisions shown).

Reporting only: nothing here feeds central's liveness or failover. The *distributed health
check* of :meth:`SiteIndex.view` tells, for a member central sees offline, which members
central sees online report it live on their site broker (``seen.peers``): alive in its site,
cut off from central (its site's bridge, or its own link), not dead.

Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from edgesched.core.site import SITE_PREFIX
from edgesched.sync.doc import NodeDoc
from edgesched.sync.schema import Registration, SiteLease, SiteSeen, SiteVote, TaskReport

#: Decisions shown per site by default (``GET /v1/sites?decisions=``), and at most.
DECISIONS_SHOWN = 20
MAX_DECISIONS_SHOWN = 1000

#: A member's health as the site sees it: online at central; offline at central but reported
#: live by a member central sees online; offline and reported live by none of them.
CONNECTED, ALIVE_IN_SITE, UNCONFIRMED = "connected", "alive-in-site", "unconfirmed"
HEALTHS = (CONNECTED, ALIVE_IN_SITE, UNCONFIRMED)


@dataclass(frozen=True, slots=True)
class SiteDecision:
    """A task a site's coordinator placed, as the node running it reports it."""

    task_id: str
    node: str
    decided_by: str  # site:<coordinator>
    state: str
    epoch: int  # its placement epoch (the assignment the node follows)
    replacement: bool  # it failed the task over from a dead member
    at: float  # when the node accepted it

    @property
    def key(self) -> tuple[float, str, str]:
        return (self.at, self.task_id, self.node)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task_id,
            "node": self.node,
            "decided_by": self.decided_by,
            "coordinator": self.decided_by[len(SITE_PREFIX) :],
            "state": self.state,
            "epoch": self.epoch,
            "replacement": self.replacement,
            "at": self.at,
        }


def decision_of(task_id: str, node_id: str, report: TaskReport | None) -> SiteDecision | None:
    """The site decision a node's report of a task shows, or None (not a site's)."""
    if report is None or not report.decided_by.startswith(SITE_PREFIX):
        return None
    ref = report.assignment
    return SiteDecision(
        task_id=task_id,
        node=node_id,
        decided_by=report.decided_by,
        state=report.state.value,
        epoch=0 if ref is None else ref.epoch,
        replacement=False if ref is None else ref.replacement,
        at=report.accepted_at or report.updated_at,
    )


@dataclass(slots=True)
class SiteMember:
    """What one node's document says of its site, as the index last read it."""

    site: str | None = None  # the site it registered (None: no registration yet)
    vote: SiteVote | None = None
    lease: SiteLease | None = None
    seen: SiteSeen | None = None
    version: int = -1  # the document's ``site`` root version when last read
    decided: dict[str, SiteDecision] = field(default_factory=dict)  # task id -> decision

    @property
    def says(self) -> bool:
        """Whether it takes part in a site: any site entry, or a site's decision it runs."""
        return bool(self.vote or self.lease or self.seen or self.decided)


@dataclass(frozen=True, slots=True)
class MemberLiveness:
    """A node's liveness as central sees it (what ``GET /v1/nodes`` says of it)."""

    status: str  # online, offline, unknown
    state: str  # connected, suspect, partitioned, dead, unknown
    since: float | None


class SiteIndex:
    """site -> members -> their vote, lease, seen and the site decisions they run."""

    def __init__(self) -> None:
        self.members: dict[str, SiteMember] = {}  # every node learned
        self.sites: dict[str, set[str]] = {}  # site -> its members that say anything of it
        self._decisions: dict[str, SortedList[tuple[float, str, str]]] = {}
        #: ``site`` roots decoded since start (each a change of one: what the tests count)
        self.reads = 0

    def learn(
        self,
        node_id: str,
        doc: NodeDoc,
        registration: Registration | None,
        reports: Mapping[str, TaskReport],
        changed: Iterable[str] | None,
    ) -> None:
        """Node ``node_id``'s replica changed: ``changed`` are its task ids whose reports
        changed (None: any may have), ``reports`` its reports as central's fleet index holds
        them now. O(1) + O(changed)."""
        member = self.members.get(node_id)
        if member is None:
            member = self.members[node_id] = SiteMember()
        site = None if registration is None else registration.site
        if site != member.site:
            self._move(node_id, member, site)
        version = doc.root_version("site")
        if version != member.version:
            member.version = version
            member.vote, member.lease, member.seen = (
                doc.site_vote(),
                doc.site_lease(),
                doc.site_seen(),
            )
            self.reads += 1
        keys = set(reports) | set(member.decided) if changed is None else changed
        for task_id in keys:
            self._decided(
                node_id, member, task_id, decision_of(task_id, node_id, reports.get(task_id))
            )
        self._group(node_id, member)

    def _decided(
        self, node_id: str, member: SiteMember, task_id: str, decision: SiteDecision | None
    ) -> None:
        old = member.decided.get(task_id)
        if decision == old:
            return
        if old is not None:
            del member.decided[task_id]
            if member.site is not None:
                self._decisions[member.site].discard(old.key)
        if decision is not None:
            member.decided[task_id] = decision
            if member.site is not None:
                self._decisions.setdefault(member.site, SortedList()).add(decision.key)

    def _move(self, node_id: str, member: SiteMember, site: str | None) -> None:
        """The node registered another site: it and its decisions go there."""
        if member.site is not None:
            group = self.sites.get(member.site)
            if group is not None:
                group.discard(node_id)
                if not group:
                    del self.sites[member.site]
            listed = self._decisions.get(member.site)
            if listed is not None:
                for decision in member.decided.values():
                    listed.discard(decision.key)
                if not listed:
                    del self._decisions[member.site]
        member.site = site
        if site is not None and member.decided:
            listed = self._decisions.setdefault(site, SortedList())
            listed.update(d.key for d in member.decided.values())

    def _group(self, node_id: str, member: SiteMember) -> None:
        site = member.site
        if site is None:
            return
        if member.says:
            self.sites.setdefault(site, set()).add(node_id)
        else:
            group = self.sites.get(site)
            if group is not None:
                group.discard(node_id)
                if not group:
                    del self.sites[site]
        listed = self._decisions.get(site)
        if listed is not None and not listed:
            del self._decisions[site]

    # --- what the API and the dashboard show ---------------------------------------------

    def decisions(self, site: str, limit: int) -> tuple[int, list[SiteDecision]]:
        """How many site decisions the site's members report, and the newest ``limit``."""
        listed = self._decisions.get(site)
        if not listed:
            return 0, []
        newest = listed[-limit:] if limit > 0 else []
        out = [self.members[node].decided[task] for _at, task, node in reversed(newest)]
        return len(listed), out

    def coordinator(self, site: str) -> tuple[str, SiteLease] | None:
        """The member with a lease at the highest epoch (ties: the smallest id), or None."""
        best: tuple[str, SiteLease] | None = None
        for node_id in sorted(self.sites.get(site, ())):
            lease = self.members[node_id].lease
            if lease is not None and (best is None or lease.epoch > best[1].epoch):
                best = (node_id, lease)
        return best

    def view(
        self,
        liveness: Callable[[str], MemberLiveness],
        sites_down: Mapping[str, float],
        limit: int = DECISIONS_SHOWN,
    ) -> list[dict[str, Any]]:
        """Every site some member says something of, by name (``GET /v1/sites``)."""
        return [self.site_view(site, liveness, sites_down, limit) for site in sorted(self.sites)]

    def site_view(
        self,
        site: str,
        liveness: Callable[[str], MemberLiveness],
        sites_down: Mapping[str, float],
        limit: int = DECISIONS_SHOWN,
    ) -> dict[str, Any]:
        group = self.sites.get(site, set())
        named: set[str] = set(group)
        for node_id in group:  # peers its members name, whatever their documents say
            m = self.members[node_id]
            if m.seen is not None:
                named.update(m.seen.peers)
            if m.lease is not None:
                named.update(m.lease.members)
        ids = sorted(named)
        live = {n: liveness(n) for n in ids}
        online = [n for n in ids if live[n].status == "online"]
        members = []
        for node_id in ids:
            member = self.members.get(node_id)
            known = node_id in group and member is not None
            state = live[node_id]
            seen_by = [
                n
                for n in online
                if n != node_id
                and (s := self.members[n].seen if n in group else None) is not None
                and node_id in s.peers
            ]
            if state.status == "online":
                health = CONNECTED
            else:
                health = ALIVE_IN_SITE if seen_by else UNCONFIRMED
            vote = member.vote if known and member is not None else None
            lease = member.lease if known and member is not None else None
            seen = member.seen if known and member is not None else None
            members.append(
                {
                    "id": node_id,
                    "known": known,
                    "status": state.status,
                    "state": state.state,
                    "status_since": state.since,
                    "health": health,
                    "seen_live_by": seen_by,
                    "vote": None if vote is None else vote.to_entry(),
                    "lease": None if lease is None else _lease_json(lease),
                    "seen": None if seen is None else _seen_json(seen),
                    "decisions": 0 if not known or member is None else len(member.decided),
                }
            )
        coordinator = self.coordinator(site)
        total, recent = self.decisions(site, limit)
        down = sites_down.get(site)
        return {
            "site": site,
            "bridge": {"up": down is None, "down_since": down},
            "coordinator": None
            if coordinator is None
            else {"node": coordinator[0], **_lease_json(coordinator[1])},
            "members": members,
            "cut_off_alive": [m["id"] for m in members if m["health"] == ALIVE_IN_SITE],
            "decisions": {"total": total, "recent": [d.to_json() for d in recent]},
        }


def _lease_json(lease: SiteLease) -> dict[str, Any]:
    return {"epoch": lease.epoch, "since": lease.since, "members": list(lease.members)}


def _seen_json(seen: SiteSeen) -> dict[str, Any]:
    return {
        "peers": list(seen.peers),
        "coordinator": seen.coordinator or None,
        "epoch": seen.epoch,
        "since": seen.since,
    }
