"""The store's database thread: one worker running every job of a store, in two lanes.

A job of the urgent lane runs before every job still waiting in the normal lane; each lane
keeps its order. A document journal's write is urgent: a submission at central waits for the
fleet journal's write, and its node's desired document goes out only once its own journal's
write is on disk. In one first-in-first-out queue those writes waited behind the replicas'
snapshot batches and the finished tasks' history (each up to a second while central's loop
computed, at 10,000 nodes). A job that has started is never interrupted, so an urgent job
waits for at most the one running.

The store keeps the lanes safe to reorder: every job outside a transaction block is a whole
transaction of its own (``BEGIN``, its statements, ``COMMIT``), and a block's jobs all go in
the normal lane (no urgent job is queued while a block is open, nor until its ``COMMIT`` or
``ROLLBACK`` has run: calls outside it wait for that), so an urgent job never lands inside
another job's transaction.

The worker is a one-thread :class:`~concurrent.futures.ThreadPoolExecutor` (its shutdown and
interpreter-exit behaviour as they are): each job queues one turn of it, and a turn runs the
most urgent job waiting, not necessarily the one that queued it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

_T = TypeVar("_T")

_Job = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DatabaseThread(Executor):
    """One worker thread, two lanes (:meth:`submit`: normal; :meth:`submit_urgent`)."""

    def __init__(self, name: str = "edgesched-sqlite") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._urgent: deque[_Job] = deque()
        self._normal: deque[_Job] = deque()
        self._guard = threading.Lock()
        #: jobs run so far from the urgent lane ahead of a normal job queued before them
        self.overtakes = 0

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        """Queue ``fn(*args, **kwargs)`` in the normal lane."""
        return self._queue(self._normal, fn, args, kwargs)

    def submit_urgent(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        """Queue ``fn(*args, **kwargs)`` ahead of every normal job not yet started."""
        return self._queue(self._urgent, fn, args, kwargs)

    def _queue(
        self,
        lane: deque[_Job],
        fn: Callable[..., _T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Future[_T]:
        future: Future[_T] = Future()
        job: _Job = (future, fn, args, kwargs)
        with self._guard:
            lane.append(job)
            try:
                self._pool.submit(self._turn)  # raises once shut down
            except BaseException:
                lane.pop()
                raise
        return future

    def _turn(self) -> None:
        """In the worker: run the most urgent job waiting (one turn per job queued)."""
        with self._guard:
            if self._urgent:
                job = self._urgent.popleft()
                if self._normal:
                    self.overtakes += 1
            else:
                job = self._normal.popleft()
        future, fn, args, kwargs = job
        if not future.set_running_or_notify_cancel():
            return  # cancelled before it started
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # handed to whoever waits on the future
            future.set_exception(exc)
        else:
            future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more jobs; the ones queued still run (``cancel_futures``: those not started
        are cancelled instead). ``wait``: until the last has run."""
        if cancel_futures:
            with self._guard:
                for lane in (self._urgent, self._normal):
                    for future, *_ in lane:
                        future.cancel()
        self._pool.shutdown(wait=wait)
