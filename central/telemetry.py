"""Central's telemetry collector: the latest hour of every node's samples, in memory.

A channel of central's session subscribed to ``edgesched/v1/node/+/telemetry`` (QoS 0). A
sample whose topic names a node central does not hold a document for is still kept (a node's
telemetry may arrive before its document), up to ``max_nodes``; malformed ones are dropped and
counted. The dashboard and ``GET /v1/nodes/{id}/telemetry`` read it.

Each node's samples live in a :class:`TelemetryRing`: one numpy structured array, a row per
sample, not a deque of :class:`Telemetry` objects. A kept object cost ~160 bytes (the object,
four float objects, the deque's slot): 1.15 GB after an hour at 10,000 nodes (720 samples of
5 s each). A row is :data:`SAMPLE_BYTES` = 36 bytes, packed: ``at``, ``cpu_util``,
``mem_util`` and ``power_w`` as float64 (8 bytes each) and ``tasks_running`` as uint32
(4 bytes); 259 MB for the same hour. float64, not float32, so that a value reads back exactly
as it arrived (the REST answer's numbers, the fleet's sums of latest samples): float32 would
save 12 more bytes a sample (86 MB at 10,000 nodes) for ~7 significant digits. A
``tasks_running`` above :data:`MAX_TASKS_RUNNING` does not fit and the sample is rejected as
malformed (it was kept before; no node runs 4 billion tasks). A ring starts at
:data:`FIRST_ROWS` rows and doubles up to ``keep`` as samples arrive, so a node heard a few
times does not cost ``keep`` rows; the array's header and the ring's own object add ~200 bytes
a node, and the newest sample is also kept as its object (~160 bytes a node) so that
:meth:`TelemetryCollector.latest`, which the engine asks of every node for the fleet's
figures, builds nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import Listener
from edgesched.sync.telemetry import TELEMETRY_FILTER, Telemetry, parse_telemetry

log = logging.getLogger("edgesched.central.telemetry")

#: One kept sample: packed (no padding), the fields in :class:`Telemetry`'s order.
SAMPLE_DTYPE = np.dtype(
    [
        ("at", "<f8"),
        ("cpu_util", "<f8"),
        ("mem_util", "<f8"),
        ("power_w", "<f8"),
        ("tasks_running", "<u4"),
    ]
)
SAMPLE_BYTES = SAMPLE_DTYPE.itemsize  # 36
MAX_TASKS_RUNNING = 2**32 - 1
#: A new ring's rows (fewer if ``keep`` is smaller); it doubles, up to ``keep``, when full.
FIRST_ROWS = 8


def _sample(row: tuple[Any, ...]) -> Telemetry:
    at, cpu, mem, power, running = row
    return Telemetry(at, cpu, mem, power, running)


class TelemetryRing:
    """The newest ``keep`` samples of one node, oldest first, in a preallocated array.

    Appended in time order (a sample older than the newest is refused); once ``keep`` rows
    are held, each new sample overwrites the oldest. ``len()`` is the samples held."""

    __slots__ = ("_buf", "_last", "_len", "_start", "keep")

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self._buf: np.ndarray[Any, np.dtype[np.void]] = np.empty(
            min(FIRST_ROWS, keep), SAMPLE_DTYPE
        )
        self._start = 0  # the oldest sample's row (not 0 only once the ring is full at keep)
        self._len = 0
        self._last: Telemetry | None = None  # the newest sample, as it arrived: latest()

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Telemetry]:
        return iter(self.since(-math.inf))

    @property
    def rows(self) -> int:
        """The rows allocated (``len(self) <= rows <= keep``)."""
        return len(self._buf)

    def append(self, sample: Telemetry) -> bool:
        """Keep ``sample``; False (and nothing kept) if it is older than the newest."""
        at = sample.at
        if self._last is not None and at < self._last.at:
            return False
        buf = self._buf
        n = self._len
        if n < len(buf):  # not full: the ring has not wrapped, the rows are 0..n-1
            row = n
            self._len = n + 1
        elif n < self.keep:  # full below keep: double
            grown = np.empty(min(2 * n, self.keep), SAMPLE_DTYPE)
            grown[:n] = buf
            self._buf = buf = grown
            row = n
            self._len = n + 1
        else:  # full at keep: the oldest goes
            row = self._start
            self._start = (row + 1) % n
        buf[row] = (at, sample.cpu_util, sample.mem_util, sample.power_w, sample.tasks_running)
        self._last = sample
        return True

    def latest(self) -> Telemetry | None:
        return self._last

    def since(self, since: float) -> list[Telemetry]:
        """The samples with ``at >= since``, oldest first (a binary search on the times)."""
        n = self._len
        if not n:
            return []
        buf, start = self._buf, self._start
        # (wrapped, full at keep: buf[start:] is the older run, buf[:start] the newer)
        held = buf[:n] if start == 0 else np.concatenate((buf[start:], buf[:start]))
        rows = held[np.searchsorted(held["at"], since, "left") :].tolist()
        return [_sample(row) for row in rows]


class TelemetryCollector(Listener):
    """Per-node ring buffers (:class:`TelemetryRing`) of :class:`Telemetry` samples."""

    def __init__(self, *, keep: int = 720, max_nodes: int = 10_000) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self.max_nodes = max_nodes
        self.series: dict[str, TelemetryRing] = {}
        self.rejected = 0
        self.routes: tuple[str, ...] = (TELEMETRY_FILTER,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (TELEMETRY_FILTER, SubscribeOptions(qos=0)),
        )

    def latest(self, node_id: str) -> Telemetry | None:
        series = self.series.get(node_id)
        return None if series is None else series.latest()

    def samples(self, node_id: str, since: float = 0.0) -> list[Telemetry]:
        series = self.series.get(node_id)
        return [] if series is None else series.since(since)

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            node_id, sample = parse_telemetry(topic, payload)
        except ValueError as exc:
            self.rejected += 1
            log.debug("dropped telemetry: %s", exc)
            return
        if sample.tasks_running > MAX_TASKS_RUNNING:
            self.rejected += 1
            log.debug("dropped telemetry: tasks_running %d too large", sample.tasks_running)
            return
        series = self.series.get(node_id)
        if series is None:
            if len(self.series) >= self.max_nodes:
                self.rejected += 1
                return
            series = self.series[node_id] = TelemetryRing(self.keep)
        series.append(sample)  # refused if out of order (QoS 0 after a reconnect)
