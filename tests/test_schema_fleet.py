"""Bad document entries of every kind, sent to a real central and a real edge node over real
Mosquitto: both keep running, count each refusal by kind, still do the legitimate work, and
stay converged (byte-equal content by hash) with the peers that wrote the bad entries.

The bad entries come from peers built from the project's own document and peer classes: a
second central replica writing the policy document (its writes are accepted: it is a listed
central), and a node writing its own document. What they write is well-formed CRDT content
that the schema refuses: wrong types, missing fields, values out of range. Extra fields are
accepted (a newer peer may add them)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from conftest import Broker, EdgeNode, central_and_nodes

from edgesched.core.model import Arch, ServerClass
from edgesched.core.task import TaskSpec, TaskState
from edgesched.sync.doc import NodeDoc, PolicyDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import AssignmentEntry, PowerModel, Registration, TaskReport

REGISTRATION = Registration(
    arch=Arch.X86_64,
    server_class=ServerClass.GENERAL,
    cpu=4.0,
    mem_gib=8.0,
    power=PowerModel(idle_w=10.0, peak_w=40.0, parked_w=2.0, wake_latency_s=5.0),
)


def _write_bad_node_entries(doc: NodeDoc, now: float) -> None:
    doc.set_registration(REGISTRATION)
    ok = TaskReport(state=TaskState.RUNNING, updated_at=now, node="gw-evil", cpu=0.1)
    doc.put_task("ok", ok)
    tasks = doc.root("tasks")
    tasks["extra-field"] = {**ok.to_entry(), "from_a_newer_engine": [1, 2]}  # accepted
    tasks["wrong-type"] = {"state": "running", "updated_at": "noon"}
    tasks["missing-field"] = {"state": "running"}
    tasks["unknown-state"] = {**ok.to_entry(), "state": "dancing"}
    tasks["beyond-the-wire"] = {**ok.to_entry(), "restarts": 2.0**60}
    tasks["not-an-object"] = "running"
    node = doc.root("node")
    node["models"] = {
        "forecast": "shipped",  # a string where an object belongs
        "placement": {"sha256": "ab", "source": "central", "from_a_newer_engine": 1},  # ok
    }
    node["power"] = {"state": 5}


def _write_bad_registration(doc: NodeDoc) -> None:
    """A node whose registration lacks its architecture (and whose power report has a field
    this version does not know, which is fine)."""
    raw = REGISTRATION.to_entry()
    del raw["arch"]
    doc.root("node")["registration"] = raw
    doc.root("node")["power"] = {"state": "active", "since": 1.0, "battery": 0.5}


def _write_bad_policy_entries(doc: PolicyDoc, policy_doc: PolicyDoc, now: float) -> None:
    """Bad desired state into the fleet document (``doc``, centrals only) and bad fleet-wide
    settings into the policy document every node replicates (``policy_doc``)."""
    good = TaskSpec(id="b-ok", command=("sleep", "60"), cpu=0.1, mem_gib=0.05)
    doc.assign(
        "b-ok",
        AssignmentEntry(spec=good, node="gw1", epoch=1, central="central-b", at=now),
    )
    assignments = doc.root("assignments")
    assignments["spec-string"] = {
        "spec": "rm -rf /",
        "node": "gw1",
        "epoch": 1,
        "central": "central-b",
        "at": now,
    }
    assignments["missing-node"] = {"spec": good.to_json(), "epoch": 1, "central": "b", "at": now}
    assignments["extra-field"] = {
        **AssignmentEntry(
            spec=TaskSpec(id="extra-field", command=("true",), cpu=0.1),
            node="gw-elsewhere",
            epoch=1,
            central="central-b",
            at=now,
        ).to_entry(),
        "from_a_newer_central": True,
    }
    doc.root("stops")["b-ok@gw1"] = {"epoch": "first", "winner": "gw2", "at": now}
    doc.root("stops")["other@gw9"] = {"winner": "gw2", "at": now}  # no epoch
    doc.root("power")["gw1"] = {"state": "exploded", "at": now}
    doc.root("power")["gw9"] = {"state": "active"}  # no time
    policy_doc.root("models")["forecast"] = {"sha256": 7}
    policy_doc.root("models")["placement"] = {"data": "AAAA"}  # no sha256
    policy = policy_doc.root("policy")
    policy["mode"] = "chaos"
    policy["tidal"] = "campus"  # a string where an object belongs


async def _until(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"not reached in {timeout}s: {what} (last: {last!r})")


async def test_bad_entries_are_refused_counted_and_converged_at_both_tiers(
    broker: Broker, tmp_path: Path
) -> None:
    async with central_and_nodes(
        tmp_path,
        broker.port,
        {"gw1": broker.port},
        central={"peers": ["central-b"]},
        edge=lambda _n, _d: {"centrals": ["central", "central-b"]},
    ) as (central, nodes):
        gw1: EdgeNode = nodes["gw1"]
        policy = PolicyDoc("policy", client_id_for("central-b"))
        fleet = PolicyDoc("fleet", client_id_for("central-b"))
        evil = NodeDoc("node-gw-evil", client_id_for("gw-evil"))
        evil2 = NodeDoc("node-gw-evil2", client_id_for("gw-evil2"))
        peers = [
            DocPeer(policy, "central-b", "127.0.0.1", broker.port, backoff_max_s=0.5),
            DocPeer(fleet, "central-b", "127.0.0.1", broker.port, backoff_max_s=0.5),
            DocPeer(evil, "gw-evil", "127.0.0.1", broker.port, backoff_max_s=0.5),
            DocPeer(evil2, "gw-evil2", "127.0.0.1", broker.port, backoff_max_s=0.5),
        ]
        running = [asyncio.create_task(p.run()) for p in peers]
        try:
            # central-b first learns the policy as central wrote it, then writes its own
            await _until(
                "central-b synced",
                lambda: (
                    central.get("/v1/status")[1]["policy_hash"] == policy.content_hash()
                    and bool(peers[0].synced_at)
                ),
            )
            now = asyncio.get_running_loop().time()
            _write_bad_node_entries(evil, now)
            _write_bad_registration(evil2)
            _write_bad_policy_entries(fleet, policy, now)

            # converged: every replica byte-equal to its writer's copy
            def central_has_evil() -> bool:
                status, body = central.get("/v1/nodes/gw-evil")
                return status == 200 and body["document"]["content_hash"] == evil.content_hash()

            await _until("central's replica of gw-evil", central_has_evil)

            def central_has_evil2() -> bool:
                status, body = central.get("/v1/nodes/gw-evil2")
                return status == 200 and body["document"]["content_hash"] == evil2.content_hash()

            await _until("central's replica of gw-evil2", central_has_evil2)

            def policy_converged() -> bool:
                c = central.get("/v1/status")[1]
                n = gw1.get("/v1/status")[1]["policy_document"]
                return bool(c["policy_hash"] == n["content_hash"] == policy.content_hash())

            await _until("the policy document at central and gw1", policy_converged)
            await _until(
                "the fleet document at central",
                lambda: central.get("/v1/status")[1]["fleet_hash"] == fleet.content_hash(),
            )

            # the legitimate work goes on: gw1 runs central-b's valid assignment
            await _until(
                "b-ok running on gw1",
                lambda: gw1.tasks().get("b-ok", {}).get("state") == "running",
            )
            status, evil_view = central.get("/v1/nodes/gw-evil")
            assert status == 200
            assert evil_view["tasks"] == {"running": 2}  # "ok" and "extra-field"
            assert evil_view["registration"]["cpu"] == 4
            evil2_view = central.get("/v1/nodes/gw-evil2")[1]
            assert evil2_view["registration"] is None  # refused: no placement target
            assert "gw-evil2" not in {n["id"] for n in central.get("/v1/nodes")[1]["nodes"]
                                      if n["registration"]}  # fmt: skip
            models = central.get("/v1/models")[1]["nodes"]
            assert set(models["gw-evil"]) == {"placement"}  # the refused one left out

            # every refusal counted, by kind, at both tiers
            c_status = central.get("/v1/status")[1]
            refused = c_status["refused_entries"]
            assert refused["task"] == 5, refused
            assert refused["models"] == 1 and refused["power"] == 1, refused
            assert refused["registration"] == 1, refused
            expected_policy = {
                "assignment": 2,
                "stop": 2,
                "power-order": 2,
                "model": 2,
                "mode": 1,
                "tidal": 1,
            }
            for kind, count in expected_policy.items():
                assert refused[kind] == count, (kind, refused)
            assert c_status["rejected"]["schema_entries"] == sum(refused.values())
            # The node replicates the fleet-wide policy (its bad settings refused there too)
            # and its own desired state, which central projects from valid entries only: the
            # bad assignments, stops and power orders never reach it.
            gw1_status = gw1.get("/v1/status")[1]
            node_refused = gw1_status["policy_document"]["refused_entries"]
            assert node_refused == {"model": 2, "mode": 1, "tidal": 1}
            assert gw1_status["desired_document"]["refused_entries"] == {}
            assert gw1_status["desired_document"]["assignments"] == 1  # b-ok
            # and both are still up and answering
            assert central.proc is not None and central.proc.poll() is None
            assert gw1.proc is not None and gw1.proc.poll() is None
            assert central.get("/v1/health", auth=False)[0] == 200
            assert gw1.get("/v1/health", auth=False)[0] == 200
            metrics = central.request("GET", "/metrics")[1]
            assert 'edgesched_central_rejected_total{reason="schema_entries"}' in metrics
        finally:
            for task in running:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
