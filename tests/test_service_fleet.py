"""Services over real processes and Mosquitto, driven by the CLI (issue 15).

Central and three edge nodes as processes; gw-c talks to the broker through a TCP fault proxy
(a real partition). The operator applies a job file of six replicas spread across nodes (at
most four a node), scales the service while gw-c is cut off, heals it, scales to ten and back
to three, then kills a node: what runs on the nodes (their own APIs) is checked each time,
not only central's view.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from conftest import Broker, EdgeNode, central_and_nodes, until
from conftest import central_cli as cli

from edgesched.core.service import parse_replica_id
from edgesched.fieldtest.faultproxy import FaultProxy

NODES = ("gw-a", "gw-b", "gw-c")
FAILOVER_S = 2.0


def running_on_nodes(nodes: dict[str, EdgeNode], alive: set[str]) -> dict[str, list[int]]:
    """node -> the slots of the replicas its own API says run there."""
    out: dict[str, list[int]] = {}
    for node_id in sorted(alive):
        status, rows = nodes[node_id].get("/v1/tasks")
        assert status == 200, rows
        slots = []
        for row in rows:
            ref = parse_replica_id(row["id"])
            if ref is not None and ref.service == "web" and row["state"] == "running":
                slots.append(ref.slot)
        out[node_id] = sorted(slots)
    return out


def exactly(nodes: dict[str, EdgeNode], alive: set[str], count: int) -> dict[str, list[int]] | None:
    """What runs, if it is slots 0..count-1 once each."""
    held = running_on_nodes(nodes, alive)
    slots = sorted(s for on in held.values() for s in on)
    return held if slots == list(range(count)) else None


async def test_a_service_over_real_nodes_spreads_scales_through_a_cut_and_fails_over(
    broker: Broker, tmp_path: Path
) -> None:
    async with FaultProxy("127.0.0.1", 0, "127.0.0.1", broker.port) as proxy:
        ports = {"gw-a": broker.port, "gw-b": broker.port, "gw-c": proxy.port}
        async with central_and_nodes(
            tmp_path,
            broker.port,
            ports,
            central={"failover_after_s": FAILOVER_S, "cycle_s": 0.3},
            edge=lambda _n, _d: {"centrals": ["central"]},
        ) as (central, nodes):

            def all_online() -> bool:
                done = cli(central, "nodes", "--json")
                states = [n["state"] for n in json.loads(done.stdout)] if done.stdout else []
                return done.returncode == 0 and states == ["connected"] * 3

            await until(all_online, 30, "three nodes connected")
            job = tmp_path / "web.toml"
            job.write_text(
                'name = "web"\nreplicas = 6\nmax = 12\n'
                "[template]\n"
                'command = ["sleep", "600"]\ncpu = 0.05\nmem_gib = 0.05\n'
                '[spread]\nmax_per_node = 4\nacross = ["node"]\n'
            )
            done = await asyncio.to_thread(cli, central, "service", "apply", str(job))
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith("web: "), done.stdout
            alive = set(NODES)
            held = await until(lambda: exactly(nodes, alive, 6), 40, "six replicas running")
            assert sorted(len(s) for s in held.values()) == [2, 2, 2], held  # spread evenly

            # gw-c is cut off; central scales to 3 while it is; after the heal, exactly 3 run
            proxy.cut()
            done = await asyncio.to_thread(cli, central, "service", "scale", "web", "3")
            assert done.returncode == 0, done.stderr
            cut_c = held["gw-c"]
            await asyncio.sleep(FAILOVER_S + 1.0)
            still = await asyncio.to_thread(running_on_nodes, nodes, {"gw-c"})
            assert still["gw-c"] == cut_c  # cut off: it keeps running what it ran
            proxy.heal()
            held = await until(lambda: exactly(nodes, alive, 3), 40, "three after the heal")
            shown = await asyncio.to_thread(cli, central, "service", "show", "web", "--json")
            view: dict[str, Any] = json.loads(shown.stdout)
            assert view["replicas"] == 3 and view["running"] == 3, view
            events = await asyncio.to_thread(
                central.get, "/v1/events?kind=scaled,replica-stopped&limit=100"
            )
            details = [e["detail"] for e in events[1]["events"]]
            assert any("manual: 6 -> 3 replicas" in d for d in details), details

            # ten, then three again, from the CLI
            done = await asyncio.to_thread(cli, central, "service", "scale", "web", "10")
            assert done.returncode == 0, done.stderr
            held = await until(lambda: exactly(nodes, alive, 10), 40, "ten replicas")
            assert max(len(s) for s in held.values()) <= 4, held  # the spread's bound
            done = await asyncio.to_thread(cli, central, "service", "scale", "web", "3")
            held = await until(lambda: exactly(nodes, alive, 3), 40, "three again")

            # a node is killed: its replicas come back on the others
            victim = next(n for n, slots in sorted(held.items()) if slots)
            await asyncio.to_thread(nodes[victim].kill)
            alive.discard(victim)
            held = await until(lambda: exactly(nodes, alive, 3), 40, f"3 without {victim}")
            listed = await asyncio.to_thread(cli, central, "service", "list")
            row = listed.stdout.splitlines()[1].split()
            assert row[:3] == ["web", "3", "3"], listed.stdout
            assert Counter(s for on in held.values() for s in on) == Counter([0, 1, 2])
