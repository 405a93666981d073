"""The fleet-wide task lifecycle (``edgesched.core.lifecycle``): the table of cases, and one
final record whatever order the facts come in (issue 14)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.lifecycle import Assigned, Copy, Phase, Reach, lifecycle
from edgesched.core.task import TaskState
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.schema import AssignmentRef, TaskReport

R, X, F, C = TaskState.RUNNING, TaskState.EXITED, TaskState.FAILED, TaskState.CANCELLED


def copy(
    node: str, state: TaskState, at: float = 10.0, epoch: int | None = 1, **kw: object
) -> Copy:
    return Copy(node=node, state=state, updated_at=at, epoch=epoch, **kw)  # type: ignore[arg-type]


CASES = {
    "placed, not taken yet": (Assigned("a", 1), [], Phase.PLACED, "a"),
    "pending at central": (Assigned(None, 1), [], Phase.PENDING, None),
    "running": (Assigned("a", 1), [copy("a", R)], Phase.RUNNING, "a"),
    "exited, code 0": (Assigned("a", 1), [copy("a", X, exit_code=0)], Phase.EXITED, "a"),
    "failed": (Assigned("a", 1), [copy("a", F, exit_code=3)], Phase.FAILED, "a"),
    "queued on its node": (Assigned("a", 1), [copy("a", TaskState.PLACED)], Phase.PLACED, "a"),
    "preempted": (Assigned("a", 1), [copy("a", TaskState.PREEMPTED)], Phase.PLACED, "a"),
    # failed over to b: a's old copy (epoch 1) is a leftover, b has not taken it yet
    "failed over, not taken": (Assigned("b", 2), [copy("a", R)], Phase.PLACED, "b"),
    "failed over, running": (
        Assigned("b", 2), [copy("a", R), copy("b", R, epoch=2)], Phase.RUNNING, "b"),
    "a finished copy of an older epoch": (
        Assigned("b", 2), [copy("a", X, exit_code=0), copy("b", R, epoch=2)], Phase.RUNNING, "b"),
    "cancelled while running": (Assigned("a", 1, cancelled=True), [copy("a", R)],
                                Phase.CANCELLED, "a"),
    "cancelled, stopped": (Assigned("a", 1, cancelled=True), [copy("a", C)], Phase.CANCELLED, "a"),
    "finished before the cancel": (Assigned("a", 1, cancelled=True), [copy("a", X, exit_code=0)],
                                   Phase.EXITED, "a"),
    "a node's own, queued": (None, [copy("a", TaskState.ACCEPTED, epoch=None)], Phase.PENDING, "a"),
    "a node's own, running": (None, [copy("a", R, epoch=None)], Phase.RUNNING, "a"),
    "a node's own, failed": (None, [copy("a", F, epoch=None, exit_code=1)], Phase.FAILED, "a"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_cases(case: str) -> None:
    assigned, copies, phase, node = CASES[case]
    got = lifecycle(assigned, copies)
    assert (got.phase, got.node) == (phase, node)
    assert got.origin == ("central" if assigned is not None else "node")
    current = [
        c for c in copies if c.node == node and (assigned is None or c.epoch == assigned.epoch)
    ]
    if current:
        assert got.exit_code == current[0].exit_code
        # final: when its copy ended, or when central cancelled it
        assert (got.finished_at is not None) == (
            current[0].state.terminal or got.phase is Phase.CANCELLED
        )


def test_a_cut_off_node_leaves_its_tasks_unknown_since_and_a_dead_one_loses_them() -> None:
    copies = [copy("a", R)]
    cut = lifecycle(Assigned("a", 1), copies, lambda _n: Reach("partitioned", 100.0))
    assert cut.phase is Phase.RUNNING and cut.unknown_since == 100.0
    assert lifecycle(Assigned("a", 1), copies, lambda _n: Reach("dead", 100.0)).phase is Phase.LOST
    done = lifecycle(Assigned("a", 1), [copy("a", X, exit_code=0)], lambda _n: Reach("dead", 1.0))
    assert done.phase is Phase.EXITED and done.unknown_since is None  # final is final


copies_st = st.lists(
    st.builds(
        Copy,
        node=st.sampled_from(["a", "b", "c"]),
        state=st.sampled_from(list(TaskState)),
        updated_at=st.floats(0, 100, allow_nan=False),
        epoch=st.none() | st.integers(1, 3),
        exit_code=st.none() | st.integers(0, 3),
        restarts=st.integers(0, 3),
    ),
    max_size=6,
)
assigned_st = st.none() | st.builds(
    Assigned, node=st.none() | st.sampled_from(["a", "b", "c"]), epoch=st.integers(1, 3),
    cancelled=st.booleans(),
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(assigned_st, copies_st, st.randoms(use_true_random=False))
def test_one_record_whatever_the_order_or_duplicates(
    assigned: Assigned | None, copies: list[Copy], rng: random.Random
) -> None:
    shuffled = copies + rng.sample(copies, k=len(copies) // 2)  # some twice
    rng.shuffle(shuffled)
    assert lifecycle(assigned, shuffled) == lifecycle(assigned, copies)


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["t1", "t2", "t3"]),
        st.sampled_from([TaskState.ACCEPTED, TaskState.PLACED, R, TaskState.PREEMPTED, X, F, C]),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(EVENTS, st.randoms(use_true_random=False))
def test_through_the_documents_any_delivery_order_gives_the_writers_record(
    events: list[tuple[str, TaskState, int]], rng: random.Random
) -> None:
    """A node's reports of its tasks (random states, exit codes, a placement epoch), its
    updates delivered to central's replica reordered and duplicated, some lost and then
    resynced: the record central derives equals the one from the node's own document."""
    writer = NodeDoc("node-a", client_id_for("a"))
    updates: list[bytes] = []
    writer.on_local_update(updates.append)
    for i, (task_id, state, code) in enumerate(events):
        writer.put_task(
            task_id,
            TaskReport(
                state=state,
                updated_at=float(i),
                node="a",
                exit_code=code if state in (X, F) else None,
                assignment=AssignmentRef(epoch=1, central="central") if task_id != "t3" else None,
            ),
        )
    delivered = updates + rng.sample(updates, k=len(updates) // 3)
    rng.shuffle(delivered)
    kept = [u for u in delivered if rng.random() > 0.2]  # some lost on the way
    replica = NodeDoc("node-a", client_id_for("central"))
    for update in kept:
        replica.apply_remote(update, sender="a")
    replica.apply_remote(writer.diff(replica.state_vector()), sender="a")  # the resync

    def record(doc: NodeDoc, task_id: str) -> object:
        report = doc.task(task_id)
        copies = [] if report is None else [
            Copy("a", report.state, report.updated_at,
                 None if report.assignment is None else report.assignment.epoch,
                 report.exit_code, report.restarts)
        ]  # fmt: skip
        assigned = None if task_id == "t3" else Assigned("a", 1)
        return lifecycle(assigned, copies)

    for task_id in ("t1", "t2", "t3"):
        assert record(replica, task_id) == record(writer, task_id)
