"""The field test's workload: tasks of several classes and priorities, and a tidal window that
opens during the run, so nodes preempt (by priority, and to give the window's class its share)
while they are cut off.

Three workload classes, all ``sleep`` processes (their CPU is a reservation, not a load, so
the machine running the test is not what fills up):

=========  ========  ==========  ===================================================
class      priority  CPU         role
=========  ========  ==========  ===================================================
service    60-90     0.1-0.3     high priority: preempts the others when a node is full
surge      30-60     0.2-0.5     the tidal window's class: guaranteed 60% once it opens
batch      10-40     0.2-0.5     low priority: preempted first, borrows what is free
=========  ========  ==========  ===================================================

Each node reports 2 CPUs (this machine), so a node holds a handful of tasks and the rest
queue: a higher priority arrival preempts, and once the window opens ``surge`` tasks reclaim
their share from borrowers. The window (:func:`tidal_window`) is written into every config as
a ``[[policy.tidal.windows]]`` of an hour starting at a chosen instant (UTC time of day, as
the engines read it); a node whose clock is skewed crosses it at another moment.

The short scenarios submit every 0.2-0.6 s, about seven times what the fleet can run, so
queues build and preemptions are many. A soak at that pace only measures its own pile-up (an
ever-growing queue and ever more services restarting), so :class:`Pace` slows it to about
40% of the fleet's CPU (one every 1.5-3 s) with at most 6 restart-always services.

A preempted task goes back to its node's queue (state ``preempted``, then placed again): in
the checker's set semantics it is *present*, so it is never counted lost; lost means absent.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from edgesched.fieldtest.checker import Submission

DAY_S = 86_400

#: (class, priority range, CPU range)
CLASSES: tuple[tuple[str, tuple[int, int], tuple[float, float]], ...] = (
    ("service", (60, 90), (0.1, 0.3)),
    ("surge", (30, 60), (0.2, 0.5)),
    ("batch", (10, 40), (0.2, 0.5)),
)
SURGE_SHARE = 0.6


@dataclass(frozen=True)
class Pace:
    """How fast the workload submits, and how many restart-always services it may start
    (None: 40% of central's submissions, without a cap)."""

    gap_s: tuple[float, float] = (0.2, 0.6)
    max_services: int | None = None


#: The soak's pace: sustainable for an hour.
STEADY = Pace((1.5, 3.0), 6)


@dataclass(frozen=True)
class TidalWindow:
    """The window every config gets: ``surge`` holds :data:`SURGE_SHARE` of the CPU from
    ``opens_at`` (epoch seconds, a whole second) for an hour."""

    opens_at: float

    def config_lines(self) -> list[str]:
        start = int(self.opens_at) % DAY_S
        end = (start + 3600) % DAY_S
        return [
            "[policy.tidal]",
            'name = "fieldtest"',
            "[[policy.tidal.windows]]",
            'name = "surge"',
            f'start = "{_clock(start)}"',
            f'end = "{_clock(end)}"',
            f"shares = {{ surge = {SURGE_SHARE} }}",
        ]

    def open_at(self, wall: float) -> bool:
        """Whether the window is open at epoch time ``wall`` (a skewed clock's reading)."""
        return 0 <= (wall - self.opens_at) % DAY_S < 3600


def _clock(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Target(Protocol):
    """Where a submission goes: central's or a node's HTTP API."""

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]: ...


def task_body(
    rng: random.Random, task_id: str, at_central: bool, service_ok: bool = True
) -> dict[str, Any]:
    workload, (plo, phi), (clo, chi) = rng.choice(CLASSES)
    seconds = rng.choice([2, 5, 10, 60])
    body: dict[str, Any] = {
        "id": task_id,
        "command": ["sleep", str(seconds)],
        "workload": workload,
        "priority": rng.randint(plo, phi),
        "cpu": round(rng.uniform(clo, chi), 2),
        "mem_gib": 0.05,
    }
    if at_central:
        always = rng.random() < 0.4 and service_ok
        body["restart"] = "always" if always else "never"
    return body


async def submit_loop(
    rng: random.Random,
    nodes: Mapping[str, Target],
    central: Target,
    *,
    until: float,
    started: float,
    cut_off: Callable[[str], bool],
    history: list[Submission],
    pace: Pace = Pace(),
) -> None:
    """Submit a task every ``pace.gap_s`` until ``until`` (monotonic): 60% locally at a random node
    (it decides, cut off or not), 40% at central (a service or a batch job). ``cut_off(node)``
    says whether a node is cut off from central at the time (recorded with the submission)."""
    n = services = 0
    names = sorted(nodes)
    while time.monotonic() < until:
        n += 1
        if rng.random() < 0.6:
            where = rng.choice(names)
            target, task_id = nodes[where], f"{where}-local-{n}"
        else:
            where, target, task_id = "central", central, f"central-{n}"
        room = pace.max_services is None or services < pace.max_services
        body = task_body(rng, task_id, where == "central", room)
        services += body.get("restart") == "always"
        cut = where != "central" and cut_off(where)
        at = time.monotonic() - started
        try:
            status, _ = await asyncio.to_thread(target.http, "POST", "/v1/tasks", body)
            acked = status == 201
        except (OSError, ValueError):
            acked = False  # a frozen (SIGSTOPped) or restarting node: unknown outcome
        history.append(Submission(at, task_id, where, acked, while_cut=cut))
        await asyncio.sleep(rng.uniform(*pace.gap_s))
