"""The campus's AI inference on sliced against whole accelerators (issue 15).

    .venv/bin/python bench/bench_sliced_accel.py [--seed N] [--slices K] [--scale S]

One day of the campus's face-recognition jobs (the inference class: its arrival curve and
durations, :mod:`edgesched.core.campus`) through the queueing model of
:mod:`edgesched.core.accelsim` (its docstring states the latency model), on the devices the
campus leaves inference (its accelerators less AI training's mean use) and on two and four
times as many, for jobs that use a quarter, half or all of one device. Columns: latency
(queue wait + run) mean and p95 in seconds on whole devices and on ``K`` slices per device,
the ratio of the means (sliced / whole: 0.60 would be the article's -40 %), the share of
units held and of device compute used (the same work in both: slicing changes what is held,
not what is used).
"""

from __future__ import annotations

import argparse

from edgesched.core.accelsim import inference_devices, inference_jobs, run_queue

APPETITES = (0.25, 0.5, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    jobs = inference_jobs(args.seed, args.scale)
    base = inference_devices(args.scale)
    k = args.slices
    print(
        f"{len(jobs.arrivals)} inference jobs in a day (seed {args.seed}, scale {args.scale:g}); "
        f"{base} devices left to inference by AI training; {k} slices per device"
    )
    head = (
        f"| devices | appetite | whole mean s | whole p95 s | 1/{k} mean s | 1/{k} p95 s "
        f"| mean ratio | p95 ratio | held whole | held 1/{k} | compute used |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for devices in (base, 2 * base, 4 * base):
        for appetite in APPETITES:
            whole = run_queue(jobs, devices, 1, appetite)
            sliced = run_queue(jobs, devices, k, appetite)
            print(
                f"| {devices} | {appetite:g} | {whole.mean_s:.1f} | {whole.p95_s:.1f} "
                f"| {sliced.mean_s:.1f} | {sliced.p95_s:.1f} "
                f"| {sliced.mean_s / whole.mean_s:.3f} | {sliced.p95_s / whole.p95_s:.3f} "
                f"| {whole.held:.3f} | {sliced.held:.3f} | {whole.used:.3f} |"
            )


if __name__ == "__main__":
    main()
