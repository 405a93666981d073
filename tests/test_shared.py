"""Shared copies of equal decoded values (edgesched.core.shared): what is shared is the same
value exactly, what is not exactly the same stays apart, and the tables are bounded."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from edgesched.core.model import Resources
from edgesched.core.shared import SharedValues, shared_float, shared_text_tuple
from edgesched.core.task import TaskSpec, TaskState
from edgesched.sync.schema import AssignmentRef, TaskReport


def test_a_table_hands_back_the_first_equal_value_and_stops_growing_when_full() -> None:
    table: SharedValues[tuple[str, ...]] = SharedValues(limit=2)
    first = ("sleep", "1")
    assert table(first) is first
    again = tuple(["sleep", "1"])
    assert again is not first and table(again) is first
    b, c = ("b",), ("c",)
    assert table(b) is b and len(table) == 2
    assert table(c) is c and len(table) == 2  # full: handed back, not kept
    assert table(tuple(["c"])) is not c


@given(st.floats(allow_nan=False))
def test_a_shared_float_is_the_same_float(value: float) -> None:
    got = shared_float(value)
    assert got == value and math.copysign(1.0, got) == math.copysign(1.0, value)
    assert type(got) is float


def test_sizes_are_shared_and_timestamps_and_zeros_are_not() -> None:
    assert shared_float(float("0.25")) is shared_float(0.5 / 2)
    ts = 1_700_000_000.5
    assert shared_float(ts) is ts
    assert shared_float(float("0.1")) is not shared_float(float(str(0.1)))  # not a size
    zero = -0.0
    assert shared_float(zero) is zero  # (0.0 == -0.0: never shared as one)


def test_only_tuples_of_text_are_shared() -> None:
    assert shared_text_tuple(("a", "b")) is shared_text_tuple(tuple(["a", "b"]))
    ones = (1,)
    trues = (True,)
    assert shared_text_tuple(ones) is ones and shared_text_tuple(trues) is trues


def test_decoded_specs_reports_and_demands_share_their_values() -> None:
    a = TaskSpec.from_json({"id": "a", "command": ["sleep", "60"], "cpu": 0.5, "mem_gib": 2.0})
    b = TaskSpec.from_json({"id": "b", "command": ["sleep", "60"], "cpu": 0.5, "mem_gib": 2.0})
    assert a.command is b.command and a.cpu is b.cpu and a.mem_gib is b.mem_gib
    assert a.to_task(1.0).demand is b.to_task(2.0).demand
    ref = {"central": "c1", "epoch": 3, "replacement": False, "score": 0.5}
    raw = {"state": "running", "updated_at": 5.0, "assignment": ref}
    one, two = TaskReport.from_entry(raw), TaskReport.from_entry(dict(raw))
    assert one.assignment is not None and one.assignment is two.assignment
    assert one.state is TaskState.RUNNING
    other = TaskReport.from_entry({**raw, "assignment": {**ref, "score": -0.0}})
    assert other.assignment == AssignmentRef("c1", 3, False, 0.0)
    assert other.assignment is not None and math.copysign(1.0, other.assignment.score) < 0


def test_a_shared_demand_is_exactly_the_demand_asked_for() -> None:
    assert Resources.shared(1.0, 2.0, 0) is Resources.shared(1.0, 2.0, 0)
    odd = Resources.shared(1, 2.0, 0)  # (an int: another value's type, not shared)
    assert type(odd.cpu) is int
    neg = Resources.shared(-0.0, 1.0, 0)
    assert math.copysign(1.0, neg.cpu) < 0
