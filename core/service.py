"""Services: a task template run as a number of replicas, and the pure rules that keep it so.

A :class:`ServiceSpec` names a task template (the existing :class:`TaskSpec`, its ``id``
ignored), how many replicas to run (``replicas``, kept within ``min``/``max``), how to spread
them (:class:`Spread`), how to scale them (:class:`Autoscale`) and how to roll a changed
template out (:class:`Rollout`).

Each replica fills a *slot* ``0 .. replicas-1`` and is one task of the fleet at a time, with its
own lifecycle (:mod:`edgesched.core.lifecycle`); its id says which:
``<service>.<slot>.<revision>.<incarnation>`` (:func:`replica_id`). The revision is a hash of
the template: a changed template is a new revision, rolled out slot by slot. The incarnation
counts the tasks a slot has had under one revision: a replica that finished or failed for good
is followed by the next incarnation; a replica on a node that died keeps its id (central's
failover places the same task again, a later placement epoch, and the copy that survives a
heal is chosen per task by :mod:`edgesched.sync.reconcile`).

:func:`plan` is the one reconcile rule: from what the replicas are now, which to start and which
to stop. It reads only the slot numbers, revisions and phases, so every peer that sees the same
replicas computes the same plan, and excess replicas are stopped in one order (highest slot
first). :func:`recommend` is the autoscaling rule: the replica count a load signal and its
15-minute forecast ask for, within the step limits and the scale-in delay.

Pure: plain values in, plain values out; the caller passes the time.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from edgesched.core.lifecycle import Phase
from edgesched.core.task import RestartPolicy, SpecError, TaskSpec

__all__ = [
    "Autoscale",
    "Plan",
    "Recommendation",
    "Replica",
    "ReplicaRef",
    "Rollout",
    "ScaleState",
    "ServiceSpec",
    "Spread",
    "parse_replica_id",
    "plan",
    "rebalance_donor",
    "recommend",
    "replica_id",
    "revision_of",
]

#: A service's name: a DNS label (as a Kubernetes Deployment's), so that the replica ids built
#: from it are task ids and can be parsed back.
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_REPLICA = re.compile(
    r"([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)\.(\d{1,6})\.([0-9a-f]{8})\.(\d{1,9})"
)
#: Replicas a service may ask for: far more than a fleet of thousands of gateways runs of one
#: service, few enough that a typo cannot queue a million tasks.
MAX_REPLICAS = 10_000
#: Topology keys replicas spread across.
SPREAD_KEYS = ("node", "site", "arch")
_SERVICE_FIELDS = frozenset(
    {"name", "template", "replicas", "min", "max", "autoscale", "spread", "rollout"}
)


class ScaleReason(StrEnum):
    """Why a service's replica count changed (the events timeline says it)."""

    MANUAL = "manual"
    LOAD = "load"
    FORECAST = "forecast"


@dataclass(frozen=True, slots=True)
class Spread:
    """How replicas spread. ``max_per_node`` (0: no bound) is a hard limit; ``across`` lists
    the topology keys (``node``, ``site``, ``arch``) whose domains the core evens the replicas
    out over, as a score that outweighs the policy's own (Kubernetes' topology spread, soft)."""

    max_per_node: int = 0
    across: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.max_per_node <= MAX_REPLICAS:
            raise SpecError(f"spread.max_per_node: must be in [0, {MAX_REPLICAS}]")
        for key in self.across:
            if key not in SPREAD_KEYS:
                raise SpecError(f"spread.across: each must be one of {', '.join(SPREAD_KEYS)}")
        if len(set(self.across)) != len(self.across):
            raise SpecError("spread.across: a key is named twice")

    def to_json(self) -> dict[str, Any]:
        return {"max_per_node": self.max_per_node, "across": list(self.across)}

    @classmethod
    def from_json(cls, data: object) -> Spread:
        raw = _object(data, "spread", {"max_per_node", "across"})
        across = raw.get("across", [])
        if not isinstance(across, list) or not all(isinstance(k, str) for k in across):
            raise SpecError("spread.across: a list of topology keys")
        return cls(_int(raw, "spread.max_per_node", "max_per_node", 0), tuple(across))


@dataclass(frozen=True, slots=True)
class Autoscale:
    """Replicas follow the service's load (cores of work it serves, as reported to central):
    ``ceil(load / target_per_replica)``, or with ``metric = "forecast"`` the higher of the load
    now and the 15-minute forecast's peak, so replicas start ahead of a peak. At most
    ``max_step_out`` replicas are added and ``max_step_in`` removed per decision, and a
    scale-in happens only when every recommendation of the last ``scale_in_delay_s`` agreed
    (Kubernetes' stabilization window: a dip does not stop replicas the next minute needs)."""

    metric: str = "forecast"
    target_per_replica: float = 1.0
    scale_in_delay_s: float = 300.0
    max_step_out: int = 4
    max_step_in: int = 1

    def __post_init__(self) -> None:
        if self.metric not in ("load", "forecast"):
            raise SpecError("autoscale.metric: must be one of load, forecast")
        if not math.isfinite(self.target_per_replica) or self.target_per_replica <= 0:
            raise SpecError("autoscale.target_per_replica: must be a finite number > 0")
        if not math.isfinite(self.scale_in_delay_s) or self.scale_in_delay_s < 0:
            raise SpecError("autoscale.scale_in_delay_s: must be a finite number >= 0")
        for name in ("max_step_out", "max_step_in"):
            if not 1 <= getattr(self, name) <= MAX_REPLICAS:
                raise SpecError(f"autoscale.{name}: must be in [1, {MAX_REPLICAS}]")

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "target_per_replica": self.target_per_replica,
            "scale_in_delay_s": self.scale_in_delay_s,
            "max_step_out": self.max_step_out,
            "max_step_in": self.max_step_in,
        }

    @classmethod
    def from_json(cls, data: object) -> Autoscale:
        keys = {"metric", "target_per_replica", "scale_in_delay_s", "max_step_out", "max_step_in"}
        raw = _object(data, "autoscale", keys)
        metric = raw.get("metric", "forecast")
        if not isinstance(metric, str):
            raise SpecError("autoscale.metric: must be one of load, forecast")
        return cls(
            metric,
            _number(raw, "autoscale.target_per_replica", "target_per_replica", 1.0),
            _number(raw, "autoscale.scale_in_delay_s", "scale_in_delay_s", 300.0),
            _int(raw, "autoscale.max_step_out", "max_step_out", 4),
            _int(raw, "autoscale.max_step_in", "max_step_in", 1),
        )


@dataclass(frozen=True, slots=True)
class Rollout:
    """A changed template replaces the replicas ``max_surge`` slots at a time: the new
    revision's replica starts beside the old one, and the old one is stopped once the new one
    has run ``healthy_after_s`` (make before break). After ``max_failures`` replicas of the new
    revision failed, the rollout stops starting more (the old replicas keep running) until the
    template changes again."""

    max_surge: int = 1
    healthy_after_s: float = 10.0
    max_failures: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.max_surge <= MAX_REPLICAS:
            raise SpecError(f"rollout.max_surge: must be in [1, {MAX_REPLICAS}]")
        if not math.isfinite(self.healthy_after_s) or self.healthy_after_s < 0:
            raise SpecError("rollout.healthy_after_s: must be a finite number >= 0")
        if not 1 <= self.max_failures <= MAX_REPLICAS:
            raise SpecError(f"rollout.max_failures: must be in [1, {MAX_REPLICAS}]")

    def to_json(self) -> dict[str, Any]:
        return {
            "max_surge": self.max_surge,
            "healthy_after_s": self.healthy_after_s,
            "max_failures": self.max_failures,
        }

    @classmethod
    def from_json(cls, data: object) -> Rollout:
        raw = _object(data, "rollout", {"max_surge", "healthy_after_s", "max_failures"})
        return cls(
            _int(raw, "rollout.max_surge", "max_surge", 1),
            _number(raw, "rollout.healthy_after_s", "healthy_after_s", 10.0),
            _int(raw, "rollout.max_failures", "max_failures", 3),
        )


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A service: ``replicas`` copies of ``template`` (restart ``always``: a replica runs until
    the service stops it), kept within ``[min, max]``."""

    name: str
    template: TaskSpec
    replicas: int
    min: int = 0
    max: int = MAX_REPLICAS
    autoscale: Autoscale | None = None
    spread: Spread = field(default_factory=Spread)
    rollout: Rollout = field(default_factory=Rollout)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise SpecError(
                "name: 1-63 lowercase letters, digits or '-', starting and ending with a "
                "letter or digit"
            )
        if not 0 <= self.min <= self.max <= MAX_REPLICAS:
            raise SpecError(f"min, max: need 0 <= min <= max <= {MAX_REPLICAS}")
        if not self.min <= self.replicas <= self.max:
            raise SpecError(f"replicas: must be within [min, max] = [{self.min}, {self.max}]")
        if self.template.restart is not RestartPolicy.ALWAYS:
            raise SpecError("template.restart: a service's replicas restart 'always'")

    @property
    def revision(self) -> str:
        return revision_of(self.template)

    def with_replicas(self, replicas: int) -> ServiceSpec:
        """The same service at ``replicas`` (clamped to ``[min, max]``)."""
        return replace(self, replicas=min(max(replicas, self.min), self.max))

    def replica_spec(self, slot: int, incarnation: int) -> TaskSpec:
        """The task of replica ``slot``'s ``incarnation`` under the current template."""
        return replace(self.template, id=replica_id(self.name, slot, self.revision, incarnation))

    def to_json(self) -> dict[str, Any]:
        template = self.template.to_json()
        del template["id"]
        return {
            "name": self.name,
            "template": template,
            "replicas": self.replicas,
            "min": self.min,
            "max": self.max,
            "autoscale": None if self.autoscale is None else self.autoscale.to_json(),
            "spread": self.spread.to_json(),
            "rollout": self.rollout.to_json(),
        }

    @classmethod
    def from_json(cls, data: object) -> ServiceSpec:
        """Parse and validate an untrusted JSON object (a REST body, a job file's table, a
        document entry); errors name the field. The template's ``restart`` defaults to
        ``always``, its ``id`` to the service's name (it is replaced per replica)."""
        raw = _object(data, "body", _SERVICE_FIELDS)
        name = raw.get("name")
        if not isinstance(name, str):
            raise SpecError("name: missing (required), a string")
        if "template" not in raw:
            raise SpecError("template: missing (required)")
        template_raw = raw["template"]
        if not isinstance(template_raw, Mapping):
            raise SpecError("template: must be a JSON object (a task spec without its id)")
        template_data = {"restart": "always", **template_raw}
        template_data.setdefault("id", name if _NAME.fullmatch(name) else "service")
        try:
            template = TaskSpec.from_json(template_data)
        except SpecError as exc:
            raise SpecError(f"template.{exc}") from None
        replicas = _int(raw, "replicas", "replicas", 1)
        autoscale_raw = raw.get("autoscale")
        return cls(
            name,
            template,
            replicas,
            _int(raw, "min", "min", 0),
            _int(raw, "max", "max", MAX_REPLICAS),
            None if autoscale_raw is None else Autoscale.from_json(autoscale_raw),
            Spread.from_json(raw.get("spread", {})),
            Rollout.from_json(raw.get("rollout", {})),
        )


def revision_of(template: TaskSpec) -> str:
    """8 hex digits naming a template's content (its id aside): equal templates, equal
    revisions, on every peer."""
    data = template.to_json()
    data.pop("id", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


@dataclass(frozen=True, slots=True, order=True)
class ReplicaRef:
    """What a replica's task id says: its service, slot, template revision and incarnation."""

    service: str
    slot: int
    revision: str
    incarnation: int


def replica_id(service: str, slot: int, revision: str, incarnation: int) -> str:
    return f"{service}.{slot}.{revision}.{incarnation}"


def parse_replica_id(task_id: str) -> ReplicaRef | None:
    """The replica a task id names, or None if it names no replica."""
    match = _REPLICA.fullmatch(task_id)
    if match is None:
        return None
    service, slot, revision, incarnation = match.groups()
    return ReplicaRef(service, int(slot), revision, int(incarnation))


# --- the reconcile rule ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replica:
    """One task of a service as central knows it: its id's parts, its lifecycle phase, the
    node it is on, since when it runs (None: not running) and whether central has asked it to
    stop (cancelled, not finished yet)."""

    ref: ReplicaRef
    phase: Phase
    node: str | None = None
    running_since: float | None = None
    stopping: bool = False

    @property
    def task_id(self) -> str:
        r = self.ref
        return replica_id(r.service, r.slot, r.revision, r.incarnation)

    @property
    def live(self) -> bool:
        """Holds its slot: not finished, not asked to stop. A replica on a dead node is live
        (its task is failed over under the same id, not replaced by a new one)."""
        return not self.stopping and (self.phase is Phase.LOST or not self.phase.final)


@dataclass(frozen=True, slots=True)
class Plan:
    """What :func:`plan` asks for: replicas to start (slot, incarnation) under the current
    revision, and replicas to stop (task id, why), in the order to act on them."""

    start: tuple[tuple[int, int], ...] = ()
    stop: tuple[tuple[str, str], ...] = ()
    #: The rollout: slots still on an older revision, and whether it stopped on failures.
    outdated: int = 0
    stalled: bool = False

    @property
    def empty(self) -> bool:
        return not self.start and not self.stop


def plan(
    spec: ServiceSpec, replicas: Iterable[Replica], now: float, next_incarnation: int = 0
) -> Plan:
    """The one reconcile rule of a service: from its replicas (every task of it central knows,
    any phase), which to start and which to stop so that each slot below ``spec.replicas``
    holds exactly one live replica of the current revision and no slot above holds any.

    - A slot above the count: its replicas stop, highest slot first (excess).
    - A replica that finished (failed for good, or exited) is retired: stopped too, so that
      any older copy of it (left running by a node cut off while it failed over) stops.
    - A slot of two live replicas of the current revision (two incarnations, e.g. one started
      while the other's node was cut off): the older incarnation stops.
    - A slot without a live replica of the current revision: the rollout starts one (the next
      incarnation), up to ``rollout.max_surge`` slots at a time while an older revision still
      runs in other slots, lowest slot first; a slot with no live replica at all always
      starts one (a lost replica is replaced whatever the rollout).
    - An older revision's replica stops once its slot's current replica has run
      ``rollout.healthy_after_s`` (make before break); or, when the current one waits for
      room (pending: the fleet or the spread's bound is full), at once, if ``min`` replicas
      still run without it (break before make, Kubernetes' ``maxUnavailable``).
    - After ``rollout.max_failures`` failures of the current revision, outdated slots that
      still run get no new replica (the rollout stalls; empty slots are still filled).

    A started replica takes the next incarnation of the service: at least
    ``next_incarnation`` (the service's high-water mark: ids of pruned replicas are never used
    again) and past every incarnation among ``replicas``.

    Deterministic: the same replicas give the same plan, whatever order they come in."""
    revision = spec.revision
    by_slot: dict[int, list[Replica]] = {}
    failures = 0
    counter = next_incarnation
    for replica in replicas:
        if replica.ref.service != spec.name:
            raise ValueError(f"{replica.task_id} is not a replica of {spec.name}")
        by_slot.setdefault(replica.ref.slot, []).append(replica)
        counter = max(counter, replica.ref.incarnation + 1)
        if replica.ref.revision == revision and replica.phase is Phase.FAILED:
            failures += 1
    for held in by_slot.values():  # (by incarnation: the newest last)
        held.sort(key=lambda r: (r.ref.incarnation, r.ref.revision))
    stalled = failures >= spec.rollout.max_failures
    stop: list[tuple[str, str]] = []
    start: list[tuple[int, int]] = []
    for slot in sorted(by_slot, reverse=True):  # excess: highest slot first
        if slot >= spec.replicas:
            stop.extend(
                (r.task_id, f"scaled to {spec.replicas}: slot {slot} is not wanted")
                for r in by_slot[slot]
                if r.live
            )
    for slot in sorted(by_slot):  # finished for good: retired (its assignment cancelled), so
        # a copy of it a node cut off during its failover still runs is stopped on heal
        stop.extend(
            (r.task_id, f"{r.phase.value}: retired, slot {slot} gets a new incarnation")
            for r in by_slot[slot]
            if r.phase in (Phase.FAILED, Phase.EXITED) and not r.stopping
        )
    outdated: list[int] = []
    surging = 0
    serving = sum(  # slots below the count with a running replica
        1
        for slot in range(spec.replicas)
        if any(r.live and r.phase is Phase.RUNNING for r in by_slot.get(slot, ()))
    )
    for slot in range(spec.replicas):
        live = [r for r in by_slot.get(slot, ()) if r.live]
        current = [r for r in live if r.ref.revision == revision]
        older = [r for r in live if r.ref.revision != revision]
        for extra in current[:-1]:  # (sorted: the last is the newest incarnation)
            stop.append((extra.task_id, f"slot {slot} holds a newer incarnation"))
        if not live:
            start.append((slot, counter))
            counter += 1
            continue
        if not older:
            continue
        if not current:
            for extra in older[:-1]:  # (two older revisions: a rollout replaced by another)
                stop.append((extra.task_id, f"slot {slot} holds a newer replica"))
            outdated.append(slot)
            continue
        newest = current[-1]
        healthy = (
            newest.phase is Phase.RUNNING
            and newest.running_since is not None
            and now - newest.running_since >= spec.rollout.healthy_after_s
        )
        if healthy:
            stop.extend(
                (r.task_id, f"rolled out: slot {slot} runs revision {revision}") for r in older
            )
        elif newest.phase is Phase.PENDING and serving - 1 >= spec.min:
            # no room to start beside the old one (the fleet, or the spread's bound, is
            # full): the old one makes room, as long as min replicas still serve
            serving -= 1
            stop.extend(
                (r.task_id, f"no room to roll slot {slot} out beside it: replaced in place")
                for r in older
            )
            surging += 1
        else:
            surging += 1
    room = 0 if stalled else max(spec.rollout.max_surge - surging, 0)
    for slot in outdated[:room]:
        start.append((slot, counter))
        counter += 1
    return Plan(
        tuple(start), tuple(stop), outdated=len(outdated), stalled=stalled and bool(outdated)
    )


def rebalance_donor(
    spec: ServiceSpec,
    replicas: Iterable[Replica],
    domain_of: Callable[[str], str | None],
    domains: int,
) -> tuple[Replica, int] | None:
    """The replica to move so that the service's spread evens out again (a node came back,
    or joined, after the replicas were placed): when every slot runs (nothing starting or
    stopping), the fullest domain of the first ``spread.across`` key holds two or more
    replicas more than the emptiest (``domains``: how many domains there are, so an empty one
    counts), the replica of the highest slot in the fullest domain (the first by name, of
    equally full ones). Returns it with its domain's count, or None. Which node takes it is
    the core's choice (its spread score puts it in the emptiest domain); the move is worth
    making only if that domain then holds fewer than the donor's did."""
    if not spec.spread.across:
        return None
    live = [r for r in replicas if r.live]
    if len(live) != spec.replicas or not live:
        return None
    counts: dict[str, int] = {}
    where: dict[str, str] = {}
    for r in live:
        domain = None if r.node is None or r.phase is not Phase.RUNNING else domain_of(r.node)
        if domain is None:
            return None  # (not settled: starting, lost, or on a node no longer usable)
        counts[domain] = counts.get(domain, 0) + 1
        where[r.task_id] = domain
    low = 0 if domains > len(counts) else min(counts.values())
    high = max(sorted(counts), key=lambda d: counts[d])
    if counts[high] - low < 2:
        return None
    donor = max((r for r in live if where[r.task_id] == high), key=lambda r: r.ref)
    return donor, counts[high]


# --- the autoscaling rule ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleState:
    """What the autoscaler remembers between decisions: its recent recommendations, (time,
    replicas), newest last, kept for the scale-in delay."""

    recent: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Recommendation:
    replicas: int
    reason: ScaleReason
    why: str
    state: ScaleState


def recommend(
    spec: ServiceSpec,
    load: float | None,
    forecast_peak: float | None,
    state: ScaleState,
    now: float,
) -> Recommendation:
    """The replica count ``spec.autoscale`` asks for now. ``load``: cores of work the service
    serves now (None: not known, the count stays); ``forecast_peak``: the highest load the
    15-minute forecast expects (None: no forecast; read only with ``metric = "forecast"``).

    Raw want: ``ceil(signal / target_per_replica)`` (at least ``min``, at most ``max``); a
    scale-out adds at most ``max_step_out``; a scale-in goes no lower than the highest want of
    the last ``scale_in_delay_s`` and removes at most ``max_step_in``."""
    rule = spec.autoscale
    current = spec.replicas
    if rule is None or load is None or not math.isfinite(load) or load < 0:
        return Recommendation(current, ScaleReason.MANUAL, "no load reported", state)
    signal, reason = load, ScaleReason.LOAD
    what = f"load {load:.2f} cores"
    if (
        rule.metric == "forecast"
        and forecast_peak is not None
        and math.isfinite(forecast_peak)
        and forecast_peak > load
    ):
        signal, reason = forecast_peak, ScaleReason.FORECAST
        what = f"forecast peak {forecast_peak:.2f} cores in the next 15 minutes (load {load:.2f})"
    want = min(max(math.ceil(signal / rule.target_per_replica - 1e-9), spec.min), spec.max)
    recent = tuple((t, r) for t, r in state.recent if now - t < rule.scale_in_delay_s)
    recent = (*recent, (now, want))
    held = max(r for _, r in recent)
    per = f"{rule.target_per_replica:g} cores a replica"
    if want > current:
        replicas = min(want, current + rule.max_step_out)
        why = f"{what} at {per} wants {want}"
    elif held < current:
        replicas = max(held, current - rule.max_step_in)
        why = f"{what} at {per} wanted at most {held} for {rule.scale_in_delay_s:g} s"
    else:
        replicas = current
        why = f"{what} at {per} wants {want}; {current} held for the scale-in delay"
    return Recommendation(replicas, reason, why, ScaleState(recent))


# --- JSON helpers -----------------------------------------------------------------------------


def _object(data: object, where: str, keys: frozenset[str] | set[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: must be a JSON object")
    unknown = sorted(str(k) for k in data if k not in keys)
    if unknown:
        prefix = "" if where == "body" else f"{where}."
        name = unknown[0] if re.fullmatch(r"[\w.-]+", unknown[0]) else repr(unknown[0])
        raise SpecError(f"{prefix}{name}: unknown field")
    return data


def _int(raw: Mapping[str, Any], where: str, key: str, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 2**53:
        raise SpecError(f"{where}: must be an integer")
    return value


def _number(raw: Mapping[str, Any], where: str, key: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where}: must be a number")
    return float(value)
