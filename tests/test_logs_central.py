"""A task's output read through central (issue 14): ``GET /v1/tasks/{id}/logs`` at central,
proxied to the node over MQTT (``edgesched.sync.logstream``), and ``edgesched logs``, against
central and two nodes as processes over a real Mosquitto."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiomqtt
from conftest import Broker, EdgeNode, central_and_nodes, central_cli, until
from test_attacks import secured_fleet
from test_signed_frames import keyed_fleet

from edgesched.sync import logstream as ls


def cli(central: EdgeNode, *args: str) -> subprocess.CompletedProcess[str]:
    return central_cli(central, "logs", *args)


def submit(central: EdgeNode, task_id: str, node: str, script: str) -> None:
    body = {"id": task_id, "command": ["sh", "-c", script], "cpu": 0.05, "mem_gib": 0.05,
            "restart": "never", "node": node}  # fmt: skip
    code, view = central.request("POST", "/v1/tasks", body)
    assert code == 201, view


def phase(central: EdgeNode, task_id: str) -> str:
    code, view = central.get(f"/v1/tasks/{task_id}")
    return str(view["phase"]) if code == 200 else ""


def raw_get(node: EdgeNode, path: str) -> tuple[int, bytes, dict[str, str]]:
    """Status, body bytes and headers of a GET (an error's too)."""
    token = (node.state / "api-token").read_text().strip()
    request = urllib.request.Request(node.url(path), headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def connected(central: EdgeNode, *nodes: str) -> bool:
    code, body = central.get("/v1/nodes")
    states = {n["id"]: n["state"] for n in body["nodes"]} if code == 200 else {}
    return all(states.get(n) == "connected" for n in nodes)


async def probe(
    port: int, node: str, messages: list[bytes], as_central: str = "probe"
) -> list[ls.Reply]:
    """Publish ``messages`` on ``node``'s request topic as a central named ``as_central``
    (the broker here has no ACL), and the replies it gets within 3 s."""
    replies: list[ls.Reply] = []
    async with aiomqtt.Client("127.0.0.1", port, identifier="probe") as client:
        await client.subscribe(ls.reply_topic(node, as_central), qos=1)
        for message in messages:
            await client.publish(ls.request_topic(node, as_central), message, qos=1)

        async def read() -> None:
            async for message in client.messages:
                payload = bytes(message.payload)
                replies.append(ls.parse_reply(ls.unseal(None, "", node, payload)))

        try:
            async with asyncio.timeout(3.0):
                await read()
        except TimeoutError:
            pass
    return replies


def request(task: str, tail: int = 100, **fields: Any) -> tuple[str, bytes]:
    request_id = os.urandom(16).hex()
    body = {"v": 1, "op": "request", "id": request_id, "task": task, "tail": tail, **fields}
    return request_id, b"U" + json.dumps(body).encode()


async def test_logs_through_central(broker: Broker, tmp_path: Path) -> None:
    nodes = {"gw-a": broker.port, "gw-b": broker.port}
    async with central_and_nodes(
        tmp_path, broker.port, nodes, edge=lambda _n, _d: {"centrals": ["central"]}
    ) as (central, edge):
        await until(lambda: connected(central, "gw-a", "gw-b"), 30, "both nodes connected")
        submit(central, "talk", "gw-a", "for i in 1 2 3 4 5; do echo out$i; done; echo err >&2")
        # 900 lines of 1,000 bytes (under the node's 1 MiB log rotation): 28 replies, past
        # the window of 8 three times
        submit(central, "big", "gw-a", "yes $(printf '%0999d' 7) | head -n 900")
        submit(central, "slow", "gw-b", "echo start; sleep 1; echo middle; sleep 1; echo end")
        submit(central, "long", "gw-b", "echo begin; sleep 300")
        await until(lambda: phase(central, "talk") == "exited", 30, "talk exited")
        await until(lambda: phase(central, "slow") == "running", 30, "slow running")

        # the last lines, read through central from gw-a; the node is named in a header
        code, body, headers = await asyncio.to_thread(
            raw_get, central, "/v1/tasks/talk/logs?tail=2"
        )
        assert code == 200 and body == b"out5\nerr\n", body
        assert headers["X-Edgesched-Node"] == "gw-a"
        done = await asyncio.to_thread(cli, central, "talk", "--tail", "3")
        assert done.returncode == 0 and done.stdout == "out4\nout5\nerr\n", done
        done = await asyncio.to_thread(cli, central, "talk", "--tail", "1", "--json")
        assert json.loads(done.stdout) == {"id": "talk", "node": "gw-a", "text": "err\n"}

        # follow through central until the task on gw-b exits
        start = time.monotonic()
        done = await asyncio.to_thread(cli, central, "slow", "-f")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["start", "middle", "end"], done.stdout
        assert 0.5 < time.monotonic() - start < 30

        # 900 kB through central byte for byte as the node's own API has it
        await until(lambda: phase(central, "big") == "exited", 30, "big exited")
        code, through, _ = await asyncio.to_thread(raw_get, central, "/v1/tasks/big/logs?tail=900")
        code_a, direct, _ = await asyncio.to_thread(
            raw_get, edge["gw-a"], "/v1/tasks/big/logs?tail=900"
        )
        assert code == code_a == 200 and len(direct) == 900_000, (len(through), len(direct))
        assert through == direct
        code, through, _ = await asyncio.to_thread(
            raw_get, central, "/v1/tasks/big/logs?tail=900&follow=1"
        )
        assert code == 200 and through == direct

        # refusals: no such task at central; a bad tail
        missing = await asyncio.to_thread(cli, central, "nope")
        assert missing.returncode == 2 and "no task 'nope'" in missing.stderr
        code, problem = central.get("/v1/tasks/talk/logs?tail=-1")
        assert code == 400 and problem["field"] == "tail"

        # malformed requests straight to gw-a over MQTT are refused with a clear error (or
        # dropped when they name no request), and gw-a keeps answering
        bad_tail, bad_tail_msg = request("talk", tail=-1)
        escape, escape_msg = request("../../../etc/passwd")
        not_held, not_held_msg = request("slow")  # gw-b's, not gw-a's
        good, good_msg = request("talk", tail=1)
        replies = await probe(
            broker.port,
            "gw-a",
            [b"garbage", b"U{not json", b"U" + b"[" * 5000, b"U" + b" " * 200_000,
             bad_tail_msg, escape_msg, not_held_msg, good_msg],
        )  # fmt: skip
        by_id = {r.id: r for r in replies if r.kind == "error"}
        assert by_id[bad_tail].code == "malformed" and "tail" in by_id[bad_tail].reason
        assert by_id[escape].code == "malformed" and "task" in by_id[escape].reason
        assert by_id[not_held].code == "no_task" and "gw-a holds no task slow" in (
            by_id[not_held].reason
        )
        assert [(r.kind, r.body) for r in replies if r.id == good] == [("data", b"err\n"),
                                                                        ("end", b"")]  # fmt: skip
        assert len(replies) == 5, replies
        assert edge["gw-a"].proc is not None and edge["gw-a"].proc.poll() is None

        # gw-b lost while its output is followed: the stream breaks off, and says so
        await until(lambda: phase(central, "long") == "running", 30, "long running")
        following = asyncio.create_task(asyncio.to_thread(cli, central, "long", "-f"))
        await until(lambda: "task long on node gw-b" in central.log.read_text(), 10, "asked")
        await asyncio.sleep(0.5)
        await asyncio.to_thread(edge["gw-b"].kill, signal.SIGKILL)
        done = await following
        assert done.returncode == 2 and "broke off" in done.stderr, done
        assert done.stdout == "begin\n", done.stdout

        # gw-b gone: central names it, and why, at once
        await until(lambda: not connected(central, "gw-b"), 20, "gw-b not connected")
        code, problem = central.get("/v1/tasks/slow/logs")
        assert code == 503 and problem["node"] == "gw-b", problem
        assert "node gw-b unreachable: not connected" in problem["detail"], problem
        done = await asyncio.to_thread(cli, central, "slow")
        assert done.returncode == 2 and "node gw-b unreachable" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


async def test_another_gateways_credentials_neither_read_nor_inject(tmp_path: Path) -> None:
    """Mosquitto with the generated ACL; the attacker holds gw-b's credentials and even knows
    the id of central's request to gw-a (here from central's debug log): its replies on its
    own topic are dropped (``foreign``), on gw-a's the broker drops them, and it reads nothing
    of gw-a's stream nor of central's requests."""
    async with secured_fleet(tmp_path) as fleet:
        central = fleet.central
        await until(lambda: connected(central, "gw-a", "gw-b"), 30, "both nodes connected")
        script = "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.4; done"
        submit(central, "chatty", "gw-a", script)
        await until(lambda: phase(central, "chatty") == "running", 30, "chatty running")
        await asyncio.to_thread(fleet.nodes["gw-b"].kill, signal.SIGTERM)  # its keys stolen
        reading = asyncio.create_task(
            asyncio.to_thread(raw_get, central, "/v1/tasks/chatty/logs?follow=1")
        )

        def request_id() -> str | None:
            found = re.search(r"logs request ([0-9a-f]{32}): task chatty", central.log.read_text())
            return found.group(1) if found else None

        rid = await until(request_id, 10, "central's request in its log")
        seen: list[str] = []
        async with aiomqtt.Client(
            "127.0.0.1", fleet.broker.port, username="gw-b", password=fleet.passwords["gw-b"]
        ) as thief:
            await thief.subscribe(f"{ls.LOGS_ROOT}/#", qos=1)  # granted; nothing delivered
            for seq in range(3):
                forged = ls.seal(None, "", ls.Reply(rid, seq, "data", b"FORGED\n").encode())
                await thief.publish(ls.reply_topic("gw-b", "central"), forged, qos=1)
                await thief.publish(ls.reply_topic("gw-a", "central"), forged, qos=1)
            ask = ls.Request("ab" * 16, "chatty", tail=100).encode()
            await thief.publish(ls.request_topic("gw-a", "central"), b"U" + ask, qos=1)

            async def listen() -> None:
                async for message in thief.messages:
                    seen.append(str(message.topic))

            listening = asyncio.create_task(listen())
            code, body, _ = await reading
            listening.cancel()
        assert code == 200 and body.decode().splitlines() == [f"line{i}" for i in range(1, 7)]
        assert seen == [], seen
        assert f"dropped a logs reply from gw-b for request {rid}" in central.log.read_text()


async def test_signed_requests_and_replies(broker: Broker, tmp_path: Path) -> None:
    """With signing configured (test_signed_frames' keyed fleet, over a broker that lets
    anyone publish anywhere) a read through central works, signed both ways, and neither an
    unsigned request to a node nor an unsigned reply to central, with the right id, is
    taken."""
    async with keyed_fleet(broker, tmp_path) as fleet:
        central = fleet.central
        await until(lambda: connected(central, "gw-a", "gw-b"), 30, "both nodes connected")
        submit(central, "chatty", "gw-a", "for i in 1 2 3 4; do echo line$i; sleep 0.4; done")
        await until(lambda: phase(central, "chatty") == "running", 30, "chatty running")
        reading = asyncio.create_task(
            asyncio.to_thread(raw_get, central, "/v1/tasks/chatty/logs?follow=1")
        )

        def request_id() -> str | None:
            found = re.search(r"logs request ([0-9a-f]{32}): task chatty", central.log.read_text())
            return found.group(1) if found else None

        rid = await until(request_id, 10, "central's request in its log")
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="forger") as forger:
            forged = ls.seal(None, "", ls.Reply(rid, 1, "data", b"FORGED\n").encode())
            await forger.publish(ls.reply_topic("gw-a", "central"), forged, qos=1)
        code, body, _ = await reading
        assert code == 200 and body.decode().splitlines() == [f"line{i}" for i in range(1, 5)]
        # an unsigned request as central: gw-a answers nothing
        _, unsigned = request("chatty", tail=1)
        assert await probe(broker.port, "gw-a", [unsigned], as_central="central") == []
        assert "logs request from central refused: unsigned" in (
            fleet.nodes["gw-a"].log.read_text()
        )
        assert "a logs reply from gw-a refused: unsigned" in central.log.read_text()
