"""Per-workload-class demand history and the fleet's (or node's) 15-minute peak forecast.

Both engines feed :class:`ClassDemand` with what each workload class asks for now (the CPU
requests of its running and waiting tasks, in cores: the *offered* demand the per-class
forecaster was trained on) at every sample; it folds the samples into 5-minute means per class
and keeps the last ``keep`` closed bins. :func:`peak_over_classes` asks a forecaster per class
for the next steps, sums the classes step by step and returns the highest sum: the CPU the
energy policy keeps awake ahead of a peak (``ClusterView.forecast_cpu``).

Pure: the caller passes the time, and picks the forecaster per class (the ONNX model for the
classes it knows, a heuristic for the others). :meth:`ClassDemand.to_json` /
:meth:`ClassDemand.from_json` let an engine keep its history across restarts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgesched.core.forecast import DemandHistory, Forecaster

#: The forecaster's sample spacing: 5-minute means.
BIN_S = 300.0
#: Closed bins kept per class (2 hours: the per-class model reads 24 lags).
KEEP_BINS = 24
#: Classes tracked at most: the rest are summed into one ``"other"`` class (bounded memory).
MAX_CLASSES = 64
#: Demand of one class is capped here (cores): the CPU requests summed over many tasks can
#: overflow to infinity (each is only checked to be finite), which no forecaster can use.
MAX_DEMAND = 1e9
OTHER = "other"


@dataclass
class ClassDemand:
    """5-minute mean demand per class; every class's bins are aligned (a class absent from a
    sample counts as 0 for it), oldest first, the last one ending at :attr:`end_s`."""

    step_s: float = BIN_S
    keep: int = KEEP_BINS
    bins: dict[str, list[float]] = field(default_factory=dict)
    end_s: float | None = None  # end of the last closed bin
    _open: tuple[float, dict[str, float], int] | None = None  # (start, sums, samples)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0) or self.keep < 1:
            raise ValueError("step_s must be > 0 and keep >= 1")

    def observe(self, now: float, demand: Mapping[str, float]) -> bool:
        """Add one sample (cores per class) taken at ``now``; True when a bin closed."""
        if not math.isfinite(now):
            raise ValueError(f"now must be finite, got {now}")
        start = now - now % self.step_s
        closed = False
        if self._open is not None and start > self._open[0]:
            self._close(start)
            closed = True
        elif self._open is not None and start < self._open[0]:
            return False  # a clock stepped back: ignore samples until it catches up
        if self._open is None:
            self._open = (start, {}, 0)
        sums = self._open[1]
        for workload, cores in self._fold(demand).items():
            sums[workload] = sums.get(workload, 0.0) + cores  # < 1e9 * samples: finite
        self._open = (start, sums, self._open[2] + 1)
        return closed

    def _fold(self, demand: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for workload, cores in demand.items():
            value = float(cores)
            if math.isnan(value) or value < 0:
                raise ValueError(f"demand of {workload!r} must be a number >= 0, got {cores}")
            value = min(value, MAX_DEMAND)
            known = workload in self.bins or len(self.bins) + len(out) < MAX_CLASSES
            key = workload if known or workload in out else OTHER
            out[key] = min(out.get(key, 0.0) + value, MAX_DEMAND)
        return out

    def _close(self, next_start: float) -> None:
        assert self._open is not None
        start, sums, count = self._open
        means = {w: s / count for w, s in sums.items()}
        width = len(next(iter(self.bins.values()), []))
        for workload in means.keys() - self.bins.keys():
            self.bins[workload] = [0.0] * width
        # Bins missed while nobody sampled (the engine was down): carry the last mean over.
        missed = min(round((next_start - start) / self.step_s) - 1, self.keep)
        for workload, values in self.bins.items():
            mean = means.get(workload, 0.0)
            values.extend([mean] * (1 + max(missed, 0)))
            del values[: max(len(values) - self.keep, 0)]
        self.end_s = next_start
        self._open = None

    def histories(self) -> dict[str, DemandHistory]:
        """Each class's closed bins as a history (empty before the first bin closes)."""
        if self.end_s is None:
            return {}
        return {
            w: DemandHistory(self.step_s, tuple(v), self.end_s)
            for w, v in sorted(self.bins.items())
            if v
        }

    def to_json(self) -> dict[str, Any]:
        return {"step_s": self.step_s, "end_s": self.end_s, "bins": self.bins}

    @classmethod
    def from_json(cls, data: object, keep: int = KEEP_BINS) -> ClassDemand:
        """A history saved by :meth:`to_json`; ValueError (naming the field) if malformed."""
        if not isinstance(data, dict):
            raise ValueError("class demand: expected an object")
        step, end, bins = data.get("step_s"), data.get("end_s"), data.get("bins")
        if not isinstance(step, int | float) or not isinstance(bins, dict):
            raise ValueError("class demand: step_s and bins are required")
        if end is not None and not (isinstance(end, int | float) and math.isfinite(end)):
            raise ValueError("class demand: end_s must be a number or null")
        out = cls(float(step), keep)
        widths = set()
        for workload, values in bins.items():
            if not isinstance(workload, str) or not isinstance(values, list):
                raise ValueError("class demand: bins maps a class to a list")
            if not all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in values):
                raise ValueError(f"class demand: bins of {workload!r} must be numbers >= 0")
            out.bins[workload] = [float(v) for v in values][-keep:]
            widths.add(len(out.bins[workload]))
        if len(widths) > 1:
            raise ValueError("class demand: every class needs the same number of bins")
        out.end_s = None if end is None else float(end)
        return out


def peak_over_classes(
    histories: Mapping[str, DemandHistory],
    forecaster_for: Callable[[str], Forecaster],
    horizon_s: float = 900.0,
) -> float | None:
    """The highest total demand (cores) over the next ``horizon_s``, summing the classes'
    forecasts step by step; None without history."""
    if not histories:
        return None
    step_s = next(iter(histories.values())).step_s
    steps = max(1, math.ceil(horizon_s / step_s - 1e-6))
    total = [0.0] * steps
    for workload, history in histories.items():
        values = forecaster_for(workload).forecast(history, steps)
        for i, v in enumerate(values[:steps]):
            total[i] += v
    return max(total)
