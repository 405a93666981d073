"""Site autonomy over real processes (issue 16): a site's nodes keep scheduling as one.

Central on its Mosquitto; a site broker (a second Mosquitto) bridged to it through a TCP fault
proxy, the site's WAN link; three edge nodes on the site broker, each listing the other two as
``site_peers``. A service of three replicas, one a node. The WAN is cut: the members elect a
coordinator (the smallest id); a member loses power (engine and tasks killed) and its replica
comes back on a peer within the site's failover time, while still cut; a burst submitted to one
node beyond its room is placed on its peers. After the heal central adopts the site's failover
(no second failover, no duplicate) and every node's document reaches central as it is.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

from conftest import (
    Broker,
    EdgeNode,
    central_and_nodes,
    central_cli,
    kill_task_processes,
    until,
)

from edgesched.core.service import parse_replica_id
from edgesched.fieldtest.brokers import broker_config
from edgesched.fieldtest.faultproxy import FaultProxy
from edgesched.ports import free_port

NODES = ("gw-a", "gw-b", "gw-c")
SITE_FAILOVER_S = 2.0


def running_replicas(nodes: dict[str, EdgeNode], alive: set[str]) -> dict[int, list[str]]:
    """slot -> the nodes whose own API says a replica of ``web`` in that slot runs there."""
    out: dict[int, list[str]] = {}
    for node_id in sorted(alive):
        status, rows = nodes[node_id].get("/v1/tasks")
        assert status == 200, rows
        for row in rows:
            ref = parse_replica_id(row["id"])
            if ref is not None and ref.service == "web" and row["state"] == "running":
                out.setdefault(ref.slot, []).append(node_id)
    return out


def site_of(node: EdgeNode) -> dict[str, Any]:
    status, body = node.get("/v1/status")
    assert status == 200, body
    site: dict[str, Any] = body["site_autonomy"]
    return site


async def test_a_cut_off_site_restarts_a_dead_members_replica_and_shares_a_burst(
    broker: Broker, tmp_path: Path
) -> None:
    site_port = free_port()
    async with FaultProxy("127.0.0.1", 0, "127.0.0.1", broker.port) as wan:
        conf = tmp_path / "site.conf"
        conf.write_text(
            broker_config([("127.0.0.1", site_port)], bridge=("site-1", "127.0.0.1", wan.port))
        )
        site_broker = Broker(site_port, None, conf, tmp_path / "site-broker.log")  # type: ignore[arg-type]
        site_broker.start()
        try:
            async with central_and_nodes(
                tmp_path,
                broker.port,
                dict.fromkeys(NODES, site_port),
                # central fails nothing over itself here: what moves is the site's doing
                central={"failover_after_s": 600.0, "cycle_s": 0.3},
                edge=lambda n, _d: {
                    "site": "site-1",
                    "site_peers": [p for p in NODES if p != n],
                    "site_failover_s": SITE_FAILOVER_S,
                    "site_offer_after_s": 0.5,
                },
            ) as (central, nodes):
                await _run(central, nodes, wan, tmp_path)
        finally:
            site_broker.stop()


async def _run(
    central: EdgeNode, nodes: dict[str, EdgeNode], wan: FaultProxy, tmp_path: Path
) -> None:
    def all_connected() -> bool:
        done = central_cli(central, "nodes", "--json")
        states = [n["state"] for n in json.loads(done.stdout)] if done.stdout else []
        return done.returncode == 0 and states == ["connected"] * 3

    await until(all_connected, 40, "three nodes connected through the site broker")
    job = tmp_path / "web.toml"
    job.write_text(
        'name = "web"\nreplicas = 3\n'
        "[template]\n"
        'command = ["sleep", "600"]\ncpu = 0.05\nmem_gib = 0.05\n'
        '[spread]\nmax_per_node = 1\nacross = ["node"]\n'
    )
    done = await asyncio.to_thread(central_cli, central, "service", "apply", str(job))
    assert done.returncode == 0, done.stderr
    alive = set(NODES)

    def one_each() -> dict[int, list[str]] | None:
        held = running_replicas(nodes, alive)
        ok = sorted(held) == [0, 1, 2] and all(len(v) == 1 for v in held.values())
        return held if ok else None

    held = await until(one_each, 40, "a replica on each node")
    # connected: nobody coordinates, every member sees the other two
    for node in nodes.values():
        site = await asyncio.to_thread(site_of, node)
        assert site["coordinating"] is None and site["following"] is None, site
    await until(lambda: all(len(site_of(n)["live"]) == 2 for n in nodes.values()), 20, "peers live")

    # --- the site's WAN link is cut: the members elect gw-a, the smallest id
    wan.cut()

    def elected() -> bool:
        sites = {n: site_of(node) for n, node in nodes.items()}
        return sites["gw-a"]["coordinating"] is not None and all(
            s["following"] is not None and s["following"]["holder"] == "gw-a"
            for s in sites.values()
        )

    await until(elected, 30, "gw-a coordinating the cut-off site")
    term = (await asyncio.to_thread(site_of, nodes["gw-a"]))["coordinating"]["epoch"]

    # --- gw-c loses power while cut: its replica comes back on gw-a or gw-b, still cut
    victim = "gw-c"
    (lost_slot,) = [slot for slot, on in held.items() if on == [victim]]
    nodes[victim].kill(signal.SIGKILL)
    kill_task_processes(nodes[victim].state)
    alive.discard(victim)

    def restored() -> dict[int, list[str]] | None:
        now = running_replicas(nodes, alive)
        ok = sorted(now) == [0, 1, 2] and all(len(v) == 1 for v in now.values())
        return now if ok else None

    # the will fires at once (the socket closes), then the site's failover time
    after = await until(restored, SITE_FAILOVER_S + 20, f"slot {lost_slot} back in the site")
    (moved_to,) = after[lost_slot]
    tasks = await asyncio.to_thread(nodes[moved_to].tasks)
    (moved,) = [
        t
        for t, row in tasks.items()
        if (ref := parse_replica_id(t)) is not None and ref.slot == lost_slot
        and row["state"] == "running"
    ]  # fmt: skip
    assert tasks[moved]["decided_by"] == "site:gw-a", tasks[moved]
    # the site is still cut off from central
    status = (await asyncio.to_thread(nodes["gw-a"].get, "/v1/status"))[1]
    assert status["mode"] == "autonomous", status

    # --- a burst to gw-b beyond its room goes to its peer
    body = (await asyncio.to_thread(nodes["gw-b"].get, "/v1/status"))[1]
    cores = body["hardware"]["cores"]
    burst = [f"burst-{i}" for i in range(2 * cores)]
    for task_id in burst:
        code, reply = await asyncio.to_thread(
            nodes["gw-b"].request, "POST", "/v1/tasks",
            {"id": task_id, "command": ["sleep", "600"], "cpu": 0.9, "mem_gib": 0.05},
        )  # fmt: skip
        assert code == 201, reply

    def spread_over_site() -> dict[str, str] | None:
        where: dict[str, str] = {}
        for node_id in sorted(alive):
            for task_id, row in nodes[node_id].tasks().items():
                if task_id in burst and row["state"] == "running":
                    where[task_id] = node_id
        done = len(where) == len(burst)
        return where if done else None

    where = await until(spread_over_site, 40, "the burst running across the site")
    assert set(where.values()) == {"gw-a", "gw-b"}, where
    handed = [t for t, n in where.items() if n == "gw-a"]
    rows_b = await asyncio.to_thread(nodes["gw-b"].tasks)
    for task_id in handed:
        assert rows_b[task_id]["state"] == "cancelled", rows_b[task_id]
        assert "moved to site peer gw-a" in rows_b[task_id]["reason"], rows_b[task_id]
    # one coordinator for the whole cut, at one epoch
    site_a = await asyncio.to_thread(site_of, nodes["gw-a"])
    assert site_a["coordinating"]["epoch"] == term, site_a

    # --- heal: central adopts the site's failover; nothing runs twice
    wan.heal()

    def adopted() -> bool:
        code, view = central.get(f"/v1/tasks/{moved}")
        return code == 200 and view.get("node") == moved_to

    await until(adopted, 40, f"central's assignment of {moved} following it to {moved_to}")
    await until(lambda: all_connected_but(central, victim), 40, "the site back at central")
    await asyncio.sleep(2.0)
    final = await asyncio.to_thread(running_replicas, nodes, alive)
    assert sorted(final) == [0, 1, 2] and all(len(v) == 1 for v in final.values()), final
    code, events = await asyncio.to_thread(central.get, "/v1/events?kind=reconciled&limit=50")
    assert any("placed there by site:gw-a" in e["detail"] for e in events["events"]), events
    # every surviving node's document at central is the node's own, byte for byte
    for node_id in sorted(alive):
        node = nodes[node_id]

        def same(node: EdgeNode = node, node_id: str = node_id) -> bool:
            return same_document(central, node, node_id)

        await until(same, 30, f"{node_id}'s document at central")


def all_connected_but(central: EdgeNode, dead: str) -> bool:
    code, rows = central.get("/v1/nodes")
    if code != 200:
        return False
    states = {r["id"]: r["state"] for r in rows["nodes"]}
    return all(s == "connected" for n, s in states.items() if n != dead)


def same_document(central: EdgeNode, node: EdgeNode, node_id: str) -> bool:
    code, body = node.get("/v1/status")
    mine = body["document"]["content_hash"] if code == 200 else None
    code, view = central.get(f"/v1/nodes/{node_id}")
    theirs = view.get("document", {}).get("content_hash") if code == 200 else None
    return mine is not None and mine == theirs
