"""The fleet over the day, for the dashboard's fleet panel and ``GET /v1/fleet``.

Every ``DEMAND_SAMPLE_S`` (5 s) central takes one :class:`FleetSample` (what the nodes
measure: CPU utilization weighted by their cores, the power they draw; what central knows:
the CPU the fleet's tasks ask for, the CPU online, the 15-minute peak forecast, the tidal
window and the share each workload class is guaranteed and uses). :class:`FleetSeries`
keeps one point a minute (the samples' means) for the last 24 hours, 1,440 points, and the
energy drawn since midnight (UTC, the clock the tidal profiles read), integrated from the
power samples: a gap longer than ``MAX_GAP_S`` (central stopped, its loop held) counts
nothing rather than guessing.

Pure: the caller passes each sample with its time. Memory is bounded by the point count,
whatever the fleet's size.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

SECONDS_PER_DAY = 86_400
POINT_S = 60.0
KEEP_POINTS = 1_440  # a day of minutes
#: A power sample further than this from the last counts no energy (no guessing over gaps).
MAX_GAP_S = 60.0


@dataclass(frozen=True, slots=True)
class FleetSample:
    """The fleet at one time. ``util``: 0..1, the nodes' measured CPU utilization weighted
    by their cores (None: no node measured recently); ``power_w``: the power they report
    (summed); ``demand_cpu``: cores the tasks placed, running and waiting ask for;
    ``capacity_cpu``: cores of the nodes central may place on; ``forecast_cpu``: the peak
    the last forecast expects over the next 15 minutes (None before one); ``window``: the
    tidal window now (None outside any); ``shares``: each workload class's guaranteed share
    of CPU in it; ``used``: each class's share of capacity in use now."""

    at: float
    util: float | None
    power_w: float
    demand_cpu: float
    capacity_cpu: float
    forecast_cpu: float | None = None
    window: str | None = None
    shares: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)
    nodes_measured: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "util": _round(self.util),
            "power_w": round(self.power_w, 1),
            "demand_cpu": round(self.demand_cpu, 3),
            "capacity_cpu": round(self.capacity_cpu, 3),
            "forecast_cpu": _round(self.forecast_cpu),
            "window": self.window,
            "shares": {k: round(v, 4) for k, v in sorted(self.shares.items())},
            "used": {k: round(v, 4) for k, v in sorted(self.used.items())},
            "nodes_measured": self.nodes_measured,
        }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class _Bucket:
    """The samples of one minute, summed."""

    start: float
    n: int = 0
    util_sum: float = 0.0
    util_n: int = 0
    power_sum: float = 0.0
    demand_sum: float = 0.0
    capacity_sum: float = 0.0
    forecast: float | None = None

    def add(self, s: FleetSample) -> None:
        self.n += 1
        if s.util is not None:
            self.util_sum += s.util
            self.util_n += 1
        self.power_sum += s.power_w
        self.demand_sum += s.demand_cpu
        self.capacity_sum += s.capacity_cpu
        if s.forecast_cpu is not None:
            self.forecast = s.forecast_cpu

    def point(self, energy_wh: float) -> dict[str, Any]:
        n = max(1, self.n)
        return {
            "at": self.start,
            "util": None if not self.util_n else round(self.util_sum / self.util_n, 4),
            "power_w": round(self.power_sum / n, 1),
            "demand_cpu": round(self.demand_sum / n, 3),
            "capacity_cpu": round(self.capacity_sum / n, 3),
            "forecast_cpu": _round(self.forecast),
            "energy_wh": round(energy_wh, 2),
        }


class FleetSeries:
    """A day of the fleet, a point a minute, and today's energy."""

    def __init__(self, keep: int = KEEP_POINTS, point_s: float = POINT_S) -> None:
        if keep < 1 or not (math.isfinite(point_s) and point_s > 0):
            raise ValueError("keep >= 1 and a finite point_s > 0")
        self.point_s = point_s
        self.points: deque[dict[str, Any]] = deque(maxlen=keep)
        self.latest: FleetSample | None = None
        self.energy_wh = 0.0  # since midnight UTC of ``day``
        self.day: int | None = None
        self._bucket: _Bucket | None = None

    def observe(self, sample: FleetSample) -> None:
        """Take one sample (times must not go back: an older one is ignored)."""
        last = self.latest
        if last is not None and sample.at < last.at:
            return
        day = int(sample.at // SECONDS_PER_DAY)
        if self.day != day:
            if self.day is not None and last is not None:
                # the part of the last interval before midnight went to the old day
                midnight = day * SECONDS_PER_DAY
                gap = sample.at - last.at
                if 0 < gap <= MAX_GAP_S:
                    self.energy_wh = sample.power_w * (sample.at - midnight) / 3600
                else:
                    self.energy_wh = 0.0
            self.day = day
        elif last is not None:
            gap = sample.at - last.at
            if 0 < gap <= MAX_GAP_S:  # trapezoid over the interval
                self.energy_wh += (last.power_w + sample.power_w) / 2 * gap / 3600
        start = sample.at - sample.at % self.point_s
        bucket = self._bucket
        if bucket is not None and bucket.start != start:
            self.points.append(bucket.point(self.energy_wh))
            bucket = None
        if bucket is None:
            bucket = self._bucket = _Bucket(start)
        bucket.add(sample)
        self.latest = sample

    def series(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The closed points from ``since`` on, oldest first, then the open minute's."""
        out = [p for p in self.points if p["at"] >= since]
        if self._bucket is not None and self._bucket.start >= since:
            out.append(self._bucket.point(self.energy_wh))
        return out

    def now(self) -> dict[str, Any] | None:
        """The latest sample with today's energy, or None before the first."""
        if self.latest is None:
            return None
        return {**self.latest.to_json(), "energy_today_wh": round(self.energy_wh, 2)}
