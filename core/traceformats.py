"""Importers of public cluster traces into edgesched trace rows (docs/traces.md says what each
keeps and drops).

* ``alibaba2018``: the ``batch_task`` table of Alibaba's cluster-trace-v2018 (CSV, no header;
  task_name, instance_num, job_name, task_type, status, start_time, end_time, plan_cpu,
  plan_mem). One row per instance (``instance_num`` rows per task, all with the task's start
  and end: batch_task has no per-instance times). DAG task names (``M1``, ``R2_1``,
  ``J3_1_2``: task 3 of the job needs tasks 1 and 2) become dependencies within the job.
* ``google2019``: the ``instance_events`` table of Google's 2019 Borg traces, as a BigQuery
  CSV export with a header or as JSON lines (nested ``resource_request``). Each instance's
  first SUBMIT is its arrival; its duration is its last SCHEDULE to the first terminal event
  after it (EVICT, FAIL, FINISH, KILL, LOST).

Normalized resources are scaled by a reference machine (:class:`Machine`, default 64 cores
and 256 GiB, the campus's x86 general server). Every malformed line is a
:class:`~edgesched.core.trace.TraceError` naming file, line and column. Pure parsing of
lines; :func:`load_trace` is the one function that opens a file.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from edgesched.core.model import MAX_PRIORITY
from edgesched.core.trace import TraceError, TraceRow, check_not_parquet, parse_trace

FORMATS: tuple[str, ...] = ("edgesched", "alibaba2018", "google2019")
ALIBABA_COLUMNS: tuple[str, ...] = (
    "task_name",
    "instance_num",
    "job_name",
    "task_type",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
)
#: Statuses of batch_task rows replayed (the others never ran to an end in the window).
ALIBABA_KEPT_STATUS = frozenset({"Terminated", "Failed"})
_ALIBABA_STATUSES = frozenset(
    {"Terminated", "Failed", "Running", "Waiting", "Ready", "Cancelled", "Interrupted"}
)
#: Most instances an Alibaba file may expand to (each is a row, then a simulated task).
MAX_INSTANCES = 2_000_000
#: The class every Alibaba instance replays in.
ALIBABA_CLASS = "batch"
_DAG_NAME = re.compile(r"[A-Za-z]+(\d+)((?:_\d+)*)")

#: Borg 2019 event types (clusterdata_trace_format_v3.proto, EventType).
GOOGLE_EVENTS: dict[str, int] = {
    "SUBMIT": 0,
    "QUEUE": 1,
    "ENABLE": 2,
    "SCHEDULE": 3,
    "EVICT": 4,
    "FAIL": 5,
    "FINISH": 6,
    "KILL": 7,
    "LOST": 8,
    "UPDATE_PENDING": 9,
    "UPDATE_RUNNING": 10,
}
_SUBMIT, _SCHEDULE = 0, 3
_TERMINAL = frozenset({4, 5, 6, 7, 8})
#: Order of same-time events of one instance: submission, updates while pending, schedule,
#: updates while running, end.
_RANK = {0: 0, 1: 1, 2: 2, 9: 3, 3: 4, 10: 5, 4: 6, 5: 6, 6: 6, 7: 6, 8: 6}
#: Time the 2019 traces give to events after the trace window (int64 max), microseconds.
GOOGLE_AFTER_WINDOW = 2**63 - 1
#: Borg priority tiers (ClusterData2019.md) and the class each replays in.
GOOGLE_TIERS: tuple[tuple[int, str], ...] = (
    (99, "free"),
    (115, "best-effort-batch"),
    (119, "mid"),
    (359, "production"),
    (MAX_PRIORITY, "monitoring"),
)
_GOOGLE_ALIASES: dict[str, tuple[str, ...]] = {
    "time": ("time",),
    "type": ("type",),
    "collection_id": ("collection_id",),
    "instance_index": ("instance_index",),
    "priority": ("priority",),
    "cpus": ("resource_request.cpus", "resource_request_cpus", "cpus"),
    "memory": ("resource_request.memory", "resource_request_memory", "memory"),
    "resource_request": ("resource_request",),
}


@dataclass(frozen=True, slots=True)
class Machine:
    """The reference machine normalized resources are fractions of."""

    cores: float = 64.0
    mem_gib: float = 256.0

    def __post_init__(self) -> None:
        for name in ("cores", "mem_gib"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"machine {name} must be a finite number > 0, got {value}")


@dataclass(frozen=True, slots=True)
class ImportStats:
    """What an import kept (rows) and what it dropped, by reason (counted in source lines
    for Alibaba, instances for Google)."""

    rows: int
    dropped: Mapping[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        if not self.dropped:
            return f"{self.rows:,} rows, nothing dropped"
        parts = ", ".join(f"{n:,} {why}" for why, n in sorted(self.dropped.items()))
        return f"{self.rows:,} rows; dropped: {parts}"


def google_class(priority: int) -> str:
    """The Borg tier of a priority, as the class name it replays in."""
    for high, name in GOOGLE_TIERS:
        if priority <= high:
            return name
    return GOOGLE_TIERS[-1][1]


def _safe(name: str) -> str:
    """A trace name made safe for edgesched names (``/`` in base64 task names becomes ``_``)."""
    out = "".join("_" if c in ';,"/#' or not c.isprintable() else c for c in name.strip())
    return out or "_"


# --------------------------------------------------------------------------------------------
# Alibaba 2018 batch_task


def _num(text: str, source: str, line: int, col: int, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise TraceError(
            source, line, col, f"{ALIBABA_COLUMNS[col - 1]}: expected {what}, got {text!r}"
        )
    return value


def parse_alibaba(
    lines: Iterable[str], source: str, machine: Machine | None = None
) -> tuple[list[TraceRow], ImportStats]:
    """Rows of an Alibaba 2018 ``batch_task`` table (a header line naming the columns, as
    some copies add, is skipped).

    ``plan_cpu`` 100 = 1 core; ``plan_mem`` is 0-100 of the reference machine's memory. Rows
    kept: status Terminated or Failed, start and end inside the window (not 0), end >= start,
    ``plan_cpu`` given, ``instance_num`` >= 1. A dependency on a task number the job does not
    have (the trace is sampled) is dropped and counted."""
    machine = machine or Machine()
    dropped: Counter[str] = Counter()
    records: list[tuple[int, str, int, str, float, float, float, float]] = []
    total = 0
    for line, cells in _csv_rows(_lines(lines), source):
        if not cells or all(not c.strip() for c in cells):
            continue
        cells = [c.strip() for c in cells]
        if line == 1 and cells[0] == "task_name":
            continue
        if len(cells) != len(ALIBABA_COLUMNS):
            raise TraceError(
                source,
                line,
                min(len(cells), len(ALIBABA_COLUMNS)) + 1,
                f"expected {len(ALIBABA_COLUMNS)} columns ({','.join(ALIBABA_COLUMNS)}), "
                f"got {len(cells)}",
            )
        name, inst, job, _type, status, start, end, cpu, mem = cells
        if not name:
            raise TraceError(source, line, 1, "task_name: expected a name, got ''")
        if not job:
            raise TraceError(source, line, 3, "job_name: expected a name, got ''")
        n = _num(inst, source, line, 2, "a whole number of instances")
        if n < 0 or n != int(n):
            raise TraceError(
                source, line, 2, f"instance_num: expected a whole number >= 0, got {inst!r}"
            )
        t0 = _num(start, source, line, 6, "seconds")
        t1 = _num(end, source, line, 7, "seconds")
        if t0 < 0:
            raise TraceError(source, line, 6, f"start_time: expected seconds >= 0, got {start!r}")
        if t1 < 0:
            raise TraceError(source, line, 7, f"end_time: expected seconds >= 0, got {end!r}")
        if not cpu:
            dropped["without plan_cpu"] += 1
            continue
        c = _num(cpu, source, line, 8, "cores x 100")
        m = _num(mem, source, line, 9, "memory 0-100") if mem else 0.0
        if c < 0:
            raise TraceError(source, line, 8, f"plan_cpu: expected cores x 100 >= 0, got {cpu!r}")
        if not 0 <= m <= 100:
            raise TraceError(source, line, 9, f"plan_mem: expected memory 0-100, got {mem!r}")
        if status not in ALIBABA_KEPT_STATUS:
            dropped[f"status {status or '(empty)'}"] += 1
            continue
        if t0 == 0 or t1 == 0:
            dropped["start or end outside the window (0)"] += 1
            continue
        if t1 < t0:
            dropped["end before start"] += 1
            continue
        if n == 0:
            dropped["no instances"] += 1
            continue
        total += int(n)
        if total > MAX_INSTANCES:
            raise TraceError(
                source, line, 2, f"instance_num: the file holds more than {MAX_INSTANCES:,} "
                "instances (a replay of that many would not finish; cut the file)",
            )  # fmt: skip
        records.append((line, name, int(n), job, t0, t1, c / 100.0, m / 100.0 * machine.mem_gib))
    by_number: dict[tuple[str, str], str] = {}
    for _, name, _, job, *_ in records:
        m_ = _DAG_NAME.fullmatch(name)
        if m_:
            by_number.setdefault((job, m_.group(1)), _safe(name))
    rows: list[TraceRow] = []
    for line, name, n, job, t0, t1, cpu_cores, mem_gib in records:
        deps: list[str] = []
        m_ = _DAG_NAME.fullmatch(name)
        if m_ and m_.group(2):
            for number in m_.group(2).strip("_").split("_"):
                target = by_number.get((job, number))
                if target is None or number == m_.group(1):
                    dropped["dependencies on tasks not in the trace"] += 1
                else:
                    deps.append(target)
        row = TraceRow(
            arrival_s=t0,
            duration_s=t1 - t0,
            cpu=cpu_cores,
            mem_gib=mem_gib,
            cls=ALIBABA_CLASS,
            job=_safe(job),
            task=_safe(name),
            deps=tuple(dict.fromkeys(deps)),
            line=line,
        )
        rows.extend([row] * n)
    return rows, ImportStats(len(rows), dict(dropped))


# --------------------------------------------------------------------------------------------
# Google 2019 instance_events


@dataclass(slots=True)
class _Instance:
    events: list[tuple[int, int, int, int, float | None, float | None, int | None]]


def _event_type(value: object) -> int:
    if isinstance(value, str) and value.strip().upper() in GOOGLE_EVENTS:
        return GOOGLE_EVENTS[value.strip().upper()]
    n = _int(value)
    if not 0 <= n <= 10:
        raise ValueError
    return n


def _int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        t = value.strip()
        if re.fullmatch(r"-?\d+", t):
            return int(t)
        f = float(t)
        if f.is_integer():
            return int(f)
    raise ValueError


def _float(value: object) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError
    f = float(value) if isinstance(value, int | float | str) else math.nan
    if not (math.isfinite(f) and f >= 0):
        raise ValueError
    return f


def _google_records(
    lines: Iterable[str], source: str
) -> Iterator[tuple[int, Mapping[str, object], Mapping[str, int]]]:
    """(line, fields, column of each field) of each event, from CSV with a header or JSONL."""
    it = iter(_lines(lines))
    first = ""
    line = 0
    for text in it:
        line += 1
        if text.strip():
            first = text
            break
    if not first:
        raise TraceError(source, 0, 0, "empty file: expected instance events")
    if first.lstrip().startswith("{"):
        yield from _jsonl(first, line, it, source)
        return
    _, first_cells = next(_csv_rows([first], source), (0, []))
    header = [h.strip() for h in first_cells]
    cols: dict[str, int] = {}
    for key, names in _GOOGLE_ALIASES.items():
        for name in names:
            if name in header:
                cols[key] = header.index(name)
                break
    for key in ("time", "type", "collection_id", "instance_index"):
        if key not in cols:
            raise TraceError(
                source, line, 0, f"header lacks the column {key!r} (a BigQuery export of "
                "instance_events names time, type, collection_id, instance_index, ...)",
            )  # fmt: skip
    for k, cells in _csv_rows(it, source, line):
        n = line + k
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise TraceError(
                source, n, min(len(cells), len(header)) + 1,
                f"expected {len(header)} columns as in the header, got {len(cells)}",
            )  # fmt: skip
        yield n, {k: cells[i] for k, i in cols.items()}, {k: i + 1 for k, i in cols.items()}


def _jsonl(
    first: str, line: int, rest: Iterator[str], source: str
) -> Iterator[tuple[int, Mapping[str, object], Mapping[str, int]]]:
    n = line
    for text in _chain(first, rest):
        if not text.strip():
            n += 1
            continue
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            col = exc.colno if isinstance(exc, json.JSONDecodeError) else 0
            raise TraceError(source, n, col, "not a JSON object") from None
        if not isinstance(doc, dict):
            raise TraceError(source, n, 1, "expected a JSON object per line")
        fields: dict[str, object] = {k: doc.get(k) for k in _GOOGLE_ALIASES if k in doc}
        req = doc.get("resource_request")
        if isinstance(req, dict):
            fields["cpus"] = req.get("cpus")
            fields["memory"] = req.get("memory")
        elif req is not None:
            raise TraceError(
                source, n, _col(text, "resource_request"), "resource_request: expected an object"
            )
        cols = {k: _col(text, "resource_request" if k in ("cpus", "memory") else k) for k in fields}
        yield n, fields, cols
        n += 1


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def _col(text: str, key: str) -> int:
    return text.find(f'"{key}"') + 1


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Event:
    """One event's fields, with where each was read (for errors)."""

    fields: Mapping[str, object]
    cols: Mapping[str, int]
    source: str
    line: int

    def error(self, key: str, what: str) -> TraceError:
        got = self.fields.get(key)
        return TraceError(
            self.source, self.line, self.cols.get(key, 0), f"{key}: expected {what}, got {got!r}"
        )

    def get(self, key: str, conv: Callable[[object], T], what: str) -> T:
        try:
            return conv(self.fields.get(key))
        except (ValueError, TypeError):
            raise self.error(key, what) from None


def _opt_int(value: object) -> int | None:
    return None if value in (None, "") else _int(value)


def parse_google(
    lines: Iterable[str], source: str, machine: Machine | None = None
) -> tuple[list[TraceRow], ImportStats]:
    """Rows of a Google 2019 ``instance_events`` export (CSV with a header, or JSON lines).

    Times are microseconds; events at the after-window time (int64 max) are ignored. Each
    instance (collection_id, instance_index) becomes one row: arrival at its first SUBMIT,
    duration from its last SCHEDULE to the first EVICT/FAIL/FINISH/KILL/LOST after it,
    resources the last request given up to that SCHEDULE (cpus x machine cores, memory x
    machine GiB), priority the last given, class its Borg tier (:func:`google_class`).
    Instances without a SUBMIT, never scheduled, or with no end in the file are dropped and
    counted."""
    machine = machine or Machine()
    instances: dict[tuple[int, int], _Instance] = {}
    seq = 0
    for line, f, cols in _google_records(lines, source):
        ev = _Event(f, cols, source, line)
        t = ev.get("time", _int, "microseconds >= 0")
        if t < 0:
            raise ev.error("time", "microseconds >= 0")
        kind = ev.get("type", _event_type, "an event type 0-10 or its name (SUBMIT, ...)")
        cid = ev.get("collection_id", _int, "an integer collection id")
        idx = ev.get("instance_index", _int, "an integer instance index")
        prio = ev.get("priority", _opt_int, f"a priority 0-{MAX_PRIORITY}")
        if prio is not None and not 0 <= prio <= MAX_PRIORITY:
            raise ev.error("priority", f"a priority 0-{MAX_PRIORITY}")
        cpus = ev.get("cpus", _float, "a normalized CPU request >= 0")
        mem = ev.get("memory", _float, "a normalized memory request >= 0")
        if t == GOOGLE_AFTER_WINDOW:
            continue
        key = (cid, idx)
        inst = instances.setdefault(key, _Instance([]))
        seq += 1
        inst.events.append((t, _RANK[kind], seq, kind, cpus, mem, prio))
    dropped: Counter[str] = Counter()
    rows: list[TraceRow] = []
    for (cid, idx), inst in instances.items():
        inst.events.sort()
        submit = next((e[0] for e in inst.events if e[3] == _SUBMIT), None)
        last_schedule = max(
            (i for i, e in enumerate(inst.events) if e[3] == _SCHEDULE), default=None
        )
        if submit is None:
            dropped["instances without SUBMIT"] += 1
            continue
        if last_schedule is None:
            dropped["instances never scheduled"] += 1
            continue
        end = next((e[0] for e in inst.events[last_schedule + 1 :] if e[3] in _TERMINAL), None)
        if end is None:
            dropped["instances with no end in the file"] += 1
            continue
        cpus = mem = None
        prio = None
        for e in inst.events[: last_schedule + 1]:
            cpus = e[4] if e[4] is not None else cpus
            mem = e[5] if e[5] is not None else mem
        for e in inst.events:
            prio = e[6] if e[6] is not None else prio
        start = inst.events[last_schedule][0]
        rows.append(
            TraceRow(
                arrival_s=submit / 1e6,
                duration_s=(end - start) / 1e6,
                cpu=(cpus or 0.0) * machine.cores,
                mem_gib=(mem or 0.0) * machine.mem_gib,
                priority=prio,
                cls=google_class(prio or 0),
                job=str(cid),
                task=f"i{idx}",
            )
        )
    rows.sort(key=lambda r: (r.arrival_s, r.job, r.task))
    return rows, ImportStats(len(rows), dict(dropped))


# --------------------------------------------------------------------------------------------
# Files


def _csv_rows(
    lines: Iterable[str], source: str, offset: int = 0
) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of CSV text; malformed CSV is a TraceError at its line."""
    reader = csv.reader(lines, strict=True)
    try:
        for cells in reader:
            yield reader.line_num, cells
    except csv.Error as exc:
        raise TraceError(source, offset + reader.line_num, 0, f"malformed CSV: {exc}") from None


def _lines(lines: Iterable[str]) -> Iterator[str]:
    for text in lines:
        yield text if text.endswith("\n") else text + "\n"


def guess_format(path: Path) -> str | None:
    """The format of ``path`` when its extension or first line tells it safely, else None."""
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return "google2019"
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            first = next((t for t in f if t.strip()), "")
    except OSError:
        return None
    if first.lstrip().startswith("{"):
        return "google2019"
    cells = [c.strip() for c in next(csv.reader([first]), [])] if first else []
    if "arrival_s" in cells:
        return "edgesched"
    if "collection_id" in cells and "instance_index" in cells:
        return "google2019"
    if cells[:1] == ["task_name"] or _looks_alibaba(cells):
        return "alibaba2018"
    return None


def _looks_alibaba(cells: list[str]) -> bool:
    """Nine cells, a batch_task status in the fifth and numbers where batch_task has them."""
    if len(cells) != len(ALIBABA_COLUMNS) or cells[4] not in _ALIBABA_STATUSES:
        return False
    try:
        for i in (1, 5, 6, 7):
            float(cells[i])
    except ValueError:
        return False
    return True


def load_trace(
    path: Path, fmt: str, machine: Machine | None = None
) -> tuple[list[TraceRow], ImportStats]:
    """The rows of the trace file ``path`` in format ``fmt`` (one of :data:`FORMATS`)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; choose from {', '.join(FORMATS)}")
    check_not_parquet(path)
    try:
        with path.open(encoding="utf-8", newline="") as f:
            if fmt == "edgesched":
                rows = parse_trace(f, str(path))
                return rows, ImportStats(len(rows))
            if fmt == "alibaba2018":
                return parse_alibaba(f, str(path), machine)
            return parse_google(f, str(path), machine)
    except OSError as exc:
        raise TraceError(str(path), 0, 0, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(str(path), 0, 0, f"not UTF-8 text: {exc.reason}") from None
