"""Central's receive path: node updates merged and acted on per second, in-process and through
a real Mosquitto.

Builds central's engine as ``bench_control_step.py`` does (N nodes of ``--tasks`` entries, 70%
running central's assignment). Each node then makes ``--updates`` real changes to its own copy
of its document (a running task exits: a ``TaskReport`` rewritten, authored under the node's
own client id), encoded as the frames its peer would publish: each update with the state
vector the node holds right after it, as ``DocPeer`` sends one update at a time (so central,
once it has applied a frame, is never behind its sender and asks no resync). The setup's
garbage is collected before the timed window starts. Every size runs two modes, each on an
engine of its own:

* **in-process** (the baseline, central's own ceiling): the frames are fed, interleaved across
  the nodes, through central's own routing (``MqttSession.route``) into the replica channels'
  ``handle`` (the path ``_dispatch`` takes for each MQTT message: reassembly, sender check,
  per-operation writer check, apply, change callbacks), and a control step runs after every
  ``--batch`` frames, as its wake-up would; then again with no writer check at all (the
  replicas' ``writers`` unset), the baseline of the per-operation authorship check's cost;
  and again with every frame signed by its node's Ed25519 key and checked by central
  (``sync/signing.py``), against the unsigned run;
* **broker** (``--broker``): Mosquitto on 127.0.0.1 on a free port, configured as the
  project's generated broker config (``sync.security.broker_config``) sets the queues
  (``queue_settings``: 100,000 messages or 256 MiB per client; ``--broker-queue`` sets the
  first, 1,000 is Mosquitto's own default), anonymous and without ACL here.
  Central runs as it does in service: its real ``MqttSession`` (``engine.session.run()``,
  its wildcard subscription, dispatch, every channel served, each peer's step 1 on connect),
  its own control loop (``engine._control_loop()``: a step whenever a change wakes it) and
  its desired documents' journals, in one event loop. The frames go, in the same interleaved
  order, from a separate process (``fanin_publisher.py``, paho-mqtt, MQTT 5, QoS 1, on each
  node's sync topic ``edgesched/v1/doc/node-<id>/sync/<id>``, as its ``DocPeer`` publishes)
  as fast as it goes or at ``--rate`` per second. The window runs from the first publish to
  the end of the first control step that started after the last frame reached a replica
  channel (``time.monotonic()`` on both sides); the run ends there, or ``--quiet-s`` after
  the publisher had every PUBACK and nothing more arrived (the rest counts as dropped).
  ``--step-gap-s``: a control loop of the harness instead of the engine's, at least that
  long between two steps (what coalescing the wake-ups would change).

Printed per size and mode: frames merged and acted on per second, with every exit in
central's index at the end (asserted in-process; counted through the broker, where a shortfall
is flagged), and for the broker: frames published, received and merged; drops (published -
merged, the broker's own ``$SYS`` dropped count, the nodes left short that would need a
resync, the frames that found central behind their sender, the step 1 messages central sent,
its reconnects); the most frames central was behind the publisher (taking the publishing as
even over its window); central's CPU seconds in the window split into control steps, merging
(the replica channels' ``handle``) and the rest (the MQTT client, asyncio, the other loops);
the publisher's and the broker's CPU; the ratio broker / in-process. Then the ratio of the
largest size to the smallest, per mode. ``--profile N``: cProfile of central's process over
the broker window, its top N costs printed (a profiled run's rates are not the figures).
``bench_central_scale.py`` measures the whole path with simulated nodes.

    .venv/bin/python bench/bench_central_fanin.py [--nodes 100,1000] [--updates 20]
        [--broker [--rate 0] [--broker-queue N] [--step-gap-s 0] [--profile N]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import gc
import io
import json
import logging
import os
import pickle
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import aiomqtt
import psutil
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_control_step as base

from edgesched.central.desired import DesiredDocs
from edgesched.central.engine import CentralEngine
from edgesched.config import EdgeschedConfig, parse_config
from edgesched.core.task import TaskState
from edgesched.localbroker import mosquitto_path
from edgesched.ports import free_port, wait_for_port
from edgesched.sync import wire
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import TaskReport
from edgesched.sync.security import queue_settings
from edgesched.sync.session import wait_event
from edgesched.sync.signing import FrameSigning, KeyRing, Signer, VerifyThread
from edgesched.sync.store import Store

PUBLISHER = Path(__file__).resolve().parent / "fanin_publisher.py"
#: Mosquitto's count of messages it dropped (a full per-client queue), every ``sys_interval``.
SYS_DROPPED = "$SYS/broker/publish/messages/dropped"


def node_frames(
    engine: CentralEngine, node_id: str, updates: int, now: float
) -> list[tuple[str, bytes]]:
    """``updates`` exits of the node's running tasks, as the frames its peer publishes."""
    replica = engine.replicas.replicas[node_id].doc
    mine = NodeDoc(replica.name, client_id_for(node_id))
    mine.packed = replica.packed  # (the form the node wrote its entries in: see base.build)
    mine.doc.apply_update(replica.diff())
    made: list[bytes] = []
    mine.on_local_update(made.append)
    running = [t for t, r in sorted(mine.tasks().items()) if r.state is TaskState.RUNNING]
    sent: list[tuple[bytes, bytes]] = []
    for task_id in running[:updates]:
        report = mine.task(task_id)
        assert report is not None
        mine.put_task(
            task_id,
            TaskReport(
                state=TaskState.EXITED, updated_at=now, cpu=1.0, assignment=report.assignment
            ),
        )
        # As the node's peer sends it: the update, with the state vector it has after it.
        (update,) = made
        made.clear()
        sent.append((update, mine.state_vector()))
    topic = wire.sync_topic(mine.name, node_id)
    frames = []
    for update, state_vector in sent:
        payload = wire.update_payload(update, state_vector)
        for frame in wire.encode(wire.Kind.UPDATE, mine.name, mine.client_id, payload, 65536):
            frames.append((topic, frame))
    return frames


@contextlib.contextmanager
def central_config(extra: Mapping[str, object]) -> Iterator[None]:
    """``base.build`` with ``extra`` merged into its ``[central]`` table (the broker to use):
    the engine then starts from a config that names it, as a deployed central does."""

    def parse(data: Mapping[str, object], source: str = "<config>") -> EdgeschedConfig:
        central = data["central"]
        assert isinstance(central, Mapping)
        return parse_config({**data, "central": {**central, **extra}}, source)

    with mock.patch.object(base, "parse_config", parse):
        yield


@dataclass
class Setup:
    engine: CentralEngine
    clock: base.Clock
    store: Store
    desired: DesiredDocs
    order: list[tuple[str, bytes]]  # every node's frames, interleaved across the nodes


async def prepare(
    nodes: int, args: argparse.Namespace, tmp: Path, broker_port: int | None = None
) -> Setup:
    """The engine with its desired documents projected and journaled, and the frames."""
    extra = {} if broker_port is None else {"mqtt": {"host": "127.0.0.1", "port": broker_port}}
    with central_config(extra):
        engine, clock, _running = base.build(nodes, args.tasks, tmp, cold=args.cold)
    store = await Store.open(tmp / "central.db")
    desired = DesiredDocs("central", engine.session, store, clock=clock)
    engine.sync_index(project=False)
    desired.match(engine.index.assignments, engine.index.stops, engine.index.orders)
    engine.desired = desired
    engine.control_step()
    await desired.journals.flush()
    clock.now += 1.0
    per_node = [node_frames(engine, f"gw-{n:05d}", args.updates, clock.now) for n in range(nodes)]
    order = [frame for round_ in zip(*per_node, strict=False) for frame in round_]
    return Setup(engine, clock, store, desired, order)


def freeze_all(engine: CentralEngine, nodes: int) -> None:
    """Every replica frozen, as a quiet fleet's: each node's first frame thaws it."""
    for _ in range(3):  # (the first sweep lets the index read them: a use)
        engine.sweep_cold()
    assert engine.freezer.frozen == nodes, engine.freezer.frozen


def time_replica_peers(engine: CentralEngine, tally: Tally) -> Callable[[], None]:
    """Time each frame central's replica peers handle, until the returned function is
    called (DocPeer is slotted: its method is wrapped meanwhile; the desired documents'
    peers pass through untimed)."""
    original = DocPeer.handle
    timers = {
        id(r.peer): tally.timed_handle(functools.partial(original, r.peer))
        for r in engine.replicas.replicas.values()
    }

    def handle(self: DocPeer, topic: str, payload: bytes) -> None:
        timer = timers.get(id(self))
        if timer is None:
            original(self, topic, payload)
        else:
            timer(topic, payload)

    def untime() -> None:
        DocPeer.handle = original  # type: ignore[method-assign]

    DocPeer.handle = handle  # type: ignore[method-assign]
    return untime


def outcome(setup: Setup) -> dict[str, int]:
    """What central's index and replica peers hold at the end."""
    engine, now = setup.engine, setup.clock.now
    exits_of: dict[str, int] = {}
    for task_id in engine.index.holders:
        for node_id, report in engine.index.copies_of(task_id).items():
            if report.state is TaskState.EXITED and report.updated_at == now:
                exits_of[node_id] = exits_of.get(node_id, 0) + 1
    peers = [r.peer for r in engine.replicas.replicas.values()]
    sent_per_node: dict[str, int] = {}
    for topic, _ in setup.order:
        node_id = topic.rsplit("/", 1)[-1]
        sent_per_node[node_id] = sent_per_node.get(node_id, 0) + 1
    return {
        "exited": sum(exits_of.values()),
        # (one frame per update at these sizes: a node short of its exits lacks an update)
        "behind_nodes": sum(1 for n, sent in sent_per_node.items() if exits_of.get(n, 0) < sent),
        "applied": sum(p.stats["updates_in"] for p in peers),
        "rejected": sum(
            p.stats["rejected_updates"]
            + p.stats["rejected_senders"]
            + p.stats["rejected_signatures"]
            + p.stats["rejected_replays"]
            for p in peers
        ),
        "resyncs": sum(p.stats["resync_requests"] for p in peers),
    }


def sign_all(setup: Setup) -> None:
    """Every frame signed by its node's own Ed25519 key (as a keyed node's peer sends it),
    and every replica peer checking them (:mod:`edgesched.sync.signing`)."""
    ring = KeyRing(Path("/nonexistent"))
    signers: dict[str, Signer] = {}
    signed = []
    for topic, frame in setup.order:
        node_id = topic.rsplit("/", 1)[-1]
        signer = signers.get(node_id)
        if signer is None:
            key = Ed25519PrivateKey.generate()
            signer = signers[node_id] = Signer(node_id, key)
            ring.add(node_id, key.public_key())
        message = wire.Reassembler().feed(frame)
        assert message is not None
        doc = topic.split("/")[3]
        sealed = signer.seal(
            doc, int(message.kind), message.sender, message.epoch, message.msg_id, message.payload
        )
        (out,) = wire.encode(
            message.kind, doc, message.sender, sealed, msg_id=message.msg_id,
            epoch=message.epoch, signed=True,
        )  # fmt: skip
        signed.append((topic, out))
    setup.order[:] = signed
    checking = FrameSigning(None, ring, verifier=VerifyThread())  # (as central's engine)
    for replica in setup.engine.replicas.replicas.values():
        replica.peer.signing = checking


async def measure(
    nodes: int, args: argparse.Namespace, *, authorship: bool = True, signed: bool = False
) -> dict[str, float]:
    """In-process: the frames straight into the replica channels (no broker).
    ``authorship=False``: the replicas' peers check no writer at all (``writers=None``), the
    baseline of what the per-operation authorship check costs (issue 13). ``signed``: every
    frame signed by its node and checked by central (:func:`sign_all`)."""
    with tempfile.TemporaryDirectory() as tmp:
        setup = await prepare(nodes, args, Path(tmp))
        engine, order = setup.engine, setup.order
        if not authorship:
            for replica in engine.replicas.replicas.values():
                replica.peer.writers = None
        if signed:
            sign_all(setup)
        topics = {t: aiomqtt.Topic(t) for t, _ in order}
        if args.cold:
            freeze_all(engine, nodes)
        thaws = engine.freezer.thaws
        fed = 0
        steps = 0
        step_s = 0.0
        # The setup's garbage is collected now, not by a full collection inside the timed
        # window (one over 1,000 nodes' objects took about 1 s here, whenever it landed).
        gc.collect()
        start = time.perf_counter()
        verifier = None
        if signed:
            replica = next(iter(engine.replicas.replicas.values()))
            verifier = replica.peer.signing.verifier if replica.peer.signing else None
        for topic, frame in order:
            channel = engine.session.route(topics[topic])
            assert channel is not None, topic
            channel.handle(topic, frame)
            fed += 1
            if verifier is not None and fed % 50 == 0:
                # (the loop turns, as central's does between socket reads: the checks go to
                # the verifier's thread, the checked messages come back and are merged)
                await asyncio.sleep(0)
            if fed % args.batch == 0:
                t0 = time.perf_counter()
                engine.control_step()
                step_s += time.perf_counter() - t0
                steps += 1
        if verifier is not None:
            await verifier.drain()
            verifier.close()
        t0 = time.perf_counter()
        engine.control_step()
        end = time.perf_counter()
        step_s += end - t0
        elapsed = end - start
        thaws = engine.freezer.thaws - thaws
        seen = outcome(setup)
        await setup.store.close()
    return {
        "nodes": nodes,
        "frames": fed,
        "elapsed": elapsed,
        "rate": fed / elapsed,
        "steps": steps,
        "step_s": step_s,
        "exited": seen["exited"],
        "rejected": seen["rejected"],
        "resyncs": seen["resyncs"],
        "thaws": thaws,
    }


# --- through the broker -------------------------------------------------------------------------


def broker_conf(port: int, queue: int | None) -> str:
    """A mosquitto.conf with the queue limits ``sync.security.broker_config`` deploys
    (:func:`~edgesched.sync.security.queue_settings`) unless ``queue`` sets
    ``max_queued_messages``; anonymous and without ACL or TLS (a loopback benchmark: the
    publisher speaks for every node); ``$SYS`` every second, for the dropped count."""
    lines = [
        "per_listener_settings false",
        "allow_anonymous true",
        "persistence false",
        "log_dest none",
        "sys_interval 1",
    ]
    if os.geteuid() == 0:
        lines.append("user root")  # as root it would switch to `mosquitto` (as localbroker)
    lines += queue_settings() if queue is None else queue_settings(max_queued_messages=queue)
    lines.append(f"listener {port} 127.0.0.1")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def mosquitto(workdir: Path, queue: int | None) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """Mosquitto on a free loopback port for the block; stopped after."""
    exe = mosquitto_path()
    if exe is None:
        raise SystemExit("Mosquitto is not installed: run `make setup`")
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(broker_conf(port, queue))
    proc = subprocess.Popen(
        [exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port, proc=proc)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def broker_dropped(port: int) -> int | None:
    """The broker's dropped-message count, read fresh (its second ``$SYS`` message: the first
    is the retained one, up to ``sys_interval`` old)."""
    values: list[int] = []
    with contextlib.suppress(TimeoutError, aiomqtt.MqttError):
        async with (
            asyncio.timeout(5.0),
            aiomqtt.Client("127.0.0.1", port, identifier="bench-fanin-sys") as client,
        ):
            await client.subscribe(SYS_DROPPED)
            async for message in client.messages:
                values.append(int(bytes(message.payload)))
                if len(values) == 2:
                    break
    return values[-1] if values else None


@dataclass
class Tally:
    """Central's side of the window, counted as it runs (``time.monotonic()``, the
    publisher's clock too)."""

    handled: int = 0
    last_at: float = 0.0  # when the last frame was handled
    handled_at: list[float] = field(default_factory=list)  # when each frame was
    handle_s: float = 0.0
    handle_cpu_s: float = 0.0
    #: (start, end, CPU seconds, the process's CPU clock at its end) of each control step
    steps: list[tuple[float, float, float, float]] = field(default_factory=list)

    def timed_handle(self, handle: Callable[[str, bytes], None]) -> Callable[[str, bytes], None]:
        def timed(topic: str, payload: bytes) -> None:
            t0, c0 = time.monotonic(), time.thread_time()
            handle(topic, payload)
            t1 = time.monotonic()
            self.handle_cpu_s += time.thread_time() - c0
            self.handle_s += t1 - t0
            self.handled += 1
            self.last_at = t1
            self.handled_at.append(t1)

        return timed

    def timed_step(self, step: Callable[[], None]) -> Callable[[], None]:
        def timed() -> None:
            t0, c0 = time.monotonic(), time.thread_time()
            step()
            c1 = time.thread_time()
            self.steps.append((t0, time.monotonic(), c1 - c0, time.process_time()))

        return timed

    def acting_step(self) -> tuple[float, float, float, float] | None:
        """The first step that started after the last frame: every frame acted on at its end."""
        return next((s for s in self.steps if s[0] >= self.last_at), None)


async def start_publisher(frames_file: Path, port: int, rate: float) -> asyncio.subprocess.Process:
    argv = [sys.executable, str(PUBLISHER), "--port", str(port), "--frames", str(frames_file)]
    if rate > 0:
        argv += ["--rate", str(rate)]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    if line.strip() != b"ready":
        raise RuntimeError(f"publisher did not start: {line!r}")
    return proc


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {timeout} s")
        await asyncio.sleep(0.02)


async def spaced_control_loop(engine: CentralEngine, gap_s: float) -> None:
    """``CentralEngine._control_loop`` with at least ``gap_s`` between two steps (``--step-gap-s``):
    what arrives meanwhile is acted on by one step. Not the engine's: a measure of the
    coalescing its loop lacks."""
    while True:
        await wait_event(engine._wake, engine.central.cycle_s)
        engine._wake.clear()
        async with engine._lock:
            engine.control_step()
        await asyncio.sleep(gap_s)


async def measure_broker(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    """Through Mosquitto: a publisher process -> the broker -> central's running session."""
    # On connect every peer of central (two per node) sends its step 1 at once, and aiomqtt
    # logs a warning for each publish made while more than 10 are pending: thousands here.
    logging.getLogger("mqtt").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        with mosquitto(tmp, args.broker_queue) as (port, broker):
            setup = await prepare(nodes, args, tmp, broker_port=port)
            engine, order = setup.engine, setup.order
            frames_file = tmp / "frames.pickle"
            frames_file.write_bytes(pickle.dumps(order))
            publisher = await start_publisher(frames_file, port, args.rate)
            tally = Tally()
            untime = time_replica_peers(engine, tally)
            engine.control_step = tally.timed_step(engine.control_step)  # type: ignore[method-assign]
            control = (
                engine._control_loop()
                if args.step_gap_s <= 0
                else spaced_control_loop(engine, args.step_gap_s)
            )
            loops = [
                asyncio.create_task(engine.session.run(), name="mqtt"),
                asyncio.create_task(control, name="control"),
                asyncio.create_task(setup.desired.journals.run(), name="desired-log"),
            ]
            try:
                peers = [c for c in engine.session.channels if isinstance(c, DocPeer)]
                await until(
                    lambda: (
                        engine.session.connected and all(p.stats["step1_out"] > 0 for p in peers)
                    ),
                    60,
                    "central connected, every peer's step 1 sent",
                )
                if args.cold:
                    freeze_all(engine, nodes)
                thaws = engine.freezer.thaws
                steps_before = len(tally.steps)
                connects = engine.session.stats["connects"]
                step1s = sum(p.stats["step1_out"] for p in peers)
                gc.collect()  # (as in-process)
                profile = cProfile.Profile() if args.profile else None
                cpu0 = time.process_time()
                broker_cpu0 = psutil.Process(broker.pid).cpu_times()
                assert publisher.stdin is not None and publisher.stdout is not None
                if profile is not None:
                    profile.enable()
                publisher.stdin.write(b"go\n")
                await publisher.stdin.drain()
                report_line = asyncio.create_task(publisher.stdout.readline())
                quiet_since = None
                while True:  # every frame in, and a step after it; or nothing more coming
                    await asyncio.sleep(0.02)
                    if tally.handled >= len(order) and tally.acting_step() is not None:
                        break
                    if report_line.done() and tally.acting_step() is not None:
                        quiet_since = quiet_since or time.monotonic()
                        if time.monotonic() - max(quiet_since, tally.last_at) > args.quiet_s:
                            break
                if profile is not None:
                    profile.disable()
                broker_cpu1 = psutil.Process(broker.pid).cpu_times()
                report = json.loads(await asyncio.wait_for(report_line, 60))
                thaws = engine.freezer.thaws - thaws
                reconnects = engine.session.stats["connects"] - connects
                step1s = sum(p.stats["step1_out"] for p in peers) - step1s
            finally:
                for task in loops:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
                untime()
            dropped = await broker_dropped(port)
            await publisher.wait()
            acting = tally.acting_step()
            assert acting is not None
            _, end, _, cpu_end = acting
            window = [s for s in tally.steps[steps_before:] if s[1] <= end]
            seen = outcome(setup)
            await setup.store.close()
    start = report["first"]
    elapsed = end - start
    # How far central fell behind: frames published by each moment a frame was handled (the
    # publishing taken as even over the publisher's window) less the frames handled by then.
    publish_s = max(report["last_ack"] - start, 1e-9)
    behind = max(
        (
            min(len(order), len(order) * (at - start) / publish_s) - (i + 1)
            for i, at in enumerate(tally.handled_at)
        ),
        default=0.0,
    )
    cpu = cpu_end - cpu0
    step_cpu = sum(s[2] for s in window)
    row: dict[str, Any] = {
        "nodes": nodes,
        "frames": len(order),
        "published": report["published"],
        "publish_s": report["last_ack"] - start,
        "max_behind": max(0, round(behind)),
        "publisher_cpu_s": report["cpu_s"],
        "broker_cpu_s": (broker_cpu1.user + broker_cpu1.system)
        - (broker_cpu0.user + broker_cpu0.system),
        "broker_dropped": dropped,
        "received": tally.handled,
        "elapsed": elapsed,
        "rate": seen["applied"] / elapsed,
        "steps": len(window),
        "step_s": sum(s[1] - s[0] for s in window),
        "handle_s": tally.handle_s,
        "cpu_s": cpu,
        "step_cpu_s": step_cpu,
        "handle_cpu_s": tally.handle_cpu_s,
        "rest_cpu_s": cpu - step_cpu - tally.handle_cpu_s,
        "thaws": thaws,
        "reconnects": reconnects,
        "step1_out": step1s,
        **seen,
        "dropped": report["published"] - seen["applied"],
    }
    if profile is not None:
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats("tottime").print_stats(args.profile)
        stats.sort_stats("cumulative").print_stats(args.profile)
        row["profile"] = out.getvalue()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000")
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--updates", type=int, default=20, help="changes per node")
    parser.add_argument("--batch", type=int, default=500, help="frames between two steps")
    parser.add_argument(
        "--cold", action="store_true",
        help="every replica frozen before the first frame (a quiet fleet waking up)",
    )  # fmt: skip
    parser.add_argument("--broker", action="store_true", help="also through Mosquitto")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="frames/s the publisher sends (0: as fast as it goes)")  # fmt: skip
    parser.add_argument("--broker-queue", type=int, default=None,
                        help="max_queued_messages (default: the deployed config's)")  # fmt: skip
    parser.add_argument("--quiet-s", type=float, default=2.0,
                        help="broker: silence after which the rest counts dropped")  # fmt: skip
    parser.add_argument("--step-gap-s", type=float, default=0.0,
                        help="broker: a control loop with this gap after each step, instead "
                        "of the engine's own")  # fmt: skip
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="broker: cProfile central in the window, print the top N")  # fmt: skip
    args = parser.parse_args()
    rows = []
    brokered: list[dict[str, Any]] = []
    for n in (int(x) for x in args.nodes.split(",")):
        row = asyncio.run(measure(n, args))
        rows.append(row)
        print(
            f"{n:>6} nodes, in-process: {row['frames']:,} node updates merged and acted on in "
            f"{row['elapsed']:.2f} s = {row['rate']:,.0f}/s ({row['steps']} control steps "
            f"between them, {row['step_s']:.2f} s of it); {row['exited']:,} exits in central's "
            "index, "
            f"{row['rejected']} rejected, {row['resyncs']} resyncs asked, "
            f"{row['thaws']} frozen replicas thawed",
            flush=True,
        )
        assert row["exited"] == row["frames"], "every update must reach the index"
        gc.collect()
        unchecked = asyncio.run(measure(n, args, authorship=False))
        print(
            f"{n:>6} nodes, in-process, no writer check at all: {unchecked['rate']:,.0f}/s; "
            f"the per-operation authorship check costs "
            f"{unchecked['rate'] / row['rate']:.2f}x the time of the merge without it",
            flush=True,
        )
        gc.collect()
        signed = asyncio.run(measure(n, args, signed=True))
        print(
            f"{n:>6} nodes, in-process, every frame signed (Ed25519) and checked: "
            f"{signed['rate']:,.0f}/s, {signed['exited']:,} exits in central's index; "
            f"signatures cost {row['rate'] / signed['rate']:.2f}x the time of the unsigned "
            f"merge (the authorship check in both)",
            flush=True,
        )
        assert signed["exited"] == signed["frames"], "every signed update must reach the index"
        gc.collect()
        if not args.broker:
            continue
        b = asyncio.run(measure_broker(n, args))
        brokered.append(b)
        pace = f"at {args.rate:,.0f}/s" if args.rate > 0 else "as fast as it goes"
        if args.step_gap_s > 0:
            pace += f"; steps {args.step_gap_s * 1000:g} ms apart at least, not the engine's loop"
        dropped = "?" if b["broker_dropped"] is None else f"{b['broker_dropped']:,}"
        print(
            f"{n:>6} nodes, broker: {b['published']:,} frames published ({pace}: all acked in "
            f"{b['publish_s']:.2f} s), {b['received']:,} reached central, {b['applied']:,} "
            f"merged, {b['exited']:,} exits in central's index; {b['dropped']:,} dropped (the "
            f"broker counted {dropped}; {b['behind_nodes']} nodes left behind, which would "
            f"need a resync; {b['resyncs']} frames found central behind, {b['step1_out']:,} "
            f"step 1 sent; {b['reconnects']} reconnects; central at most "
            f"{b['max_behind']:,} frames behind the publisher); {b['rate']:,.0f}/s merged and "
            f"acted on over {b['elapsed']:.2f} s from the first publish to the step after the last "
            f"frame ({b['steps']} control steps, {b['step_s']:.2f} s of it, merging "
            f"{b['handle_s']:.2f} s); central CPU "
            f"{b['cpu_s']:.2f} s = control steps {b['step_cpu_s']:.2f} + merging "
            f"{b['handle_cpu_s']:.2f} + MQTT client, asyncio and the rest "
            f"{b['rest_cpu_s']:.2f}; publisher CPU {b['publisher_cpu_s']:.2f} s, broker CPU "
            f"{b['broker_cpu_s']:.2f} s; {b['thaws']} thawed; broker / in-process "
            f"{b['rate'] / row['rate']:.2f}x",
            flush=True,
        )
        if "profile" in b:
            print(b["profile"], flush=True)
        if b["exited"] != b["frames"]:
            print(f"  !! {b['frames'] - b['exited']:,} updates never reached central's index")
        gc.collect()
    base_row, top = rows[0], rows[-1]
    print(
        f"\n{top['nodes']} vs {base_row['nodes']} nodes: in-process "
        f"{top['rate'] / base_row['rate']:.2f}x the updates per second"
        + (f", broker {brokered[-1]['rate'] / brokered[0]['rate']:.2f}x" if brokered else "")
    )


if __name__ == "__main__":
    main()
