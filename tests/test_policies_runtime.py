"""ONNX forecasters run by onnxruntime: real .onnx files, contract checks, loud fallbacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.forecast import DemandHistory, Ewma
from edgesched.policies.onnxgraph import random_mlp, write_mlp
from edgesched.policies.runtime import FEATURES, LAGS, ModelError, OnnxForecaster, model_features


def history(values: list[float]) -> DemandHistory:
    return DemandHistory(300.0, tuple(values), 300.0 * len(values))


def test_a_real_model_loads_and_forecasts(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    layers = [  # non-negative weights: a sane (if untrained) demand model
        (np.abs(rng.normal(0, 0.2, (FEATURES, 64))), np.zeros(64)),
        (np.abs(rng.normal(0, 0.01, (64, 3))), np.zeros(3)),
    ]
    path = write_mlp(tmp_path / "f.onnx", layers)
    f = OnnxForecaster(path, Ewma())
    out = f.forecast(history([10.0] * 40), 3)
    assert len(out) == 3 and all(v >= 0 and np.isfinite(v) for v in out)
    assert f.name == "onnx:f.onnx"
    assert f.fallbacks == 0


def test_identity_like_model_scales_back_to_cores(tmp_path: Path) -> None:
    # y = the last lag (weight 1 on feature LAGS-1): the forecast must be the last value.
    w = np.zeros((FEATURES, 1))
    w[LAGS - 1, 0] = 1.0
    path = write_mlp(tmp_path / "last.onnx", [(w, np.zeros(1))])
    f = OnnxForecaster(path, Ewma())
    assert f.forecast(history([4.0, 8.0, 20.0, 12.0]), 3) == pytest.approx((12.0, 12.0, 12.0))


def test_contract_violations_are_refused_at_load(tmp_path: Path) -> None:
    wrong = random_mlp(tmp_path / "wrong.onnx", [FEATURES + 1, 4, 1])
    with pytest.raises(ModelError, match=r"\[N, 32\]"):
        OnnxForecaster(wrong, Ewma())
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07not a model at all" * 10)
    with pytest.raises(ModelError, match="cannot load"):
        OnnxForecaster(garbage, Ewma())
    with pytest.raises(ModelError, match="cannot load"):
        OnnxForecaster(tmp_path / "missing.onnx", Ewma())


@pytest.mark.parametrize("poison", [np.nan, 1e9, -1e9])
def test_garbage_outputs_fall_back_loudly(tmp_path: Path, poison: float) -> None:
    w = np.zeros((FEATURES, 2))
    b = np.array([poison, poison])
    path = write_mlp(tmp_path / "bad.onnx", [(w, b)])
    reasons: list[str] = []
    f = OnnxForecaster(path, Ewma(), on_fallback=reasons.append)
    h = history([5.0, 6.0, 7.0, 8.0])
    assert f.forecast(h, 3) == Ewma().forecast(h, 3)
    assert f.fallbacks == 1 and reasons and "garbage" in reasons[0]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=100), st.floats(0, 1e6))
def test_property_features_are_normalized(values: list[float], end: float) -> None:
    x, scale = model_features(DemandHistory(300.0, tuple(values), end))
    assert x.shape == (1, FEATURES) and x.dtype == np.float32
    assert np.all(np.isfinite(x))
    assert np.all((x[0, :LAGS] >= 0) & (x[0, :LAGS] <= 1 + 1e-6))
    assert scale >= max(values[-LAGS:]) or scale == 1.0
