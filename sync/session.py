"""The node's one MQTT connection: reconnect loop, TLS, and cancellation that is never lost.

aiomqtt has no reconnect of its own; every long-lived client here runs the same loop:
connect, serve until an :class:`aiomqtt.MqttError`, back off with full jitter and a cap,
reconnect. Two traps can make such a loop swallow its own cancellation and hang a shutdown
forever, and the helpers here close both:

- Python 3.11's ``asyncio.wait_for`` (which aiomqtt uses for every publish, subscribe and
  connect) returns the result instead of raising when the awaited future completes in the same
  loop iteration as the cancel. :func:`checked` re-raises the lost cancellation.
- On cancel, aiomqtt's ``__aexit__`` waits for a graceful disconnect and raises ``MqttError``
  if that times out, replacing the ``CancelledError``. :func:`reraise_if_cancelling` in the
  loop's ``except`` block puts it back.

Both read :meth:`asyncio.Task.cancelling`, which Python 3.11's ``TaskGroup`` leaves raised on
its parent when a child fails while the parent already waits in ``__aexit__`` (fixed in later
Pythons). A session's pair of loops therefore runs under :func:`first_failure`, which gives the
same structure (the first to fail cancels the other, both are awaited) without touching the
caller's cancel count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def reraise_if_cancelling() -> None:
    """Raise ``CancelledError`` if the current task has a cancel request pending."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def checked(awaitable: Awaitable[T]) -> T:
    """Await an aiomqtt call; if our task was cancelled meanwhile, raise even if it returned."""
    result = await awaitable
    reraise_if_cancelling()
    return result


async def first_failure(*loops: Coroutine[Any, Any, object]) -> None:
    """Run ``loops`` as sibling tasks until one ends; cancel and await the rest; re-raise
    the first one's exception. A cancel of the caller cancels and awaits them all."""
    tasks = [asyncio.create_task(loop) for loop in loops]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:  # in start order, so the report does not depend on timing
        if task in done and not task.cancelled() and (exc := task.exception()) is not None:
            raise exc
