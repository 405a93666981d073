"""The shipped ONNX models against baselines measured in the same run.

    cd /tmp && /work/main/.venv/bin/python /work/main/bench/bench_policies.py

* forecast MAE per class on a held-out seed: the ONNX model against seasonal-naive and Holt
  (ratio to the better one);
* the learned placement policy against the heuristic modes on a held-out campus day
  (scale 0.2): reward, utilization, energy cost, SLO misses;
* inference latency p50/p99 at batch 1 and 64 on one pinned core, each against a numpy
  baseline doing the same job in-process (Holt for the forecaster, the energy mode's weighted
  sum for the placement score), and the RSS that importing onnxruntime and loading both
  sessions adds.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil

from edgesched.core.forecast import DemandHistory, Ewma
from edgesched.core.learned import N_LEARNED_FEATURES, learned_features
from edgesched.core.model import Arch, Node, PowerModel, Resources, ServerClass, Task
from edgesched.core.nodetable import NodeTable, resource_vector
from edgesched.core.plugins import SCORES
from edgesched.core.policy import MODE_WEIGHTS, PolicyMode


def _percentiles(fn: Callable[[], object], n: int) -> tuple[float, float]:
    for _ in range(min(200, n)):
        fn()
    samples = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples[i] = time.perf_counter_ns() - t0
    return float(np.percentile(samples, 50)) / 1e3, float(np.percentile(samples, 99)) / 1e3


def _placement_case(batch: int, scorer: Any, rng: np.random.Generator, n: int) -> None:
    """The placement score over ``batch`` candidate nodes: ONNX vs the energy weighted sum."""
    power = PowerModel(idle_w=120, peak_w=400, parked_w=8, wake_latency_s=60)
    ns = [
        Node(f"n{i:03d}", Arch.X86_64, ServerClass.GENERAL, Resources(64, 256), power)
        for i in range(batch)
    ]
    table = NodeTable.build(ns, [])
    table.used[:, 0] = rng.uniform(0, 48, batch)
    task = Task("t", "w", 10, Resources(2, 4))
    demand_v = resource_vector(task.demand)
    rows = np.arange(batch)
    feats = learned_features(table, task, demand_v, rows)
    assert feats.shape[1] == N_LEARNED_FEATURES
    weights = MODE_WEIGHTS[PolicyMode.ENERGY]

    def heuristic() -> None:
        total = np.zeros(len(table))
        for name, w in weights.items():
            total += w * SCORES[name].fn(table, task, demand_v)

    def onnx_score() -> None:
        scorer(feats)

    def features() -> None:
        learned_features(table, task, demand_v, rows)

    o50, o99 = _percentiles(onnx_score, n)
    f50, f99 = _percentiles(features, n)
    b50, b99 = _percentiles(heuristic, n)
    print(
        f"| placement-score | {batch} | {o50:.1f} µs | {o99:.1f} µs | energy weighted sum "
        f"(numpy) | {b50:.1f} µs | {b99:.1f} µs |"
    )
    print(f"| (its features, numpy) | {batch} | {f50:.1f} µs | {f99:.1f} µs | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=5000, help="timed calls per case")
    parser.add_argument("--skip-sim", action="store_true", help="skip the campus-day comparison")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    import onnxruntime  # noqa: F401  (what loading a model costs, counted below)

    rss_import = proc.memory_info().rss
    from edgesched.policies import demand, placement
    from edgesched.policies.train import FORECAST_FILE, PLACEMENT_FILE, shipped_dir

    forecaster = demand.ClassForecaster(shipped_dir() / FORECAST_FILE, Ewma())
    scorer = placement.OnnxPlacementScore(shipped_dir() / PLACEMENT_FILE)
    rss_loaded = proc.memory_info().rss
    print(
        f"RSS: {rss0 / 2**20:.1f} MB before onnxruntime, +{(rss_import - rss0) / 2**20:.1f} MB "
        f"importing it, +{(rss_loaded - rss_import) / 2**20:.1f} MB for both sessions"
    )

    # --- latency -------------------------------------------------------------------------
    rng = np.random.default_rng(0)
    cfg = demand.ForecastTrainConfig()
    windows = demand.all_windows(cfg, (1001,)).astype(np.float32)
    print("\n| model | batch | ONNX p50 | ONNX p99 | baseline | baseline p50 | baseline p99 |")
    print("|---|---|---|---|---|---|---|")
    hist = DemandHistory(300.0, tuple(float(v) for v in windows[0, 5:29] * 2816.0), 3600.0)
    holt = Ewma()
    for batch in (1, 64):
        x = windows[rng.integers(0, len(windows), batch)]
        o50, o99 = _percentiles(functools.partial(forecaster.run, x), args.n)

        def holt_batch(batch: int = batch) -> None:
            for _ in range(batch):
                holt.forecast(hist, 3)

        b50, b99 = _percentiles(holt_batch, max(args.n // 10, 200))
        print(
            f"| demand15 | {batch} | {o50:.1f} µs | {o99:.1f} µs | Holt x{batch} (python) | "
            f"{b50:.1f} µs | {b99:.1f} µs |"
        )
    for batch in (1, 64):
        _placement_case(batch, scorer, rng, args.n)

    # --- accuracy ------------------------------------------------------------------------
    eval_cfg = demand.ForecastTrainConfig(eval_seeds=(1001,))
    t0 = time.perf_counter()
    results = demand.evaluate(forecaster.run, eval_cfg)
    print(f"\nforecast, held-out seed 1001, 7 days ({time.perf_counter() - t0:.0f} s):")
    for line in demand.format_table(results):
        print(line)
    if args.skip_sim:
        return
    pcfg = placement.PolicyTrainConfig(families=(), eval_seeds=(2001,), workers=1)
    t0 = time.perf_counter()
    compared = placement.evaluate(
        pcfg,
        shipped_dir() / PLACEMENT_FILE,
        ("learned", "energy", "tidal+energy", "priority", "balance", "k8s-spread"),
    )[placement.CAMPUS]
    print(
        f"\nplacement, campus seed 2001, scale {pcfg.campus_scale}, {pcfg.campus_days:g} day "
        f"({time.perf_counter() - t0:.0f} s); objective J, lower is better:"
    )
    for line in placement.format_table(compared):
        print(line)
    best = placement.best_heuristic(compared)
    print(f"learned J {placement.margin(compared):+.1%} lower than the best heuristic ({best})")


if __name__ == "__main__":
    main()
