"""Resource-awareness agent: sample a node's CPU, frequency, memory, network and power.

Role: the lightweight per-server sampler of the resource-awareness tier. :class:`Agent` turns
psutil counters and sysfs power sensors into frozen :class:`Sample` records on the caller's
clock (``sample(now)``); the edge sub-engine feeds them to the scheduler and the fleet view.

* *CPU*: per-core utilization in [0, 1] from deltas of ``psutil.cpu_times(percpu=True)`` kept
  by the agent itself (psutil's ``cpu_percent(interval=None)`` keeps one baseline per process,
  so any other caller would skew ours); busy time excludes idle and iowait, and guest time is
  not counted twice, as psutil does. The first sample measures from the agent's construction.
* *Network*: bytes/s summed over physical interfaces (those with a ``device`` link in
  ``sys/class/net``; all but loopback when none has one), from deltas between samples; the
  first sample reports 0.
* *Power*: :class:`PowerMeter` picks the best source when built:

  1. ``hwmon`` when an ACPI ``power_meter`` sensor exists (whole-server power);
  2. ``rapl``: ``sys/class/powercap/intel-rapl:N`` package zones (not subzones, not psys),
     ``delta energy_uj / delta t``, wrap-around corrected with ``max_energy_range_uj``.
     Package power only (no fans, disks, PSU loss). The first read has no delta and falls back
     to the model for that one sample;
  3. ``hwmon``: ``sys/class/hwmon/hwmon*/power*_input`` (microwatts; ``power*_average`` when
     a channel has no input) summed, skipping PSU output channels (labelled ``pout``) whose
     energy the PSU input channel already counts. ARM servers expose their sensors here;
  4. ``model``: ``PowerModel.power(cpu_total)``.

  Any sample whose sensor read fails is taken from the model and marked estimated.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from edgesched.core.model import PowerModel
from edgesched.edge.hal import HardwareProfile
from edgesched.edge.sysfs import listdir, read_int, read_text

GIB = 1024.0**3
SOURCE_RAPL = "rapl"
SOURCE_HWMON = "hwmon"
SOURCE_MODEL = "model"


@dataclass(frozen=True, slots=True)
class Sample:
    """One resource sample at ``at`` (caller's clock, seconds). ``power_source`` is where this
    sample's watts came from; ``power_estimated`` is True when that is the model."""

    at: float
    cpu_per_core: tuple[float, ...]
    cpu_total: float
    freq_mhz: tuple[float, ...]
    mem_used_gib: float
    mem_total_gib: float
    net_rx_bps: float
    net_tx_bps: float
    power_w: float
    power_source: str
    power_estimated: bool

    def to_json(self) -> dict[str, object]:
        """A JSON-ready view (rates in bytes/s, power in W)."""
        return {
            "at": self.at,
            "cpu_per_core": [round(u, 4) for u in self.cpu_per_core],
            "cpu_total": round(self.cpu_total, 4),
            "freq_mhz": [round(f, 1) for f in self.freq_mhz],
            "mem_used_gib": round(self.mem_used_gib, 4),
            "mem_total_gib": round(self.mem_total_gib, 4),
            "net_rx_bps": round(self.net_rx_bps, 1),
            "net_tx_bps": round(self.net_tx_bps, 1),
            "power_w": round(self.power_w, 3),
            "power_source": self.power_source,
            "power_estimated": self.power_estimated,
        }


@dataclass(frozen=True, slots=True)
class PowerReading:
    """Watts, the source that produced them, and whether they are a model estimate."""

    watts: float
    source: str
    estimated: bool


# --------------------------------------------------------------------------- sysfs sensors


@dataclass(frozen=True, slots=True)
class RaplZone:
    """A RAPL package zone: its ``energy_uj`` file and counter range (None when unknown)."""

    energy: Path
    max_energy_uj: int | None


def rapl_zones(root: Path) -> tuple[RaplZone, ...]:
    """Readable top-level RAPL package zones (``intel-rapl:N`` whose name starts "package",
    or every top-level zone when none is named)."""
    zones: list[tuple[str | None, RaplZone]] = []
    for zone in listdir(root / "sys/class/powercap"):
        if not re.fullmatch(r"intel-rapl:\d+", zone.name):
            continue  # subzones (intel-rapl:0:0), intel-rapl-mmio duplicates
        if read_int(zone / "energy_uj") is None:
            continue  # missing, or root-only (the default since 2020)
        name = read_text(zone / "name")
        zones.append((name, RaplZone(zone / "energy_uj", read_int(zone / "max_energy_range_uj"))))
    packages = [z for name, z in zones if name and name.startswith("package")]
    if packages:
        return tuple(packages)
    return tuple(z for name, z in zones if name is None)


def rapl_delta_uj(before: int, after: int, max_energy_uj: int | None) -> int | None:
    """Energy used between two counter reads, correcting one wrap-around; None when the
    counter went backwards and its range is unknown."""
    if after >= before:
        return after - before
    if max_energy_uj is None or max_energy_uj <= 0:
        return None
    return after + max_energy_uj - before


@dataclass(frozen=True, slots=True)
class HwmonChannel:
    """One hwmon power channel file (microwatts) and its device's name."""

    path: Path
    device: str


def hwmon_channels(root: Path) -> tuple[HwmonChannel, ...]:
    """Readable power channels; when an ACPI ``power_meter`` exists, only its channels."""
    channels: list[HwmonChannel] = []
    for hw in listdir(root / "sys/class/hwmon"):
        device = read_text(hw / "name") or hw.name
        indices = sorted(
            {m.group(1) for p in listdir(hw) if (m := re.fullmatch(r"power(\d+)_\w+", p.name))},
            key=int,
        )
        for idx in indices:
            label = (read_text(hw / f"power{idx}_label") or "").lower()
            if label.startswith("pout"):
                continue
            for suffix in ("input", "average"):
                path = hw / f"power{idx}_{suffix}"
                if read_int(path) is not None:
                    channels.append(HwmonChannel(path, device))
                    break
    meters = [c for c in channels if c.device == "power_meter"]
    return tuple(meters or channels)


class PowerMeter:
    """Node power in watts from the best available source (see the module docstring)."""

    def __init__(self, root: Path, model: PowerModel) -> None:
        self.model = model
        self._rapl = rapl_zones(root)
        self._hwmon = hwmon_channels(root)
        self._last: tuple[float, tuple[int, ...]] | None = None
        if self._hwmon and any(c.device == "power_meter" for c in self._hwmon):
            self.source = SOURCE_HWMON
        elif self._rapl:
            self.source = SOURCE_RAPL
        elif self._hwmon:
            self.source = SOURCE_HWMON
        else:
            self.source = SOURCE_MODEL

    def _modelled(self, cpu_utilization: float) -> PowerReading:
        return PowerReading(self.model.power(cpu_utilization), SOURCE_MODEL, True)

    def _read_rapl(self, now: float) -> float | None:
        energies: list[int] = []
        for zone in self._rapl:
            value = read_int(zone.energy)
            if value is None:
                self._last = None
                return None
            energies.append(value)
        last, self._last = self._last, (now, tuple(energies))
        if last is None or now <= last[0]:
            return None
        total = 0
        for zone, before, after in zip(self._rapl, last[1], energies, strict=True):
            delta = rapl_delta_uj(before, after, zone.max_energy_uj)
            if delta is None:
                return None
            total += delta
        return total / 1e6 / (now - last[0])

    def _read_hwmon(self) -> float | None:
        total = 0
        for channel in self._hwmon:
            value = read_int(channel.path)
            if value is None:
                return None
            total += value
        return total / 1e6

    def measure(self, now: float, cpu_utilization: float) -> PowerReading:
        """Power at ``now`` (caller's clock, seconds) with CPU utilization in [0, 1]."""
        if self.source == SOURCE_RAPL:
            watts = self._read_rapl(now)
        elif self.source == SOURCE_HWMON:
            watts = self._read_hwmon()
        else:
            watts = None
        if watts is None or not math.isfinite(watts) or watts < 0:
            return self._modelled(cpu_utilization)
        return PowerReading(watts, self.source, False)

    def read(self, now: float, cpu_utilization: float) -> float:
        """Watts (see :meth:`measure` for where they came from)."""
        return self.measure(now, cpu_utilization).watts


# --------------------------------------------------------------------------- CPU and network


def busy_fraction(before: Any, after: Any) -> float:
    """Busy share of CPU time between two ``psutil`` cpu-times records, in [0, 1].

    Busy is everything but idle and iowait; guest and guest_nice are already inside user and
    nice on Linux, so they are left out of the total (psutil's own rule).
    """

    def split(t: Any) -> tuple[float, float]:
        total = sum(t)
        total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
        idle = t.idle + getattr(t, "iowait", 0.0)
        return total, total - idle

    total0, busy0 = split(before)
    total1, busy1 = split(after)
    d_total = total1 - total0
    if d_total <= 0:
        return 0.0
    return min(max((busy1 - busy0) / d_total, 0.0), 1.0)


def physical_interfaces(root: Path, names: Sequence[str]) -> tuple[str, ...]:
    """Of ``names``, those backed by a device in ``sys/class/net`` (all but ``lo`` if none)."""
    physical = tuple(n for n in names if os.path.lexists(root / "sys/class/net" / n / "device"))
    return physical or tuple(n for n in names if n != "lo")


def _net_bytes(root: Path) -> tuple[int, int]:
    counters: Mapping[str, Any] = psutil.net_io_counters(pernic=True)
    nics = physical_interfaces(root, sorted(counters))
    return (
        sum(counters[n].bytes_recv for n in nics),
        sum(counters[n].bytes_sent for n in nics),
    )


def _freqs() -> tuple[float, ...]:
    try:
        freqs = psutil.cpu_freq(percpu=True)
    except (AttributeError, NotImplementedError, OSError, RuntimeError):
        return ()
    return tuple(float(f.current) for f in freqs or () if f is not None)


class Agent:
    """Samples this node. Build once (it keeps CPU and network baselines), then call
    :meth:`sample` with the caller's clock."""

    def __init__(self, profile: HardwareProfile, power: PowerModel, root: Path = Path("/")) -> None:
        self.profile = profile
        self.root = root
        self.meter = PowerMeter(root, power)
        self._cpu_times: list[Any] = list(psutil.cpu_times(percpu=True))
        self._net: tuple[float, int, int] | None = None

    def sample(self, now: float, parked: bool = False) -> Sample:
        """A sample at ``now``: CPU since the previous sample (or construction), network rates
        since the previous sample (0 on the first), current memory, frequency and power. A
        ``parked`` node with no power meter reports its model's parked draw."""
        times = list(psutil.cpu_times(percpu=True))
        per_core = tuple(busy_fraction(b, a) for b, a in zip(self._cpu_times, times, strict=False))
        if len(times) != len(self._cpu_times):  # a CPU went on/offline: restart baselines
            per_core = tuple(0.0 for _ in times)
        self._cpu_times = times
        cpu_total = math.fsum(per_core) / len(per_core) if per_core else 0.0

        rx, tx = _net_bytes(self.root)
        rx_bps = tx_bps = 0.0
        if self._net is not None and now > self._net[0]:
            dt = now - self._net[0]
            rx_bps = max(rx - self._net[1], 0) / dt
            tx_bps = max(tx - self._net[2], 0) / dt
        self._net = (now, rx, tx)

        mem = psutil.virtual_memory()
        reading = self.meter.measure(now, cpu_total)
        if parked and reading.estimated:
            reading = PowerReading(self.meter.model.parked_w, "model-parked", True)
        return Sample(
            at=now,
            cpu_per_core=per_core,
            cpu_total=cpu_total,
            freq_mhz=_freqs(),
            mem_used_gib=(mem.total - mem.available) / GIB,
            mem_total_gib=mem.total / GIB,
            net_rx_bps=rx_bps,
            net_tx_bps=tx_bps,
            power_w=reading.watts,
            power_source=reading.source,
            power_estimated=reading.estimated,
        )
