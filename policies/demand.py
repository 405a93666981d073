"""The per-class 15-minute demand forecaster: data, training (numpy ridge), ONNX export,
onnxruntime inference with loud fallbacks, and evaluation against the core's baselines.

Model contract ``edgesched.forecast.per-class/2`` (stored in the model's metadata; the model
card states it):

* input ``x``: float32 ``[N, 31]``: columns 0-4 a one-hot of the workload class in
  :data:`CLASSES` order; columns 5-28 the class's last 24 five-minute mean CPU demands (2 h),
  oldest first, as a fraction of the CPU capacity being forecast (the fleet's cores);
  columns 29, 30 sin and cos of the time of day of the first step to predict;
* output ``y``: float32 ``[N, 3]``: the next three 5-minute means (15 minutes), same unit.

Inside the graph: 24 time-of-day harmonics (built from sin and cos by the angle-addition
recurrence), the last three lags times the first four harmonics, and one linear map per class
(ridge regression, closed form, so training is deterministic). Both engines run it through
:mod:`edgesched.policies.models` (which central can swap at run time).

Training data is the campus scenario's *offered* demand per class (:func:`class_demand`: the
cores in use if every task started when it arrived), over training seeds; evaluation uses
other seeds (other days).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgesched.core.classdemand import BIN_S as BIN_S  # (= the campus scenario's; tested)
from edgesched.core.forecast import (
    DemandHistory,
    Ewma,
    Forecaster,
    SeasonalEwma,
    SeasonalNaive,
    time_of_day_features,
)
from edgesched.core.model import SECONDS_PER_DAY
from edgesched.policies.ortsession import ModelLoadError, open_contract

log = logging.getLogger("edgesched.policies.demand")

#: Five-minute bins a day. The engines' demand bins (core.classdemand), which the campus
#: scenario the models train on also uses; imported from there, the campus module would load
#: with every engine (0.4 MB of RSS) although only training needs it.
BINS_PER_DAY = round(SECONDS_PER_DAY / BIN_S)

FloatArray = npt.NDArray[np.float64]

CONTRACT = "edgesched.forecast.per-class/2"
CLASSES: tuple[str, ...] = (
    "face-recognition",
    "video-conferencing",
    "cloud-desktop",
    "ai-training",
    "video-analytics",
)
LAGS = 24
STEPS = 3
HARMONICS = 24
INTERACT_HARMONICS = 4  # the last 3 lags times sin/cos of harmonics 1..4
INTERACT_LAGS = 3
N_INPUT = len(CLASSES) + LAGS + 2
N_FEATURES = LAGS + 2 * HARMONICS + INTERACT_LAGS * 2 * INTERACT_HARMONICS
#: Inputs (demand fractions) above this are refused as out of range.
MAX_INPUT_FRACTION = 4.0
#: A forecast above this multiple of the recent maximum (or 1% of capacity) is garbage.
ABSURD_FACTOR = 10.0


# --- data -----------------------------------------------------------------------------------


def class_demand(seed: int, days: int, scale: float = 1.0) -> tuple[FloatArray, float]:
    """``([len(CLASSES), days * 288] 5-minute mean offered CPU demand, fleet CPU)``.

    Offered demand: the cores in use if every task of the campus scenario started on arrival
    (what a forecaster for capacity planning must predict, independent of any scheduler).
    """
    from edgesched.core.campus import campus_scenario

    scenario = campus_scenario(seed=seed, days=float(days), scale=scale)
    n_bins = days * BINS_PER_DAY
    edges = np.arange(n_bins + 1, dtype=np.float64) * BIN_S
    workload = np.array([CLASSES.index(t.workload) for t in scenario.tasks])
    start = np.array([t.submitted_at for t in scenario.tasks])
    end = start + np.array([t.duration_s or 0.0 for t in scenario.tasks])
    cpu = np.array([t.demand.cpu for t in scenario.tasks])
    out = np.zeros((len(CLASSES), n_bins))
    for c in range(len(CLASSES)):
        m = workload == c

        def integral(at: FloatArray, cores: FloatArray) -> FloatArray:
            """Core-seconds by each edge of tasks starting at ``at`` and never ending."""
            order = np.argsort(at, kind="stable")
            xs, cs = at[order], cores[order]
            a = np.concatenate([[0.0], np.cumsum(cs)])
            b = np.concatenate([[0.0], np.cumsum(cs * xs)])
            k = np.searchsorted(xs, edges, side="left")
            r: FloatArray = edges * a[k] - b[k]
            return r

        total = integral(start[m], cpu[m]) - integral(end[m], cpu[m])
        out[c] = np.diff(total) / BIN_S
    return out, scenario.fleet_cpu


def harmonics(sin1: FloatArray, cos1: FloatArray) -> FloatArray:
    """``[n, 2 * HARMONICS]``: sin k, cos k for k = 1..HARMONICS (as the graph builds them)."""
    s, c = sin1.copy(), cos1.copy()
    cols = [s, c]
    for _ in range(HARMONICS - 1):
        s, c = s * cos1 + c * sin1, c * cos1 - s * sin1
        cols += [s, c]
    out: FloatArray = np.column_stack(cols)
    return out


def features(lags: FloatArray, sin1: FloatArray, cos1: FloatArray) -> FloatArray:
    """The graph's feature rows ``[n, N_FEATURES]`` from lags ``[n, LAGS]`` and sin/cos."""
    hs = harmonics(sin1, cos1)
    last = lags[:, -INTERACT_LAGS:]
    inter = [last * hs[:, j : j + 1] for j in range(2 * INTERACT_HARMONICS)]
    out: FloatArray = np.concatenate([lags, hs, *inter], axis=1)
    return out


def windows(series: FloatArray, first: int = LAGS) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(lags, targets, sin/cos)`` for every origin ``t >= first`` of a fraction series that
    starts at midnight: lags ``series[t-LAGS:t]``, targets ``series[t:t+STEPS]``."""
    origins = np.arange(max(first, LAGS), len(series) - STEPS + 1)
    view = np.lib.stride_tricks.sliding_window_view(series, LAGS + STEPS)
    block = view[origins - LAGS]
    angle = 2.0 * math.pi * (origins % BINS_PER_DAY) / BINS_PER_DAY
    return block[:, :LAGS], block[:, LAGS:], np.column_stack([np.sin(angle), np.cos(angle)])


# --- training -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForecastTrainConfig:
    """What ``edgesched policies train`` fits the forecaster on."""

    train_seeds: tuple[int, ...] = tuple(range(1, 9))
    eval_seeds: tuple[int, ...] = (1001, 1002, 1003)
    days: int = 7
    scale: float = 1.0
    ridge: float = 1e-5  # times the number of rows, on every weight but the bias

    def as_dict(self) -> dict[str, object]:
        return {
            "train_seeds": list(self.train_seeds),
            "eval_seeds": list(self.eval_seeds),
            "days": self.days,
            "scale": self.scale,
            "ridge": self.ridge,
        }


#: A tiny config for tests: one short training run, seconds.
TINY = ForecastTrainConfig(train_seeds=(1,), eval_seeds=(2,), days=2, scale=0.25)


@dataclass(frozen=True, slots=True)
class ForecastModel:
    """Ridge weights per class: ``weights[c]`` is ``[N_FEATURES + 1, STEPS]`` (bias last)."""

    weights: FloatArray
    config: ForecastTrainConfig = field(default_factory=ForecastTrainConfig)

    def predict(self, x: FloatArray) -> FloatArray:
        """The contract's output for contract inputs ``x [N, N_INPUT]`` (float64 numpy)."""
        cls = np.argmax(x[:, : len(CLASSES)], axis=1)
        f = features(x[:, len(CLASSES) : len(CLASSES) + LAGS], x[:, -2], x[:, -1])
        f = np.concatenate([f, np.ones((len(x), 1))], axis=1)
        out: FloatArray = np.einsum("nf,nfk->nk", f, self.weights[cls])
        return out


def fit(config: ForecastTrainConfig) -> ForecastModel:
    """Fit one ridge regression per class on the training seeds (deterministic)."""
    per_class: list[list[tuple[FloatArray, FloatArray]]] = [[] for _ in CLASSES]
    for seed in config.train_seeds:
        demand, fleet = class_demand(seed, config.days, config.scale)
        for c in range(len(CLASSES)):
            lags, y, sc = windows(demand[c] / fleet)
            per_class[c].append((features(lags, sc[:, 0], sc[:, 1]), y))
    weights = np.zeros((len(CLASSES), N_FEATURES + 1, STEPS))
    for c, parts in enumerate(per_class):
        x = np.concatenate([p[0] for p in parts])
        x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
        y = np.concatenate([p[1] for p in parts])
        reg = config.ridge * len(x) * np.eye(x.shape[1])
        reg[-1, -1] = 0.0
        weights[c] = np.linalg.solve(x.T @ x + reg, x.T @ y)
    return ForecastModel(weights, config)


def write_onnx(model: ForecastModel, path: Path) -> Path:
    """The model as an ONNX graph under contract :data:`CONTRACT` (opset 17)."""
    from onnx import TensorProto, helper, numpy_helper

    c_n = len(CLASSES)
    nodes: list[Any] = []
    inits: list[Any] = []

    def const(name: str, value: object, dtype: type = np.int64) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def slice_cols(src: str, lo: int, hi: int, out: str) -> str:
        nodes.append(
            helper.make_node(
                "Slice",
                [src, const(f"{out}_lo", [lo]), const(f"{out}_hi", [hi]), const(f"{out}_ax", [1])],
                [out],
            )
        )
        return out

    onehot = slice_cols("x", 0, c_n, "onehot")
    lags = slice_cols("x", c_n, c_n + LAGS, "lags")
    s1 = slice_cols("x", c_n + LAGS, c_n + LAGS + 1, "s1")
    c1 = slice_cols("x", c_n + LAGS + 1, c_n + LAGS + 2, "c1")
    hs = [s1, c1]
    s, c = s1, c1
    for k in range(2, HARMONICS + 1):
        products = ((s, c1, f"sc{k}"), (c, s1, f"cs{k}"), (c, c1, f"cc{k}"), (s, s1, f"ss{k}"))
        for left, right, out in products:
            nodes.append(helper.make_node("Mul", [left, right], [out]))
        nodes.append(helper.make_node("Add", [f"sc{k}", f"cs{k}"], [f"s{k}"]))
        nodes.append(helper.make_node("Sub", [f"cc{k}", f"ss{k}"], [f"c{k}"]))
        s, c = f"s{k}", f"c{k}"
        hs += [s, c]
    last = slice_cols(lags, LAGS - INTERACT_LAGS, LAGS, "last")
    inter = []
    for j in range(2 * INTERACT_HARMONICS):
        nodes.append(helper.make_node("Mul", [last, hs[j]], [f"inter{j}"]))
        inter.append(f"inter{j}")
    nodes.append(helper.make_node("Concat", [lags, *hs, *inter], ["f"], axis=1))
    wmat = np.concatenate([model.weights[k][:-1] for k in range(c_n)], axis=1)
    bvec = np.concatenate([model.weights[k][-1] for k in range(c_n)])
    inits += [
        numpy_helper.from_array(wmat.astype(np.float32), "W"),
        numpy_helper.from_array(bvec.astype(np.float32), "b"),
    ]
    nodes.append(helper.make_node("Gemm", ["f", "W", "b"], ["per_class"]))
    nodes.append(
        helper.make_node("Reshape", ["per_class", const("shape3", [-1, c_n, STEPS])], ["pc3"])
    )
    nodes.append(helper.make_node("Unsqueeze", [onehot, const("ax2", [2])], ["oh3"]))
    nodes.append(helper.make_node("Mul", ["pc3", "oh3"], ["masked"]))
    nodes.append(helper.make_node("ReduceSum", ["masked", const("ax1", [1])], ["y"], keepdims=0))
    graph = helper.make_graph(
        nodes,
        "edgesched_demand15_per_class",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", N_INPUT])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", STEPS])],
        inits,
    )
    props = {
        "edgesched.contract": CONTRACT,
        "edgesched.classes": ",".join(CLASSES),
        "edgesched.lags": str(LAGS),
        "edgesched.step_s": str(BIN_S),
    }
    from edgesched.policies.onnxgraph import PRODUCER, save  # (writing a model: training)

    return save(graph, path, props, PRODUCER)


# --- inference ------------------------------------------------------------------------------


class ClassForecaster:
    """The per-class ONNX forecaster (one onnxruntime session), falling back loudly.

    Load errors (a missing, truncated or mismatched file) raise :class:`ModelLoadError`; the
    caller keeps its heuristic. At run time an input out of range, an unknown class, a failed
    inference or a garbage output (NaN, infinities, negative or absurd demand) returns the
    ``fallback`` forecaster's answer instead, logs a warning, counts ``fallbacks`` and calls
    ``on_fallback(why)``.
    """

    def __init__(
        self,
        path: Path,
        fallback: Forecaster,
        on_fallback: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.fallback = fallback
        self.on_fallback = on_fallback
        self.fallbacks = 0
        self.session = open_contract(self.path, CONTRACT, "edgesched.classes", ",".join(CLASSES))
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or inputs[0].name != "x" or list(inputs[0].shape)[1:] != [N_INPUT]:
            raise ModelLoadError(f"{self.path}: input must be x [N, {N_INPUT}]")
        if len(outputs) != 1 or list(outputs[0].shape)[1:] != [STEPS]:
            raise ModelLoadError(f"{self.path}: output must be [N, {STEPS}]")
        self.output = outputs[0].name

    @property
    def name(self) -> str:
        return f"onnx:{self.path.name}"

    def run(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Raw batch inference on contract inputs (validated: shape, finite, range)."""
        if x.ndim != 2 or x.shape[1] != N_INPUT:
            raise ValueError(f"x must be [N, {N_INPUT}], got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("x has NaN or infinite values")
        lags = x[:, len(CLASSES) : len(CLASSES) + LAGS]
        if np.any(lags < 0) or np.any(lags > MAX_INPUT_FRACTION):
            raise ValueError(f"lags must be fractions in [0, {MAX_INPUT_FRACTION}]")
        (y,) = self.session.run([self.output], {"x": x.astype(np.float32, copy=False)})
        out: npt.NDArray[np.float32] = np.asarray(y, dtype=np.float32)
        return out

    def _fall_back(self, why: str, history: DemandHistory, steps: int) -> tuple[float, ...]:
        self.fallbacks += 1
        log.warning("%s: %s; using %s", self.name, why, self.fallback.name)
        if self.on_fallback is not None:
            self.on_fallback(why)
        return self.fallback.forecast(history, steps)

    def forecast_class(
        self, workload: str, history: DemandHistory, capacity_cpu: float, horizon_steps: int
    ) -> tuple[float, ...]:
        """Cores of ``workload`` over the next ``horizon_steps`` 5-minute steps."""
        if horizon_steps < 1:
            raise ValueError("horizon_steps must be >= 1")
        if workload not in CLASSES:
            return self._fall_back(f"unknown class {workload!r}", history, horizon_steps)
        if not (math.isfinite(capacity_cpu) and capacity_cpu > 0):
            return self._fall_back(f"bad capacity {capacity_cpu}", history, horizon_steps)
        if abs(history.step_s - BIN_S) > 1e-6:
            return self._fall_back(f"step {history.step_s} s, not {BIN_S}", history, horizon_steps)
        x = contract_row(workload, history, capacity_cpu)
        try:
            y = self.run(x)
        except Exception as exc:  # input validation or a model failing at run time
            return self._fall_back(f"inference refused: {exc}", history, horizon_steps)
        values = [float(v) * capacity_cpu for v in np.asarray(y, dtype=np.float64).reshape(-1)]
        recent = max(max(history.values[-LAGS:]), 0.01 * capacity_cpu)
        if len(values) != STEPS or not all(
            math.isfinite(v) and -1e-3 * capacity_cpu <= v <= ABSURD_FACTOR * recent for v in values
        ):
            return self._fall_back(f"garbage output {values[:3]}", history, horizon_steps)
        values = [max(v, 0.0) for v in values][:horizon_steps]
        values += [values[-1]] * (horizon_steps - len(values))
        return tuple(values)

    def for_class(self, workload: str, capacity_cpu: float) -> Forecaster:
        """This model for one class, as a core :class:`Forecaster`."""
        return _BoundClass(self, workload, capacity_cpu)


@dataclass(frozen=True, slots=True)
class _BoundClass:
    model: ClassForecaster
    workload: str
    capacity_cpu: float

    @property
    def name(self) -> str:
        return f"{self.model.name}[{self.workload}]"

    def forecast(self, history: DemandHistory, horizon_steps: int) -> tuple[float, ...]:
        return self.model.forecast_class(self.workload, history, self.capacity_cpu, horizon_steps)


def contract_row(
    workload: str, history: DemandHistory, capacity_cpu: float
) -> npt.NDArray[np.float32]:
    """The contract's input row ``[1, N_INPUT]`` for one class's history."""
    values = list(history.values[-LAGS:])
    values = [values[0]] * (LAGS - len(values)) + values  # pad a short history with its start
    onehot = [1.0 if c == workload else 0.0 for c in CLASSES]
    sin, cos = time_of_day_features(history.end_s)
    row = np.array([*onehot, *(v / capacity_cpu for v in values), sin, cos], dtype=np.float32)
    return row.reshape(1, N_INPUT)


# --- evaluation -----------------------------------------------------------------------------


def baselines() -> dict[str, Forecaster]:
    return {"seasonal-naive": SeasonalNaive(), "holt": Ewma(), "seasonal-ewma": SeasonalEwma()}


def evaluate(
    predict: Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]],
    config: ForecastTrainConfig,
    *,
    baseline_stride: int = 1,
) -> dict[str, dict[str, float]]:
    """MAE (cores) per class of ``predict`` and each baseline on the evaluation seeds.

    Every forecaster is scored on the same origins: from the second day on (seasonal naive
    needs a day), every 5 minutes, three steps each. Baselines see the last two days (Holt
    and seasonal naive need far less; seasonal-ewma is given two periods).
    """
    out: dict[str, dict[str, float]] = {c: {} for c in CLASSES}
    sums: dict[tuple[str, str], list[float]] = {}
    for seed in config.eval_seeds:
        demand, fleet = class_demand(seed, config.days, config.scale)
        for c, name in enumerate(CLASSES):
            series = demand[c]
            lags, y, sc = windows(series / fleet, first=BINS_PER_DAY)
            x = np.concatenate([np.zeros((len(lags), len(CLASSES))), lags, sc], axis=1)
            x[:, c] = 1.0
            pred = np.asarray(predict(x.astype(np.float32)), dtype=np.float64)
            err = np.abs(pred - y) * fleet
            sums.setdefault((name, "model"), []).extend(err.reshape(-1).tolist())
            origins = range(BINS_PER_DAY, len(series) - STEPS + 1, baseline_stride)
            for bname, forecaster in baselines().items():
                errs = sums.setdefault((name, bname), [])
                for t in origins:
                    first = max(0, t - 2 * BINS_PER_DAY)
                    hist = DemandHistory(BIN_S, tuple(series[first:t].tolist()), t * BIN_S)
                    p = forecaster.forecast(hist, STEPS)
                    errs.extend(abs(a - b) for a, b in zip(p, series[t : t + STEPS], strict=True))
    for (name, model), errs in sums.items():
        out[name][model] = math.fsum(errs) / len(errs)
    return out


def format_table(results: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Markdown rows: MAE per class, and the model's error relative to the better of
    seasonal-naive and Holt (the issue's baselines)."""
    lines = [
        "| class | model MAE | seasonal-naive | Holt (ewma) | seasonal-ewma | model / best of "
        "naive, Holt |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        best = min(r["seasonal-naive"], r["holt"])
        lines.append(
            f"| {name} | {r['model']:.2f} | {r['seasonal-naive']:.2f} | {r['holt']:.2f} | "
            f"{r['seasonal-ewma']:.2f} | {r['model'] / best:.3f} |"
        )
    return lines


def ratios(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    return {n: r["model"] / min(r["seasonal-naive"], r["holt"]) for n, r in results.items()}


def all_windows(config: ForecastTrainConfig, seeds: Sequence[int]) -> FloatArray:
    """Contract inputs over ``seeds`` (for benchmarks): every origin of every class."""
    rows = []
    for seed in seeds:
        demand, fleet = class_demand(seed, config.days, config.scale)
        for c in range(len(CLASSES)):
            lags, _, sc = windows(demand[c] / fleet)
            x = np.concatenate([np.zeros((len(lags), len(CLASSES))), lags, sc], axis=1)
            x[:, c] = 1.0
            rows.append(x)
    out: FloatArray = np.concatenate(rows)
    return out
