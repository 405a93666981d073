"""Long loops on the event loop, in turns: the loop gets a turn after every few ms of work.

Central's event loop carries its MQTT connection, every document peer, the control step and
each submission's path to the broker (several turns of the loop: the journal's write handed
back, the publish, its PUBACK read). A loop over thousands of documents or tasks that yields
every N items holds the loop for N times an item's cost, which varies by a hundredfold (a
freeze ~0.7 ms, a visit of a used document ~1 µs). :class:`Turns` yields on time instead:
``await turns.take()`` between two items gives the loop a turn once :attr:`Turns.turn_s` of
work has gone by since the last (``bench/bench_central_scale.py --hold-sample`` names what
held the loop).
"""

from __future__ import annotations

import asyncio
import time

#: The work a loop does between two turns of the event loop.
TURN_S = 0.005


class Turns:
    """One loop's turns: :meth:`take` between items, :meth:`began` after awaiting anything
    else (which gave the event loop its turn already)."""

    def __init__(self, turn_s: float = TURN_S) -> None:
        self.turn_s = turn_s
        self._since = time.monotonic()
        self.taken = 0  # turns given to the loop so far

    @property
    def due(self) -> bool:
        """Whether this turn has lasted :attr:`turn_s`."""
        return time.monotonic() - self._since >= self.turn_s

    async def take(self, *, now: bool = False) -> None:
        """Give the event loop a turn if this one has lasted :attr:`turn_s` (or ``now``)."""
        if now or self.due:
            await asyncio.sleep(0)
            self.taken += 1
            self.began()

    def began(self) -> None:
        """A turn begins now (the caller just awaited something)."""
        self._since = time.monotonic()
