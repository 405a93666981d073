"""How a node follows central's assignments (issue 14): a newer epoch is always taken, even
for a task whose copy here has finished, so a failover or a migration back to this node
never leaves the task running nowhere."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import kill_task_processes
from test_edge_history import NODE, engine_for, running, until

from edgesched.core.task import RestartPolicy, TaskRecord, TaskSpec, TaskState
from edgesched.edge.engine import EdgeEngine
from edgesched.sync.schema import AssignmentEntry

SPEC = TaskSpec(id="job", command=("true",), cpu=0.1, mem_gib=0.1, restart=RestartPolicy.NEVER)


def assign(engine: EdgeEngine, epoch: int) -> None:
    """Central's assignment of ``job`` to us at ``epoch``, as our desired document gets it."""
    engine.desired.assign(
        "job",
        AssignmentEntry(spec=SPEC, node=NODE, epoch=epoch, central="central", at=time.time()),
    )
    engine._policy_changed("central")


async def test_a_newer_epoch_runs_again_a_task_that_finished_here(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        async with running(engine_for(state)) as engine:

            async def done_at(epoch: int) -> TaskRecord | None:
                record = await engine.store.get_task("job")
                ok = (
                    record is not None
                    and record.assignment is not None
                    and record.assignment.epoch == epoch
                    and record.state is TaskState.EXITED
                )
                return record if ok else None

            assign(engine, 1)
            first = await until("epoch 1 run and exited", lambda: done_at(1))
            assign(engine, 1)  # the same epoch again: nothing to do
            assign(engine, 2)  # failed over back to us, or migrated here again
            second = await until("epoch 2 run and exited", lambda: done_at(2))
            assert second.submitted_at > first.submitted_at  # a second run, not a relabel
            assert second.exit_code == 0
            report = engine.doc.task("job")  # what central reads
            assert report is not None and report.assignment is not None
            assert report.assignment.epoch == 2 and report.state is TaskState.EXITED
    finally:
        kill_task_processes(state)
