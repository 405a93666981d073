"""The compiled decoders (``schema._decoder``) and the fast ``TaskSpec.from_json`` decide exactly
what the straightforward versions decide, on random valid and invalid input of every entry kind:
the same values (of the same types), the same refusals (the same SchemaError kind, field and
message, or the same SpecError message), the same fields counted as ignored.

The references: ``schema._reference_decode``, the generic decoder kept in the schema module (it
is also the compiled decoders' slow path), and, below, ``TaskSpec.from_json`` and
``TaskSpec.__post_init__`` as they were before their fast paths, verbatim but for building a
dict instead of the spec.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.core.model import MAX_PRIORITY, Arch, ServerClass
from edgesched.core.task import (
    MAX_SPEC_INT,
    MAX_THREADS,
    Limits,
    RestartPolicy,
    SpecError,
    TaskSpec,
    _as_tuple,
    _kind_name,
    check_image,
    compact_spec_json,
    same_json,
)
from edgesched.sync import schema
from edgesched.sync.schema import ENTRY_KINDS, MAX_TEXT, MAX_WIRE_INT, Entry, ModelEntry

# --- the reference spec parse -------------------------------------------------------------------


def _ref_check_storable(name: str, value: object) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SPEC_INT:
        raise SpecError(f"{name}: beyond ±2**53, what the documents carry exactly")
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise SpecError(f"{name}: not valid Unicode (a lone surrogate)") from None
    elif isinstance(value, list):
        for item in value:
            _ref_check_storable(name, item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _ref_check_storable(name, key)
            _ref_check_storable(f"{name}.{key}", item)


def _ref_post_init(s: types.SimpleNamespace) -> None:
    if (
        not s.id
        or not all(c.isalnum() or c in "-_." for c in s.id)
        or len(s.id.encode()) > 128
        or s.id[0] in ".-"
    ):
        raise SpecError(
            "id: 1-128 letters, digits, '-', '_' or '.' (at most 128 bytes in UTF-8), "
            "not starting with '.' or '-'"
        )
    if not s.command or not all(isinstance(a, str) and a for a in s.command):
        raise SpecError("command: a non-empty list of non-empty strings")
    if not 0 <= s.priority <= MAX_PRIORITY:
        raise SpecError(f"priority: must be in [0, {MAX_PRIORITY}]")
    for name in ("cpu", "mem_gib"):
        value = getattr(s, name)
        if not math.isfinite(value) or value < 0:
            raise SpecError(f"{name}: must be a finite number >= 0")
    if s.cpu <= 0:
        raise SpecError("cpu: must be > 0")
    if s.accel < 0 or s.threads < 0 or s.max_restarts < 0:
        raise SpecError("accel, threads and max_restarts must be >= 0")
    if s.threads > MAX_THREADS:
        raise SpecError(f"threads: at most {MAX_THREADS}")
    if s.duration_s is not None and (not math.isfinite(s.duration_s) or s.duration_s < 0):
        raise SpecError("duration_s: must be a finite number >= 0")
    for arch, ref in s.images.items():
        check_image(arch, ref)


def _reference_spec(data: object) -> dict[str, Any]:
    """The fields of ``TaskSpec.from_json(data)`` as it was, or its SpecError."""
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
        _ref_check_storable(name, value)
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
            raise SpecError(f"images.{arch}: unknown architecture (one of arm64, x86_64)") from None
    duration = get("duration_s", (int, float), None)
    cwd = get("cwd", str, None)
    reconcile = get("reconcile", str, "")
    choices = ("", "keep-original", "keep-replacement", "best-score", "longest-running")
    if reconcile not in choices:
        raise SpecError("reconcile: must be one of " + ", ".join(choices[1:]))
    fields = dict(
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
    _ref_post_init(types.SimpleNamespace(**fields))
    return fields


# --- comparing outcomes -------------------------------------------------------------------------


def _deep(value: object) -> object:
    """A value's content with every type spelled out (``1 == 1.0`` but an int is not a float;
    NaN equals itself here), an instance's attributes in their order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        attrs = [f.name for f in dataclasses.fields(value)]
        if hasattr(value, "__dict__"):
            assert list(vars(value))[: len(attrs)] == attrs
            attrs = list(vars(value))  # and what __post_init__ added (an assignment's _spec)
        return (type(value), tuple((a, _deep(object.__getattribute__(value, a))) for a in attrs))
    if isinstance(value, float):
        return (float, repr(value))
    if isinstance(value, Mapping):
        return (type(value), tuple((_deep(k), _deep(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value), tuple(_deep(v) for v in value))
    if isinstance(value, frozenset):
        return (frozenset, tuple(sorted(map(repr, value))))
    return (type(value), value)


def _outcome(
    decode: Callable[[object], object], raw: object
) -> tuple[tuple[object, ...], dict[str, int]]:
    before = dict(schema.IGNORED_FIELDS)
    try:
        value = decode(raw)
    except Exception as exc:  # the refusal (or a crash) is part of what must be the same
        what: tuple[object, ...] = (
            type(exc),
            str(exc),
            getattr(exc, "kind", None),
            getattr(exc, "field", None),
            getattr(exc, "problem", None),
        )
    else:
        what = ("ok", _deep(value))
    ignored = {k: n - before.get(k, 0) for k, n in schema.IGNORED_FIELDS.items()}
    return what, {k: n for k, n in ignored.items() if n}


# --- random input -------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
_EDGE_NUMBERS = [
    0, -1, 1, 2**53, 2**53 + 1, -(2**53), -(2**53) - 1, 2**63 - 1, 2**63, 10**400,
    0.0, -0.0, 0.5, -1.5, 3.0, float(2**53), float(2**53 + 2), 1e300, math.nan, math.inf,
    -math.inf, True, False,
]  # fmt: skip
numbers = st.sampled_from(_EDGE_NUMBERS) | st.integers() | st.floats()
texts = (
    st.text(max_size=10)
    | st.sampled_from(["", "x" * MAX_TEXT, "x" * (MAX_TEXT + 1), "\udc80", "é", "a b"])
    | st.builds(str.__new__, st.just(type("Str", (str,), {})), st.text(max_size=4))
)
ID_CHARS = st.sampled_from(list("ab09-_.é٣ /\udc80"))
spec_ids = st.text(ID_CHARS, min_size=0, max_size=6) | st.sampled_from(["t" * 128, "t" * 129])


def _spec_field_values() -> dict[str, st.SearchStrategy[Any]]:
    ints = st.integers(min_value=0, max_value=10) | numbers
    limit_values = (
        st.none() | st.integers(-1, 4) | st.booleans() | st.sampled_from([2**63, 1.0, "1"])
    )
    return {
        "id": spec_ids | texts,
        "command": st.lists(st.sampled_from(["sleep", "60", "", "\udc80", "é"]), max_size=3)
        | json_values,
        "workload": texts,
        "priority": ints,
        "cpu": numbers,
        "mem_gib": numbers,
        "accel": ints,
        "threads": ints | st.just(MAX_THREADS + 1),
        "env": st.dictionaries(texts, texts, max_size=2) | json_values,
        "cwd": st.none() | texts,
        "restart": st.sampled_from([p.value for p in RestartPolicy]) | texts | numbers,
        "max_restarts": ints,
        "limits": st.dictionaries(
            st.sampled_from(["memory_mb", "nofile", "cpu_seconds", "bogus", "é"]),
            limit_values,
            max_size=3,
        )
        | st.fixed_dictionaries({k: st.none() | limit_values for k in Limits.__slots__})
        | json_values,
        "archs": st.lists(st.sampled_from(["arm64", "x86_64", "sparc"]), max_size=2) | json_values,
        "server_classes": st.lists(
            st.sampled_from([c.value for c in ServerClass] + ["mainframe"]), max_size=2
        )
        | json_values,
        "images": st.dictionaries(
            st.sampled_from(["arm64", "x86_64", "sparc"]),
            st.sampled_from(["busybox:1.36", "Not An Image", "", "\udc80"]) | json_scalars,
            max_size=2,
        )
        | json_values,
        "preemptible": st.booleans() | json_scalars,
        "duration_s": st.none() | numbers,
        "reconcile": st.sampled_from(
            ["", "keep-original", "keep-replacement", "best-score", "longest-running", "x"]
        )
        | texts,
    }


SPEC_VALUES = _spec_field_values()
VALID_SPEC = TaskSpec(id="t1", command=("sleep", "60"), cpu=0.5, mem_gib=0.25).to_json()


@st.composite
def spec_json(draw: st.DrawFn) -> object:
    """A spec as central writes it (sometimes with ints for floats, as a document reads it
    back), with a few fields changed to anything, removed or added."""
    if draw(st.integers(0, 20)) == 0:
        return draw(json_values)
    spec: dict[str, Any] = dict(VALID_SPEC)
    if draw(st.booleans()):
        spec["cpu"] = draw(st.sampled_from([1, 2, 0.25]))
    changes = draw(st.sampled_from([0, 0, 0, 1, 2, 3]))  # half of them as written
    for name in draw(
        st.lists(st.sampled_from(sorted(SPEC_VALUES)), min_size=changes, max_size=changes)
    ):
        if draw(st.integers(0, 5)) == 0:
            spec.pop(name, None)
        else:
            spec[name] = draw(SPEC_VALUES[name])
    if draw(st.integers(0, 10)) == 0:
        spec[draw(st.sampled_from(["extra", "Id", "zz", "a"]))] = 1
    return spec


def _valid(hint: Any) -> st.SearchStrategy[Any]:
    """Values a field of this hint accepts (as a document carries them: ints for floats)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = next(a for a in get_args(hint) if a is not type(None))
        return st.none() | _valid(inner)
    if isinstance(hint, type) and issubclass(hint, Entry):
        return entry_json(hint, depth=1)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return st.sampled_from([m.value for m in hint])
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(0, 2**53) | st.integers(0, 50).map(float)
    if hint is float:
        return st.floats(0, 1e9) | st.integers(0, 2**53)
    if hint is str:
        return st.text(max_size=8)
    return spec_json()  # Any: an assignment's spec


def _wrong(hint: Any) -> st.SearchStrategy[Any]:
    """Anything, with the edges of this hint's rules."""
    return json_values | numbers | texts | _valid(hint).map(lambda v: [v])


#: Fields a class's own checks narrow further than their type (so that random entries are
#: often valid ones).
_VALID_FIELDS: dict[tuple[str, str], st.SearchStrategy[Any]] = {
    ("power-order", "state"): st.sampled_from(["parked", "active"]),
    ("assignment", "central"): st.text(min_size=1, max_size=4),
    ("assignment", "node"): st.text(min_size=1, max_size=4),
    ("task.assignment", "central"): st.text(min_size=1, max_size=4),
    ("registration", "cpu"): st.floats(0.5, 64),
    ("registration", "perf"): st.floats(0.5, 2) | st.just(1),
    ("service", "spec"): st.builds(
        lambda name, replicas: {
            "name": name,
            "template": {"command": ["srv"]},
            "replicas": replicas,
        },
        st.sampled_from(["web", "api-1"]),
        st.integers(0, 5),
    ),
    # site autonomy's entries: epochs and terms from 1, ids non-empty, a spec that parses
    ("site.vote", "epoch"): st.integers(1, 1000),
    ("site.vote", "holder"): st.text(min_size=1, max_size=4),
    ("site.lease", "epoch"): st.integers(1, 1000),
    ("site.seen", "epoch"): st.integers(0, 1000),
    ("site.seen", "peers"): st.lists(st.text(min_size=1, max_size=4), max_size=3),
    ("site.lease", "members"): st.lists(st.text(min_size=1, max_size=4), max_size=3),
    ("site.order", "node"): st.text(min_size=1, max_size=4),
    ("site.order", "origin"): st.text(min_size=1, max_size=4),
    ("site.order", "term"): st.integers(1, 1000),
    ("site.order", "epoch"): st.integers(0, 1000),
    ("site.stop", "term"): st.integers(1, 1000),
    ("site.stop", "epoch"): st.integers(0, 1000),
    ("site.spec", "spec"): st.builds(
        lambda task_id, cpu: {"id": task_id, "command": ["srv"], "cpu": cpu},
        st.sampled_from(["t1", "web.0.ab.0"]),
        st.floats(0, 4),
    ),
}


@st.composite
def entry_json(draw: st.DrawFn, kind: type[Entry], depth: int = 0) -> object:
    """A ``kind`` entry, valid field by field, with up to three fields wrong, missing or
    added; now and then not an object, or an object of another type than a dict."""
    if depth == 0 and draw(st.integers(0, 15)) == 0:
        return draw(json_values)
    hints = get_type_hints(kind)
    raw: dict[str, Any] = {}
    for f in dataclasses.fields(kind):  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING or draw(st.booleans()):
            valid = _VALID_FIELDS.get((kind.KIND, f.name))
            valid = _valid(hints[f.name]) if valid is None else valid
            raw[f.name] = draw(valid)
    for name in draw(st.lists(st.sampled_from(sorted(hints)), max_size=3 - 2 * depth)):
        if name == "KIND":
            raw["from_a_newer_peer"] = draw(json_values)
        elif draw(st.integers(0, 4)) == 0:
            raw.pop(name, None)
        else:
            raw[name] = draw(_wrong(hints[name]))
    if draw(st.integers(0, 20)) == 0:
        return types.MappingProxyType(raw)
    return raw


# --- the properties -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ENTRY_KINDS, ids=lambda k: k.__name__)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_compiled_decoder_is_the_reference(kind: type[Entry], data: st.DataObject) -> None:
    raw = data.draw(entry_json(kind))
    compiled = _outcome(lambda r: schema._decoder(kind)(r, kind.KIND), raw)
    reference = _outcome(lambda r: schema._reference_decode(kind, r, kind.KIND), raw)
    assert compiled == reference
    if kind is not ModelEntry:  # its own from_entry: the long data outside the text cap
        assert _outcome(kind.from_entry, raw) == reference


@settings(max_examples=2000, deadline=None)
@given(raw=spec_json())
def test_the_spec_parse_is_the_reference(raw: object) -> None:
    expected = _outcome(_reference_spec, raw)
    got = _outcome(TaskSpec.from_json, raw)
    if expected[0][0] == "ok":  # the reference gives the fields: compare them with the spec's
        assert got[0][0] == "ok", got
        spec = TaskSpec.from_json(raw)
        assert spec == TaskSpec(**_reference_spec(raw))
        assert _deep(spec) == _deep(TaskSpec(**_reference_spec(raw)))
    else:
        assert got == expected


@pytest.mark.parametrize("kind", ENTRY_KINDS, ids=lambda k: k.__name__)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_compact_entry_decodes_as_the_full_one(kind: type[Entry], data: st.DataObject) -> None:
    """A packed entry leaves out the fields that hold their default (and an assignment's spec
    its own): the decoder reads back the same entry, through a document's JSON text too."""
    raw = data.draw(entry_json(kind))
    try:
        entry = kind.from_entry(raw)
    except (schema.SchemaError, OverflowError):  # (the latter: see the last test)
        return  # (a refused entry is never written)
    full = entry.to_entry()
    compact = schema.compact_entry(kind, full)
    assert set(compact) <= set(full)
    assert kind.from_entry(compact) == entry
    assert kind.from_entry(json.loads(json.dumps(compact))) == entry
    if kind is not ModelEntry:
        assert _deep(kind.from_entry(compact)) == _deep(entry)
    # what is left out is exactly what holds its default
    defaults: dict[str, object] = {}
    for f in dataclasses.fields(kind):  # type: ignore[arg-type]
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    for name in set(full) - set(compact):
        assert getattr(entry, name) == defaults[name]


@settings(max_examples=1000, deadline=None)
@given(raw=spec_json())
def test_a_compact_spec_parses_as_the_full_one(raw: object) -> None:
    try:
        spec = TaskSpec.from_json(raw)
    except SpecError:
        return
    full = spec.to_json()
    compact = compact_spec_json(full)
    assert {"id", "command"} <= set(compact) <= set(full)
    assert TaskSpec.from_json(compact) == spec
    assert _deep(TaskSpec.from_json(compact)) == _deep(spec)


def test_compaction_tells_types_apart() -> None:
    """``1 == 1.0 == True`` in Python: a value of another type than its default is kept (an
    integer 0 for a float field that defaults to 0.0 would read back as a refusal, or as the
    wrong type)."""
    assert same_json(0.0, 0.0) and not same_json(0, 0.0) and not same_json(False, 0)
    assert not same_json({"a": 1}, {"a": 1.0}) and same_json({"a": [None]}, {"a": [None]})
    assert not same_json([1], [True]) and not same_json([], [None])
    assert not same_json(-0.0, 0.0)  # (reads back as 0.0: not the value written)


@settings(max_examples=500, deadline=None)
@given(
    ident=spec_ids,
    command=st.lists(st.sampled_from(["a", "", 1]), max_size=2).map(tuple),
    priority=st.integers(-1, MAX_PRIORITY + 1),
    cpu=numbers,
    mem_gib=st.floats(),
    threads=st.integers(-1, MAX_THREADS + 1),
)
def test_the_spec_checks_are_the_reference(
    ident: str, command: tuple[Any, ...], priority: int, cpu: float, mem_gib: float, threads: int
) -> None:
    """``TaskSpec(...)`` refuses what it refused, with the same message (a spec built in code,
    not parsed: the checks of ``__post_init__`` alone)."""
    fields: dict[str, Any] = dict(
        id=ident, command=command, priority=priority, cpu=cpu, mem_gib=mem_gib, threads=threads
    )
    full = {
        f.name: getattr(TaskSpec(id="x", command=("a",)), f.name)
        for f in dataclasses.fields(TaskSpec)
    }
    expected = _outcome(lambda _: _ref_post_init(types.SimpleNamespace(**{**full, **fields})), None)
    got = _outcome(lambda _: TaskSpec(**fields), None)
    if expected[0][0] == "ok":
        assert got[0][0] == "ok"
    else:
        assert got == expected


def test_the_random_entries_are_mostly_accepted() -> None:
    """The strategies reach the decoders' fast paths, not only their refusals."""
    accepted: dict[str, int] = {}

    # 400 examples: an assignment is accepted about one time in ten (its random spec is often
    # refused), so 200 left the bound of 20 within reach of chance.
    @settings(max_examples=400, deadline=None, database=None)
    @given(data=st.data())
    def count(data: st.DataObject) -> None:
        for kind in ENTRY_KINDS:
            try:
                kind.from_entry(data.draw(entry_json(kind)))
            except (schema.SchemaError, OverflowError):  # (a 400-digit int: see below)
                continue
            accepted[kind.__name__] = accepted.get(kind.__name__, 0) + 1

    count()
    low = {k.__name__: accepted.get(k.__name__, 0) for k in ENTRY_KINDS}
    assert all(n >= 20 for n in low.values()), {k: n for k, n in low.items() if n < 20}


def test_decoded_entries_are_what_the_constructor_builds() -> None:
    """An entry built by a compiled decoder (each field into its slot, then __post_init__) is
    the instance the dataclass's own __init__ builds: equal, the same hash, repr, attributes;
    slotted (no instance dict), and holding the parsed spec, not its JSON."""
    parsed = TaskSpec(id="t1", command=("a",))
    spec = parsed.to_json()
    raw = {"spec": spec, "node": "gw", "epoch": 3, "central": "c", "at": 1.5, "score": 2}
    got = schema.AssignmentEntry.from_entry(raw)
    built = schema.AssignmentEntry(spec=parsed, node="gw", epoch=3, central="c", at=1.5, score=2.0)
    assert got == built and repr(got) == repr(built)
    names = [f.name for f in dataclasses.fields(got)]
    assert [getattr(got, n) for n in names] == [getattr(built, n) for n in names]
    assert not hasattr(got, "__dict__") and not hasattr(built, "__dict__")
    assert type(got.spec) is TaskSpec and got.task_spec == built.task_spec
    assert got.to_entry()["spec"] == spec  # the document carries the spec's JSON
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.node = "other"  # type: ignore[misc]
    stop = schema.StopOrder.from_entry({"epoch": 2.0, "winner": "gw", "at": 1})
    assert hash(stop) == hash(schema.StopOrder(epoch=2, winner="gw", at=1.0))


def test_float_fields_of_huge_integers_fail_as_they_did() -> None:
    """Not a refusal but an OverflowError (as before: ``math.isfinite`` of a 400-digit int);
    a document cannot carry one (its numbers are float64), only a caller in this process."""
    raw = {"epoch": 1, "winner": "gw", "at": 10**400}
    with pytest.raises(OverflowError):
        schema.StopOrder.from_entry(raw)
    with pytest.raises(OverflowError):
        schema._reference_decode(schema.StopOrder, raw, "stop")
    assert MAX_WIRE_INT == 2**53
