"""The pure rule that settles a task placed twice across a partition.

While a node was cut off, central may have failed its task over to another node, and the cut-off
node may have kept running it. After the heal every peer sees both placements (both
:class:`Claim`\\ s). :func:`winner` is a pure, deterministic function of the claims, so every peer
picks the same one without talking; the :func:`losers` stop their copies.

A copy that runs (or can run at once: placed, its process about to start) always wins over
one that does not (queued, or preempted by local work): keeping a copy that is not running and
stopping the one that is left a service running nowhere (issue 14). Among copies alike in
that, the policy decides (the Nomad ``disconnect.reconcile`` choices), then the final
tie-breaks give a total order: higher lease epoch, then the decider's rank (central over a
site's coordinator over an edge node alone: a failover central made and one a cut-off site
made at the same epoch settle for central's, on every peer), then the smaller node id, then
the remaining fields. Input order never matters.

The default is :attr:`ReconcilePolicy.KEEP_ORIGINAL`: the original copy has been running all
along (stopping it throws its progress away, while the replacement has just started), and the
rule depends only on recorded facts. ``BEST_SCORE`` compares scores computed by different
deciders at different times, and ``LONGEST_RUNNING`` compares start times read from different
machines' clocks, which may be skewed; both are deterministic but less meaningful.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum


class ReconcilePolicy(StrEnum):
    KEEP_ORIGINAL = "keep-original"
    KEEP_REPLACEMENT = "keep-replacement"
    BEST_SCORE = "best-score"
    LONGEST_RUNNING = "longest-running"


DEFAULT_POLICY = ReconcilePolicy.KEEP_ORIGINAL
#: ``decided_by`` of central (or ``central:<replica>``); ``site:<coordinator>`` is a site's
#: coordinator (edgesched.core.site); anything else is an edge node.
CENTRAL = "central"
SITE = "site:"


@dataclass(frozen=True)
class Claim:
    """One placement of a task, as recorded in the merged documents."""

    task_id: str
    node_id: str
    epoch: int  # lease epoch of the decision
    decided_by: str  # "central", "central:<replica>" or the deciding edge node's id
    started_at: float
    score: float
    replacement: bool  # True if this placement failed the task over from another node
    running: bool = True  # the copy runs or can at once (not queued, not preempted)

    def __post_init__(self) -> None:
        if not self.task_id or not self.node_id:
            raise ValueError("claim: task_id and node_id must not be empty")
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 0:
            raise ValueError(f"claim: epoch must be an int >= 0, got {self.epoch!r}")
        if not (math.isfinite(self.started_at) and math.isfinite(self.score)):
            raise ValueError("claim: started_at and score must be finite")

    @property
    def by_central(self) -> bool:
        return self.decided_by == CENTRAL or self.decided_by.startswith(CENTRAL + ":")

    @property
    def decider_rank(self) -> int:
        """0 central, 1 a site's coordinator, 2 an edge node alone: the wider the view the
        decision was made over, the better it ranks among copies otherwise alike."""
        if self.by_central:
            return 0
        return 1 if self.decided_by.startswith(SITE) else 2


def _policy_key(claim: Claim, policy: ReconcilePolicy) -> float:
    """Smaller is better."""
    if policy is ReconcilePolicy.KEEP_ORIGINAL:
        return 1.0 if claim.replacement else 0.0
    if policy is ReconcilePolicy.KEEP_REPLACEMENT:
        return 0.0 if claim.replacement else 1.0
    if policy is ReconcilePolicy.BEST_SCORE:
        return -claim.score
    if policy is ReconcilePolicy.LONGEST_RUNNING:
        return claim.started_at
    raise ValueError(f"unknown reconcile policy {policy!r}")


def _rank(claim: Claim, policy: ReconcilePolicy) -> tuple[object, ...]:
    """A total order key (smaller wins) over distinct claims."""
    return (
        0 if claim.running else 1,
        _policy_key(claim, policy),
        -claim.epoch,
        claim.decider_rank,
        claim.node_id,
        claim.started_at,
        -claim.score,
        claim.replacement,
        claim.decided_by,
    )


def winner(claims: Sequence[Claim], policy: ReconcilePolicy = DEFAULT_POLICY) -> Claim:
    """The one claim of a task that keeps running; the same on every peer, for any order."""
    if not claims:
        raise ValueError("winner of no claims")
    task_ids = {c.task_id for c in claims}
    if len(task_ids) != 1:
        raise ValueError(f"claims of several tasks: {sorted(task_ids)}")
    policy = ReconcilePolicy(policy)
    return min(claims, key=lambda c: _rank(c, policy))


def losers(claims: Sequence[Claim], policy: ReconcilePolicy = DEFAULT_POLICY) -> list[Claim]:
    """The claims whose copies must stop, in rank order.

    A claim on the winner's own node is not a loser: a node runs one copy of a task, and
    stopping it would stop the winner (such claims are older records of the same copy).
    """
    best = winner(claims, policy)
    ranked = sorted(claims, key=lambda c: _rank(c, policy))
    return [c for c in ranked if c.node_id != best.node_id]


def resolve(claims: Iterable[Claim], policy: ReconcilePolicy = DEFAULT_POLICY) -> dict[str, Claim]:
    """The winner of each task among ``claims`` of any number of tasks."""
    by_task: dict[str, list[Claim]] = {}
    for claim in claims:
        by_task.setdefault(claim.task_id, []).append(claim)
    return {task: winner(group, policy) for task, group in sorted(by_task.items())}
