"""The edgesched trace format: one CSV row per task instance, read with exact error positions.

A trace file is CSV (UTF-8, comma-separated, RFC 4180 quoting) with a header naming its
columns in any order (docs/traces.md). Required: ``arrival_s``, ``duration_s``, ``cpu``;
optional: ``mem_gib``, ``accel``, ``priority``, ``class``, ``job``, ``task``, ``deps``. Rows
sharing ``(job, task)`` are the instances of one task; ``deps`` names tasks of the same job
(separated by ``;``) all of whose instances must finish before this row may start.

Every bad value is a :class:`TraceError` naming the file, the line, the column and what was
expected. Parquet is not supported (``pyarrow`` is not a dependency): a ``.parquet`` path is
refused with a message saying so. Pure parsing: :func:`parse_trace` takes lines; only
:func:`read_trace` and :func:`write_trace` touch files.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgesched.core.fleetspec import default_fleet
from edgesched.core.model import MAX_PRIORITY, SECONDS_PER_DAY, Node, Resources, Task
from edgesched.core.strategies import Strategy
from edgesched.core.tracedeps import DependencyCycle, DependencyGate, release_times

#: Columns of the format, in the order :func:`format_trace` writes them.
COLUMNS: tuple[str, ...] = (
    "arrival_s",
    "duration_s",
    "cpu",
    "mem_gib",
    "accel",
    "priority",
    "class",
    "job",
    "task",
    "deps",
)
REQUIRED: tuple[str, ...] = ("arrival_s", "duration_s", "cpu")
#: Separator of the task names in ``deps``.
DEP_SEPARATOR = ";"
#: Class of a row with neither a class nor a priority.
DEFAULT_CLASS = "default"
_NAME_FORBIDDEN = frozenset(';,"\n\r\t/#')


class TraceError(ValueError):
    """A trace that cannot be read: ``source``, 1-based ``line`` and ``column`` (0: none)."""

    def __init__(self, source: str, line: int, column: int, problem: str) -> None:
        where = source
        if line:
            where += f":{line}"
            if column:
                where += f":{column}"
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.line = line
        self.column = column
        self.problem = problem


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One task instance of a trace.

    ``arrival_s``: seconds since the trace's start; ``duration_s``: run time once started;
    ``cpu``: cores; ``mem_gib``: GiB; ``accel``: whole accelerators; ``priority``: 0-999 or
    None (unset); ``cls``: class name or "" (unset); ``job``/``task``: names (job "": the
    unnamed job; task "": the row is a task of its own); ``deps``: names of tasks of the same
    job that must finish first. ``line``: where it was read (0 for rows built in code), not
    compared.
    """

    arrival_s: float
    duration_s: float
    cpu: float
    mem_gib: float = 0.0
    accel: int = 0
    priority: int | None = None
    cls: str = ""
    job: str = ""
    task: str = ""
    deps: tuple[str, ...] = ()
    line: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        for name in ("arrival_s", "duration_s", "cpu", "mem_gib"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.accel < 0:
            raise ValueError(f"accel must be >= 0, got {self.accel}")
        if self.priority is not None and not 0 <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be in [0, {MAX_PRIORITY}], got {self.priority}")
        for name in (self.cls, self.job, self.task, *self.deps):
            bad = _name_problem(name)
            if bad:
                raise ValueError(bad)
        if any(not d for d in self.deps):
            raise ValueError("a dependency name must not be empty")
        if self.task and self.task in self.deps:
            raise ValueError(f"task {self.task!r} depends on itself")


def _name_problem(name: str) -> str:
    if name != name.strip():
        return f"name {name!r} has leading or trailing spaces"
    bad = sorted(set(name) & _NAME_FORBIDDEN)
    if bad:
        return f'name {name!r} holds {bad[0]!r} (names may not hold ; , " / # or control)'
    return ""


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected {what}, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"expected {what}, got {text!r}")
    return value


def _integer(text: str, what: str, high: int | None = None) -> int:
    t = text.strip()
    if not t.isdigit() or not t.isascii():
        raise ValueError(f"expected {what}, got {text!r}")
    value = int(t)
    if high is not None and value > high:
        raise ValueError(f"expected {what}, got {text!r}")
    return value


def check_not_parquet(path: Path) -> None:
    """Refuse a Parquet file with a message saying why (no ``pyarrow`` here)."""
    if path.suffix.lower() in (".parquet", ".pq"):
        raise TraceError(
            str(path), 0, 0, "Parquet is not supported (it would need pyarrow); export it as CSV"
        )


def parse_trace(lines: Iterable[str], source: str) -> list[TraceRow]:
    """Rows of an edgesched trace given as text lines (with or without line ends).

    The header must name every required column, no column twice and no unknown one. Blank
    lines are skipped. Raises :class:`TraceError` at the first bad header cell or value."""
    reader = csv.reader(_numbered(lines), strict=True)
    header: list[str] | None = None
    rows: list[TraceRow] = []
    index: dict[str, int] = {}
    try:
        for cells in reader:
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            if header is None:
                header = [c.strip() for c in cells]
                index = _check_header(header, source, line)
                continue
            rows.append(_row(cells, header, index, source, line))
    except csv.Error as exc:
        raise TraceError(source, reader.line_num, 0, f"malformed CSV: {exc}") from None
    if header is None:
        raise TraceError(source, 0, 0, f"empty file: expected a header ({','.join(COLUMNS)})")
    if "deps" in index:
        known = {(r.job, r.task) for r in rows if r.task}
        for r in rows:
            for d in r.deps:
                if (r.job, d) not in known:
                    raise TraceError(
                        source, r.line, index["deps"] + 1,
                        f"deps: no task {d!r} in job {r.job or '(unnamed)'!r}",
                    )  # fmt: skip
    return rows


def _numbered(lines: Iterable[str]) -> Iterable[str]:
    for text in lines:
        yield text if text.endswith("\n") else text + "\n"


def _check_header(header: list[str], source: str, line: int) -> dict[str, int]:
    index: dict[str, int] = {}
    for col, name in enumerate(header, start=1):
        if name not in COLUMNS:
            raise TraceError(
                source, line, col, f"unknown column {name!r}; expected some of {', '.join(COLUMNS)}"
            )
        if name in index:
            raise TraceError(source, line, col, f"column {name!r} appears twice")
        index[name] = col - 1
    missing = [c for c in REQUIRED if c not in index]
    if missing:
        raise TraceError(source, line, 0, f"header lacks the required column {missing[0]!r}")
    return index


def _row(
    cells: list[str], header: list[str], index: dict[str, int], source: str, line: int
) -> TraceRow:
    if len(cells) != len(header):
        raise TraceError(
            source, line, min(len(cells), len(header)) + 1,
            f"expected {len(header)} columns as in the header, got {len(cells)}",
        )  # fmt: skip

    def cell(name: str) -> str:
        return cells[index[name]].strip() if name in index else ""

    def parsed(name: str, fn: object) -> object:
        text = cell(name)
        try:
            return fn(text)  # type: ignore[operator]
        except ValueError as exc:
            raise TraceError(source, line, index[name] + 1, f"{name}: {exc}") from None

    def names(name: str) -> str:
        text = cell(name)
        bad = _name_problem(text)
        if bad:
            raise TraceError(source, line, index[name] + 1, f"{name}: {bad}")
        return text

    arrival = parsed("arrival_s", lambda t: _number(t, "seconds >= 0"))
    duration = parsed("duration_s", lambda t: _number(t, "seconds >= 0"))
    cpu = parsed("cpu", lambda t: _number(t, "cores >= 0"))
    mem = parsed("mem_gib", lambda t: _number(t, "GiB >= 0") if t else 0.0)
    accel = parsed("accel", lambda t: _integer(t, "a whole number of accelerators") if t else 0)
    priority = parsed(
        "priority",
        lambda t: _integer(t, f"an integer priority 0-{MAX_PRIORITY}", MAX_PRIORITY) if t else None,
    )
    deps: tuple[str, ...] = ()
    if cell("deps"):
        col = index["deps"] + 1
        parts = [p.strip() for p in cell("deps").split(DEP_SEPARATOR)]
        for p in parts:
            bad = _name_problem(p) or ("" if p else "an empty task name")
            if bad:
                raise TraceError(source, line, col, f"deps: {bad}")
        deps = tuple(parts)
    task = names("task") if "task" in index else ""
    if task and task in deps:
        raise TraceError(source, line, index["deps"] + 1, f"deps: task {task!r} depends on itself")
    return TraceRow(
        arrival_s=arrival,  # type: ignore[arg-type]
        duration_s=duration,  # type: ignore[arg-type]
        cpu=cpu,  # type: ignore[arg-type]
        mem_gib=mem,  # type: ignore[arg-type]
        accel=accel,  # type: ignore[arg-type]
        priority=priority,  # type: ignore[arg-type]
        cls=names("class") if "class" in index else "",
        job=names("job") if "job" in index else "",
        task=task,
        deps=deps,
        line=line,
    )


def read_trace(path: Path) -> list[TraceRow]:
    """The rows of the edgesched trace at ``path`` (TraceError for a missing or bad file)."""
    check_not_parquet(path)
    try:
        with path.open(encoding="utf-8", newline="") as f:
            return parse_trace(f, str(path))
    except OSError as exc:
        raise TraceError(str(path), 0, 0, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(str(path), 0, 0, f"not UTF-8 text: {exc.reason}") from None


def _fmt(value: float) -> str:
    return repr(float(value))


def format_trace(rows: Sequence[TraceRow]) -> str:
    """The CSV text of ``rows`` with every column (floats written exactly, ``repr``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow(
            (
                _fmt(r.arrival_s),
                _fmt(r.duration_s),
                _fmt(r.cpu),
                _fmt(r.mem_gib),
                r.accel,
                "" if r.priority is None else r.priority,
                r.cls,
                r.job,
                r.task,
                DEP_SEPARATOR.join(r.deps),
            )
        )
    return out.getvalue()


def write_trace(rows: Sequence[TraceRow], path: Path) -> Path:
    """Write ``rows`` as an edgesched trace at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_trace(rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# The scenario a trace replays

#: SLO wait objective of a class without one set, seconds.
DEFAULT_SLO_WAIT_S = 60.0
#: Flat electricity price of a replay, per kWh (a trace does not say its time of day).
FLAT_PRICE = 0.14


@dataclass(frozen=True, slots=True)
class TraceClass:
    """A workload class of a replay: its name, priority and SLO wait objective."""

    name: str
    priority: int
    slo_wait_s: float


@dataclass(frozen=True, slots=True)
class FlatTariff:
    """One price per kWh at every hour."""

    price: float = FLAT_PRICE

    def price_at(self, t: float) -> float:
        return self.price


@dataclass(frozen=True, slots=True)
class TraceScenario:
    """A trace ready for :func:`edgesched.core.simulator.simulate` (a ``ScenarioLike``).

    ``tasks``: one per row, submitted at its release time (:mod:`edgesched.core.tracedeps`),
    id ``job/task/k`` (``k``: the instance's rank in its task), sorted by submission.
    ``needs``: task id -> the task groups (``job/task``) it waits for; ``members``: group ->
    its task ids (only groups something waits for). ``unplaceable``: tasks no node can hold.
    """

    nodes: tuple[Node, ...]
    tasks: tuple[Task, ...]
    classes: Mapping[str, TraceClass]
    tariff: FlatTariff
    days: float
    source: str = "trace"
    needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    members: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unplaceable: int = 0

    @property
    def horizon_s(self) -> float:
        return self.days * SECONDS_PER_DAY

    @property
    def fleet_cpu(self) -> float:
        return sum(n.capacity.cpu for n in self.nodes)


def class_of(row: TraceRow) -> str:
    """The class a row replays in: its ``class``; else ``p<priority>``; else ``default``."""
    if row.cls:
        return row.cls
    if row.priority is not None:
        return f"p{row.priority}"
    return DEFAULT_CLASS


def trace_scenario(
    rows: Sequence[TraceRow],
    fleet: Sequence[Node] | None = None,
    *,
    slo_wait_s: float = DEFAULT_SLO_WAIT_S,
    slo_by_class: Mapping[str, float] | None = None,
    source: str = "trace",
) -> TraceScenario:
    """The replay of ``rows`` on ``fleet``.

    ``fleet`` None: :func:`edgesched.core.fleetspec.default_fleet` of the released tasks (x86
    general servers, peak CPU 70% of the fleet's). Classes: see :func:`class_of`; a class's
    priority is the highest priority its rows give (0 when none does) and a row without a
    priority takes its class's. SLO wait objective:
    ``slo_by_class[name]``, else ``slo_wait_s``. Times are shifted so that the first arrival
    is at 0; the horizon is the last unconstrained finish plus the longest SLO wait. Raises
    :class:`TraceError` for no rows, an unknown dependency or a dependency cycle."""
    if not rows:
        raise TraceError(source, 0, 0, "the trace holds no tasks")
    if fleet is not None and not fleet:
        raise ValueError("the fleet has no nodes")
    if not (math.isfinite(slo_wait_s) and slo_wait_s >= 0):
        raise ValueError(f"SLO wait must be a finite number >= 0, got {slo_wait_s}")
    slos = dict(slo_by_class or {})
    for name, value in slos.items():
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"SLO wait of {name!r} must be a finite number >= 0, got {value}")
    names = [class_of(r) for r in rows]
    prio: dict[str, int] = {}
    for r, name in zip(rows, names, strict=True):
        prio[name] = max(prio.get(name, 0), r.priority if r.priority is not None else 0)
    classes = {n: TraceClass(n, prio[n], slos.get(n, slo_wait_s)) for n in sorted(prio)}

    groups: dict[tuple[str, str], int] = {}
    group_of: list[int] = []
    ids: list[str] = []
    count: dict[int, int] = {}
    for i, r in enumerate(rows):
        key = (r.job, r.task or f"r{i}")
        g = groups.setdefault(key, len(groups))
        group_of.append(g)
        k = count.get(g, 0)
        count[g] = k + 1
        ids.append(f"{key[0] or '-'}/{key[1]}/{k}")
    needs_of: list[tuple[int, ...]] = [()] * len(groups)
    seen_deps: set[tuple[int, tuple[str, ...]]] = set()
    for r, g in zip(rows, group_of, strict=True):
        if not r.deps or (g, r.deps) in seen_deps:
            continue
        seen_deps.add((g, r.deps))
        deps = list(needs_of[g])  # a task needs what any of its rows names
        for d in r.deps:
            if (r.job, d) not in groups:
                raise TraceError(
                    source, r.line, 0, f"deps: no task {d!r} in job {r.job or '(unnamed)'!r}"
                )
            deps.append(groups[(r.job, d)])
        needs_of[g] = tuple(dict.fromkeys(deps))
    t0 = min(r.arrival_s for r in rows)
    try:
        release = release_times(
            [r.arrival_s - t0 for r in rows], [r.duration_s for r in rows], group_of, needs_of
        )
    except DependencyCycle as exc:
        first = next(r for r, g in zip(rows, group_of, strict=True) if g == exc.group)
        raise TraceError(
            source, first.line, 0, f"task {first.task!r} of job {first.job!r} is in a cycle"
        ) from None

    key_of = {g: f"{job or '-'}/{task}" for (job, task), g in groups.items()}
    if fleet is None:
        fleet = default_fleet(
            [(at, r.duration_s, r.cpu) for at, r in zip(release, rows, strict=True)]
        )
    waited = {d for deps in needs_of for d in deps}
    members: dict[str, list[str]] = {key_of[g]: [] for g in waited}
    needs: dict[str, tuple[str, ...]] = {}
    tasks: list[Task] = []
    cap = [n.capacity for n in fleet]
    unplaceable = 0
    for r, name, g, task_id, at in zip(rows, names, group_of, ids, release, strict=True):
        if g in waited:
            members[key_of[g]].append(task_id)
        if needs_of[g]:
            needs[task_id] = tuple(key_of[d] for d in needs_of[g])
        demand = Resources.shared(float(r.cpu), float(r.mem_gib), int(r.accel))
        if not any(demand.fits_in(c) for c in cap):
            unplaceable += 1
        tasks.append(
            Task(
                id=task_id,
                workload=name,
                priority=r.priority if r.priority is not None else classes[name].priority,
                demand=demand,
                submitted_at=at,
                duration_s=r.duration_s,
            )
        )
    tasks.sort(key=lambda t: (t.submitted_at, t.id))
    end = max(t.submitted_at + (t.duration_s or 0.0) for t in tasks)
    horizon = end + max(c.slo_wait_s for c in classes.values()) + 1.0
    return TraceScenario(
        nodes=tuple(sorted(fleet, key=lambda n: n.id)),
        tasks=tuple(tasks),
        classes=classes,
        tariff=FlatTariff(),
        days=horizon / SECONDS_PER_DAY,
        source=source,
        needs=needs,
        members={k: tuple(v) for k, v in members.items()},
        unplaceable=unplaceable,
    )


def gated(strategy: Strategy, scenario: TraceScenario) -> Strategy:
    """``strategy`` behind a :class:`DependencyGate` when the scenario has dependencies."""
    if not scenario.needs:
        return strategy
    return DependencyGate(strategy, scenario.needs, scenario.members)
