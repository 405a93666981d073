"""The documents' typed schema: every entry kind decodes what it encodes, and no input, however
wrong, gets past :func:`from_entry` as anything but a value of its kind or a SchemaError."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.model import Arch, ServerClass
from edgesched.core.policy import PolicyMode
from edgesched.core.task import TaskSpec, TaskState
from edgesched.sync.doc import NodeDoc, PolicyDoc, SiteDoc
from edgesched.sync.schema import (
    ENTRY_KINDS,
    MAX_WIRE_INT,
    AssignmentEntry,
    AssignmentRef,
    AssignmentState,
    Entry,
    LoadReport,
    ModelEntry,
    ModelReport,
    NodeView,
    PowerModel,
    PowerOrder,
    PowerReport,
    Registration,
    SchemaError,
    ServiceEntry,
    SiteLease,
    SiteOrderEntry,
    SiteSeen,
    SiteSpec,
    SiteStop,
    SiteVote,
    StopOrder,
    TaskReport,
    TidalEntry,
)

SPEC_OF = TaskSpec(id="t1", command=("sleep", "1"), cpu=0.5)
SPEC = SPEC_OF.to_json()

#: One valid value of every entry kind, with every optional field set.
SAMPLES: dict[type[Entry], Entry] = {
    Registration: Registration(
        arch=Arch.ARM64,
        server_class=ServerClass.GENERAL,
        cpu=8.0,
        mem_gib=16.0,
        accel=0,
        perf=1.2,
        power=PowerModel(idle_w=20.0, peak_w=90.0, parked_w=5.0, wake_latency_s=30.0),
        site="campus",
        cpu_model="Neoverse",
    ),
    ModelReport: ModelReport(sha256="ab" * 32, source="shipped", refused=""),
    PowerReport: PowerReport(state="parked", since=10.0, idle_since=5.0),
    TaskReport: TaskReport(
        state=TaskState.RUNNING,
        updated_at=12.5,
        node="gw1",
        decided_by="central",
        workload="video",
        priority=3,
        cpu=0.5,
        mem_gib=0.25,
        accel=1,
        restarts=2,
        exit_code=None,
        accepted_at=10.0,
        started_at=11.0,
        assignment=AssignmentRef(central="c1", epoch=2, replacement=True, score=0.7),
    ),
    AssignmentEntry: AssignmentEntry(
        spec=SPEC_OF, node="gw1", epoch=1, central="c1", at=3.0, score=0.5, reason="fits"
    ),
    StopOrder: StopOrder(epoch=1, winner="gw2", at=4.0, reason="placed twice"),
    PowerOrder: PowerOrder(state="parked", at=5.0, reason="idle"),
    ModelEntry: ModelEntry(sha256="cd" * 32, data="AAAA", size=3, name="m", set_at=6.0),
    TidalEntry: TidalEntry(profile="campus"),
    ServiceEntry: ServiceEntry(
        spec={"name": "web", "template": {"command": ["srv"]}, "replicas": 2},
        at=7.0,
        central="c1",
        reason="manual: created with 2 replicas",
        incarnations=3,
    ),
    LoadReport: LoadReport(load=2.5, at=8.0),
    SiteVote: SiteVote(epoch=3, holder="gw1", at=9.0),
    SiteLease: SiteLease(epoch=3, since=9.5, members=("gw1", "gw2")),
    SiteSeen: SiteSeen(peers=("gw2",), coordinator="gw1", epoch=3, since=9.0),
    SiteOrderEntry: SiteOrderEntry(
        node="gw2",
        origin="gw1",
        term=3,
        epoch=2,
        replacement=True,
        score=0.4,
        at=10.0,
        reason="site gw1@3: gw3 is down",
    ),
    SiteStop: SiteStop(term=3, epoch=1, winner="gw2", at=11.0, reason="gw2 keeps it"),
    SiteSpec: SiteSpec(spec=SPEC_OF, offered=True),
}

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def test_every_kind_has_a_sample() -> None:
    assert set(SAMPLES) == set(ENTRY_KINDS)


@pytest.mark.parametrize("kind", ENTRY_KINDS, ids=lambda k: k.__name__)
def test_each_kind_round_trips(kind: type[Entry]) -> None:
    sample = SAMPLES[kind]
    assert kind.from_entry(sample.to_entry()) == sample
    # through a real document, which carries numbers as float64 (5 reads back as 5.0)
    doc = SiteDoc("site-x", 3)
    doc.set("entry", sample.to_entry())
    replica = SiteDoc("site-x", 4)
    replica.apply_remote(doc.diff(), sender="x")
    assert kind.from_entry(replica.get("entry")) == sample
    # and the decoder's own rule for integers stored as floats
    assert kind.from_entry(_floats(sample.to_entry(), skip="spec")) == sample


def _floats(value: Any, skip: str = "") -> Any:
    """Every integer as a float (but under ``skip``: a task spec has its own, strict rule)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: v if k == skip else _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return value


@pytest.mark.parametrize("kind", ENTRY_KINDS, ids=lambda k: k.__name__)
@settings(max_examples=150, deadline=None)
@given(raw=json_values)
def test_any_json_is_an_entry_or_a_schema_error(kind: type[Entry], raw: object) -> None:
    try:
        entry = kind.from_entry(raw)
    except SchemaError as err:
        assert str(err).startswith(kind.KIND)
    else:
        assert isinstance(entry, kind)


@pytest.mark.parametrize("kind", ENTRY_KINDS, ids=lambda k: k.__name__)
@settings(max_examples=120, deadline=None)
@given(data=st.data(), wrong=json_values)
def test_one_field_of_any_value_never_crashes(kind: type[Entry], data: Any, wrong: Any) -> None:
    raw = SAMPLES[kind].to_entry()
    name = data.draw(st.sampled_from(sorted(raw)))
    raw[name] = wrong
    try:
        entry = kind.from_entry(raw)
    except SchemaError as err:
        assert err.kind.startswith(kind.KIND)
    else:
        assert isinstance(entry, kind)


def _required(kind: type[Entry]) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(kind)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def test_only_the_reports_of_older_engines_have_no_required_field() -> None:
    """An older engine may report nothing of its models or power: all defaults, on purpose."""
    assert {k for k in ENTRY_KINDS if not _required(k)} == {ModelReport, PowerReport}


@pytest.mark.parametrize("kind", [k for k in ENTRY_KINDS if _required(k)], ids=lambda k: k.__name__)
def test_a_missing_required_field_is_named(kind: type[Entry]) -> None:
    for name in _required(kind):
        raw = SAMPLES[kind].to_entry()
        del raw[name]
        with pytest.raises(SchemaError) as err:
            kind.from_entry(raw)
        assert err.value.field == name


@pytest.mark.parametrize("kind", ENTRY_KINDS, ids=lambda k: k.__name__)
def test_extra_fields_are_ignored(kind: type[Entry]) -> None:
    """A newer writer may add fields: this version reads the rest of the entry."""
    raw = {**SAMPLES[kind].to_entry(), "added_by_a_newer_peer": {"x": 1}}
    assert kind.from_entry(raw) == SAMPLES[kind]


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (3, True),
        (3.0, True),
        (float(MAX_WIRE_INT), True),
        (MAX_WIRE_INT + 1, False),  # the wire (float64) cannot carry it exactly
        (2**63 - 1, False),
        (3.5, False),
        (math.nan, False),
        (math.inf, False),
        (True, False),
        ("3", False),
    ],
)
def test_integers_are_what_the_wire_carries(value: object, ok: bool) -> None:
    raw = {**SAMPLES[StopOrder].to_entry(), "epoch": value}
    if ok:
        assert StopOrder.from_entry(raw).epoch == int(value)  # type: ignore[call-overload]
    else:
        with pytest.raises(SchemaError) as err:
            StopOrder.from_entry(raw)
        assert err.value.field == "epoch"


def test_floats_must_be_finite() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(SchemaError, match="at: must be finite"):
            StopOrder.from_entry({**SAMPLES[StopOrder].to_entry(), "at": bad})


def test_an_assignment_with_a_bad_spec_is_refused() -> None:
    raw = {**SAMPLES[AssignmentEntry].to_entry(), "spec": {"id": "x" * 300, "command": ["a"]}}
    with pytest.raises(SchemaError) as err:
        AssignmentEntry.from_entry(raw)
    assert err.value.field == "spec"
    pending = AssignmentEntry(
        spec=SPEC_OF, node="", epoch=1, central="c1", at=1.0, state=AssignmentState.PENDING
    )
    assert AssignmentEntry.from_entry(pending.to_entry()) == pending
    with pytest.raises(SchemaError, match="names its node"):
        AssignmentEntry.from_entry({**pending.to_entry(), "state": "active"})


# --- the document classes refuse, count and go on ---------------------------------------------


def test_a_node_document_refuses_a_bad_entry_and_reads_the_rest() -> None:
    doc = NodeDoc("node-gw1", 7)
    good = SAMPLES[TaskReport]
    assert isinstance(good, TaskReport)
    doc.put_task("good", good)
    doc.root("tasks")["bad"] = {"state": "running", "updated_at": "yesterday"}
    doc.root("tasks")["worse"] = "not an object"
    doc.root("node")["registration"] = {"arch": "sparc", "server_class": "general", "cpu": 4}
    assert doc.tasks() == {"good": good}
    assert doc.registration() is None
    assert doc.refusals.by_kind() == {"task": 2, "registration": 1}
    doc.put_task("more", good)  # a change: the views are decoded again
    assert set(doc.tasks()) == {"good", "more"}
    assert doc.refusals.total() == 3  # the same bad entries are not counted twice
    # and the typed view central reads says the same
    assert NodeView.from_content(doc.to_json()).tasks == doc.tasks()


def test_a_policy_document_refuses_a_bad_entry_of_every_kind() -> None:
    doc = PolicyDoc("policy", 9)
    doc.assign("ok", AssignmentEntry(spec=SPEC_OF, node="gw1", epoch=1, central="c", at=1.0))
    doc.root("assignments")["bad"] = {"spec": "rm -rf /", "node": "gw1"}
    doc.root("stops")["t@gw1"] = {"epoch": 2**60}
    doc.root("power")["gw1"] = {"state": "exploded", "at": 1.0}
    doc.root("models")["forecast"] = ["not", "an", "object"]
    doc.root("policy")["mode"] = "chaos"
    doc.root("policy")["tidal"] = "campus"  # a string where an object belongs
    assert set(doc.assignments()) == {"ok"}
    assert doc.stops() == {}
    assert doc.power() == {}
    assert doc.models() == {}
    assert doc.mode() is None
    assert doc.tidal() is None
    assert doc.refusals.by_kind() == {
        "assignment": 1,
        "stop": 1,
        "power-order": 1,
        "model": 1,
        "mode": 1,
        "tidal": 1,
    }
    doc.set_mode(PolicyMode.ENERGY)
    assert doc.mode() is PolicyMode.ENERGY


def test_decoded_views_are_cached_per_revision() -> None:
    doc = PolicyDoc("policy", 9)
    for i in range(50):
        doc.assign(f"t{i}", AssignmentEntry(spec=SPEC_OF, node="gw1", epoch=1, central="c", at=1.0))
    first = doc.assignments()
    assert doc.assignments() is first  # no change: the same decoded view
    doc.assign("t0", dataclasses.replace(first["t0"], epoch=2))
    second = doc.assignments()
    assert second is not first and second["t0"].epoch == 2
    assert second["t1"] is first["t1"]  # an unchanged entry is not decoded again


@settings(max_examples=200, deadline=None)
@given(
    cpu=st.floats(min_value=1e-3, max_value=1.7e308),
    mem=st.floats(min_value=0.0, max_value=1.7e308),
    priority=st.integers(min_value=0, max_value=100),
    accel=st.integers(min_value=0, max_value=2**53),
    epoch=st.integers(min_value=0, max_value=2**53),
    at=st.floats(allow_nan=False, allow_infinity=False),
)
def test_what_central_writes_every_replica_reads_back(
    cpu: float, mem: float, priority: int, accel: int, epoch: int, at: float
) -> None:
    """An assignment built from any spec the API accepts survives the document: written by
    one peer, merged into another, it decodes to the same entry (no self-refusal)."""
    try:
        spec = TaskSpec(
            id="t", command=("x",), cpu=cpu, mem_gib=mem, priority=priority, accel=accel
        )
    except ValueError:
        return  # not a spec the API would accept either
    entry = AssignmentEntry(spec=spec, node="gw", epoch=epoch, central="c", at=at)
    writer, reader = PolicyDoc("policy", 1), PolicyDoc("policy", 2)
    writer.assign("t", entry)
    reader.apply_remote(writer.diff(), sender="c")
    got = reader.assignment("t")
    assert reader.refusals.total() == 0, reader.refusals.counts
    assert got is not None and got.task_spec == spec and got.epoch == epoch and got.at == at


def test_writes_inside_one_transaction_see_each_other() -> None:
    """The decoded views are those of a transaction's start; a write compares with the map."""
    doc = NodeDoc("node-gw1", 7)
    first = SAMPLES[TaskReport]
    assert isinstance(first, TaskReport)
    doc.put_task("t", first)
    moved = dataclasses.replace(first, state=TaskState.EXITED, exit_code=0)
    with doc.doc.transaction():
        doc.put_task("t", moved)
        doc.put_task("t", first)  # back: must not be skipped as "unchanged"
    assert doc.task("t") == first
    with doc.doc.transaction():
        doc.put_task("t", moved)
    assert doc.task("t") == moved


# --- the incremental views equal a decode from scratch ---------------------------------------

_TASK_IDS = [f"t{i}" for i in range(6)]
_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "bad", "delete", "merge", "rotate", "batch"]),
        st.sampled_from(_TASK_IDS),
        st.sampled_from(list(TaskState)),
        st.integers(min_value=0, max_value=3),
    ),
    max_size=30,
)


def _scratch(doc: NodeDoc | PolicyDoc, name: str, cls: type[Entry]) -> dict[str, Entry]:
    """The oracle: the whole root map decoded again, from nothing."""
    from edgesched.sync.doc import normalise
    from edgesched.sync.schema import Refusals, decode_map

    return decode_map(cls, normalise(doc.root(name).to_py()), Refusals("oracle"), where=name)


@settings(max_examples=150, deadline=None)
@given(ops=_ops)
def test_incremental_node_views_equal_a_decode_from_scratch(
    ops: list[tuple[str, str, TaskState, int]],
) -> None:
    """Local writes, raw bad writes, deletes, batches in one transaction, merges into a
    replica and rotations, in any order: the views each document keeps from the changed keys
    are what decoding the whole map again gives, at the writer and at its replica."""
    writer, replica = NodeDoc("node-gw1", 1), NodeDoc("node-gw1", 2)
    base = SAMPLES[TaskReport]
    assert isinstance(base, TaskReport)
    for op, task_id, state, n in ops:
        report = dataclasses.replace(base, state=state, restarts=n)
        if op == "put":
            writer.put_task(task_id, report)
        elif op == "bad":
            writer.root("tasks")[task_id] = {"state": "running", "restarts": -n - 1}
        elif op == "delete":
            writer.remove_task(task_id)
        elif op == "batch":
            with writer.doc.transaction():
                writer.put_task(task_id, report)
                writer.remove_task(_TASK_IDS[n])
                writer.put_task(_TASK_IDS[(n + 1) % len(_TASK_IDS)], report)
        elif op == "rotate":
            writer.rotate()
            replica.reset_to_epoch(writer.epoch)  # an empty document until it resyncs
            assert dict(replica.tasks()) == _scratch(replica, "tasks", TaskReport)
        replica.apply_remote(writer.diff(replica.state_vector()), sender="gw1")
        for doc in (writer, replica):
            assert dict(doc.tasks()) == _scratch(doc, "tasks", TaskReport)
    assert writer.content_hash() == replica.content_hash()


@settings(max_examples=100, deadline=None)
@given(ops=_ops)
def test_incremental_policy_views_equal_a_decode_from_scratch(
    ops: list[tuple[str, str, TaskState, int]],
) -> None:
    """Two central replicas co-writing the policy document, merging both ways in any order."""
    a, b = PolicyDoc("policy", 11), PolicyDoc("policy", 12)
    for i, (op, task_id, _state, n) in enumerate(ops):
        doc = a if i % 2 == 0 else b
        entry = AssignmentEntry(spec=SPEC_OF, node=f"gw{n}", epoch=n, central="c", at=float(i))
        if op in ("put", "batch"):
            with doc.doc.transaction():
                doc.assign(task_id, entry)
                doc.order_stop(task_id, f"gw{n}", StopOrder(epoch=n, winner="gw9", at=float(i)))
                doc.set_power(f"gw{n}", PowerOrder(state="parked", at=float(i)))
        elif op == "bad":
            doc.root("assignments")[task_id] = {"spec": SPEC, "node": 7}
            doc.root("power")[f"gw{n}"] = {"state": "parked"}
        elif op == "delete":
            doc.drop_assignment(task_id)
            doc.drop_stop(task_id, f"gw{n}")
        else:  # merge (or rotate, which a multi-writer document does not do): exchange
            b.apply_remote(a.diff(b.state_vector()), sender="c-a")
            a.apply_remote(b.diff(a.state_vector()), sender="c-b")
        for d in (a, b):
            assert dict(d.assignments()) == _scratch(d, "assignments", AssignmentEntry)
            assert dict(d.stops()) == _scratch(d, "stops", StopOrder)
            assert dict(d.power()) == _scratch(d, "power", PowerOrder)
    b.apply_remote(a.diff(b.state_vector()), sender="c-a")
    a.apply_remote(b.diff(a.state_vector()), sender="c-b")
    assert a.content_hash() == b.content_hash()
    assert dict(a.assignments()) == dict(b.assignments())
