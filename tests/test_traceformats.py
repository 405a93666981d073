"""Importers of public traces: Alibaba 2018 batch_task and Google 2019 instance_events.

Hand-written lines follow the public schemas (alibaba/clusterdata cluster-trace-v2018
schema.txt and trace_2018.md's Job-A DAG; google/cluster-data clusterdata_trace_format_v3.proto
InstanceEvent fields), not our writer; the synthetic writers are then checked against the
importers on whole files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.fleetspec import peak_cpu
from edgesched.core.trace import TraceError, TraceRow, read_trace, trace_scenario
from edgesched.core.traceformats import (
    GOOGLE_AFTER_WINDOW,
    Machine,
    google_class,
    guess_format,
    load_trace,
    parse_alibaba,
    parse_google,
)
from edgesched.core.tracegen import (
    default_peak_cores,
    format_alibaba,
    synthetic_tasks,
    to_rows,
    write_alibaba,
    write_edgesched,
    write_google,
)

# Job-A of trace_2018.md section 2.3, in batch_task's column order (schema.txt):
# task_name, instance_num, job_name, task_type, status, start_time, end_time, plan_cpu, plan_mem
JOB_A = [
    "M1,2,j_A,1,Terminated,1000,1060,100.0,0.39",
    "M2_1,1,j_A,1,Terminated,1060,1090,50.0,0.2",
    "M3_1,1,j_A,1,Terminated,1061,1100,200.0,0.2",
    "R4_2,3,j_A,1,Terminated,1090,1120,100.0,1.5",
    "M5_3_4,1,j_A,1,Terminated,1120,1130,100.0,0.2",
    "task_LTg0MTUwNTA5Mjg4MzU2MjcxMg==,1,j_B,12,Terminated,1005,1015,50.0,0.1",
]


def test_alibaba_job_a_gives_one_row_per_instance_with_its_dag() -> None:
    rows, stats = parse_alibaba(JOB_A, "batch_task.csv", Machine(cores=96, mem_gib=512))
    assert stats.rows == len(rows) == 2 + 1 + 1 + 3 + 1 + 1 and not stats.dropped
    deps = {r.task: r.deps for r in rows}
    assert deps == {
        "M1": (),
        "M2_1": ("M1",),
        "M3_1": ("M1",),
        "R4_2": ("M2_1",),
        "M5_3_4": ("M3_1", "R4_2"),
        "task_LTg0MTUwNTA5Mjg4MzU2MjcxMg==": (),
    }
    r4 = [r for r in rows if r.task == "R4_2"]
    assert (
        r4
        == [
            TraceRow(
                1090.0,
                30.0,
                1.0,
                1.5 / 100 * 512,
                cls="batch",
                job="j_A",
                task="R4_2",
                deps=("M2_1",),
            )
        ]
        * 3
    )
    assert {r.line for r in r4} == {4}
    # replayed: task 5 is released when tasks 3 and 4 would both have finished
    scenario = trace_scenario(rows, None)
    release = {t.id: t.submitted_at for t in scenario.tasks}
    assert release["j_A/M5_3_4/0"] == 1120 - 1000
    assert release["j_A/R4_2/2"] == 1090 - 1000


def test_alibaba_keeps_what_ran_and_counts_what_it_drops() -> None:
    lines = [
        "task_name,instance_num,job_name,task_type,status,start_time,end_time,plan_cpu,plan_mem",
        "M1,1,j_1,1,Terminated,10,20,100,1",
        "M2_1,1,j_1,1,Running,15,0,100,1",  # still running: dropped, so...
        "R3_2,2,j_1,1,Terminated,30,40,100,1",  # ...its dependency on task 2 is dropped
        "M1,1,j_2,1,Failed,12,13,100,1",  # failed tasks ran: kept
        "M1,1,j_3,1,Terminated,0,13,100,1",  # start outside the window
        "M1,0,j_4,1,Terminated,5,13,100,1",
        "M1,1,j_5,1,Terminated,9,8,100,1",
        "M1,1,j_6,1,Terminated,9,18,,1",
        "M1,1,j_7,1,Cancelled,9,18,100,1",
    ]
    rows, stats = parse_alibaba(lines, "b.csv")
    assert [(r.job, r.task, r.deps) for r in rows] == [
        ("j_1", "M1", ()),
        ("j_1", "R3_2", ()),
        ("j_1", "R3_2", ()),
        ("j_2", "M1", ()),
    ]
    assert stats.dropped == {
        "status Running": 1,
        "status Cancelled": 1,
        "dependencies on tasks not in the trace": 1,
        "start or end outside the window (0)": 1,
        "no instances": 1,
        "end before start": 1,
        "without plan_cpu": 1,
    }


@pytest.mark.parametrize(
    ("line", "where", "words"),
    [
        ("M1,1,j_1,1,Terminated,10,20,100", "b.csv:1:9", "expected 9 columns"),
        ("M1,1,j_1,1,Terminated,10,20,100,1,7", "b.csv:1:10", "expected 9 columns"),
        ("M1,x,j_1,1,Terminated,10,20,100,1", "b.csv:1:2", "instance_num"),
        ("M1,1.5,j_1,1,Terminated,10,20,100,1", "b.csv:1:2", "whole number"),
        ("M1,1,j_1,1,Terminated,ten,20,100,1", "b.csv:1:6", "start_time"),
        ("M1,1,j_1,1,Terminated,10,-20,100,1", "b.csv:1:7", "end_time"),
        ("M1,1,j_1,1,Terminated,10,20,lots,1", "b.csv:1:8", "plan_cpu"),
        ("M1,1,j_1,1,Terminated,10,20,100,101", "b.csv:1:9", "plan_mem: expected memory 0-100"),
        (",1,j_1,1,Terminated,10,20,100,1", "b.csv:1:1", "task_name"),
        ("M1,1,,1,Terminated,10,20,100,1", "b.csv:1:3", "job_name"),
    ],
)
def test_alibaba_bad_lines_name_file_line_and_column(line: str, where: str, words: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_alibaba(["M1,1,j_0,1,Terminated,1,2,100,1", line][1:], "b.csv")
    assert str(info.value).startswith(where + ": "), str(info.value)
    assert words in str(info.value)


# InstanceEvent fields in proto order; a BigQuery export flattens resource_request.
GOOGLE_HEADER = (
    "time,type,collection_id,scheduling_class,missing_type,collection_type,priority,"
    "alloc_collection_id,instance_index,machine_id,alloc_instance_index,"
    "resource_request_cpus,resource_request_memory"
)


def test_google_pairs_submit_with_the_end_of_the_last_run() -> None:
    lines = [
        GOOGLE_HEADER,
        # instance 0 of 42: submitted, scheduled, evicted, resubmitted, rescheduled, finished
        "300000000,3,42,1,,0,110,0,0,1001,-1,,",
        "100000000,0,42,1,,0,110,0,0,0,-1,0.0625,0.01",  # (rows out of order, as exported)
        "700000000,4,42,1,,0,110,0,0,1001,-1,,",
        "710000000,0,42,1,,0,115,0,0,0,-1,0.125,0.02",
        "800000000,3,42,1,,0,115,0,0,1002,-1,,",
        "950000000,6,42,1,,0,115,0,0,1002,-1,,",
        # instance 1: killed while pending
        "100000000,0,42,1,,0,110,0,1,0,-1,0.0625,0.01",
        "200000000,7,42,1,,0,110,0,1,0,-1,,",
        # instance 2: scheduled, still running when the window closes
        "100000000,0,42,1,,0,110,0,2,0,-1,0.0625,0.01",
        "150000000,3,42,1,,0,110,0,2,1003,-1,,",
        f"{GOOGLE_AFTER_WINDOW},6,42,1,,0,110,0,2,1003,-1,,",
        # a production instance of another job, event types by name, failed
        "0,SUBMIT,43,3,,0,200,0,0,0,-1,0.5,0.25",
        "0,SCHEDULE,43,3,,0,200,0,0,1004,-1,,",
        "60000000,FAIL,43,3,,0,200,0,0,1004,-1,,",
        # an instance first seen running (its SUBMIT before the trace)
        "5000000,3,44,1,,0,110,0,0,1005,-1,0.1,0.1",
        "6000000,6,44,1,,0,110,0,0,1005,-1,,",
    ]
    rows, stats = parse_google(lines, "ev.csv", Machine(cores=32, mem_gib=100))
    assert rows == [
        TraceRow(0.0, 60.0, 16.0, 25.0, priority=200, cls="production", job="43", task="i0"),
        TraceRow(
            100.0, 150.0, 4.0, 2.0, priority=115, cls="best-effort-batch", job="42", task="i0"
        ),
    ]
    assert stats.dropped == {
        "instances never scheduled": 1,
        "instances with no end in the file": 1,
        "instances without SUBMIT": 1,
    }


def test_google_json_lines_with_nested_requests_and_int64_strings() -> None:
    lines = [
        '{"time":"600000000","type":"0","collection_id":"7","scheduling_class":"2",'
        '"collection_type":"0","priority":"360","instance_index":"3",'
        '"resource_request":{"cpus":0.03125,"memory":0.0625}}',
        "",
        '{"time":"601000000","type":"3","collection_id":"7","priority":"360",'
        '"instance_index":"3","machine_id":"9"}',
        '{"time":"661000000","type":"6","collection_id":"7","instance_index":"3"}',
    ]
    rows, _ = parse_google(lines, "ev.json")
    assert rows == [
        TraceRow(600.0, 60.0, 2.0, 16.0, priority=360, cls="monitoring", job="7", task="i3")
    ]


@pytest.mark.parametrize(
    ("lines", "where", "words"),
    [
        ([GOOGLE_HEADER, "x,0,42,1,,0,110,0,0,0,-1,0.1,0.1"], "g:2:1", "time: expected"),
        ([GOOGLE_HEADER, "1,11,42,1,,0,110,0,0,0,-1,0.1,0.1"], "g:2:2", "type: expected"),
        ([GOOGLE_HEADER, "1,0,42,1,,0,1000,0,0,0,-1,0.1,0.1"], "g:2:7", "priority"),
        ([GOOGLE_HEADER, "1,0,42,1,,0,110,0,0,0,-1,-0.1,0.1"], "g:2:12", "cpus"),
        ([GOOGLE_HEADER, "1,0,42,1,,0,110,0,zero,0,-1,0.1,0.1"], "g:2:9", "instance_index"),
        ([GOOGLE_HEADER, "1,0,42"], "g:2:4", "expected 13 columns"),
        (["time,type,collection_id"], "g:1", "instance_index"),
        (['{"time": 1, "type": 0,'], "g:1:", "not a JSON object"),
        (
            ['{"time":"1","type":"0","collection_id":"1","instance_index":0}', "[1, 2]"],
            "g:2:1",
            "expected a JSON object",
        ),
        (
            ['{"time":"1","type":"0","collection_id":"1","instance_index":"x"}'],
            "g:1:",
            "instance_index",
        ),
        (
            ['{"time":"1","type":"0","collection_id":"1","instance_index":0,"resource_request":3}'],
            "g:1:",
            "resource_request",
        ),
        ([], "g", "empty file"),
    ],
)
def test_google_bad_lines_name_file_line_and_column(
    lines: list[str], where: str, words: str
) -> None:
    with pytest.raises(TraceError) as info:
        parse_google(lines, "g")
    assert str(info.value).startswith(where), str(info.value)
    assert words in str(info.value)


def test_google_tiers() -> None:
    assert [google_class(p) for p in (0, 99, 100, 115, 116, 119, 120, 359, 360, 450)] == [
        "free", "free", "best-effort-batch", "best-effort-batch", "mid", "mid",
        "production", "production", "monitoring", "monitoring",
    ]  # fmt: skip


def test_the_synthetic_files_import_to_the_same_work_in_every_format(tmp_path: Path) -> None:
    tasks = synthetic_tasks(3, instances=250, hours=0.25)
    assert sum(t.instances for t in tasks) == 250
    expected = to_rows(tasks)
    ali, _ = load_trace(write_alibaba(tasks, tmp_path / "a.csv"), "alibaba2018")
    assert ali == expected
    assert read_trace(write_edgesched(tasks, tmp_path / "e.csv")) == expected
    assert any(r.deps for r in expected) and any(r.task.startswith("task_") for r in expected)

    def work(rows: list[TraceRow]) -> Counter[tuple[float, float, float, float]]:
        return Counter(
            (r.arrival_s, r.duration_s, round(r.cpu, 9), round(r.mem_gib, 9)) for r in rows
        )

    for name in ("g.csv", "g.jsonl"):
        goo, stats = load_trace(
            write_google(tasks, tmp_path / name, jsonl=name.endswith("l")), "google2019"
        )
        assert not stats.dropped
        assert work(goo) == work(expected)
        assert {r.cls for r in goo} == {"best-effort-batch"}


def test_the_synthetic_hour_is_sized_for_the_fleet() -> None:
    tasks = synthetic_tasks(0, instances=2400)
    assert sum(t.instances for t in tasks) == 2400
    assert all(t.start_s >= 1 and t.end_s > t.start_s for t in tasks)
    assert all(t.start_s < 3601 for t in tasks if not t.deps)  # jobs arrive within the hour
    peak = peak_cpu([(r.arrival_s, r.duration_s, r.cpu) for r in to_rows(tasks)])
    assert 0.9 * default_peak_cores(2400) <= peak <= default_peak_cores(2400) == 0.7 * 3 * 64
    scenario = trace_scenario(to_rows(tasks), None)  # so the default fleet is three servers
    assert len(scenario.nodes) == 3
    assert synthetic_tasks(0, instances=2400) == tasks
    assert synthetic_tasks(1, instances=2400) != tasks
    assert format_alibaba(tasks).count("\n") == len(tasks)


def test_formats_are_guessed_only_when_safe(tmp_path: Path) -> None:
    tasks = synthetic_tasks(1, instances=40, hours=0.1)
    assert guess_format(write_alibaba(tasks, tmp_path / "a.csv")) == "alibaba2018"
    assert guess_format(write_edgesched(tasks, tmp_path / "e.csv")) == "edgesched"
    assert guess_format(write_google(tasks, tmp_path / "g.csv")) == "google2019"
    assert guess_format(write_google(tasks, tmp_path / "g.jsonl", jsonl=True)) == "google2019"
    other = tmp_path / "o.csv"
    other.write_text("a,b,c\n1,2,3\n")
    assert guess_format(other) is None
    assert guess_format(tmp_path / "missing.csv") is None
    with pytest.raises(TraceError, match="Parquet is not supported"):
        load_trace(tmp_path / "x.parquet", "alibaba2018")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=5))
def test_any_text_imports_or_fails_with_a_trace_error(lines: list[str]) -> None:
    for parse in (parse_alibaba, parse_google):
        try:
            parse(lines, "fuzz")
        except TraceError as exc:
            assert str(exc).startswith("fuzz")


_value = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 2**64), st.floats(), st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=6), st.floats(), max_size=2),
)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(
                ["time", "type", "collection_id", "instance_index", "priority", "resource_request"]
            ),
            _value,
        ),
        max_size=4,
    )
)
def test_any_json_event_imports_or_fails_with_a_trace_error(docs: list[dict[str, object]]) -> None:
    try:
        parse_google([json.dumps(d) for d in docs], "fuzz.jsonl")
    except TraceError as exc:
        assert str(exc).startswith("fuzz.jsonl")


def test_an_alibaba_file_cannot_expand_past_the_instance_cap() -> None:
    line = "M1,1500000,j_1,1,Terminated,10,20,100,1"
    rows, _ = parse_alibaba([line], "big.csv")
    assert len(rows) == 1_500_000
    with pytest.raises(TraceError, match=r"^big\.csv:2:2: instance_num: the file holds more than"):
        parse_alibaba([line, line.replace("j_1", "j_2")], "big.csv")
