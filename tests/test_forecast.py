"""Tests for the demand forecaster interface and its baselines (edgesched.core.forecast)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.forecast import (
    DemandHistory,
    Ewma,
    Forecaster,
    SeasonalEwma,
    SeasonalNaive,
    mae,
    peak_next,
    time_of_day_features,
)

STEP = 300.0
DAY = 288  # 5-minute samples per day

FORECASTERS: list[Forecaster] = [SeasonalNaive(), Ewma(), SeasonalEwma()]


def history(values: list[float], step_s: float = STEP, end_s: float | None = None) -> DemandHistory:
    end = len(values) * step_s if end_s is None else end_s
    return DemandHistory(step_s, tuple(values), end)


def campus_like(days: int, noise: float, shift_from_day: int, seed: int = 1) -> list[float]:
    """A daily step-shaped demand curve with Gaussian noise, 30% higher from a given day on."""
    rng = random.Random(seed)
    out: list[float] = []
    for i in range(days * DAY):
        hour = (i % DAY) * STEP / 3600
        base = 20.0
        if 7 <= hour < 9:
            base += 60
        elif 9 <= hour < 18:
            base += 40 + 10 * math.sin(hour)
        elif hour >= 22 or hour < 6:
            base += 25
        if i >= shift_from_day * DAY:
            base *= 1.3
        out.append(max(0.0, base + rng.gauss(0, noise)))
    return out


# --- DemandHistory ---------------------------------------------------------------------------


def test_history_times_and_tail() -> None:
    h = DemandHistory(300.0, (1.0, 2.0, 3.0), end_s=1200.0)
    assert h.start_s == 300.0
    assert h.times() == (300.0, 600.0, 900.0)
    assert h.future_times(3) == (1200.0, 1500.0, 1800.0)
    assert h.tail(2) == DemandHistory(300.0, (2.0, 3.0), 1200.0)
    assert h.tail(10) == h


def test_history_coerces_values_to_float_tuple() -> None:
    h = DemandHistory(60.0, [1, 2], 0.0)  # type: ignore[arg-type]
    assert h.values == (1.0, 2.0)
    assert all(isinstance(v, float) for v in h.values)


@pytest.mark.parametrize(
    ("step", "values", "end"),
    [
        (0.0, (1.0,), 0.0),
        (-300.0, (1.0,), 0.0),
        (math.inf, (1.0,), 0.0),
        (math.nan, (1.0,), 0.0),
        (300.0, (), 0.0),
        (300.0, (1.0, -0.5), 0.0),
        (300.0, (1.0, math.nan), 0.0),
        (300.0, (math.inf,), 0.0),
        (300.0, (1.0,), math.nan),
    ],
)
def test_history_rejects_bad_input(step: float, values: tuple[float, ...], end: float) -> None:
    with pytest.raises(ValueError):
        DemandHistory(step, values, end)


def test_time_of_day_features() -> None:
    assert time_of_day_features(0.0) == pytest.approx((0.0, 1.0))
    assert time_of_day_features(6 * 3600.0) == pytest.approx((1.0, 0.0), abs=1e-12)
    assert time_of_day_features(86_400.0 + 3600) == pytest.approx(time_of_day_features(3600))


# --- exact results -----------------------------------------------------------------------------


@pytest.mark.parametrize("forecaster", FORECASTERS, ids=lambda f: f.name)
@pytest.mark.parametrize("length", [1, 2, 10, DAY + 5, 3 * DAY])
def test_constant_series_forecasts_the_constant(forecaster: Forecaster, length: int) -> None:
    out = forecaster.forecast(history([7.5] * length), 3)
    assert out == pytest.approx((7.5, 7.5, 7.5), rel=1e-12)


def test_undamped_holt_extrapolates_a_linear_series_exactly() -> None:
    values = [2.0 + 0.5 * i for i in range(50)]
    out = Ewma(damping=1.0).forecast(history(values), 3)
    assert out == pytest.approx((27.0, 27.5, 28.0), rel=1e-12)


def test_damped_trend_stays_between_last_value_and_linear_extrapolation() -> None:
    values = [2.0 + 0.5 * i for i in range(50)]
    out = Ewma().forecast(history(values), 3)
    for k, v in enumerate(out, start=1):
        assert values[-1] < v < values[-1] + 0.5 * k


def test_ewma_clamps_a_falling_trend_at_zero() -> None:
    values = [max(0.0, 50.0 - 5.0 * i) for i in range(10)]  # ..., 10, 5
    out = Ewma(damping=1.0, alpha=1.0, trend_beta=1.0).forecast(history(values), 3)
    assert out == (0.0, 0.0, 0.0)


def test_seasonal_naive_falls_back_to_last_value_on_short_history() -> None:
    values = [2.0 + 0.5 * i for i in range(DAY - 1)]
    assert SeasonalNaive().forecast(history(values), 3) == (values[-1],) * 3


@pytest.mark.parametrize("days", [1, 2, 3])
def test_seasonal_naive_reproduces_a_periodic_series_exactly(days: int) -> None:
    rng = random.Random(7)
    day = [rng.uniform(0, 100) for _ in range(DAY)]
    values = day * days + day[:17]
    out = SeasonalNaive().forecast(history(values), 3)
    assert out == tuple(day[17:20])
    # Horizons longer than one period repeat the last period.
    long = SeasonalNaive().forecast(history(day * days), DAY + 2)
    assert long == (*day, day[0], day[1])


def test_seasonal_naive_with_a_short_period() -> None:
    values = [1.0, 2.0, 3.0, 4.0] * 3  # period of 4 steps of 60 s
    out = SeasonalNaive(period_s=240.0).forecast(history(values, step_s=60.0), 6)
    assert out == (1.0, 2.0, 3.0, 4.0, 1.0, 2.0)


def test_seasonal_ewma_reproduces_a_periodic_series() -> None:
    rng = random.Random(8)
    day = [rng.uniform(0, 100) for _ in range(DAY)]
    values = day * 3 + day[:40]
    out = SeasonalEwma().forecast(history(values), 3)
    assert out == pytest.approx(tuple(day[40:43]), rel=1e-9)


# --- adaptation and accuracy -----------------------------------------------------------------


def test_ewma_adapts_to_a_level_shift() -> None:
    values = [10.0] * 50 + [20.0] * 40
    out = Ewma().forecast(history(values), 3)
    assert out == pytest.approx((20.0, 20.0, 20.0), abs=0.5)
    just_after = Ewma().forecast(history([10.0] * 50 + [20.0] * 2), 1)[0]
    assert 10.0 < just_after < 20.0


def test_seasonal_ewma_adapts_to_a_level_shift_within_a_period() -> None:
    rng = random.Random(9)
    day = [rng.uniform(20, 80) for _ in range(DAY)]
    values = day * 2 + [v + 30.0 for v in day[:60]]
    out = SeasonalEwma().forecast(history(values), 3)
    assert out == pytest.approx(tuple(v + 30.0 for v in day[60:63]), abs=1.0)


def test_seasonal_ewma_beats_both_baselines_on_noisy_daily_demand() -> None:
    series = campus_like(days=5, noise=4.0, shift_from_day=3)
    errors = {
        f.name: mae(f, series, STEP, horizon_steps=3, warmup=DAY, lookback=3 * DAY, stride=2)
        for f in FORECASTERS
    }
    assert errors["seasonal-ewma"] < 0.9 * errors["ewma"]
    assert errors["seasonal-ewma"] < 0.9 * errors["seasonal-naive"]


# --- helpers -----------------------------------------------------------------------------------


def test_peak_next_takes_the_max_over_fifteen_minutes() -> None:
    values = [1.0, 5.0, 2.0, 9.0, 3.0, 4.0]  # period of 3 steps
    h = history(values)
    assert peak_next(SeasonalNaive(period_s=900.0), h) == 9.0
    assert peak_next(SeasonalNaive(period_s=900.0), h, horizon_s=300.0) == 9.0
    # A horizon that is not a whole number of steps rounds up: 400 s -> 2 steps.
    assert peak_next(SeasonalNaive(period_s=1800.0), h, horizon_s=400.0) == 5.0


def test_peak_next_rejects_a_bad_horizon() -> None:
    with pytest.raises(ValueError):
        peak_next(Ewma(), history([1.0]), horizon_s=0.0)


def test_mae_by_hand() -> None:
    # Last-value forecasts (history shorter than the period) of 1, 2, 4, 8 with horizon 1:
    # origins 1..3 predict 1, 2, 4 for 2, 4, 8 -> errors 1, 2, 4.
    assert mae(SeasonalNaive(), [1.0, 2.0, 4.0, 8.0], STEP, 1, warmup=1) == pytest.approx(7 / 3)
    # Horizon 2 from origins 1 and 2: (|1-2| + |1-4| + |2-4| + |2-8|) / 4.
    assert mae(SeasonalNaive(), [1.0, 2.0, 4.0, 8.0], STEP, 2, warmup=1) == pytest.approx(3.0)


def test_mae_is_zero_for_a_perfect_forecaster() -> None:
    series = [3.0, 1.0, 4.0] * 5
    assert mae(SeasonalNaive(period_s=900.0), series, STEP, 3, warmup=3) == 0.0


def test_mae_passes_time_to_the_forecaster() -> None:
    seen: list[float] = []

    @dataclass(frozen=True)
    class Spy:
        name: str = "spy"

        def forecast(self, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]:
            seen.append(history.end_s)
            return (0.0,) * horizon_steps

    mae(Spy(), [1.0] * 5, 60.0, 1, warmup=2, start_s=1000.0, lookback=1)
    assert seen == [1120.0, 1180.0, 1240.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"warmup": 0},
        {"warmup": 10},
        {"warmup": 1, "horizon_steps": 0},
        {"warmup": 1, "stride": 0},
        {"warmup": 1, "lookback": 0},
        {"warmup": 1, "step_s": 0.0},
    ],
)
def test_mae_rejects_bad_input(kwargs: dict[str, float]) -> None:
    args: dict[str, float] = {"step_s": STEP, "horizon_steps": 1}
    args.update(kwargs)
    with pytest.raises(ValueError):
        mae(SeasonalNaive(), [1.0, 2.0, 3.0], **args)  # type: ignore[arg-type]


# --- protocol fit for a learned model ----------------------------------------------------------


@dataclass(frozen=True)
class WindowModel:
    """Shaped like the ONNX forecaster: last N samples plus time-of-day features in, N out."""

    window: int = 4

    @property
    def name(self) -> str:
        return "window-model"

    def forecast(self, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]:
        recent = history.tail(self.window).values
        features = [time_of_day_features(t) for t in history.future_times(horizon_steps)]
        level = sum(recent) / len(recent)
        return tuple(max(0.0, level * (1.0 + 0.1 * sin)) for sin, _ in features)


def test_a_window_model_fits_the_protocol() -> None:
    model: Forecaster = WindowModel()
    h = history([4.0] * 10, end_s=6 * 3600.0)
    out = model.forecast(h, 3)
    assert len(out) == 3
    assert out[0] == pytest.approx(4.4)
    assert peak_next(model, h) == pytest.approx(4.4)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("forecaster", FORECASTERS, ids=lambda f: f.name)
def test_forecast_rejects_a_non_positive_horizon(forecaster: Forecaster) -> None:
    with pytest.raises(ValueError):
        forecaster.forecast(history([1.0, 2.0]), 0)


@pytest.mark.parametrize("forecaster", [SeasonalNaive(), SeasonalEwma()], ids=lambda f: f.name)
def test_period_must_be_a_whole_number_of_steps(forecaster: Forecaster) -> None:
    with pytest.raises(ValueError, match="whole multiple"):
        forecaster.forecast(history([1.0] * 10, step_s=7.0), 1)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SeasonalNaive(period_s=0.0),
        lambda: SeasonalNaive(period_s=math.inf),
        lambda: Ewma(alpha=0.0),
        lambda: Ewma(alpha=1.5),
        lambda: Ewma(trend_beta=-0.1),
        lambda: Ewma(damping=1.1),
        lambda: SeasonalEwma(period_s=-1.0),
        lambda: SeasonalEwma(alpha=2.0),
        lambda: SeasonalEwma(season_gamma=-1.0),
    ],
)
def test_forecaster_parameters_are_validated(make: object) -> None:
    assert callable(make)
    with pytest.raises(ValueError):
        make()


# --- properties --------------------------------------------------------------------------------

demand = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(demand, min_size=1, max_size=40),
    horizon=st.integers(min_value=1, max_value=30),
    end_s=st.floats(min_value=-1e7, max_value=1e7),
    forecaster=st.sampled_from(
        [
            SeasonalNaive(period_s=3000.0),
            Ewma(),
            Ewma(alpha=1.0, trend_beta=1.0, damping=1.0),
            SeasonalEwma(period_s=3000.0),
            SeasonalEwma(period_s=1500.0, alpha=1.0, season_gamma=1.0),
        ]
    ),
)
def test_forecasts_are_finite_non_negative_and_of_the_right_length(
    values: list[float], horizon: int, end_s: float, forecaster: Forecaster
) -> None:
    out = forecaster.forecast(DemandHistory(STEP, tuple(values), end_s), horizon)
    assert len(out) == horizon
    assert all(math.isfinite(v) and v >= 0 for v in out)
