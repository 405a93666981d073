"""Central's service controller: keeps every service at its replica count (issue 15).

Services live in central's fleet document (``services``: name -> :class:`ServiceEntry`, the
spec's JSON with its replica count; ``loads``: name -> the load last reported for it), so
central replicas share them and SQLite journals them with the rest of the fleet. Each control
step of the acting central (the owner of the service name's shard, with leases) runs the pure
rule of :mod:`edgesched.core.service` over each service's replicas, which it finds in the fleet
index by their ids (``<service>.<slot>.<revision>.<incarnation>``, one sorted run), and acts on
the plan: a replica to start becomes a task placed by the core with the service's spread
(:mod:`edgesched.core.spread`) or waiting for its shard's owner; a replica to stop has its
assignment cancelled, which its node hears (a cut-off node on heal). Every scaling decision
(manual, load, forecast) and every rollout step is an event on the timeline.

The autoscaler (:func:`edgesched.core.service.recommend`) reads the load reported for the
service and the 15-minute forecast of it: each report is folded into 5-minute bins per service
as it arrives (:class:`ClassDemand` under the template's workload class, so the per-class
forecast model applies to the classes it knows) and forecast on each closed bin. It runs on
its own clock, real time unless ``[central] autoscale_time_scale`` speeds it up (a demo's
accelerated day). A service without a fresh report (5 minutes) keeps its count.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from edgesched.core.classdemand import ClassDemand, peak_over_classes
from edgesched.core.lifecycle import Phase
from edgesched.core.service import (
    Plan,
    Replica,
    ReplicaRef,
    ScaleState,
    ServiceSpec,
    parse_replica_id,
    plan,
    rebalance_donor,
    recommend,
)
from edgesched.core.spread import SpreadGroup
from edgesched.core.task import TaskSpec
from edgesched.sync.schema import AssignmentState, LoadReport, ServiceEntry

if TYPE_CHECKING:
    from edgesched.central.fleetindex import FleetIndex
    from edgesched.core.forecast import Forecaster
    from edgesched.core.lifecycle import Lifecycle
    from edgesched.sync.doc import PolicyDoc
    from edgesched.sync.schema import AssignmentEntry


class ServiceHost(Protocol):
    """What the controller needs of central's engine (:class:`CentralEngine` is one)."""

    fleet: PolicyDoc | None
    index: FleetIndex

    @property
    def central_id(self) -> str: ...

    def sync_index(self, *, project: bool = True) -> None: ...

    def lifecycle_of(self, task_id: str, entry: AssignmentEntry | None) -> Lifecycle: ...

    def record_event(
        self, kind: str, detail: str, *, node: str | None = None, task: str | None = None
    ) -> None: ...

    def admit_replicas(self, specs: Sequence[TaskSpec]) -> None: ...

    def forecaster_for(self) -> Callable[[str], Forecaster] | None: ...

    def domains(self, key: str) -> tuple[Callable[[str], str | None], int]: ...

    def rebalance_replica(
        self, task_id: str, reason: str, accept: Callable[[str], bool]
    ) -> str | None: ...


log = logging.getLogger("edgesched.central.services")

#: How often the services with a timer running are looked at (a rollout's health wait; the
#: autoscaler's decisions, each :data:`AUTOSCALE_EVERY_S`); a change to a replica's report or
#: assignment has its service reconciled at the next step, whatever the time.
RECONCILE_EVERY_S = 1.0
#: How often every service is reconciled whatever changed (a safety net: a change the index
#: did not name, an assignment forgotten past its retention).
FULL_PASS_S = 30.0
#: How often each autoscaled service is re-decided.
AUTOSCALE_EVERY_S = 15.0
#: Closed 5-minute bins of load a service needs before its forecast is read (30 minutes: a
#: forecaster given one or two bins extrapolates noise, and scaled a demo's service out at
#: 04:05 for a 07:00 peak).
MIN_FORECAST_BINS = 6
#: A load report older than this is not acted on (its reporter went away).
LOAD_FRESH_S = 300.0
#: Services central holds at most (each is a few hundred bytes of the fleet document and a
#: scan of its replicas every reconcile).
MAX_SERVICES = 1_000


class ServiceRefused(Exception):
    """A service call refused: HTTP status, the field at fault, the message."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message


@dataclass(slots=True)
class _Autoscaled:
    """What the controller keeps per autoscaled service (memory only: a new acting central
    starts afresh, which delays a scale-in by at most the delay, never a scale-out)."""

    state: ScaleState
    demand: ClassDemand
    forecast: float | None = None
    decided_at: float = float("-inf")


class ServiceController:
    """The service half of central's control step; its engine's lock is held around every
    call (the API's and the step's)."""

    def __init__(
        self,
        engine: ServiceHost,
        clock: Callable[[], float] = time.time,
        time_scale: float = 1.0,
    ) -> None:
        self.engine = engine
        self.clock = clock
        #: the autoscaler's clock runs this much faster ([central] autoscale_time_scale)
        self.time_scale = time_scale
        #: (real time, autoscaler time) it last agreed on: a simulated report's (time_scale > 1)
        self._anchor = (0.0, 0.0)
        self._autoscaled: dict[str, _Autoscaled] = {}
        self._reconciled_at = self._timers_at = float("-inf")
        self._dirty = True  # the services themselves changed: reconcile them all
        #: service -> (rollout slots outdated, stalled), as the last plan said
        self.rollouts: dict[str, tuple[int, bool]] = {}

    # --- reading -------------------------------------------------------------------------

    def entries(self) -> Mapping[str, ServiceEntry]:
        fleet = self.engine.fleet
        return {} if fleet is None else fleet.services()

    def replica_ids(self, name: str) -> Iterator[str]:
        """The ids of every task of service ``name`` central placed (any phase), in order."""
        return (task_id for task_id, _ in self._replica_refs(name))

    def _replica_refs(self, name: str) -> Iterator[tuple[str, ReplicaRef]]:
        """:meth:`replica_ids`, each with what its id says."""
        prefix = f"{name}."
        assignments = self.engine.index.assignments
        for task_id in itertools.takewhile(
            lambda t: t.startswith(prefix), self.engine.index.task_ids.irange(minimum=prefix)
        ):
            ref = parse_replica_id(task_id)
            if ref is not None and ref.service == name and task_id in assignments:
                yield task_id, ref

    def replicas(self, name: str) -> list[Replica]:
        """Service ``name``'s replicas as the reconcile rule reads them."""
        engine = self.engine
        out = []
        for task_id, ref in self._replica_refs(name):
            entry = engine.index.assignments[task_id]
            life = engine.lifecycle_of(task_id, entry)
            out.append(
                Replica(
                    ref,
                    life.phase,
                    life.node,
                    life.started_at if life.phase is Phase.RUNNING else None,
                    stopping=entry.state is AssignmentState.CANCELLED,
                )
            )
        return out

    def view(self, name: str) -> dict[str, Any] | None:
        """A service as ``GET /v1/services/{name}`` shows it: its spec, why it has the count
        it has, each replica (slot, revision, phase, node) and the counts by phase."""
        entry = self.entries().get(name)
        if entry is None:
            return None
        spec = entry.service
        replicas = self.replicas(name)
        live = [r for r in replicas if r.live]
        phases: dict[str, int] = {}
        for r in live:
            phases[r.phase.value] = phases.get(r.phase.value, 0) + 1
        outdated, stalled = self.rollouts.get(name, (0, False))
        auto = self._autoscaled.get(name)
        load = self.engine.fleet.loads().get(name) if self.engine.fleet is not None else None
        return {
            "name": name,
            "spec": spec.to_json(),
            "revision": spec.revision,
            "replicas": spec.replicas,
            "running": sum(1 for r in live if r.phase is Phase.RUNNING),
            "live": len(live),
            "phases": phases,
            "reason": entry.reason,
            "at": entry.at,
            "deleted": entry.deleted,
            "rollout": {"outdated": outdated, "stalled": stalled},
            "load": None
            if load is None
            else {"cores": load.load, "at": load.at, "fresh": self._fresh(load) is not None},
            "forecast_peak": None if auto is None else auto.forecast,
            "tasks": [
                {
                    "id": r.task_id,
                    "slot": r.ref.slot,
                    "revision": r.ref.revision,
                    "phase": r.phase.value,
                    "node": r.node,
                    "stopping": r.stopping,
                }
                for r in replicas
            ],
        }

    # --- the API's calls ---------------------------------------------------------------------

    def apply(self, spec: ServiceSpec) -> ServiceEntry:
        """Create service ``spec.name`` or change it (template, count, rules): a new template
        is rolled out by :func:`plan`'s rollout rule."""
        entries = self.entries()
        current = entries.get(spec.name)
        if current is None and len(entries) >= MAX_SERVICES:
            raise ServiceRefused(422, "name", f"central holds at most {MAX_SERVICES} services")
        if current is not None and current.deleted:
            raise ServiceRefused(409, "name", f"service {spec.name} is being deleted")
        if current is None:
            why = f"manual: created with {spec.replicas} replicas"
        else:
            old = current.service
            changes = []
            if old.revision != spec.revision:
                changes.append(f"template {old.revision} -> {spec.revision}")
            if old.replicas != spec.replicas:
                changes.append(f"replicas {old.replicas} -> {spec.replicas}")
            why = "manual: " + ("; ".join(changes) or "rules changed")
        return self._write(spec, why, "service" if current is None else "service-changed")

    def scale(self, name: str, replicas: int) -> ServiceEntry:
        """Set service ``name``'s replica count (within its ``[min, max]``: refused outside)."""
        entry = self._entry(name)
        spec = entry.service
        if not spec.min <= replicas <= spec.max:
            raise ServiceRefused(
                422, "replicas", f"must be within [min, max] = [{spec.min}, {spec.max}]"
            )
        why = f"manual: {spec.replicas} -> {replicas} replicas"
        return self._write(spec.with_replicas(replicas), why, "scaled")

    def delete(self, name: str) -> ServiceEntry:
        """Stop every replica of service ``name``; the service is forgotten once none runs."""
        entry = self._entry(name)
        if entry.deleted:
            return entry
        deleted = replace(entry, deleted=True, at=self.clock(), reason="manual: deleted")
        self._fleet().put_service(name, deleted)
        self.engine.record_event("service-deleted", f"{name}: manual: deleted; its replicas stop")
        self._dirty = True
        return deleted

    def report_load(self, name: str, load: float, at: float | None = None) -> LoadReport:
        """The load service ``name`` serves now (cores): its autoscaler's signal, folded into
        its 5-minute bins (forecast on each closed bin) as it arrives. ``at``: when it was
        measured, on a simulated clock (read only with ``time_scale`` > 1: a demo replaying
        a day says which time of the day it is, which the forecast reads; the autoscaler's
        clock then follows it). Central's own time otherwise."""
        entry = self._entry(name)
        if at is not None and self.time_scale > 1:
            self._anchor = (self.clock(), at)
            for auto in self._autoscaled.values():
                if auto.decided_at > at:  # the simulated clock went back (a new day, replay)
                    auto.decided_at = float("-inf")
                    auto.state = ScaleState()
        report = LoadReport(load=float(load), at=self.auto_now())
        self._fleet().set_load(name, report)
        spec = entry.service
        if spec.autoscale is not None and not entry.deleted:
            self._observe(name, spec, report.load)
        return report

    def auto_now(self) -> float:
        """The autoscaler's clock: central's, or with ``time_scale`` > 1 a clock that many
        times faster, from the simulated time the last report gave (else from real time)."""
        if self.time_scale == 1:
            return self.clock()
        real, auto = self._anchor
        return auto + (self.clock() - real) * self.time_scale

    def _fresh(self, report: LoadReport | None) -> float | None:
        """The load of ``report`` if it is recent enough to act on (autoscaler time)."""
        if report is None or self.auto_now() - report.at > LOAD_FRESH_S:
            return None
        return report.load

    def _observe(self, name: str, spec: ServiceSpec, load: float) -> None:
        auto = self._auto(name)
        workload = spec.template.workload
        if auto.demand.observe(self.auto_now(), {workload: load}):
            forecaster = self.engine.forecaster_for()
            history = auto.demand.histories().get(workload)
            if history is None or len(history.values) < MIN_FORECAST_BINS:
                auto.forecast = None  # (too little history: the load alone decides)
            elif forecaster is not None:
                auto.forecast = peak_over_classes({workload: history}, forecaster)

    # --- the control step --------------------------------------------------------------------

    def step(self, now: float, mine: Callable[[str], bool] | None) -> None:
        """Reconcile the services this central acts on (``mine``: of its shards; None: all)
        that are due: those whose replicas changed since the last step, those with a timer
        running (a rollout's health wait, an autoscaling decision), and every one of them
        after a change to the services themselves and each :data:`FULL_PASS_S`.
        O(the services due x their replicas)."""
        touched = self.take_changes()
        entries = self.entries()
        if self._dirty or now - self._reconciled_at >= FULL_PASS_S:
            self._dirty = False
            self._reconciled_at = self._timers_at = now
            names = sorted(entries)
        else:
            due = {t.split(".", 1)[0] for t in touched}
            if now - self._timers_at >= RECONCILE_EVERY_S:
                self._timers_at = now
                due.update(n for n, (outdated, _) in self.rollouts.items() if outdated)
                auto_now = self.auto_now()
                due.update(
                    n
                    for n, auto in self._autoscaled.items()
                    if auto_now - auto.decided_at >= AUTOSCALE_EVERY_S
                )
            names = sorted(due & entries.keys())
        for name in names:
            entry = entries[name]
            if mine is not None and not mine(name):
                continue
            spec = entry.service
            if entry.deleted:
                spec = replace(spec, replicas=0, min=0)
            elif spec.autoscale is not None:
                spec = self._autoscale(name, spec)
            replicas = self.replicas(name)
            if entry.deleted and not any(r.live for r in replicas):
                self._fleet().drop_service(name)
                self._fleet().drop_load(name)
                self._autoscaled.pop(name, None)
                self.rollouts.pop(name, None)
                self.engine.record_event("service-deleted", f"{name}: its last replica stopped")
                continue
            todo = plan(spec, replicas, now, entry.incarnations)
            self._act(spec, replicas, todo, now)
            if todo.empty and spec.spread.across and not entry.deleted:
                self._rebalance(spec, replicas)
            if todo.start:
                used = 1 + max(incarnation for _, incarnation in todo.start)
                current = self.entries()[name]
                self._fleet().put_service(name, replace(current, incarnations=used))
        if names:
            # (what this step wrote has its services looked at again next step: a no-op plan,
            # unless a node's report arrived meanwhile, which must not be dropped with it)
            self.engine.sync_index()

    def take_changes(self) -> set[str]:
        """The replicas touched since the last call (the index's set, drained). A central
        replica that does not act drains it too, each step: it never grows."""
        index = self.engine.index
        touched, index.replicas_touched = index.replicas_touched, set()
        return touched

    def _act(self, spec: ServiceSpec, replicas: Sequence[Replica], todo: Plan, now: float) -> None:
        name = spec.name
        before = self.rollouts.get(name)
        self.rollouts[name] = (todo.outdated, todo.stalled)
        if todo.stalled and (before is None or not before[1]):
            self.engine.record_event(
                "rollout-stalled",
                f"{name}: {spec.rollout.max_failures} replicas of revision {spec.revision} "
                f"failed; {todo.outdated} slots keep the old revision",
            )
        if todo.empty:
            return
        fleet = self._fleet()
        with fleet.doc.transaction():
            for task_id, why in todo.stop:
                entry = self.engine.index.assignments.get(task_id)
                if entry is None or entry.state is AssignmentState.CANCELLED:
                    continue
                fleet.assign(task_id, replace(entry, state=AssignmentState.CANCELLED, at=now))
                self.engine.record_event("replica-stopped", f"{task_id}: {why}", task=task_id)
        specs = [spec.replica_spec(slot, incarnation) for slot, incarnation in todo.start]
        if not specs:
            return
        outdated = {r.ref.slot for r in replicas if r.live and r.ref.revision != spec.revision}
        for (slot, _), task in zip(todo.start, specs, strict=True):
            why = (
                f"rolling out revision {spec.revision} in slot {slot}"
                if slot in outdated
                else f"slot {slot} of {spec.replicas} has no replica"
            )
            self.engine.record_event("replica-started", f"{task.id}: {why}", task=task.id)
        with fleet.doc.transaction():  # (the stops are in the index first: the spread's
            self.engine.admit_replicas(specs)  # counts leave the stopped replicas out)

    def _rebalance(self, spec: ServiceSpec, replicas: Sequence[Replica]) -> None:
        """Even a settled service's spread out again, a replica at a time: the donor of
        :func:`rebalance_donor` migrated make-before-break to where the core puts it, if that
        is a domain holding fewer than the donor's would after the move."""
        key = spec.spread.across[0]
        domain_of, count = self.engine.domains(key)
        found = rebalance_donor(spec, replicas, domain_of, count)
        if found is None:
            return
        donor, held = found
        source = donor.node
        reason = f"rebalance: {key} {domain_of(source or '')} holds {held} of {spec.name}"
        target = self.engine.rebalance_replica(
            donor.task_id, reason, lambda node: self._fewer(node, domain_of, replicas, held)
        )
        if target is not None:
            self.engine.record_event(
                "migrated", f"{donor.task_id}: {source} -> {target} ({reason})",
                node=target, task=donor.task_id,
            )  # fmt: skip

    @staticmethod
    def _fewer(
        node: str,
        domain_of: Callable[[str], str | None],
        replicas: Sequence[Replica],
        held: int,
    ) -> bool:
        """Whether ``node``'s domain holds two or more fewer live replicas than ``held``."""
        domain = domain_of(node)
        there = sum(1 for r in replicas if r.live and r.node and domain_of(r.node) == domain)
        return domain is not None and there + 1 < held

    def groups_for(self, specs: Sequence[TaskSpec]) -> dict[str, SpreadGroup]:
        """task id -> its service's spread, for the replicas among ``specs`` (what the core
        places them with, whoever places them: a start, a waiting replica, a failover). A
        replica being placed is not counted where its assignment still points."""
        entries = self.entries()
        placing = {s.id for s in specs}
        by_service: dict[str, SpreadGroup] = {}
        out: dict[str, SpreadGroup] = {}
        for spec in specs:
            ref = parse_replica_id(spec.id)
            if ref is None or ref.service not in entries:
                continue
            group = by_service.get(ref.service)
            if group is None:
                service = entries[ref.service].service
                counts: dict[str, int] = {}
                for r in self.replicas(ref.service):
                    # (a finished one holds nothing; one being placed counts where it goes)
                    if r.node and not r.phase.final and r.task_id not in placing:
                        counts[r.node] = counts.get(r.node, 0) + 1
                group = SpreadGroup(
                    ref.service, service.spread.max_per_node, service.spread.across, counts
                )
                by_service[ref.service] = group
            out[spec.id] = group
        return out

    # --- autoscaling -------------------------------------------------------------------------

    def _auto(self, name: str) -> _Autoscaled:
        auto = self._autoscaled.get(name)
        if auto is None:
            auto = self._autoscaled[name] = _Autoscaled(ScaleState(), ClassDemand())
        return auto

    def _autoscale(self, name: str, spec: ServiceSpec) -> ServiceSpec:
        """Re-decide ``spec``'s count every :data:`AUTOSCALE_EVERY_S`; written when it
        changes, with its reason."""
        auto = self._auto(name)
        now = self.auto_now()
        if now - auto.decided_at < AUTOSCALE_EVERY_S:
            return spec
        auto.decided_at = now
        load = self._fresh(self._fleet().loads().get(name))
        rec = recommend(spec, load, auto.forecast if load is not None else None, auto.state, now)
        auto.state = rec.state
        if rec.replicas == spec.replicas:
            return spec
        scaled = spec.with_replicas(rec.replicas)
        why = f"{rec.reason.value}: {spec.replicas} -> {rec.replicas} replicas ({rec.why})"
        self._write(scaled, why, "scaled")
        return scaled

    # --- helpers -----------------------------------------------------------------------------

    def _write(self, spec: ServiceSpec, why: str, kind: str) -> ServiceEntry:
        current = self.entries().get(spec.name)
        entry = ServiceEntry(
            spec=spec.to_json(), at=self.clock(), central=self.engine.central_id,
            reason=why, incarnations=0 if current is None else current.incarnations,
        )  # fmt: skip
        self._fleet().put_service(spec.name, entry)
        self.engine.record_event(kind, f"{spec.name}: {why}")
        self._dirty = True  # reconcile at the next step
        return entry

    def _entry(self, name: str) -> ServiceEntry:
        entry = self.entries().get(name)
        if entry is None:
            raise ServiceRefused(404, "name", f"no service {name!r}")
        return entry

    def _fleet(self) -> PolicyDoc:
        fleet = self.engine.fleet
        if fleet is None:
            raise RuntimeError("central engine not started")
        return fleet
