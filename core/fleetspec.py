"""Fleets for trace replays: a one-line fleet spec, and a default fleet sized to a trace.

Grammar (docs/traces.md): a spec is groups separated by commas; a group is either

* ``COUNTxTYPE``: ``COUNT`` servers of a campus server type, by its pool name (``x86-gen``,
  ``arm-gen``, ``ai-x86``, ``ai-arm``, ``sto-x86``) or an alias ``CLASS-ARCH`` with ``CLASS``
  one of ``general``, ``accel``, ``storage`` and ``ARCH`` one of ``x86``, ``arm``
  (``36xgeneral-x86`` = ``36xx86-gen``); or
* ``COUNT:CLASS:ARCH:CORESc:MEMg[:ACCELa]``: ``COUNT`` servers of that class (``general``,
  ``accel``, ``storage``, or the ServerClass values), architecture (``x86_64``/``x86``,
  ``arm64``/``arm``), cores, memory (GiB) and accelerators. Power, parked power, wake latency,
  per-core performance and IOPS are those of the campus type of the same class and
  architecture: the CPU side's idle and peak power scale with ``cores / that type's cores``,
  the accelerators' with ``accelerators / that type's`` (parked power at most the idle).

Node ids are ``<pool>-NN`` numbered per group kind. Pure functions; :class:`FleetSpecError`
says which group is wrong and why.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace

from edgesched.core.campus import campus_fleet
from edgesched.core.model import Arch, CoreTopology, Node, Resources, ServerClass

#: Fraction of fleet CPU the default fleet's peak demand fills.
DEFAULT_PEAK_FILL = 0.7
#: The server type of the default fleet.
DEFAULT_TYPE = "x86-gen"

_CLASS_ALIASES = {
    "general": ServerClass.GENERAL,
    "accel": ServerClass.AI_ACCELERATOR,
    "ai": ServerClass.AI_ACCELERATOR,
    "ai-accelerator": ServerClass.AI_ACCELERATOR,
    "storage": ServerClass.STORAGE_DENSE,
    "storage-dense": ServerClass.STORAGE_DENSE,
}
_ARCH_ALIASES = {"x86": Arch.X86_64, "x86_64": Arch.X86_64, "arm": Arch.ARM64, "arm64": Arch.ARM64}
_TYPE_ALIASES = {
    "general-x86": "x86-gen",
    "general-arm": "arm-gen",
    "accel-x86": "ai-x86",
    "accel-arm": "ai-arm",
    "storage-x86": "sto-x86",
}
_SHORT = re.compile(r"(\d+)x([a-z0-9_-]+)")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([cga])")
#: Most servers one spec may describe (a typo like 36000 would build a fleet for minutes).
MAX_NODES = 10_000


class FleetSpecError(ValueError):
    """A fleet spec that cannot be read; the message names the group."""


def presets() -> dict[str, Node]:
    """One node of each campus server type, by pool name."""
    out: dict[str, Node] = {}
    for node in campus_fleet(1.0):
        out.setdefault(node.labels["pool"], node)
    return out


def _preset_for(server_class: ServerClass, arch: Arch) -> Node | None:
    for node in presets().values():
        if node.server_class is server_class and node.arch is arch:
            return node
    return None


def parse_fleet(spec: str) -> tuple[Node, ...]:
    """The nodes a fleet spec describes, sorted by id."""
    text = spec.strip().lower()
    if not text:
        raise FleetSpecError("fleet spec is empty")
    kinds: list[tuple[int, Node, str]] = []
    for raw in text.split(","):
        group = raw.strip()
        if not group:
            raise FleetSpecError(f"fleet spec {spec!r} has an empty group")
        kinds.append(_group(group))
    total = sum(count for count, _, _ in kinds)
    if total > MAX_NODES:
        raise FleetSpecError(f"fleet spec {spec!r} describes {total} servers (at most {MAX_NODES})")
    nodes: list[Node] = []
    used: dict[str, int] = {}
    for count, template, pool in kinds:
        start = used.get(pool, 0)
        used[pool] = start + count
        nodes.extend(replace(template, id=f"{pool}-{start + i:02d}") for i in range(1, count + 1))
    return tuple(sorted(nodes, key=lambda n: n.id))


def _group(group: str) -> tuple[int, Node, str]:
    m = _SHORT.fullmatch(group)
    if m:
        count = _count(m.group(1), group)
        name = _TYPE_ALIASES.get(m.group(2), m.group(2))
        kinds = presets()
        if name not in kinds:
            choices = ", ".join([*kinds, *_TYPE_ALIASES])
            raise FleetSpecError(
                f"fleet group {group!r}: unknown type {m.group(2)!r}; use {choices}"
            )
        return count, kinds[name], name
    parts = group.split(":")
    if len(parts) not in (5, 6):
        raise FleetSpecError(
            f"fleet group {group!r}: expected COUNTxTYPE or COUNT:CLASS:ARCH:CORESc:MEMg[:ACCELa]"
        )
    count = _count(parts[0], group)
    cls = _CLASS_ALIASES.get(parts[1])
    if cls is None:
        raise FleetSpecError(
            f"fleet group {group!r}: unknown class {parts[1]!r}; use general, accel or storage"
        )
    arch = _ARCH_ALIASES.get(parts[2])
    if arch is None:
        raise FleetSpecError(
            f"fleet group {group!r}: unknown architecture {parts[2]!r}; use x86_64 or arm64"
        )
    cores = _size(parts[3], "c", group, "cores, e.g. 64c")
    mem = _size(parts[4], "g", group, "memory in GiB, e.g. 256g")
    accel = _size(parts[5], "a", group, "accelerators, e.g. 4a") if len(parts) == 6 else 0.0
    if cores < 1 or cores != int(cores):
        raise FleetSpecError(f"fleet group {group!r}: cores must be a whole number >= 1")
    if accel != int(accel):
        raise FleetSpecError(f"fleet group {group!r}: accelerators must be a whole number")
    base = _preset_for(cls, arch)
    if base is None:
        raise FleetSpecError(
            f"fleet group {group!r}: no campus server type is {cls.value} {arch.value}, so there "
            "is no power model for it"
        )
    k = cores / base.capacity.cpu
    bp = base.power
    ka = accel / base.capacity.accel if base.capacity.accel else 0.0
    accel_idle, accel_peak = bp.accel_idle_w * ka, bp.accel_peak_w * ka
    idle = (bp.idle_w - bp.accel_idle_w) * k + accel_idle
    power = replace(
        bp,
        idle_w=idle,
        peak_w=(bp.peak_w - bp.accel_peak_w) * k + accel_peak,
        parked_w=min(bp.parked_w, idle),
        accel_idle_w=accel_idle,
        accel_peak_w=accel_peak,
    )
    clusters = base.topology.clusters if base.topology else ((0,),)
    n_clusters = min(len(clusters), int(cores))
    node = replace(
        base,
        capacity=Resources(cpu=cores, mem_gib=mem, accel=int(accel), iops_k=base.capacity.iops_k),
        power=power,
        topology=CoreTopology.uniform(int(cores), n_clusters),
    )
    pool = f"{base.labels['pool']}-{int(cores)}c"
    return count, replace(node, labels={**node.labels, "pool": pool}), pool


def _count(text: str, group: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise FleetSpecError(f"fleet group {group!r}: count {text!r} must be a whole number >= 1")
    return int(text)


def _size(text: str, unit: str, group: str, what: str) -> float:
    m = _SIZE.fullmatch(text)
    if not m or m.group(2) != unit:
        raise FleetSpecError(f"fleet group {group!r}: {text!r} is not {what}")
    return float(m.group(1))


def peak_cpu(intervals: Sequence[tuple[float, float, float]]) -> float:
    """Peak concurrent CPU of ``(start, duration, cores)`` intervals, each running from its
    start without waiting (a task ending at ``t`` frees its cores before one starting at ``t``
    takes them)."""
    events: list[tuple[float, int, float]] = []
    for start, duration, cores in intervals:
        events.append((start, 1, cores))
        events.append((start + duration, 0, -cores))
    events.sort()
    level = peak = 0.0
    for _, _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def default_fleet(
    intervals: Sequence[tuple[float, float, float]], fill: float = DEFAULT_PEAK_FILL
) -> tuple[Node, ...]:
    """x86 general servers (64 cores, 256 GiB), as many as make the intervals' peak CPU
    ``fill`` of the fleet's (at least one)."""
    if not 0 < fill <= 1:
        raise ValueError(f"fill must be in (0, 1], got {fill}")
    cores = presets()[DEFAULT_TYPE].capacity.cpu
    count = max(1, math.ceil(peak_cpu(intervals) / fill / cores))
    return parse_fleet(f"{min(count, MAX_NODES)}x{DEFAULT_TYPE}")
