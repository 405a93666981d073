"""Policy bytes to each node when every node of the fleet reconnects once, over Mosquitto.

Each node that (re)connects sends its y-sync step 1 of the shared ``policy`` document; central
answers it. Before reply topics (``--protocol old``: the step 1 unmarked, the nodes hearing the
centrals' sender topics only) central answers on its sender topic, which every node hears, so
each reconnect anywhere costs every node an answer and a node's bytes grow with the fleet.
With them (``new``: the step 1 marked, :func:`edgesched.sync.wire.step1_payload` with
``replies=True``) central answers on the asker's reply topic and only the asker hears it.

Central is a real :class:`~edgesched.sync.peer.DocPeer` of a policy document like a running
central's (mode, tidal profile, ``packed_entries``, two published models, a few mode changes
behind it: a delete set). The N nodes' step 1s are published by one client, each on its node's
own sender topic, one after the other (each once central answered the one before: reconnects
spread over time; a burst of equal step 1s would be answered once on the sender topic), with
the state vector of an up-to-date node (a reconnect; ``--fresh``: an
empty one, a node that holds nothing); ``--observers`` of them are also raw subscribers with
that node's subscriptions (its protocol's), counting the payload bytes the broker delivers
to them. A fresh Mosquitto (the project's queue limits) per size and protocol.

Printed per protocol and size: the bytes delivered to each observed node in the round (its own
answer and everyone else's), the same per node per hour if every node reconnects
``--per-hour`` times an hour, and the ratio of the largest size to the smallest.

    .venv/bin/python bench/bench_policy_fanout.py [--nodes 100,1000] [--protocol old,new]
        [--observers 3] [--per-hour 1] [--fresh]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt

from edgesched.core.policy import PolicyMode
from edgesched.localbroker import mosquitto_path
from edgesched.ports import free_port, wait_for_port
from edgesched.sync import security, wire
from edgesched.sync.doc import PolicyDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import ModelEntry, TidalEntry

CENTRAL = "central"
DOC = "policy"


def central_policy() -> PolicyDoc:
    """A policy document like a running central's: a few switches behind it."""
    doc = PolicyDoc(DOC, client_id_for(CENTRAL))
    doc.announce_packed()
    for mode in (PolicyMode.BALANCE, PolicyMode.ENERGY, PolicyMode.PRIORITY, PolicyMode.BALANCE):
        doc.set_mode(mode)
    for profile in ("campus", "office", "campus"):
        doc.set_tidal(TidalEntry(profile=profile))
    for kind in ("forecast", "placement"):
        data = "QUFB" * 512  # 2 KB of base64: a small model
        doc.set_model(kind, ModelEntry(sha256="0" * 64, data=data, size=1536, name=kind))
    return doc


@dataclass
class Ear:
    """What the broker delivered to one node's subscriptions."""

    node: str
    own: int = 0  # payload bytes on its reply topic (answers to its own step 1)
    shared: int = 0  # payload bytes on central's sender topic
    messages: int = 0


@dataclass
class Result:
    protocol: str
    nodes: int
    ears: list[Ear] = field(default_factory=list)
    answers: int = 0
    seconds: float = 0.0

    def per_node(self) -> float:
        """Mean payload bytes delivered to each observed node in the round."""
        return statistics.fmean(e.own + e.shared for e in self.ears)


async def until(pred: Callable[[], bool], timeout: float, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(interval)


async def listen(port: int, ear: Ear, protocol: str, ready: asyncio.Event) -> None:
    """A node's subscriptions of the policy (its protocol's), counted."""
    own = wire.reply_topic(DOC, ear.node, CENTRAL)
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"ear-{ear.node}") as client:
        await client.subscribe(wire.sync_topic(DOC, CENTRAL), qos=1)
        if protocol == "new":
            await client.subscribe(wire.reply_filter(DOC, ear.node, CENTRAL), qos=1)
        ready.set()
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            ear.messages += 1
            if message.topic.value == own:
                ear.own += len(message.payload)
            else:
                ear.shared += len(message.payload)


def start_broker(workdir: Path) -> tuple[int, subprocess.Popen[bytes]]:
    exe = mosquitto_path()
    if exe is None:
        raise SystemExit("Mosquitto is not installed: run `make setup`")
    port = free_port()
    conf = workdir / "mosquitto.conf"
    settings = "\n".join(security.queue_settings())  # as the project deploys it
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        f"log_dest none\n{settings}\n"
    )
    proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL)
    wait_for_port(port)
    return port, proc


async def round_of_reconnects(
    port: int, nodes: int, protocol: str, observers: int, fresh: bool
) -> Result:
    doc = central_policy()
    central = DocPeer(doc, CENTRAL, "127.0.0.1", port, keepalive=10)
    tasks = [asyncio.create_task(central.run())]
    result = Result(protocol, nodes)
    try:
        await until(lambda: central.connected and central.stats["step1_out"] >= 1, 10)
        await asyncio.sleep(0.3)  # central's own step 1 on connect: before the round
        ids = [f"node-{i}" for i in range(nodes)]
        result.ears = [Ear(node) for node in ids[:observers]]
        ready = [asyncio.Event() for _ in result.ears]
        tasks += [
            asyncio.create_task(listen(port, ear, protocol, r))
            for ear, r in zip(result.ears, ready, strict=True)
        ]
        for event in ready:
            await asyncio.wait_for(event.wait(), 10)
        state_vector = b"\x00" if fresh else doc.state_vector()
        step1 = wire.step1_payload(state_vector, replies=protocol == "new")
        node_cid = client_id_for("node")  # one replica's client id stands for each node's
        answered = central.stats["step2_out"]
        start = time.monotonic()
        async with aiomqtt.Client("127.0.0.1", port, identifier="askers") as askers:
            for k, node in enumerate(ids, 1):  # one at a time, as reconnects spread over time
                for frame in wire.encode(wire.Kind.SYNC, DOC, node_cid, step1):
                    await askers.publish(wire.sync_topic(DOC, node), frame, qos=1)
                await until(lambda: central.stats["step2_out"] - answered >= k, 30, 0.001)  # noqa: B023
            result.seconds = time.monotonic() - start
            result.answers = central.stats["step2_out"] - answered

            def delivered() -> int:
                return sum(e.messages for e in result.ears)

            last = -1
            while last != delivered():  # until the observers' queues are drained
                last = delivered()
                await asyncio.sleep(0.5)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000", help="comma-separated fleet sizes")
    parser.add_argument("--protocol", default="old,new", help="old (before reply topics), new")
    parser.add_argument("--observers", type=int, default=3, help="nodes whose bytes are counted")
    parser.add_argument("--per-hour", type=float, default=1.0, help="reconnects per node-hour")
    parser.add_argument("--fresh", action="store_true", help="askers hold nothing yet")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    protocols = args.protocol.split(",")
    if not set(protocols) <= {"old", "new"} or min(sizes) < args.observers:
        parser.error("--protocol takes old,new; every size must be >= --observers")
    results: dict[tuple[str, int], Result] = {}
    with tempfile.TemporaryDirectory(prefix="bench-policy-fanout-") as tmp:
        for protocol in protocols:
            for nodes in sizes:
                port, broker = start_broker(Path(tmp))
                try:
                    res = asyncio.run(
                        round_of_reconnects(port, nodes, protocol, args.observers, args.fresh)
                    )
                finally:
                    broker.terminate()
                    broker.wait(10)
                results[protocol, nodes] = res
                own = statistics.fmean(e.own for e in res.ears)
                shared = statistics.fmean(e.shared for e in res.ears)
                print(
                    f"{protocol:>3} {nodes:>6} nodes: {res.answers} answers in {res.seconds:.1f} s;"
                    f" to each observed node {res.per_node():,.0f} B in the round"
                    f" ({own:,.0f} on its reply topic, {shared:,.0f} on central's sender topic),"
                    f" {res.per_node() * args.per_hour / 1e3:,.1f} kB/h"
                    f" at {args.per_hour:g} reconnect(s) per node-hour",
                    flush=True,
                )
    print()
    print("| protocol | " + " | ".join(f"{n:,} nodes (B/node/round)" for n in sizes) + " | ratio |")
    print("|---|" + "---|" * len(sizes) + "---|")
    for protocol in protocols:
        row = [results[protocol, n].per_node() for n in sizes]
        ratio = row[-1] / row[0] if row[0] else float("nan")
        cells = " | ".join(f"{v:,.0f}" for v in row)
        print(f"| {protocol} | {cells} | ×{ratio:.2f} |")


if __name__ == "__main__":
    main()
