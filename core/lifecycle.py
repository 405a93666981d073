"""One task's lifecycle, fleet-wide: what central says a task is, from what it knows (issue 14).

Central knows two things of a task: its own assignment, if it placed the task (node, placement
epoch, cancelled or not), and every node's copy of it, from the nodes' documents (state, exit
code, restarts, times, who decided it, the epoch it runs under). A task submitted at a node,
or decided by a node while cut off, has no assignment: only the node's copy. :func:`lifecycle`
turns that into one record, the same whatever order the facts arrived in:

- **pending**: accepted, on no node yet (central found none; a node's own queue);
- **placed**: on a node, not running yet (not taken up yet, queued there, or preempted);
- **running**;
- **exited** (code 0), **failed** (non-zero, no more restarts), **cancelled**: final;
- **lost**: placed or running on a node that is dead.

The copy that counts is, for a task central placed, the one on the assigned node under the
assignment's epoch (an older epoch's copy elsewhere is a leftover of a failover); for a task a
node decided, that node's (the most recently updated, if several report it). A task central
cancelled is cancelled unless that copy finished first. A task whose node is cut off shows its
last known state and ``unknown_since``: since when central has not known.

Pure: plain values in, a :class:`Lifecycle` out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from edgesched.core.task import TaskState

__all__ = ["Assigned", "Copy", "Lifecycle", "Phase", "Reach", "lifecycle"]


class Phase(StrEnum):
    PENDING = "pending"
    PLACED = "placed"
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def final(self) -> bool:
        return self in (Phase.EXITED, Phase.FAILED, Phase.CANCELLED, Phase.LOST)


@dataclass(frozen=True, slots=True)
class Copy:
    """A node's copy of a task, as the node's document reports it."""

    node: str
    state: TaskState
    updated_at: float
    epoch: int | None = None  # the assignment's epoch it runs under; None: the node decided
    exit_code: int | None = None
    restarts: int = 0
    decided_by: str = ""
    accepted_at: float = 0.0
    started_at: float | None = None


@dataclass(frozen=True, slots=True)
class Assigned:
    """Central's assignment of a task."""

    node: str | None  # None: pending (no node could take it)
    epoch: int
    cancelled: bool = False
    at: float = 0.0
    decided_by: str = "central"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Reach:
    """What central knows of a node's link: ``connected``, ``suspect``, ``partitioned`` or
    ``dead``, since when."""

    state: str
    since: float | None = None


@dataclass(frozen=True, slots=True)
class Lifecycle:
    phase: Phase
    node: str | None  # where it runs, ran or is placed
    exit_code: int | None
    restarts: int
    submitted_at: float | None
    started_at: float | None
    finished_at: float | None
    decided_by: str
    origin: str  # "central": central placed it; "node": a node's API or a node while cut off
    unknown_since: float | None  # its node is cut off: its state is as of before this

    def to_json(self) -> dict[str, object]:
        return {
            "phase": self.phase.value,
            "node": self.node,
            "exit_code": self.exit_code,
            "restarts": self.restarts,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "decided_by": self.decided_by,
            "origin": self.origin,
            "unknown_since": self.unknown_since,
        }


_FROM_COPY = {
    TaskState.ACCEPTED: Phase.PLACED,
    TaskState.PLACED: Phase.PLACED,
    TaskState.PREEMPTED: Phase.PLACED,
    TaskState.RUNNING: Phase.RUNNING,
    TaskState.EXITED: Phase.EXITED,
    TaskState.FAILED: Phase.FAILED,
    TaskState.CANCELLED: Phase.CANCELLED,
}
_CUT = ("suspect", "partitioned", "dead")


def _current(assigned: Assigned | None, copies: Iterable[Copy]) -> Copy | None:
    if assigned is not None:
        if assigned.node is None:
            return None
        mine = [c for c in copies if c.node == assigned.node and c.epoch == assigned.epoch]
    else:
        mine = list(copies)
    # (several: the most recently updated; every other field breaks a tie, in a fixed order,
    # so the order they come in never matters)
    return max(mine, key=_rank, default=None)


def _rank(c: Copy) -> tuple[float, str, str, int, int, int, str, float, float]:
    return (
        c.updated_at,
        c.node,
        c.state.value,
        -1 if c.epoch is None else c.epoch,
        -1 if c.exit_code is None else c.exit_code,
        c.restarts,
        c.decided_by,
        c.accepted_at,
        -1.0 if c.started_at is None else c.started_at,
    )


def lifecycle(
    assigned: Assigned | None,
    copies: Iterable[Copy],
    reach: Callable[[str], Reach] = lambda _node: Reach("connected"),
) -> Lifecycle:
    """The task's one record (see the module docstring). ``reach``: a node's link as central
    knows it."""
    copies = tuple(copies)
    current = _current(assigned, copies)
    if current is not None:
        phase = _FROM_COPY[current.state]
        if assigned is None and current.state is TaskState.ACCEPTED:
            phase = Phase.PENDING  # in the node's own queue
        node: str | None = current.node
    elif assigned is not None and assigned.node is not None:
        phase, node = Phase.PLACED, assigned.node  # not taken up yet
    else:
        phase, node = Phase.PENDING, None
    if assigned is not None and assigned.cancelled and phase not in (Phase.EXITED, Phase.FAILED):
        phase = Phase.CANCELLED
    unknown_since = None
    if node is not None and not phase.final:
        link = reach(node)
        if link.state == "dead":
            phase = Phase.LOST
        elif link.state in _CUT:
            unknown_since = link.since
    finished = current is not None and current.state.terminal
    return Lifecycle(
        phase=phase,
        node=node,
        exit_code=current.exit_code if current is not None else None,
        restarts=current.restarts if current is not None else 0,
        submitted_at=(
            (current.accepted_at if current is not None else 0.0)
            or (assigned.at if assigned is not None else 0.0)
            or None
        ),
        started_at=current.started_at if current is not None else None,
        finished_at=(
            current.updated_at
            if finished and current is not None
            else assigned.at
            if phase is Phase.CANCELLED and assigned is not None
            else None
        ),
        decided_by=(
            current.decided_by
            if current is not None and current.decided_by
            else assigned.decided_by
            if assigned is not None
            else ""
        ),
        origin="central" if assigned is not None else "node",
        unknown_since=unknown_since,
    )
