"""How long central's SQLite writes hold the store while its event loop computes.

SQLite runs in the store's database thread, each write one job there (``BEGIN``, its
statements, ``COMMIT``), handed back to the event loop once: the write waits for the busy
loop's turn once (about two turns: the hand-back, then the waiting task's wake-up), however
many statements it runs. A transaction block costs one job per call in it plus one for its
end. The thread gives up the GIL around each statement (and each row of an ``executemany``)
and then waits for it while the event loop's thread computes: up to the interpreter's switch
interval each time (5 ms by default). At 10,000 nodes central's snapshot batches held the
store 0.6-3 s (then on aiosqlite's thread: a round trip through the loop per statement, and
those GIL waits), and the fleet journal (each submission) waited behind them. This benchmark
reproduces it in one process: a task keeps the loop busy (``--turn-ms`` of Python work per
turn, as central's receive path and steps do) while the store writes a batch of replica
snapshots (``Store.replace_docs``: one job) and one journal update in a transaction (a block
of one append: two jobs), at Python's default switch interval and at central's
(``SWITCH_INTERVAL_S``), for two batch sizes. Prints the median and worst hold of each, and
the ratio default / central's setting.

    .venv/bin/python bench/bench_store_contention.py [--turn-ms 20] [--repeats 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from edgesched.central.engine import SWITCH_INTERVAL_S
from edgesched.sync.store import Store

SNAPSHOT_BYTES = 28_000  # a node replica's snapshot of 100 packed tasks, uncompressed


async def busy(stop: asyncio.Event, turn_s: float) -> None:
    """The event loop's other work: ``turn_s`` of Python between two awaits."""
    while not stop.is_set():
        started = time.perf_counter()
        while time.perf_counter() - started < turn_s:
            sum(range(1000))
        await asyncio.sleep(0)


async def holds(interval: float, docs: int, args: argparse.Namespace) -> tuple[float, ...]:
    """(median, worst) seconds of a snapshot batch and of a journal update's transaction."""
    sys.setswitchinterval(interval)
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp) / "central.db")
        blob = os.urandom(SNAPSHOT_BYTES)
        stop = asyncio.Event()
        loop_work = asyncio.create_task(busy(stop, args.turn_ms / 1000))
        batches, journals = [], []
        try:
            for _ in range(args.repeats):
                started = time.perf_counter()
                await store.replace_docs([(f"node-gw{i}", blob, 0) for i in range(docs)])
                batches.append(time.perf_counter() - started)
                started = time.perf_counter()
                async with store.transaction():
                    await store.append_update("fleet", b"x" * 500)
                journals.append(time.perf_counter() - started)
        finally:
            stop.set()
            await loop_work
            await store.close()
    return (statistics.median(batches), max(batches), statistics.median(journals), max(journals))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turn-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    default = sys.getswitchinterval()
    print(f"event loop busy {args.turn_ms:g} ms a turn; holds in ms (median / worst)")
    print(f"{'snapshots':>10}{'switch (ms)':>13}{'batch':>16}{'journal update':>18}")
    for docs in (36, 72):
        rows = {}
        for interval in (default, SWITCH_INTERVAL_S):
            rows[interval] = asyncio.run(holds(interval, docs, args))
            b50, bmax, j50, jmax = (v * 1000 for v in rows[interval])
            print(f"{docs:>10}{interval * 1000:>13.1f}{b50:>9.0f} / {bmax:<5.0f}"
                  f"{j50:>11.0f} / {jmax:<5.0f}")  # fmt: skip
        ratio = rows[default][0] / rows[SWITCH_INTERVAL_S][0]
        print(f"{'':>10}batch hold, default / central's setting: {ratio:.1f}x")
    sys.setswitchinterval(default)


if __name__ == "__main__":
    main()
