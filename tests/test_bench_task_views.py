"""The task-views benchmark at a tiny size: every task has a view, and the history passes
write exactly the tasks the nodes finished (30% of the seeded ones)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_task_views as bench
import pytest


def test_the_views_and_the_history_at_a_tiny_size() -> None:
    row = asyncio.run(bench.measure(6, 20))
    assert row["tasks"] == 6 * 20
    assert row["written"] == row["rows"] == 6 * 6  # 6 of each node's 20 finished
    assert row["passes"] == 1 and row["life_us"] > 0 and row["page_ms"] > 0


@pytest.mark.parametrize("due_up_to", [50_000, 5])
def test_a_restart_does_not_write_the_history_again_but_a_task_finished_again_does(
    due_up_to: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted central marks every restored task due for its history: rows the store
    holds as they are (same phase, same end) are not written again; a task that finished
    again since is. With more due than ``HISTORY_DUE_UP_TO`` (5 here) the set gives way to a
    sweep of every task, a slice a pass (``HISTORY_PER_PASS``, 7 here): the same rows."""
    from edgesched.central import engine as engine_module

    monkeypatch.setattr(engine_module, "HISTORY_DUE_UP_TO", due_up_to)
    if due_up_to < 50_000:
        monkeypatch.setattr(engine_module, "HISTORY_PER_PASS", 7)
    from dataclasses import replace

    import bench_control_step as base

    from edgesched.core.task import TaskState
    from edgesched.sync.store import Store

    async def run(tmp: Path) -> tuple[int, int, int, int]:
        engine, _clock, _running = base.build(4, 10, tmp)
        engine._store = await Store.open(tmp / "central.db")
        try:
            engine.sync_index(project=False)
            assert (engine._history_sweep is not None) == (due_up_to < 50_000)
            assert len(engine._history_due) <= due_up_to
            first = 0
            while engine.history_backlog():
                first += await engine.record_history()
            engine._history_mark(engine.task_ids())  # (as a restart marks them)
            again = 0
            while engine.history_backlog():
                again += await engine.record_history()
            # one finished task finishes again, later
            node_id, doc = next(iter(engine.replicas.replicas.items()))
            task_id, report = next(
                (t, r) for t, r in doc.doc.tasks().items() if r.state is TaskState.EXITED
            )
            doc.doc.put_task(task_id, replace(report, updated_at=report.updated_at + 60))
            engine._dirty_nodes.add(node_id)
            engine.sync_index(project=False)
            later = 0
            while engine.history_backlog():
                later += await engine.record_history()
            rows = await engine.store.finished_tasks(limit=1000)
            (row,) = [r for r in rows if r["id"] == task_id]
            assert row["finished_at"] == report.updated_at + 60
            return first, again, later, len(rows)
        finally:
            await engine.store.close()

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        first, again, later, rows = asyncio.run(run(Path(tmp)))
    assert first == rows == 4 * 3  # 3 of each node's 10 finished
    assert again == 0
    assert later == 1
