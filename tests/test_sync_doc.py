"""SyncedDoc on real pycrdt: convergence, no echo, bad input, identity, snapshots, persistence."""

from __future__ import annotations

import functools
import gc
import random
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pycrdt import Map

from edgesched.core.model import Arch, ServerClass
from edgesched.core.policy import PolicyMode
from edgesched.core.task import TaskSpec, TaskState
from edgesched.sync.doc import (
    NodeDoc,
    PolicyDoc,
    SiteDoc,
    SyncedDoc,
    UpdateRejected,
    client_id_for,
    decode_state_vector,
    normalise,
)
from edgesched.sync.schema import (
    AssignmentEntry,
    AssignmentRef,
    ModelEntry,
    ModelReport,
    NodeView,
    PowerModel,
    PowerOrder,
    PowerReport,
    Registration,
    StopOrder,
    TaskReport,
    TidalEntry,
)
from edgesched.sync.store import Store

KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def report(state: str = "running", at: float = 1.0, **kw: Any) -> TaskReport:
    """A node's report of one task (the generic content of a node document in these tests)."""
    return TaskReport(state=TaskState(state), updated_at=at, **kw)


def assigned(node: str, task_id: str = "t1", **kw: Any) -> AssignmentEntry:
    """Central's assignment of a one-command task to ``node``."""
    spec = TaskSpec(id=task_id, command=("sleep", "1"))
    return AssignmentEntry(spec=spec, node=node, epoch=1, central="c1", at=1.0, **kw)


# (replica index, kind, key, value)
OPS = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["set", "delete", "nested"]), KEYS, JSON),
    max_size=25,
)


def _edit(doc: SyncedDoc, model: dict[str, Any], kind: str, key: str, value: Any) -> None:
    root = doc.root("m")
    if kind == "set":
        root[key] = value
        model[key] = value
    elif kind == "nested":
        root[key] = Map({"inner": value, "n": 5})
        model[key] = {"inner": value, "n": 5}
    elif key in root:
        del root[key]
        model.pop(key, None)


def _record(sent: list[tuple[int, bytes]], who: int, update: bytes) -> None:
    sent.append((who, update))


def _exchange(replicas: Sequence[SyncedDoc]) -> None:
    """The y-sync steps between every ordered pair: send what the other's state vector lacks."""
    for src in replicas:
        for dst in replicas:
            if src is not dst:
                dst.apply_remote(src.diff(dst.state_vector()), sender=src.name)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 4), ops=OPS, delivery=st.randoms(use_true_random=False))
def test_partitioned_replicas_converge_after_state_vector_exchange(
    n: int, ops: list[tuple[int, str, str, Any]], delivery: random.Random
) -> None:
    replicas = [SiteDoc("site", 100 + i) for i in range(n)]
    models: list[dict[str, Any]] = [{} for _ in range(n)]
    sent: list[tuple[int, bytes]] = []
    for i, r in enumerate(replicas):
        r.on_local_update(functools.partial(_record, sent, i))
    for who, kind, key, value in ops:
        _edit(replicas[who % n], models[who % n], kind, key, value)

    # Partitioned: each replica holds only its own edits, exactly as its model says.
    for r, model in zip(replicas, models, strict=True):
        assert r.to_json() == ({"m": normalise(model)} if model else {})

    # Lossy, reordering, duplicating delivery.
    deliveries = [(i, u, dst) for i, u in sent for dst in range(n) if dst != i]
    plan: list[tuple[int, bytes, int]] = []
    for item in deliveries:
        fate = delivery.random()
        if fate < 0.2:
            continue  # dropped
        plan.append(item)
        if fate > 0.8:
            plan.append(item)  # duplicated
    delivery.shuffle(plan)
    for i, update, dst in plan:
        replicas[dst].apply_remote(update, sender=f"r{i}")

    # Note: a duplicate delivered *before* the exchange may change the doc: re-applying retries
    # the updates pycrdt holds pending (the "stuck" case). Once integrated, it is a no-op (below).
    _exchange(replicas)
    hashes = {r.content_hash() for r in replicas}
    assert len(hashes) == 1
    for a in replicas:
        for b in replicas:
            assert not a.missing_from(b.state_vector())
    # After convergence, a full re-delivery changes nothing anywhere.
    for i, update in sent:
        for r in replicas:
            assert r.apply_remote(update, sender=f"r{i}") is False
    assert {r.content_hash() for r in replicas} == hashes


def test_out_of_order_delivery_can_stick_and_the_exchange_repairs_it() -> None:
    stuck = 0
    for seed in range(40):
        rng = random.Random(seed)
        a, b = SiteDoc("s", 1), SiteDoc("s", 2)
        sent: list[bytes] = []
        a.on_local_update(sent.append)
        for i in range(8):
            a.set(rng.choice("xyz"), i)
        rng.shuffle(sent)
        for update in sent:
            b.apply_remote(update, sender="a")
        if b.missing_from(a.state_vector()):
            stuck += 1
            assert b.content_hash() != a.content_hash()
        b.apply_remote(a.diff(b.state_vector()), sender="a")
        assert not b.missing_from(a.state_vector())
        assert b.content_hash() == a.content_hash()
    assert stuck > 0  # every update arrived, yet some replicas stayed behind until the resync


def test_local_updates_reported_and_remote_ones_never_echoed() -> None:
    a, b = NodeDoc("n", 1), NodeDoc("n", 2)
    a_seen: list[bytes] = []
    b_seen: list[bytes] = []
    a.on_local_update(a_seen.append)
    b.on_local_update(b_seen.append)
    a.put_task("t1", report("running", node="edge-1"))
    a.set_registration(Registration(arch=Arch.ARM64, server_class=ServerClass.GENERAL, cpu=4))
    assert len(a_seen) == 2
    for update in a_seen:
        assert b.apply_remote(update, sender="a") is True
    assert b_seen == []  # no echo
    assert b.content_hash() == a.content_hash()
    with a.doc.transaction():  # one transaction, one update
        a.put_task("t2", report("placed"))
        a.remove_task("t1")
    assert len(a_seen) == 3
    # A delete-only update changes the doc without moving its state vector: still "changed".
    assert b.apply_remote(a_seen[2], sender="a") is True
    sv = b.state_vector()
    a.remove_task("t2")
    assert b.apply_remote(a_seen[3], sender="a") is True
    assert b.tasks() == {} and b.state_vector() == sv
    assert b_seen == []


def test_callback_errors_do_not_break_the_transaction() -> None:
    doc = SiteDoc("s", 1)

    def boom(_: bytes) -> None:
        raise RuntimeError("subscriber bug")

    got: list[bytes] = []
    doc.on_local_update(boom)
    doc.on_local_update(got.append)
    doc.set("k", 1)
    assert doc.get("k") == 1 and len(got) == 1


def _valid_update() -> tuple[bytes, SyncedDoc]:
    src = SiteDoc("s", 7)
    src.set("k", {"v": 1})
    return src.diff(), src


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64))
def test_random_bytes_are_rejected_or_harmless(data: bytes) -> None:
    doc = SiteDoc("s", 1)
    doc.set("mine", 1)
    before = doc.content_hash()
    try:
        doc.apply_remote(data, sender="fuzz")
    except UpdateRejected:
        assert doc.content_hash() == before  # refused: unchanged
    doc.set("after", 2)  # still usable
    assert doc.get("after") == 2 and doc.get("mine") == 1


def test_truncated_updates_are_rejected_and_leave_the_doc_unchanged() -> None:
    update, src = _valid_update()
    rejected = 0
    for cut in range(len(update)):
        doc = SiteDoc("s", 1)
        before = doc.content_hash()
        try:
            doc.apply_remote(update[:cut], sender="trunc")
        except UpdateRejected:
            rejected += 1
        assert doc.content_hash() == before
        doc.apply_remote(update, sender="src")  # the doc still takes the whole update
        assert doc.content_hash() == src.content_hash()
    assert rejected >= len(update) - 2  # nearly every prefix is refused outright


def test_single_bit_flips_are_rejected_or_applied_silently() -> None:
    """The decoder is no integrity check: some flips apply silently (hence TLS + checksums).

    Outcomes per flip: refused (doc unchanged), applied with no visible change, or applied
    with corrupted content. The doc stays usable in every case.
    """
    update, src = _valid_update()
    outcomes = {"rejected": 0, "no-change": 0, "applied-corrupt": 0, "applied-faithful": 0}
    for bit in range(len(update) * 8):
        flipped = bytearray(update)
        flipped[bit // 8] ^= 1 << (bit % 8)
        doc = SiteDoc("s", 1)
        before = doc.content_hash()
        try:
            doc.apply_remote(bytes(flipped), sender="flip")
        except UpdateRejected:
            outcomes["rejected"] += 1
            assert doc.content_hash() == before
        else:
            after = doc.content_hash()
            if after == before:
                outcomes["no-change"] += 1
            elif after == src.content_hash():
                outcomes["applied-faithful"] += 1
            else:
                outcomes["applied-corrupt"] += 1
        doc.set("still", "usable")
        assert doc.get("still") == "usable"
    assert sum(outcomes.values()) == len(update) * 8
    assert outcomes["rejected"] > 0
    assert outcomes["rejected"] < len(update) * 8  # some flips do get through silently


def test_oversized_update_rejected() -> None:
    src = SiteDoc("s", 7)
    src.set("blob", "x" * 1000)
    doc = SiteDoc("s", 1, max_update_bytes=512)
    before = doc.content_hash()
    with pytest.raises(UpdateRejected, match="over the cap"):
        doc.apply_remote(src.diff(), sender="big")
    assert doc.content_hash() == before
    with pytest.raises(UpdateRejected):
        doc.apply_remote(b"", sender="empty")
    small = SiteDoc("s", 8)
    small.set("k", 1)
    assert doc.apply_remote(small.diff(), sender="small") is True


@pytest.mark.parametrize(
    "vector",
    [b"", b"\x01", b"\x01\x05", b"\x02\x01\x01", b"\x01\x01\x01\x00", b"\xff" * 11, b"\x05\x01"],
)
def test_malformed_state_vector_rejected(vector: bytes) -> None:
    doc = SiteDoc("s", 1)
    doc.set("k", 1)
    with pytest.raises(UpdateRejected):
        doc.missing_from(vector)
    with pytest.raises(UpdateRejected):
        doc.diff(vector)
    assert doc.get("k") == 1


def test_state_vector_decoder_round_trips_pycrdt() -> None:
    a, b = SiteDoc("s", 300), SiteDoc("s", 2**32 - 1)
    for i in range(200):
        a.set(f"k{i}", i)
    b.set("x", 1)
    b.apply_remote(a.diff(), sender="a")
    assert decode_state_vector(b.state_vector()) == {300: 200, 2**32 - 1: 1}
    assert a.missing_from(b.state_vector()) and not b.missing_from(a.state_vector())


def test_duplicate_client_id_diverges_silently() -> None:
    """Why content_hash exists: equal state vectors, different contents, never repaired."""
    a, b = SiteDoc("s", 42), SiteDoc("s", 42)
    a.set("x", "from a")
    b.set("x", "from b")
    _exchange([a, b])
    assert a.state_vector() == b.state_vector()
    assert not a.missing_from(b.state_vector()) and not b.missing_from(a.state_vector())
    assert a.content_hash() != b.content_hash()
    assert a.get("x") == "from a" and b.get("x") == "from b"


def test_client_ids() -> None:
    assert client_id_for("edge-1") == client_id_for("edge-1")
    ids = {client_id_for(f"edge-{i}") for i in range(1000)}
    assert all(1 <= i < 2**32 for i in ids) and len(ids) > 990
    for bad in (0, -1, 2**32):
        with pytest.raises(ValueError):
            SyncedDoc("s", bad)
    with pytest.raises(TypeError):
        SyncedDoc("s", True)
    with pytest.raises(ValueError):
        client_id_for("")


def test_content_hash_normalises_numbers_and_ignores_empty_roots() -> None:
    a, b = SiteDoc("s", 1), SiteDoc("s", 2)
    a.set("n", 5)
    b.set("n", 5.0)
    b.root("never-written")
    assert a.content_hash() == b.content_hash()
    assert a.to_json() == {"site": {"n": 5}}
    with pytest.raises(ValueError, match="JSON"):
        a.set("bad", float("nan"))


def test_typed_accessors() -> None:
    node = NodeDoc("node/edge-1", 1)
    reg = Registration(
        arch=Arch.X86_64,
        server_class=ServerClass.GENERAL,
        cpu=8,
        mem_gib=16.0,
        power=PowerModel(idle_w=60.0, peak_w=200.0, parked_w=8.0, wake_latency_s=45.0),
        site="s1",
    )
    models = {"forecast": ModelReport(sha256="ab" * 32, source="central")}
    power = PowerReport(state="parked", since=5.0, idle_since=4.5)
    running = report(
        "running",
        at=2.5,
        node="edge-1",
        priority=7,
        cpu=1.5,
        accel=1,
        started_at=2.0,
        assignment=AssignmentRef("c1", 3, replacement=True, score=0.25),
    )
    node.set_registration(reg)
    node.set_model_reports(models)
    node.set_power_report(power)
    node.put_task("t1", running)
    assert node.registration() == reg
    assert node.model_reports() == models
    assert node.power_report() == power
    assert node.task("t1") == running
    assert node.task("nope") is None
    assert node.to_json() == {
        "node": {
            "registration": reg.to_entry(),
            "models": {"forecast": models["forecast"].to_entry()},
            "power": power.to_entry(),
        },
        "tasks": {"t1": running.to_entry()},
    }
    # A replica reads the same typed values back (pycrdt's floats as the fields' ints).
    copy = NodeDoc.restore("node/edge-1", 2, node.snapshot(), [])
    assert copy.typed() == NodeView(
        registration=reg, tasks={"t1": running}, power=power, models=models
    )
    assert copy.model_reports() == models
    got = copy.task("t1")
    assert got is not None and type(got.priority) is int and type(got.accel) is int
    assert copy.refusals.total() == 0
    # An entry that does not decode is refused: absent from the typed view, counted, and still
    # in the raw content (the document itself is never rewritten by a reader).
    node.root("tasks")["bad"] = {"state": "sleeping", "updated_at": 1.0}
    assert node.task("bad") is None and set(node.tasks()) == {"t1"}
    assert node.refusals.by_kind() == {"task": 1}
    raw = node.to_json()["tasks"]
    assert isinstance(raw, dict) and set(raw) == {"t1", "bad"}

    policy = PolicyDoc("policy", 2)
    assert policy.mode() is None and policy.tidal() is None
    policy.set_mode(PolicyMode.ENERGY)
    policy.set_tidal(TidalEntry(profile="office"))
    policy.set_power("edge-1", PowerOrder(state="parked", at=3.0, reason="idle"))
    policy.set_model("forecast", ModelEntry(sha256="cd" * 32, data="AAAA", size=3, name="f"))
    policy.order_stop("t1", "edge-2", StopOrder(epoch=2, winner="edge-1", at=4.0))
    replica = PolicyDoc.restore("policy", 3, policy.snapshot(), [])
    assert replica.mode() is PolicyMode.ENERGY
    assert replica.tidal() == TidalEntry(profile="office")
    assert replica.power() == {"edge-1": PowerOrder(state="parked", at=3.0, reason="idle")}
    assert replica.models() == {
        "forecast": ModelEntry(sha256="cd" * 32, data="AAAA", size=3, name="f")
    }
    assert replica.stops() == {"t1@edge-2": StopOrder(epoch=2, winner="edge-1", at=4.0)}
    assert replica.refusals.total() == 0


def test_restore_from_snapshot_and_updates_reproduces_hash() -> None:
    doc = NodeDoc("n", 9)
    later: list[bytes] = []
    for i in range(10):
        doc.put_task(f"t{i}", report("accepted"))
    snap = doc.snapshot()
    doc.on_local_update(later.append)
    doc.put_task("t3", report("running"))
    doc.remove_task("t4")
    restored = NodeDoc.restore("n", 9, snap, later)
    assert restored.content_hash() == doc.content_hash()
    assert restored.state_vector() == doc.state_vector()
    # The restored replica keeps its client id and continues its clock.
    restored.put_task("t11", report("accepted"))
    assert decode_state_vector(restored.state_vector())[9] == 12
    # A garbled stored update is skipped, the rest still restores.
    partial = NodeDoc.restore("n", 9, snap, [b"\xff\xff", *later])
    assert partial.content_hash() == doc.content_hash()


async def test_persist_and_load_through_store_with_compaction(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "edge.db")
    try:
        doc = await NodeDoc.load_from(store, "node/edge-1", 5)
        assert doc.to_json() == {}
        queue: list[bytes] = []
        doc.on_local_update(queue.append)
        for i in range(23):
            doc.put_task(f"t{i}", report("running", priority=i))
            while queue:  # what the engine does from its callback queue, before publishing
                await doc.log_update(store, queue.pop(0), compact_after=5)
        snap = await store.snapshot("node/edge-1")
        assert snap is not None and snap[0] >= 18
        assert len(await store.updates("node/edge-1", snap[0])) <= 5

        loaded = await NodeDoc.load_from(store, "node/edge-1", 5)
        assert loaded.content_hash() == doc.content_hash()
        assert loaded.tasks()["t22"] == report("running", priority=22)

        # Carry on writing on the reloaded replica, then fold everything into a snapshot.
        loaded.on_local_update(queue.append)
        loaded.remove_task("t0")
        await loaded.log_update(store, queue.pop(0))
        await loaded.persist_to(store)
        assert (
            await store.updates("node/edge-1", (await store.snapshot("node/edge-1") or (0,))[0])
            == []
        )
        again = await NodeDoc.load_from(store, "node/edge-1", 5)
        assert again.content_hash() == loaded.content_hash()
        assert again.task("t0") is None
    finally:
        await store.close()


async def test_a_large_document_is_compacted_in_proportion_to_its_size(tmp_path: Path) -> None:
    """Past ``compact_after`` updates the log is folded only once it holds half the
    snapshot's bytes: a large document with small updates is not rewritten every few
    updates (central's fleet document at 10,000 nodes was encoded and rewritten whole every
    256 steps); a restored one knows its snapshot's size."""
    store = await Store.open(tmp_path / "central.db")
    try:
        doc = await NodeDoc.load_from(store, "big", 5)
        queue: list[bytes] = []
        doc.on_local_update(queue.append)
        with doc.doc.transaction():
            for i in range(300):
                doc.put_task(f"t{i:03d}", report("running", priority=i))
        await doc.persist_to(store)
        queue.clear()
        big = len((await store.snapshot("big") or (0, b""))[1])
        assert big > 20_000
        small = 0
        for i in range(40):  # each far smaller than the snapshot
            doc.put_task(f"t{i:03d}", report("exited", priority=i))
            update = queue.pop(0)
            small += len(update)
            await doc.log_update(store, update, compact_after=5)
        assert 2 * small < big  # not half the snapshot yet: still in the log
        snap = await store.snapshot("big")
        assert snap is not None and len(await store.updates("big", snap[0])) == 40
        restored = await NodeDoc.load_from(store, "big", 5)
        assert restored.content_hash() == doc.content_hash()
        restored.on_local_update(queue.append)
        logged = 40
        while logged * 2 * (small // 40) < big + 4 * (small // 40):  # past half of it
            restored.put_task(f"t{logged % 300:03d}", report("running", priority=-logged))
            await restored.log_update(store, queue.pop(0), compact_after=5)
            logged += 1
        snap = await store.snapshot("big")
        assert snap is not None and len(await store.updates("big", snap[0])) < 10  # folded
        again = await NodeDoc.load_from(store, "big", 5)
        assert again.content_hash() == restored.content_hash()
    finally:
        await store.close()


def test_policy_assignments_are_cached_per_change_and_follow_every_change() -> None:
    a = PolicyDoc("policy", 101)
    b = PolicyDoc("policy", 102)
    a.assign("t1", assigned("gw1"))
    assert a.assignments() == {"t1": assigned("gw1")}
    assert a.assignments() == {"t1": assigned("gw1")}  # (the cached decode)
    b.apply_remote(a.diff(), sender="a")
    assert b.assignments() == {"t1": assigned("gw1")}
    b.assign("t2", assigned("gw2", "t2"))
    a.apply_remote(b.diff(a.state_vector()), sender="b")  # a remote insert
    assert set(a.assignments()) == {"t1", "t2"}
    before = b.state_vector()
    b.drop_assignment("t1")
    a.apply_remote(b.diff(before), sender="b")  # a remote delete (the state vector stays)
    assert set(a.assignments()) == {"t2"}
    a.assign("t2", assigned("gw3", "t2"))  # a local overwrite
    assert a.assignments()["t2"] == assigned("gw3", "t2")


def test_policy_assignments_returned_map_is_read_only() -> None:
    """The decoded views are shared (cached per revision), so they cannot be changed."""
    a = PolicyDoc("policy", 101)
    a.assign("t1", assigned("gw1"))
    first = a.assignments()
    with pytest.raises(TypeError):
        first["t9"] = assigned("gw9", "t9")  # type: ignore[index]
    assert a.assignments() == {"t1": assigned("gw1")}


def test_a_replicas_registration_is_decoded_again_only_when_the_node_root_changes() -> None:
    """A task update does not decode the registration again (it is read for every frame at
    central); a change of the ``node`` root, local or remote, or a new epoch does."""
    node = NodeDoc("node-gw", client_id_for("gw"))
    replica = NodeDoc("node-gw", client_id_for("central"))
    updates: list[bytes] = []
    node.on_local_update(updates.append)
    first = Registration(arch=Arch.X86_64, server_class=ServerClass.GENERAL, cpu=4, mem_gib=8)
    node.set_registration(first)
    replica.apply_remote(updates[-1], sender="gw")
    decoded = replica.registration()
    assert decoded == first
    node.put_task("t", TaskReport(state=TaskState.RUNNING, updated_at=1.0))
    replica.apply_remote(updates[-1], sender="gw")
    assert replica.registration() is decoded  # the same object: not decoded again
    second = Registration(arch=Arch.ARM64, server_class=ServerClass.GENERAL, cpu=8, mem_gib=8)
    node.set_registration(second)
    replica.apply_remote(updates[-1], sender="gw")
    assert replica.registration() == second
    node.rotate()
    replica.reset_to_epoch(node.epoch)
    assert replica.registration() is None  # a new epoch, nothing of it applied yet
    replica.apply_remote(updates[-1], sender="gw")
    assert replica.registration() == second
    node.set_registration(first)  # a local write of the node's own document
    assert node.registration() == first


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.booleans()), max_size=25))
def test_a_packed_fleet_document_reads_as_the_nested_one(
    writes: list[tuple[int, bool, bool]],
) -> None:
    """Central's fleet document writes its entries as JSON text (``packed``): a replica of it
    decodes the same assignments and stops as a nested-valued document given the same writes,
    whichever form each entry was written in (an older central wrote nested values)."""
    packed = PolicyDoc("fleet", client_id_for("central"))
    packed.packed = True
    nested = PolicyDoc("fleet", client_id_for("central"))
    replica = PolicyDoc("fleet", client_id_for("central-b"))
    for key, as_nested, stop in writes:
        task_id = f"t{key}"
        entry = assigned(f"gw-{key % 3}", task_id, score=float(key) / 3)
        packed.packed = not as_nested  # this entry as an older central wrote it, or packed
        for doc in (packed, nested):
            if stop:
                doc.order_stop(task_id, "gw-1", StopOrder(epoch=1, winner="gw-2", at=float(key)))
            else:
                doc.assign(task_id, entry)
        packed.packed = True
    replica.apply_remote(packed.snapshot(), sender="central")
    assert dict(replica.assignments()) == dict(nested.assignments())
    assert dict(replica.stops()) == dict(nested.stops())
    for task_id in nested.assignments():
        assert replica.assignment(task_id) == nested.assignment(task_id)
    last = {f"t{key}": as_nested for key, as_nested, stop in writes if not stop}
    for task_id, as_nested in last.items():  # each entry in the form it was last written
        assert isinstance(packed.root("assignments").get(task_id), dict if as_nested else str)
    assert sum(replica.refusals.counts.values()) == 0


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '"a string"',
        '{"spec": NaN}',
        "[" * 5000 + "]" * 5000,
        '{"node": "gw", "epoch": 1e999}',
        "{" + '"x": 1, ' * 10 + '"y": 2}',
    ],
    ids=["garbage", "array", "string", "nan", "deep", "overflow", "wrong-fields"],
)
def test_a_packed_entry_that_is_not_an_assignment_is_refused_not_raised(text: str) -> None:
    doc = PolicyDoc("fleet", client_id_for("central"))
    doc.root("assignments")["bad"] = text
    doc.assign("good", assigned("gw", "good"))
    assert doc.assignment("bad") is None
    assert set(doc.assignments()) == {"good"}
    assert sum(doc.refusals.counts.values()) >= 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 6), st.booleans(), st.sampled_from(["r", "x", "del"]))))
def test_a_packed_node_document_reads_as_the_nested_one(
    writes: list[tuple[int, bool, str]],
) -> None:
    """A node of this version writes its task reports as JSON text once central says it reads
    them (``packed``); central's replica decodes the same reports, and the same changed keys,
    as from a node writing nested values, whichever form each entry was last written in (the
    node may switch mid-history). Rewriting an entry's value in the other form is no change."""
    node = NodeDoc("node-gw", client_id_for("gw"))
    nested = NodeDoc("node-gw", client_id_for("gw"))
    replica = NodeDoc("node-gw", client_id_for("central"))
    replica.track_changes("tasks")
    replica.drain_changes("tasks")
    for key, as_nested, what in writes:
        task_id = f"t{key}"
        node.packed = not as_nested
        for doc in (node, nested):
            if what == "del":
                doc.remove_task(task_id)
            else:
                state = "running" if what == "r" else "exited"
                doc.put_task(task_id, report(state, at=float(key), cpu=0.5 * key))
    replica.apply_remote(node.snapshot(), sender="gw")
    assert dict(replica.tasks()) == dict(nested.tasks())
    assert replica.readable() == nested.to_json()  # what central's API shows of it
    changed = replica.drain_changes("tasks")  # what central's index re-reads
    assert changed is not None
    assert set(nested.tasks()) <= changed <= {f"t{k}" for k, _n, _w in writes}
    for task_id, held in nested.tasks().items():
        assert replica.task(task_id) == held
        before = node.state_vector()
        node.packed = not isinstance(node.root("tasks").get(task_id), str)  # the other form
        node.put_task(task_id, held)  # the same report: not written again
        assert node.state_vector() == before


def test_central_says_it_reads_packed_entries_once() -> None:
    """``announce_packed`` writes the flag once (no update when it is set already); a node's
    replica of the policy reads it, and a policy an older central wrote reads as not said."""
    central = PolicyDoc("policy", client_id_for("central"))
    replica = PolicyDoc("policy", client_id_for("gw"))
    assert not replica.packed_entries()
    central.announce_packed()
    sv = central.state_vector()
    central.announce_packed()
    assert central.state_vector() == sv
    replica.apply_remote(central.snapshot(), sender="central")
    assert replica.packed_entries() and central.packed_entries()
    old = PolicyDoc("policy", client_id_for("central"))
    old.set_mode(PolicyMode.ENERGY)
    assert not old.packed_entries()


def test_a_document_nobody_holds_is_freed_with_its_pycrdt_document() -> None:
    """pycrdt's subscriptions refer back from Rust, where the collector cannot look: a
    SyncedDoc whose callbacks held it strongly, and its pycrdt document, were never freed."""
    writer = NodeDoc("node-gw-1", client_id_for("gw-1"))
    writer.put_task("t1", TaskReport(state=TaskState.RUNNING, updated_at=1.0))
    held = NodeDoc("node-gw-1", client_id_for("central"))
    held.track_changes("tasks")
    assert held.apply_remote(writer.doc.get_update(), sender="gw-1")
    assert set(held.tasks()) == {"t1"}
    assert held.drain_changes("tasks") is None  # (the first drain: read it all)
    gone, gone_doc = weakref.ref(writer), weakref.ref(writer.doc)
    del writer
    gc.collect()
    assert gone() is None
    assert gone_doc() is None
    # the one still held keeps observing its document: its view and its changes follow
    other = NodeDoc("node-gw-1", client_id_for("gw-1"))
    assert other.apply_remote(held.doc.get_update(), sender="central")
    other.put_task("t2", TaskReport(state=TaskState.ACCEPTED, updated_at=2.0))
    assert held.apply_remote(other.doc.get_update(), sender="gw-1")
    assert set(held.tasks()) == {"t1", "t2"}
    assert held.drain_changes("tasks") == {"t2"}


def test_a_tracked_documents_own_write_is_read_back_as_written() -> None:
    """Central writes an assignment into its fleet document, then its index reads the changed
    key back: the entry it wrote, not a decode of the text, while the text is still its own;
    and its node's desired document writes the same text without encoding it again."""
    fleet = PolicyDoc("fleet", client_id_for("central"))
    fleet.packed = True
    fleet.track_changes("assignments")
    assert fleet.drain_changes("assignments") is None
    entry = assigned("gw1")
    fleet.assign("t1", entry)
    assert fleet.drain_changes("assignments") == {"t1"}
    assert fleet.assignment("t1") is entry
    desired = PolicyDoc("desired-gw1", client_id_for("central"))
    desired.packed = True
    desired.assign("t1", entry)
    assert desired.root("assignments").get("t1") == fleet.root("assignments").get("t1")
    assert desired.packed_form(entry) is fleet.packed_form(entry)
    # another central replica writes the key: the read decodes what is there now
    other = PolicyDoc("fleet", client_id_for("central-2"))
    other.packed = True
    assert other.apply_remote(fleet.snapshot(), sender="central")
    moved = assigned("gw2")
    other.assign("t1", moved)
    assert fleet.apply_remote(other.diff(fleet.state_vector()), sender="central-2")
    assert fleet.drain_changes("assignments") == {"t1"}
    read = fleet.assignment("t1")
    assert read == moved and read is not moved and read is not entry


def test_site_maps_read_fresh_tracked_at_members_only() -> None:
    """Issue 16: a site member's documents (SiteNodeDoc) track the site maps by key; central's
    replicas (NodeDoc) do not (it never reads them, and tracking cost every thaw), yet both
    read every write and removal at once, and both hash the same content alike."""
    from edgesched.sync.doc import SiteNodeDoc
    from edgesched.sync.schema import SiteOrderEntry, SiteVote

    assert NodeDoc.incremental_roots == ("tasks",)
    assert set(SiteNodeDoc.incremental_roots) >= {"site_orders", "site_stops", "site_specs"}
    writer = SiteNodeDoc("node-x", 7)
    assert writer.site_orders() == {}
    writer.put_site_order("t", SiteOrderEntry("b", "a", 2, 1))
    writer.set_site_entry("vote", SiteVote(2, "x", 1.0))
    for doc in (NodeDoc("node-x", 8), SiteNodeDoc("node-x", 9)):
        assert doc.site_orders() == {} and doc.site_vote() is None
        doc.apply_remote(writer.snapshot(), sender="x")
        assert set(doc.site_orders()) == {"t"} and doc.site_vote() == SiteVote(2, "x", 1.0)
        assert doc.content_hash() == writer.content_hash()
    writer.drop_site_keys("site_orders", ["t"])
    assert writer.site_orders() == {}
    local = NodeDoc("node-y", 3)  # central's kind, written locally: no stale view either
    assert local.site_orders() == {}
    local.put_site_order("u", SiteOrderEntry("b", "a", 2, 1))
    assert set(local.site_orders()) == {"u"}
    local.drop_site_keys("site_orders", ["u"])
    assert local.site_orders() == {}
