"""An edge node's power state: parked on central's order when idle, woken by central or by work.

Central decides which nodes of the fleet to park (:mod:`edgesched.central.power`, energy and
learned modes, ``[central] park_nodes``) and writes its orders into the policy document. The
node carries an order out only when it is still current (given after the node's last change
of state: a node that woke itself for local work ignores the park order it woke against) and,
for a park, only while the node holds nothing and only if given during its current idle spell
(an order that found the node busy is void: central decides again once the node has been idle
long enough). Parking runs ``[edge] park_command``
(an argv: e.g. a CPU governor or a BMC call; none by default, so parking is bookkeeping plus
the parked power figure in telemetry), waking runs ``wake_command``. A command that fails or
times out leaves the node in the state it was in, with the reason logged and counted.

A parked node still runs its engine: it hears central, accepts local submissions, and wakes
itself as soon as work arrives (a node cut off from central never waits for central to wake
it). It reports ``{"state", "since", "idle_since"}`` in its document for central's power stage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgesched.sync.schema import PowerOrder, PowerReport

log = logging.getLogger("edgesched.edge.power")

PARKED = "parked"
ACTIVE = "active"
HOOK_TIMEOUT_S = 30.0


@dataclass
class PowerState:
    """The node's power state, when it last changed, and since when it holds no task."""

    state: str = ACTIVE
    since: float = 0.0
    idle_since: float | None = None

    @property
    def parked(self) -> bool:
        return self.state == PARKED

    def report(self) -> PowerReport:
        return PowerReport(state=self.state, since=self.since, idle_since=self.idle_since)


class PowerControl:
    """Owns :class:`PowerState` and runs the hooks; every change is reported through
    ``on_change`` (the engine writes it into the node's document)."""

    def __init__(
        self,
        clock: Callable[[], float],
        park_command: Sequence[str] = (),
        wake_command: Sequence[str] = (),
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.clock = clock
        self.park_command = tuple(park_command)
        self.wake_command = tuple(wake_command)
        self.on_error = on_error or (lambda stage: None)
        self.state = PowerState(since=clock(), idle_since=None)
        self.last_error = ""

    def observe(self, busy: bool) -> bool:
        """Track whether the node holds work; True when its idle time changed."""
        if busy and self.state.idle_since is not None:
            self.state.idle_since = None
            return True
        if not busy and self.state.idle_since is None:
            self.state.idle_since = self.clock()
            return True
        return False

    async def follow(self, order: PowerOrder | None, busy: bool) -> bool:
        """Carry out central's current order for this node; True when the state changed."""
        if order is None:
            return False
        at = order.at
        if at < self.state.since:
            return False  # given before our last change: stale
        wanted = order.state
        idle = self.state.idle_since
        if wanted == PARKED and (idle is None or at < idle):
            return False  # given while we were busy: central decides again on this idle spell
        reason = order.reason or "central's order"
        if wanted == PARKED and not self.state.parked and not busy:
            return await self._switch(PARKED, self.park_command, reason)
        if wanted == ACTIVE and self.state.parked:
            return await self._switch(ACTIVE, self.wake_command, reason)
        return False

    async def wake(self, reason: str) -> bool:
        """Wake for work that arrived (local submission, central's assignment)."""
        if not self.state.parked:
            return False
        return await self._switch(ACTIVE, self.wake_command, reason)

    async def _switch(self, state: str, command: tuple[str, ...], reason: str) -> bool:
        if command and not await self._run(command, state):
            return False
        self.state.state = state
        self.state.since = self.clock()
        log.warning("power: %s (%s)", state, reason)
        return True

    async def _run(self, argv: tuple[str, ...], state: str) -> bool:
        stage = "park" if state == PARKED else "wake"
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            return self._failed(stage, f"{argv[0]}: {exc}")
        try:
            async with asyncio.timeout(HOOK_TIMEOUT_S):
                _, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return self._failed(stage, f"{argv[0]} timed out after {HOOK_TIMEOUT_S:.0f} s")
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return self._failed(stage, f"{argv[0]} exited {proc.returncode}: {tail[0][:200]}")
        return True

    def _failed(self, stage: str, why: str) -> bool:
        self.last_error = f"{stage}: {why}"
        log.error("power: %s command failed, staying %s: %s", stage, self.state.state, why)
        self.on_error(stage)
        return False
