"""What each sync peer's reassembler remembers of completed messages, over a long run: the
packed, time-bounded memory (:class:`~edgesched.sync.wire.RecentMessages`) against the
count-bounded ordered dict of ``(sender, message id)`` tuples it replaced.

Central holds one reassembler per peer: a node replica's and a desired document's for each
node, 20,000 at 10,000 nodes. Every unsigned message a peer completes is remembered so that
a QoS 1 redelivery is dropped as a duplicate. The old memory kept the last 1,024 keys
whatever their age, so a node replica's peer completing a message every 30 s filled it
in ~8.5 hours and then held ~170 kB for as long as the peer lived.

For each run length (``--messages``, 300 and 3,000 by default: 2.5 and 25 hours of a
message every 30 s) and each layout, ``--peers`` reassemblers (200 by default) are each fed
that many one-frame messages through ``feed()`` (real frames from ``wire.encode``), one
every ``--period-s`` of simulated time. Printed per run length and layout:

* **B/peer**: what ``tracemalloc`` holds after the feed, less before, per peer;
* **feed ns**: ``feed()`` per message over the whole run (the memory's lookup and add in it);
* **old/new**: the ratio of each figure, the dict's over the packed memory's;

then each layout's growth from the first run length to the last, and what 20,000 peers
come to. The old layout is the reassembler's memory before (an ``OrderedDict`` of tuples
trimmed to ``remember``), reimplemented here around the same frame parser.

    .venv/bin/python bench/bench_reassembler_memory.py [--peers 200] [--messages 300,3000]

~20 s by default on a 2-core machine.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections import OrderedDict

from edgesched.sync import wire
from edgesched.sync.wire import Kind, Reassembler

LAYOUTS = ("dict", "packed")
REMEMBER = 1024
FLEET_PEERS = 20_000


class DictReassembler:
    """The previous memory of completed messages: the last ``remember`` keys as tuples in an
    ordered dict, however old (a one-frame message's path only, which is all this feeds)."""

    def __init__(self, remember: int = REMEMBER) -> None:
        self._done: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._remember = remember

    def feed(self, data: bytes, now: float) -> wire.Message | None:
        kind, sender, epoch, msg_id, _, _, _, _, _, chunk, signed = wire._parse_frame(data)
        key = (sender, msg_id)
        if key in self._done:
            return None
        self._done[key] = None
        while len(self._done) > self._remember:
            self._done.popitem(last=False)
        return wire.Message(kind, sender, msg_id, chunk, epoch, signed)


def frames(peers: int, messages: int) -> list[list[bytes]]:
    """Each peer's messages: one frame each, from the peer's own sender (its node)."""
    return [
        [wire.encode(Kind.UPDATE, "node-x", 1000 + p, b"u" * 40, 65536)[0] for _ in range(messages)]
        for p in range(peers)
    ]


def feed_all(layout: str, feeds: list[list[bytes]], period_s: float) -> float:
    """Feed every peer its frames; seconds taken."""
    started = time.perf_counter()
    peers = [Reassembler() if layout == "packed" else DictReassembler() for _ in feeds]
    for peer, peer_frames in zip(peers, feeds, strict=True):
        for i, frame in enumerate(peer_frames):
            if peer.feed(frame, now=i * period_s) is None:
                raise AssertionError("a fresh message was taken for a duplicate")
    return time.perf_counter() - started


def run(layout: str, feeds: list[list[bytes]], period_s: float) -> tuple[float, float]:
    """(bytes held per peer, ns per feed) for ``layout`` fed ``feeds``: the memory traced,
    the time in a second, untraced, feed (tracemalloc slows allocation several times)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    peers = [Reassembler() if layout == "packed" else DictReassembler() for _ in feeds]
    for peer, peer_frames in zip(peers, feeds, strict=True):
        for i, frame in enumerate(peer_frames):
            peer.feed(frame, now=i * period_s)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del peers, started
    gc.collect()
    took = feed_all(layout, feeds, period_s)
    return held / len(feeds), took / sum(map(len, feeds)) * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=200)
    parser.add_argument("--messages", default="300,3000", help="run lengths, comma-separated")
    parser.add_argument("--period-s", type=float, default=30.0)
    args = parser.parse_args()
    lengths = [int(m) for m in args.messages.split(",")]
    if len(lengths) < 2:
        parser.error("--messages needs at least two run lengths (the growth is a ratio)")
    print(
        f"reassembler memory: {args.peers} peers, one message every {args.period_s:g} s each, "
        f"remember {REMEMBER} (the packed one also for 600 s)"
    )
    print(f"{'messages':>9} {'hours':>6} {'layout':>7} {'B/peer':>9} {'feed ns':>8}")
    results: dict[tuple[int, str], tuple[float, float]] = {}
    for messages in lengths:
        feeds = frames(args.peers, messages)
        for layout in LAYOUTS:
            held, ns = results[messages, layout] = run(layout, feeds, args.period_s)
            hours = messages * args.period_s / 3600
            print(f"{messages:>9,} {hours:>6.1f} {layout:>7} {held:>9,.0f} {ns:>8,.0f}")
        (old_b, old_ns), (new_b, new_ns) = results[messages, "dict"], results[messages, "packed"]
        print(f"{'':>9} {'':>6} {'old/new':>7} {old_b / new_b:>9.1f}x {old_ns / new_ns:>7.2f}x")
    first, last = lengths[0], lengths[-1]
    for layout in LAYOUTS:
        growth = results[last, layout][0] / results[first, layout][0]
        print(
            f"{layout}: memory per peer x{growth:.2f} from {first:,} to {last:,} messages "
            f"(x{last / first:.0f} the run); {FLEET_PEERS:,} peers after {last:,}: "
            f"{results[last, layout][0] * FLEET_PEERS / 1e6:,.0f} MB"
        )


if __name__ == "__main__":
    main()
