"""What an edge node is asked to run: a task's process spec, and its record in the store.

A :class:`TaskSpec` is the core's :class:`~edgesched.core.model.Task` (what the scheduler
needs) plus how to run it as a process (command, environment, limits, restart policy). A
:class:`TaskRecord` is the durable state of one task on this node, as the store keeps it.
Plain dataclasses with JSON round-trips and validation that names the bad field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from edgesched.core.model import MAX_PRIORITY, Arch, Resources, ServerClass, Task


class SpecError(ValueError):
    """A task spec that cannot be accepted; the message starts with the field's name."""


#: Integers a spec may carry: what SQLite and the CRDT documents store (int64).
MAX_SPEC_INT = 2**63 - 1
#: An OCI image reference (``[registry[:port]/]name[/name...][:tag][@digest]``), as
#: distribution/reference defines it, in ASCII, without anchors (the API document adds them).
IMAGE_REF = (
    r"(?:[a-zA-Z0-9]+(?:-+[a-zA-Z0-9]+)*(?:\.[a-zA-Z0-9]+(?:-+[a-zA-Z0-9]+)*)*(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
_IMAGE_REF = re.compile(IMAGE_REF)
MAX_IMAGE_REF = 255
#: The affinity planner lays out one entry per thread: a bound keeps a typo from exhausting
#: the node's memory in its scheduling loop (1024: more than any node's cores).
MAX_THREADS = 1024


class RestartPolicy(StrEnum):
    NEVER = "never"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


class TaskState(StrEnum):
    ACCEPTED = "accepted"  # committed, waiting to be placed
    PLACED = "placed"  # decided for this node, process not started yet
    RUNNING = "running"
    EXITED = "exited"  # finished with exit code 0 (terminal)
    FAILED = "failed"  # finished non-zero, no more restarts (terminal)
    CANCELLED = "cancelled"  # stopped on request (terminal)
    PREEMPTED = "preempted"  # stopped to make room; back to the queue

    @property
    def terminal(self) -> bool:
        return self in (TaskState.EXITED, TaskState.FAILED, TaskState.CANCELLED)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-process limits: cgroup v2 where writable, rlimits otherwise."""

    memory_mb: int | None = None
    nofile: int | None = None
    cpu_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class TaskSpec:
    id: str
    command: tuple[str, ...]
    workload: str = "default"
    priority: int = 50
    cpu: float = 1.0
    mem_gib: float = 0.5
    accel: int = 0
    threads: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    restart: RestartPolicy = RestartPolicy.ON_FAILURE
    max_restarts: int = 5
    limits: Limits = field(default_factory=Limits)
    archs: frozenset[Arch] = frozenset()
    #: The image to run on each architecture (empty: the command runs as it is). A task with
    #: images is placed only on an architecture it has one for; the node runs the command in
    #: that image with its ``[edge] container_runtime``, or, without one, as it is with the
    #: image's reference in ``EDGESCHED_IMAGE`` (see :mod:`edgesched.edge.container`).
    images: Mapping[Arch, str] = field(default_factory=dict)
    server_classes: frozenset[ServerClass] = frozenset()
    preemptible: bool = True
    duration_s: float | None = None  # expected run time, a hint for the scheduler
    #: Which copy survives if this task ends up placed twice across a partition (see
    #: :mod:`edgesched.sync.reconcile`); empty: central's default.
    reconcile: str = ""

    def __post_init__(self) -> None:
        if not self.id or len(self.id) > 128 or not all(c.isalnum() or c in "-_." for c in self.id):
            raise SpecError("id: 1-128 characters of letters, digits, '-', '_' or '.'")
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise SpecError("command: a non-empty list of non-empty strings")
        if not 0 <= self.priority <= MAX_PRIORITY:
            raise SpecError(f"priority: must be in [0, {MAX_PRIORITY}]")
        for name in ("cpu", "mem_gib"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise SpecError(f"{name}: must be a finite number >= 0")
        if self.cpu <= 0:
            raise SpecError("cpu: must be > 0")
        if self.accel < 0 or self.threads < 0 or self.max_restarts < 0:
            raise SpecError("accel, threads and max_restarts must be >= 0")
        if self.threads > MAX_THREADS:
            raise SpecError(f"threads: at most {MAX_THREADS}")
        if self.duration_s is not None and (
            not math.isfinite(self.duration_s) or self.duration_s < 0
        ):
            raise SpecError("duration_s: must be a finite number >= 0")
        for arch, ref in self.images.items():
            check_image(arch, ref)

    def to_task(self, submitted_at: float) -> Task:
        """The scheduler's view of this spec."""
        return Task(
            id=self.id,
            workload=self.workload,
            priority=self.priority,
            demand=Resources(cpu=self.cpu, mem_gib=self.mem_gib, accel=self.accel),
            submitted_at=submitted_at,
            duration_s=self.duration_s,
            archs=self.archs,
            images=self.images,
            server_classes=self.server_classes,
            preemptible=self.preemptible,
            threads=self.threads,
        )

    def to_json(self) -> dict[str, Any]:
        data = self._to_json()
        if self.images:  # only when set: a node or central of an older release refuses the
            # unknown field, so specs without images stay readable across a rolling upgrade
            data["images"] = {a.value: ref for a, ref in sorted(self.images.items())}
        return data

    def _to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "command": list(self.command),
            "workload": self.workload,
            "priority": self.priority,
            "cpu": self.cpu,
            "mem_gib": self.mem_gib,
            "accel": self.accel,
            "threads": self.threads,
            "env": dict(self.env),
            "cwd": self.cwd,
            "restart": self.restart.value,
            "max_restarts": self.max_restarts,
            "limits": {
                "memory_mb": self.limits.memory_mb,
                "nofile": self.limits.nofile,
                "cpu_seconds": self.limits.cpu_seconds,
            },
            "archs": sorted(a.value for a in self.archs),
            "server_classes": sorted(c.value for c in self.server_classes),
            "preemptible": self.preemptible,
            "duration_s": self.duration_s,
            "reconcile": self.reconcile,
        }

    @classmethod
    def from_json(cls, data: object) -> TaskSpec:
        """Parse and validate an untrusted JSON object; errors name the field."""
        if not isinstance(data, Mapping):
            raise SpecError("body: must be a JSON object")
        known = {
            "id", "command", "workload", "priority", "cpu", "mem_gib", "accel", "threads",
            "env", "cwd", "restart", "max_restarts", "limits", "archs", "server_classes",
            "preemptible", "duration_s", "reconcile", "images",
        }  # fmt: skip
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"{unknown[0]}: unknown field")
        for required in ("id", "command"):
            if required not in data:
                raise SpecError(f"{required}: missing (required)")

        def get(name: str, kind: type | tuple[type, ...], default: Any) -> Any:
            value = data.get(name, default)
            if value is default:
                return value
            if isinstance(value, bool) and kind is not bool and bool not in _as_tuple(kind):
                raise SpecError(f"{name}: expected {_kind_name(kind)}, got a boolean")
            if not isinstance(value, kind):
                raise SpecError(f"{name}: expected {_kind_name(kind)}, got {type(value).__name__}")
            _check_storable(name, value)
            return value

        command = get("command", list, [])
        env = get("env", dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise SpecError("env: keys and values must be strings")
        limits_raw = get("limits", dict, {})
        for key, value in limits_raw.items():
            if key not in ("memory_mb", "nofile", "cpu_seconds"):
                raise SpecError(f"limits.{key}: unknown field")
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise SpecError(f"limits.{key}: must be a positive integer")
        try:
            restart = RestartPolicy(get("restart", str, RestartPolicy.ON_FAILURE.value))
        except ValueError:
            raise SpecError(
                "restart: must be one of " + ", ".join(p.value for p in RestartPolicy)
            ) from None
        try:
            archs = frozenset(Arch(a) for a in get("archs", list, []))
        except ValueError:
            raise SpecError("archs: each must be one of arm64, x86_64") from None
        try:
            classes = frozenset(ServerClass(c) for c in get("server_classes", list, []))
        except ValueError:
            raise SpecError(
                "server_classes: each must be one of " + ", ".join(c.value for c in ServerClass)
            ) from None
        images: dict[Arch, str] = {}
        for arch, ref in get("images", dict, {}).items():
            try:
                images[Arch(arch)] = ref
            except ValueError:
                raise SpecError(
                    f"images.{arch}: unknown architecture (one of arm64, x86_64)"
                ) from None
        duration = get("duration_s", (int, float), None)
        cwd = get("cwd", str, None)
        reconcile = get("reconcile", str, "")
        choices = ("", "keep-original", "keep-replacement", "best-score", "longest-running")
        if reconcile not in choices:
            raise SpecError("reconcile: must be one of " + ", ".join(choices[1:]))
        return cls(
            id=get("id", str, None),
            command=tuple(command),
            workload=get("workload", str, "default"),
            priority=get("priority", int, 50),
            cpu=float(get("cpu", (int, float), 1.0)),
            mem_gib=float(get("mem_gib", (int, float), 0.5)),
            accel=get("accel", int, 0),
            threads=get("threads", int, 0),
            env=dict(env),
            cwd=cwd,
            restart=restart,
            max_restarts=get("max_restarts", int, 5),
            limits=Limits(**limits_raw),
            archs=archs,
            images=images,
            server_classes=classes,
            preemptible=get("preemptible", bool, True),
            duration_s=float(duration) if duration is not None else None,
            reconcile=reconcile,
        )


def check_image(arch: object, ref: object) -> None:
    """SpecError naming ``images.<arch>`` unless ``ref`` is an OCI image reference."""
    if not isinstance(arch, Arch):
        raise SpecError(f"images.{arch}: unknown architecture (one of arm64, x86_64)")
    if not isinstance(ref, str):
        raise SpecError(f"images.{arch.value}: expected a string, got {type(ref).__name__}")
    if len(ref) > MAX_IMAGE_REF or not _IMAGE_REF.fullmatch(ref):
        raise SpecError(
            f"images.{arch.value}: not an image reference ([registry/]name[:tag][@digest], "
            f"lower-case name, at most {MAX_IMAGE_REF} characters): {ref[:80]!r}"
        )


def _check_storable(name: str, value: object) -> None:
    """Refuse what the store and the CRDT documents cannot hold: integers beyond int64 and
    strings with lone surrogates (JSON's ``"\\udc80"``), which are not UTF-8."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SPEC_INT:
        raise SpecError(f"{name}: out of range")
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise SpecError(f"{name}: not valid Unicode (a lone surrogate)") from None
    elif isinstance(value, list):
        for item in value:
            _check_storable(name, item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_storable(name, key)
            _check_storable(name, item)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object", bool: "a boolean"}  # fmt: skip
    return " or ".join(names.get(k, k.__name__) for k in _as_tuple(kind))


@dataclass(frozen=True, slots=True)
class Assignment:
    """Central's placement of a task on this node, as its policy document said.

    ``epoch`` counts central's placements of the task (a failover is a new epoch);
    ``replacement`` marks a placement that failed the task over from another node; ``score``
    is what central's core scored the node. These are the facts the reconcile rule
    (:mod:`edgesched.sync.reconcile`) compares when a task ends up placed twice."""

    central: str
    epoch: int
    replacement: bool = False
    score: float = 0.0

    def __post_init__(self) -> None:
        if not self.central:
            raise SpecError("assignment.central: must not be empty")
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 0:
            raise SpecError(f"assignment.epoch: must be an integer >= 0, got {self.epoch!r}")
        if not math.isfinite(self.score):
            raise SpecError("assignment.score: must be finite")

    def to_json(self) -> dict[str, Any]:
        return {
            "central": self.central,
            "epoch": self.epoch,
            "replacement": self.replacement,
            "score": self.score,
        }

    @classmethod
    def from_json(cls, data: object) -> Assignment:
        if not isinstance(data, Mapping):
            raise SpecError("assignment: expected an object")
        central, epoch = data.get("central"), data.get("epoch")
        replacement, score = data.get("replacement", False), data.get("score", 0.0)
        if not isinstance(central, str):
            raise SpecError("assignment.central: expected a string")
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise SpecError("assignment.epoch: expected an integer")
        if not isinstance(replacement, bool):
            raise SpecError("assignment.replacement: expected a boolean")
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise SpecError("assignment.score: expected a number")
        return cls(central, epoch, replacement, float(score))


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task's durable state on this node (one row of the store's ``tasks`` table).

    ``assignment`` is set for a task central placed here (None for local submissions)."""

    spec: TaskSpec
    state: TaskState
    submitted_at: float
    updated_at: float
    decided_by: str = ""  # "central", "edge-autonomous", "edge-connected"
    node_id: str | None = None
    pid: int | None = None
    pid_started_at: float | None = None  # process create time, to tell a reused pid apart
    cores: tuple[int, ...] = ()
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    assignment: Assignment | None = None

    def with_state(self, state: TaskState, at: float, **changes: Any) -> TaskRecord:
        return replace(self, state=state, updated_at=at, **changes)
