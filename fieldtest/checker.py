"""The field test's verdict, from a recorded history and the final state. Pure.

Jepsen's set semantics over the tasks the workload submitted:

* **acknowledged**: the submission returned 201 (committed to SQLite at the node, or
  journaled into the policy document at central) — these must never be lost;
* **lost**: acknowledged, but absent from where it must be at the end (the node that took
  it, for a local submission; central's assignments, for a central one);
* **unexpected**: present at the end but never submitted (or submitted and refused);
* **recovered**: not acknowledged (the request failed or timed out) but present anyway.

A task a node preempted is still there (``preempted``, back in its node's queue, then placed
again): present, so never lost. Lost means absent.

And the properties of the design: after the heal and a quiet period every node's replica at
central holds byte-equal content (content hash), every task a node decided while cut off is
at central as the node has it, every task central assigned to a node has reached that node
(*undelivered* otherwise: central's policy document never got there, say across a site's
bridge), and no task of central's runs on two nodes. A node that lost
power (its engine and every task process killed) and booted while still cut off must bring
back, without central, every task that was running: running again under a new process, or
ended or preempted since (*not brought back* otherwise).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ACTIVE = frozenset({"accepted", "placed", "running", "preempted"})


@dataclass(frozen=True)
class Submission:
    """One submission the workload made, and what it got back."""

    at: float
    task_id: str
    where: str  # "central" or the node id it was submitted to
    acknowledged: bool
    while_cut: bool = False  # the node it went to was cut off at the time


@dataclass(frozen=True)
class FinalState:
    """What the harness read after the quiet period."""

    node_hashes: Mapping[str, str]  # node id -> its own document's content hash
    replica_hashes: Mapping[str, str]  # node id -> central's replica's content hash
    node_tasks: Mapping[str, Mapping[str, Mapping[str, Any]]]  # node -> task id -> record
    replica_tasks: Mapping[str, Mapping[str, Mapping[str, Any]]]  # central's view, per node
    central_tasks: Mapping[str, Mapping[str, Any]]  # central's assignments (task views)


@dataclass(frozen=True)
class Reboot:
    """A power loss of a node: what ran before, and what the node said some seconds after it
    booted again (still cut off)."""

    node: str
    running_before: Mapping[str, int]  # task id -> pid
    after: Mapping[str, tuple[str, int | None]]  # task id -> (state, pid)


def brought_back(reboot: Reboot) -> list[str]:
    """The tasks of ``reboot`` that the node did *not* bring back."""
    missing = []
    for task_id, pid in reboot.running_before.items():
        state, new_pid = reboot.after.get(task_id, ("absent", None))
        back = (state == "running" and new_pid != pid) or state in (
            "exited", "failed", "cancelled", "preempted",
        )  # fmt: skip
        if not back:
            missing.append(f"{reboot.node}/{task_id} ({state})")
    return sorted(missing)


@dataclass
class Verdict:
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    duplicates: dict[str, list[str]] = field(default_factory=dict)  # task -> nodes running it
    diverged: list[str] = field(default_factory=list)  # nodes whose replica differs
    offline_missing: list[str] = field(default_factory=list)  # offline decisions not at central
    not_brought_back: list[str] = field(default_factory=list)  # after a power loss, cut off
    undelivered: list[str] = field(default_factory=list)  # assigned by central, not at the node
    #: site autonomy: a lost member's replicas not running again inside its cut-off site
    #: within the limit (site/node/task)
    not_restored_in_site: list[str] = field(default_factory=list)
    #: site autonomy: two members seen coordinating one site at one epoch ("site@epoch: a, b")
    coordinators_at_once: list[str] = field(default_factory=list)
    restored_in_site: int = 0  # replicas a cut-off site ran again after a member was lost
    #: local submissions a site's coordinator placed on another member than the one that
    #: took them (the one that took them hands its copy over: cancelled, never run twice)
    moved_in_site: int = 0
    acknowledged: int = 0
    offline_decisions: int = 0
    rebooted_tasks: int = 0  # tasks running at a power loss, all reboots together

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.unexpected or self.duplicates or self.diverged
            or self.offline_missing or self.not_brought_back or self.undelivered
            or self.not_restored_in_site or self.coordinators_at_once
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "acknowledged": self.acknowledged,
            "offline_decisions": self.offline_decisions,
            "lost": self.lost,
            "unexpected": self.unexpected,
            "recovered": self.recovered,
            "duplicates": self.duplicates,
            "diverged": self.diverged,
            "offline_missing": self.offline_missing,
            "rebooted_tasks": self.rebooted_tasks,
            "not_brought_back": self.not_brought_back,
            "undelivered": self.undelivered,
            "restored_in_site": self.restored_in_site,
            "moved_in_site": self.moved_in_site,
            "not_restored_in_site": self.not_restored_in_site,
            "coordinators_at_once": self.coordinators_at_once,
        }


def _placed_for_central(decided_by: object) -> bool:
    """A copy of a task of central's: placed by central, or by a cut-off site's coordinator
    (``site:<node>``, edgesched.core.site) failing it over."""
    return decided_by == "central" or (
        isinstance(decided_by, str) and decided_by.startswith("site:")
    )


def undelivered(final: FinalState) -> list[str]:
    """Central's active assignments whose node does not hold the task."""
    return sorted(
        f"{view.get('node')}/{task_id}"
        for task_id, view in final.central_tasks.items()
        if view.get("state") == "active"
        and view.get("node") in final.node_tasks
        and task_id not in final.node_tasks[str(view.get("node"))]
    )


def site_checks(
    verdict: Verdict,
    restores: Sequence[Mapping[str, Any]],
    coordinators: Mapping[str, Mapping[int, Collection[str]]],
    limit_s: float,
) -> None:
    """Site autonomy's invariants: a member lost while its site was cut off has each of its
    replicas running on a site peer within ``limit_s`` (unless the site healed first: then
    central takes over), and no two members ever coordinate one site at one epoch."""
    for r in restores:
        if r.get("healed_first"):
            continue
        restored = r.get("restored") or {}
        seconds = r.get("seconds")
        verdict.restored_in_site += len(restored)
        late = seconds is None or seconds > limit_s
        for task_id in r.get("replicas", ()):
            if task_id not in restored or late:
                verdict.not_restored_in_site.append(f"{r.get('site')}/{r.get('node')}/{task_id}")
    for site, epochs in sorted(coordinators.items()):
        for epoch, members in sorted(epochs.items()):
            if len(set(members)) > 1:
                verdict.coordinators_at_once.append(f"{site}@{epoch}: {', '.join(sorted(members))}")


def check(
    history: Sequence[Submission],
    final: FinalState,
    reboots: Sequence[Reboot] = (),
    *,
    site_restores: Sequence[Mapping[str, Any]] = (),
    coordinators: Mapping[str, Mapping[int, Collection[str]]] | None = None,
    restore_limit_s: float = 8.0,
) -> Verdict:
    verdict = Verdict()
    site_checks(verdict, site_restores, coordinators or {}, restore_limit_s)
    for reboot in reboots:
        verdict.rebooted_tasks += len(reboot.running_before)
        verdict.not_brought_back += brought_back(reboot)
    submitted = {s.task_id: s for s in history}
    verdict.acknowledged = sum(1 for s in history if s.acknowledged)
    for s in history:
        if s.where == "central":
            present = s.task_id in final.central_tasks
        else:
            present = s.task_id in final.node_tasks.get(s.where, {})
        if s.acknowledged and not present:
            verdict.lost.append(s.task_id)
        elif present and not s.acknowledged:
            verdict.recovered.append(s.task_id)
    for s in history:
        if s.where != "central" and s.acknowledged:
            verdict.moved_in_site += any(
                s.task_id in tasks and n != s.where for n, tasks in final.node_tasks.items()
            )
    for node, tasks in final.node_tasks.items():
        for task_id, record in tasks.items():
            central_placed = record.get("decided_by") == "central"
            if task_id not in submitted and not central_placed:
                verdict.unexpected.append(f"{node}/{task_id}")
    for task_id in final.central_tasks:
        if task_id not in submitted:
            verdict.unexpected.append(f"central/{task_id}")
        running = sorted(
            n
            for n, tasks in final.node_tasks.items()
            if tasks.get(task_id, {}).get("state") in ACTIVE
            and _placed_for_central(tasks.get(task_id, {}).get("decided_by"))
        )
        if len(running) > 1:
            verdict.duplicates[task_id] = running
    for node, mine in final.node_hashes.items():
        if final.replica_hashes.get(node) != mine:
            verdict.diverged.append(node)
    verdict.undelivered = undelivered(final)
    for s in history:
        if not (s.acknowledged and s.while_cut and s.where != "central"):
            continue
        found = final.node_tasks.get(s.where, {}).get(s.task_id)
        if found is None or found.get("decided_by") != "edge-autonomous":
            continue  # decided after the heal (queued while cut): not an offline decision
        verdict.offline_decisions += 1
        at_central = final.replica_tasks.get(s.where, {}).get(s.task_id)
        if at_central is None or at_central.get("state") != found.get("state"):
            verdict.offline_missing.append(f"{s.where}/{s.task_id}")
    for name in (
        "lost",
        "unexpected",
        "recovered",
        "diverged",
        "offline_missing",
        "undelivered",
        "not_restored_in_site",
        "coordinators_at_once",
    ):
        getattr(verdict, name).sort()
    return verdict
