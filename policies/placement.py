"""The learned placement score: reward, black-box policy search (RL) in the simulator, ONNX
export, and the onnxruntime scorer injected into the core's ``learned`` mode.

Model contract ``edgesched.placement.score/1`` (in the model's metadata; the card states it):

* input ``x``: float32 ``[N, 13]``: one row per feasible candidate node for the task being
  placed, columns in :data:`~edgesched.core.learned.LEARNED_FEATURES` order, each in [0, 1];
* output ``y``: float32 ``[N, 1]``: the score; the core places on the highest (ties: lowest
  node id).

The model is linear (13 weights and a bias). It is trained by the cross-entropy method, a
black-box policy search: sample weight vectors around a mean, simulate members of the generated
workload families (:mod:`edgesched.core.workloadgen`) with each as the score stage, keep the
best by the combined :func:`objective` (energy cost relative to k8s-spread's, SLO misses, p99
waits), refit the mean and spread, repeat. The search starts from the energy mode's weights
written in these features. :func:`evaluate` scores the shipped model and every heuristic on
*held-out* members of each family (other random streams, a higher load band) with the same
objective.

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
from edgesched.core.nodetable import FloatArray
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.policies.ortsession import ModelLoadError, open_contract

if TYPE_CHECKING:  # training only: an engine that scores placements does not load them
    from edgesched.core.simulator import ScenarioLike, SimReport
    from edgesched.core.strategies import Strategy

log = logging.getLogger("edgesched.policies.placement")

CONTRACT = "edgesched.placement.score/1"
#: Scores outside this are treated as garbage.
MAX_ABS_SCORE = 1e6


# --- the combined objective ---------------------------------------------------------------

#: Weights of the combined objective :func:`objective` (the model card states them).
MISS_WEIGHT = 20.0
WAIT_WEIGHT = 0.05
#: A class's p99 wait counts at most this many times its SLO in the wait term.
WAIT_CAP = 2.0


def objective_terms(
    report: SimReport, scenario: ScenarioLike, reference_cost: float
) -> dict[str, float]:
    """The terms of :func:`objective` for one run (plus throughput and utilization).

    ``cost_ratio``: energy cost over ``reference_cost`` (k8s-spread's on the same scenario);
    ``weighted_miss_rate``: SLO misses weighted by class priority over submissions weighted the
    same way; ``wait_ratio``: the priority-weighted mean, over the classes that had work, of
    ``min(p99 wait / SLO wait, 2)``.
    """
    classes = scenario.classes
    rows = [(w, c, max(classes[w].priority, 1)) for w, c in report.classes.items() if c.submitted]
    total = math.fsum(p * c.submitted for _, c, p in rows)
    weight = math.fsum(p for _, _, p in rows)
    waits = math.fsum(
        p * min(c.wait_p99_s / max(classes[w].slo_wait_s, 1e-9), WAIT_CAP) for w, c, p in rows
    )
    submitted = sum(c.submitted for c in report.classes.values())
    return {
        "cost_ratio": report.energy_cost / max(reference_cost, 1e-12),
        "weighted_miss_rate": math.fsum(p * c.slo_misses for _, c, p in rows) / max(total, 1e-9),
        "wait_ratio": waits / weight if weight else 0.0,
        "utilization_awake": report.utilization_awake,
        "throughput": report.completed / max(submitted, 1),
    }


def objective(report: SimReport, scenario: ScenarioLike, reference_cost: float) -> float:
    """The combined objective of one run, lower is better (training and evaluation alike)::

        J = cost / cost_k8s + 20 * weighted_miss_rate + 0.05 * wait_ratio

    ``cost_k8s`` is k8s-spread's energy cost on the same scenario, so J is 1.0 for k8s-spread
    with no miss and no wait; see :func:`objective_terms` for the other terms.
    """
    t = objective_terms(report, scenario, reference_cost)
    return t["cost_ratio"] + MISS_WEIGHT * t["weighted_miss_rate"] + WAIT_WEIGHT * t["wait_ratio"]


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


# --- scenarios ------------------------------------------------------------------------------

#: A scenario of training or evaluation: ``(family, split, index)`` of a generated member, or
#: ``("campus", "", seed)``.
ScenarioKey = tuple[str, str, int]
CAMPUS = "campus"


@dataclass(frozen=True, slots=True)
class PolicyTrainConfig:
    """The policy search's budget and scenarios.

    Training uses members ``0..train_members-1`` of each family's ``train`` split; evaluation
    members ``0..eval_members-1`` of its ``heldout`` split, plus the campus (scale
    ``campus_scale``, ``campus_days``) on ``eval_seeds`` (``train_seeds`` adds campus days to
    training; empty by default: a campus day costs as much as ten members).
    """

    families: tuple[str, ...] = ("batch", "mixed-bursty", "accel-heavy")
    train_members: int = 4
    eval_members: int = 4
    train_seeds: tuple[int, ...] = ()
    eval_seeds: tuple[int, ...] = (2001,)
    campus_scale: float = 0.1
    campus_days: float = 1.0
    population: int = 10
    elite: int = 3
    generations: int = 8
    members_per_candidate: int = 6
    init_std: float = 0.25
    workers: int = 1
    #: Cut generated members to their first ``truncate_h`` hours (0: whole; tests use it).
    truncate_h: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__slots__}

    @property
    def train_keys(self) -> tuple[ScenarioKey, ...]:
        """Training scenarios, interleaved across families."""
        members = [(f, "train", i) for i in range(self.train_members) for f in self.families]
        return (*members, *((CAMPUS, "", s) for s in self.train_seeds))

    @property
    def eval_keys(self) -> tuple[ScenarioKey, ...]:
        members = [(f, "heldout", i) for f in self.families for i in range(self.eval_members)]
        return (*members, *((CAMPUS, "", s) for s in self.eval_seeds))


TINY_POLICY = PolicyTrainConfig(
    families=("batch",),
    train_members=1,
    eval_members=1,
    eval_seeds=(),
    population=3,
    elite=1,
    generations=1,
    members_per_candidate=1,
    truncate_h=0.25,
)


def scenario_for(key: ScenarioKey, config: PolicyTrainConfig) -> Any:
    """The scenario of ``key`` (a generated member, or a campus day)."""
    source, split, index = key
    if source == CAMPUS:
        from edgesched.core.campus import campus_scenario

        return campus_scenario(seed=index, days=config.campus_days, scale=config.campus_scale)
    from edgesched.core.workloadgen import member

    scenario = member(source, index, split)
    cut = config.truncate_h * 3600.0
    if 0 < cut < scenario.horizon_s:
        tasks = tuple(t for t in scenario.tasks if t.submitted_at < cut)
        scenario = replace(scenario, tasks=tasks, days=config.truncate_h / 24.0)
    return scenario


def strategy_for(name: str, key: ScenarioKey, scenario: Any, model: str = "") -> Strategy:
    """Strategy ``name`` on ``scenario``: tidal variants use the campus profile on the campus
    and none on generated members (their classes have no tidal windows); ``learned`` loads
    ``model`` (empty: the shipped one)."""
    from edgesched.core.experiment import build_strategies
    from edgesched.core.tidal import TidalProfile, campus_profile

    tidal = campus_profile() if key[0] == CAMPUS else TidalProfile()
    learned = None
    if name == "learned":
        learned = learned_policy(Path(model) if model else None).learned_score
    (strategy,) = build_strategies(scenario, tidal, only=[name], learned=learned)
    return strategy


def _reference_job(args: tuple[ScenarioKey, PolicyTrainConfig]) -> float:
    from edgesched.core.simulator import simulate

    key, config = args
    scenario = scenario_for(key, config)
    return simulate(scenario, strategy_for("k8s-spread", key, scenario)).energy_cost


def reference_costs(
    keys: Sequence[ScenarioKey], config: PolicyTrainConfig
) -> dict[ScenarioKey, float]:
    """k8s-spread's energy cost per scenario: the objective's cost reference."""
    costs = _map(_reference_job, [(k, config) for k in keys], config.workers)
    return dict(zip(keys, costs, strict=True))


# --- training: cross-entropy method over the weights ----------------------------------------


def _run_weights(
    args: tuple[tuple[float, ...], tuple[tuple[ScenarioKey, float], ...], PolicyTrainConfig],
) -> float:
    """Mean objective of the linear score ``weights`` over the given scenarios."""
    from edgesched.core.simulator import simulate
    from edgesched.core.strategies import CoreStrategy

    weights, keyed, config = args
    policy = PolicyConfig(mode=PolicyMode.LEARNED, learned_score=LinearScore(weights))
    total = 0.0
    for key, ref in keyed:
        scenario = scenario_for(key, config)
        total += objective(simulate(scenario, CoreStrategy("learned", policy)), scenario, ref)
    return total / len(keyed)


def _map(fn: Callable[[Any], float], jobs: list[Any], workers: int) -> list[float]:
    if workers <= 1 or len(jobs) <= 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, jobs))


@dataclass(frozen=True, slots=True)
class SearchResult:
    weights: tuple[float, ...]
    history: tuple[tuple[int, float, float], ...]  # (generation, best objective, mean objective)
    #: The final comparison on all training scenarios, and which of the three was shipped.
    final: tuple[tuple[str, float], ...] = ()
    picked: str = ""


def train(
    config: PolicyTrainConfig, seed: int = 0, progress: Callable[[str], None] | None = None
) -> SearchResult:
    """Cross-entropy method minimising :func:`objective`; deterministic for a seed and config.

    Every candidate of a generation is simulated on the *same* training members (common random
    numbers; the members rotate between generations and cover every family), and the heuristic
    start rides along in every generation, so each candidate is judged by its paired advantage
    over the energy weights, not by the luck of its members. The final pick is made on all
    training members among the start, the refit mean and the candidate with the best advantage
    seen: the search never ships weights that did worse than the heuristic it started from on
    the data it saw.
    """
    rng = np.random.default_rng([seed, 6])
    keys = config.train_keys
    refs = reference_costs(keys, config)
    start = heuristic_start()
    mean = start.copy()
    std = np.full(N_LEARNED_FEATURES, config.init_std)
    best_w, best_adv = tuple(float(v) for v in start), 0.0
    history: list[tuple[int, float, float]] = []
    for g in range(config.generations):
        k = min(config.members_per_candidate, len(keys))
        first = (g * k) % len(keys)
        keyed = tuple((keys[(first + i) % len(keys)], refs[keys[(first + i) % len(keys)]])
                      for i in range(k))  # fmt: skip
        samples = [start, mean] + [
            mean + std * rng.standard_normal(len(mean)) for _ in range(config.population - 2)
        ]
        candidates = [tuple(float(v) for v in s) for s in samples]
        scores = _map(_run_weights, [(c, keyed, config) for c in candidates], config.workers)
        order = sorted(range(1, len(candidates)), key=lambda i: (scores[i], i))
        elite = np.array([candidates[i] for i in order[: config.elite]])
        mean = elite.mean(axis=0)
        std = np.maximum(elite.std(axis=0), 0.01)
        top, base = scores[order[0]], scores[0]
        history.append((g, top, float(np.mean(scores))))
        if base - top > best_adv:
            best_adv, best_w = base - top, candidates[order[0]]
        if progress is not None:
            progress(
                f"generation {g + 1}/{config.generations}: best objective {top:.4f} "
                f"({top - base:+.4f} against the heuristic start {base:.4f}), "
                f"mean {np.mean(scores):.4f}"
            )
    finals = [tuple(float(v) for v in start), tuple(float(v) for v in mean), best_w]
    everything = tuple((key, refs[key]) for key in keys)
    final_j = _map(_run_weights, [(c, everything, config) for c in finals], config.workers)
    pick = min(range(len(finals)), key=lambda i: (final_j[i], i))
    names = ("heuristic start", "refit mean", "best candidate")
    if progress is not None:
        progress(
            "final, on all training members: "
            + ", ".join(f"{n} {r:.4f}" for n, r in zip(names, final_j, strict=True))
            + f"; shipping the {names[pick]}"
        )
    final = tuple(zip(names, final_j, strict=True))
    return SearchResult(finals[pick], tuple(history), final, names[pick])


# --- evaluation -----------------------------------------------------------------------------

HEURISTICS = (
    "energy",
    "balance",
    "priority",
    "tidal+energy",
    "tidal+priority",
    "k8s-spread",
    "first-fit",
    "static-partition",
)
#: Tidal variants differ from their base only under a tidal profile: the campus only.
_CAMPUS_ONLY = frozenset({"tidal+energy", "tidal+priority"})


def _eval_job(args: tuple[str, ScenarioKey, PolicyTrainConfig, str, float]) -> dict[str, float]:
    from edgesched.core.simulator import simulate

    name, key, config, model, ref = args
    scenario = scenario_for(key, config)
    report = simulate(scenario, strategy_for(name, key, scenario, model))
    return {
        **objective_terms(report, scenario, ref),
        "objective": objective(report, scenario, ref),
        "energy_cost": report.energy_cost,
        "slo_misses": float(report.slo_misses),
    }


def group_of(key: ScenarioKey) -> str:
    return key[0]


def evaluate(
    config: PolicyTrainConfig, model: Path, names: Sequence[str] = ("learned", *HEURISTICS)
) -> dict[str, dict[str, dict[str, float]]]:
    """Mean figures per scenario group (each family's held-out members, the campus) and over
    every generated member (``"generated"``), per strategy; every strategy sees the same
    arrivals. ``results[group][strategy][figure]``."""
    keys = config.eval_keys
    refs = reference_costs(keys, config)
    jobs = [
        (n, k, config, str(model), refs[k])
        for k in keys
        for n in names
        if k[0] == CAMPUS or n not in _CAMPUS_ONLY
    ]
    results = _map_dicts(jobs, config.workers)
    groups: dict[str, list[tuple[str, dict[str, float]]]] = {}
    for (n, k, _, _, _), r in zip(jobs, results, strict=True):
        groups.setdefault(group_of(k), []).append((n, r))
        if k[0] != CAMPUS:
            groups.setdefault("generated", []).append((n, r))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for g, rows in groups.items():
        out[g] = {}
        for n in names:
            mine = [r for rn, r in rows if rn == n]
            if mine:
                out[g][n] = {f: float(np.mean([r[f] for r in mine])) for f in mine[0]}
    return out


def _map_dicts(jobs: list[Any], workers: int) -> list[dict[str, float]]:
    if workers <= 1 or len(jobs) <= 1:
        return [_eval_job(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_eval_job, jobs))


def best_heuristic(results: Mapping[str, Mapping[str, float]]) -> str:
    """The heuristic with the lowest objective in one group's results."""
    return min((n for n in results if n != "learned"), key=lambda n: results[n]["objective"])


def margin(results: Mapping[str, Mapping[str, float]]) -> float:
    """How much lower learned's objective is than the best heuristic's, as a fraction of it."""
    best = results[best_heuristic(results)]["objective"]
    return 1.0 - results["learned"]["objective"] / best


def format_table(results: Mapping[str, Mapping[str, float]]) -> list[str]:
    lines = [
        "| strategy | objective J | cost / k8s-spread | energy cost | SLO misses | "
        "weighted miss rate | p99 wait / SLO | util (awake) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in results.items():
        lines.append(
            f"| {n} | {r['objective']:.4f} | {r['cost_ratio']:.4f} | {r['energy_cost']:.3f} | "
            f"{r['slo_misses']:.2f} | {r['weighted_miss_rate']:.4%} | {r['wait_ratio']:.3f} | "
            f"{r['utilization_awake']:.1%} |"
        )
    return lines


def format_groups(results: Mapping[str, Mapping[str, Mapping[str, float]]]) -> list[str]:
    """One table per group, each followed by learned's margin over the best heuristic."""
    lines: list[str] = []
    for g, table in results.items():
        lines += [f"### {g}", "", *format_table(table), ""]
        if "learned" in table and len(table) > 1:
            b = best_heuristic(table)
            lines += [
                f"Best heuristic: `{b}` (J {table[b]['objective']:.4f}); learned "
                f"{table['learned']['objective']:.4f}: {margin(table):+.1%} lower J, SLO "
                f"misses {table['learned']['slo_misses']:.2f} against {b}'s "
                f"{table[b]['slo_misses']:.2f} (the fewest of any heuristic: "
                f"{min(r['slo_misses'] for n, r in table.items() if n != 'learned'):.2f}).",
                "",
            ]
    return lines


def default_workers() -> int:
    return max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))


def as_float32(x: FloatArray) -> npt.NDArray[np.float32]:
    return x.astype(np.float32)
