"""Pacing of the step 1s a process with many documents sends on its own initiative.

Central holds two documents per node (its replica of the node's document and the node's
desired document), each synced by its own :class:`~edgesched.sync.peer.DocPeer` over one MQTT
connection. On every connect each of them resyncs by state vector; at 10,000 nodes that was
20,000 QoS 1 publishes queued at once behind paho's in-flight window, answered by 20,000
step 2s (and step 1s back) arriving together: central lost its broker within a second of the
fleet coming up (``bench/bench_central_scale.py``). A :class:`ResyncPacer` shared by the peers
of one connection hands out send slots at ``rate`` per second after a ``burst``: a peer that
wants to send its step 1 reserves a slot and waits for it, while everything else it does
(answering a peer's step 1, sending its local updates) goes on meanwhile.

The pacer is a channel of the session it paces (no subscriptions): when the connection drops,
the slots reserved for it are void, and the next connect starts a fresh schedule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.session import Listener


class ResyncPacer(Listener):
    """Send slots at ``rate`` per second after a burst of ``burst``, first come first served.

    :meth:`reserve` costs O(1) and never waits itself: it returns the monotonic time of the
    caller's slot (now, while the burst lasts), which the caller waits for as it likes.
    """

    routes: tuple[str, ...] = ()
    subscriptions: tuple[tuple[str, SubscribeOptions], ...] = ()

    def __init__(
        self, rate: float, burst: int = 100, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be finite and > 0, got {rate}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._interval = 1.0 / rate
        self._next = -math.inf  # the earliest time the next slot may take
        self.reserved = 0  # slots handed out, all connections
        self.voided = 0  # schedules dropped with their connection

    def reserve(self) -> float:
        """The time (of ``clock``) at which the caller may send: now, or its place in line."""
        now = self.clock()
        slot = max(self._next, now - (self.burst - 1) * self._interval)
        self._next = slot + self._interval
        self.reserved += 1
        return max(slot, now)

    def backlog_s(self) -> float:
        """How long the last slot handed out is from now (0: no line)."""
        return max(0.0, self._next - self._interval - self.clock())

    def handle(self, topic: str, payload: bytes) -> None:
        """Never called: the pacer routes nothing."""

    def disconnected(self) -> None:
        """The slots were for a connection that is gone: the next one starts a new line (each
        peer reserves again when it connects)."""
        if self._next > self.clock():
            self.voided += 1
        self._next = -math.inf
