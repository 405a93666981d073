"""What central writes to SQLite to keep its replicas of the nodes' documents, per change.

Central's snapshot pass (``central/replicas.py``, every ``snapshot_s``) used to write each
replica that changed as a whole snapshot: ~29 KB for a node of 100 tasks, for a change of one
task. It now appends the updates the replica applied to its log and folds the log into a
snapshot once it holds half the snapshot's bytes. This bench runs both on the same replicas
and the same changes, over a real SQLite store, with central's classes:

* ``--nodes`` replicas (500 and 2,000 by default) of node documents seeded as the scale
  harness seeds them (``bench_central_scale.py``: 100 task entries a node, packed);
* ``--rounds`` passes (120); before each, a sixth of the nodes (the same ones each time)
  change one task entry, its state and time: a node changing a task every ~30 s and a pass
  every 5 s as in the scale harness, the changing nodes over long enough (120 changes each)
  for their logs to fold into snapshots twice, so the figures include the folds;
* **snapshots**: every changed replica written whole at each pass (what central did);
  **log**: the pass as it is now.

Printed per size and mode: bytes handed to SQLite per change, bytes the process wrote to
storage per change (``/proc/self/io``: the WAL, its checkpoints, the database file; this
process writes nothing else meanwhile), and the passes' time per change; then the
ratio of the two modes and the growth from the smaller fleet to the larger (flat: per change).

    .venv/bin/python bench/bench_replica_persistence.py [--nodes 500,2000] [--rounds 120]

About 2 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
from bench_central_scale import Scale, SeedTexts, build_node_doc, node_ids

from edgesched.central.replicas import NodeReplicas
from edgesched.core.task import TaskState
from edgesched.sync.doc import NodeDoc
from edgesched.sync.session import Endpoint, MqttSession
from edgesched.sync.store import Store


def written() -> int:
    """Bytes this process has caused to be written to storage (``/proc/self/io``
    ``write_bytes``: SQLite's WAL, its checkpoints, the database file)."""
    return int(psutil.Process().io_counters().write_bytes)


async def run(nodes: int, rounds: int, mode: str, seed: int) -> dict[str, float]:
    """``rounds`` passes over ``nodes`` replicas in ``mode`` (``snapshots`` or ``log``)."""
    texts = SeedTexts(Scale(nodes=nodes), time.time())
    writers: dict[str, NodeDoc] = {n: build_node_doc(n, texts) for n in node_ids(nodes)}
    outbox: dict[str, list[bytes]] = {n: [] for n in writers}  # each node's updates, to send
    for node_id, writer in writers.items():
        writer.on_local_update(outbox[node_id].append)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "central.db"
        async with await Store.open(path) as store:
            session = MqttSession(Endpoint("127.0.0.1", 1883, "central"))  # never started
            replicas = NodeReplicas("central", session, store=store)
            for node_id, writer in writers.items():
                replicas.add(node_id).doc.apply_remote(writer.snapshot(), sender=node_id)
            await replicas.persist_changed()  # every replica's first snapshot
            handed = 0
            replace_docs, append = store.replace_docs, store.append_updates

            async def counted_replace(docs: Any) -> list[str]:
                nonlocal handed
                handed += sum(len(s) for _, s, _ in docs)
                return await replace_docs(docs)

            async def counted_append(runs: Any, **kwargs: Any) -> dict[str, int]:
                nonlocal handed
                handed += sum(len(u) for run in runs.values() for u in run)
                return await append(runs, **kwargs)

            store.replace_docs = counted_replace  # type: ignore[method-assign]
            store.append_updates = counted_append  # type: ignore[method-assign]
            rng = random.Random(seed)
            ids = list(writers)
            changing = rng.sample(ids, max(1, nodes // 6))
            on_disk = written()
            changes = 0
            busy = 0.0
            for r in range(rounds):
                for node_id in changing:
                    writer = writers[node_id]
                    task_id = f"{node_id}-t{rng.randrange(100):03d}"
                    state = (TaskState.RUNNING, TaskState.EXITED)[r % 2]
                    report = writer.task(task_id)
                    assert report is not None
                    writer.put_task(task_id, replace(report, state=state, updated_at=r + 0.5))
                    replica = replicas.replicas[node_id]
                    for update in outbox[node_id]:
                        replica.doc.apply_remote(update, sender=node_id)
                    outbox[node_id].clear()
                    if mode == "snapshots":
                        replica.restart_log()  # (each change written whole: as before)
                    changes += 1
                start = time.perf_counter()
                await replicas.persist_changed()
                busy += time.perf_counter() - start
            grown = written() - on_disk
            # the store still holds what the replicas hold
            for node_id in rng.sample(ids, 20):
                back = await NodeDoc.load_from(store, f"node-{node_id}", 7)
                assert back.content_hash() == replicas.replicas[node_id].doc.content_hash()
    return {"handed": handed / changes, "disk": grown / changes, "busy_us": 1e6 * busy / changes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="500,2000", help="comma-separated fleet sizes")
    parser.add_argument("--rounds", type=int, default=120, help="snapshot passes")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    if len(sizes) < 2:
        parser.error("--nodes needs two sizes at least (the growth is a ratio)")
    print(
        f"replica persistence: {args.rounds} passes, the same sixth of the nodes changing one "
        "task before each (100 task entries a node)"
    )
    print(f"{'nodes':>7} {'mode':>10} {'to SQLite B/change':>19} {'written B/change':>17} "
          f"{'pass us/change':>15}")  # fmt: skip
    results: dict[tuple[int, str], dict[str, float]] = {}
    for n in sizes:
        for mode in ("snapshots", "log"):
            r = results[n, mode] = asyncio.run(run(n, args.rounds, mode, args.seed))
            print(f"{n:>7,} {mode:>10} {r['handed']:>19,.0f} {r['disk']:>17,.0f} "
                  f"{r['busy_us']:>15,.0f}")  # fmt: skip
    for n in sizes:
        old, new = results[n, "snapshots"], results[n, "log"]
        print(
            f"{n:,} nodes: the log writes x{old['handed'] / new['handed']:.1f} fewer bytes to "
            f"SQLite (x{old['disk'] / max(new['disk'], 1):.1f} written to storage), the "
            f"passes take x{old['busy_us'] / new['busy_us']:.1f} less of the loop"
        )
    a, b = sizes[0], sizes[-1]
    growth = results[b, "log"]["handed"] / results[a, "log"]["handed"]
    print(f"log: bytes per change x{growth:.2f} from {a:,} to {b:,} nodes (flat: per change)")
    day = 10_000 / 30 * 86_400  # 10,000 nodes each changing a task every 30 s
    print(
        f"at 10,000 nodes changing a task every 30 s: "
        f"{results[b, 'snapshots']['handed'] * day / 1e9:,.0f} GB a day to SQLite as "
        f"snapshots, {results[b, 'log']['handed'] * day / 1e9:,.1f} GB with the log"
    )


if __name__ == "__main__":
    main()
