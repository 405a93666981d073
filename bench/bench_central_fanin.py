"""Central's receive path: node updates merged and acted on per second, without the broker.

Builds central's engine as ``bench_control_step.py`` does (N nodes of ``--tasks`` entries, 70%
running central's assignment). Each node then makes ``--updates`` real changes to its own copy
of its document (a running task exits: a ``TaskReport`` rewritten, authored under the node's
own client id), encoded as the frames its peer would publish: each update with the state
vector the node holds right after it, as ``DocPeer`` sends one update at a time (so central,
once it has applied a frame, is never behind its sender and asks no resync). The setup's
garbage is collected before the timed window starts. The frames are fed, interleaved
across the nodes, through central's own routing (``MqttSession.route``) into the replica
channels' ``handle`` (the path ``_dispatch`` takes for each MQTT message: reassembly, sender
check, per-operation writer check, apply, change callbacks), and the control loop runs a step
after every ``--batch`` frames, as its wake-up would. Printed per size: frames per second
merged and acted on (every exit is in central's index when the run ends: checked), and the
ratio of the largest size to the smallest. The broker is left out on purpose: this is central's
own ceiling; ``bench_central_scale.py`` measures the whole path through Mosquitto.

    .venv/bin/python bench/bench_central_fanin.py [--nodes 100,1000] [--updates 20]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path

import aiomqtt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_control_step as base

from edgesched.central.desired import DesiredDocs
from edgesched.central.engine import CentralEngine
from edgesched.core.task import TaskState
from edgesched.sync import wire
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.schema import TaskReport
from edgesched.sync.store import Store


def node_frames(
    engine: CentralEngine, node_id: str, updates: int, now: float
) -> list[tuple[str, bytes]]:
    """``updates`` exits of the node's running tasks, as the frames its peer publishes."""
    replica = engine.replicas.replicas[node_id].doc
    mine = NodeDoc(replica.name, client_id_for(node_id))
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


async def measure(nodes: int, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        engine, clock, _running = base.build(nodes, args.tasks, Path(tmp), cold=args.cold)
        store = await Store.open(Path(tmp) / "central.db")
        desired = DesiredDocs("central", engine.session, store, clock=clock)
        engine.sync_index(project=False)
        desired.match(engine.index.assignments, engine.index.stops, engine.index.orders)
        engine.desired = desired
        engine.control_step()
        await desired.journals.flush()
        clock.now += 1.0
        per_node = [
            node_frames(engine, f"gw-{n:05d}", args.updates, clock.now) for n in range(nodes)
        ]
        order = [frame for round_ in zip(*per_node, strict=False) for frame in round_]
        topics = {t: aiomqtt.Topic(t) for t, _ in order}
        if args.cold:  # every replica frozen, as a quiet fleet's: each node's first frame thaws it
            for _ in range(3):  # (the first sweep lets the index read them: a use)
                engine.sweep_cold()
            assert engine.freezer.frozen == nodes, engine.freezer.frozen
        thaws = engine.freezer.thaws
        fed = 0
        steps = 0
        # The setup's garbage is collected now, not by a full collection inside the timed
        # window (one over 1,000 nodes' objects took about 1 s here, whenever it landed).
        gc.collect()
        start = time.perf_counter()
        for topic, frame in order:
            channel = engine.session.route(topics[topic])
            assert channel is not None, topic
            channel.handle(topic, frame)
            fed += 1
            if fed % args.batch == 0:
                engine.control_step()
                steps += 1
        engine.control_step()
        elapsed = time.perf_counter() - start
        thaws = engine.freezer.thaws - thaws
        exited = sum(
            1
            for copies in engine.index.copies.values()
            for report in copies.values()
            if report.state is TaskState.EXITED and report.updated_at == clock.now
        )
        rejected = sum(
            r.peer.stats["rejected_updates"] + r.peer.stats["rejected_senders"]
            for r in engine.replicas.replicas.values()
        )
        resyncs = sum(r.peer.stats["resync_requests"] for r in engine.replicas.replicas.values())
        await store.close()
    return {
        "nodes": nodes,
        "frames": fed,
        "elapsed": elapsed,
        "rate": fed / elapsed,
        "steps": steps,
        "exited": exited,
        "rejected": rejected,
        "resyncs": resyncs,
        "thaws": thaws,
    }


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
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        row = asyncio.run(measure(n, args))
        rows.append(row)
        print(
            f"{n:>6} nodes: {row['frames']:,} node updates merged and acted on in "
            f"{row['elapsed']:.2f} s = {row['rate']:,.0f}/s ({row['steps']} control steps "
            f"between them); {row['exited']:,} exits in central's index, "
            f"{row['rejected']} rejected, {row['resyncs']} resyncs asked, "
            f"{row['thaws']} frozen replicas thawed",
            flush=True,
        )
        assert row["exited"] == row["frames"], "every update must reach the index"
    base_row, top = rows[0], rows[-1]
    print(
        f"\n{top['nodes']} vs {base_row['nodes']} nodes: {top['rate'] / base_row['rate']:.2f}x "
        f"the updates per second"
    )


if __name__ == "__main__":
    main()
