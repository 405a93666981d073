"""Central's telemetry memory: the per-node ring (:class:`TelemetryRing`) against the deque of
:class:`Telemetry` objects it replaced, after a full hour of samples.

For each fleet size N (250 and 1,000 nodes by default) and each layout, fresh child processes
(so that one layout's freed memory does not hide the next one's RSS growth) fill a collector
with N nodes × ``keep`` samples (720: one hour at 5 s), all through ``handle(topic, payload)``
with the payload a node publishes (``json.dumps`` of :meth:`Telemetry.to_json`, checked byte
for byte; the figures vary per node and sample). Printed per size and layout:

* **B/sample**: what ``tracemalloc`` holds after the fill, less before, over N×keep (a child
  of its own: tracemalloc slows ``handle()`` ~3x and its bookkeeping inflates RSS);
* **B/s RSS**: the process's RSS growth over the same fill, untraced (psutil), over N×keep:
  coarser (the allocators' arenas and free lists), a check on the traced figure;
* **fill ns**: ``handle()`` per sample over that fill (the rings growing);
* **handle ns**: ``handle()`` per sample over 60 more samples a node (5 minutes, the rings
  full and wrapping: the steady state). Most of it is ``parse_telemetry`` (~6 µs);
* **since µs**: ``samples(node, since)`` of the last 10 minutes (121 samples), per call;
* **old/new**: the ratio of each figure, the deque's over the ring's.

Then each layout's growth from the first size to the last (memory should grow with N×keep
and nothing more) and what an hour at 10,000 nodes comes to. The old layout is the collector
before the ring (a ``deque(maxlen=keep)`` of Telemetry per node), reimplemented here.

    .venv/bin/python bench/bench_telemetry_memory.py [--sizes 250,1000] [--keep 720]

~70 s by default on a 2-core machine (the traced fills, ~25 µs a sample); ``--sizes
1000,4000`` takes ~5 minutes.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
import tracemalloc
from collections import deque
from typing import Any, Protocol

import psutil

from edgesched.central.telemetry import TelemetryCollector
from edgesched.sync.telemetry import Telemetry, parse_telemetry, telemetry_topic

STEP_S = 5.0
T0 = 1_700_000_000.0
EXTRA_STEPS = 60  # 5 minutes more, timed
SINCE_S = 600.0  # samples() of the last 10 minutes
LAYOUTS = ("deque", "ring")


class Collector(Protocol):
    def handle(self, topic: str, payload: bytes) -> None: ...
    def samples(self, node_id: str, since: float = 0.0) -> list[Telemetry]: ...


class DequeCollector:
    """The collector before the ring: a deque of Telemetry objects per node (baseline)."""

    def __init__(self, *, keep: int = 720, max_nodes: int = 10_000) -> None:
        self.keep = keep
        self.max_nodes = max_nodes
        self.series: dict[str, deque[Telemetry]] = {}
        self.rejected = 0

    def samples(self, node_id: str, since: float = 0.0) -> list[Telemetry]:
        return [s for s in self.series.get(node_id, ()) if s.at >= since]

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            node_id, sample = parse_telemetry(topic, payload)
        except ValueError:
            self.rejected += 1
            return
        series = self.series.get(node_id)
        if series is None:
            if len(self.series) >= self.max_nodes:
                self.rejected += 1
                return
            series = self.series[node_id] = deque(maxlen=self.keep)
        if series and sample.at < series[-1].at:
            return
        series.append(sample)


def bodies(count: int, seed: int = 7) -> list[bytes]:
    """Payload tails (everything after ``"at"``) as a node sends them: cpu as psutil gives
    it (a percent to 0.1, over 100), mem a ratio, power a model's output, a few tasks."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        sample = Telemetry(
            at=T0,
            cpu_util=round(rng.uniform(0, 100), 1) / 100,
            mem_util=rng.uniform(3, 60) / 64,
            power_w=rng.uniform(40, 300),
            tasks_running=rng.randrange(0, 12),
        )
        sent = json.dumps(sample.to_json()).encode()
        head = payload_head(T0)
        assert sent.startswith(head), sent
        out.append(sent[len(head) :])
    return out


def payload_head(at: float) -> bytes:
    return b'{"at": ' + repr(at).encode() + b", "


def fill(collector: Collector, topics: list[str], tails: list[bytes], steps: range) -> None:
    handle = collector.handle
    count = len(tails)
    for k in steps:
        head = payload_head(T0 + STEP_S * k)
        for i, topic in enumerate(topics):
            handle(topic, head + tails[(i * 31 + k) % count])


def child(layout: str, nodes: int, keep: int, traced: bool) -> dict[str, Any]:
    """One fill of one layout; ``traced``: tracemalloc on over the fill (its figure only),
    else RSS and the timings."""
    topics = [telemetry_topic(f"node-{i:05d}") for i in range(nodes)]
    tails = bodies(997)
    collector: Collector = (
        DequeCollector(keep=keep, max_nodes=nodes)
        if layout == "deque"
        else TelemetryCollector(keep=keep, max_nodes=nodes)
    )
    samples = nodes * keep
    gc.collect()
    if traced:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        fill(collector, topics, tails, range(keep))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        return {"traced_b": held / samples, "traced_mb": held / 1e6}
    process = psutil.Process()
    rss0 = process.memory_info().rss
    began = time.perf_counter()
    fill(collector, topics, tails, range(keep))
    fill_ns = (time.perf_counter() - began) / samples * 1e9
    gc.collect()
    rss = process.memory_info().rss - rss0

    began = time.perf_counter()
    fill(collector, topics, tails, range(keep, keep + EXTRA_STEPS))
    handle_ns = (time.perf_counter() - began) / (nodes * EXTRA_STEPS) * 1e9

    since = T0 + STEP_S * (keep + EXTRA_STEPS - 1) - SINCE_S
    asked = [f"node-{i:05d}" for i in range(0, nodes, max(1, nodes // 1000))]
    began = time.perf_counter()
    got = 0
    for node in asked:
        got += len(collector.samples(node, since))
    since_us = (time.perf_counter() - began) / len(asked) * 1e6
    return {
        "samples": samples,
        "rss_b": rss / samples,
        "fill_ns": fill_ns,
        "handle_ns": handle_ns,
        "since_us": since_us,
        "since_n": got / len(asked),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="250,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--keep", type=int, default=720, help="samples kept a node")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # layout nodes traced
    args = parser.parse_args()
    if args.child:
        layout, nodes, traced = args.child
        print(json.dumps(child(layout, int(nodes), args.keep, traced == "traced")))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[tuple[str, int], dict[str, Any]] = {}
    header = (
        f"{'nodes':>6} {'layout':>6} {'samples':>10} {'B/sample':>9} {'B/s RSS':>8} "
        f"{'MB':>8} {'handle ns':>10} {'since µs':>9} {'(n)':>5} {'fill ns':>8}"
    )
    print(f"keep={args.keep} ({args.keep * STEP_S / 3600:g} h at {STEP_S:g} s)")
    print(header)
    for nodes in sizes:
        for layout in LAYOUTS:
            r = results[layout, nodes] = {}
            for mode in ("traced", "rss"):
                command = [sys.executable, __file__, "--keep", str(args.keep)]
                command += ["--child", layout, str(nodes), mode]
                out = subprocess.run(command, check=True, capture_output=True, text=True)
                r.update(json.loads(out.stdout.strip().splitlines()[-1]))
            print(
                f"{nodes:>6,} {layout:>6} {r['samples']:>10,} {r['traced_b']:>9.1f} "
                f"{r['rss_b']:>8.1f} {r['traced_mb']:>8.1f} {r['handle_ns']:>10,.0f} "
                f"{r['since_us']:>9.1f} {r['since_n']:>5.0f} {r['fill_ns']:>8,.0f}",
                flush=True,
            )
        old, new = results["deque", nodes], results["ring", nodes]
        print(
            f"{'':>6} {'old/new':>6} {'':>10} {old['traced_b'] / new['traced_b']:>9.2f} "
            f"{old['rss_b'] / new['rss_b']:>8.2f} {'':>8} "
            f"{old['handle_ns'] / new['handle_ns']:>10.2f} "
            f"{old['since_us'] / new['since_us']:>9.2f}"
        )
    if len(sizes) > 1:
        first, last = sizes[0], sizes[-1]
        for layout in LAYOUTS:
            a, b = results[layout, first], results[layout, last]
            print(
                f"{layout}: {last:,} vs {first:,} nodes ({last / first:g}x): traced memory "
                f"{b['traced_mb'] / a['traced_mb']:.2f}x, per sample "
                f"{b['traced_b'] / a['traced_b']:.3f}x"
            )
        at_10k = {
            layout: results[layout, last]["traced_b"] * 10_000 * 720 / 1e9 for layout in LAYOUTS
        }
        print(
            "an hour at 10,000 nodes (from the last size's B/sample): "
            + ", ".join(f"{layout} {gb:.2f} GB" for layout, gb in at_10k.items())
        )


if __name__ == "__main__":
    main()
