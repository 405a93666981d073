"""Central's parts in isolation: status messages, discovery of node documents, persistence."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgesched.central.liveness import Liveness, parse_status
from edgesched.central.replicas import NodeReplicas, parse_sync_topic
from edgesched.core.task import TaskState
from edgesched.sync import wire
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.schema import TaskReport
from edgesched.sync.session import Endpoint, MqttSession
from edgesched.sync.store import Store

#: A node's report of a running task.
RUNNING = TaskReport(state=TaskState.RUNNING, updated_at=1.0)


def status(node: str, state: str) -> bytes:
    return json.dumps({"node": node, "state": state}).encode()


def test_liveness_follows_status_and_refuses_forgeries() -> None:
    now = [100.0]
    live = Liveness(clock=lambda: now[0])
    changes: list[tuple[str, str]] = []
    live.on_change = lambda node, s: changes.append((node, s.state))
    live.handle("edgesched/v1/node/gw1/status", status("gw1", "online"))
    now[0] = 105.0
    live.handle("edgesched/v1/node/gw1/status", status("gw1", "online"))  # no change
    live.handle("edgesched/v1/node/gw1/status", status("gw1", "offline"))
    assert changes == [("gw1", "online"), ("gw1", "offline")]
    assert live.nodes["gw1"].since == 105.0 and live.state("gw2") == "unknown"
    for topic, payload in [
        ("edgesched/v1/node/gw1/status", status("gw2", "offline")),  # names another node
        ("edgesched/v1/node/gw1/status", b"\xff not json"),
        ("edgesched/v1/node/gw1/status", status("gw1", "sleeping")),
        ("edgesched/v1/node/gw1/status", b"x" * 5000),
        ("edgesched/v1/node/gw1/other", status("gw1", "online")),
    ]:
        live.handle(topic, payload)
    assert live.rejected == 5 and live.state("gw1") == "offline"


def test_a_sites_bridge_dropping_takes_its_nodes_offline_until_it_is_back() -> None:
    now = [100.0]
    sites = {"gw1": "north", "gw2": "north", "gw3": "south"}
    live = Liveness(clock=lambda: now[0], site_of=sites.get)
    changes: list[tuple[str, str, float]] = []
    live.on_change = lambda node, s: changes.append((node, s.state, s.since))
    for node in sites:
        live.handle(f"edgesched/v1/node/{node}/status", status(node, "online"))
    live.handle("edgesched/v1/site/north/bridge", b"1")  # up: nothing changes
    assert all(live.state(n) == "online" for n in sites)
    changes.clear()
    now[0] = 200.0
    live.handle("edgesched/v1/site/north/bridge", b"0")  # the WAN of site north is cut
    assert changes == [("gw1", "offline", 200.0), ("gw2", "offline", 200.0)]
    assert live.state("gw3") == "online"
    now[0] = 210.0
    live.handle("edgesched/v1/node/gw1/status", status("gw1", "online"))  # a retained copy
    assert live.state("gw1") == "offline" and live.nodes["gw1"].since == 200.0
    for bad in (b"", b"2", b"up", b"0" * 100):
        live.handle("edgesched/v1/site/north/bridge", bad)
    assert live.rejected == 4 and live.state("gw2") == "offline"
    changes.clear()
    now[0] = 230.0
    live.handle("edgesched/v1/site/north/bridge", b"1")  # healed
    assert changes == [("gw1", "online", 230.0), ("gw2", "online", 230.0)]
    # A node that went offline for itself while its site was cut stays offline after.
    live.handle("edgesched/v1/site/north/bridge", b"0")
    live.handle("edgesched/v1/node/gw2/status", status("gw2", "offline"))
    live.handle("edgesched/v1/site/north/bridge", b"1")
    assert live.state("gw1") == "online" and live.state("gw2") == "offline"


@given(st.binary(max_size=64), st.text(max_size=40))
def test_parse_status_never_crashes(payload: bytes, topic: str) -> None:
    try:
        node, state = parse_status(topic, payload)
    except ValueError:
        return
    assert state in ("online", "offline") and node


def test_parse_sync_topic() -> None:
    assert parse_sync_topic("edgesched/v1/doc/node-a/sync/a") == ("node-a", "a")
    for bad in ("edgesched/v1/doc/node-a/sync/", "edgesched/v2/doc/x/sync/y", "a/b/c"):
        assert parse_sync_topic(bad) is None


def _frame(doc: NodeDoc) -> bytes:
    payload = wire.update_payload(doc.diff(), doc.state_vector())
    (only,) = wire.encode(wire.Kind.UPDATE, doc.name, doc.client_id, payload)
    return only


def _replicas(**kw: object) -> NodeReplicas:
    session = MqttSession(Endpoint("127.0.0.1", 1883, "central"))  # never started here
    return NodeReplicas("central", session, **kw)  # type: ignore[arg-type]


def test_a_node_document_is_discovered_only_from_the_node_itself() -> None:
    replicas = _replicas()
    node = NodeDoc("node-gw1", client_id_for("gw1"))
    node.put_task("t1", RUNNING)
    replicas.handle("edgesched/v1/doc/node-gw1/sync/gw2", _frame(node))  # someone else
    assert replicas.replicas == {} and replicas.stats["refused_unknown"] == 1
    replicas.handle("edgesched/v1/doc/policy/sync/gw1", b"whatever")  # not a node document
    assert replicas.stats["ignored"] == 1
    replicas.handle("edgesched/v1/doc/node-gw1/sync/gw1", _frame(node))
    assert set(replicas.replicas) == {"gw1"}
    assert replicas.replicas["gw1"].doc.task("t1") == RUNNING
    assert replicas.session.channels == [replicas.replicas["gw1"].peer]


def test_a_lone_central_takes_a_nodes_duplicate_answer_for_a_duplicate() -> None:
    """Alone, central is the only one asking a node for its document, so the node's step 2
    that brings nothing new is a duplicate (a healed node's queued updates inside its answer),
    not a sign of updates held pending: no full read of its tasks. With fellow centrals the
    node's answer to another central's state vector may leave ours waiting: read in full."""
    for fellows, full_read in (((), False), (("central-b",), True)):
        replicas = _replicas(centrals=fellows)
        node = NodeDoc("node-gw1", client_id_for("gw1"))
        node.put_task("t1", RUNNING)
        replicas.handle("edgesched/v1/doc/node-gw1/sync/gw1", _frame(node))
        replica = replicas.replicas["gw1"]
        assert replica.peer.sole_asker is not full_read
        replica.doc.drain_changes("tasks")
        answer = wire.step2_payload(node.diff(b"\x00"))  # to a step 1 sent before the update
        (frame,) = wire.encode(wire.Kind.SYNC, node.name, node.client_id, answer)
        replicas.handle("edgesched/v1/doc/node-gw1/sync/gw1", frame)
        assert replica.peer.synced_at.get("gw1") is not None
        assert (replica.doc.drain_changes("tasks") is None) is full_read


def test_a_lone_central_spares_its_answer_to_a_node_that_holds_everything() -> None:
    """A node's step 1 to central's replica of its document, when the node holds every
    operation of the replica (the usual reconnect: the node is the document's only writer):
    alone, central owes it nothing and sends nothing; one behind the replica (a node restored
    from an old copy) is answered; with fellow centrals every step 1 is answered as before."""
    for fellows, spared in (((), True), (("central-b",), False)):
        replicas = _replicas(centrals=fellows)
        node = NodeDoc("node-gw1", client_id_for("gw1"))
        node.put_task("t1", RUNNING)
        node.remove_task("t1")  # a deletion in the replica's delete set: the node's own
        node.put_task("t2", RUNNING)
        replicas.handle("edgesched/v1/doc/node-gw1/sync/gw1", _frame(node))
        peer = replicas.replicas["gw1"].peer
        for vector, owed in ((node.state_vector(), not spared), (b"\x00", True)):
            before = peer.stats["answers_spared"]
            ask = wire.step1_payload(vector, replies=True)
            (frame,) = wire.encode(wire.Kind.SYNC, node.name, node.client_id, ask)
            replicas.handle("edgesched/v1/doc/node-gw1/sync/gw1", frame)
            assert bool(peer._answers) is owed
            assert peer.stats["answers_spared"] - before == (0 if owed else 1)
            peer._answers.clear()


def test_a_node_list_limits_discovery() -> None:
    replicas = _replicas(nodes=["gw1"])
    other = NodeDoc("node-gw9", client_id_for("gw9"))
    other.put_task("t", RUNNING)
    replicas.handle("edgesched/v1/doc/node-gw9/sync/gw9", _frame(other))
    assert replicas.replicas == {} and replicas.stats["refused_unknown"] == 1


async def test_replicas_survive_a_restart_through_sqlite(tmp_path: Path) -> None:
    node = NodeDoc("node-gw1", client_id_for("gw1"))
    node.put_task("t1", RUNNING)
    async with await Store.open(tmp_path / "central.db") as store:
        replicas = _replicas(store=store)
        replicas.handle("edgesched/v1/doc/node-gw1/sync/gw1", _frame(node))
        assert await replicas.persist_changed() == 1
        assert await replicas.persist_changed() == 0  # nothing moved since
    async with await Store.open(tmp_path / "central.db") as store:
        again = _replicas(store=store)
        assert await again.load() == 1
        assert again.replicas["gw1"].doc.content_hash() == node.content_hash()
        assert again.replicas["gw1"].doc.client_id == client_id_for("central")


async def test_a_snapshot_pass_writes_replicas_in_few_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A pass writes its changed replicas a batch a transaction (not one commit each), skips
    the unchanged, appends a replica's later changes to its log (one store call), refuses to
    go back on an epoch either way, and a restart loads what it wrote."""
    monkeypatch.setattr("edgesched.central.replicas.SNAPSHOT_BATCH_DOCS", 10)
    nodes = {}
    for i in range(25):
        node = NodeDoc(f"node-gw{i}", client_id_for(f"gw{i}"))
        node.put_task("t1", RUNNING)
        nodes[f"gw{i}"] = node
    async with await Store.open(tmp_path / "central.db") as store:
        calls: list[int] = []
        replace = store.replace_docs

        taken = 0  # snapshots taken so far: a batch is written before the next is encoded
        taken_at_calls: list[int] = []

        async def counted(docs: Any) -> list[str]:
            calls.append(len(docs))
            taken_at_calls.append(taken)
            return await replace(docs)

        monkeypatch.setattr(store, "replace_docs", counted)
        replicas = _replicas(store=store)
        for node_id, node in nodes.items():
            replicas.handle(f"edgesched/v1/doc/node-{node_id}/sync/{node_id}", _frame(node))
        for replica in replicas.replicas.values():
            encode = replica.doc.snapshot

            def counting(encode: Any = encode) -> bytes:
                nonlocal taken
                taken += 1
                return bytes(encode())

            monkeypatch.setattr(replica.doc, "snapshot", counting)
        assert await replicas.persist_changed() == 25
        assert calls == [10, 10, 5]
        assert taken_at_calls == [10, 20, 25]  # (not all 25 encoded, then held, first)
        assert await replicas.persist_changed() == 0 and calls == [10, 10, 5]
        await store.rotate_doc("node-gw3", b"", 7)  # another writer went to a newer epoch
        for node_id in ("gw3", "gw4"):
            nodes[node_id].put_task("t2", RUNNING)
            replicas.handle(
                f"edgesched/v1/doc/node-{node_id}/sync/{node_id}", _frame(nodes[node_id])
            )
        with caplog.at_level(logging.ERROR):
            assert await replicas.persist_changed() == 1  # gw4's change appended to its log
        assert calls == [10, 10, 5]  # (no snapshot for a change: ~0.3 kB, not the document)
        assert "replica of gw3: updates not saved: the store holds another epoch" in caplog.text
        assert replicas.replicas["gw3"].saved == -1  # written whole next pass
        with caplog.at_level(logging.ERROR):
            assert await replicas.persist_changed() == 0
        assert "replica of gw3 not saved: the store holds a newer epoch" in caplog.text
        assert calls == [10, 10, 5, 1]
        assert await replicas.persist_changed() == 0  # (and again at each pass)
    async with await Store.open(tmp_path / "central.db") as store:
        again = _replicas(store=store)
        assert await again.load() == 25
        for node_id in ("gw0", "gw4", "gw24"):
            assert again.replicas[node_id].doc.content_hash() == nodes[node_id].content_hash()


@pytest.mark.parametrize("nodes", [(), ("gw1",)])
def test_replica_peers_refuse_other_writers(nodes: tuple[str, ...]) -> None:
    replicas = _replicas(nodes=nodes)
    node = NodeDoc("node-gw1", client_id_for("gw1"))
    node.put_task("t1", RUNNING)
    replicas.handle("edgesched/v1/doc/node-gw1/sync/gw1", _frame(node))
    forger = NodeDoc("node-gw1", client_id_for("gw1") ^ 1)
    forger.put_task("evil", RUNNING)
    peer = replicas.replicas["gw1"].peer
    peer.handle("edgesched/v1/doc/node-gw1/sync/gw1", _frame(forger))  # claims another id
    assert peer.stats["rejected_senders"] == 1
    assert replicas.replicas["gw1"].doc.task("evil") is None


def test_a_replicas_decoded_content_follows_every_change() -> None:
    replicas = _replicas()
    node = NodeDoc("node-gw1", client_id_for("gw1"))
    node.put_task("t1", RUNNING)
    replicas.handle("edgesched/v1/doc/node-gw1/sync/gw1", _frame(node))
    replica = replicas.replicas["gw1"]
    first = replica.doc.typed()
    assert replica.doc.typed() is first  # decoded once
    assert replicas.views() == {"gw1": first} and replicas.views()["gw1"] is first  # one cache
    assert dict(first.tasks) == {"t1": RUNNING}
    before = node.state_vector()
    node.put_task("t2", RUNNING)
    update = node.diff(before)
    payload = wire.update_payload(update, node.state_vector())
    (frame,) = wire.encode(wire.Kind.UPDATE, node.name, node.client_id, payload)
    replica.peer.handle("edgesched/v1/doc/node-gw1/sync/gw1", frame)
    tasks = replica.doc.typed().tasks
    assert dict(tasks) == {"t1": RUNNING, "t2": RUNNING}
    assert replicas.views()["gw1"].tasks == tasks
    raw = replica.doc.to_json()["tasks"]
    assert isinstance(raw, dict) and set(raw) == {"t1", "t2"}


def test_the_status_hashes_the_fleet_document_only_while_it_is_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hashing the fleet document reads all of it (~14 s of central's loop at 700,000
    assignments): past STATUS_HASH_MAX_ENTRIES the status says null instead."""
    from edgesched.central import engine as engine_module
    from edgesched.central.engine import CentralEngine
    from edgesched.config import parse_config
    from edgesched.sync.doc import PolicyDoc, client_id_for

    config = parse_config({"central": {"state_dir": str(tmp_path)}})
    engine = CentralEngine(config)
    fleet = PolicyDoc("fleet", client_id_for("central"))
    engine.fleet = fleet
    for key in ("a", "b", "c"):
        engine.index.assignments[key] = None  # type: ignore[assignment]  # (only counted)
    monkeypatch.setattr(engine_module, "STATUS_HASH_MAX_ENTRIES", 3)
    assert engine._fleet_hash() == fleet.content_hash()
    monkeypatch.setattr(engine_module, "STATUS_HASH_MAX_ENTRIES", 2)
    assert engine._fleet_hash() is None


def _frozen(doc: NodeDoc) -> bool:
    """``doc.frozen`` through a call (mypy narrows a property across asserts)."""
    return doc.frozen


def test_the_replicas_sweep_on_a_period_of_their_own(tmp_path: Path) -> None:
    """A node's replica is frozen by the replicas' own sweeps (``replica_cold_after_s``), a
    desired-state document only by the full ones; the index has read what changed first."""
    from edgesched.central.engine import CentralEngine
    from edgesched.config import parse_config
    from edgesched.sync.doc import PolicyDoc

    config = parse_config({"central": {"central_id": "central", "state_dir": str(tmp_path)}})
    assert (config.central.replica_cold_after_s, config.central.cold_after_s) == (2.0, 60.0)
    engine = CentralEngine(config, clock=lambda: 1000.0)
    engine.fleet = PolicyDoc("fleet", client_id_for("central"))
    engine.fleet.track_changes("assignments", "stops", "power")
    node = NodeDoc("node-gw1", client_id_for("gw1"))
    updates: list[bytes] = []
    node.on_local_update(updates.append)
    node.put_task("t1", RUNNING)
    replica = engine.replicas.add("gw1")
    desired = NodeDoc("desired-gw1", client_id_for("central"))
    engine.freezer.watch(desired)
    replica.doc.apply_remote(updates[0], sender="gw1")
    engine.sweep_cold(replicas_only=True)  # both were used since: both stay
    engine.sweep_cold(replicas_only=True)
    assert _frozen(replica.doc) and not _frozen(desired)  # the replica's own sweeps only
    assert engine.index.members["gw1"].reports["t1"] == RUNNING  # read before it froze
    node.put_task("t2", RUNNING)
    replica.doc.apply_remote(updates[1], sender="gw1")  # thaws it
    assert not _frozen(replica.doc)
    engine.sweep_cold()  # a full sweep: used since the last (the change)
    engine.sweep_cold()
    assert _frozen(replica.doc) and _frozen(desired)
    assert set(engine.index.members["gw1"].reports) == {"t1", "t2"}
