"""Central replicas sharing the fleet by shard leases from a real etcd cluster.

Three etcd members, two central replicas (processes, as a user runs them), three edge nodes
and Mosquitto. Each replica places only the tasks of the shards etcd leased to it, whichever
replica the task was submitted at; every task is placed once, by its shard's owner, and
runs. When one replica is killed (its lease must expire: no clean revoke), the survivor
takes its shards over and places the work that was waiting in them.
"""

from __future__ import annotations

import asyncio
import signal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from conftest import Broker, EdgeNode, until, write_central_config, write_edge_config
from etcdcluster import EtcdCluster, etcd_missing

from edgesched.central.leases import shard_of

pytestmark = pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))

SHARDS = 8
CENTRALS = ("central-a", "central-b")
NODES = ("gw-a", "gw-b", "gw-c")


def status(c: EdgeNode) -> dict[str, Any]:
    return dict(c.get("/v1/status")[1])


async def test_two_central_replicas_split_the_shards_and_one_takes_over(
    broker: Broker, tmp_path: Path
) -> None:
    with EtcdCluster(tmp_path / "etcd", 3) as etcd:
        centrals: dict[str, EdgeNode] = {}
        nodes: dict[str, EdgeNode] = {}
        try:
            for cid in CENTRALS:
                d = tmp_path / cid
                d.mkdir()
                config, state = write_central_config(
                    d, broker.port, central_id=cid,
                    peers=[c for c in CENTRALS if c != cid],
                    etcd_endpoints=etcd.endpoints, shards=SHARDS, lease_ttl_s=2.0,
                    failover_after_s=60.0,
                )  # fmt: skip
                centrals[cid] = EdgeNode(config, state, d / "central.log", tier="central")
                await asyncio.to_thread(centrals[cid].start)
            for node_id in NODES:
                d = tmp_path / node_id
                d.mkdir()
                cfg, st = write_edge_config(
                    d, broker.port, node_id=node_id, centrals=list(CENTRALS),
                    mqtt={"reconnect_max_s": 1.0},
                )  # fmt: skip
                nodes[node_id] = EdgeNode(cfg, st, d / "edge.log")
                await asyncio.to_thread(nodes[node_id].start)

            def split() -> dict[str, list[int]] | None:
                owned = {c: status(n)["shards"]["owned"] for c, n in centrals.items()}
                held = sorted(s for shards in owned.values() for s in shards)
                return owned if held == list(range(SHARDS)) and all(owned.values()) else None

            owned = await until(split, 30, "every shard leased to exactly one replica")
            owner = {s: c for c, shards in owned.items() for s in shards}
            token = {
                int(s): t
                for c in centrals.values()
                for s, t in status(c)["shards"]["tokens"].items()
            }
            assert sorted(token) == list(range(SHARDS))

            def known(c: EdgeNode) -> bool:
                return len(c.get("/v1/nodes")[1]["nodes"]) == len(NODES)

            for c in centrals.values():
                await until(partial(known, c), 30, "every node known to every central")

            # Twelve tasks, submitted alternately at either replica.
            ids = [f"job-{i:02d}" for i in range(12)]
            for i, task_id in enumerate(ids):
                at = centrals[CENTRALS[i % 2]]
                body = {"id": task_id, "command": ["sleep", "300"], "cpu": 0.05, "mem_gib": 0.05}
                code, reply = await asyncio.to_thread(at.request, "POST", "/v1/tasks", body)
                assert code == 201, reply

            def placed() -> dict[str, dict[str, Any]] | None:
                views = {t: centrals["central-a"].get(f"/v1/tasks/{t}")[1] for t in ids}
                done = all(
                    v.get("state") == "active" and v.get("running_on") for v in views.values()
                )
                return views if done else None

            views = await until(placed, 40, "every task placed and running")
            for task_id, view in views.items():
                # placed once (epoch 1, one copy), by the owner of its shard
                assert view["epoch"] == 1 and len(view["running_on"]) == 1, view
                assert {c["epoch"] for c in view["copies"].values()} == {1}, view
                # ...under the lease it held: the decision carries the shard's fencing token
                assert view["decided_by"] == owner[shard_of(task_id, SHARDS)], view
                assert view["lease"] == token[shard_of(task_id, SHARDS)], view
            for task_id in ids:
                running = [n for n, node in nodes.items() if task_id in node.tasks()]
                assert len(running) == 1, (task_id, running)
            assert {v["decided_by"] for v in views.values()} == set(CENTRALS)  # both acted

            # Kill central-b without a word to etcd; at once, submit work of its shards to
            # central-a, which must leave it waiting until b's lease expires and it takes
            # the shards over, then place it.
            await asyncio.to_thread(centrals["central-b"].kill, signal.SIGKILL)
            survivor = centrals["central-a"]
            candidates = (f"late-{i}" for i in range(1000))
            late = [t for t in candidates if owner[shard_of(t, SHARDS)] == "central-b"][:4]
            replies = []
            for task_id in late:
                body = {"id": task_id, "command": ["sleep", "300"], "cpu": 0.05, "mem_gib": 0.05}
                code, reply = await asyncio.to_thread(survivor.request, "POST", "/v1/tasks", body)
                assert code == 201, reply
                replies.append(reply["state"])
            assert "pending" in replies, replies  # not a's to place while b's lease holds
            await until(
                lambda: len(status(survivor)["shards"]["owned"]) == SHARDS,
                15,
                "central-a holding every shard",
            )

            def runs(task_id: str) -> bool:
                return any(
                    n.tasks().get(task_id, {}).get("state") == "running" for n in nodes.values()
                )

            for task_id in late:
                await until(partial(runs, task_id), 20, f"{task_id} running")
                view = survivor.get(f"/v1/tasks/{task_id}")[1]
                assert view["decided_by"] == "central-a" and view["epoch"] == 1, view
                # a new lease on b's old shard: a newer token than b decided under
                new_token = int(
                    status(survivor)["shards"]["tokens"][str(shard_of(task_id, SHARDS))]
                )
                assert view["lease"] == new_token > token[shard_of(task_id, SHARDS)], view
        finally:
            for proc in [*nodes.values(), *centrals.values()]:
                if proc.proc is not None and proc.proc.poll() is None:
                    await asyncio.to_thread(proc.kill, signal.SIGTERM)
