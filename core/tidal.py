"""Time-of-day ("tidal") capacity profiles.

A profile is a list of windows over the day. Inside a window each named workload class is
*guaranteed* a share of the fleet's CPU capacity: it may always grow to its share, preempting
borrowers (classes above their own share) of no higher priority to get there. Unused guaranteed
capacity can be borrowed by anyone until its owner asks for it back. A window may also rotate
an extra share between classes in fixed time slices (time-slice rotation).

Pure data and pure functions of the time of day; profiles come from config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from edgesched.core.model import SECONDS_PER_DAY


def parse_clock(text: str) -> float:
    """``"HH:MM"`` (or ``"HH:MM:SS"``) to seconds after midnight; ``"24:00"`` is allowed."""
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ValueError(f"time of day must look like HH:MM, got {text!r}")
    hours, minutes = int(parts[0]), int(parts[1])
    seconds = int(parts[2]) if len(parts) == 3 else 0
    if minutes > 59 or seconds > 59 or hours > 24 or (hours == 24 and (minutes or seconds)):
        raise ValueError(f"time of day out of range: {text!r}")
    return float(hours * 3600 + minutes * 60 + seconds)


def format_clock(seconds: float) -> str:
    s = int(seconds % SECONDS_PER_DAY)
    return f"{s // 3600:02d}:{(s % 3600) // 60:02d}"


@dataclass(frozen=True, slots=True)
class TidalWindow:
    """One time-of-day window. ``end < start`` wraps midnight (e.g. 22:00-06:00).

    ``shares`` maps workload class to its guaranteed fraction of fleet CPU capacity.
    ``rotate`` lists classes that take turns, ``slice_s`` seconds each, holding an extra
    ``rotate_share`` on top of their own share.
    """

    name: str
    start_s: float
    end_s: float
    shares: Mapping[str, float] = field(default_factory=dict)
    rotate: tuple[str, ...] = ()
    rotate_share: float = 0.0
    slice_s: float = 1800.0

    def __post_init__(self) -> None:
        for bound in (self.start_s, self.end_s):
            if not 0 <= bound <= SECONDS_PER_DAY:
                raise ValueError(f"window {self.name!r}: bounds must be within the day")
        if self.start_s == self.end_s:
            raise ValueError(f"window {self.name!r}: start and end are equal")
        for workload, share in self.shares.items():
            if not 0 <= share <= 1:
                raise ValueError(f"window {self.name!r}: share of {workload!r} must be in [0, 1]")
        if not 0 <= self.rotate_share <= 1:
            raise ValueError(f"window {self.name!r}: rotate_share must be in [0, 1]")
        if self.rotate and self.slice_s <= 0:
            raise ValueError(f"window {self.name!r}: slice_s must be > 0")
        peak = sum(self.shares.values()) + (self.rotate_share if self.rotate else 0.0)
        if peak > 1 + 1e-9:
            raise ValueError(f"window {self.name!r}: shares add up to {peak:.2f} > 1")

    def contains(self, time_of_day: float) -> bool:
        if self.start_s < self.end_s:
            return self.start_s <= time_of_day < self.end_s
        return time_of_day >= self.start_s or time_of_day < self.end_s

    def elapsed(self, time_of_day: float) -> float:
        """Seconds since this window opened (for a time inside it)."""
        return (time_of_day - self.start_s) % SECONDS_PER_DAY

    def shares_at(self, time_of_day: float) -> dict[str, float]:
        shares = dict(self.shares)
        if self.rotate and self.rotate_share > 0:
            turn = int(self.elapsed(time_of_day) // self.slice_s) % len(self.rotate)
            holder = self.rotate[turn]
            shares[holder] = min(1.0, shares.get(holder, 0.0) + self.rotate_share)
        return shares


@dataclass(frozen=True, slots=True)
class TidalProfile:
    """A named list of windows; the first window containing a time of day applies."""

    name: str = "none"
    windows: tuple[TidalWindow, ...] = ()

    def window_at(self, now: float) -> TidalWindow | None:
        tod = now % SECONDS_PER_DAY
        for window in self.windows:
            if window.contains(tod):
                return window
        return None

    def shares_at(self, now: float) -> dict[str, float]:
        """Guaranteed CPU share per workload class at time ``now`` (empty outside windows)."""
        window = self.window_at(now)
        return window.shares_at(now % SECONDS_PER_DAY) if window else {}

    def boundaries(self) -> tuple[float, ...]:
        """Every time of day where the shares may change (window edges and slice edges)."""
        points: set[float] = set()
        for w in self.windows:
            points.update((w.start_s, w.end_s % SECONDS_PER_DAY))
            if w.rotate:
                span = (w.end_s - w.start_s) % SECONDS_PER_DAY or SECONDS_PER_DAY
                k = 1
                while k * w.slice_s < span:
                    points.add((w.start_s + k * w.slice_s) % SECONDS_PER_DAY)
                    k += 1
        return tuple(sorted(points))


def campus_profile() -> TidalProfile:
    """The smart-campus profile of the source article.

    07:00-09:00 70% to face recognition at the gates; 09:00-12:00 80% to video conferencing;
    12:30-14:00 to AI training; working hours 60% to cloud desktops; nights to video analytics,
    rotating with AI training in 30-minute slices.
    """
    c = parse_clock
    return TidalProfile(
        name="campus",
        windows=(
            TidalWindow("gates", c("07:00"), c("09:00"), {"face-recognition": 0.7}),
            TidalWindow("meetings", c("09:00"), c("12:00"), {"video-conferencing": 0.8}),
            TidalWindow("lunch-training", c("12:30"), c("14:00"), {"ai-training": 0.6}),
            TidalWindow("working-hours", c("12:00"), c("18:00"), {"cloud-desktop": 0.6}),
            TidalWindow(
                "night",
                c("22:00"),
                c("06:00"),
                {"video-analytics": 0.5},
                rotate=("ai-training", "video-analytics"),
                rotate_share=0.3,
                slice_s=1800.0,
            ),
        ),
    )
