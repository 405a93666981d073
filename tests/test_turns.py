"""``sync/turns.py``: a long loop gives the event loop a turn once its turn's time is up,
not before, and at once when asked."""

from __future__ import annotations

import asyncio
import time

from edgesched.sync.turns import Turns


async def test_a_turn_is_given_once_its_time_is_up_and_not_before() -> None:
    ran: list[int] = []

    async def other() -> None:
        while True:
            ran.append(1)
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    try:
        turns = Turns(turn_s=3600.0)
        before = len(ran)
        for _ in range(100):
            await turns.take()  # an hour's turn: never due here
        assert len(ran) == before and turns.taken == 0
        await turns.take(now=True)
        assert len(ran) == before + 1 and turns.taken == 1
        every = Turns(turn_s=0.0)  # always due: a turn at each take
        for _ in range(10):
            await every.take()
        assert every.taken == 10 and len(ran) == before + 11
    finally:
        task.cancel()


def test_began_starts_the_turn_again() -> None:
    turns = Turns(turn_s=0.01)
    time.sleep(0.02)
    assert turns.due
    turns.began()
    assert not turns.due
