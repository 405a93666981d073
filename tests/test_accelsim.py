"""The inference queueing model of sliced against whole accelerators (core/accelsim.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.core.accelsim import Jobs, inference_devices, inference_jobs, run_queue

jobs_st = st.lists(st.tuples(st.floats(0, 3600), st.floats(0.5, 600)), min_size=1, max_size=60).map(
    lambda pairs: Jobs(
        tuple(sorted(a for a, _ in pairs)), tuple(d for _, d in sorted(pairs, key=lambda p: p[0]))
    )
)


@settings(max_examples=200, deadline=None)
@given(jobs=jobs_st, devices=st.integers(1, 6), slices=st.integers(1, 7))
def test_slices_a_job_fits_in_never_make_it_later(jobs: Jobs, devices: int, slices: int) -> None:
    """A job that needs no more than one slice runs as fast on it: more units, the same run
    times, so under FCFS no job starts later and the mean latency is no larger."""
    whole = run_queue(jobs, devices, 1, 1.0 / slices)
    sliced = run_queue(jobs, devices, slices, 1.0 / slices)
    assert sliced.mean_s <= whole.mean_s + 1e-6
    assert sliced.peak_running <= devices * slices and whole.peak_running <= devices
    for r in (whole, sliced):
        assert 0 <= r.used <= r.held + 1e-9 <= 1 + 1e-9
    # the same work either way; slicing shrinks what is held to what is used
    assert math.isclose(whole.used, sliced.used, rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(sliced.held, sliced.used, rel_tol=1e-6, abs_tol=1e-12)


def test_without_a_queue_a_full_appetite_job_runs_slices_times_longer() -> None:
    jobs = Jobs((0.0, 1000.0, 2000.0), (10.0, 20.0, 30.0))
    whole = run_queue(jobs, 2, 1, 1.0)
    sliced = run_queue(jobs, 2, 4, 1.0)
    assert whole.mean_s == pytest.approx(20.0) and whole.mean_wait_s == 0.0
    assert sliced.mean_s == pytest.approx(80.0)  # a quarter of the device at full appetite
    half = run_queue(jobs, 2, 4, 0.5)
    assert half.mean_s == pytest.approx(40.0)


def test_a_queue_is_served_in_order_on_the_units() -> None:
    jobs = Jobs((0.0, 0.0, 0.0), (10.0, 10.0, 10.0))
    assert run_queue(jobs, 1, 1, 0.25).mean_s == pytest.approx((10 + 20 + 30) / 3)
    assert run_queue(jobs, 1, 4, 0.25).mean_s == pytest.approx(10.0)
    with pytest.raises(ValueError):
        run_queue(jobs, 0, 1, 0.5)
    with pytest.raises(ValueError):
        run_queue(jobs, 1, 1, 0.0)


def test_the_campus_day_is_deterministic_per_seed() -> None:
    a, b = inference_jobs(3), inference_jobs(3)
    assert a == b and a != inference_jobs(4)
    assert len(a.arrivals) > 10_000  # tens of thousands of face-recognition jobs a day
    assert list(a.arrivals) == sorted(a.arrivals)
    assert 1 <= inference_devices() < 80  # the campus's 80 accelerators less training's
