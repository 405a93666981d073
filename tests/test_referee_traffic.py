"""A second implementation as the referee (issue 13): the traffic of a real fleet, decoded by
the reference Yjs, holds what central's REST view shows.

Central and a node as processes over Mosquitto; a raw subscriber records every frame the node
publishes on its document's sender topic from its first connect. After the node has run,
finished and cancelled tasks, the recorded y-sync updates are reassembled with our wire
decoder, then applied by Yjs (npm ``yjs@13`` under node) to an empty document: its content
must be the node document central shows at ``GET /v1/nodes/gw-a`` (same roots, same entries;
a packed entry's fields as central reads them).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiomqtt
from conftest import Broker, central_and_nodes, until
from pycrdt import YSyncMessageType
from yjsref import run_node, yjs_modules

from edgesched.sync import wire

APPLY_SCRIPT = r"""
const Y = require('yjs');
const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const doc = new Y.Doc();
for (const hex of input) Y.applyUpdate(doc, Buffer.from(hex, 'hex'));
const out = {};
for (const name of doc.share.keys()) out[name] = doc.getMap(name).toJSON();
process.stdout.write(JSON.stringify(out));
"""

TOPIC = wire.sync_topic("node-gw-a", "gw-a")


async def record(port: int, frames: list[bytes], ready: asyncio.Event) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier="referee-ear") as client:
        await client.subscribe(TOPIC, qos=1)
        ready.set()
        async for message in client.messages:
            if isinstance(message.payload, bytes):
                frames.append(message.payload)


def updates_of(frames: list[bytes]) -> list[bytes]:
    """The y-sync updates (steps 2 and updates) the frames carry, of the last epoch seen."""
    reassembler = wire.Reassembler()
    by_epoch: dict[int, list[bytes]] = {}
    for frame in frames:
        message = reassembler.feed(frame)
        if message is None:
            continue
        sync = wire.decode_sync(message.kind, message.payload)
        if sync.step != YSyncMessageType.SYNC_STEP1 and sync.data != b"\x00\x00":
            by_epoch.setdefault(message.epoch, []).append(sync.data)
    assert by_epoch, "no update recorded"
    return by_epoch[max(by_epoch)]


def same_entry(theirs: Any, ours: Any) -> bool:
    """Yjs's value of an entry against central's readable one: a packed entry (JSON text)
    holds the fields that differ from their defaults, each equal to central's."""
    if isinstance(theirs, str) and isinstance(ours, dict):
        try:
            theirs = json.loads(theirs)
        except ValueError:
            return False
        return isinstance(theirs, dict) and all(ours.get(k) == v for k, v in theirs.items())
    return bool(theirs == ours)


async def test_the_reference_yjs_reads_the_fleets_traffic_as_central_does(
    broker: Broker, tmp_path: Path
) -> None:
    script = tmp_path / "apply.js"
    script.write_text(APPLY_SCRIPT)
    await asyncio.to_thread(yjs_modules)  # (installs it, or skips the test)
    frames: list[bytes] = []
    ready = asyncio.Event()
    ear = asyncio.create_task(record(broker.port, frames, ready))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        async with central_and_nodes(tmp_path, broker.port, {"gw-a": broker.port}) as (
            central,
            nodes,
        ):
            gw = nodes["gw-a"]
            for i, (command, seconds) in enumerate(
                [("sleep", "120"), ("sleep", "120"), ("true", ""), ("false", "")]
            ):
                body = {"id": f"t{i}", "command": [command, *([seconds] if seconds else [])],
                        "cpu": 0.05, "mem_gib": 0.05, "restart": "never"}  # fmt: skip
                code, reply = await asyncio.to_thread(gw.request, "POST", "/v1/tasks", body)
                assert code == 201, reply
            code, _ = await asyncio.to_thread(gw.request, "DELETE", "/v1/tasks/t1")
            assert code in (200, 202)

            def settled() -> bool:
                tasks = gw.tasks()
                states = {t: tasks.get(t, {}).get("state") for t in ("t0", "t1", "t2", "t3")}
                done = states == {"t0": "running", "t1": "cancelled", "t2": "exited",
                                  "t3": "failed"}  # fmt: skip
                code, view = central.get("/v1/nodes/gw-a")
                mine = gw.get("/v1/status")[1]["document"]["content_hash"]
                return done and code == 200 and view["document"]["content_hash"] == mine

            await until(settled, 30, "gw-a's tasks settled and central holding its document")
            await asyncio.sleep(0.5)  # (the last frames on their way to the ear too)
            code, view = await asyncio.to_thread(central.get, "/v1/nodes/gw-a")
            assert code == 200
    finally:
        ear.cancel()
    theirs: dict[str, dict[str, Any]] = await asyncio.to_thread(
        run_node, script, [u.hex() for u in updates_of(frames)]
    )
    ours: dict[str, Any] = view["content"]
    assert {k for k, v in theirs.items() if v} == {k for k, v in ours.items() if v}
    assert set(theirs["tasks"]) == set(ours["tasks"]) >= {"t0", "t1", "t2", "t3"}
    for root, entries in theirs.items():
        for key, value in entries.items():
            assert same_entry(value, ours[root][key]), (root, key, value, ours[root][key])
