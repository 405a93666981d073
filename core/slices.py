"""Sliced accelerators: which device, and which of its slices, a task gets on one node.

A node's compute accelerators are :class:`Device` s, each offering ``slices`` units: MIG
instances, SR-IOV virtual functions, or a configured time-slicing share (``[edge]
accel_time_slices``); an unsliced device offers one. A task asks either ``devices`` whole
devices (a device with every slice free) or ``slices`` units of one device (never spanning
devices). :func:`plan` picks deterministically: slices go best-fit (the device that keeps the
fewest free slices after the grant, then the lowest index; the lowest free slots on it), whole
devices go to the lowest-indexed fully free ones; slices only come from sliced devices (an
unsliced device on a node with sliced ones is kept for whole-device tasks). So a device is
never oversubscribed and the fractions granted on a device sum to at most 1.

Pure functions over plain frozen dataclasses: the edge engine keeps the grants of its running
tasks and plans each start with them; the core's fit filter replays the same rule over a
node's placements (:func:`fits_on_node`) for a fleet-level check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Device:
    """One compute accelerator of a node.

    ``index`` is its position among the node's compute accelerators (the GPU index CUDA
    numbers it by); ``kind`` is ``"whole"`` (unsliced), ``"time"`` (a time-sliced share),
    ``"mig"`` or ``"sriov"``; ``units`` names each slice where the hardware does (a MIG
    instance's UUID, a virtual function's PCI address), one per slice; ``address`` is the
    device's own PCI address (or ``""``)."""

    index: int
    slices: int = 1
    kind: str = "whole"
    units: tuple[str, ...] = ()
    address: str = ""

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"device index must be >= 0, got {self.index}")
        if self.slices < 1:
            raise ValueError(f"device {self.index}: slices must be >= 1, got {self.slices}")
        if self.units and len(self.units) != self.slices:
            raise ValueError(f"device {self.index}: {len(self.units)} units for {self.slices}")


@dataclass(frozen=True, slots=True)
class Request:
    """What a task asks: ``devices`` whole devices, or ``slices`` slices of one device."""

    devices: int = 0
    slices: int = 0

    def __post_init__(self) -> None:
        if self.devices < 0 or self.slices < 0:
            raise ValueError("devices and slices must be >= 0")
        if self.devices and self.slices:
            raise ValueError("a task asks whole devices or slices of one device, not both")

    @property
    def empty(self) -> bool:
        return not (self.devices or self.slices)


@dataclass(frozen=True, slots=True)
class Grant:
    """What a task holds: ``slots`` of each device in ``devices`` (sorted pairs)."""

    task_id: str
    held: tuple[tuple[int, tuple[int, ...]], ...]

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for d, _ in self.held)

    def to_json(self) -> dict[str, object]:
        return {"task": self.task_id, "held": [[d, list(s)] for d, s in self.held]}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Grant:
        task = data.get("task")
        held = data.get("held")
        if not isinstance(task, str) or not isinstance(held, list):
            raise ValueError("grant: expected {task: str, held: [[device, [slot...]]...]}")
        pairs: list[tuple[int, tuple[int, ...]]] = []
        for item in held:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)):
                raise ValueError("grant: each held entry is [device, [slot...]]")
            slots = item[1]
            if not isinstance(slots, list) or not all(isinstance(s, int) for s in slots):
                raise ValueError("grant: slots must be a list of integers")
            pairs.append((item[0], tuple(slots)))
        return cls(task, tuple(sorted(pairs)))


def used_slots(devices: Sequence[Device], grants: Iterable[Grant]) -> dict[int, set[int]]:
    """Per device index: the slots the ``grants`` hold (grants on unknown devices ignored)."""
    used: dict[int, set[int]] = {d.index: set() for d in devices}
    for grant in grants:
        for device, slots in grant.held:
            if device in used:
                used[device].update(slots)
    return used


def plan(
    devices: Sequence[Device], grants: Iterable[Grant], task_id: str, request: Request
) -> Grant | None:
    """The grant for ``request`` next to ``grants`` (the running tasks'), or None when it
    does not fit. Deterministic: the same inputs give the same grant."""
    if request.empty:
        return Grant(task_id, ())
    used = used_slots(devices, grants)
    ordered = sorted(devices, key=lambda d: d.index)
    if request.devices:
        free = [d for d in ordered if not used[d.index]]
        if len(free) < request.devices:
            return None
        return Grant(
            task_id, tuple((d.index, tuple(range(d.slices))) for d in free[: request.devices])
        )
    best: tuple[int, int] | None = None
    for d in ordered:
        if d.slices == 1:
            continue  # an unsliced device is for whole-device tasks
        left = d.slices - len(used[d.index]) - request.slices
        if left >= 0 and (best is None or left < best[0]):
            best = (left, d.index)
    if best is None:
        return None
    device = next(d for d in ordered if d.index == best[1])
    taken = used[device.index]
    slots = tuple(s for s in range(device.slices) if s not in taken)[: request.slices]
    return Grant(task_id, ((device.index, slots),))


def release(grants: Iterable[Grant], task_id: str) -> tuple[Grant, ...]:
    """``grants`` without ``task_id``'s."""
    return tuple(g for g in grants if g.task_id != task_id)


def uniform_devices(count: int, slices_total: int) -> tuple[Device, ...]:
    """A node's devices as the core sees them from its capacity alone: ``count`` devices
    sharing ``slices_total`` slices evenly (0 slices: unsliced, one each)."""
    if count <= 0:
        return ()
    per = max(slices_total // count, 1)
    return tuple(Device(i, per, "time" if per > 1 else "whole") for i in range(count))


def node_devices(count: int, slices_total: int, layout: str | None = None) -> tuple[Device, ...]:
    """A node's devices as the core sees them: from ``layout`` (the ``accel_slices`` label
    the hardware layer writes, each device's slices comma-separated) when it matches
    ``count`` devices, else :func:`uniform_devices`."""
    if layout:
        try:
            sizes = [int(x) for x in layout.split(",")]
        except ValueError:
            sizes = []
        if len(sizes) == count and all(n >= 1 for n in sizes):
            return tuple(Device(i, n, "time" if n > 1 else "whole") for i, n in enumerate(sizes))
    return uniform_devices(count, slices_total)


#: The node label holding each device's slices (``"4,4,1,1"``), written by the hardware
#: layer (:func:`edgesched.edge.hal.to_node`) so a node's own core sees uneven devices.
LAYOUT_LABEL = "accel_slices"


#: The node label holding the grants its running tasks really hold (:func:`held_label`),
#: written by the node into its own core's view so that view is exact.
HELD_LABEL = "accel_held"


def held_label(grants: Iterable[Grant]) -> str:
    """``grants`` as :data:`HELD_LABEL`'s text (JSON)."""
    return json.dumps([g.to_json() for g in sorted(grants, key=lambda g: g.task_id)])


def parse_held_label(text: str | None) -> dict[str, Grant]:
    """The grants of a :data:`HELD_LABEL` text, by task id ({} when absent or unreadable)."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
        grants = [Grant.from_json(g) for g in raw] if isinstance(raw, list) else []
    except (ValueError, TypeError, AttributeError):
        return {}
    return {g.task_id: g for g in grants}


def fits_on_node(
    devices: Sequence[Device],
    running: Iterable[tuple[str, Request]],
    task_id: str,
    request: Request,
    held: Mapping[str, Grant] | None = None,
) -> bool:
    """Whether ``request`` fits next to ``running``: the tasks with a grant in ``held`` keep
    it (what the node really gave them), the others are granted in the given order by
    :func:`plan` (the core's fleet-level view, which knows no grants; the node checks again
    with the grants it holds when it starts the task)."""
    known = held or {}
    grants: list[Grant] = [known[t] for t, _ in running if t in known]
    for other_id, other in running:
        if other_id in known:
            continue
        grant = plan(devices, grants, other_id, other)
        if grant is None:
            return False  # already over (a view behind the node): nothing more fits
        grants.append(grant)
    return plan(devices, grants, task_id, request) is not None


def device_env(devices: Sequence[Device], grant: Grant) -> dict[str, str]:
    """The environment that hands ``grant``'s unit to the task's process.

    ``CUDA_VISIBLE_DEVICES``: the GPU indices, or the MIG instances' UUIDs;
    ``EDGESCHED_VF_PCI``: the virtual functions' PCI addresses (SR-IOV);
    ``EDGESCHED_ACCEL_SLICE``: ``<device>:<slot>[,<slot>...]/<slices>`` per device, ``;``
    between devices (what the task holds, whatever the kind). Empty for an empty grant."""
    if not grant.held:
        return {}
    by_index = {d.index: d for d in devices}
    visible: list[str] = []
    vfs: list[str] = []
    slices: list[str] = []
    for index, slots in grant.held:
        device = by_index[index]
        slices.append(f"{index}:{','.join(map(str, slots))}/{device.slices}")
        if device.kind == "mig" and device.units:
            visible.extend(device.units[s] for s in slots)
        elif device.kind == "sriov" and device.units:
            vfs.extend(device.units[s] for s in slots)
        else:
            visible.append(str(index))
    env = {"EDGESCHED_ACCEL_SLICE": ";".join(slices)}
    if visible:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
    if vfs:
        env["EDGESCHED_VF_PCI"] = ",".join(vfs)
    return env
