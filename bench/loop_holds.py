"""Where a held event loop's time went: sample the loop thread's stack while the loop is late.

A benchmark's event-loop lag (a sleep's lateness) says how long the loop was held, not by
what. :class:`HoldSampler` beats on the loop every ``beat_s``; a thread wakes every
``sample_s`` and, while the beat is later than ``late_s``, takes the loop thread's stack and
counts it under the callback the loop is running (the frame below asyncio's
``Handle._run``) and under the innermost frame of the project's own code, and under ``[gc]``
while CPython's cyclic collector runs (``gc.callbacks``). Each hold (a run of late samples)
is kept with its length and the callback seen most in it, so the note can name what held the
loop longest, not only what held it most often.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import sys
import threading
import time
import traceback
from typing import Any

#: Paths of the project's code in a frame's file name (an editable install or a checkout).
OWN_CODE = ("/edgesched/", "/central/", "/sync/", "/core/", "/edge/", "/rest/", "/bench/")


def _short(frame: traceback.FrameSummary) -> str:
    parts = frame.filename.rsplit("/", 2)
    return f"{'/'.join(parts[-2:])}:{frame.name}"


def attribute(stack: list[traceback.FrameSummary], depth: int = 3) -> tuple[str, str]:
    """``(callback, innermost own frames)`` of a stack taken from the loop's thread: the
    ``depth`` innermost frames of the project's code, innermost first."""
    callback = "?"
    for i, frame in enumerate(stack):
        ours = frame.filename.endswith("asyncio/events.py") and frame.name == "_run"
        if ours and i + 1 < len(stack):
            callback = _short(stack[i + 1])
    own = [
        _short(frame)
        for frame in stack
        if any(part in frame.filename for part in OWN_CODE) and "loop_holds" not in frame.filename
    ]
    return callback, " < ".join(reversed(own[-depth:])) or "?"


class HoldSampler:
    """Run :meth:`run` as a task of the loop to watch; read :meth:`note` after."""

    def __init__(self, late_s: float = 0.03, beat_s: float = 0.005, sample_s: float = 0.002):
        self.late_s = late_s
        self.beat_s = beat_s
        self.sample_s = sample_s
        self.by_callback: collections.Counter[str] = collections.Counter()
        self.by_own: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.gc_samples = 0  # of them, in the cyclic garbage collector
        #: (how long, the callback seen most in it) of each hold past ``late_s``
        self.holds: list[tuple[float, str]] = []
        self._beat = time.monotonic()
        self._in_gc = False
        self._stop = threading.Event()
        self._loop_thread = threading.get_ident()

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        self._in_gc = phase == "start"

    async def run(self) -> None:
        self._loop_thread = threading.get_ident()
        gc.callbacks.append(self._gc)
        thread = threading.Thread(target=self._watch, name="hold-sampler", daemon=True)
        thread.start()
        try:
            while True:
                self._beat = time.monotonic()
                await asyncio.sleep(self.beat_s)
        finally:
            self._stop.set()
            gc.callbacks.remove(self._gc)

    def _watch(self) -> None:
        hold_beat: float | None = None
        in_hold: collections.Counter[str] = collections.Counter()
        while not self._stop.wait(self.sample_s):
            beat = self._beat
            now = time.monotonic()
            if hold_beat is not None and beat != hold_beat:
                self.holds.append((beat - hold_beat - self.beat_s, in_hold.most_common(1)[0][0]))
                hold_beat, in_hold = None, collections.Counter()
            if now - beat - self.beat_s <= self.late_s:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                continue
            callback, own = attribute(traceback.extract_stack(frame))
            if self._in_gc:
                callback, own = f"[gc] {callback}", f"[gc] {own}"
                self.gc_samples += 1
            self.samples += 1
            self.by_callback[callback] += 1
            self.by_own[own] += 1
            in_hold[callback] += 1
            hold_beat = beat

    def note(self, top: int = 8) -> str:
        """The callbacks and own frames seen most while the loop was late, and the longest
        holds with the callback that held each."""
        if not self.samples:
            return f"loop holds past {self.late_s * 1e3:.0f} ms: none sampled"

        def share(counter: collections.Counter[str]) -> str:
            return ", ".join(
                f"{name} {n * 100 / self.samples:.0f}%" for name, n in counter.most_common(top)
            )

        longest = sorted(self.holds, reverse=True)[:top]
        held = sum(h for h, _ in self.holds)
        return (
            f"loop holds past {self.late_s * 1e3:.0f} ms: {len(self.holds)}, {held:.1f} s in "
            f"all, {self.samples} samples ({self.gc_samples * 100 / self.samples:.0f}% in the "
            f"garbage collector); by callback: {share(self.by_callback)}; by "
            f"innermost own frames: {share(self.by_own)}; longest: "
            + ", ".join(f"{h * 1e3:.0f} ms in {name}" for h, name in longest)
        )
