"""The learned placement score: reward, black-box policy search (RL) in the simulator, ONNX
export, and the onnxruntime scorer injected into the core's ``learned`` mode.

Model contract ``edgesched.placement.score/1`` (in the model's metadata; the card states it):

* input ``x``: float32 ``[N, 13]``: one row per feasible candidate node for the task being
  placed, columns in :data:`~edgesched.core.learned.LEARNED_FEATURES` order, each in [0, 1];
* output ``y``: float32 ``[N, 1]``: the score; the core places on the highest (ties: lowest
  node id).

The model is linear (13 weights and a bias). It is trained by the cross-entropy method, a
black-box policy search: sample weight vectors around a mean, simulate campus days with each
as the score stage, keep the best by :func:`reward`, refit the mean and spread, repeat. The
search starts from the energy mode's weights written in these features.

Inference (:class:`OnnxPlacementScore`) validates every batch (shape, NaN, range) and every
output; a failure is logged, counted and re-raised, and the core then places that task with the
energy heuristic and says so in the decision. A model file that does not load or does not match
the contract gives a policy without a model (:func:`learned_policy`), logged and counted: the
core then falls back on every placement, each decision saying why.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from edgesched.core.learned import LEARNED_FEATURES, N_LEARNED_FEATURES
from edgesched.core.model import SECONDS_PER_DAY
from edgesched.core.nodetable import FloatArray
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.policies.ortsession import ModelLoadError, open_contract

if TYPE_CHECKING:  # training only: an engine that scores placements does not load them
    from edgesched.core.simulator import ScenarioLike, SimReport
    from edgesched.core.strategies import Strategy

log = logging.getLogger("edgesched.policies.placement")

CONTRACT = "edgesched.placement.score/1"
#: Reward weights (the model card defines the reward with them).
COST_WEIGHT = 2.0
MISS_WEIGHT = 10.0
#: Scores outside this are treated as garbage.
MAX_ABS_SCORE = 1e6


# --- reward ---------------------------------------------------------------------------------


def reward_terms(report: SimReport, scenario: ScenarioLike) -> dict[str, float]:
    """The reward's terms for one simulated run (see :func:`reward`)."""
    horizon = scenario.days * SECONDS_PER_DAY
    peak_w = sum(n.power.peak_w for n in scenario.nodes)
    step = 300.0
    price_integral = math.fsum(
        scenario.tariff.price_at(t) * step for t in np.arange(0.0, horizon, step).tolist()
    )
    cost_ref = peak_w / 1000.0 * price_integral / 3600.0  # the whole fleet at peak power
    classes = scenario.classes
    weighted = math.fsum(classes[w].priority * c.slo_misses for w, c in report.classes.items())
    total = math.fsum(classes[w].priority * c.submitted for w, c in report.classes.items())
    submitted = sum(c.submitted for c in report.classes.values())
    return {
        "utilization_awake": report.utilization_awake,
        "throughput": report.completed / max(submitted, 1),
        "cost_fraction": report.energy_cost / cost_ref,
        "weighted_miss_rate": weighted / max(total, 1e-9),
    }


def reward(report: SimReport, scenario: ScenarioLike) -> float:
    """``util_awake + completed/submitted - 2 * cost/cost_ref - 10 * weighted_miss_rate``.

    ``cost_ref`` is the energy cost of the whole fleet at peak power for the horizon under
    the tariff; the weighted miss rate is the SLO misses weighted by class priority over the
    submissions weighted the same way.
    """
    t = reward_terms(report, scenario)
    return (
        t["utilization_awake"]
        + t["throughput"]
        - COST_WEIGHT * t["cost_fraction"]
        - MISS_WEIGHT * t["weighted_miss_rate"]
    )


# --- the score model ------------------------------------------------------------------------


def heuristic_start() -> FloatArray:
    """The energy mode's weights written in the learned features (the search's start)."""
    w = dict.fromkeys(LEARNED_FEATURES, 0.0)
    w.update(most_allocated=1.0, marginal_power=2.0, energy_efficiency=1.0, class_fit=0.5)
    out: FloatArray = np.array([w[f] for f in LEARNED_FEATURES]) / 4.5
    return out


@dataclass(frozen=True, slots=True)
class LinearScore:
    """``features @ weights``: the score model in numpy (training and tests)."""

    weights: tuple[float, ...]

    def __call__(self, features: FloatArray) -> FloatArray:
        out: FloatArray = features @ np.asarray(self.weights, dtype=np.float64)
        return out


def write_onnx(
    weights: Sequence[float], path: Path, extra: Mapping[str, str] | None = None
) -> Path:
    """The linear score as an ONNX graph under :data:`CONTRACT`."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.asarray(weights, dtype=np.float32).reshape(N_LEARNED_FEATURES, 1)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "b"], ["y"])],
        "edgesched_placement_score",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", N_LEARNED_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.zeros(1, np.float32), "b")],
    )
    props = {
        "edgesched.contract": CONTRACT,
        "edgesched.features": ",".join(LEARNED_FEATURES),
        **(extra or {}),
    }
    from edgesched.policies.onnxgraph import PRODUCER, save

    return save(graph, path, props, PRODUCER)


class OnnxPlacementScore:
    """The core's :class:`~edgesched.core.learned.LearnedScore` backed by one onnxruntime
    session. Raises :class:`ModelLoadError` at load for an unusable or mismatched file."""

    def __init__(self, path: Path, on_fallback: Callable[[str], None] | None = None) -> None:
        self.path = Path(path)
        self.on_fallback = on_fallback
        self.fallbacks = 0
        self.session = open_contract(
            self.path, CONTRACT, "edgesched.features", ",".join(LEARNED_FEATURES)
        )
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if (
            len(inputs) != 1
            or inputs[0].name != "x"
            or list(inputs[0].shape)[1:] != [N_LEARNED_FEATURES]
        ):
            raise ModelLoadError(f"{self.path}: input must be x [N, {N_LEARNED_FEATURES}]")
        if len(outputs) != 1 or len(outputs[0].shape) != 2:
            raise ModelLoadError(f"{self.path}: output must be [N, 1]")
        self.output = outputs[0].name

    def _fail(self, why: str) -> ValueError:
        self.fallbacks += 1
        log.warning("%s: %s; the energy heuristic places this task", self.path.name, why)
        if self.on_fallback is not None:
            self.on_fallback(why)
        return ValueError(why)

    def __call__(self, features: FloatArray) -> FloatArray:
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != N_LEARNED_FEATURES or x.shape[0] < 1:
            raise self._fail(f"features must be [N>=1, {N_LEARNED_FEATURES}], got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise self._fail("features have NaN or infinite values")
        if np.any(x < -1e-6) or np.any(x > 1 + 1e-6):
            raise self._fail("features out of [0, 1]")
        try:
            (y,) = self.session.run([self.output], {"x": x})
        except Exception as exc:  # a model failing at run time
            raise self._fail(f"inference failed: {exc}".splitlines()[0]) from exc
        out: FloatArray = np.asarray(y, dtype=np.float64).reshape(-1)
        if out.shape != (len(x),) or not np.all(np.isfinite(out)):
            raise self._fail(f"garbage output of shape {out.shape}")
        if np.any(np.abs(out) > MAX_ABS_SCORE):
            raise self._fail("absurd scores")
        return out


def learned_policy(
    path: Path | None,
    base: PolicyConfig | None = None,
    on_fallback: Callable[[str], None] | None = None,
) -> PolicyConfig:
    """``base`` in ``learned`` mode with the model at ``path`` injected; without a usable model
    (logged, and ``on_fallback`` told) the core falls back to the energy heuristic."""
    base = replace(base or PolicyConfig(), mode=PolicyMode.LEARNED)
    if path is None:
        path = shipped_model()
    try:
        scorer = OnnxPlacementScore(path, on_fallback)
    except ModelLoadError as exc:
        log.error("learned placement model refused (%s); energy heuristic instead", exc)
        if on_fallback is not None:
            on_fallback(str(exc))
        return replace(base, learned_score=None)
    return replace(base, learned_score=scorer)


def shipped_model() -> Path:
    return Path(__file__).with_name("placement-score.onnx")


# --- training: cross-entropy method over the weights ----------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyTrainConfig:
    """The policy search's budget and scenarios."""

    train_seeds: tuple[int, ...] = (11, 12, 13, 14, 15, 16)
    eval_seeds: tuple[int, ...] = (2001, 2002, 2003, 2004, 2005)
    scale: float = 0.2
    days: float = 1.0
    population: int = 10
    elite: int = 3
    generations: int = 6
    seeds_per_candidate: int = 3
    init_std: float = 0.1
    workers: int = 2

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__slots__}


TINY_POLICY = PolicyTrainConfig(
    train_seeds=(11,),
    eval_seeds=(12,),
    scale=0.1,
    days=0.05,
    population=3,
    elite=1,
    generations=1,
    seeds_per_candidate=1,
    workers=1,
)


def _scenario(seed: int, config: PolicyTrainConfig) -> Any:
    from edgesched.core.campus import campus_scenario

    return campus_scenario(seed=seed, days=config.days, scale=config.scale)


def _run_weights(args: tuple[tuple[float, ...], tuple[int, ...], PolicyTrainConfig]) -> float:
    from edgesched.core.simulator import simulate
    from edgesched.core.strategies import CoreStrategy

    weights, seeds, config = args
    policy = PolicyConfig(mode=PolicyMode.LEARNED, learned_score=LinearScore(weights))
    total = 0.0
    for seed in seeds:
        scenario = _scenario(seed, config)
        total += reward(simulate(scenario, CoreStrategy("learned", policy)), scenario)
    return total / len(seeds)


def _map(fn: Callable[[Any], float], jobs: list[Any], workers: int) -> list[float]:
    if workers <= 1 or len(jobs) <= 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, jobs))


@dataclass(frozen=True, slots=True)
class SearchResult:
    weights: tuple[float, ...]
    history: tuple[tuple[int, float, float], ...]  # (generation, best reward, mean reward)
    #: The final comparison on all training seeds, and which of the three was shipped.
    final: tuple[tuple[str, float], ...] = ()
    picked: str = ""


def train(
    config: PolicyTrainConfig, seed: int = 0, progress: Callable[[str], None] | None = None
) -> SearchResult:
    """Cross-entropy method; deterministic for a given ``seed`` and config.

    Every candidate of a generation is simulated on the *same* seeds (common random numbers),
    and the heuristic start rides along in every generation, so each candidate is judged by
    its paired advantage over the energy weights, not by the luck of its seeds. The final
    pick is made on all training seeds among the start, the refit mean and the candidate with
    the best advantage seen: the search never ships weights that did worse than the heuristic
    it started from on the data it saw.
    """
    rng = np.random.default_rng([seed, 6])
    start = heuristic_start()
    mean = start.copy()
    std = np.full(N_LEARNED_FEATURES, config.init_std)
    best_w, best_adv = tuple(float(v) for v in start), 0.0
    history: list[tuple[int, float, float]] = []
    for g in range(config.generations):
        k = config.seeds_per_candidate
        first = (g * k) % len(config.train_seeds)
        seeds = tuple(config.train_seeds[(first + i) % len(config.train_seeds)] for i in range(k))
        samples = [start, mean] + [
            mean + std * rng.standard_normal(len(mean)) for _ in range(config.population - 2)
        ]
        candidates = [tuple(float(v) for v in s) for s in samples]
        rewards = _map(_run_weights, [(c, seeds, config) for c in candidates], config.workers)
        order = sorted(range(1, len(candidates)), key=lambda i: (-rewards[i], i))
        elite = np.array([candidates[i] for i in order[: config.elite]])
        mean = elite.mean(axis=0)
        std = np.maximum(elite.std(axis=0), 0.01)
        top, base = rewards[order[0]], rewards[0]
        history.append((g, top, float(np.mean(rewards))))
        if top - base > best_adv:
            best_adv, best_w = top - base, candidates[order[0]]
        if progress is not None:
            progress(
                f"generation {g + 1}/{config.generations}: best reward {top:.4f} "
                f"({top - base:+.4f} over the heuristic start {base:.4f}), "
                f"mean {np.mean(rewards):.4f}"
            )
    finals = [tuple(float(v) for v in start), tuple(float(v) for v in mean), best_w]
    final_r = _map(_run_weights, [(c, config.train_seeds, config) for c in finals], config.workers)
    pick = max(range(len(finals)), key=lambda i: (final_r[i], -i))
    names = ("heuristic start", "refit mean", "best candidate")
    if progress is not None:
        progress(
            "final, on all training seeds: "
            + ", ".join(f"{n} {r:.4f}" for n, r in zip(names, final_r, strict=True))
            + f"; shipping the {names[pick]}"
        )
    final = tuple(zip(names, final_r, strict=True))
    return SearchResult(finals[pick], tuple(history), final, names[pick])


# --- evaluation -----------------------------------------------------------------------------

HEURISTICS = ("priority", "balance", "energy", "tidal+priority", "tidal+energy", "k8s-spread")


def _eval_job(args: tuple[str, int, PolicyTrainConfig, str]) -> dict[str, float]:
    from edgesched.core.experiment import build_strategies
    from edgesched.core.simulator import simulate
    from edgesched.core.strategies import CoreStrategy
    from edgesched.core.tidal import campus_profile

    name, seed, config, model = args
    scenario = _scenario(seed, config)
    strategy: Strategy
    if name == "learned":
        strategy = CoreStrategy("learned", learned_policy(Path(model)))
    else:
        (strategy,) = build_strategies(scenario, campus_profile(), only=[name])
    report = simulate(scenario, strategy)
    terms = reward_terms(report, scenario)
    return {
        **terms,
        "reward": reward(report, scenario),
        "energy_cost": report.energy_cost,
        "slo_misses": float(report.slo_misses),
    }


def evaluate(
    config: PolicyTrainConfig, model: Path, names: Sequence[str] = ("learned", *HEURISTICS)
) -> dict[str, dict[str, float]]:
    """Mean figures per strategy over the held-out seeds (the same arrivals for each)."""
    jobs = [(n, s, config, str(model)) for n in names for s in config.eval_seeds]
    results = _map_dicts(jobs, config.workers)
    out: dict[str, dict[str, float]] = {}
    for n in names:
        rows = [r for (jn, _, _, _), r in zip(jobs, results, strict=True) if jn == n]
        out[n] = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    return out


def _map_dicts(jobs: list[Any], workers: int) -> list[dict[str, float]]:
    if workers <= 1 or len(jobs) <= 1:
        return [_eval_job(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_eval_job, jobs))


def format_table(results: Mapping[str, Mapping[str, float]]) -> list[str]:
    lines = [
        "| strategy | reward | util (awake) | completed / submitted | energy cost | "
        "cost / fleet-at-peak | SLO misses | weighted miss rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in results.items():
        lines.append(
            f"| {n} | {r['reward']:.4f} | {r['utilization_awake']:.1%} | {r['throughput']:.2%} | "
            f"{r['energy_cost']:.2f} | {r['cost_fraction']:.3f} | {r['slo_misses']:.1f} | "
            f"{r['weighted_miss_rate']:.4%} |"
        )
    return lines


def default_workers() -> int:
    return max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))


def as_float32(x: FloatArray) -> npt.NDArray[np.float32]:
    return x.astype(np.float32)
