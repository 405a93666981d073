"""Signed document messages through a broker that forges (issue 13).

Central and two edge nodes as processes, each with its Ed25519 key (``edgesched certs
signing-key``) and the others' public keys, over a Mosquitto that lets anyone publish
anything: what a compromised broker can do. The attacker captures real frames and publishes
on the centrals' and the nodes' own topics. At both tiers a replayed frame, a frame signed with
the wrong key, an unsigned frame, and a well-signed frame carrying operations its sender may
not deliver are refused and counted by reason, and nothing changes; the fleet works and
converges throughout.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
from conftest import (
    Broker,
    EdgeNode,
    central_and_nodes,
    until,
)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pycrdt import Doc, Map

from edgesched.sync import wire
from edgesched.sync.doc import client_id_for
from edgesched.sync.signing import FrameSigning, Signer, load_signing_key, write_signing_key

NODES = ("gw-a", "gw-b")
ROOT = "edgesched/v1"


@dataclass
class KeyedFleet:
    central: EdgeNode
    nodes: dict[str, EdgeNode]
    keys: dict[str, Path]
    captured: dict[str, list[bytes]] = field(default_factory=dict)

    def refused(self, where: str, channel: str, reason: str) -> int:
        proc = self.central if where == "central" else self.nodes[where]
        code, body = proc.get("/v1/status")
        assert code == 200, body
        return int(body["refused"][channel][reason])

    def converged(self) -> bool:
        code, central = self.central.get("/v1/status")
        if code != 200:
            return False
        for node_id, node in self.nodes.items():
            code, status = node.get("/v1/status")
            if code != 200:
                return False
            code, view = self.central.get(f"/v1/nodes/{node_id}")
            if (
                code != 200
                or view["document"]["content_hash"] != (status["document"]["content_hash"])
            ):
                return False
            if status["policy_document"]["content_hash"] != central["policy_hash"]:
                return False
        return True


@asynccontextmanager
async def keyed_fleet(broker: Broker, tmp_path: Path) -> AsyncIterator[KeyedFleet]:
    keys = {}
    for name in ("central", *NODES):
        keys[name], _ = write_signing_key(tmp_path / "keys", name)
    peer_keys = str(tmp_path / "keys" / "keys")
    async with central_and_nodes(
        tmp_path,
        broker.port,
        dict.fromkeys(NODES, broker.port),
        central_mqtt={"signing_key": str(keys["central"]), "peer_keys": peer_keys},
        edge=lambda _n, _d: {"centrals": ["central"]},
        edge_mqtt=lambda n: {"signing_key": str(keys[n]), "peer_keys": peer_keys},
    ) as (central, nodes):
        yield KeyedFleet(central, nodes, keys)


def submit(fleet: KeyedFleet, task_id: str, node_id: str) -> None:
    body = {"id": task_id, "command": ["sleep", "300"], "cpu": 0.05, "mem_gib": 0.05,
            "node": node_id}  # fmt: skip
    code, reply = fleet.central.request("POST", "/v1/tasks", body)
    assert code == 201, reply


def signed_update(
    signer: Signer | None, doc: str, client_id: int, update: bytes, state: bytes
) -> list[bytes]:
    """``update`` framed as ``signer``'s peer publishes it (unsigned if None)."""
    payload = wire.update_payload(update, state)
    msg_id = wire.new_msg_id()
    kind = wire.Kind.UPDATE
    sealed = None if signer is None else signer.seal(doc, int(kind), client_id, 0, msg_id, payload)
    body = payload if sealed is None else sealed
    return wire.encode(kind, doc, client_id, body, msg_id=msg_id, signed=sealed is not None)


async def capture(client: aiomqtt.Client, topics: list[str], into: dict[str, list[bytes]]) -> None:
    for topic in topics:
        await client.subscribe(topic, qos=1)
    async for msg in client.messages:
        if isinstance(msg.payload, bytes):
            into.setdefault(str(msg.topic), []).append(msg.payload)


async def test_a_forging_broker_gets_nothing_past_signatures(
    broker: Broker, tmp_path: Path
) -> None:
    async with keyed_fleet(broker, tmp_path) as fleet:
        a, b = fleet.nodes["gw-a"], fleet.nodes["gw-b"]
        policy_topic = wire.sync_topic("policy", "central")
        own_topic = wire.sync_topic("node-gw-a", "gw-a")
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="the-broker") as ear:
            listening = asyncio.create_task(capture(ear, [policy_topic, own_topic],
                                                    fleet.captured))  # fmt: skip
            try:
                # Signed end to end, the fleet works: an assignment runs, a switch is followed.
                await asyncio.to_thread(submit, fleet, "job-a", "gw-a")
                await until(lambda: a.tasks().get("job-a", {}).get("state") == "running", 30,
                            "job-a running on gw-a")  # fmt: skip
                code, _ = await asyncio.to_thread(
                    fleet.central.request, "POST", "/v1/policy", {"mode": "energy"}
                )
                assert code == 200
                await until(lambda: b.get("/v1/status")[1]["policy"] == "energy", 20,
                            "gw-b following the switch")  # fmt: skip
                await until(fleet.converged, 30, "the keyed fleet converged")
                await until(lambda: fleet.captured.get(policy_topic) and fleet.captured.get(
                    own_topic), 10, "frames of central and of gw-a captured")  # fmt: skip
            finally:
                listening.cancel()

            async def sent(topic: str, frames: list[bytes]) -> None:
                for frame in frames:
                    await ear.publish(topic, frame, qos=1)

            async def refused_more(where: str, channel: str, reason: str, act: Any) -> None:
                before = await asyncio.to_thread(fleet.refused, where, channel, reason)
                await act

                def counted() -> bool:
                    return fleet.refused(where, channel, reason) > before

                await until(counted, 10, f"{where} refusing on {channel} for {reason}")

            # The node tier: frames "from central" on central's own policy topic.
            await refused_more("gw-b", "policy", "replay",
                               sent(policy_topic, fleet.captured[policy_topic][-1:]))  # fmt: skip
            forger: Doc[Any] = Doc(client_id=client_id_for("central"))
            forger.get("policy", type=Map)["mode"] = "priority"
            impostor = Signer("central", Ed25519PrivateKey.generate())
            cid = client_id_for("central")
            for signer in (impostor, None):
                frames = signed_update(signer, "policy", cid, forger.get_update(), b"\x00")
                await refused_more("gw-b", "policy", "signature", sent(policy_topic, frames))

            # The central tier: frames "from gw-a" on gw-a's own document topic.
            await refused_more("central", "node", "replay",
                               sent(own_topic, fleet.captured[own_topic][-1:]))  # fmt: skip
            evil: Doc[Any] = Doc(client_id=client_id_for("gw-a"))
            evil.get("tasks", type=Map)["evil"] = json.dumps({"state": "running"})
            impostor = Signer("gw-a", Ed25519PrivateKey.generate())
            cid = client_id_for("gw-a")
            for signer in (impostor, None):
                frames = signed_update(signer, "node-gw-a", cid, evil.get_update(), b"\x00")
                await refused_more("central", "node", "signature", sent(own_topic, frames))

            # Authorship still binds a valid signature to its sender: gw-b's own key (a stolen
            # gw-b), on a topic of gw-b's into gw-a's document, operations under gw-a's id.
            gw_b = FrameSigning(Signer("gw-b", load_signing_key(fleet.keys["gw-b"])), None)
            assert gw_b.signer is not None
            gw_b_cid = client_id_for("gw-b")  # (its own id in the header, as its peer sends)
            # (past gw-a's own clocks: at clocks gw-a already holds it would be an echo,
            # dropped as bringing nothing rather than refused)
            for k in range(5_000):
                evil.get("tasks", type=Map)["evil"] = json.dumps({"state": "running", "k": k})
            frames = signed_update(gw_b.signer, "node-gw-a", gw_b_cid, evil.get_update(), b"\x00")
            await refused_more("gw-a", "node", "authorship",
                               sent(wire.sync_topic("node-gw-a", "gw-b"), frames))  # fmt: skip

        # Nothing changed: the policy, central's view of gw-a, gw-a's own document.
        assert (await asyncio.to_thread(b.get, "/v1/status"))[1]["policy"] == "energy"
        code, view = await asyncio.to_thread(fleet.central.get, "/v1/nodes/gw-a")
        assert code == 200 and "evil" not in str(view["content"])
        assert "evil" not in await asyncio.to_thread(a.tasks)
        await until(fleet.converged, 30, "the keyed fleet converged after the attacks")
        # The same counts on both tiers' /metrics (Prometheus text).
        for proc, line in (
            (b, 'edgesched_edge_refused_total{channel="policy",reason="replay"} '),
            (fleet.central, 'edgesched_central_refused_total{channel="node",reason="signature"} '),
        ):
            code, text = await asyncio.to_thread(proc.get, "/metrics")
            assert code == 200
            values = [ln.removeprefix(line) for ln in str(text).splitlines() if ln.startswith(line)]
            assert values and float(values[0]) >= 1, (line, str(text)[:2000])
        assert (await asyncio.to_thread(a.tasks))["job-a"]["state"] == "running"
