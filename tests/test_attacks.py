"""An attacker holding one gateway's credentials, against a real fleet (issue 13).

Central and two edge nodes as processes, Mosquitto with the generated ACL and password file,
exactly as docs/install.md sets a fleet up. The attacker is gw-a's credentials in another
client (the gateway was opened and its software replaced): it fetches what gw-a may read and
publishes forgeries where gw-a may write (``edgesched.fieldtest.attacks``). Every forgery
must be refused, counted by channel and reason in central's ``/v1/status``, change nothing,
and leave every replica equal to its writer's document once the real gw-a comes back.
"""

from __future__ import annotations

import asyncio
import getpass
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
from conftest import (
    Broker,
    EdgeNode,
    central_and_nodes,
    edgesched_binary,
    free_port,
    until,
)

from edgesched.fieldtest import attacks
from edgesched.sync import security as sec
from edgesched.sync import wire
from edgesched.sync.doc import desired_doc_name

NODES = ("gw-a", "gw-b")


@dataclass
class SecuredFleet:
    broker: Broker
    central: EdgeNode
    nodes: dict[str, EdgeNode]
    passwords: dict[str, str]

    def status(self) -> dict[str, Any]:
        code, body = self.central.get("/v1/status")
        assert code == 200, body
        return dict(body)

    def refused(self, channel: str, reason: str) -> int:
        return int(self.status()["refused"][channel][reason])

    def node_view(self, node_id: str) -> dict[str, Any]:
        code, body = self.central.get(f"/v1/nodes/{node_id}")
        assert code == 200, body
        return dict(body)

    def converged(self) -> bool:
        """Central's replica of each node's document equals the node's own (by hash), and
        each node's policy equals central's."""
        central = self.status()
        for node_id, node in self.nodes.items():
            code, status = node.get("/v1/status")
            if code != 200:
                return False
            seen = self.node_view(node_id)["document"]["content_hash"]
            if seen != status["document"]["content_hash"]:
                return False
            if status["policy_document"]["content_hash"] != central["policy_hash"]:
                return False
        return True


@asynccontextmanager
async def secured_fleet(tmp_path: Path) -> AsyncIterator[SecuredFleet]:
    port = free_port()
    passwords = {name: f"{name}-secret" for name in ("central", *NODES)}
    pw_file = sec.write_password_file(tmp_path / "passwords", passwords)
    acl = tmp_path / "acl"
    acl.write_text(sec.acl(["central"]))
    (tmp_path / "broker-db").mkdir()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        sec.broker_config(
            port=port,
            acl_path=acl,
            password_file=pw_file,
            tls=False,
            persistence_dir=tmp_path / "broker-db",
            user=getpass.getuser(),
        )
    )
    broker = Broker(port, None, conf, tmp_path / "mosquitto.log")  # type: ignore[arg-type]
    broker.start()
    secrets = {}
    for name, password in passwords.items():
        secrets[name] = tmp_path / f"{name}.password"
        secrets[name].write_text(password + "\n")
        secrets[name].chmod(0o600)
    try:
        async with central_and_nodes(
            tmp_path,
            port,
            dict.fromkeys(NODES, port),
            central_mqtt={"password_file": str(secrets["central"])},
            edge=lambda _n, _d: {"centrals": ["central"]},
            edge_mqtt=lambda n: {"password_file": str(secrets[n])},
        ) as (central, nodes):
            yield SecuredFleet(broker, central, nodes, passwords)
    finally:
        broker.stop()


def submit_at_central(fleet: SecuredFleet, task_id: str, node_id: str) -> None:
    body = {
        "id": task_id,
        "command": ["sleep", "300"],
        "cpu": 0.05,
        "mem_gib": 0.05,
        "node": node_id,
    }
    code, reply = fleet.central.request("POST", "/v1/tasks", body)
    assert code == 201, reply


def running_on(node: EdgeNode, task_id: str) -> bool:
    return node.tasks().get(task_id, {}).get("state") == "running"


async def test_one_gateways_credentials_forge_nothing(tmp_path: Path) -> None:
    async with secured_fleet(tmp_path) as fleet:
        a, b = fleet.nodes["gw-a"], fleet.nodes["gw-b"]
        for task_id, node_id in (("job-a", "gw-a"), ("job-b", "gw-b")):
            await asyncio.to_thread(submit_at_central, fleet, task_id, node_id)
        await until(lambda: running_on(a, "job-a") and running_on(b, "job-b"), 30, "jobs run")
        await until(fleet.converged, 30, "the fleet converged before the attack")
        mode = (await asyncio.to_thread(fleet.central.get, "/v1/policy"))[1]["mode"]
        forged_mode = "energy" if mode != "energy" else "balance"

        # The gateway is opened: its software stops, its credentials are the attacker's.
        await asyncio.to_thread(a.kill, 15)
        # The same forgeries as an operator runs them against a fleet of theirs: the command.
        done = await asyncio.to_thread(
            subprocess.run,
            [
                edgesched_binary(),
                "fieldtest",
                "attack",
                "--config",
                str(a.config),
                "--central",
                fleet.central.url(""),
                "--token-file",
                str(fleet.central.state / "api-token"),
                "--other-node",
                "gw-b",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == 5 and all(line.startswith("refused ") for line in lines), lines

        async with aiomqtt.Client(
            "127.0.0.1",
            fleet.broker.port,
            identifier="gw-a",
            username="gw-a",
            password=fleet.passwords["gw-a"],
        ) as client:
            attacker = attacks.Attacker(client, "gw-a", "central")
            policy = await attacker.fetch(attacks.POLICY)
            desired = await attacker.fetch(desired_doc_name("gw-a"))
            forgeries = [
                attacks.policy_continuation(policy, "central", "gw-a", forged_mode),
                attacks.policy_new_root(policy, "central", "gw-a"),
                attacks.desired_pure_delete(desired, "gw-a", "job-a"),
                attacks.desired_forged_assignment(
                    desired, "central", "gw-a", "evil", ["sh", "-c", "touch /tmp/pwned"]
                ),
                attacks.node_doc_other_author("gw-a", "gw-b", "evil"),
            ]
            for forgery in forgeries:
                before = await asyncio.to_thread(fleet.refused, forgery.channel, "authorship")
                await attacker.send(forgery)

                def refused_more(channel: str = forgery.channel, seen: int = before) -> bool:
                    return fleet.refused(channel, "authorship") > seen

                await until(
                    refused_more,
                    10,
                    f"{forgery.name} refused for its authorship on {forgery.channel}",
                )
            # A header claiming central's client id on gw-a's own topic: the sender check.
            senders = await asyncio.to_thread(fleet.refused, "node", "sender")
            doc = "node-gw-a"
            for frame in wire.encode(wire.Kind.SYNC, doc, 1, wire.step1_payload(b"\x00")):
                await client.publish(wire.sync_topic(doc, "gw-a"), frame, qos=1)
            await until(lambda: fleet.refused("node", "sender") > senders, 10, "header refused")

            # Status and telemetry nested past json's depth (a RecursionError nobody caught).
            for channel, topic, size in (
                ("status", "edgesched/v1/node/gw-a/status", 1024),
                ("telemetry", "edgesched/v1/node/gw-a/telemetry", 2048),
            ):
                seen = await asyncio.to_thread(fleet.refused, channel, "malformed")
                await client.publish(topic, b"[" * size, qos=1)

                def malformed_counted(c: str = channel, n: int = seen) -> bool:
                    return fleet.refused(c, "malformed") > n

                await until(malformed_counted, 10, f"a deep {channel} message refused")
            # gw-a's own document, moved to the last epoch (two jumps of under half the circle)
            # with a decoy in it: its own to do, but the real gw-a must take it back after.
            for epoch in (2**31 - 1, 2**32 - 1):
                await attacker.send(attacks.epoch_jump("gw-a", epoch))
            await until(
                lambda: "job-a" not in str(fleet.node_view("gw-a")["content"]),
                10,
                "central's copy of gw-a at the attacker's epoch",
            )

        # Nothing changed: central's policy and gw-b's, the assignment, central's view of gw-a.
        status = await asyncio.to_thread(fleet.status)
        assert (await asyncio.to_thread(fleet.central.get, "/v1/policy"))[1]["mode"] == mode
        assert (await asyncio.to_thread(b.get, "/v1/status"))[1]["policy"] == mode
        code, task = await asyncio.to_thread(fleet.central.get, "/v1/tasks/job-a")
        assert code == 200 and task["node"] == "gw-a", task
        code, _ = await asyncio.to_thread(fleet.central.get, "/v1/tasks/evil")
        assert code == 404
        view = await asyncio.to_thread(fleet.node_view, "gw-a")
        assert "evil" not in str(view["content"]), view["content"]
        assert view["document"]["epoch"] == 2**32 - 1, view["document"]
        assert status["rejected"]["rejected_authorship"] >= len(forgeries)
        assert not Path("/tmp/pwned").exists()

        # The real gw-a comes back: every replica equal to its writer, job-a still running.
        await asyncio.to_thread(a.start)
        await until(fleet.converged, 30, "the fleet converged after the attack")
        await until(lambda: running_on(a, "job-a"), 20, "job-a running on gw-a again")
        assert running_on(b, "job-b")
        refused = (await asyncio.to_thread(b.get, "/v1/status"))[1]["refused"]["policy"]
        assert "authorship" in refused and not any(refused.values()), refused  # gw-b: nothing
