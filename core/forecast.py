"""Short-horizon CPU demand forecasting: the forecaster interface and simple baselines.

The energy policy keeps enough capacity awake for the demand expected over the next 15 minutes
(:func:`peak_next`). A forecaster is any object with a ``name`` and a pure
``forecast(history, horizon_steps)`` (the :class:`Forecaster` protocol); this module holds the
history type, three baselines (:class:`SeasonalNaive`, :class:`Ewma`, :class:`SeasonalEwma`) and a
rolling-origin error helper (:func:`mae`) for benchmarks, and :func:`peak_upper`, a point
forecast's peak raised to an upper quantile of its own recent shortfalls (what the energy
mode keeps awake for: the mean is exceeded half the time).

A learned model fits the same protocol: it reads the last N samples (:meth:`DemandHistory.tail`)
and the time-of-day features (:func:`time_of_day_features`) of the samples it predicts, whose
start times are :meth:`DemandHistory.future_times`. No clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from edgesched.core.model import SECONDS_PER_DAY

#: Relative slack when checking that a period is a whole number of sample steps.
_STEP_SLACK = 1e-6


@dataclass(frozen=True, slots=True)
class DemandHistory:
    """Evenly spaced CPU demand samples (cores), oldest first.

    Sample ``i`` of ``n`` covers ``[end_s - (n - i) * step_s, end_s - (n - i - 1) * step_s)``:
    the last sample ends at ``end_s``. ``values`` is coerced to a tuple of floats.
    """

    step_s: float
    values: tuple[float, ...]
    end_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError(f"step_s must be finite and > 0, got {self.step_s}")
        if not math.isfinite(self.end_s):
            raise ValueError(f"end_s must be finite, got {self.end_s}")
        values = tuple(float(v) for v in self.values)
        if not values:
            raise ValueError("demand history needs at least one sample")
        for i, v in enumerate(values):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"demand sample {i} must be finite and >= 0, got {v}")
        object.__setattr__(self, "values", values)

    @property
    def start_s(self) -> float:
        """When the first sample starts."""
        return self.end_s - len(self.values) * self.step_s

    def times(self) -> tuple[float, ...]:
        """Start time of each sample."""
        start = self.start_s
        return tuple(start + i * self.step_s for i in range(len(self.values)))

    def future_times(self, horizon_steps: int) -> tuple[float, ...]:
        """Start times of the next ``horizon_steps`` samples (the ones a forecast predicts)."""
        _check_horizon(horizon_steps)
        return tuple(self.end_s + k * self.step_s for k in range(horizon_steps))

    def tail(self, count: int) -> DemandHistory:
        """The last ``count`` samples (all of them when there are fewer)."""
        if count < 1:
            raise ValueError(f"tail needs count >= 1, got {count}")
        return DemandHistory(self.step_s, self.values[-count:], self.end_s)


def asked_history(
    starts: npt.ArrayLike,
    durations: npt.ArrayLike,
    cpu: npt.ArrayLike,
    start_s: float,
    end_s: float,
    step_s: float = 300.0,
) -> DemandHistory | None:
    """The CPU asked (cores, as means per ``step_s``) over ``[start_s, end_s)`` by tasks that
    each ran from ``starts[i]`` for ``durations[i]`` seconds asking ``cpu[i]`` cores: the
    demand history a store would hold of work that ran as it arrived (a scenario's prior, see
    :func:`edgesched.core.simulator.simulate`). ``end_s - start_s`` is rounded down to whole
    steps, kept at the end; None when that leaves no step."""
    steps = math.floor((end_s - start_s) / step_s + _STEP_SLACK)
    if steps < 1:
        return None
    edges = end_s - step_s * np.arange(steps, -1, -1, dtype=np.float64)
    t = np.asarray(starts, dtype=np.float64)
    c = np.asarray(cpu, dtype=np.float64)
    a = np.clip(t, edges[0], end_s)
    b = np.clip(t + np.asarray(durations, dtype=np.float64), edges[0], end_s)
    keep = (b > a) & (c > 0)
    # the integral of the CPU asked from edges[0] to each edge: sum of c * (x - a) over the
    # tasks started before x, less the same over the tasks ended before x
    integral = np.zeros(len(edges), dtype=np.float64)
    for times, sign in ((a[keep], 1.0), (b[keep], -1.0)):
        order = np.argsort(times, kind="stable")
        at, weight = times[order], c[keep][order]
        cum_c = np.concatenate(([0.0], np.cumsum(weight)))
        cum_ca = np.concatenate(([0.0], np.cumsum(weight * at)))
        i = np.searchsorted(at, edges, side="right")
        integral += sign * (edges * cum_c[i] - cum_ca[i])
    values = np.maximum(np.diff(integral) / step_s, 0.0)
    return DemandHistory(step_s, tuple(values.tolist()), end_s)


class Forecaster(Protocol):
    """Predicts the next ``horizon_steps`` samples of a :class:`DemandHistory`.

    ``forecast`` must be a pure function of its arguments and return exactly ``horizon_steps``
    finite, non-negative values spaced ``history.step_s`` apart, starting at ``history.end_s``.
    It raises ValueError for a ``horizon_steps`` below 1 or a history it cannot use.
    """

    @property
    def name(self) -> str: ...

    def forecast(self, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]: ...


def time_of_day_features(t: float) -> tuple[float, float]:
    """``(sin, cos)`` of the time of day of ``t``: a continuous encoding for learned models."""
    angle = 2.0 * math.pi * ((t % SECONDS_PER_DAY) / SECONDS_PER_DAY)
    return math.sin(angle), math.cos(angle)


def peak_next(forecaster: Forecaster, history: DemandHistory, horizon_s: float = 900.0) -> float:
    """The highest demand ``forecaster`` expects over the next ``horizon_s`` seconds."""
    if not (math.isfinite(horizon_s) and horizon_s > 0):
        raise ValueError(f"horizon_s must be finite and > 0, got {horizon_s}")
    steps = max(1, math.ceil(horizon_s / history.step_s - _STEP_SLACK))
    return max(forecaster.forecast(history, steps))


def peak_upper(
    peak: Callable[[DemandHistory, float], float],
    history: DemandHistory,
    horizon_s: float = 900.0,
    *,
    quantile: float = 0.9,
    lookback: int = 24,
    min_errors: int = 4,
) -> float:
    """An upper ``quantile`` of the demand peak over the next ``horizon_s``, not the mean:
    ``peak(history, horizon_s)`` plus the ``quantile`` of how far the same forecast fell
    short of the realized peak at the last ``lookback`` origins of ``history`` (rolling
    origin, as :func:`mae`; an overshoot counts as a shortfall of 0). With fewer than
    ``min_errors`` origins to learn from, the highest sample seen is the floor instead
    (a young history has not shown its spread yet). ``peak`` is any point forecast of the
    highest demand over a horizon, e.g. ``lambda h, s: peak_next(Ewma(), h, s)``."""
    if not 0 <= quantile <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    if lookback < 1 or min_errors < 1:
        raise ValueError("lookback and min_errors must be >= 1")
    point = peak(history, horizon_s)
    values = history.values
    steps = max(1, math.ceil(horizon_s / history.step_s - _STEP_SLACK))
    n = len(values)
    origins = range(max(1, n - steps - lookback + 1), n - steps + 1)
    shortfalls: list[float] = []
    for t in origins:
        past = DemandHistory(history.step_s, values[:t], history.start_s + t * history.step_s)
        shortfalls.append(max(0.0, max(values[t : t + steps]) - peak(past, horizon_s)))
    if len(shortfalls) < min_errors:
        return max(point, max(values))
    shortfalls.sort()
    at = quantile * (len(shortfalls) - 1)
    low = math.floor(at)
    high = min(low + 1, len(shortfalls) - 1)
    margin = shortfalls[low] + (shortfalls[high] - shortfalls[low]) * (at - low)
    return point + margin


@dataclass(frozen=True, slots=True)
class SeasonalNaive:
    """The value one period ago at the same phase; the last value while history is shorter."""

    period_s: float = SECONDS_PER_DAY

    def __post_init__(self) -> None:
        _check_period(self.period_s)

    @property
    def name(self) -> str:
        return "seasonal-naive"

    def forecast(self, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]:
        _check_horizon(horizon_steps)
        period = _period_steps(self.period_s, history.step_s)
        values = history.values
        n = len(values)
        if n < period:
            return (values[-1],) * horizon_steps
        return tuple(values[n - period + k % period] for k in range(horizon_steps))


@dataclass(frozen=True, slots=True)
class Ewma:
    """Holt's linear smoothing with a damped trend, clamped at 0.

    ``alpha`` smooths the level, ``trend_beta`` the trend; the trend's contribution ``h`` steps
    ahead is ``(damping + damping**2 + ... + damping**h) * trend`` (``damping = 1`` is plain
    Holt, which extrapolates a linear series exactly). ``flat_start`` starts the trend at 0
    rather than at the first two samples' difference: a history that begins on an empty
    fleet begins with a ramp that is no trend, and the damped trend carried it for hours.
    """

    alpha: float = 0.3
    trend_beta: float = 0.1
    damping: float = 0.98
    flat_start: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0 <= self.trend_beta <= 1:
            raise ValueError(f"trend_beta must be in [0, 1], got {self.trend_beta}")
        if not 0 <= self.damping <= 1:
            raise ValueError(f"damping must be in [0, 1], got {self.damping}")

    @property
    def name(self) -> str:
        return "ewma"

    def forecast(self, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]:
        _check_horizon(horizon_steps)
        level, trend = _holt(
            history.values, self.alpha, self.trend_beta, self.damping, self.flat_start
        )
        out: list[float] = []
        reach = 0.0
        factor = 1.0
        for _ in range(horizon_steps):
            factor *= self.damping
            reach += factor
            out.append(max(0.0, level + reach * trend))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class SeasonalEwma:
    """Additive Holt-Winters without trend: a smoothed seasonal profile plus a recent level.

    The level follows deseasonalised demand with ``alpha``; each phase of the profile is smoothed
    across periods with ``season_gamma``. Needs one full period of history; before that it
    falls back to :class:`Ewma` with the same ``alpha``. Clamped at 0.
    """

    period_s: float = SECONDS_PER_DAY
    alpha: float = 0.3
    season_gamma: float = 0.2

    def __post_init__(self) -> None:
        _check_period(self.period_s)
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0 <= self.season_gamma <= 1:
            raise ValueError(f"season_gamma must be in [0, 1], got {self.season_gamma}")

    @property
    def name(self) -> str:
        return "seasonal-ewma"

    def forecast(self, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]:
        _check_horizon(horizon_steps)
        period = _period_steps(self.period_s, history.step_s)
        values = history.values
        n = len(values)
        if n < period:
            return Ewma(alpha=self.alpha).forecast(history, horizon_steps)
        a, g = self.alpha, self.season_gamma
        level = math.fsum(values[:period]) / period
        season = [v - level for v in values[:period]]
        for t in range(period, n):
            j = t % period
            previous = season[j]
            level = a * (values[t] - previous) + (1 - a) * level
            season[j] = g * (values[t] - level) + (1 - g) * previous
        return tuple(max(0.0, level + season[(n + k) % period]) for k in range(horizon_steps))


def mae(
    forecaster: Forecaster,
    series: Sequence[float],
    step_s: float,
    horizon_steps: int,
    warmup: int,
    *,
    start_s: float = 0.0,
    lookback: int | None = None,
    stride: int = 1,
) -> float:
    """Mean absolute error of ``forecaster`` by rolling-origin evaluation over ``series``.

    ``series[0]`` starts at ``start_s``. For each origin ``t`` in ``warmup, warmup + stride, ...``
    with ``t + horizon_steps <= len(series)``, the forecaster sees ``series[:t]`` (only the last
    ``lookback`` samples when set, to bound the cost) and its ``horizon_steps`` predictions are
    compared with ``series[t:t + horizon_steps]``. Every predicted sample counts once.
    """
    _check_horizon(horizon_steps)
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1, got {warmup}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if lookback is not None and lookback < 1:
        raise ValueError(f"lookback must be >= 1, got {lookback}")
    whole = DemandHistory(step_s, tuple(series), start_s + len(series) * step_s)
    values = whole.values
    origins = range(warmup, len(values) - horizon_steps + 1, stride)
    if not origins:
        raise ValueError(
            f"series of {len(values)} samples is too short for warmup={warmup} "
            f"and horizon_steps={horizon_steps}"
        )
    errors: list[float] = []
    for t in origins:
        first = 0 if lookback is None else max(0, t - lookback)
        history = DemandHistory(step_s, values[first:t], start_s + t * step_s)
        predicted = forecaster.forecast(history, horizon_steps)
        if len(predicted) != horizon_steps:
            raise ValueError(
                f"forecaster {forecaster.name!r} returned {len(predicted)} samples, "
                f"expected {horizon_steps}"
            )
        errors.extend(
            abs(p - a) for p, a in zip(predicted, values[t : t + horizon_steps], strict=True)
        )
    return math.fsum(errors) / len(errors)


def _check_period(period_s: float) -> None:
    if not (math.isfinite(period_s) and period_s > 0):
        raise ValueError(f"period_s must be finite and > 0, got {period_s}")


def _check_horizon(horizon_steps: int) -> None:
    if horizon_steps < 1:
        raise ValueError(f"horizon_steps must be >= 1, got {horizon_steps}")


def _period_steps(period_s: float, step_s: float) -> int:
    """``period_s`` as a whole number of ``step_s`` steps (ValueError when it is not)."""
    steps = period_s / step_s
    whole = round(steps)
    if whole < 1 or abs(steps - whole) > _STEP_SLACK * steps:
        raise ValueError(
            f"period_s={period_s} must be a whole multiple of the sample step {step_s}"
        )
    return whole


def _holt(
    values: Sequence[float], alpha: float, beta: float, damping: float, flat: bool = False
) -> tuple[float, float]:
    """Final (level, trend) of damped Holt smoothing, started from the first two samples
    (``flat``: from the first sample and no trend)."""
    level = values[0]
    trend = values[1] - values[0] if len(values) > 1 and not flat else 0.0
    for x in values[1:]:
        previous = level
        level = alpha * x + (1 - alpha) * (previous + damping * trend)
        trend = beta * (level - previous) + (1 - beta) * damping * trend
    return level, trend
