"""Document sync: convergence after heal, resync bytes, central fan-in, a month's document size.

Four figures, each against a baseline measured in the same run and printed as a ratio, with
the issue's target and MET/MISSED next to it:

1. Convergence after heal. N nodes, each with its own :class:`NodeDoc` (client id from
   ``client_id_for``), synced once with central, then D offline decisions each (``put_task``
   of an engine-shaped record, ~30% overwrites of earlier tasks). Central holds one replica
   per node and merges them one after another by state-vector exchange both ways (in-process,
   no network). Per node: merge time, and time from heal (the sequential central's view, the
   last node waits for all). Baseline: the same exchange on raw ``pycrdt.Doc`` s. Networked
   variant: n nodes x d decisions made while the DocPeers cannot reach the broker; time from
   Mosquitto start (heal) to every node/central pair having equal content hashes; baseline:
   the in-process merge of the same documents. [target p99 < 1 s]
2. Bytes on the wire per resync: a node reconnects with D decisions central lacks; every byte
   both DocPeers publish (their ``stats["bytes_out"]``: frames incl. our 44-byte header)
   until converged and quiet, against ``len(node.diff(central_state_vector))``. Also the
   framing alone (``wire.encode`` of the step 2) and an estimate with MQTT PUBLISH headers.
   [target <= 1.25x]
3. Central fan-in: many small updates from many node docs, round-robin, applied with
   ``apply_remote`` to per-node replicas; also the whole receive path of a DocPeer (frame
   reassembly and CRCs, y-sync decode, apply, state-vector check). Baseline: raw
   ``Doc.apply_update`` of the same bytes. [target >= 5,000 updates/s]
4. One node's document over a simulated month: T tasks/day, each accepted -> placed ->
   running -> exited/failed/cancelled (4 ``put_task`` s), the engine's policy (an hourly sweep
   removes tasks finished more than a day ago; SQLite is the durable log), the update log
   compacted every 256 updates as ``log_update`` does, and at each compaction the document
   rotated to a new epoch when ``NodeDoc.should_rotate`` says so (the default
   ``RotationPolicy``: over 64 KiB and over twice a fresh document of the live content), as
   ``log_update`` does. Snapshot bytes at the end and the max along the way, and the store's
   doc footprint (snapshot + uncompacted log). Baselines: the same operations without epochs
   (tombstones of removed tasks stay), and without removing finished tasks. [target < 1 MB]

Pinned to one core. Mosquitto (``/usr/sbin/mosquitto`` or on PATH) is started on a free port
for 1 (networked: unsigned, then every message signed and checked, the ratio printed) and 2 and
stopped at the end. Default run well under 2 minutes; full sizes
are the defaults of 1 and 4; ``--full`` also takes fan-in to 1,000 nodes x 100 updates and the
networked variant to 20 nodes x 1,000 decisions.

    .venv/bin/python bench/bench_sync.py [--nodes 100] [--decisions 1000] [--net-nodes 10]
        [--net-decisions 200] [--fanin-nodes 100] [--fanin-updates 100] [--days 30]
        [--tasks-per-day 2000] [--only converge,net,wire,fanin,month] [--full]

``--only month`` runs the month alone (about 35 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pycrdt import Doc, YSyncMessageType

from edgesched.core.model import Arch, ServerClass
from edgesched.core.task import TaskState
from edgesched.ports import free_port, wait_for_port
from edgesched.sync import wire
from edgesched.sync.doc import LocalUpdate, NodeDoc, client_id_for, decode_state_vector
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import Registration, TaskReport
from edgesched.sync.signing import FrameSigning, KeyRing, Signer

CENTRAL_ID = client_id_for("central")
EMPTY = b"\x00\x00"
TERMINAL = ("exited", "failed", "cancelled")
RETENTION_S = 86_400.0  # edge/engine.py DOC_RETENTION_S
SWEEP_S = 3_600.0  # the engine sweeps with its hourly rollup
COMPACT_AFTER = 256  # sync/doc.py DEFAULT_COMPACT_AFTER


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def record(rng: random.Random, state: str, node: str, at: float) -> TaskReport:
    """The entry the engine mirrors into the node document (edge/engine.py ``_put``:
    ``TaskReport.of`` its task record)."""
    return TaskReport(
        state=TaskState(state),
        node=node,
        decided_by="local",
        workload=rng.choice(("ingest", "infer", "etl", "backup")),
        priority=rng.randint(0, 100),
        cpu=1.0,
        mem_gib=0.5,
        restarts=0,
        exit_code=(0 if state == "exited" else 1) if state in TERMINAL else None,
        accepted_at=round(at, 3),
        updated_at=round(at, 3),
    )


def registration(arch: Arch = Arch.X86_64, cpu: float = 8, mem_gib: float = 16) -> Registration:
    """A node's registration (edge/engine.py writes it once at start)."""
    return Registration(arch=arch, server_class=ServerClass.GENERAL, cpu=cpu, mem_gib=mem_gib)


def offline_decisions(doc: NodeDoc, node: str, count: int, rng: random.Random) -> None:
    """``count`` decisions: new tasks, ~30% overwrites (state changes) of earlier ones."""
    ids: list[str] = []
    states = ("placed", "running", "exited", "failed")
    for j in range(count):
        at = 1.7e9 + j
        if ids and rng.random() < 0.3:
            doc.put_task(rng.choice(ids), record(rng, rng.choice(states), node, at))
        else:
            ids.append(f"job-{j:06d}")
            doc.put_task(ids[-1], record(rng, "accepted", node, at))


@dataclass
class Fleet:
    nodes: list[NodeDoc]
    central: list[NodeDoc]
    pre: list[bytes]  # what central got from each node before the partition


def make_fleet(n: int, decisions: int, seed: int) -> Fleet:
    rng = random.Random(seed)
    fleet = Fleet([], [], [])
    for i in range(n):
        name = f"n{i:03d}"
        node = NodeDoc(f"node-{name}", client_id_for(name))
        node.set_registration(registration(Arch.ARM64, cpu=8, mem_gib=16))
        replica = NodeDoc(node.name, CENTRAL_ID)
        pre = node.diff(replica.state_vector())
        replica.apply_remote(pre, sender=name)
        offline_decisions(node, name, decisions, rng)
        fleet.nodes.append(node)
        fleet.central.append(replica)
        fleet.pre.append(pre)
    ids = {d.client_id for d in fleet.nodes} | {CENTRAL_ID}
    assert len(ids) == n + 1, "client id collision in the benchmark fleet"
    return fleet


# ---------------------------------------------------------------------- 1. convergence


def merge_ours(node: NodeDoc, central: NodeDoc, sender: str) -> None:
    """Both y-sync steps: central's vector -> node's diff; node's vector -> central's diff."""
    central.apply_remote(node.diff(central.state_vector()), sender=sender)
    back = central.diff(node.state_vector())
    if back != EMPTY:
        node.apply_remote(back, sender="central")


def merge_raw(node: Doc[Any], central: Doc[Any]) -> None:
    central.apply_update(node.get_update(central.get_state()))
    back = central.get_update(node.get_state())
    if back != EMPTY:
        node.apply_update(back)


def bench_converge(n: int, decisions: int) -> float:
    print(f"\n1. convergence after heal, in-process: {n} nodes x {decisions} offline decisions")
    t0 = time.perf_counter()
    fleet = make_fleet(n, decisions, seed=1)
    build = time.perf_counter() - t0
    raw_nodes, raw_central = [], []
    for node, pre in zip(fleet.nodes, fleet.pre, strict=True):
        rn: Doc[Any] = Doc(client_id=node.client_id)
        rn.apply_update(node.snapshot())
        rc: Doc[Any] = Doc(client_id=CENTRAL_ID)
        rc.apply_update(pre)
        raw_nodes.append(rn)
        raw_central.append(rc)
    diff_sizes = [
        len(nd.diff(c.state_vector())) for nd, c in zip(fleet.nodes, fleet.central, strict=True)
    ]
    print(
        f"   built in {build:.1f} s; diff per node p50 {statistics.median(diff_sizes) / 1e3:.0f} KB"
        f", total {sum(diff_sizes) / 1e6:.1f} MB"
    )

    def run(merge: Callable[[int], None]) -> tuple[list[float], list[float]]:
        own, since_heal = [], []
        heal = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            merge(i)
            end = time.perf_counter()
            own.append(end - t)
            since_heal.append(end - heal)
        return own, since_heal

    ours, ours_heal = run(
        lambda i: merge_ours(fleet.nodes[i], fleet.central[i], fleet.nodes[i].name)
    )
    raw, raw_heal = run(lambda i: merge_raw(raw_nodes[i], raw_central[i]))
    t = time.perf_counter()
    same = sum(
        a.content_hash() == b.content_hash()
        for a, b in zip(fleet.nodes, fleet.central, strict=True)
    )
    check = (time.perf_counter() - t) / n
    assert same == n, f"only {same}/{n} replicas converged"
    print(f"   all {n} replicas converged (content hash checked after, {check * 1e3:.1f} ms/node)")
    ratio = statistics.median(ours) / statistics.median(raw)
    print(
        f"   merge per node    ours p50 {statistics.median(ours) * 1e3:6.1f} ms  "
        f"p99 {pct(ours, 0.99) * 1e3:6.1f} ms | raw pycrdt p50 {statistics.median(raw) * 1e3:6.1f}"
        f" ms  p99 {pct(raw, 0.99) * 1e3:6.1f} ms | ratio x{ratio:.2f}  "
        f"[p99 < 1 s: {verdict(pct(ours, 0.99) < 1.0)}]"
    )
    print(
        f"   time from heal    ours p50 {statistics.median(ours_heal):6.2f} s   "
        f"p99 {pct(ours_heal, 0.99):6.2f} s  | raw pycrdt p50 {statistics.median(raw_heal):6.2f} s"
        f"   p99 {pct(raw_heal, 0.99):6.2f} s  | total {ours_heal[-1]:.2f} s vs "
        f"{raw_heal[-1]:.2f} s (x{ours_heal[-1] / raw_heal[-1]:.2f})  "
        f"[p99 < 1 s: {verdict(pct(ours_heal, 0.99) < 1.0)}]"
    )
    return statistics.median(ours)


# ---------------------------------------------------------------------- Mosquitto


class Broker:
    """Mosquitto on 127.0.0.1 on a free port (anonymous, no persistence), as tests/conftest."""

    def __init__(self, tmp: Path) -> None:
        found = shutil.which("mosquitto") or (
            "/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None
        )
        if found is None:
            raise SystemExit("Mosquitto is not installed (apt-get install mosquitto)")
        self.binary = found
        self.port = free_port()
        self.conf = tmp / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            "log_dest none\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, interval=0.01)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def broker() -> Iterator[Broker]:
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        b = Broker(Path(tmp))
        try:
            yield b
        finally:
            b.stop()


def make_peer(
    doc: NodeDoc, peer_id: str, port: int, signing: FrameSigning | None = None
) -> DocPeer:
    # Short reconnect backoff: we measure the sync, not how long a peer sleeps before retrying
    # (production: 0.5 s doubling to 30 s, full jitter, which adds up to that to any heal).
    return DocPeer(
        doc,
        peer_id,
        "127.0.0.1",
        port,
        keepalive=5,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        signing=signing,
    )


def signings(peer_ids: list[str]) -> dict[str, FrameSigning]:
    """Each peer's signing (its own Ed25519 key), checking every other's."""
    keys = {p: Ed25519PrivateKey.generate() for p in peer_ids}
    ring = KeyRing(Path("/nonexistent"))
    for peer_id, key in keys.items():
        ring.add(peer_id, key.public_key())
    return {p: FrameSigning(Signer(p, key), ring) for p, key in keys.items()}


async def stop_tasks(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    _, pending = await asyncio.wait(tasks, timeout=5)
    if pending:  # a DocPeer that swallowed its cancel: say so rather than hang
        print(f"   warning: {len(pending)} peer task(s) did not stop within 5 s of cancel")


# ---------------------------------------------------------------------- 1b. networked


async def net_converge(n: int, decisions: int, *, signed: bool = False) -> float:
    """Prints the heal's figures; returns the time until all converged (seconds).
    ``signed``: every peer signs its messages and checks its peers' (sync/signing.py)."""
    print(
        f"\n1b. convergence after heal through Mosquitto: {n} nodes x {decisions} offline "
        "decisions, node + central DocPeer per node doc (2 MQTT clients each, one process)"
        + (", every message signed (Ed25519) and checked" if signed else ", unsigned")
    )
    fleet = make_fleet(n, 0, seed=2)
    names = [d.name.removeprefix("node-") for d in fleet.nodes]
    keyed = signings([*names, "central"]) if signed else {}
    with broker() as b:
        peers = [
            make_peer(d, p, b.port, keyed.get(p)) for d, p in zip(fleet.nodes, names, strict=True)
        ]
        peers += [make_peer(c, "central", b.port, keyed.get("central")) for c in fleet.central]
        tasks = [asyncio.create_task(p.run()) for p in peers]
        try:
            rng = random.Random(3)
            for node in fleet.nodes:  # offline: the peers retry against a closed port
                offline_decisions(node, node.name, decisions, rng)
            await asyncio.sleep(0.5)
            if any(p.connected for p in peers):
                raise RuntimeError("a peer connected before the broker started")
            heal = time.monotonic()
            b.start()
            up = time.monotonic() - heal
            times: dict[int, float] = {}
            while len(times) < n:
                for i in range(n):
                    # Vectors first (cheap), then the content hash that proves it.
                    node, replica = fleet.nodes[i], fleet.central[i]
                    if (
                        i not in times
                        and decode_state_vector(node.state_vector())
                        == decode_state_vector(replica.state_vector())
                        and node.content_hash() == replica.content_hash()
                    ):
                        times[i] = time.monotonic() - heal
                if time.monotonic() - heal > 60:
                    raise TimeoutError(f"{n - len(times)} node docs not converged after 60 s")
                await asyncio.sleep(0.005)
            total = max(times.values())
        finally:
            await stop_tasks(tasks)
    # Baseline: the in-process merge of the same documents (fresh replicas from the same state).
    merge: list[float] = []
    for node, pre in zip(fleet.nodes, fleet.pre, strict=True):
        mirror = NodeDoc(node.name, node.client_id)
        mirror.apply_remote(node.snapshot(), sender="copy")
        replica = NodeDoc(node.name, CENTRAL_ID)
        replica.apply_remote(pre, sender="pre")
        t = time.perf_counter()
        merge_ours(mirror, replica, mirror.name)
        merge.append(time.perf_counter() - t)
    vals = list(times.values())
    frames = sum(p.stats["frames_out"] for p in peers)
    sent = sum(p.stats["bytes_out"] for p in peers)
    print(
        f"   broker up (port open) {up * 1e3:.0f} ms after start; {frames} frames, "
        f"{sent / 1e3:.0f} KB published in all"
    )
    print(
        f"   time from heal    p50 {statistics.median(vals):5.2f} s  p99 {pct(vals, 0.99):5.2f} s"
        f"  all converged {total:5.2f} s | in-process merge of the same docs, sequential: "
        f"{sum(merge):.3f} s (x{total / sum(merge):.0f})  "
        f"[p99 < 1 s: {verdict(pct(vals, 0.99) < 1.0)}]"
    )
    return total


async def net_converge_both(n: int, decisions: int) -> None:
    """The networked heal unsigned, then signed: the cost of signatures (issue 13)."""
    plain = await net_converge(n, decisions)
    signed = await net_converge(n, decisions, signed=True)
    print(
        f"   signed against unsigned, all converged: {signed:.2f} s against {plain:.2f} s "
        f"(x{signed / plain:.2f}) [within 1.5x: {verdict(signed <= 1.5 * plain)}]"
    )


# ---------------------------------------------------------------------- 2. wire bytes


def publish_overhead(topic: str, frame: int) -> int:
    """MQTT v5 PUBLISH QoS 1 bytes around a frame: fixed header, topic, packet id, props."""
    body = 2 + len(topic.encode()) + 2 + 1 + frame
    remaining = 1 if body < 128 else 2 if body < 16_384 else 3
    return 1 + remaining + body - frame


async def wire_bytes(sizes: list[int]) -> None:
    print(
        "\n2. bytes published per resync vs the minimal diff (node reconnects with D decisions "
        "central lacks; central knew 50 earlier tasks)"
    )
    with broker() as b:
        b.start()
        for size in sizes:
            rng = random.Random(size)
            name = f"w{size}"
            node = NodeDoc(f"node-{name}", client_id_for(name))
            central = NodeDoc(node.name, CENTRAL_ID)
            node.set_registration(registration())
            offline_decisions(node, name, 50, rng)
            central.apply_remote(node.diff(central.state_vector()), sender=name)
            offline_decisions(node, name, size, random.Random(size + 1))
            minimal = node.diff(central.state_vector())
            framed = wire.encode(
                wire.Kind.SYNC, node.name, node.client_id, wire.step2_payload(minimal)
            )
            cpeer = make_peer(central, "central", b.port)
            ctask = asyncio.create_task(cpeer.run())
            tasks = [ctask]
            try:
                while not cpeer.connected:
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.1)  # central's own step 1 goes out to nobody
                base_c = Counter(cpeer.stats)
                npeer = make_peer(node, name, b.port)
                tasks.append(asyncio.create_task(npeer.run()))
                t0 = time.monotonic()
                while node.content_hash() != central.content_hash():
                    if time.monotonic() - t0 > 30:
                        raise TimeoutError(f"resync of {size} decisions not done in 30 s")
                    await asyncio.sleep(0.005)
                took = time.monotonic() - t0
                await asyncio.sleep(0.6)  # let coalesced step 1s and their answers drain
            finally:
                await stop_tasks(tasks)
            n_out, n_frames = npeer.stats["bytes_out"], npeer.stats["frames_out"]
            c_out = cpeer.stats["bytes_out"] - base_c["bytes_out"]
            c_frames = cpeer.stats["frames_out"] - base_c["frames_out"]
            total = n_out + c_out
            mqtt = total + (n_frames + c_frames) * publish_overhead(npeer.topic, 1000)
            steps = (
                f"node step1 {npeer.stats['step1_out']} step2 {npeer.stats['step2_out']} / "
                f"central step1 {cpeer.stats['step1_out'] - base_c['step1_out']} step2 "
                f"{cpeer.stats['step2_out'] - base_c['step2_out']}"
            )
            print(
                f"   D={size:>5}  minimal diff {len(minimal):>8,} B | node->central "
                f"{n_out:>8,} B (x{n_out / len(minimal):.3f})  both ways {total:>8,} B "
                f"(x{total / len(minimal):.3f})  "
                f"[<= 1.25x: {verdict(total / len(minimal) <= 1.25)}]"
            )
            print(
                f"            framing alone x{sum(map(len, framed)) / len(minimal):.3f} "
                f"({len(framed)} frame(s)); with MQTT PUBLISH headers ~x{mqtt / len(minimal):.3f};"
                f" {n_frames + c_frames} frames ({steps}); converged in {took * 1e3:.0f} ms"
            )


# ---------------------------------------------------------------------- 3. fan-in


@dataclass
class Stream:
    names: list[str]
    clients: list[int]
    order: list[tuple[int, bytes, bytes]]  # node index, update, node state vector after it


def fanin_stream(n: int, per_node: int) -> Stream:
    rng = random.Random(4)
    stream = Stream([], [], [])
    per: list[list[tuple[int, bytes, bytes]]] = []
    for i in range(n):
        name = f"n{i:04d}"
        doc = NodeDoc(f"node-{name}", client_id_for(name))
        got: list[bytes] = []
        doc.on_local_update(got.append)
        mine = []
        for j in range(per_node):
            task = f"job-{j // 4:05d}"  # 4 state changes per task
            state = ("accepted", "placed", "running", "exited")[j % 4]
            doc.put_task(task, record(rng, state, name, 1.7e9 + j))
            mine.append((i, got[-1], doc.state_vector()))
        stream.names.append(doc.name)
        stream.clients.append(doc.client_id)
        per.append(mine)
    for j in range(per_node):  # round-robin across nodes
        stream.order.extend(p[j] for p in per)
    return stream


def bench_fanin(n: int, per_node: int, repeat: int) -> None:
    stream = fanin_stream(n, per_node)
    count = len(stream.order)
    sizes = [len(u) for _, u, _ in stream.order]
    print(
        f"\n3. central fan-in: {count:,} updates from {n} nodes ({per_node} each, round-robin), "
        f"update p50 {statistics.median(sizes):.0f} B, one process, median of {repeat}"
    )
    frames = [
        (
            i,
            wire.encode(
                wire.Kind.UPDATE,
                stream.names[i],
                stream.clients[i],
                wire.update_payload(u, sv),
            )[0],
        )
        for i, u, sv in stream.order
    ]

    def raw() -> float:
        docs: list[Doc[Any]] = [Doc(client_id=CENTRAL_ID) for _ in range(n)]
        t = time.perf_counter()
        for i, update, _ in stream.order:
            docs[i].apply_update(update)
        return time.perf_counter() - t

    def ours() -> float:
        docs = [NodeDoc(name, CENTRAL_ID) for name in stream.names]
        t = time.perf_counter()
        for i, update, _ in stream.order:
            docs[i].apply_remote(update, sender=stream.names[i])
        return time.perf_counter() - t

    def path() -> float:
        docs = [NodeDoc(name, CENTRAL_ID) for name in stream.names]
        assembler = wire.Reassembler()
        behind = 0
        t = time.perf_counter()
        for i, frame in frames:
            message = assembler.feed(frame)
            assert message is not None
            sync = wire.decode_sync(message.kind, message.payload)
            assert sync.step == YSyncMessageType.SYNC_UPDATE and sync.state_vector is not None
            docs[i].apply_remote(sync.data, sender=stream.names[i])
            behind += docs[i].missing_from(sync.state_vector)
        took = time.perf_counter() - t
        assert behind == 0, f"{behind} replicas left behind"
        return took

    timings: dict[str, list[float]] = {"raw": [], "ours": [], "path": []}
    for _ in range(repeat):  # interleaved
        timings["raw"].append(raw())
        timings["ours"].append(ours())
        timings["path"].append(path())
    base = count / statistics.median(timings["raw"])
    for key, label in (("ours", "apply_remote"), ("path", "DocPeer receive path")):
        rate = count / statistics.median(timings[key])
        print(
            f"   {label:<21} {rate:>9,.0f} updates/s | raw Doc.apply_update {base:>9,.0f}/s | "
            f"ratio x{base / rate:.2f} slower  [>= 5,000/s: {verdict(rate >= 5000)}]"
        )


# ---------------------------------------------------------------------- 4. a month


def month_events(days: int, per_day: int, seed: int) -> list[tuple[float, int, str, str]]:
    """(time, order, task, state): arrivals uniform over each day, the Alibaba-like durations."""
    rng = random.Random(seed)
    events: list[tuple[float, int, str, str]] = []
    for day in range(days):
        for k in range(per_day):
            task = f"job-{day:02d}-{k:05d}"
            t = day * 86_400.0 + rng.uniform(0, 86_400.0)
            placed = t + rng.uniform(0.05, 1.0)  # the next scheduling cycle
            running = placed + rng.uniform(0.01, 0.2)
            duration = min(rng.lognormvariate(2.3, 1.7), 6 * 3600.0)  # median 10 s, p99 ~ 10 min
            roll = rng.random()
            end = "exited" if roll < 0.95 else "failed" if roll < 0.98 else "cancelled"
            for order, (at, state) in enumerate(
                (
                    (t, "accepted"),
                    (placed, "placed"),
                    (running, "running"),
                    (running + duration, end),
                )
            ):
                events.append((at, order, task, state))
    events.sort()
    return events


@dataclass
class MonthResult:
    final: int
    peak: int
    peak_store: int
    live: int
    samples: list[int]
    ops: int
    seconds: float
    rotations: int = 0


def simulate_month(
    events: list[tuple[float, int, str, str]],
    days: int,
    remove: bool,
    sample_compaction: bool,
    epochs: bool = False,
) -> MonthResult:
    rng = random.Random(5)
    doc = NodeDoc("node-month", client_id_for("month"))
    if not epochs:
        doc.rotation_policy = None
    doc.set_registration(registration(Arch.X86_64, cpu=16))
    logged: list[int] = []
    rotations = 0

    def on_update(update: bytes) -> None:
        if isinstance(update, LocalUpdate) and update.rotation:
            logged.append(-len(update))  # log_update makes it the snapshot, drops the log
        else:
            logged.append(len(update))

    doc.on_local_update(on_update)
    finished: dict[str, float] = {}
    snapshot = len(doc.snapshot())
    peak = peak_store = snapshot
    log_bytes = since = 0
    samples: list[int] = []
    next_sweep = SWEEP_S
    next_day = 86_400.0
    ops = 0
    t0 = time.perf_counter()

    def after_update() -> None:
        # log_update: append, and fold the log into a snapshot past COMPACT_AFTER entries
        # (or rotate then, if the policy says so: the rotation's state becomes the snapshot).
        nonlocal log_bytes, since, snapshot, peak, peak_store, rotations
        if not sample_compaction:
            return
        for size in logged:
            if size < 0:
                snapshot, log_bytes, since = -size, 0, 0
            else:
                log_bytes += size
                since += 1
        logged.clear()
        peak_store = max(peak_store, snapshot + log_bytes)
        if since > COMPACT_AFTER:
            state = len(doc.snapshot())
            peak = max(peak, state)
            if doc.should_rotate(state):
                doc.rotate()
                rotations += 1
                after_update()
            else:
                snapshot = state
                log_bytes = since = 0

    for at, _, task, state in events:
        while at >= next_day:
            size = len(doc.snapshot())
            samples.append(size)
            peak = max(peak, size)
            next_day += 86_400.0
        while remove and at >= next_sweep:
            for tid, done in list(finished.items()):
                if next_sweep - done > RETENTION_S:
                    doc.remove_task(tid)
                    del finished[tid]
                    ops += 1
                    after_update()
            next_sweep += SWEEP_S
        doc.put_task(task, record(rng, state, "month", at))
        ops += 1
        after_update()
        if state in TERMINAL:
            finished[task] = at
    seconds = time.perf_counter() - t0
    final = len(doc.snapshot())
    live = NodeDoc("node-month", client_id_for("month"))
    reg = doc.registration()
    assert reg is not None
    live.set_registration(reg)
    for tid, entry in doc.tasks().items():
        live.put_task(tid, entry)
    return MonthResult(
        final, max(peak, final), peak_store, len(live.snapshot()), samples, ops, seconds, rotations
    )


def bench_month(days: int, per_day: int) -> None:
    print(
        f"\n4. one node's document over {days} days: {per_day:,} tasks/day x 4 state changes; "
        f"policy: hourly sweep removes tasks finished > {RETENTION_S / 3600:.0f} h ago "
        f"(edge/engine.py), update log compacted every {COMPACT_AFTER} updates, epochs rotated "
        "by the default RotationPolicy at compaction (sync/doc.py)"
    )
    events = month_events(days, per_day, seed=6)
    ep = simulate_month(events, days, remove=True, sample_compaction=True, epochs=True)
    kept = simulate_month(events, days, remove=True, sample_compaction=True)
    base = simulate_month(events, days, remove=False, sample_compaction=False)
    mb = 1e6
    print(
        f"   with epochs       end {ep.final / mb:6.2f} MB  max {ep.peak / mb:6.2f} MB  "
        f"store max (snapshot + log) {ep.peak_store / mb:6.2f} MB  "
        f"[< 1 MB: {verdict(ep.peak < 1e6)}]   ({ep.rotations} rotations, {ep.ops:,} "
        f"transactions, {ep.seconds:.1f} s)"
    )
    print(
        f"   without epochs    end {kept.final / mb:6.2f} MB  max {kept.peak / mb:6.2f} MB  "
        f"store max (snapshot + log) {kept.peak_store / mb:6.2f} MB  ({kept.seconds:.1f} s) | "
        f"ratio with/without epochs: end x{ep.final / kept.final:.3f}, "
        f"max x{ep.peak / kept.peak:.3f}"
    )
    print(
        f"   without removal   end {base.final / mb:6.2f} MB  ({base.ops:,} transactions) | "
        f"ratio without epochs/without removal x{kept.final / base.final:.3f}"
    )
    print(
        f"   the live content alone, in a fresh doc: {kept.live / mb:.2f} MB; without epochs the "
        f"rest ({(kept.final - kept.live) / mb:.2f} MB) is the deleted keys' tombstones"
    )
    marks = sorted({0, len(kept.samples) // 4, len(kept.samples) // 2, len(kept.samples) - 1})
    for label, run in (("with epochs", ep), ("without epochs", kept)):
        if run.samples:
            growth = "  ".join(f"day {i + 1}: {run.samples[i] / mb:.2f}" for i in marks)
            print(f"   snapshot MB by day ({label}): {growth}")


# ---------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--decisions", type=int, default=1000)
    parser.add_argument("--net-nodes", type=int, default=10)
    parser.add_argument("--net-decisions", type=int, default=200)
    parser.add_argument("--wire-sizes", default="10,200,2000,20000")
    parser.add_argument("--fanin-nodes", type=int, default=100)
    parser.add_argument("--fanin-updates", type=int, default=100)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--tasks-per-day", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="converge,net,wire,fanin,month")
    parser.add_argument("--full", action="store_true", help="larger fan-in and networked runs")
    args = parser.parse_args()
    if args.full:
        args.fanin_nodes = max(args.fanin_nodes, 1000)
        args.net_nodes, args.net_decisions = max(args.net_nodes, 20), max(args.net_decisions, 1000)
    logging.basicConfig(level=logging.ERROR)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    only = set(args.only.split(","))
    start = time.perf_counter()
    print("document sync benchmarks, one core (Mosquitto runs as its own process)")
    if "converge" in only:
        bench_converge(args.nodes, args.decisions)
    if "net" in only:
        asyncio.run(net_converge_both(args.net_nodes, args.net_decisions))
    if "wire" in only:
        asyncio.run(wire_bytes([int(s) for s in args.wire_sizes.split(",")]))
    if "fanin" in only:
        bench_fanin(args.fanin_nodes, args.fanin_updates, args.repeat)
    if "month" in only:
        bench_month(args.days, args.tasks_per_day)
    print(f"\ndone in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
