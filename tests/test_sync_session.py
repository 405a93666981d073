"""The cancellation guards of the MQTT session loops (the cause of a CI hang)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from edgesched.sync.session import checked, first_failure, reraise_if_cancelling


async def _race(guard: bool) -> asyncio.Task[None]:
    """A cancel that lands in the same loop iteration as the awaited future's result: Python
    3.11's wait_for (used by aiomqtt for every publish) returns the result and drops it."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    parked = asyncio.Event()

    async def child() -> None:
        call = asyncio.wait_for(fut, 5)
        await (checked(call) if guard else call)
        await parked.wait()  # a send loop idling for work

    task = asyncio.create_task(child())
    await asyncio.sleep(0)
    fut.set_result(1)
    task.cancel()
    await asyncio.wait({task}, timeout=0.5)
    return task


async def test_checked_keeps_a_cancel_that_wait_for_dropped() -> None:
    task = await _race(guard=True)
    assert task.done() and task.cancelled()


async def test_the_race_is_real_without_the_guard() -> None:
    """Guards the guard: if this starts failing, the interpreter fixed the race and
    :func:`checked` is no longer needed."""
    task = await _race(guard=False)
    if task.done():  # pragma: no cover - interpreters without the race
        pytest.skip("this interpreter's wait_for does not drop the cancel")
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.cancelled()


async def test_reraise_if_cancelling_only_when_a_cancel_is_pending() -> None:
    reraise_if_cancelling()  # no cancel pending: nothing happens
    me = asyncio.current_task()
    assert me is not None
    me.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)
    with pytest.raises(asyncio.CancelledError):
        reraise_if_cancelling()
    me.uncancel()


async def test_first_failure_cancels_the_sibling_and_raises_its_error() -> None:
    sibling_cancelled = asyncio.Event()

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ConnectionError("lost")

    async def idles() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            sibling_cancelled.set()
            raise

    with pytest.raises(ConnectionError, match="lost"):
        await first_failure(idles(), fails())
    assert sibling_cancelled.is_set()
    me = asyncio.current_task()
    assert me is not None and me.cancelling() == 0  # unlike 3.11's TaskGroup


async def test_first_failure_is_cancelled_as_a_whole() -> None:
    finished: list[str] = []

    async def loop(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            finished.append(name)

    task = asyncio.create_task(first_failure(loop("a"), loop("b")))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(finished) == ["a", "b"]
