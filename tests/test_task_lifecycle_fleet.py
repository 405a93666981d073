"""Central knows every task (issue 14), over real processes and Mosquitto.

Tasks submitted at central and at a node's API, short and long, succeeding and failing,
cancelled at either tier, and decided by a node while it was cut off: every one shows at
central (``GET /v1/tasks`` and ``/v1/tasks/{id}``) with its phase, exit code and origin once
it has ended, and after the heal for the cut node's; a finished task is not relabelled by a
late cancel.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from conftest import Broker, EdgeNode, central_and_nodes, until

from edgesched.fieldtest.faultproxy import FaultProxy


def body(task_id: str, *command: str, **extra: Any) -> dict[str, Any]:
    return {"id": task_id, "command": list(command), "cpu": 0.05, "mem_gib": 0.05,
            "restart": "never", **extra}  # fmt: skip


def post(proc: EdgeNode, payload: dict[str, Any]) -> None:
    code, reply = proc.request("POST", "/v1/tasks", payload)
    assert code == 201, reply


def central_tasks(central: EdgeNode, **query: str) -> dict[str, dict[str, Any]]:
    """Every task central lists, page by page (3 a page: the cursor is exercised)."""
    out: dict[str, dict[str, Any]] = {}
    after = ""
    while True:
        params = "&".join(f"{k}={v}" for k, v in {"limit": "3", **query}.items())
        code, page = central.get(f"/v1/tasks?{params}" + (f"&after={after}" if after else ""))
        assert code == 200, page
        out.update({t["id"]: t for t in page["tasks"]})
        if page["next"] is None:
            return out
        after = page["next"]


EXPECTED = {  # id -> (phase, exit code, origin, node)
    "c-short": ("exited", 0, "central", "gw-a"),
    "c-fail": ("failed", 3, "central", "gw-a"),
    "c-long": ("running", None, "central", "gw-a"),
    "c-cancel": ("cancelled", None, "central", "gw-a"),
    "n-short": ("exited", 0, "node", "gw-a"),
    "n-fail": ("failed", 4, "node", "gw-a"),
    "n-cancel": ("cancelled", None, "node", "gw-a"),
    "cut-short": ("exited", 0, "node", "gw-b"),
    "cut-fail": ("failed", 5, "node", "gw-b"),
    "cut-long": ("running", None, "node", "gw-b"),
}


def seen(central: EdgeNode, ids: list[str]) -> dict[str, tuple[Any, ...]] | None:
    tasks = central_tasks(central)
    got = {
        t: (tasks[t]["phase"], tasks[t]["exit_code"], tasks[t]["origin"], tasks[t]["node"])
        for t in ids
        if t in tasks
    }
    return got if got == {t: EXPECTED[t] for t in ids} else None


async def test_every_task_shows_at_central_with_its_end(broker: Broker, tmp_path: Path) -> None:
    async with FaultProxy("127.0.0.1", 0, "127.0.0.1", broker.port) as proxy:
        ports = {"gw-a": broker.port, "gw-b": proxy.port}
        async with central_and_nodes(
            tmp_path, broker.port, ports, edge=lambda _n, _d: {"centrals": ["central"]}
        ) as (central, nodes):
            a, b = nodes["gw-a"], nodes["gw-b"]

            def connected() -> bool:
                nodes = central.get("/v1/nodes")[1]["nodes"]
                # (and each node heard central: a node starts autonomous until it does)
                heard = all(n.get("/v1/status")[1]["mode"] == "connected" for n in (a, b))
                return heard and len(nodes) == 2 and all(n["state"] == "connected" for n in nodes)

            await until(connected, 30, "both nodes connected, and hearing central")
            # At central, pinned to gw-a; at gw-a's own API.
            for payload in (
                body("c-short", "true", node="gw-a"),
                body("c-fail", "sh", "-c", "exit 3", node="gw-a"),
                body("c-long", "sleep", "300", node="gw-a"),
                body("c-cancel", "sleep", "300", node="gw-a"),
            ):
                await asyncio.to_thread(post, central, payload)
            for payload in (
                body("n-short", "true"),
                body("n-fail", "sh", "-c", "exit 4"),
                body("n-cancel", "sleep", "300"),
            ):
                await asyncio.to_thread(post, a, payload)
            await until(lambda: a.tasks().get("c-cancel", {}).get("state") == "running"
                        and a.tasks().get("n-cancel", {}).get("state") == "running",
                        30, "the long ones running")  # fmt: skip
            code, _ = await asyncio.to_thread(central.request, "DELETE", "/v1/tasks/c-cancel")
            assert code == 200
            code, _ = await asyncio.to_thread(a.request, "DELETE", "/v1/tasks/n-cancel")
            assert code in (200, 202)

            # gw-b cut off decides on its own.
            proxy.blackhole()
            await until(lambda: b.get("/v1/status")[1]["mode"] == "autonomous", 20,
                        "gw-b autonomous")  # fmt: skip
            for payload in (
                body("cut-short", "true"),
                body("cut-fail", "sh", "-c", "exit 5"),
                body("cut-long", "sleep", "300"),
            ):
                await asyncio.to_thread(post, b, payload)
            ours = [t for t in EXPECTED if not t.startswith("cut-")]
            await until(lambda: seen(central, ours), 30, "central holding gw-a's ends")
            # while cut off, central knows nothing of gw-b's new tasks
            assert not [t for t in central_tasks(central) if t.startswith("cut-")]
            proxy.heal()
            await until(lambda: seen(central, list(EXPECTED)), 30, "central holding all ends")

            tasks = await asyncio.to_thread(central_tasks, central)
            at_b = await asyncio.to_thread(b.tasks)
            for task_id in ("cut-short", "cut-fail", "cut-long"):  # as the node has it
                assert tasks[task_id]["decided_by"] == at_b[task_id]["decided_by"]
                assert tasks[task_id]["decided_by"] == "edge-autonomous"  # past the lease
            assert tasks["c-short"]["finished_at"] is not None
            running = await asyncio.to_thread(central_tasks, central, phase="running")
            assert set(running) == {"c-long", "cut-long"}
            on_b = await asyncio.to_thread(central_tasks, central, node="gw-b")
            assert set(on_b) == {"cut-short", "cut-fail", "cut-long"}
            code, one = await asyncio.to_thread(central.get, "/v1/tasks/cut-fail")
            assert code == 200 and one["phase"] == "failed" and one["exit_code"] == 5
            # A late cancel changes nothing: finished stays finished, a node's own stays its.
            code, reply = await asyncio.to_thread(central.request, "DELETE", "/v1/tasks/c-short")
            assert code == 409 and "already finished" in reply["detail"], reply
            code, reply = await asyncio.to_thread(central.request, "DELETE", "/v1/tasks/n-fail")
            assert code == 409 and "gw-a" in reply["detail"], reply
            assert (await asyncio.to_thread(central.get, "/v1/tasks/c-short"))[1]["phase"] == (
                "exited"
            )
            code, bad = await asyncio.to_thread(central.get, "/v1/tasks?phase=done")
            assert code == 400 and bad["field"] == "phase"

            # Central's history (SQLite): every finished task, newest first, page by page.
            finished = {t for t, (phase, *_rest) in EXPECTED.items() if phase != "running"}
            pages: list[dict[str, Any]] = []
            query = "/v1/history?limit=3"
            while True:
                code, page = await asyncio.to_thread(central.get, query)
                assert code == 200, page
                pages += page["tasks"]
                if page["next"] is None:
                    break
                nxt = page["next"]
                query = (
                    f"/v1/history?limit=3&before_at={nxt['before_at']}&before_id={nxt['before_id']}"
                )
            assert sorted(r["id"] for r in pages) == sorted(finished)  # each once
            assert [r["finished_at"] for r in pages] == sorted(
                (r["finished_at"] for r in pages), reverse=True
            )
            by_id = {r["id"]: r for r in pages}
            assert all(by_id[t]["phase"] == EXPECTED[t][0] for t in finished)
            assert by_id["cut-fail"]["exit_code"] == 5 and by_id["c-fail"]["workload"] == "default"
            code, failed = await asyncio.to_thread(central.get, "/v1/history?phase=failed")
            assert {r["id"] for r in failed["tasks"]} == {"c-fail", "n-fail", "cut-fail"}
            code, ran_on_b = await asyncio.to_thread(
                central.get, "/v1/history?node=gw-b&origin=node"
            )
            assert {r["id"] for r in ran_on_b["tasks"]} == {"cut-short", "cut-fail"}


async def test_an_assignment_a_node_does_not_take_up_is_placed_again(
    broker: Broker, tmp_path: Path
) -> None:
    """gw-a holds a task of its own named ``clash`` and so ignores central's assignment of
    that id: central notices within ``take_up_s`` (the node connected and fresh, no copy of
    the epoch there) and places it again, at the next epoch, saying why (issue 14)."""
    async with central_and_nodes(
        tmp_path,
        broker.port,
        {"gw-a": broker.port},
        central={"take_up_s": 1.5},
        edge=lambda _n, _d: {"centrals": ["central"]},
    ) as (central, nodes):
        a = nodes["gw-a"]
        await until(
            lambda: [n["state"] for n in central.get("/v1/nodes")[1]["nodes"]] == ["connected"],
            30,
            "gw-a connected",
        )
        await asyncio.to_thread(post, a, body("clash", "sleep", "300"))
        await asyncio.to_thread(post, central, body("clash", "sleep", "300", node="gw-a"))

        def noticed() -> list[str]:
            events = central.get("/v1/events")[1]["events"]
            return [e["detail"] for e in events if e["kind"] == "not-taken-up"]

        details = await until(noticed, 30, "central noticing gw-a did not take it up")
        assert "gw-a did not take it up within 1.5 s (epoch 1)" in details[0], details
        await until(lambda: central.get("/v1/tasks/clash")[1]["epoch"] >= 2, 10, "placed again")
