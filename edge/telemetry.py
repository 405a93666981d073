"""What a node's telemetry says: this host as measured, or the server the node registered as.

Central shows each node's telemetry (``cpu_util``, ``mem_util``, ``power_w``, ``tasks_running``,
:class:`edgesched.sync.telemetry.Telemetry`) on its dashboard and ``/v1/nodes``. ``[edge]
telemetry_source`` says where the figures come from:

* ``host`` (the default; a real gateway): :func:`host_telemetry`, the agent's sample of this
  machine (psutil's CPU and memory, the power meter or the power model at the measured CPU);
* ``reserved`` (a simulated node, ``hal_root`` elsewhere: the demo runs several on one host,
  whose measurements would describe none of them): :func:`reserved_telemetry`, the registered
  server at what its placed and running tasks reserve. CPU and memory are the reserved share
  of the registered capacity; power is the registered power model
  (:class:`edgesched.core.model.PowerModel`) at the larger of the reserved CPU and accelerator
  shares, the figure the demo's energy report integrates; a parked node draws ``parked_w``.

Either way the node's own samples (SQLite, ``/metrics``) measure this host, and
``tasks_running`` counts the task processes the executor tracks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from edgesched.core.model import Node, Resources
from edgesched.edge.agent import Sample
from edgesched.sync.telemetry import Telemetry


def _share(used: float, capacity: float) -> float:
    """``used / capacity`` clamped to [0, 1]; 0 for a capacity the server does not have."""
    if capacity <= 0:
        return 0.0
    return min(1.0, max(0.0, used / capacity))


def host_telemetry(sample: Sample, tasks_running: int) -> Telemetry:
    """This machine, as the agent sampled it."""
    return Telemetry(
        at=sample.at,
        cpu_util=min(1.0, max(0.0, sample.cpu_total)),
        mem_util=_share(sample.mem_used_gib, sample.mem_total_gib),
        power_w=max(0.0, sample.power_w),
        tasks_running=tasks_running,
    )


def reserved_telemetry(
    node: Node,
    reserved: Iterable[Resources],
    *,
    at: float,
    tasks_running: int,
    parked: bool = False,
) -> Telemetry:
    """The registered server ``node`` holding ``reserved`` (one demand per placed or running
    task): shares of its capacity, and its power model at the busier of CPU and accelerators."""
    demands = list(reserved)
    cap = node.capacity
    cpu = _share(math.fsum(d.cpu for d in demands), cap.cpu)
    mem = _share(math.fsum(d.mem_gib for d in demands), cap.mem_gib)
    accel = _share(sum(d.accel for d in demands), cap.accel)
    power = node.power.parked_w if parked else node.power.power(max(cpu, accel))
    return Telemetry(at=at, cpu_util=cpu, mem_util=mem, power_w=power, tasks_running=tasks_running)
