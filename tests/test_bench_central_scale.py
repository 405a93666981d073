"""The central scale harness (bench/bench_central_scale.py) at a tiny size: the real engine, a
real Mosquitto and one simulator process for 8 nodes, a few seconds of submissions and a heal.
Its figures must be real: the seeded assignments projected by the running engine into each
node's desired-state document and synced to that node's replica, steps timed, every placed
submission seen (through its desired document) by the node central named, the healed node
converged both ways, what the nodes published all applied at central, and each node hearing
central's documents (policy, its desired document) from central only, as a real node does."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import pickle
import random
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_central_scale as bench
from pycrdt import YSyncMessageType

from edgesched.core.policy import PolicyMode
from edgesched.sync import wire
from edgesched.sync.doc import NodeDoc, PolicyDoc, client_id_for, desired_doc_name
from edgesched.sync.peer import DocPeer
from edgesched.sync.topics import HEARTBEAT_TOPIC


def test_nodes_hear_centrals_documents_from_the_centrals_only() -> None:
    """The simulator subscribes what real nodes' sessions do: the policy and each node's
    desired document on the centrals' sender topics only (no ``+``, so no other node's step 1
    reaches a node), each node's own document from every peer, the heartbeat."""
    ids = ["sim00000", "sim00001"]
    topics = [t for t, _ in bench.node_subscriptions(ids)]
    assert len(topics) == len(set(topics))
    assert set(topics) == {
        "edgesched/v1/doc/policy/sync/central",
        HEARTBEAT_TOPIC,
        "edgesched/v1/doc/node-sim00000/sync/+",
        "edgesched/v1/doc/node-sim00001/sync/+",
        "edgesched/v1/doc/desired-sim00000/sync/central",
        "edgesched/v1/doc/desired-sim00001/sync/central",
        # central's answers to each node's own step 1s, which only that node hears
        "edgesched/v1/doc/desired-sim00000/reply/sim00000/central",
        "edgesched/v1/doc/desired-sim00001/reply/sim00001/central",
        "edgesched/v1/doc/policy/reply/sim00000/central",  # and to their policy step 1s
        "edgesched/v1/doc/policy/reply/sim00001/central",
    }
    # A real node's policy peer (listen_to the centrals) hears these, and marks its step 1.
    for node_id in ids:
        policy = DocPeer(PolicyDoc("policy", client_id_for(node_id)), node_id,
                         listen_to=bench.CENTRALS)  # fmt: skip
        assert policy.replies and set(policy.routes) <= set(topics)
    # The feed's peer is built as a real node's (listen_to the centrals), and routes so.
    feed = bench.AssignmentFeed("sim00000")
    peer = feed.peer()
    assert peer.routes == feed.routes
    assert feed.routes == (
        "edgesched/v1/doc/desired-sim00000/sync/central",
        "edgesched/v1/doc/desired-sim00000/reply/sim00000/central",
    )
    real = DocPeer(feed.doc, "sim00000", listen_to=bench.CENTRALS)  # edge/engine.py's
    assert {t for t, _ in real.subscriptions} == set(feed.routes)
    assert feed.node_doc("sim00000") == desired_doc_name("sim00000")


async def test_the_harness_measures_a_tiny_fleet(tmp_path: Path) -> None:
    scale = bench.Scale(
        nodes=8,
        tasks_per_node=10,
        rate=4.0,
        run_s=1.0,
        churn_s=2.0,
        telemetry_s=1.0,
        steady_s=4.0,
        offline_s=2.0,
        converge_s=20.0,
        drain_s=10.0,
        up_s=20.0,
        budget_s=50.0,
    )
    broker = bench.start_broker(tmp_path)
    try:
        result = await bench.run_size(scale, broker.port, tmp_path)
        listening = bench.listener_pid(broker.port)
    finally:
        broker.stop()
    assert result["finished"], result["notes"]
    assert result["seeded_assignments"] == 8 * 7  # 70% of each node's 10 entries
    # Central restarted from the seeded store: its desired documents held them already.
    assert result["seed_s"] > 0 and result["restart_s"] > 0 and result["restart_writes"] == 0
    # Its index holds them, and every node's replica of its desired document got its own.
    assert result["projected_assignments"] == 8 * 7
    assert result["desired_synced"] == 8 and result["desired_held"] == 8 * 7
    assert result["fleet_up_s"] is not None and result["fleet_up_s"] < 20
    # Control steps ran in the window and were timed.
    assert result["steps"] > 0 and result["step_p50_ms"] > 0
    assert result["step_p99_ms"] >= result["step_p50_ms"]
    # Every submission was placed, and seen by the node central placed it on.
    assert result["submitted"] >= 10 and result["placed"] == result["submitted"]
    assert result["refused"] == 0
    assert result["seen"] == result["placed"] and result["seen_wrong_node"] == 0
    assert 0 < result["seen_p50_ms"] <= result["seen_p99_ms"] < 5000
    # ... each in a desired-state frame central published (the broker's PUBACK)
    assert result["assignments_published"] == result["placed"]
    assert result["projected_at_once"] == result["placed"]  # not left for the next step
    assert 0 < result["published_p50_ms"] <= result["published_p99_ms"] < 5000
    # The heal: 10% of 8 nodes is one node, which went offline and converged again (central's
    # replica of its document, and its replica of its desired document, byte-equal).
    assert result["healed"] == 1 and result["converged"] == 1
    assert 0 < result["heal_p99_s"] < 20
    # Counts add up: central applied every document message the nodes published.
    assert result["published"] > 0 and result["not_applied"] == 0
    assert result["rejected"] == 0 and result["broker_dropped"] == 0
    assert result["merged"] > 0 and result["merged_per_s"] > 0
    counts = result["sim_counts"]
    assert counts["policy_step1_sent"] == 8 + 1  # each node on connect, the healed one again
    # ... marked, as a real node's: central answered each on that node's reply topic alone
    assert counts["policy_replies_from_central"] >= counts["policy_step1_sent"]
    assert counts["desired_step1_out"] >= 8 + 1  # each desired peer's too (and resyncs)
    assert counts["desired_step2_in"] >= 8 + 1  # central answered each
    assert counts["desired_frames_from_central"] > 0
    assert counts["desired_rejected_updates"] == counts["desired_rejected_senders"] == 0
    assert counts["telemetry"] > 0
    # Central's documents reached the nodes from central only: its policy answers to the
    # nodes' step 1s (their bytes counted), nothing of another node's.
    assert counts["frames_not_from_central"] == 0
    assert counts["policy_frames_from_central"] > 0 and result["in_policy_mb_h"] > 0
    assert result["in_desired_mb_h"] > 0 and result["in_heartbeat_mb_h"] > 0
    # Central's own process, and bytes both ways for every node.
    assert result["cpu_s"] > 0 and result["rss_mb"] > 20
    assert result["in_mb_h"] > 0 and result["out_mb_h"] > 0
    assert result["out_node_doc_mb_h"] > 0 and result["out_telemetry_mb_h"] > 0
    assert result["out_policy_mb_h"] > 0 and result["out_desired_mb_h"] > 0  # (the heal)
    assert result["sim_cpu_share"] is not None and result["sim_cpu_share"] > 0
    # Central logged no error (warnings are allowed: the healed node's will, say).
    assert "ERROR" not in result["central_log"], result["central_errors"]
    # Where central's memory is: its documents, live or frozen, all of them counted
    [memory] = [n for n in result["notes"] if n.startswith("central's memory")]
    found = re.search(
        r"documents live (\d+) \((\d+) node replicas, (\d+) desired-state\), frozen (\d+)", memory
    )
    assert found is not None, memory
    live, replicas, desired, frozen = (int(x) for x in found.groups())
    assert replicas + desired == live
    assert live + frozen == 2 * 8  # each node's replica and its desired-state document
    if sys.implementation.name == "cpython" and sys.platform == "linux":
        assert "pymalloc: " in memory and "anonymous" in memory
    # ... and the broker's CPU (found by its listening port) and the machine's, by phase
    assert listening == broker.proc.pid
    [cpu] = [n for n in result["notes"] if n.startswith("CPU by phase")]
    assert "steady: broker " in cpu and "machine busy max" in cpu
    [sends] = [n for n in result["notes"] if n.startswith("central's publishes")]
    assert "unread on central's socket p50 / max" in sends and "unsent max" in sends
    table = bench.table([result, result])
    assert "control step p99 (ms)" in table and "x1.0" in table and "finished" in table


def test_the_published_tail_is_split_where_its_time_went() -> None:
    placed: dict[str, tuple[float, float, str | None]] = {
        "fast": (0.0, 0.01, "gw-1"),
        "slow": (10.0, 10.1, "gw-2"),  # 0.1 s in submit, 0.2 to publish, 0.3 to its PUBACK
        "healed": (20.0, 20.05, "gw-3"),
    }
    published = {"fast": 0.05, "slow": 10.6, "healed": 20.5}
    handed = {"fast": 0.02, "slow": 10.3, "healed": 20.1}
    note = bench.published_tail_note(placed, published, handed, {"gw-3"})
    assert note is not None
    assert note.startswith("published past 200 ms: 2 of 3, 1 of them on a node of the heal")
    assert "in engine.submit max 100 ms" in note
    assert "then to publish max 200 ms, then to its PUBACK max 400 ms" in note
    assert "100+200+300" in note and "50+50+400" in note
    assert bench.published_tail_note(placed, {"fast": 0.05}, handed, set()) is None


def test_pymalloc_is_read_from_the_interpreters_own_report() -> None:
    stats = bench.pymalloc_stats()
    if not hasattr(sys, "_debugmallocstats"):
        assert stats == {}
        return
    assert stats["arenas"] > 0 and stats["arena_bytes"] >= stats["in_use"] > 0
    before = stats["in_use"]
    held = [object() for _ in range(200_000)]  # ~3 MB of small objects
    assert bench.pymalloc_stats()["in_use"] > before + 2_000_000
    del held


def test_seeded_texts_are_what_the_classes_write() -> None:
    """The seeder writes each node's entries as the template node's packed text with the
    node's id in place: exactly what ``NodeDoc.put_task`` and ``PolicyDoc.assign`` of a
    packed document write for that node."""
    scale = bench.Scale(nodes=20, tasks_per_node=12)
    now = 1_700_000_000.0
    texts = bench.SeedTexts(scale, now)
    for node_id in ("sim00000", "sim00007", "sim12345"):
        built = bench.build_node_doc(node_id, texts)
        own = NodeDoc(f"node-{node_id}", client_id_for(node_id))
        own.packed = True
        for task_id, report in bench.seeded_tasks(node_id, scale, now):
            own.put_task(task_id, report)
        assert built.tasks() == own.tasks()
        assert dict(built.root("tasks").items()) == dict(own.root("tasks").items())
        registration = built.registration()
        assert registration is not None and registration.reads_packed
        fleet = PolicyDoc("fleet", client_id_for("central"))
        fleet.packed = True
        for task_id, entry in bench.seeded_assignments(node_id, scale, now):
            fleet.assign(task_id, entry)
        assert dict(fleet.root("assignments").items()) == dict(texts.assignments_of(node_id))
    assert bench.running_tasks("sim00003", scale) == [
        t for t, r in bench.seeded_tasks("sim00003", scale, now) if r.active
    ]


def make_simulator(tmp_path: Path, ids: list[str], policy: PolicyDoc, port: int = 1) -> Any:
    """A simulator of ``ids`` holding ``policy``'s replica, as the harness starts one (its
    pipe's other end returned too)."""
    scale = bench.Scale(nodes=len(ids), tasks_per_node=4, telemetry_s=60.0, churn_s=3600.0)
    texts = bench.SeedTexts(scale, 1_700_000_000.0)
    nodes = {i: bench.build_node_doc(i, texts).snapshot() for i in ids}
    (tmp_path / "nodes.pickle").write_bytes(pickle.dumps(nodes))
    (tmp_path / "policy.snapshot").write_bytes(policy.snapshot())
    plan = bench.SimPlan(0, tuple(ids), port, str(tmp_path / "policy.snapshot"), scale,
                         str(tmp_path / "nodes.pickle"))  # fmt: skip
    ours, theirs = mp.Pipe()
    return bench.Simulator(plan, theirs), ours


def only_published(fake: FakeClient, topic: str) -> wire.SyncPayload:
    """The one frame ``fake`` published, on ``topic``, decoded."""
    [(published_to, frame)] = fake.published
    assert published_to == topic
    message = wire.Reassembler().feed(frame)
    assert message is not None
    return wire.decode_sync(message.kind, message.payload)


class FakeClient:
    """What :meth:`Simulator.dispatch` reads (``messages``) and writes (``publish``)."""

    def __init__(self, incoming: list[tuple[str, bytes]]) -> None:
        self.incoming = incoming
        self.published: list[tuple[str, bytes]] = []

    @property
    def messages(self) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            for topic, payload in self.incoming:
                yield SimpleNamespace(topic=SimpleNamespace(value=topic), payload=payload)

        return gen()

    async def publish(self, topic: str, payload: bytes, qos: int = 0, **_: Any) -> None:
        self.published.append((topic, payload))


async def test_central_policy_answers_on_reply_topics_reach_their_asker_only(
    tmp_path: Path,
) -> None:
    """Central's answers to a node's marked policy step 1 come on that node's reply topic:
    its step 2 is applied to the simulator's policy replica and counted as the asker's bytes
    only (no other node's, none shared), and its step 1 back is answered by the asker alone,
    on the asker's sender topic. (Before, the first such answer killed the dispatch loop with
    a KeyError, silently: the fleet never came up with the mark.)"""
    central = PolicyDoc("policy", client_id_for(bench.CENTRAL_ID))
    central.set_mode(PolicyMode.BALANCE)
    sim, _pipe = make_simulator(tmp_path, ["sim00000", "sim00001", "sim00002"], central)
    for node in sim.nodes.values():
        node.online = True
    sim.online_count = len(sim.nodes)
    # what the node sends: marked (central answers on its reply topic)
    asker = sim.nodes["sim00000"]
    fake = FakeClient([])
    sim.client = fake
    await sim.policy_step1(asker)
    sync = only_published(fake, "edgesched/v1/doc/policy/sync/sim00000")
    assert sync.step == YSyncMessageType.SYNC_STEP1
    assert wire.split_reply_mark(sync.data) == (sim.policy.state_vector(), True)
    # central moved on since the replica's snapshot: its step 2 brings the change
    central.set_mode(PolicyMode.ENERGY)
    enc = wire.encode  # central's frames, as its peer publishes them
    step2 = enc(wire.Kind.SYNC, "policy", central.client_id,
                wire.step2_payload(central.diff(sim.policy.state_vector())))[0]  # fmt: skip
    # ... and a step 1 of a central that lacks something, to another node's reply topic
    empty = PolicyDoc("policy", client_id_for("central-b"))
    step1 = enc(wire.Kind.SYNC, "policy", empty.client_id,
                wire.step1_payload(empty.state_vector()))[0]  # fmt: skip
    fake = FakeClient([
        (wire.reply_topic("policy", "sim00000", bench.CENTRAL_ID), step2),
        (wire.reply_topic("policy", "sim00001", bench.CENTRAL_ID), step1),
    ])  # fmt: skip
    sim.client = fake
    asker.bytes_in = 0
    await asyncio.wait_for(sim.dispatch(fake), 10)
    assert sim.counts["policy_replies_from_central"] == 2
    assert sim.counts["policy_frames_from_central"] == 2
    assert sim.policy.mode() == PolicyMode.ENERGY  # the one replica all nodes share
    assert sim.policy.content_hash() == central.content_hash()
    assert asker.bytes_in == len(step2)
    assert sim.nodes["sim00001"].bytes_in == len(step1)
    assert sim.nodes["sim00002"].bytes_in == 0 and sim.shared == 0  # nobody else paid
    assert sim.received["policy"] == len(step2) + len(step1)
    # central's step 1 to sim00001 is answered by sim00001 alone, on its sender topic
    assert sim.counts["policy_step1_heard"] == sim.counts["policy_answers"] == 1
    answer = only_published(fake, "edgesched/v1/doc/policy/sync/sim00001")
    assert answer.step == YSyncMessageType.SYNC_STEP2
    assert empty.apply_remote(answer.data, sender="sim00001") is not None
    assert empty.content_hash() == central.content_hash()


async def test_a_simulator_whose_loop_dies_exits_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A simulator loop that raises ends the simulator (its process exits non-zero and the
    harness says so) instead of leaving its nodes deaf while the harness waits for them. (The
    broker logs, as ``--broker-log`` has it, the simulator's connection and its end.)"""
    broker = bench.start_broker(tmp_path, log=str(tmp_path / "broker.log"))
    try:
        sim, pipe = make_simulator(
            tmp_path, ["sim00000"], PolicyDoc("policy", client_id_for("central")), broker.port
        )

        async def broken(client: Any) -> None:
            raise KeyError("policy_replies_from_central")

        monkeypatch.setattr(sim, "dispatch", broken)
        with pytest.raises(bench.SimulatorDied, match="dispatch") as died:
            await asyncio.wait_for(sim.run(), 30)
        assert isinstance(died.value.__cause__, KeyError)
        pipe.close()
        # the broker logs the end of the connection when it reads it: on a loaded machine
        # after the simulator has exited (stopped at once, it once terminated first)
        deadline = time.monotonic() + 10
        while "disconnected" not in (tmp_path / "broker.log").read_text():
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    finally:
        broker.stop()
    log = (tmp_path / "broker.log").read_text()
    assert "edgesched-bench-sim-0" in log and "disconnected" in log


def test_a_sockets_kernel_queues_are_read() -> None:
    """What central's connection has received and not yet read, from the kernel (the
    harness's probe of whether a PUBACK waits behind the heal's inbound documents)."""
    import socket

    left, right = socket.socketpair()
    try:
        assert bench.socket_queues(right) == (0, 0)
        left.sendall(b"x" * 1000)
        deadline = time.monotonic() + 5
        while bench.socket_queues(right)[0] < 1000:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert bench.socket_queues(right)[0] == 1000
        right.recv(400)
        assert bench.socket_queues(right)[0] == 600
    finally:
        left.close()
        right.close()
    assert bench.socket_queues(right) == (0, 0)  # closed: nothing to read
    assert bench.socket_queues(None) == (0, 0)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 8), st.none() | st.integers(0, 99)), min_size=1, max_size=40
    ),
    seed=st.integers(0, 2**16),
    freeze=st.booleans(),
)
def test_the_heal_check_compares_deletions_once_the_vectors_are_equal(
    ops: list[tuple[int, int | None]], seed: int, freeze: bool
) -> None:
    """The harness takes a healed node as converged once central's replica has the node's
    state vector and the same delete set, as bytes (the diff against that vector). With the
    vectors equal (the same operations), those bytes are equal exactly when the content is:
    delivered out of order, a delete-only update that comes before what it deletes is lost
    by pycrdt (the content differs, and so do the bytes); the node's answer to a step 1,
    which carries its whole delete set, brings both to equal."""
    node = NodeDoc("node-gw", client_id_for("gw"))
    sent: list[bytes] = []
    node.on_local_update(sent.append)
    for key, value in ops:
        if value is None:
            node.remove_task(f"t{key}")
        else:
            node.put_task(f"t{key}", bench_report(value))
    replica = NodeDoc("node-gw", client_id_for("central"))
    shuffled = list(sent)
    random.Random(seed).shuffle(shuffled)
    for update in shuffled:
        replica.apply_remote(update, sender="gw")
    sv = node.state_vector()
    if replica.state_vector() == sv:  # (else some wait for a dependency: no check yet)
        same_content = replica.content_hash() == node.content_hash()
        assert (replica.diff(sv) == node.diff(sv)) == same_content
    replica.apply_remote(node.diff(replica.state_vector()), sender="gw")  # the node's step 2
    if freeze:
        replica.freeze()  # (central answers a frozen one from its bytes)
    assert replica.diff(sv) == node.diff(sv)
    assert replica.content_hash() == node.content_hash()


def bench_report(value: int) -> Any:
    from edgesched.core.task import TaskState
    from edgesched.sync.schema import TaskReport

    return TaskReport(state=(TaskState.RUNNING, TaskState.EXITED)[value % 2], updated_at=value)
