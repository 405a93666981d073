"""The per-class ONNX demand forecaster: reproducible training, the contract, loud fallbacks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edgesched.core.forecast import DemandHistory, Ewma
from edgesched.policies import demand
from edgesched.policies.onnxgraph import random_mlp
from edgesched.policies.ortsession import ModelLoadError
from edgesched.policies.train import FORECAST_FILE, shipped_dir

SHIPPED = shipped_dir() / FORECAST_FILE


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[demand.ForecastModel, Path]:
    model = demand.fit(demand.TINY)
    return model, demand.write_onnx(model, tmp_path_factory.mktemp("fc") / "tiny.onnx")


def history(values: list[float], end_s: float = 8 * 3600.0) -> DemandHistory:
    return DemandHistory(300.0, tuple(values), end_s)


def test_training_is_reproducible_byte_for_byte(
    tiny: tuple[demand.ForecastModel, Path], tmp_path: Path
) -> None:
    again = demand.write_onnx(demand.fit(demand.TINY), tmp_path / "again.onnx")
    assert again.read_bytes() == tiny[1].read_bytes()


def test_onnx_graph_matches_the_numpy_model(tiny: tuple[demand.ForecastModel, Path]) -> None:
    model, path = tiny
    x = demand.all_windows(demand.TINY, (3,))[::7]
    onnx_y = demand.ClassForecaster(path, Ewma()).run(x.astype(np.float32))
    assert np.allclose(onnx_y, model.predict(x), atol=1e-5)


def test_harmonics_are_sines_and_cosines_of_multiples() -> None:
    theta = np.linspace(0, 2 * np.pi, 17)
    hs = demand.harmonics(np.sin(theta), np.cos(theta))
    assert np.allclose(hs[:, 2 * 6], np.sin(7 * theta), atol=1e-9)
    assert np.allclose(hs[:, 2 * 23 + 1], np.cos(24 * theta), atol=1e-9)


def test_shipped_model_loads_and_forecasts_every_class() -> None:
    f = demand.ClassForecaster(SHIPPED, Ewma())
    h = history([100.0 + i for i in range(30)])
    for name in demand.CLASSES:
        out = f.for_class(name, 2816.0).forecast(h, 3)
        assert len(out) == 3 and all(0 <= v < 1000 for v in out)
    assert f.fallbacks == 0


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(SHIPPED.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match="cannot load"):
        demand.ClassForecaster(broken, Ewma())


def test_wrong_contract_or_shape_is_refused(tmp_path: Path) -> None:
    v1 = random_mlp(tmp_path / "v1.onnx", [32, 8, 3])  # the version 1 contract, no metadata
    with pytest.raises(ModelLoadError, match="contract"):
        demand.ClassForecaster(v1, Ewma())


def test_nan_model_falls_back_loudly(
    tiny: tuple[demand.ForecastModel, Path], tmp_path: Path
) -> None:
    model, _ = tiny
    poisoned = demand.ForecastModel(np.full_like(model.weights, np.nan))
    path = demand.write_onnx(poisoned, tmp_path / "nan.onnx")
    why: list[str] = []
    f = demand.ClassForecaster(path, Ewma(), on_fallback=why.append)
    h = history([50.0] * 24)
    assert f.forecast_class("cloud-desktop", h, 1000.0, 3) == Ewma().forecast(h, 3)
    assert f.fallbacks == 1 and "garbage" in why[0]


def test_inputs_are_validated(tiny: tuple[demand.ForecastModel, Path]) -> None:
    f = demand.ClassForecaster(tiny[1], Ewma())
    with pytest.raises(ValueError, match=r"must be"):
        f.run(np.zeros((2, demand.N_INPUT + 1), np.float32))
    bad = np.zeros((1, demand.N_INPUT), np.float32)
    bad[0, 7] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        f.run(bad)
    h = history([5000.0] * 24)  # five times the capacity: out of range
    assert f.forecast_class("ai-training", h, 1000.0, 3) == Ewma().forecast(h, 3)
    assert f.forecast_class("no-such-class", h, 1000.0, 3) == Ewma().forecast(h, 3)
    assert f.fallbacks == 2


@pytest.mark.skipif(not os.environ.get("EDGESCHED_SLOW"), reason="full retrain: EDGESCHED_SLOW=1")
def test_full_retrain_reproduces_the_shipped_model(tmp_path: Path) -> None:
    model = demand.fit(demand.ForecastTrainConfig())
    again = demand.write_onnx(model, tmp_path / FORECAST_FILE)
    x = demand.all_windows(demand.ForecastTrainConfig(), (1001,))[::11].astype(np.float32)
    a = demand.ClassForecaster(again, Ewma()).run(x)
    b = demand.ClassForecaster(SHIPPED, Ewma()).run(x)
    assert np.allclose(a, b, atol=1e-6)
