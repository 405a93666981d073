"""The edgesched trace format: reading, errors with file:line:column, the replay scenario,
dependencies (release times and the gate) and the fleet spec."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.fleetspec import (
    FleetSpecError,
    default_fleet,
    parse_fleet,
    peak_cpu,
    presets,
)
from edgesched.core.model import Arch, DecisionKind, ServerClass, Task
from edgesched.core.scheduler import ClusterView, ScheduleResult
from edgesched.core.simulator import simulate
from edgesched.core.strategies import FirstFit, Strategy
from edgesched.core.trace import (
    COLUMNS,
    TraceError,
    TraceRow,
    format_trace,
    gated,
    parse_trace,
    read_trace,
    trace_scenario,
)
from edgesched.core.tracedeps import DependencyCycle, release_times

HEADER = ",".join(COLUMNS)


def test_a_hand_written_trace_reads_with_defaults_for_empty_cells() -> None:
    text = [
        "duration_s,arrival_s,cpu,class,priority,job,task,deps,mem_gib,accel",
        "30,0,2,web,200,j1,a,,4,",
        "5.5,12.25,0.5,,,j1,b,a,,1",
        "",  # blank lines are skipped
        "1,3,1,,7,,,,,",
    ]
    rows = parse_trace(text, "t.csv")
    assert rows == [
        TraceRow(0.0, 30.0, 2.0, 4.0, 0, 200, "web", "j1", "a", ()),
        TraceRow(12.25, 5.5, 0.5, 0.0, 1, None, "", "j1", "b", ("a",)),
        TraceRow(3.0, 1.0, 1.0, 0.0, 0, 7, "", "", "", ()),
    ]
    assert [r.line for r in rows] == [2, 3, 5]


@pytest.mark.parametrize(
    ("lines", "where", "words"),
    [
        (["arrival_s,duration_s,cpu,colour"], "t.csv:1:4", "unknown column 'colour'"),
        (["arrival_s,cpu,duration_s,cpu"], "t.csv:1:4", "appears twice"),
        (["arrival_s,duration_s"], "t.csv:1:", "required column 'cpu'"),
        ([HEADER, "abc,1,1,,,,,,,"], "t.csv:2:1", "arrival_s: expected seconds >= 0, got 'abc'"),
        ([HEADER, "0,-1,1,,,,,,,"], "t.csv:2:2", "duration_s"),
        ([HEADER, "0,1,nan,,,,,,,"], "t.csv:2:3", "cpu"),
        ([HEADER, "0,1,inf,,,,,,,"], "t.csv:2:3", "cpu"),
        ([HEADER, "0,1,1,x,,,,,,"], "t.csv:2:4", "mem_gib"),
        ([HEADER, "0,1,1,,1.5,,,,,"], "t.csv:2:5", "whole number of accelerators"),
        ([HEADER, "0,1,1,,,1000,,,,"], "t.csv:2:6", "priority 0-999"),
        ([HEADER, "0,1,1,,,,a/b,,,"], "t.csv:2:7", "class"),
        ([HEADER, "0,1,1,,,,,,t,t"], "t.csv:2:10", "depends on itself"),
        ([HEADER, "0,1,1,,,,,j,t,u"], "t.csv:2:10", "no task 'u' in job 'j'"),
        ([HEADER, "0,1,1,,,,,j,t,;"], "t.csv:2:10", "empty task name"),
        ([HEADER, "0,1,1"], "t.csv:2:4", "expected 10 columns"),
        ([HEADER, '0,1,1,,,,"unclosed'], "t.csv:", "malformed CSV"),
        ([], "t.csv", "empty file"),
    ],
)
def test_every_bad_value_names_file_line_and_column(
    lines: list[str], where: str, words: str
) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace(lines, "t.csv")
    message = str(info.value)
    assert message.startswith(where), message
    assert words in message


def test_read_trace_refuses_parquet_and_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="Parquet is not supported"):
        read_trace(tmp_path / "x.parquet")
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.csv")
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"arrival_s,duration_s,cpu\n0,1,\xe9\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_trace(bad)


_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
    max_size=8,
).filter(lambda s: not set(s) & set(';,"/#\x85'))
_amounts = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)


@st.composite
def _rows(draw: st.DrawFn) -> list[TraceRow]:
    out: list[TraceRow] = []
    for _ in range(draw(st.integers(0, 6))):
        task = draw(_names)
        earlier = [r.task for r in out if r.task and r.task != task]
        deps = (
            tuple(dict.fromkeys(draw(st.lists(st.sampled_from(earlier), max_size=2))))
            if earlier
            else ()
        )
        out.append(
            TraceRow(
                arrival_s=draw(_amounts),
                duration_s=draw(_amounts),
                cpu=draw(_amounts),
                mem_gib=draw(_amounts),
                accel=draw(st.integers(0, 16)),
                priority=draw(st.none() | st.integers(0, 999)),
                cls=draw(_names),
                job="j",
                task=task,
                deps=deps,
            )
        )
    return out


@settings(max_examples=50, deadline=None)
@given(_rows())
def test_writing_then_reading_gives_the_same_rows(rows: list[TraceRow]) -> None:
    assert parse_trace(format_trace(rows).splitlines(), "mem") == rows


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=6))
def test_any_text_reads_or_fails_with_a_trace_error(lines: list[str]) -> None:
    try:
        parse_trace([HEADER, *lines], "fuzz.csv")
    except TraceError as exc:
        assert str(exc).startswith("fuzz.csv")


def test_classes_come_from_class_then_priority_then_default() -> None:
    rows = [
        TraceRow(10, 5, 1, cls="web", priority=300),
        TraceRow(11, 5, 1, cls="web"),
        TraceRow(12, 5, 1, priority=7),
        TraceRow(13, 5, 1),
    ]
    scenario = trace_scenario(rows, parse_fleet("1xx86-gen"), slo_wait_s=30, slo_by_class={"p7": 2})
    assert {n: (c.priority, c.slo_wait_s) for n, c in scenario.classes.items()} == {
        "web": (300, 30),
        "p7": (7, 2),
        "default": (0, 30),
    }
    by_workload = sorted((t.workload, t.priority, t.submitted_at) for t in scenario.tasks)
    # times shift so that the first arrival is at 0; a row without priority takes its class's
    assert by_workload == [
        ("default", 0, 3.0),
        ("p7", 7, 2.0),
        ("web", 300, 0.0),
        ("web", 300, 1.0),
    ]
    assert scenario.horizon_s == pytest.approx(3 + 5 + 30 + 1)


def test_dependent_instances_are_released_when_their_tasks_would_finish() -> None:
    rows = [
        TraceRow(0, 10, 1, job="j", task="a"),
        TraceRow(2, 30, 1, job="j", task="a"),  # a's second instance ends at 32
        TraceRow(5, 4, 1, job="j", task="b", deps=("a",)),
        TraceRow(50, 1, 1, job="j", task="c", deps=("a", "b")),  # its own arrival is later
        TraceRow(0, 1, 1, job="k", task="a"),  # another job's "a" is another task
    ]
    scenario = trace_scenario(rows, parse_fleet("1xx86-gen"))
    release = {t.id: t.submitted_at for t in scenario.tasks}
    assert release == {"j/a/0": 0, "j/a/1": 2, "j/b/0": 32, "j/c/0": 50, "k/a/0": 0}
    assert scenario.needs == {"j/b/0": ("j/a",), "j/c/0": ("j/a", "j/b")}
    assert scenario.members == {"j/a": ("j/a/0", "j/a/1"), "j/b": ("j/b/0",)}


def test_a_dependency_cycle_is_refused_with_the_line() -> None:
    rows = parse_trace(
        ["arrival_s,duration_s,cpu,job,task,deps", "0,1,1,j,a,b", "0,1,1,j,b,a"], "c.csv"
    )
    with pytest.raises(TraceError, match=r"^c\.csv:[23]: .* in a cycle"):
        trace_scenario(rows, parse_fleet("1xx86-gen"), source="c.csv")
    with pytest.raises(DependencyCycle):
        release_times([0.0], [1.0], [0], [(0,)])


def test_an_empty_trace_is_refused() -> None:
    with pytest.raises(TraceError, match="holds no tasks"):
        trace_scenario(parse_trace([HEADER], "e.csv"), None, source="e.csv")


@dataclass
class _Recorder:
    """A strategy that records when each task it placed started."""

    inner: Strategy
    starts: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.inner.name

    def decide(self, view: ClusterView, pending: Sequence[Task]) -> ScheduleResult:
        result = self.inner.decide(view, pending)
        for d in result.decisions:
            if d.kind is DecisionKind.PLACE and d.task_id:
                self.starts[d.task_id] = view.now
        return result


def test_the_gate_holds_a_dependent_until_its_queued_task_finished() -> None:
    # 3 cores: x takes 2 until 50, a (2 cores) queues behind it; c needs a and is released at
    # 11 (a's unconstrained end), when 1 core is free: only the gate keeps it from starting.
    rows = [
        TraceRow(0, 50, 2, job="j", task="x"),
        TraceRow(1, 10, 2, job="j", task="a"),
        TraceRow(0, 5, 1, job="j", task="c", deps=("a",)),
    ]
    scenario = trace_scenario(rows, parse_fleet("1:general:x86:3c:16g"))
    free = _Recorder(FirstFit())
    simulate(scenario, free)
    assert free.starts["j/c/0"] < free.starts["j/a/0"]  # what the gate is there to prevent
    held = _Recorder(FirstFit())
    report = simulate(scenario, gated(held, scenario))
    assert held.starts["j/a/0"] >= 50
    assert held.starts["j/c/0"] >= held.starts["j/a/0"] + 10
    assert report.completed == 3


def test_fleet_specs_short_and_explicit() -> None:
    nodes = parse_fleet("2xgeneral-x86, 1x arm-gen".replace(" arm", "arm"))
    assert [n.id for n in nodes] == ["arm-gen-01", "x86-gen-01", "x86-gen-02"]
    base = presets()["x86-gen"]
    (half,) = parse_fleet("1:general:x86_64:32c:128g")
    assert half.capacity.cpu == 32 and half.capacity.mem_gib == 128
    assert half.power.peak_w == pytest.approx(base.power.peak_w / 2)
    assert half.power.wake_latency_s == base.power.wake_latency_s
    (acc,) = parse_fleet("1:accel:arm:80c:256g:4a")
    assert acc.server_class is ServerClass.AI_ACCELERATOR and acc.arch is Arch.ARM64
    assert acc.capacity.accel == 4


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", "empty"),
        ("3xgpu", "unknown type 'gpu'"),
        ("0xx86-gen", "count '0'"),
        ("2xx86-gen,", "empty group"),
        ("1:general:x86:64:256g", "'64' is not cores"),
        ("1:general:sparc:64c:256g", "unknown architecture"),
        ("1:storage:arm:32c:64g", "no campus server type is storage-dense arm64"),
        ("1:general:x86:0c:1g", "cores must be a whole number >= 1"),
        ("1:general:x86:1.5c:1g", "cores must be a whole number >= 1"),
        ("20000xx86-gen", "at most"),
    ],
)
def test_bad_fleet_specs_say_what_is_wrong(spec: str, words: str) -> None:
    with pytest.raises(FleetSpecError, match=words):
        parse_fleet(spec)


def test_the_default_fleet_puts_the_peak_at_70_percent() -> None:
    intervals = [(float(i), 100.0, 3.0) for i in range(0, 600, 2)]  # 50 overlapping: 150 cores
    assert peak_cpu(intervals) == pytest.approx(150.0)
    nodes = default_fleet(intervals)
    cores = sum(n.capacity.cpu for n in nodes)
    assert len(nodes) == math.ceil(150 / 0.7 / 64)
    assert 150 / cores <= 0.7 < 150 / (cores - 64)
    # back to back: one ending when the next starts is not counted twice
    assert peak_cpu([(0.0, 10.0, 1.0), (10.0, 5.0, 1.0)]) == 1.0


def test_a_task_needs_what_any_of_its_rows_names() -> None:
    rows = [
        TraceRow(0, 10, 1, job="j", task="a"),
        TraceRow(0, 20, 1, job="j", task="c"),
        TraceRow(0, 1, 1, job="j", task="b", deps=("a",)),
        TraceRow(0, 1, 1, job="j", task="b", deps=("c",)),
    ]
    scenario = trace_scenario(rows, parse_fleet("1xx86-gen"))
    assert scenario.needs == {"j/b/0": ("j/a", "j/c"), "j/b/1": ("j/a", "j/c")}
    assert {t.id: t.submitted_at for t in scenario.tasks}["j/b/0"] == 20
