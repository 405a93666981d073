"""A page of ``GET /v1/tasks``: every task central knows, in id order, filtered, with a bound
on the work one request does on central's loop.

A view costs ~15 µs (its lifecycle, its copies); a filter that matches little (a rare phase)
would otherwise build every view of a 100,000-task fleet for one page (~1.5 s of central's
loop, the control step waiting behind it). So:

- ``node``: the candidates are the node's own (what central assigns it, what it reports),
  from the index, not every task;
- ``prefix``: the ids are sorted, so the candidates are one contiguous run;
- ``phase`` and ``origin``: judged per view, at most ``scan`` ids per request. When the
  budget runs out before the page is full, the answer holds what matched so far and
  ``next`` (the last id looked at): a page may hold fewer than ``limit`` tasks while
  ``next`` is not null, as with Kubernetes' ``continue``. Follow ``next`` until it is null.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

#: Ids looked at per request when a filter judges views (phase, origin): ~75 ms of views.
SCAN_PER_REQUEST = 5_000


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """What one request asks for. ``after``: the last id of the page before (exclusive)."""

    limit: int
    after: str | None = None
    phase: str | None = None
    origin: str | None = None
    node: str | None = None
    prefix: str | None = None
    scan: int = SCAN_PER_REQUEST


@dataclass(frozen=True, slots=True)
class TaskPage:
    tasks: list[dict[str, Any]]
    next: str | None
    scanned: int


def candidates(
    ids: Sequence[str], query: TaskQuery, node_ids: Callable[[str], Sequence[str]]
) -> Iterator[str]:
    """The ids a page may hold, in order, after ``query.after``: every id, the node's own
    (``node_ids(node)``, sorted here), or the run of ids starting with ``prefix``."""
    if query.node is not None:
        own = sorted(node_ids(query.node))
        start = bisect.bisect_right(own, query.after) if query.after else 0
        run: Iterator[str] = iter(own[start:])
    else:
        start = bisect.bisect_right(ids, query.after) if query.after else 0
        if query.prefix and (query.after is None or query.after < query.prefix):
            start = max(start, bisect.bisect_left(ids, query.prefix))
        run = (ids[i] for i in range(start, len(ids)))  # (a SortedList indexes in O(log n))
    if query.prefix:
        prefix = query.prefix
        if query.node is not None:
            run = (i for i in run if i.startswith(prefix))
        else:  # sorted: the run ends at the first id past the prefix
            run = itertools.takewhile(lambda i: i.startswith(prefix), run)
    return run


def page(
    ids: Sequence[str],
    query: TaskQuery,
    view: Callable[[str], dict[str, Any] | None],
    node_ids: Callable[[str], Sequence[str]],
) -> TaskPage:
    """One page of views (``view(id)``, None for a task gone since) matching ``query``."""
    judged = query.phase is not None or query.origin is not None
    tasks: list[dict[str, Any]] = []
    scanned = 0
    last: str | None = None
    for task_id in candidates(ids, query, node_ids):
        if len(tasks) == query.limit:
            return TaskPage(tasks, last, scanned)  # (everything up to ``last`` is judged)
        if judged and scanned >= query.scan:
            return TaskPage(tasks, last, scanned)  # budget spent: go on from here
        scanned += 1
        last = task_id
        found = view(task_id)
        if found is None or not _matches(found, query):
            continue
        tasks.append(found)
    return TaskPage(tasks, None, scanned)


def _matches(view: dict[str, Any], query: TaskQuery) -> bool:
    if query.phase is not None and view["phase"] != query.phase:
        return False
    if query.origin is not None and view["origin"] != query.origin:
        return False
    return query.node is None or view["node"] == query.node or query.node in view["copies"]
