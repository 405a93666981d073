"""The CRDT documents' schema: one frozen dataclass per entry kind, one validating decoder.

Every entry a peer writes into a document is built from one of these classes
(:meth:`Entry.to_entry`) and every entry it reads is decoded by :func:`decode` at the boundary:
a wrong type, a missing field, a number the wire cannot carry exactly or a value out of range
is a :class:`SchemaError` naming the entry kind and the field, which the document classes turn
into a counted, logged refusal of that one entry (:class:`Refusals`), never an exception that
reaches a loop. Fields a newer writer added are ignored (and counted), so a rolling upgrade
does not refuse what an older peer cannot read.

Numbers: documents carry JSON numbers as float64, so an integer field accepts an integral float
(pycrdt reads ``5`` back as ``5.0``) up to 2**53, and a float field refuses NaN and infinities.

    node document  ``node.registration``  :class:`Registration`
                   ``node.models``        kind -> :class:`ModelReport`
                   ``node.power``         :class:`PowerReport`
                   ``tasks[id]``          :class:`TaskReport`
    policy doc     ``policy.mode``        a :class:`~edgesched.core.policy.PolicyMode` value
                   ``policy.tidal``       :class:`TidalEntry`
                   ``assignments[id]``    :class:`AssignmentEntry`
                   ``stops[task@node]``   :class:`StopOrder`
                   ``power[node]``        :class:`PowerOrder`
                   ``models[kind]``       :class:`ModelEntry`
"""

from __future__ import annotations

import dataclasses
import logging
import math
import types
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, ClassVar, Self, TypeVar, Union, get_args, get_origin, get_type_hints

from edgesched.core.model import Arch, Node, Resources, ServerClass
from edgesched.core.model import PowerModel as CorePowerModel
from edgesched.core.service import ServiceSpec
from edgesched.core.shared import SharedValues, exact_zero_free, shared_float
from edgesched.core.task import (
    MAX_SPEC_INT,
    Assignment,
    SpecError,
    TaskRecord,
    TaskSpec,
    TaskState,
    compact_spec_json,
    intern_short,
    same_json,
)

log = logging.getLogger("edgesched.sync.schema")

#: Largest integer a float64 carries exactly (JSON numbers in the documents are float64).
MAX_WIRE_INT = 2**53
#: Longest string any entry field may hold (a model's base64 data has its own cap).
MAX_TEXT = 4096

E = TypeVar("E", bound="Entry")


class SchemaError(ValueError):
    """An entry that does not match its kind; ``str()`` names the kind and the field."""

    def __init__(self, kind: str, field_name: str, problem: str) -> None:
        super().__init__(f"{kind}.{field_name}: {problem}" if field_name else f"{kind}: {problem}")
        self.kind = kind
        self.field = field_name
        self.problem = problem

    @property
    def reason(self) -> str:
        """A short, bounded label for counters: the field and the kind of problem."""
        what = self.problem.split(":")[0].split(",")[0][:40]
        return f"{self.field or '-'}: {what}"


class Entry:
    """Base of every document entry: frozen dataclasses with :meth:`to_entry`/``from_entry``."""

    KIND: ClassVar[str] = "entry"
    # Slotted, as every entry class is: central holds every task report and assignment of
    # the fleet decoded (a million at 10,000 nodes), and an instance dict is ~3x the entry.
    __slots__ = ()

    def to_entry(self) -> dict[str, Any]:
        """The JSON value written into the document."""
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in dataclasses.fields(self))  # type: ignore[arg-type]
        out = {}
        for name in names:
            value = getattr(self, name)
            out[name] = value if type(value) in _PLAIN else _encode(value)
        return out

    @classmethod
    def from_entry(cls, raw: object) -> Self:
        """Decode and validate ``raw``; :class:`SchemaError` naming what is wrong."""
        return _decoder(cls)(raw, cls.KIND)


#: Each entry class's field names, in order (``dataclasses.fields`` builds them anew per call).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
#: Values written as they are.
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _encode(value: object) -> object:
    if isinstance(value, Entry):
        return value.to_entry()
    if isinstance(value, TaskSpec):
        return value.to_json()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    return value


#: The assignment references of task reports, shared: most of a node's 100 reports follow
#: the same central at one of a few epochs (see :mod:`edgesched.core.shared`).
_REFS: SharedValues[AssignmentRef] = SharedValues()


def _shared_ref(ref: AssignmentRef) -> AssignmentRef:
    if (
        type(ref.central) is str
        and type(ref.epoch) is int
        and type(ref.replacement) is bool
        and type(ref.score) is float
        and exact_zero_free(ref.score)
    ):
        return _REFS(ref)
    return ref


_DEFAULTS: dict[type, dict[str, object]] = {}


def _encoded_defaults(cls: type[Entry]) -> dict[str, object]:
    defaults = _DEFAULTS.get(cls)
    if defaults is None:
        defaults = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = _encode(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = _encode(f.default_factory())
        _DEFAULTS[cls] = defaults
    return defaults


def compact_entry(cls: type[Entry], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a ``cls`` entry's :meth:`Entry.to_entry`) without the fields that hold their
    default, and an assignment's spec without its own (:func:`compact_spec_json`): what a
    packed entry carries ([schema.md](../docs/schema.md#packed-entries)). The decoder reads
    an absent field as its default, so ``cls.from_entry`` of either is the same entry."""
    defaults = _encoded_defaults(cls)
    out = {k: v for k, v in data.items() if k not in defaults or not same_json(v, defaults[k])}
    spec = out.get("spec")
    if type(spec) is dict and _hints(cls).get("spec") is TaskSpec:
        out["spec"] = compact_spec_json(spec)
    return out


# --- the reference decoder ----------------------------------------------------------------------
#
# The rules, stated once and generically: each field's type hint is resolved and dispatched on
# per field per entry. This is the definition the compiled decoders below must equal (the
# property test in tests/test_schema_decoder.py compares them on valid and invalid entries of
# every kind), and their slow path: whatever a compiled decoder has no fast path for (a
# refusal, a subclass of str, a container field, a non-dict mapping) it hands to these.


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = get_type_hints(cls)
    return hints


def _reference_decode(cls: type[E], raw: object, kind: str) -> E:
    if not isinstance(raw, Mapping):
        raise SchemaError(kind, "", f"expected an object, got {_type_name(raw)}")
    hints = _hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for f in fields:
        if f.name in raw:
            values[f.name] = _reference_value(hints[f.name], raw[f.name], kind, f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SchemaError(kind, f.name, "missing")
    try:
        entry = cls(**values)
    except SchemaError:
        raise
    except (SpecError, ValueError, TypeError) as exc:  # a class's own checks
        raise SchemaError(kind, "", str(exc)[:200]) from None
    if len(values) < len(raw):
        IGNORED_FIELDS[kind] += len(raw) - len(values)
    return entry


#: Fields newer writers added that this version ignored, by entry kind (process-wide).
IGNORED_FIELDS: Counter[str] = Counter()


def _reference_value(hint: Any, raw: object, kind: str, name: str) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if raw is None:
            if len(args) < len(get_args(hint)):
                return None
            raise SchemaError(kind, name, "must not be null")
        return _reference_value(args[0], raw, kind, name)
    if origin is dict:
        key_t, value_t = get_args(hint)
        if not isinstance(raw, Mapping):
            raise SchemaError(kind, name, f"expected an object, got {_type_name(raw)}")
        return {
            _reference_value(key_t, k, kind, f"{name}[{k!r}]"): _reference_value(
                value_t, v, kind, f"{name}[{k!r}]"
            )
            for k, v in raw.items()
        }
    if origin is tuple:
        (item_t, _ellipsis) = get_args(hint)
        if not isinstance(raw, list | tuple):
            raise SchemaError(kind, name, f"expected an array, got {_type_name(raw)}")
        return tuple(_reference_value(item_t, v, kind, f"{name}[{i}]") for i, v in enumerate(raw))
    if isinstance(hint, type) and issubclass(hint, Entry):
        return _reference_decode(hint, raw, f"{kind}.{name}")
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(raw)
        except ValueError:
            choices = ", ".join(str(m.value) for m in hint)
            raise SchemaError(kind, name, f"must be one of {choices}, got {raw!r}"[:200]) from None
    if hint is bool:
        if not isinstance(raw, bool):
            raise SchemaError(kind, name, f"expected a boolean, got {_type_name(raw)}")
        return raw
    if hint is int:
        return wire_int(raw, kind, name)
    if hint is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise SchemaError(kind, name, f"expected a number, got {_type_name(raw)}")
        if not math.isfinite(raw):
            raise SchemaError(kind, name, "must be finite")
        return float(raw)
    if hint is str:
        if not isinstance(raw, str):
            raise SchemaError(kind, name, f"expected a string, got {_type_name(raw)}")
        if len(raw) > MAX_TEXT:
            raise SchemaError(kind, name, f"longer than {MAX_TEXT} characters")
        return raw
    if hint is TaskSpec:
        return _spec_field(raw, kind, name)
    if hint is Any:  # opaque JSON (a tidal profile): checked by its own parser
        return raw
    raise TypeError(f"schema: no decoder for {hint!r} ({kind}.{name})")  # a bug in a class


# --- the compiled decoders ----------------------------------------------------------------------
#
# Central decodes every entry of every replica (a restart over 10,000 nodes: a million), so
# the reference's per-field introspection (``dataclasses.fields``, ``get_origin``, a chain of
# isinstance checks) is resolved once per class instead: :func:`_compile` turns each field's
# hint into a decoder closure ``(raw, kind, field name) -> value`` with a fast path for the
# exact types the documents carry (str, int, float, bool, an enum's value, null for an
# optional field), and decoding an entry is one loop over (name, decoder, default). Anything
# off the fast path falls through to :func:`_reference_value` of the same hint, so a refusal
# is the reference's, word for word.

_FieldDecoder = Callable[[object, str, str], Any]
_EntryDecoder = Callable[[object, str], Any]

#: The compiled decoder of each entry class, built on its first decode.
_DECODERS: dict[type, _EntryDecoder] = {}
_ABSENT = object()
_REQUIRED = object()
_FACTORY = object()


def _decoder(cls: type[E]) -> Callable[[object, str], E]:
    """``cls``'s compiled decoder: ``(raw, kind) -> entry`` (the rules of the reference)."""
    try:
        return _DECODERS[cls]
    except KeyError:
        decode = _DECODERS[cls] = _compile(cls)
        return decode


def _compile(cls: type[E]) -> Callable[[object, str], E]:
    hints = get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    # (name, decoder, default): _REQUIRED, the default, or _FACTORY (the class makes one)
    plan = tuple(
        (
            f.name,
            _compile_field(hints[f.name]),
            f.default
            if f.default is not dataclasses.MISSING
            else _REQUIRED
            if f.default_factory is dataclasses.MISSING
            else _FACTORY,
        )
        for f in fields
    )
    # A slotted frozen dataclass (every entry is one) is built as its generated ``__init__``
    # builds it: each field into its slot, then ``__post_init__``; but through the slot's
    # descriptor, without the frozen class's ``object.__setattr__`` per field (a third of a
    # small entry's cost) and without the keyword dict ``cls(**values)`` takes.
    slots = [cls.__dict__.get(f.name) for f in fields]
    direct = (
        all(isinstance(s, types.MemberDescriptorType) for s in slots)
        and all(f.init for f in fields)
        and all(default is not _FACTORY for _n, _d, default in plan)
        and not any(isinstance(h, dataclasses.InitVar) for h in hints.values())
    )
    setters = tuple(s.__set__ for s in slots) if direct else ()  # type: ignore[union-attr]
    post_init = getattr(cls, "__post_init__", None)
    new = object.__new__

    def decode(raw: object, kind: str) -> E:
        if type(raw) is not dict:  # another mapping (or a refusal): as the reference does
            return _reference_decode(cls, raw, kind)
        given = 0
        if direct:
            entry = new(cls)
            for (name, decode_field, default), set_slot in zip(plan, setters, strict=True):
                value = raw.get(name, _ABSENT)
                if value is not _ABSENT:
                    set_slot(entry, decode_field(value, kind, name))
                    given += 1
                elif default is _REQUIRED:
                    raise SchemaError(kind, name, "missing")
                else:
                    set_slot(entry, default)
        else:
            values: dict[str, Any] = {}
            for name, decode_field, default in plan:
                value = raw.get(name, _ABSENT)
                if value is not _ABSENT:
                    values[name] = decode_field(value, kind, name)
                    given += 1
                elif default is _REQUIRED:
                    raise SchemaError(kind, name, "missing")
                elif default is not _FACTORY:
                    values[name] = default
        try:
            if direct:
                if post_init is not None:
                    post_init(entry)
            else:
                entry = cls(**values)
        except SchemaError:
            raise
        except (SpecError, ValueError, TypeError) as exc:  # a class's own checks
            raise SchemaError(kind, "", str(exc)[:200]) from None
        if given < len(raw):
            IGNORED_FIELDS[kind] += len(raw) - given
        return entry

    return decode


def _compile_field(hint: Any) -> _FieldDecoder:
    """The decoder of one field's hint: fast paths, else the reference (which refuses)."""

    def reference(raw: object, kind: str, name: str) -> Any:
        return _reference_value(hint, raw, kind, name)

    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == len(get_args(hint)):
            return reference  # a union without null: no entry has one
        inner = _compile_field(args[0])

        def optional(raw: object, kind: str, name: str) -> Any:
            return None if raw is None else inner(raw, kind, name)

        return optional
    if origin is not None:  # a container (dict[...], tuple[...]): no entry has one either
        return reference
    if isinstance(hint, type) and issubclass(hint, Entry):
        entry_cls = hint

        def nested(raw: object, kind: str, name: str) -> Any:
            entry = _decoder(entry_cls)(raw, f"{kind}.{name}")
            return _shared_ref(entry) if isinstance(entry, AssignmentRef) else entry

        return nested
    if isinstance(hint, type) and issubclass(hint, Enum):
        members = {m.value: m for m in hint}  # what ``hint(raw)`` finds first

        def enum(raw: object, kind: str, name: str) -> Any:
            try:
                return members[raw]
            except (KeyError, TypeError):  # not a value (or unhashable): the reference says
                return reference(raw, kind, name)

        return enum
    return _LEAF_DECODERS.get(hint, reference)


def _str_field(raw: object, kind: str, name: str) -> Any:
    if type(raw) is str and len(raw) <= MAX_TEXT:
        # Short text interned: the same node id, central id, workload or reason is in
        # thousands of entries central holds decoded, each decoded string a copy of its own.
        return intern_short(raw)
    return _reference_value(str, raw, kind, name)


def _int_field(raw: object, kind: str, name: str) -> Any:
    if type(raw) is int:
        if -MAX_WIRE_INT <= raw <= MAX_WIRE_INT:
            return raw
    elif type(raw) is float and raw.is_integer() and -MAX_WIRE_INT <= raw <= MAX_WIRE_INT:
        return int(raw)
    return wire_int(raw, kind, name)


def _float_field(raw: object, kind: str, name: str) -> Any:
    # (sizes shared: see edgesched.core.shared)
    if type(raw) is float:
        if math.isfinite(raw):
            return shared_float(raw)
    elif type(raw) is int and -MAX_WIRE_INT <= raw <= MAX_WIRE_INT:
        return shared_float(float(raw))
    return _reference_value(float, raw, kind, name)


def _bool_field(raw: object, kind: str, name: str) -> Any:
    if raw is True or raw is False:
        return raw
    return _reference_value(bool, raw, kind, name)


def _any_field(raw: object, kind: str, name: str) -> Any:
    return raw


def _spec_field(raw: object, kind: str, name: str) -> TaskSpec:
    """A task spec's JSON, parsed (:meth:`~edgesched.core.task.TaskSpec.from_json` checks it)."""
    if isinstance(raw, TaskSpec):
        return raw
    try:
        return TaskSpec.from_json(raw)
    except SpecError as exc:
        raise SchemaError(kind, name, str(exc)[:200]) from None


_LEAF_DECODERS: dict[Any, _FieldDecoder] = {
    str: _str_field,
    int: _int_field,
    float: _float_field,
    bool: _bool_field,
    Any: _any_field,
    TaskSpec: _spec_field,
}


def wire_int(raw: object, kind: str, name: str) -> int:
    """An integer as the documents carry it: an int or an integral float, |n| <= 2**53."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise SchemaError(kind, name, f"expected an integer, got {_type_name(raw)}")
    if isinstance(raw, float) and not (math.isfinite(raw) and raw.is_integer()):
        raise SchemaError(kind, name, f"expected an integer, got {raw!r}")
    if abs(raw) > MAX_WIRE_INT:
        raise SchemaError(kind, name, f"beyond ±2**53 (what the wire carries exactly): {raw!r}")
    return int(raw)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(
        type(value), "an array" if isinstance(value, list | tuple) else "an object"
    )


# --- node documents -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PowerModel(Entry):
    KIND: ClassVar[str] = "registration.power"
    idle_w: float
    peak_w: float
    parked_w: float
    wake_latency_s: float


@dataclass(frozen=True, slots=True)
class Registration(Entry):
    """``node.registration``: what the node is, for central's placement."""

    KIND: ClassVar[str] = "registration"
    arch: Arch
    server_class: ServerClass
    cpu: float
    mem_gib: float = 0.0
    accel: int = 0
    perf: float = 1.0
    power: PowerModel | None = None
    site: str = "default"
    cpu_model: str = ""
    #: The node reads packed entries (JSON text, :attr:`~edgesched.sync.doc.SyncedDoc.packed`)
    #: in its desired-state document: central writes them so only to a node that says it
    #: (a node of an older version reads nested values only, and lacks the field).
    reads_packed: bool = False
    #: Slices its accelerators offer in all (:mod:`edgesched.core.slices`); written only
    #: when set, so a registration without slices reads as before in an older central.
    accel_slices: int = 0

    def __post_init__(self) -> None:
        if self.cpu <= 0 or self.mem_gib < 0 or self.accel < 0 or self.perf <= 0:
            raise SchemaError(self.KIND, "", "cpu > 0, mem_gib >= 0, accel >= 0, perf > 0")
        if self.accel_slices < 0:
            raise SchemaError(self.KIND, "accel_slices", "must be >= 0")

    def to_entry(self) -> dict[str, Any]:
        out = Entry.to_entry(self)
        if not self.accel_slices:
            del out["accel_slices"]
        return out

    def to_node(self, node_id: str) -> Node:
        """The core's :class:`~edgesched.core.model.Node` (power defaults by core count)."""
        p = self.power
        try:
            return Node(
                id=node_id,
                arch=self.arch,
                server_class=self.server_class,
                capacity=Resources(
                    cpu=self.cpu,
                    mem_gib=self.mem_gib,
                    accel=self.accel,
                    accel_slices=self.accel_slices,
                ),
                power=CorePowerModel(
                    idle_w=p.idle_w if p else 10.0 * self.cpu,
                    peak_w=p.peak_w if p else 25.0 * self.cpu,
                    parked_w=p.parked_w if p else 10.0,
                    wake_latency_s=p.wake_latency_s if p else 60.0,
                ),
                perf=self.perf,
                site=self.site,
            )
        except ValueError as exc:  # the core's own checks (peak below idle, ...)
            raise SchemaError(self.KIND, "", str(exc)[:200]) from None


@dataclass(frozen=True, slots=True)
class ModelReport(Entry):
    """``node.models[kind]``: the model a node runs, and what it refused last."""

    KIND: ClassVar[str] = "models"
    sha256: str = ""
    source: str = ""
    refused: str = ""


@dataclass(frozen=True, slots=True)
class PowerReport(Entry):
    """``node.power``: the node's own power state (``edgesched.edge.power``)."""

    KIND: ClassVar[str] = "power"
    state: str = "active"
    since: float = 0.0
    idle_since: float | None = None


@dataclass(frozen=True, slots=True)
class AssignmentRef(Entry):
    """The assignment a node's copy of a task follows (:class:`~edgesched.core.task.Assignment`)."""

    KIND: ClassVar[str] = "task.assignment"
    central: str
    epoch: int
    replacement: bool = False
    score: float = 0.0

    def __post_init__(self) -> None:
        if not self.central or self.epoch < 0:
            raise SchemaError(self.KIND, "", "central must be set and epoch >= 0")

    def to_assignment(self) -> Assignment:
        return Assignment(self.central, self.epoch, self.replacement, self.score)

    @classmethod
    def of(cls, a: Assignment) -> AssignmentRef:
        return cls(a.central, a.epoch, a.replacement, a.score)


@dataclass(frozen=True, slots=True)
class TaskReport(Entry):
    """``tasks[id]`` of a node document: the node's copy of a task and its state."""

    KIND: ClassVar[str] = "task"
    state: TaskState
    updated_at: float
    node: str | None = None
    decided_by: str = ""
    workload: str = "default"
    priority: int = 0
    cpu: float = 0.0
    mem_gib: float = 0.0
    accel: int = 0
    restarts: int = 0
    exit_code: int | None = None
    accepted_at: float = 0.0
    started_at: float | None = None
    assignment: AssignmentRef | None = None
    #: Accelerator slices the task asks (written only when set, like the registration's).
    accel_slices: int = 0

    def __post_init__(self) -> None:
        if self.accel_slices < 0:
            raise SchemaError(self.KIND, "accel_slices", "must be >= 0")
        if self.cpu < 0 or self.mem_gib < 0 or self.accel < 0 or self.restarts < 0:
            raise SchemaError(self.KIND, "", "cpu, mem_gib, accel and restarts must be >= 0")
        if abs(self.priority) > MAX_SPEC_INT:
            raise SchemaError(self.KIND, "priority", "out of range")

    @property
    def active(self) -> bool:
        return not self.state.terminal

    @classmethod
    def of(cls, record: TaskRecord) -> TaskReport:
        """The report of a node's task record (what the node publishes of it)."""
        return cls(
            state=record.state,
            node=record.node_id,
            decided_by=record.decided_by,
            workload=record.spec.workload,
            priority=record.spec.priority,
            cpu=record.spec.cpu,
            mem_gib=record.spec.mem_gib,
            accel=record.spec.accel,
            accel_slices=record.spec.accel_slices,
            restarts=record.restarts,
            exit_code=record.exit_code,
            accepted_at=record.submitted_at,
            updated_at=record.updated_at,
            assignment=None if record.assignment is None else AssignmentRef.of(record.assignment),
        )

    def to_entry(self) -> dict[str, Any]:
        out = Entry.to_entry(self)  # (no bare super() in a slots=True dataclass)
        if self.assignment is None:
            del out["assignment"]  # local tasks carry none (as before: no null key)
        if self.started_at is None:
            del out["started_at"]
        if not self.accel_slices:
            del out["accel_slices"]
        return out


# --- the policy document ------------------------------------------------------------------------


class AssignmentState(StrEnum):
    PENDING = "pending"  # accepted, no node could take it yet (``pin``: the node asked for)
    ACTIVE = "active"  # placed on ``node``
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class AssignmentEntry(Entry):
    """``assignments[id]``: central's placement of a task (spec, node, epoch)."""

    KIND: ClassVar[str] = "assignment"
    #: The task's spec, parsed (the document holds its JSON, :meth:`TaskSpec.to_json`, which
    #: the decoder parses and checks). Only the parsed spec is kept: central holds every
    #: assignment of the fleet, and the JSON beside it was its largest part.
    spec: TaskSpec
    node: str
    epoch: int
    central: str
    at: float
    replacement: bool = False
    score: float = 0.0
    reason: str = ""
    state: AssignmentState = AssignmentState.ACTIVE
    pin: str | None = None
    #: The fencing token of the shard lease it was decided under (the etcd owner key's
    #: create revision for the task's shard, see edgesched.central.leases); 0 without etcd.
    lease: int = 0

    def __post_init__(self) -> None:
        if not self.central or self.epoch < 0:
            raise SchemaError(self.KIND, "", "central must be set, epoch >= 0")
        if not 0 <= self.lease <= MAX_SPEC_INT:
            raise SchemaError(self.KIND, "lease", "must be in [0, 2**53]")
        if self.state is AssignmentState.ACTIVE and not self.node:
            raise SchemaError(self.KIND, "node", "an active assignment names its node")

    @property
    def task_spec(self) -> TaskSpec:
        return self.spec

    @property
    def active(self) -> bool:
        return self.state is AssignmentState.ACTIVE

    def to_assignment(self) -> Assignment:
        return Assignment(self.central, self.epoch, self.replacement, self.score)


@dataclass(frozen=True, slots=True)
class StopOrder(Entry):
    """``stops[task@node]``: stop that node's copy (it lost the reconcile, or moved)."""

    KIND: ClassVar[str] = "stop"
    epoch: int
    winner: str
    at: float
    reason: str = ""
    #: The fencing token it was ordered under (as :attr:`AssignmentEntry.lease`).
    lease: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.lease <= MAX_SPEC_INT:
            raise SchemaError(self.KIND, "lease", "must be in [0, 2**53]")


@dataclass(frozen=True, slots=True)
class ServiceEntry(Entry):
    """``services[name]``: a service (:class:`edgesched.core.service.ServiceSpec`'s JSON,
    checked by its parser), the replica count it is kept at (in the spec), why it was last
    scaled, and whether it is being deleted (its replicas stop, then the entry goes)."""

    KIND: ClassVar[str] = "service"
    spec: Any
    at: float
    central: str
    reason: str = ""
    deleted: bool = False
    #: One past the last replica incarnation started: ids are never used twice.
    incarnations: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.incarnations <= MAX_SPEC_INT:
            raise SchemaError(self.KIND, "incarnations", "must be in [0, 2**53]")
        try:
            ServiceSpec.from_json(self.spec)
        except SpecError as exc:
            raise SchemaError(self.KIND, "spec", str(exc)) from None

    @property
    def service(self) -> ServiceSpec:
        return ServiceSpec.from_json(self.spec)


@dataclass(frozen=True, slots=True)
class LoadReport(Entry):
    """``loads[service]``: the load a service serves (cores of work), as last reported to a
    central replica (``POST /v1/services/{name}/load``): what its autoscaler reads."""

    KIND: ClassVar[str] = "load"
    load: float
    at: float

    def __post_init__(self) -> None:
        if not 0 <= self.load <= 1e9:
            raise SchemaError(self.KIND, "load", "must be in [0, 1e9] cores")


@dataclass(frozen=True, slots=True)
class PowerOrder(Entry):
    """``power[node]``: central's standing order to park or wake a node."""

    KIND: ClassVar[str] = "power-order"
    state: str
    at: float
    reason: str = ""

    def __post_init__(self) -> None:
        if self.state not in ("parked", "active"):
            raise SchemaError(self.KIND, "state", f"must be parked or active, got {self.state!r}")


#: A model file's base64 data may be this long (the model cap is 1 MiB of bytes).
MAX_MODEL_DATA = 2 * (1 << 20)


@dataclass(frozen=True, slots=True)
class ModelEntry(Entry):
    """``models[kind]``: a model file central published (verified by each node before use)."""

    KIND: ClassVar[str] = "model"
    sha256: str
    data: str = field(repr=False)
    size: int = 0
    name: str = ""
    set_at: float = 0.0

    @classmethod
    def from_entry(cls, raw: object) -> Self:
        if isinstance(raw, Mapping) and isinstance(raw.get("data"), str):
            if len(raw["data"]) > MAX_MODEL_DATA:
                raise SchemaError(cls.KIND, "data", "too large")
            # the data field may be long: decode it outside the generic text cap
            rest = {k: v for k, v in raw.items() if k != "data"}
            head = _decoder(cls)({**rest, "data": ""}, cls.KIND)
            return dataclasses.replace(head, data=raw["data"])
        return _decoder(cls)(raw, cls.KIND)


@dataclass(frozen=True, slots=True)
class TidalEntry(Entry):
    """``policy.tidal``: the tidal profile central switched the fleet to (by name)."""

    KIND: ClassVar[str] = "tidal"
    profile: str  # the name of a built-in profile


# --- refusals -----------------------------------------------------------------------------------


class Refusals:
    """Entries a document refused, by kind and reason: each distinct refused entry (key and
    problem) is counted and logged once."""

    def __init__(self, doc_name: str) -> None:
        self.doc_name = doc_name
        self.counts: Counter[tuple[str, str]] = Counter()
        self._logged: set[tuple[str, str]] = set()

    def refuse(self, key: str, err: SchemaError) -> None:
        """Count and log a refused entry once (views are decoded again after each change)."""
        seen = (key, str(err))
        if seen in self._logged:
            return
        if len(self._logged) >= 10_000:  # a flood: keep counting, stop remembering
            self._logged.clear()
        self._logged.add(seen)
        self.counts[(err.kind, err.reason)] += 1
        log.warning("%s: entry %s refused: %s", self.doc_name, key[:200], err)

    def total(self) -> int:
        return sum(self.counts.values())

    def by_kind(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (kind, _reason), n in self.counts.items():
            out[kind] += n
        return dict(out)


def decode_map(
    cls: type[E],
    raw: object,
    refusals: Refusals,
    *,
    where: str,
    memo: dict[str, tuple[object, E]] | None = None,
) -> dict[str, E]:
    """Decode every entry of a document map; the invalid ones are refused and left out.

    ``memo`` (key -> (raw value, decoded entry) of the previous decode, updated in place)
    spares decoding an entry whose raw value did not change: a map of thousands of
    assignments changes a few entries per step, and comparing is cheaper than validating."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        refusals.refuse(where, SchemaError(cls.KIND, "", f"{where} is not a map"))
        return {}
    out: dict[str, E] = {}
    fresh: dict[str, tuple[object, E]] = {}
    for k, value in raw.items():
        key = str(k)
        hit = None if memo is None else memo.get(key)
        if hit is not None and hit[0] == value:
            out[key] = hit[1]
            fresh[key] = hit
            continue
        try:
            out[key] = entry = cls.from_entry(value)
        except SchemaError as err:
            refusals.refuse(f"{where}[{key}]", err)
            continue
        fresh[key] = (value, entry)
    if memo is not None:
        memo.clear()
        memo.update(fresh)
    return out


def decode_one(cls: type[E], raw: object, refusals: Refusals, *, where: str) -> E | None:
    """Decode one entry (None when absent); an invalid one is refused and reads as absent."""
    if raw is None:
        return None
    try:
        return cls.from_entry(raw)
    except SchemaError as err:
        refusals.refuse(where, err)
        return None


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node document's content, typed: what central's decisions read of a node."""

    registration: Registration | None
    tasks: Mapping[str, TaskReport]
    power: PowerReport | None = None
    models: Mapping[str, ModelReport] = field(default_factory=dict)

    @classmethod
    def from_content(cls, content: Mapping[str, Any], refusals: Refusals | None = None) -> NodeView:
        """Decode a node document's JSON content (``{"node": {...}, "tasks": {...}}``)."""
        refusals = refusals or Refusals("content")
        node = content.get("node")
        node = node if isinstance(node, Mapping) else {}
        return cls(
            registration=decode_one(
                Registration, node.get("registration"), refusals, where="registration"
            ),
            tasks=decode_map(TaskReport, content.get("tasks"), refusals, where="tasks"),
            power=decode_one(PowerReport, node.get("power"), refusals, where="power"),
            models=decode_map(ModelReport, node.get("models"), refusals, where="node.models"),
        )


# ---- site coordination (edgesched.core.site): each member writes these in its own document


@dataclass(frozen=True, slots=True)
class SiteVote(Entry):
    """``site["vote"]``: the coordinator this member votes for (:class:`edgesched.core.site.Term`).
    A member's votes only grow in epoch (one vote per epoch)."""

    KIND: ClassVar[str] = "site.vote"
    epoch: int
    holder: str
    at: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.epoch <= MAX_SPEC_INT or not self.holder:
            raise SchemaError(self.KIND, "", "epoch in [1, 2**53] and a holder")


@dataclass(frozen=True, slots=True)
class SiteLease(Entry):
    """``site["lease"]``: this node acts as its site's coordinator at ``epoch`` since ``since``
    (absent while it does not), over the live ``members``."""

    KIND: ClassVar[str] = "site.lease"
    epoch: int
    since: float
    members: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.epoch <= MAX_SPEC_INT:
            raise SchemaError(self.KIND, "epoch", "must be in [1, 2**53]")


@dataclass(frozen=True, slots=True)
class SiteSeen(Entry):
    """``site["seen"]``: the site peers this node sees live on its site broker, and the
    coordinator whose orders it follows ("" for none) at ``epoch``; written when it changes.
    Central reads it to tell a node cut off from central but alive in its site from a dead
    one (the distributed health check)."""

    KIND: ClassVar[str] = "site.seen"
    peers: tuple[str, ...]
    coordinator: str = ""
    epoch: int = 0
    since: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.epoch <= MAX_SPEC_INT:
            raise SchemaError(self.KIND, "epoch", "must be in [0, 2**53]")


@dataclass(frozen=True, slots=True)
class SiteOrderEntry(Entry):
    """``site_orders[task id]``: the coordinator's order to run a task on ``node`` (it came
    from ``origin``), given at its term ``term``; ``epoch`` is the task's placement epoch
    (:class:`edgesched.core.site.SiteOrder`)."""

    KIND: ClassVar[str] = "site.order"
    node: str
    origin: str
    term: int
    epoch: int
    replacement: bool = False
    score: float = 0.0
    at: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.node or not self.origin:
            raise SchemaError(self.KIND, "", "node and origin must be set")
        if not 1 <= self.term <= MAX_SPEC_INT or not 0 <= self.epoch <= MAX_SPEC_INT:
            raise SchemaError(self.KIND, "", "term in [1, 2**53], epoch in [0, 2**53]")


@dataclass(frozen=True, slots=True)
class SiteStop(Entry):
    """``site_stops[task@node]``: the coordinator's order to stop that member's copy of the
    task at placement epoch ``epoch`` (it lost the reconcile rule to ``winner``'s)."""

    KIND: ClassVar[str] = "site.stop"
    term: int
    epoch: int
    winner: str
    at: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.term <= MAX_SPEC_INT or not 0 <= self.epoch <= MAX_SPEC_INT:
            raise SchemaError(self.KIND, "", "term in [1, 2**53], epoch in [0, 2**53]")


@dataclass(frozen=True, slots=True)
class SiteSpec(Entry):
    """``site_specs[task id]``: the spec of one of this node's tasks another member may need:
    a service replica it runs (to restart it elsewhere if this node dies while the site is
    cut off) or a local submission it ``offered`` to the site (queued here, no room)."""

    KIND: ClassVar[str] = "site.spec"
    spec: TaskSpec
    offered: bool = False


#: Every entry kind, for the fuzz tests and the schema documentation.
ENTRY_KINDS: tuple[type[Entry], ...] = (
    Registration,
    ModelReport,
    PowerReport,
    TaskReport,
    AssignmentEntry,
    StopOrder,
    PowerOrder,
    ModelEntry,
    TidalEntry,
    ServiceEntry,
    LoadReport,
    SiteVote,
    SiteLease,
    SiteSeen,
    SiteOrderEntry,
    SiteStop,
    SiteSpec,
)
