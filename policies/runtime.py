"""onnxruntime inference for edgesched's ONNX forecast models, falling back loudly.

An :class:`OnnxForecaster` implements the core's :class:`~edgesched.core.forecast.Forecaster`
protocol with one onnxruntime session (one thread: edge gateways are small). Model contract,
version 1 (the model card of every shipped model states it):

* input ``x``: float32 ``[N, LAGS + 2]``: the last ``LAGS`` 5-minute demand samples, oldest
  first, divided by their maximum (or 1 when all are 0), then sin and cos of the time of day
  of the first step to predict;
* output: float32 ``[N, K]``, ``K >= 1``: the next ``K`` 5-minute samples in the same scale.

A model that does not load or does not match the contract is refused at load time; a model
that returns garbage at run time (NaN, infinities, negative or absurd demand) gets that
forecast replaced by the fallback forecaster's. Either way the caller's ``on_fallback``
hook is told why (the edge engine logs it and counts it in a metric): never silently.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgesched.core.forecast import DemandHistory, Forecaster, time_of_day_features

log = logging.getLogger("edgesched.policies.runtime")

LAGS = 30
FEATURES = LAGS + 2
#: A forecast above this multiple of the recent maximum is treated as garbage.
ABSURD_FACTOR = 10.0


class ModelError(Exception):
    """The model file cannot be used; the message says why."""


def model_features(history: DemandHistory) -> tuple[np.ndarray, float]:
    """The contract's input row for ``history`` and the scale to multiply outputs by."""
    values = list(history.values[-LAGS:])
    values = [values[0]] * (LAGS - len(values)) + values  # pad a short history with its start
    scale = max(values) or 1.0
    sin, cos = time_of_day_features(history.end_s)
    row = np.array([*(v / scale for v in values), sin, cos], dtype=np.float32)
    return row.reshape(1, FEATURES), scale


class OnnxForecaster:
    """A Forecaster backed by an ONNX model, with a fallback for bad outputs."""

    def __init__(
        self,
        path: Path,
        fallback: Forecaster,
        on_fallback: Callable[[str], None] | None = None,
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - onnxruntime is a dependency
            raise ModelError(f"onnxruntime is not installed: {exc}") from exc
        self.path = Path(path)
        self.fallback = fallback
        self.on_fallback = on_fallback
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(
                str(self.path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelError(f"{self.path}: cannot load: {exc}".splitlines()[0]) from exc
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or inputs[0].name != "x":
            raise ModelError(f"{self.path}: expected one input named 'x'")
        shape = inputs[0].shape
        if len(shape) != 2 or shape[1] != FEATURES:
            raise ModelError(f"{self.path}: input 'x' must be [N, {FEATURES}], got {shape}")
        if len(outputs) < 1 or len(outputs[0].shape) != 2:
            raise ModelError(f"{self.path}: output must be [N, K]")
        self.output = outputs[0].name
        self.fallbacks = 0

    @property
    def name(self) -> str:
        return f"onnx:{self.path.name}"

    def _fall_back(self, why: str, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]:
        self.fallbacks += 1
        log.warning("%s: %s; using %s", self.name, why, self.fallback.name)
        if self.on_fallback is not None:
            self.on_fallback(why)
        return self.fallback.forecast(history, horizon_steps)

    def forecast(self, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]:
        if horizon_steps < 1:
            raise ValueError("horizon_steps must be >= 1")
        x, scale = model_features(history)
        try:
            (y,) = self.session.run([self.output], {"x": x})
        except Exception as exc:  # a model that fails at run time
            return self._fall_back(f"inference failed: {exc}", history, horizon_steps)
        out = np.asarray(y, dtype=np.float64).reshape(-1)
        if out.size == 0:
            return self._fall_back("empty output", history, horizon_steps)
        values = [float(v) * scale for v in out[:horizon_steps]]
        limit = ABSURD_FACTOR * max(max(history.values[-LAGS:]), 1.0)
        if not all(math.isfinite(v) and -1e-6 <= v <= limit for v in values):
            return self._fall_back(f"garbage output {values[:3]}", history, horizon_steps)
        values = [max(v, 0.0) for v in values]
        # A model with fewer steps than asked repeats its last step over the horizon.
        values += [values[-1]] * (horizon_steps - len(values))
        return tuple(values)
