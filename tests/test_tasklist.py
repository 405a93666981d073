"""central/tasklist.py: following ``next`` from the first page yields exactly the tasks the
filters match, in id order, once each, whatever the page size and the scan budget; and the
work of one request stays within its budget."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from edgesched.central.tasklist import TaskQuery, page

PHASES = ("pending", "running", "exited", "failed")
NODES = ("gw-a", "gw-b", "gw-c")

tasks_st = st.dictionaries(
    st.text(alphabet="abc-0", min_size=1, max_size=4),
    st.tuples(
        st.sampled_from(PHASES),
        st.sampled_from(("central", "node")),
        st.sampled_from(NODES),
        st.lists(st.sampled_from(NODES), max_size=2, unique=True),
    ),
    max_size=60,
)


def _views(tasks: dict[str, tuple[str, str, str, list[str]]]) -> dict[str, dict[str, Any]]:
    return {
        t: {"id": t, "phase": p, "origin": o, "node": n, "copies": {c: {} for c in copies}}
        for t, (p, o, n, copies) in tasks.items()
    }


@settings(max_examples=200, deadline=None)
@given(
    tasks_st,
    st.integers(1, 7),
    st.integers(1, 9),
    st.one_of(st.none(), st.sampled_from(PHASES)),
    st.one_of(st.none(), st.sampled_from(("central", "node"))),
    st.one_of(st.none(), st.sampled_from(NODES)),
    st.one_of(st.none(), st.sampled_from(("a", "b-", "0", "ab"))),
)
def test_following_next_yields_every_match_once_in_order(
    tasks: dict[str, tuple[str, str, str, list[str]]],
    limit: int,
    scan: int,
    phase: str | None,
    origin: str | None,
    node: str | None,
    prefix: str | None,
) -> None:
    views = _views(tasks)
    ids = SortedList(views)

    def node_ids(n: str) -> list[str]:  # the index's answer: assigned to it or reported by it
        return [t for t, v in views.items() if v["node"] == n or n in v["copies"]]

    expected = [
        t
        for t in ids
        if (phase is None or views[t]["phase"] == phase)
        and (origin is None or views[t]["origin"] == origin)
        and (node is None or t in node_ids(node))
        and (prefix is None or t.startswith(prefix))
    ]
    got: list[str] = []
    after: str | None = None
    looked = 0
    for _ in range(len(views) + 2):
        query = TaskQuery(limit, after, phase, origin, node, prefix, scan=scan)
        result = page(ids, query, views.get, node_ids)
        assert len(result.tasks) <= limit
        if phase is not None or origin is not None:
            assert result.scanned <= scan
        looked += result.scanned
        got += [v["id"] for v in result.tasks]
        if result.next is None:
            break
        assert after is None or result.next > after  # always forward
        after = result.next
    else:
        raise AssertionError("next never ended")
    assert got == expected
    assert looked <= len(views)  # no id judged twice


def test_a_node_filter_looks_only_at_the_nodes_tasks() -> None:
    views = _views({f"t{i:05}": ("running", "central", NODES[i % 3], []) for i in range(3000)})
    ids = SortedList(views)
    asked: list[str] = []

    def view(task_id: str) -> dict[str, Any] | None:
        asked.append(task_id)
        return views.get(task_id)

    def node_ids(n: str) -> list[str]:
        return [t for t, v in views.items() if v["node"] == n]

    result = page(ids, TaskQuery(10_000, node="gw-b"), view, node_ids)
    assert len(result.tasks) == 1000 and len(asked) == 1000
    assert all(v["node"] == "gw-b" for v in result.tasks)
    asked.clear()
    result = page(ids, TaskQuery(10, prefix="t0299"), view, node_ids)
    assert [v["id"] for v in result.tasks] == [f"t0299{d}" for d in range(10)]
    assert len(asked) == 10  # the run of the prefix, from its start
