"""Noticing a held event loop: how long, and where it was held.

One event loop carries a process's MQTT connection, its document peers and its control step.
A callback that holds the loop for seconds starves everything else: the connection's keepalive
(the broker drops a client it has not heard from for 1.5 keepalives), every peer's answers,
the API. :class:`StallWatch` is a daemon thread that sees the loop's beat stop and logs, once
per stall, the stack the loop's thread is in after ``threshold_s``, then how long the stall
lasted in all, so an operator (or a benchmark) can tell which work to slice. It costs one
timer callback per ``interval_s`` on the loop and a thread waking as often.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger("edgesched.stall")


class StallWatch:
    """Run :meth:`run` as a task of the loop to watch (it starts and stops the thread)."""

    def __init__(self, threshold_s: float = 2.0, interval_s: float = 0.25) -> None:
        if not threshold_s > interval_s > 0:
            raise ValueError("need threshold_s > interval_s > 0")
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self._beat = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self.stalls = 0  # stalls seen past the threshold
        self.longest_s = 0.0  # the longest one, in all
        #: the stack of each stall, as logged (the last few)
        self.where: list[str] = []

    async def run(self) -> None:
        """Beat every ``interval_s`` until cancelled; the watching thread lives as long."""
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._stop.clear()
        thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        thread.start()
        try:
            while True:
                self._beat = time.monotonic()
                await asyncio.sleep(self.interval_s)
        finally:
            self._stop.set()

    def _watch(self) -> None:
        reported_beat: float | None = None
        while not self._stop.wait(self.interval_s):
            beat = self._beat
            held = time.monotonic() - beat
            if reported_beat is not None and beat != reported_beat:
                total = beat - reported_beat  # the loop beat again: the stall is over
                self.longest_s = max(self.longest_s, total)
                log.warning("event loop was held for %.1f s in all", total)
                reported_beat = None
            if reported_beat is None and held > self.threshold_s:
                reported_beat = beat
                self.stalls += 1
                frame = sys._current_frames().get(self._loop_thread)
                stack = "".join(traceback.format_stack(frame, limit=12)) if frame else "?"
                self.where = [*self.where[-4:], stack]
                log.warning("event loop held for %.1f s so far, in:\n%s", held, stack)
