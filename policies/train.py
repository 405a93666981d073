"""``edgesched policies train|eval``: fit both models, write the .onnx files and their model
cards, and print the evaluation tables."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgesched.core.forecast import Ewma
from edgesched.core.learned import LEARNED_FEATURES
from edgesched.policies import demand, placement

FORECAST_FILE = "demand15.onnx"
PLACEMENT_FILE = "placement-score.onnx"


def shipped_dir() -> Path:
    return Path(__file__).parent


@dataclass(frozen=True, slots=True)
class TrainConfig:
    forecast: demand.ForecastTrainConfig
    policy: placement.PolicyTrainConfig
    quick: bool = False


def config_for(quick: bool, workers: int | None = None) -> TrainConfig:
    f = demand.TINY if quick else demand.ForecastTrainConfig()
    p = placement.TINY_POLICY if quick else placement.PolicyTrainConfig()
    if workers is not None:
        from dataclasses import replace

        p = replace(p, workers=workers)
    return TrainConfig(f, p, quick)


def _command(seed: int, quick: bool, only: str = "") -> str:
    flags = (" --quick" if quick else "") + (f" --only {only}" if only else "")
    return f".venv/bin/edgesched policies train --seed {seed} --out policies{flags}"


def train_forecaster(
    out: Path, config: TrainConfig, seed: int, say: Callable[[str], None]
) -> dict[str, dict[str, float]]:
    t0 = time.perf_counter()
    model = demand.fit(config.forecast)
    path = demand.write_onnx(model, out / FORECAST_FILE)
    fit_s = time.perf_counter() - t0
    say(f"forecaster: fitted in {fit_s:.1f} s -> {path}")
    results = demand.evaluate(demand.ClassForecaster(path, Ewma()).run, config.forecast)
    for line in demand.format_table(results):
        say(line)
    _write_forecast_card(out, config, seed, results, fit_s)
    return results


def train_policy(
    out: Path, config: TrainConfig, seed: int, say: Callable[[str], None]
) -> dict[str, dict[str, dict[str, float]]]:
    t0 = time.perf_counter()
    found = placement.train(config.policy, seed, progress=say)
    path = placement.write_onnx(found.weights, out / PLACEMENT_FILE)
    train_s = time.perf_counter() - t0
    say(f"placement policy: searched in {train_s:.0f} s -> {path}")
    results = placement.evaluate(config.policy, path)
    for line in placement.format_groups(results):
        say(line)
    _write_policy_card(out, config, seed, found, results, train_s)
    return results


def train_all(out: Path, seed: int, quick: bool, say: Callable[[str], None]) -> None:
    config = config_for(quick)
    train_forecaster(out, config, seed, say)
    train_policy(out, config, seed, say)


def evaluate_shipped(out: Path, quick: bool, say: Callable[[str], None]) -> None:
    config = config_for(quick)
    path = out / FORECAST_FILE
    say(f"forecaster {path} on held-out seeds {list(config.forecast.eval_seeds)}, MAE in cores:")
    results = demand.evaluate(demand.ClassForecaster(path, Ewma()).run, config.forecast)
    for line in demand.format_table(results):
        say(line)
    ppath = out / PLACEMENT_FILE
    say(f"placement policy {ppath} on held-out scenarios {list(config.policy.eval_keys)}:")
    for line in placement.format_groups(placement.evaluate(config.policy, ppath)):
        say(line)


# --- model cards ----------------------------------------------------------------------------


def _write_forecast_card(
    out: Path,
    config: TrainConfig,
    seed: int,
    results: dict[str, dict[str, float]],
    fit_s: float,
) -> None:
    f = config.forecast
    ratio = demand.ratios(results)
    met = all(r <= 0.8 for r in ratio.values())
    lines = [
        f"# {FORECAST_FILE}: 15-minute CPU demand forecast per workload class",
        "",
        f"Produced by `{_command(seed, config.quick)}` (fit in {fit_s:.1f} s on this machine).",
        "Training is a closed-form ridge regression in numpy, so it has no random draws: the",
        "seed does not change it, and re-running reproduces the weights to float32 rounding",
        "(`tests/test_policies_forecast.py` checks a small config byte for byte).",
        "",
        f"## Contract `{demand.CONTRACT}`",
        "",
        f"- input `x`: float32 `[N, {demand.N_INPUT}]`, in this order:",
        f"  - columns 0-4: one-hot of the workload class: {', '.join(demand.CLASSES)};",
        f"  - columns 5-{4 + demand.LAGS}: the class's last {demand.LAGS} five-minute mean CPU "
        "demands (2 h), oldest first, as a fraction of the CPU capacity forecast for (the "
        "fleet's cores);",
        f"  - columns {5 + demand.LAGS}, {6 + demand.LAGS}: sin and cos of the time of day of the "
        "first 5-minute step to predict.",
        f"- output `y`: float32 `[N, {demand.STEPS}]`: the next three 5-minute means (15 minutes),"
        " same unit.",
        "- Inside: 24 time-of-day harmonics built from sin and cos, the last 3 lags times the",
        "  first 4 harmonics' sin and cos, and one linear map (97 weights x 3 steps) per class.",
        "- Metadata: `edgesched.contract`, `edgesched.classes`, `edgesched.lags`, "
        "`edgesched.step_s`.",
        "- Runtime: `edgesched.policies.demand.ClassForecaster` (one onnxruntime session; input",
        "  shape, NaN and range checked; garbage output or a failed run falls back to the given",
        "  forecaster with a log line and a counter; a file that does not load or does not match",
        "  the contract is refused at load).",
        "",
        "## Training data",
        "",
        f"The campus scenario (`core/campus.py`, scale {f.scale}) for seeds "
        f"{list(f.train_seeds)}, {f.days} days each: per class, the *offered* 5-minute mean "
        "CPU demand (cores in use had every task started on arrival). Ridge penalty "
        f"{f.ridge} x rows on every weight but the bias. Every campus day is a weekday, so no "
        "day-of-week feature.",
        "",
        "## Evaluation (held-out seeds, other days than training)",
        "",
        f"Seeds {list(f.eval_seeds)}, {f.days} days each; origins every 5 minutes from the second"
        " day on, 3 steps each; mean absolute error in cores. Baselines from `core/forecast.py`"
        " see the last two days.",
        "",
        *demand.format_table(results),
        "",
        "Target: at least 20% lower error than the better of seasonal-naive and Holt, per "
        f"class: **{'met' if met else 'not met'}** (worst ratio {max(ratio.values()):.3f}).",
        "",
        "Limits: trained and tested on the simulator's campus only, where the daily shape is the",
        "same every day; a site whose profile changes needs retraining on its own history.",
    ]
    (out / FORECAST_FILE.replace(".onnx", ".md")).write_text("\n".join(lines) + "\n")
    (out / "demand15.eval.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def _write_policy_card(
    out: Path,
    config: TrainConfig,
    seed: int,
    found: placement.SearchResult,
    results: dict[str, dict[str, dict[str, float]]],
    train_s: float,
) -> None:
    p = config.policy
    overall = results.get("generated") or next(iter(results.values()))
    best = placement.best_heuristic(overall)
    gain = placement.margin(overall)
    misses_ok = all(
        t["learned"]["slo_misses"] <= t[placement.best_heuristic(t)]["slo_misses"]
        for t in results.values()
    )
    lines = [
        f"# {PLACEMENT_FILE}: learned placement score (the core's `learned` mode)",
        "",
        f"Produced by `{_command(seed, config.quick, 'placement')}` (the search took "
        f"{train_s:.0f} s, "
        f"{p.workers} worker process). Deterministic for a seed: the candidates are drawn from "
        "a seeded generator, the scenarios are seeded and the simulator is deterministic.",
        "",
        f"## Contract `{placement.CONTRACT}`",
        "",
        f"- input `x`: float32 `[N, {len(LEARNED_FEATURES)}]`, one row per feasible candidate "
        "node of the task being placed, each column in [0, 1], in this order: "
        + ", ".join(f"`{f}`" for f in LEARNED_FEATURES)
        + " (`core/learned.py` defines them).",
        "- output `y`: float32 `[N, 1]`, the score; the core places on the highest.",
        "- Metadata: `edgesched.contract`, `edgesched.features`.",
        "- Runtime: `edgesched.policies.placement.learned_policy(path)` gives a `PolicyConfig` in",
        "  `learned` mode with an `OnnxPlacementScore` (one onnxruntime session) injected. Bad",
        "  input or output: a log line, the scorer's `fallbacks` counter and `on_fallback`, and",
        "  the core places that task with the energy heuristic, saying so in the decision",
        "  (`scores['learned_fallback'] = 1`). A model that does not load: the policy has no",
        "  model and every placement falls back the same way.",
        "",
        "## Objective (lower is better; the same in training and evaluation)",
        "",
        "    J = cost / cost_k8s + "
        f"{placement.MISS_WEIGHT:g} * weighted_miss_rate + {placement.WAIT_WEIGHT:g} * wait_ratio",
        "",
        "- `cost / cost_k8s`: the run's energy cost (time-of-use tariff) over k8s-spread's on the"
        " same scenario (so k8s-spread without misses or waits scores 1.0);",
        "- `weighted_miss_rate`: SLO misses weighted by class priority over submissions weighted"
        " the same way (a miss of 1% of the weighted work costs 0.2, a fifth of k8s-spread's "
        "energy);",
        "- `wait_ratio`: priority-weighted mean over the classes of min(p99 wait / SLO wait, "
        f"{placement.WAIT_CAP:g}).",
        "",
        "## Model and training",
        "",
        "A linear score (13 weights, no hidden layer). Queue, preemption, waking and parking are",
        "the energy mode's; only the score stage is learned. Black-box policy search by the",
        f"cross-entropy method: {p.population} candidates per generation (the energy start, "
        f"the current mean and {p.population - 2} Gaussian samples around it), {p.elite} "
        f"elite, {p.generations} generations, initial spread {p.init_std}. Each generation "
        f"scores every candidate on the same {p.members_per_candidate} training members "
        f"(rotating through members 0-{p.train_members - 1} of the `train` split of each "
        f"family: {', '.join(p.families)}"
        + (f"; campus seeds {list(p.train_seeds)}" if p.train_seeds else "")
        + "), so it is judged by its paired advantage over the energy start. At the end the "
        "start, the refitted mean and the candidate with the best advantage are compared on "
        "all training members and the best is shipped: "
        + ", ".join(f"{n} {r:.4f}" for n, r in found.final)
        + f"; shipped: the **{found.picked}**.",
        "",
        "Search history (generation, best J, mean J):",
        "",
        *(f"- {g + 1}: {b:.4f}, {m:.4f}" for g, b, m in found.history),
        "",
        "Weights: "
        + ", ".join(f"{n}={w:.3f}" for n, w in zip(LEARNED_FEATURES, found.weights, strict=True)),
        "",
        "## Evaluation (held-out)",
        "",
        f"Members 0-{p.eval_members - 1} of the `heldout` split of each family (random streams "
        "the training never drew, load from a band above the training one), and the campus "
        f"(scale {p.campus_scale}, {p.campus_days:g} day, seeds {list(p.eval_seeds)}); means "
        "per group; every strategy sees the same arrivals; `learned` runs the ONNX file through "
        "onnxruntime. Tidal variants run on the campus only (generated members have no tidal "
        "profile, so there they equal their base mode). `generated` is the mean over every "
        "generated member.",
        "",
        *placement.format_groups(results),
        "Goal: J at least 5% below the best heuristic on held-out generated members, and never "
        "more SLO misses than that heuristic. Measured over every held-out generated member: "
        f"{gain:+.1%} against `{best}` ({overall[best]['objective']:.4f} vs "
        f"{overall['learned']['objective']:.4f}); SLO misses "
        f"{overall['learned']['slo_misses']:.2f} vs {overall[best]['slo_misses']:.2f}: "
        + ("**met**." if gain >= 0.05 and misses_ok else "**not met**.")
        + " Against each group's best heuristic, learned "
        + (
            "never has more SLO misses."
            if misses_ok
            else "has more SLO misses in at least one group (see the tables)."
        ),
    ]
    (out / PLACEMENT_FILE.replace(".onnx", ".md")).write_text("\n".join(lines) + "\n")
    search = {
        "seed": seed,
        "quick": config.quick,
        "train_s": train_s,
        "weights": list(found.weights),
        "history": [list(h) for h in found.history],
        "final": [list(f) for f in found.final],
        "picked": found.picked,
    }
    doc = {"search": search, "heldout": results}
    (out / "placement-score.eval.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def reevaluate_policy(
    out: Path, say: Callable[[str], None]
) -> dict[str, dict[str, dict[str, float]]]:
    """Evaluate the model in ``out`` again (the heuristics may have moved since it was trained)
    and rewrite its card and ``placement-score.eval.json``, keeping the search's record."""
    doc = json.loads((out / "placement-score.eval.json").read_text())
    sr = doc["search"]
    found = placement.SearchResult(
        weights=tuple(sr["weights"]),
        history=tuple((int(g), float(b), float(m)) for g, b, m in sr["history"]),
        final=tuple((str(n), float(r)) for n, r in sr["final"]),
        picked=sr["picked"],
    )
    config = config_for(bool(sr["quick"]))
    results = placement.evaluate(config.policy, out / PLACEMENT_FILE)
    for line in placement.format_groups(results):
        say(line)
    _write_policy_card(out, config, int(sr["seed"]), found, results, float(sr["train_s"]))
    return results
