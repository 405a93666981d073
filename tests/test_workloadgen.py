"""Tests of the generated workload families (edgesched.core.workloadgen)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.model import Node, Task
from edgesched.core.workloadgen import (
    FAMILIES,
    FAMILY_NAMES,
    GeneratedScenario,
    draw_params,
    member,
)


def _fits(node: Node, task: Task) -> bool:
    if not task.runs_on(node.arch):
        return False
    if task.server_classes and node.server_class not in task.server_classes:
        return False
    return task.demand.fits_in(node.capacity)


def test_same_member_is_identical() -> None:
    a, b = member("mixed-bursty", 3), member("mixed-bursty", 3)
    assert a == b
    assert a.tasks == b.tasks


def test_members_of_a_family_differ() -> None:
    a, b = member("batch", 0), member("batch", 1)
    assert a.params != b.params
    assert a.tasks != b.tasks


def test_heldout_members_differ_from_training_ones() -> None:
    for family in FAMILY_NAMES:
        train = {draw_params(family, "train", i) for i in range(8)}
        held = [draw_params(family, "heldout", i) for i in range(8)]
        spec = FAMILIES[family]
        for p in held:
            stripped = {(q.load, q.fleet, q.mix) for q in train}
            assert (p.load, p.fleet, p.mix) not in stripped
            # the held-out load band lies above the training one
            assert spec.heldout_load[0] <= p.load <= spec.heldout_load[1]
            assert p.load >= spec.load[1]
        assert all(spec.load[0] <= q.load <= spec.load[1] for q in train)


def test_families_differ_in_kind() -> None:
    kinds = {}
    for family in FAMILY_NAMES:
        sc = member(family, 0)
        priorities = {wc.priority for wc in sc.classes.values()}
        accel_tasks = sum(t.demand.accel > 0 for t in sc.tasks)
        kinds[family] = (len(priorities), accel_tasks / max(len(sc.tasks), 1))
    assert kinds["batch"][0] == 1  # one priority for every task
    assert kinds["mixed-bursty"][0] > 1
    assert kinds["batch"][1] == 0
    assert kinds["accel-heavy"][1] > kinds["mixed-bursty"][1]


def test_members_are_small_and_sorted() -> None:
    for family in FAMILY_NAMES:
        sc = member(family, 1, "heldout")
        assert 5 <= len(sc.nodes) <= 40
        assert 500 <= len(sc.tasks) <= 20_000
        assert list(sc.tasks) == sorted(sc.tasks, key=lambda t: (t.submitted_at, t.id))
        assert len({t.id for t in sc.tasks}) == len(sc.tasks)
        assert all(0 <= t.submitted_at < sc.horizon_s for t in sc.tasks)
        assert set(Counter(t.workload for t in sc.tasks)) <= set(sc.classes)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown family"):
        member("nope", 0)
    with pytest.raises(ValueError, match="split"):
        draw_params("batch", "test", 0)
    with pytest.raises(ValueError, match="index"):
        draw_params("batch", "train", -1)


@settings(max_examples=12, deadline=None)
@given(
    family=st.sampled_from(FAMILY_NAMES),
    split=st.sampled_from(("train", "heldout")),
    index=st.integers(min_value=0, max_value=10_000),
)
def test_every_task_fits_some_node(family: str, split: str, index: int) -> None:
    sc: GeneratedScenario = member(family, index, split)
    shapes = {(t.demand, t.archs, t.server_classes): t for t in sc.tasks}
    for task in shapes.values():
        assert any(_fits(n, task) for n in sc.nodes), (sc.name, task)
    carried = [t for t in sc.tasks if t.id in sc.carried_over]
    assert all(t.submitted_at == 0.0 for t in carried)
