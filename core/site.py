"""Site coordination: which member of a cut-off site schedules for it, and what it decides. Pure.

When central is unreachable, the live members of a site (the nodes behind one site broker,
listed in each member's config) agree on one of them, the *coordinator*, to run the core over
the whole site. Nothing here does I/O: each member feeds in what it sees (the members live on
the site broker, the site state every member wrote in its own document) and gets back what to
write in its own document.

**Election** (:func:`next_vote`, :func:`acting_term`, :func:`followed_term`). Every member
holds one vote, a :class:`Term` ``(epoch, holder)``, in its own document (committed to SQLite
before it is published). The rule:

* the candidate is the smallest id among the live members (as this member sees them, itself
  included); a member whose live view holds no majority of the site's members casts no vote
  (a minority side of a split inside the site elects nobody: its nodes each schedule alone,
  as a node without site peers does);
* a member votes for the candidate at the highest epoch any live member already votes for
  it, or else at one above every epoch it has seen; its own votes only ever grow in epoch, so
  **a member votes at most once per epoch**;
* a member *acts* as coordinator at epoch ``e`` only while a majority of the site's members
  (counted over the whole configured membership, live or not) vote ``(e, itself)`` and no live
  member votes a higher epoch. Two holders cannot both have a majority at one epoch, so **at
  most one coordinator acts per epoch**, whatever the members see;
* a member follows the orders of the holder of its own vote, at that vote's epoch only, and
  only while that holder says (its lease) it acts at that epoch. An order of an older epoch is
  stale: a member that has voted past it ignores it (the fencing).

A split inside the site (some members lose the site broker): the side with a majority of the
members elects (or keeps) a coordinator; the other side elects nobody. A former coordinator on
the minority side stops acting as soon as it sees fewer than a majority live; until it notices,
its orders reach nobody who voted past its epoch. A site of two members has a coordinator only
while both are live (a majority of two is two): when one dies the other schedules alone.

**Decisions** (:func:`plan_site`): the coordinator runs :func:`edgesched.core.scheduler.schedule`
over the live members with what they run, for the work that needs a node: replicas
(``movable`` copies) of members dead longer than the failover time, and the local submissions
members *offered* to the site (queued on a node that could not place them). Each becomes a
:class:`SiteOrder` naming the node, the member it came from and the placement epoch (one above
every copy's, so the reconcile rule sees it as a failover, as central's).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from edgesched.core.model import DecisionKind, Node, Placement, Task
from edgesched.core.policy import PolicyConfig
from edgesched.core.scheduler import ClusterView, schedule

#: ``decided_by`` and an assignment's ``central`` of a site coordinator's decision:
#: ``site:<coordinator>``.
SITE_PREFIX = "site:"
#: The last epoch a vote may name (the documents' integer bound, 2**53). A member that sees a
#: vote there can vote no higher: it votes for nobody (its site schedules node by node).
MAX_EPOCH = 2**53


def majority(members: int) -> int:
    """How many of ``members`` make a majority."""
    return members // 2 + 1


@dataclass(frozen=True, slots=True, order=True)
class Term:
    """A vote, and the term of the coordinator it elects: ``holder`` acting at ``epoch``."""

    epoch: int
    holder: str

    def __post_init__(self) -> None:
        if self.epoch < 1 or not self.holder:
            raise ValueError("a term has an epoch >= 1 and a holder")


@dataclass(frozen=True, slots=True)
class MemberState:
    """What one member's document says of the site: its vote, and the epoch it says it acts
    at as coordinator (None: it does not)."""

    vote: Term | None = None
    acting: int | None = None


def _present(me: str, members: Collection[str], live: Collection[str]) -> list[str]:
    return sorted({m for m in live if m in members} | {me})


def next_vote(
    me: str,
    members: Collection[str],
    live: Collection[str],
    states: Mapping[str, MemberState],
) -> Term | None:
    """The vote ``me`` should hold now; None to keep the one it has (or to hold none).

    ``members``: the site's configured members, ``me`` among them; ``live``: those ``me`` sees
    live now; ``states``: every member's state as ``me`` has it (its own included)."""
    if me not in members:
        raise ValueError(f"{me} is not a member of its site")
    present = _present(me, members, live)
    if len(present) < majority(len(members)):
        return None
    candidate = present[0]
    own = states.get(me, MemberState()).vote
    floor = 0 if own is None else own.epoch
    votes = [s.vote for s in states.values() if s.vote is not None]
    top = max([v.epoch for v in votes] + [floor])
    joined = max(
        (
            v.epoch
            for m in present
            if (v := states.get(m, MemberState()).vote) is not None and v.holder == candidate
        ),
        default=0,
    )
    if own is not None and own.holder == candidate and own.epoch >= joined:
        return None  # (a member sees its own vote as it wrote it)
    if joined > floor:
        return Term(joined, candidate)
    if top >= MAX_EPOCH:
        return None  # (a peer voted the last epoch: no election can follow it)
    return Term(top + 1, candidate)


def acting_term(
    me: str,
    members: Collection[str],
    live: Collection[str],
    states: Mapping[str, MemberState],
) -> Term | None:
    """The term at which ``me`` acts as the site's coordinator now, or None: its own vote
    names itself, a majority of ``members`` (live ones, itself included) vote exactly that,
    and no live member votes a higher epoch."""
    own = states.get(me, MemberState()).vote
    if own is None or own.holder != me:
        return None
    present = _present(me, members, live)
    votes = {m: states.get(m, MemberState()).vote for m in present}
    if any(v is not None and v.epoch > own.epoch for v in votes.values()):
        return None
    if sum(1 for v in votes.values() if v == own) < majority(len(members)):
        return None
    return own


def followed_term(me: str, live: Collection[str], states: Mapping[str, MemberState]) -> Term | None:
    """The coordinator's term whose orders ``me`` follows: its own vote, if the holder is live
    (or ``me``) and says it acts at that epoch; else None (nobody's orders)."""
    own = states.get(me, MemberState()).vote
    if own is None or (own.holder != me and own.holder not in live):
        return None
    if states.get(own.holder, MemberState()).acting != own.epoch:
        return None
    return own


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Copy:
    """A member's copy of a task, as the member's document says."""

    task: Task  # its footprint, as the core sees it
    node: str
    running: bool  # running or placed (it holds its resources); False: queued
    epoch: int  # its placement epoch (its assignment's; 0 for a local task)
    movable: bool  # a service replica (restart always): may restart on another member


@dataclass(frozen=True, slots=True)
class Offer:
    """A local submission a member offered to the site: queued there, not placed."""

    task: Task
    origin: str


@dataclass(frozen=True, slots=True)
class SiteOrder:
    """The coordinator's order: run ``task_id`` on ``node`` (it came from ``origin``)."""

    task_id: str
    node: str
    origin: str
    term: int  # the coordinator's epoch
    epoch: int  # the task's placement epoch
    replacement: bool  # it fails the task over from a dead member
    score: float
    at: float
    reason: str


@dataclass(frozen=True)
class SitePlan:
    """What the coordinator orders at one step, and what still waits (task id -> why)."""

    orders: tuple[SiteOrder, ...]
    waiting: Mapping[str, str]


def failover_candidates(
    copies: Mapping[str, Sequence[Copy]],
    live: Collection[str],
    dead_since: Mapping[str, float],
    now: float,
    failover_after_s: float,
) -> list[Copy]:
    """The replicas to restart elsewhere: a movable copy on a member dead longer than
    ``failover_after_s``, of a task with no copy on any live member (by task id order)."""
    out = []
    for task_id in sorted(copies):
        group = copies[task_id]
        if any(c.node in live for c in group):
            continue
        for c in group:
            since = dead_since.get(c.node)
            if c.movable and since is not None and now - since > failover_after_s:
                out.append(c)
                break
    return out


def plan_site(
    term: Term,
    nodes: Sequence[Node],
    copies: Mapping[str, Sequence[Copy]],
    offers: Sequence[Offer],
    standing: Mapping[str, SiteOrder],
    *,
    dead_since: Mapping[str, float],
    now: float,
    failover_after_s: float,
    policy: PolicyConfig,
    running: Sequence[Placement] | None = None,
) -> SitePlan:
    """The coordinator's orders for this step, over ``nodes`` (the live members).

    ``copies``: task id -> every member's copy (live members' and dead ones', as their
    documents last said); ``offers``: the members' offered submissions; ``standing``: the
    orders this coordinator gave at this term (task id -> order), whose targets count as
    holding them until they report the task. A task with a standing order is not ordered
    again, unless its target has died since. ``running``: what the live members run, when
    the caller keeps it (then ``copies`` need hold only the tasks that may need a node, the
    offered ones and those with a standing order); else derived from ``copies``."""
    live = {n.id for n in nodes}
    pending: dict[str, tuple[Task, str, int, bool]] = {}  # task id -> (task, origin, epoch, repl)
    for copy in failover_candidates(copies, live, dead_since, now, failover_after_s):
        epoch = max(c.epoch for c in copies[copy.task.id]) + 1
        pending[copy.task.id] = (copy.task, copy.node, epoch, True)
    for offer in offers:
        if offer.origin in live and offer.task.id not in pending:
            group = copies.get(offer.task.id, ())
            pending[offer.task.id] = (
                offer.task,
                offer.origin,
                max((c.epoch for c in group), default=0) + 1,
                False,
            )
    for task_id, order in standing.items():
        if task_id in pending and order.node in live:
            del pending[task_id]  # ordered already: its target has not reported it yet
    if not pending:
        return SitePlan((), {})
    held: list[Placement] = []
    if running is None:
        for group in copies.values():
            held += [
                Placement(c.task, c.node, c.task.submitted_at)
                for c in group
                if c.running and c.node in live
            ]
    else:
        held = [p for p in running if p.node_id in live]
    reported = {(p.task.id, p.node_id) for p in held if p.task.id in standing}
    for task_id, order in standing.items():
        if order.node in live and (task_id, order.node) not in reported:
            task = _task_of(task_id, copies, offers)
            if task is not None:  # in flight: the target holds it before it reports it
                held.append(Placement(task, order.node, order.at))
    view = ClusterView(tuple(nodes), tuple(held), now)
    result = schedule(view, [p[0] for p in pending.values()], policy)
    orders = []
    for d in result.decisions:
        if d.kind is not DecisionKind.PLACE or d.task_id not in pending:
            continue
        task, origin, epoch, replacement = pending[d.task_id]
        score = sum(d.scores.values())
        why = (
            f"{origin} is down: restarted on {d.node_id}"
            if replacement
            else (f"offered by {origin}: placed on {d.node_id}")
        )
        orders.append(
            SiteOrder(
                task_id=task.id,
                node=d.node_id,
                origin=origin,
                term=term.epoch,
                epoch=epoch,
                replacement=replacement,
                score=score if math.isfinite(score) else 0.0,
                at=now,
                reason=f"site {term.holder}@{term.epoch}: {why} ({d.reason})",
            )
        )
    placed = {o.task_id for o in orders}
    waiting = {t: result.waiting.get(t, "no member fits") for t in pending if t not in placed}
    return SitePlan(tuple(orders), waiting)


def _task_of(
    task_id: str, copies: Mapping[str, Sequence[Copy]], offers: Sequence[Offer]
) -> Task | None:
    for c in copies.get(task_id, ()):
        return c.task
    for o in offers:
        if o.task.id == task_id:
            return o.task
    return None
