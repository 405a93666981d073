"""What an edge node is asked to run: a task's process spec, and its record in the store.

A :class:`TaskSpec` is the core's :class:`~edgesched.core.model.Task` (what the scheduler
needs) plus how to run it as a process (command, environment, limits, restart policy). A
:class:`TaskRecord` is the durable state of one task on this node, as the store keeps it.
Plain dataclasses with JSON round-trips and validation that names the bad field.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from edgesched.core.model import MAX_PRIORITY, Arch, Resources, ServerClass, Task
from edgesched.core.shared import shared_float, shared_text_tuple


class SpecError(ValueError):
    """A task spec that cannot be accepted; the message starts with the field's name."""


#: Integers a spec may carry: what SQLite and the CRDT documents store (int64).
#: The largest integer a spec may carry: what the documents carry exactly (pycrdt writes an
#: integer as a float64 on the wire, so 2**53 + 1 would read back as 2**53 on another replica,
#: and the replicas diverge for good). The store's int64 holds more; the wire does not.
MAX_SPEC_INT = 2**53
#: A task id's length, in characters and in UTF-8 bytes (it names files: ``<id>.log``, ...,
#: and a file name is at most 255 bytes).
MAX_TASK_ID_BYTES = 128
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
#: A task id's characters: ``str.isalnum()`` (what ``\w`` matches, less ``_``) or ``-_.``.
_TASK_ID = re.compile(r"[\w.\-]+")
#: Every field a spec's JSON may carry.
_SPEC_FIELDS = frozenset(
    {
        "id", "command", "workload", "priority", "cpu", "mem_gib", "accel", "threads",
        "env", "cwd", "restart", "max_restarts", "limits", "archs", "server_classes",
        "preemptible", "duration_s", "reconcile", "images", "accel_slices",
    }
)  # fmt: skip
_NUMBER = (int, float)
_RECONCILE_CHOICES = ("", "keep-original", "keep-replacement", "best-score", "longest-running")
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
    #: Slices of one accelerator (MIG instances, SR-IOV virtual functions, time-slicing
    #: shares; see :mod:`edgesched.core.slices`), instead of ``accel`` whole devices.
    accel_slices: int = 0

    def __post_init__(self) -> None:
        ident = self.id
        if (
            not ident
            or len(ident) > MAX_TASK_ID_BYTES
            or not (
                _TASK_ID.fullmatch(ident)
                if type(ident) is str
                else all(c.isalnum() or c in "-_." for c in ident)
            )
            or ident[0] in ".-"
            or (not ident.isascii() and len(ident.encode()) > MAX_TASK_ID_BYTES)
        ):
            raise SpecError(
                "id: 1-128 letters, digits, '-', '_' or '.' (at most 128 bytes in UTF-8), "
                "not starting with '.' or '-'"
            )
        if not self.command:
            raise SpecError("command: a non-empty list of non-empty strings")
        for arg in self.command:
            if not (isinstance(arg, str) and arg):
                raise SpecError("command: a non-empty list of non-empty strings")
        if not 0 <= self.priority <= MAX_PRIORITY:
            raise SpecError(f"priority: must be in [0, {MAX_PRIORITY}]")
        if not math.isfinite(self.cpu) or self.cpu < 0:
            raise SpecError("cpu: must be a finite number >= 0")
        if not math.isfinite(self.mem_gib) or self.mem_gib < 0:
            raise SpecError("mem_gib: must be a finite number >= 0")
        if self.cpu <= 0:
            raise SpecError("cpu: must be > 0")
        if self.accel < 0 or self.threads < 0 or self.max_restarts < 0:
            raise SpecError("accel, threads and max_restarts must be >= 0")
        if self.accel_slices:
            if self.accel_slices < 0:
                raise SpecError("accel_slices: must be >= 0")
            if self.accel:
                raise SpecError("accel_slices: ask whole devices (accel) or slices, not both")
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
            demand=Resources.shared(self.cpu, self.mem_gib, self.accel)
            if not self.accel_slices
            else Resources(self.cpu, self.mem_gib, accel_slices=self.accel_slices),
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
        if self.accel_slices:  # likewise: only a sliced task carries the field
            data["accel_slices"] = self.accel_slices
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
        """Parse and validate an untrusted JSON object; errors name the field.

        Every entry of the policy document carries a spec, so this is on central's hot path:
        each field is read with an inline check of the plain case (its exact type, an ASCII
        string, an integer within int64) and anything else goes through :func:`_field`, which
        accepts what that check was too strict for and refuses the rest. The fields are read
        in the same order either way, so the first refusal is always the same."""
        if type(data) is not dict and not isinstance(data, Mapping):
            raise SpecError("body: must be a JSON object")
        if not _SPEC_FIELDS.issuperset(data):
            unknown = sorted(set(data) - _SPEC_FIELDS)
            raise SpecError(f"{unknown[0]}: unknown field")
        if "id" not in data:
            raise SpecError("id: missing (required)")
        if "command" not in data:
            raise SpecError("command: missing (required)")
        get = data.get

        command = get("command")
        if type(command) is list:
            _check_storable("command", command)
        else:
            command = _field(data, "command", list, [])
        env = get("env", _EMPTY)
        if type(env) is not dict or env:
            env = _field(data, "env", dict, {})
            if env and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                raise SpecError("env: keys and values must be strings")
        limits: Limits | None = _NO_LIMITS
        limits_raw = get("limits", _EMPTY)
        if type(limits_raw) is not dict or (
            limits_raw  # anything but all three unset (what to_json writes) or none given
            and not (
                len(limits_raw) == 3
                and limits_raw.get("memory_mb", 0) is None
                and limits_raw.get("nofile", 0) is None
                and limits_raw.get("cpu_seconds", 0) is None
            )
        ):
            limits_raw = _field(data, "limits", dict, {})
            for key, value in limits_raw.items():
                if key not in ("memory_mb", "nofile", "cpu_seconds"):
                    raise SpecError(f"limits.{key}: unknown field")
                if value is not None:
                    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                        raise SpecError(f"limits.{key}: must be a positive integer")
                    _check_storable(f"limits.{key}", value)
                    limits = None  # one is set
        try:  # (a refusal of the field's type reads as this one too, as it always has)
            restart_raw = get("restart", "on-failure")
            if type(restart_raw) is not str or not restart_raw.isascii():
                restart_raw = _field(data, "restart", str, RestartPolicy.ON_FAILURE.value)
            restart = _RESTART_POLICIES.get(restart_raw) or RestartPolicy(restart_raw)
        except ValueError:
            raise SpecError(
                "restart: must be one of " + ", ".join(p.value for p in RestartPolicy)
            ) from None
        try:
            archs_raw = get("archs", _NONE)
            if type(archs_raw) is not list or archs_raw:
                archs_raw = _field(data, "archs", list, [])
            archs = frozenset(Arch(a) for a in archs_raw) if archs_raw else _NO_SET
        except ValueError:
            raise SpecError("archs: each must be one of arm64, x86_64") from None
        try:
            classes_raw = get("server_classes", _NONE)
            if type(classes_raw) is not list or classes_raw:
                classes_raw = _field(data, "server_classes", list, [])
            classes = frozenset(ServerClass(c) for c in classes_raw) if classes_raw else _NO_SET
        except ValueError:
            raise SpecError(
                "server_classes: each must be one of " + ", ".join(c.value for c in ServerClass)
            ) from None
        images: dict[Arch, str] = {}
        images_raw = get("images", _EMPTY)
        if type(images_raw) is not dict or images_raw:
            for arch, ref in _field(data, "images", dict, {}).items():
                try:
                    images[Arch(arch)] = ref
                except ValueError:
                    raise SpecError(
                        f"images.{arch}: unknown architecture (one of arm64, x86_64)"
                    ) from None
        duration = get("duration_s")
        if (
            duration is not None
            and type(duration) is not float
            and (type(duration) is not int or not -MAX_SPEC_INT <= duration <= MAX_SPEC_INT)
        ):
            duration = _field(data, "duration_s", _NUMBER, None)
        cwd = get("cwd")
        if cwd is not None and (type(cwd) is not str or not cwd.isascii()):
            cwd = _field(data, "cwd", str, None)
        reconcile = get("reconcile", "")
        if type(reconcile) is not str or not reconcile.isascii():
            reconcile = _field(data, "reconcile", str, "")
        if reconcile not in _RECONCILE_CHOICES:
            raise SpecError("reconcile: must be one of " + ", ".join(_RECONCILE_CHOICES[1:]))
        ident = get("id")
        if type(ident) is not str or not ident.isascii():
            ident = _field(data, "id", str, None)
        workload = get("workload", "default")
        if type(workload) is not str or not workload.isascii():
            workload = _field(data, "workload", str, "default")
        priority = get("priority", 50)
        if type(priority) is not int or not -MAX_SPEC_INT <= priority <= MAX_SPEC_INT:
            priority = _field(data, "priority", int, 50)
        cpu = get("cpu", 1.0)
        if type(cpu) is not float and (
            type(cpu) is not int or not -MAX_SPEC_INT <= cpu <= MAX_SPEC_INT
        ):
            cpu = _field(data, "cpu", _NUMBER, 1.0)
        mem_gib = get("mem_gib", 0.5)
        if type(mem_gib) is not float and (
            type(mem_gib) is not int or not -MAX_SPEC_INT <= mem_gib <= MAX_SPEC_INT
        ):
            mem_gib = _field(data, "mem_gib", _NUMBER, 0.5)
        accel = get("accel", 0)
        if type(accel) is not int or not -MAX_SPEC_INT <= accel <= MAX_SPEC_INT:
            accel = _field(data, "accel", int, 0)
        threads = get("threads", 0)
        if type(threads) is not int or not -MAX_SPEC_INT <= threads <= MAX_SPEC_INT:
            threads = _field(data, "threads", int, 0)
        max_restarts = get("max_restarts", 5)
        if type(max_restarts) is not int or not -MAX_SPEC_INT <= max_restarts <= MAX_SPEC_INT:
            max_restarts = _field(data, "max_restarts", int, 5)
        preemptible = get("preemptible", True)
        if type(preemptible) is not bool:
            preemptible = _field(data, "preemptible", bool, True)
        accel_slices = get("accel_slices", 0)
        if type(accel_slices) is not int or not -MAX_SPEC_INT <= accel_slices <= MAX_SPEC_INT:
            accel_slices = _field(data, "accel_slices", int, 0)
        values = (  # in the order of TaskSpec's fields (_SPEC_ORDER)
            # (interned: central holds every spec of the fleet, and the same id is the key of
            # its index, and the same commands and workloads recur across thousands of specs)
            sys.intern(ident) if type(ident) is str else ident,
            shared_text_tuple(tuple(intern_short(a) if type(a) is str else a for a in command)),
            sys.intern(workload) if type(workload) is str else workload,
            priority,
            shared_float(float(cpu)),
            shared_float(float(mem_gib)),
            accel,
            threads,
            dict(env) if env else _NO_ENV,
            cwd,
            restart,
            max_restarts,
            Limits(**limits_raw) if limits is None else limits,
            archs,
            images or _NO_IMAGES,
            classes,
            preemptible,
            float(duration) if duration is not None else None,
            reconcile,
            accel_slices,
        )
        return _new_spec(values) if cls is TaskSpec else cls(*values)


_RESTART_POLICIES = {p.value: p for p in RestartPolicy}
#: The limits of a spec that sets none (frozen, so shared).
_NO_LIMITS = Limits()
#: Text this short is interned where central keeps it decoded (ids, commands, workloads):
#: the same value recurs across thousands of entries, each decoded copy a string of its own.
INTERN_UP_TO = 64


def intern_short(text: str) -> str:
    """``text``, interned if it is short (:data:`INTERN_UP_TO`)."""
    return sys.intern(text) if len(text) <= INTERN_UP_TO else text


def same_json(value: object, default: object) -> bool:
    """Whether a JSON value is ``default`` exactly: equal and of the same types throughout
    (``1 == 1.0 == True`` in Python; not here)."""
    if type(value) is not type(default):
        return False
    if type(value) is dict:
        assert isinstance(default, dict)
        return value.keys() == default.keys() and all(
            same_json(v, default[k]) for k, v in value.items()
        )
    if type(value) is list:
        assert isinstance(default, list)
        return len(value) == len(default) and all(map(same_json, value, default))
    if type(value) is float:
        assert isinstance(default, float)
        return value == default and math.copysign(1.0, value) == math.copysign(1.0, default)
    return value == default


_SPEC_DEFAULTS: dict[str, Any] = {}


def compact_spec_json(data: dict[str, Any]) -> dict[str, Any]:
    """A spec's :meth:`TaskSpec.to_json` without the fields that hold their default (and
    :meth:`TaskSpec.from_json` reads back the same spec): what a packed entry carries. The
    id and the command are required, so always kept."""
    if not _SPEC_DEFAULTS:
        _SPEC_DEFAULTS.update(TaskSpec(id="x", command=("-",)).to_json())
        del _SPEC_DEFAULTS["id"], _SPEC_DEFAULTS["command"]
    return {
        k: v
        for k, v in data.items()
        if k not in _SPEC_DEFAULTS or not same_json(v, _SPEC_DEFAULTS[k])
    }


#: The empty values of a parsed spec, shared (central holds every spec of the fleet, and an
#: empty dict or frozenset of its own costs each ~200 bytes); never written to.
_NO_SET: frozenset[Any] = frozenset()
_NO_ENV: dict[str, str] = {}
_NO_IMAGES: dict[Arch, str] = {}
#: What ``data.get`` answers for an absent object field in :meth:`TaskSpec.from_json` (never
#: written to; it reads as the field's default, an empty object).
_EMPTY: dict[str, Any] = {}
#: An absent list field, likewise.
_NONE: list[Any] = []


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """``data[name]`` (``default`` when absent) if it is a ``kind`` the store can hold; else
    a SpecError naming the field (a boolean is not a number)."""
    value = data.get(name, default)
    if value is default:
        return value
    if isinstance(value, bool) and kind is not bool and bool not in _as_tuple(kind):
        raise SpecError(f"{name}: expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise SpecError(f"{name}: expected {_kind_name(kind)}, got {type(value).__name__}")
    _check_storable(name, value)
    return value


#: TaskSpec's fields, in the order :meth:`TaskSpec.from_json` lists their values.
_SPEC_ORDER = (
    "id", "command", "workload", "priority", "cpu", "mem_gib", "accel", "threads", "env",
    "cwd", "restart", "max_restarts", "limits", "archs", "images", "server_classes",
    "preemptible", "duration_s", "reconcile", "accel_slices",
)  # fmt: skip
if tuple(f.name for f in fields(TaskSpec)) != _SPEC_ORDER:  # a field added or moved
    raise TypeError("TaskSpec's fields changed: update _SPEC_ORDER and TaskSpec.from_json")
_SPEC_SLOTS = tuple(getattr(TaskSpec, name).__set__ for name in _SPEC_ORDER)


def _new_spec(values: tuple[Any, ...]) -> TaskSpec:
    """``TaskSpec(*values)``, built as its dataclass ``__init__`` builds it (every slot set,
    then ``__post_init__``) but without the frozen class's ``object.__setattr__`` per field:
    a third of parsing a spec, which central does for every entry of the policy document."""
    spec = object.__new__(TaskSpec)
    for set_slot, value in zip(_SPEC_SLOTS, values, strict=True):
        set_slot(spec, value)
    spec.__post_init__()
    return spec


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
        raise SpecError(f"{name}: beyond ±2**53, what the documents carry exactly")
    if isinstance(value, str):
        if value.isascii():  # the common case: ASCII always encodes
            return
        try:
            value.encode()
        except UnicodeEncodeError:
            raise SpecError(f"{name}: not valid Unicode (a lone surrogate)") from None
    elif isinstance(value, list):
        for item in value:
            # an ASCII string, null, a float or a boolean: nothing to refuse (spares a call)
            if not ((type(item) is str and item.isascii()) or type(item) in _PLAIN_SCALARS):
                _check_storable(name, item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not (type(key) is str and key.isascii()):
                _check_storable(name, key)
            if not ((type(item) is str and item.isascii()) or type(item) in _PLAIN_SCALARS):
                _check_storable(f"{name}.{key}", item)


_PLAIN_SCALARS = frozenset({type(None), float, bool})


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
