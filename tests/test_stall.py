"""The held-loop watch (``edgesched.sync.stall``): a callback that holds the loop is reported
once, with the stack it holds it in, and then with how long it held it in all."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from edgesched.sync.stall import StallWatch


def hold_the_loop_for_a_while(seconds: float) -> None:
    time.sleep(seconds)  # a synchronous step that forgot to yield


async def test_a_held_loop_is_reported_with_where_and_how_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="edgesched.stall")
    watch = StallWatch(threshold_s=0.3, interval_s=0.05)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.sleep(0.2)  # beating: nothing to report
        assert watch.stalls == 0
        hold_the_loop_for_a_while(1.0)
        await asyncio.sleep(0.3)  # the loop beats again: the watch sees the end
        assert watch.stalls == 1
        assert 0.9 <= watch.longest_s < 5.0
        assert "hold_the_loop_for_a_while" in watch.where[-1]
        messages = [r.getMessage() for r in caplog.records]
        assert any("held for" in m and "hold_the_loop_for_a_while" in m for m in messages)
        assert any("was held for" in m for m in messages)
        await asyncio.sleep(0.4)  # a beating loop again: no new stall
        assert watch.stalls == 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_the_threshold_must_exceed_the_beat() -> None:
    with pytest.raises(ValueError):
        StallWatch(threshold_s=0.1, interval_s=0.1)
