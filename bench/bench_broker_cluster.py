"""The project's document sync through one Mosquitto against a three-member NATS cluster.

The same fleet and load on both, measured in the same run, each figure printed with its ratio
to Mosquitto's: N node documents, each with a node-side :class:`DocPeer` on a session of its
own and a central-side one on central's single session (as central and the nodes run it);
MQTT 3.1.1 on both brokers (NATS speaks nothing else), QoS 1 frames, persistent sessions. On
the cluster central is connected to nats1 and the nodes alternately to nats2 and nats3, so
every frame crosses a cluster route and QoS 1 passes through JetStream.

1. Latency: one task update at one node until central's replica has the node's content
   hash, one node at a time, R rounds: p50 and p99.
2. Throughput: every node writes U task updates, one per loop turn (the peers send as they
   come, coalescing what queues while a publish is in flight): time until every replica
   at central is converged; updates/s and the frames/s that carried them.
3. Broker capacity, without the sync: one aiomqtt publisher (a node's member) sends M QoS 1
   messages of 1 KiB, one subscriber (central's member) receives them: messages/s.
4. Resync after a reconnect: central's session is stopped, each node writes D more updates,
   central's session comes back (a fresh process would resync the same way): time until all
   converged.

nats-server (Debian's ``nats-server``) and Mosquitto must be installed; both are started on
free loopback ports and stopped at the end (well under a minute at the defaults).

    .venv/bin/python bench/bench_broker_cluster.py [--nodes 20] [--updates 200] [--rounds 100]
        [--resync 500] [--raw 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from natscluster import loopback_cluster

from edgesched.core.task import TaskState
from edgesched.ports import free_port, wait_for_port
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import TaskReport
from edgesched.sync.session import Endpoint, MqttSession

Address = tuple[str, int]


@contextlib.contextmanager
def mosquitto() -> Iterator[Address]:
    """Mosquitto on a free loopback port (anonymous, no persistence), as tests/conftest."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        port = free_port()
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            "log_dest none\nmax_queued_messages 100000\n"
        )
        proc = subprocess.Popen(
            [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for_port(port, proc=proc)
            yield ("127.0.0.1", port)
        finally:
            proc.terminate()
            proc.wait(10)


@dataclass
class Fleet:
    nodes: list[NodeDoc]
    replicas: list[NodeDoc]
    node_sessions: list[MqttSession]
    central: MqttSession
    central_addr: Address
    tasks: list[asyncio.Task[None]]

    def converged(self, i: int) -> bool:
        return self.nodes[i].content_hash() == self.replicas[i].content_hash()

    def all_converged(self) -> bool:
        return all(self.converged(i) for i in range(len(self.nodes)))

    def frames(self) -> int:
        return sum(
            ch.stats["frames_out"]  # type: ignore[attr-defined]
            for s in [*self.node_sessions, self.central]
            for ch in s.channels
        )


def session(addr: Address, ident: str) -> MqttSession:
    endpoint = Endpoint(addr[0], addr[1], ident, keepalive_s=5, protocol="3.1.1")
    return MqttSession(endpoint, backoff_initial_s=0.05, backoff_max_s=0.2)


def central_session(fleet_replicas: list[NodeDoc], addr: Address) -> MqttSession:
    s = session(addr, "bench-central")
    for replica in fleet_replicas:
        s.add(DocPeer(replica, "central"))
    return s


async def until(pred: object, timeout: float, what: str) -> float:
    t0 = time.perf_counter()
    assert callable(pred)
    while not pred():
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{what} not reached in {timeout}s")
        await asyncio.sleep(0.001)
    return time.perf_counter() - t0


@contextlib.asynccontextmanager
async def fleet(n: int, central_addr: Address, node_addrs: list[Address], tag: str):  # type: ignore[no-untyped-def]
    nodes = [NodeDoc(f"node-{tag}{i:03d}", client_id_for(f"{tag}{i:03d}")) for i in range(n)]
    replicas = [NodeDoc(d.name, client_id_for("central")) for d in nodes]
    node_sessions = []
    for i, doc in enumerate(nodes):
        s = session(node_addrs[i % len(node_addrs)], f"bench-{tag}{i:03d}")
        s.add(DocPeer(doc, f"{tag}{i:03d}"))
        node_sessions.append(s)
    central = central_session(replicas, central_addr)
    tasks = [asyncio.create_task(s.run()) for s in [*node_sessions, central]]
    f = Fleet(nodes, replicas, node_sessions, central, central_addr, tasks)
    try:
        await until(lambda: all(s.connected for s in [*node_sessions, central]), 30, "connected")
        for doc in nodes:
            doc.put_task("warm", TaskReport(state=TaskState.RUNNING, updated_at=0.0))
        await until(f.all_converged, 30, "warm-up converged")
        yield f
    finally:
        for task in f.tasks:
            task.cancel()
        await asyncio.gather(*f.tasks, return_exceptions=True)


async def raw_qos1(pub: Address, sub: Address, count: int) -> float:
    """Messages/s of ``count`` QoS 1 messages of 1 KiB from a client at ``pub`` to one at
    ``sub``, until the last is received."""
    import aiomqtt

    v311 = aiomqtt.ProtocolVersion.V311
    topic = "edgesched/v1/bench/raw"
    async with (
        aiomqtt.Client(*sub, identifier="bench-raw-sub", protocol=v311) as rx,
        aiomqtt.Client(
            *pub, identifier="bench-raw-pub", protocol=v311, max_inflight_messages=100
        ) as tx,
    ):
        await rx.subscribe(topic, qos=1)
        await asyncio.sleep(0.3)
        got = 0
        done = asyncio.Event()

        async def receive() -> None:
            nonlocal got
            async for _ in rx.messages:
                got += 1
                if got == count:
                    done.set()
                    return

        reader = asyncio.create_task(receive())
        t0 = time.perf_counter()
        await asyncio.gather(*(tx.publish(topic, b"x" * 1024, qos=1) for _ in range(count)))
        await asyncio.wait_for(done.wait(), 60)
        took = time.perf_counter() - t0
        await reader
        return count / took


def report(state: int, at: float) -> TaskReport:
    return TaskReport(state=TaskState.RUNNING if state % 2 else TaskState.PLACED, updated_at=at)


async def measure(
    n: int,
    updates: int,
    rounds: int,
    resync: int,
    raw: int,
    central: Address,
    nodes: list[Address],
    tag: str,
) -> dict[str, float]:
    out: dict[str, float] = {}
    async with fleet(n, central, nodes, tag) as f:
        lat = []
        for r in range(rounds):
            i = r % n
            f.nodes[i].put_task(f"lat-{r}", report(r, float(r)))
            lat.append(await until(lambda i=i: f.converged(i), 10, "one update"))
        lat.sort()
        out["lat_p50_ms"] = statistics.median(lat) * 1e3
        out["lat_p99_ms"] = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] * 1e3

        frames0 = f.frames()
        t0 = time.perf_counter()
        for u in range(updates):
            for i, doc in enumerate(f.nodes):
                doc.put_task(f"t{u % 50}", report(u, 1e3 + u + i))
            await asyncio.sleep(0)
        await until(f.all_converged, 120, "every replica after the burst")
        took = time.perf_counter() - t0
        out["updates_per_s"] = n * updates / took
        out["frames_per_s"] = (f.frames() - frames0) / took

        out["raw_msgs_per_s"] = await raw_qos1(nodes[0], central, raw)

        f.tasks[-1].cancel()
        await asyncio.gather(f.tasks[-1], return_exceptions=True)
        for u in range(resync):
            for i, doc in enumerate(f.nodes):
                doc.put_task(f"r{u}", report(u, 2e3 + u + i))
        fresh = [NodeDoc(d.name, client_id_for("central")) for d in f.nodes]
        for replica, new in zip(f.replicas, fresh, strict=True):
            new.apply_remote(replica.snapshot(), sender="copy")
        f.replicas[:] = fresh
        f.central = central_session(fresh, f.central_addr)
        t0 = time.perf_counter()
        f.tasks.append(asyncio.create_task(f.central.run()))
        out["resync_s"] = await until(f.all_converged, 120, "every replica after the resync")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--updates", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--resync", type=int, default=500)
    ap.add_argument("--raw", type=int, default=5000)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("mqtt").setLevel(logging.ERROR)  # paho's "pending publish calls"
    print(
        f"document sync, {args.nodes} nodes: one Mosquitto vs a 3-member NATS cluster "
        "(MQTT 3.1.1, QoS 1; central on nats1, nodes on nats2/nats3)"
    )
    results: dict[str, dict[str, float]] = {}

    def run(central: Address, nodes: list[Address], tag: str) -> dict[str, float]:
        return asyncio.run(
            measure(
                args.nodes, args.updates, args.rounds, args.resync, args.raw, central, nodes, tag
            )
        )

    with mosquitto() as addr:
        results["mosquitto"] = run(addr, [addr], "m")
    with loopback_cluster() as cluster:
        n1, n2, n3 = cluster.members
        results["nats x3"] = run(
            (n1.mqtt_host, n1.mqtt_port),
            [(n2.mqtt_host, n2.mqtt_port), (n3.mqtt_host, n3.mqtt_port)],
            "n",
        )
    m, c = results["mosquitto"], results["nats x3"]
    rows = (
        ("1. one update, node -> central, p50", "lat_p50_ms", "ms", False),
        ("1. one update, node -> central, p99", "lat_p99_ms", "ms", False),
        (
            f"2. throughput, {args.nodes} x {args.updates} updates",
            "updates_per_s",
            "updates/s",
            True,
        ),
        ("2. frames carried", "frames_per_s", "frames/s", True),
        (f"3. raw QoS 1, {args.raw} x 1 KiB, one pair", "raw_msgs_per_s", "msgs/s", True),
        (f"4. resync, {args.nodes} x {args.resync} updates", "resync_s", "s", False),
    )
    print(f"{'figure':44} {'mosquitto':>12} {'nats x3':>12}  ratio (nats / mosquitto)")
    for label, key, unit, _higher in rows:
        print(f"{label:44} {m[key]:>12.1f} {c[key]:>12.1f}  x{c[key] / m[key]:.2f} ({unit})")


if __name__ == "__main__":
    main()
