"""Tidal (time-of-day) profiles: windows, midnight wrap, time-slice rotation, the campus profile."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgesched.core.model import SECONDS_PER_DAY
from edgesched.core.tidal import (
    TidalProfile,
    TidalWindow,
    campus_profile,
    format_clock,
    parse_clock,
)

H = 3600.0


def test_parse_and_format_clock() -> None:
    assert parse_clock("07:30") == 7.5 * H
    assert parse_clock("24:00") == SECONDS_PER_DAY
    assert parse_clock("23:59:59") == SECONDS_PER_DAY - 1
    assert format_clock(7.5 * H) == "07:30"
    for bad in ("7", "25:00", "12:60", "24:01", "ab:cd", ""):
        with pytest.raises(ValueError):
            parse_clock(bad)


def test_campus_profile_matches_the_article() -> None:
    p = campus_profile()
    assert p.shares_at(8 * H) == {"face-recognition": 0.7}
    assert p.shares_at(10 * H) == {"video-conferencing": 0.8}
    assert p.shares_at(13 * H) == {"ai-training": 0.6}  # lunch window wins over working hours
    assert p.shares_at(15 * H) == {"cloud-desktop": 0.6}
    assert p.shares_at(20 * H) == {}
    # Day 3 behaves like day 1: profiles repeat daily.
    assert p.shares_at(2 * SECONDS_PER_DAY + 8 * H) == {"face-recognition": 0.7}


def test_night_window_wraps_midnight_and_rotates_in_slices() -> None:
    night = campus_profile().window_at(23 * H)
    assert night is not None and night.name == "night"
    assert night.contains(23 * H) and night.contains(1 * H) and not night.contains(12 * H)
    p = campus_profile()
    first = p.shares_at(22 * H + 60)  # first slice: ai-training holds the rotating share
    second = p.shares_at(22 * H + 1800 + 60)
    assert first == {"video-analytics": 0.5, "ai-training": 0.3}
    assert second == {"video-analytics": 0.8}
    # Rotation continues across midnight: 00:00 is 4 slices after 22:00 -> ai-training again.
    assert p.shares_at(SECONDS_PER_DAY + 60) == first


def test_bad_windows_are_rejected() -> None:
    with pytest.raises(ValueError, match="add up"):
        TidalWindow("w", 0, H, {"a": 0.7, "b": 0.5})
    with pytest.raises(ValueError, match="equal"):
        TidalWindow("w", H, H, {"a": 0.5})
    with pytest.raises(ValueError, match="share"):
        TidalWindow("w", 0, H, {"a": 1.5})
    with pytest.raises(ValueError, match="slice_s"):
        TidalWindow("w", 0, H, {}, rotate=("a",), rotate_share=0.2, slice_s=0)


def test_boundaries_include_window_and_slice_edges() -> None:
    b = campus_profile().boundaries()
    assert 7 * H in b and 9 * H in b and 22.5 * H in b and 0.0 in b


windows = st.builds(
    lambda start, length, share, rot: TidalWindow(
        "w",
        float(start),
        float((start + length) % 86_400) or 86_400.0,
        {"a": share},
        rotate=("b", "c") if rot else (),
        rotate_share=(1 - share) * 0.5 if rot else 0.0,
        slice_s=600.0,
    ),
    st.integers(0, 86_399),
    st.integers(60, 86_000),
    st.floats(0, 1),
    st.booleans(),
)


@given(windows, st.floats(0, 10 * SECONDS_PER_DAY, allow_nan=False))
def test_property_shares_stay_within_the_window_and_sum_to_at_most_one(
    window: TidalWindow, t: float
) -> None:
    profile = TidalProfile("p", (window,))
    shares = profile.shares_at(t)
    inside = window.contains(t % SECONDS_PER_DAY)
    assert bool(shares) == inside
    assert sum(shares.values()) <= 1 + 1e-9
    assert all(0 <= v <= 1 for v in shares.values())
    if inside and window.rotate and window.rotate_share > 0:  # (a turn of nothing: no holder)
        holders = [c for c in window.rotate if c in shares]
        assert len(holders) == 1
