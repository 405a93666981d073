"""The demo's autoscaled service (issue 15): the gates' face-recognition front end.

``gate-api`` is a service whose replica count follows the morning and evening gate peaks: the
demo reports its load to central every simulated 5 minutes (the cores the campus model's face
recognition class keeps busy then, :func:`edgesched.core.campus.expected_cores_in_use`, for
this fleet), and central's autoscaler (metric ``forecast``: the higher of the load and its
15-minute forecast, :mod:`edgesched.central.services`) sets the count, on a clock as fast as the
demo's (``[central] autoscale_time_scale``). The demo records each change with its reason and
reports when the forecast first scaled the service out ahead of the morning peak.

Pure helpers here; the demo's loop calls them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edgesched.core.campus import BIN_S, BINS_PER_DAY, expected_cores_in_use, workload_classes

NAME = "gate-api"
CLASS = "face-recognition"
#: The replica count at the day's peak load (the per-replica target is sized for it).
PEAK_REPLICAS = 6
#: When the morning gate peak starts (the campus model's face recognition plateau).
MORNING_PEAK_S = 7 * 3600.0
#: The simulated day's midnight as unix time (UTC), for the load reports' ``at``: the
#: forecast reads the time of day (2026-01-05, a Monday).
SIM_EPOCH_S = 1_767_571_200.0


def load_curve(fleet_cpu: float) -> tuple[float, ...]:
    """The face-recognition cores in use per 5-minute bin of the day, for this fleet."""
    return expected_cores_in_use(workload_classes(fleet_cpu)[CLASS])


def service_body(
    curve: tuple[float, ...], *, env: dict[str, str], cwd: str, real_s: float
) -> dict[str, Any]:
    """``POST /v1/services`` for the gate front end: replicas of half a core, one per
    ``peak / PEAK_REPLICAS`` cores of load, 1 to ``PEAK_REPLICAS + 2``; scale-in after 30
    simulated minutes of lower load, a replica at a time."""
    target = max(max(curve) / PEAK_REPLICAS, 1e-3)
    return {
        "name": NAME,
        "template": {
            "command": ["sleep", str(int(real_s + 3600))],
            "workload": CLASS,
            "priority": 90,
            "cpu": 0.5,
            "mem_gib": 0.25,
            "preemptible": False,
            "env": dict(env),
            "cwd": cwd,
        },
        "replicas": 1,
        "min": 1,
        "max": PEAK_REPLICAS + 2,
        "autoscale": {
            "metric": "forecast",
            "target_per_replica": round(target, 3),
            "scale_in_delay_s": 1800.0,
            "max_step_out": 2,
            "max_step_in": 1,
        },
        "spread": {"across": ["node"]},
    }


def load_at(curve: tuple[float, ...], sim_s: float) -> float:
    """The load the demo reports at simulated time ``sim_s``."""
    return round(curve[int(sim_s // BIN_S) % BINS_PER_DAY], 3)


@dataclass
class ScaleLog:
    """What the demo saw of the service: each change of its count, in simulated time."""

    changes: list[dict[str, Any]] = field(default_factory=list)
    last: int | None = None

    def seen(self, sim_s: float, view: dict[str, Any]) -> bool:
        """Record ``view`` (``GET /v1/services/gate-api``) if its count changed."""
        replicas = int(view["replicas"])
        if replicas == self.last:
            return False
        self.last = replicas
        self.changes.append(
            {
                "at_s": sim_s,
                "replicas": replicas,
                "running": view["running"],
                "reason": view["reason"],
            }
        )
        return True

    def summary(self, clock_text: Any) -> dict[str, Any]:
        """The report's ``service`` section: the changes, and the scale-out the forecast made
        ahead of the morning peak: the last change before the peak that took the count up
        from its night level, if the forecast made it and nothing before the peak undid it
        (None otherwise)."""
        morning = [c for c in self.changes if c["at_s"] % 86_400 < MORNING_PEAK_S]
        ahead = None
        for i, change in enumerate(morning):
            later = morning[i + 1 :]
            held = all(c["replicas"] >= change["replicas"] for c in later)
            before = morning[i - 1]["replicas"] if i else None
            if (
                change["reason"].startswith("forecast:")
                and before is not None
                and change["replicas"] > before
                and held
            ):
                ahead = change
                break
        return {
            "name": NAME,
            "changes": [{**c, "at": clock_text(c["at_s"])} for c in self.changes],
            "peak_replicas": max((c["replicas"] for c in self.changes), default=None),
            "morning_peak_at": clock_text(MORNING_PEAK_S),
            "forecast_scale_out_at": None if ahead is None else clock_text(ahead["at_s"]),
            "forecast_lead_min": None
            if ahead is None
            else math.floor((MORNING_PEAK_S - ahead["at_s"] % 86_400) / 60),
        }
