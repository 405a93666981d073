"""Site autonomy against node-only autonomy: the campus split into sites whose WAN links get cut.

The campus fleet (:func:`edgesched.core.campus.campus_fleet`) is split into sites
(:func:`split_sites`: round-robin over the nodes sorted by id, so every site holds a mix of
server types). Each site's WAN link to central is cut now and then (:class:`Cut`), and during
some cuts member nodes of the cut site crash (:class:`Crash`). :func:`simulate_sites` runs the
same seeded scenario under two modes and measures what the cuts cost:

* ``node-only`` (today): while its site is cut, a node schedules for itself alone. It places
  the submissions made to it on itself (the core's :func:`~edgesched.core.scheduler.schedule`
  over a view of that one node) and a submission that does not fit waits on it. A crashed
  node's replicas and killed tasks have no owner but the node: they wait until it comes back
  (it restarts them itself) or until the WAN returns (central fails them over).
* ``site``: while its site is cut, the site's live nodes act as one. A coordinator runs the
  same :func:`~edgesched.core.scheduler.schedule` over the site's live nodes (with what runs
  on them): submissions made at any member go to the best node of the site, and a crashed
  member's replicas and killed tasks are placed again on the live members ``failover_s``
  after the crash. Submissions whose node is dead reach the coordinator over the site's LAN.

The model, explicitly:

* **Central.** While a site is reachable, central places every submission and replica over
  every live node of the reachable sites (the same ``schedule`` over that view) and fails a
  crashed node's work over ``failover_s`` after the crash. Central does nothing at all for a
  cut site's nodes: it cannot place there, it does not see their work end or fail, and the
  work waiting at central never goes to them. When the WAN returns, whatever the cut site was
  holding waiting (node queues, the coordinator's queue) moves to central, and central fails
  over the work of the site's still-dead nodes ``failover_s`` after the return.
* **Services.** Each :class:`SiteService` runs ``replicas`` restart-always replicas (slots),
  placed by central at ``t = 0`` and spread over sites and nodes (a
  :class:`~edgesched.core.spread.SpreadGroup` across ``site`` and ``node``). A replica
  occupies its cores until its node crashes; the slot is then *down* until placed again. A
  revived node restarts only the slots still its own (nobody failed them over), so a slot
  never runs twice.
* **Submissions.** Local batch tasks (:class:`Submission`) arrive at nodes, a seeded Poisson
  process per node with a rate proportional to its cores (:func:`draw_submissions`). A task
  needs its cores for its duration once started (the node's speed is ignored). It misses its
  SLO when it waits longer than ``slo_wait_s`` before its first start, or never starts. A task
  killed by a crash is lost and runs again from scratch when its owner places it again.
  Replicas outrank tasks (priority 90 against 50); nothing is preempted.
* **Faults.** Every site gets ``cuts_per_day`` cuts of ``cut_s`` a day (one uniformly placed in
  each of equal slices of the horizon, so a site's cuts never overlap); during each cut, with
  probability ``crash_p``, one or two members crash at a uniform time of the cut and stay
  down 15-90 minutes, possibly past the cut (:func:`draw_faults`).

The figures (:class:`Figures`), each split into *while cut* and *outside cuts*:

* ``replica_down_s``: replica-seconds below the services' desired counts. A slot lost in a
  crash is charged to the cut of the crashed node's site for the part of its downtime that
  falls inside that cut, the rest outside (a slot that never got a node from ``t = 0`` is
  charged outside).
* ``submissions`` / ``slo_misses`` / ``never_ran``: local submissions, by whether the site of
  the node they arrived at was cut at their arrival; those that missed their SLO; those that
  had not started by the horizon (included in the misses).
* ``killed`` / ``killed_cpu_s``: the *work lost*. Task runs cut short by a crash, and the
  CPU-seconds (cores x seconds run) they had done: that work is thrown away, the task
  starting again from scratch. Charged to *while cut* when the crashed node's site was cut.
  Which tasks a crash kills depends on where each mode placed them, so this figure measures
  the crashes, not the modes' recovery.
* ``rerun_wait_s``: the recovery of that lost work: seconds from each kill until the killed
  task started again (or until the horizon), summed over the killed tasks.

Pure: plain values in, plain values out; the only randomness is the seeded generators of
:func:`campus_site_scenario`, the only time the simulated one.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from edgesched.core.campus import campus_fleet
from edgesched.core.model import SECONDS_PER_DAY, DecisionKind, Node, Placement, Resources, Task
from edgesched.core.nodetable import NodeTable
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.scheduler import ClusterView, schedule
from edgesched.core.spread import SpreadGroup

__all__ = [
    "MODES",
    "Crash",
    "Cut",
    "Figures",
    "Run",
    "SiteReport",
    "SiteScenario",
    "SiteService",
    "Submission",
    "campus_site_scenario",
    "campus_site_services",
    "compare",
    "draw_faults",
    "draw_submissions",
    "simulate_sites",
    "split_sites",
]

MODES = ("node-only", "site")
#: Priorities of a replica and of a local task (replicas go first; nothing is preempted).
REPLICA_PRIORITY = 90
TASK_PRIORITY = 50
#: The workload name of the local submissions.
LOCAL = "local"
_EPS = 1e-9


# --- the scenario ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SiteService:
    """A service of ``replicas`` restart-always replicas of ``cpu`` cores each."""

    name: str
    replicas: int
    cpu: float
    mem_gib_per_cpu: float = 2.0
    max_per_node: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 0 or self.cpu <= 0:
            raise ValueError("a service needs replicas >= 0 and cpu > 0")

    def slots(self) -> tuple[str, ...]:
        return tuple(f"{self.name}/{k}" for k in range(self.replicas))


@dataclass(frozen=True, slots=True)
class Submission:
    """A local batch task submitted at ``node`` at ``at``: ``cpu`` cores for ``duration_s``."""

    id: str
    node: str
    at: float
    cpu: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class Cut:
    """``site``'s WAN link to central is down over ``[start, end)``."""

    site: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Crash:
    """``node`` is down over ``[at, back)``: what ran on it is lost at ``at``."""

    node: str
    at: float
    back: float


@dataclass(frozen=True, slots=True)
class SiteScenario:
    """Everything a run reads: the nodes (each with its ``site``), the services, the local
    submissions, the faults, the horizon, the SLO bound and the failover time."""

    nodes: tuple[Node, ...]
    services: tuple[SiteService, ...]
    submissions: tuple[Submission, ...]
    cuts: tuple[Cut, ...] = ()
    crashes: tuple[Crash, ...] = ()
    horizon_s: float = SECONDS_PER_DAY
    slo_wait_s: float = 60.0
    failover_s: float = 10.0

    def __post_init__(self) -> None:
        ids = [n.id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ValueError("node ids must be unique")
        known = set(ids)
        sites = {n.site for n in self.nodes}
        for sub in self.submissions:
            if sub.node not in known:
                raise ValueError(f"submission {sub.id} names an unknown node {sub.node}")
        for cut in self.cuts:
            if cut.site not in sites or not cut.start < cut.end:
                raise ValueError(f"bad cut {cut}")
        for crash in self.crashes:
            if crash.node not in known or not crash.at < crash.back:
                raise ValueError(f"bad crash {crash}")
        by_node: dict[str, list[Crash]] = {}
        for crash in self.crashes:
            by_node.setdefault(crash.node, []).append(crash)
        for crashes in by_node.values():
            crashes.sort(key=lambda c: c.at)
            for a, b in itertools.pairwise(crashes):
                if b.at < a.back:
                    raise ValueError(f"crashes of {a.node} overlap")
        if self.failover_s < 0 or self.slo_wait_s < 0 or self.horizon_s <= 0:
            raise ValueError("failover_s and slo_wait_s must be >= 0, horizon_s > 0")

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(sorted({n.site for n in self.nodes}))

    def without_faults(self) -> SiteScenario:
        return replace(self, cuts=(), crashes=())


def split_sites(nodes: Sequence[Node], n_sites: int = 3) -> tuple[Node, ...]:
    """``nodes`` sorted by id, node ``i`` in site ``site-{i % n_sites}``."""
    if n_sites < 1:
        raise ValueError("n_sites must be >= 1")
    ordered = sorted(nodes, key=lambda n: n.id)
    return tuple(replace(n, site=f"site-{i % n_sites}") for i, n in enumerate(ordered))


def campus_site_services(scale: float = 1.0) -> tuple[SiteService, ...]:
    """The campus's services in this model: 24 face-recognition replicas of 8 cores, 16
    conferencing replicas of 8 cores and 12 telemetry replicas of 4 cores at scale 1 (13% of
    the fleet's cores), counts scaled with the fleet."""

    def n(count: int) -> int:
        return max(1, math.floor(count * scale + 0.5))

    return (
        SiteService("face-recognition", n(24), 8.0),
        SiteService("video-conferencing", n(16), 8.0),
        SiteService("telemetry", n(12), 4.0),
    )


#: Cores of a local task and their weights; its duration's lognormal median and sigma.
TASK_CPU = (2.0, 4.0, 8.0)
TASK_CPU_WEIGHTS = (0.4, 0.4, 0.2)
TASK_MEDIAN_S = 900.0
TASK_SIGMA = 0.7


def draw_submissions(
    nodes: Sequence[Node], horizon_s: float, seed: int, utilization: float = 0.5
) -> tuple[Submission, ...]:
    """Seeded Poisson arrivals at each node over ``[0, horizon_s)``: rate such that the
    expected cores in use by a node's own submissions are ``utilization`` of its cores."""
    rng = np.random.default_rng([seed, 1])
    weights = np.asarray(TASK_CPU_WEIGHTS) / sum(TASK_CPU_WEIGHTS)
    mean_cpu = float(np.dot(TASK_CPU, weights))
    mean_s = TASK_MEDIAN_S * math.exp(TASK_SIGMA**2 / 2)
    out: list[Submission] = []
    for node in sorted(nodes, key=lambda n: n.id):
        rate = utilization * node.capacity.cpu / (mean_cpu * mean_s)
        count = int(rng.poisson(rate * horizon_s))
        times = np.sort(rng.random(count) * horizon_s)
        cpu = rng.choice(np.asarray(TASK_CPU), size=count, p=weights)
        dur = rng.lognormal(math.log(TASK_MEDIAN_S), TASK_SIGMA, size=count)
        for k, (t, c, d) in enumerate(zip(times.tolist(), cpu.tolist(), dur.tolist(), strict=True)):
            out.append(Submission(f"{node.id}#{k}", node.id, round(t, 3), c, round(d, 3)))
    out.sort(key=lambda s: (s.at, s.id))
    return tuple(out)


def draw_faults(
    nodes: Sequence[Node],
    horizon_s: float,
    seed: int,
    cuts_per_day: int = 2,
    cut_s: float = 3600.0,
    crash_p: float = 0.5,
) -> tuple[tuple[Cut, ...], tuple[Crash, ...]]:
    """Seeded WAN cuts of every site and crashes of cut sites' members (module docstring)."""
    rng = np.random.default_rng([seed, 2])
    sites = sorted({n.site for n in nodes})
    members = {s: sorted(n.id for n in nodes if n.site == s) for s in sites}
    n_cuts = max(1, round(cuts_per_day * horizon_s / SECONDS_PER_DAY))
    width = horizon_s / n_cuts
    if width < cut_s:
        raise ValueError("the cuts do not fit the horizon")
    cuts: list[Cut] = []
    crashes: list[Crash] = []
    for site in sites:
        for k in range(n_cuts):
            start = k * width + float(rng.random()) * (width - cut_s)
            cuts.append(Cut(site, round(start, 3), round(start + cut_s, 3)))
            if float(rng.random()) >= crash_p:
                continue
            many = min(len(members[site]), 1 + int(rng.random() < 0.3))
            for i in rng.choice(len(members[site]), size=many, replace=False).tolist():
                at = start + float(rng.random()) * cut_s * 0.9
                down = float(rng.uniform(15 * 60.0, 90 * 60.0))
                crashes.append(Crash(members[site][i], round(at, 3), round(at + down, 3)))
    return tuple(cuts), tuple(sorted(crashes, key=lambda c: (c.at, c.node)))


def campus_site_scenario(
    seed: int = 0,
    days: float = 1.0,
    scale: float = 1.0,
    *,
    n_sites: int = 3,
    utilization: float = 0.5,
    cuts_per_day: int = 2,
    crash_p: float = 0.5,
    slo_wait_s: float = 60.0,
    failover_s: float = 10.0,
) -> SiteScenario:
    """The campus fleet of ``scale`` in ``n_sites`` sites, its services, ``days`` of local
    submissions and of faults: a pure function of its arguments."""
    horizon = days * SECONDS_PER_DAY
    nodes = split_sites(campus_fleet(scale), n_sites)
    cuts, crashes = draw_faults(nodes, horizon, seed, cuts_per_day, crash_p=crash_p)
    return SiteScenario(
        nodes=nodes,
        services=campus_site_services(scale),
        submissions=draw_submissions(nodes, horizon, seed, utilization),
        cuts=cuts,
        crashes=crashes,
        horizon_s=horizon,
        slo_wait_s=slo_wait_s,
        failover_s=failover_s,
    )


# --- the report --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    """What one window (while cut, or outside cuts) cost: see the module docstring."""

    replica_down_s: float = 0.0
    submissions: int = 0
    slo_misses: int = 0
    never_ran: int = 0
    killed: int = 0
    killed_cpu_s: float = 0.0
    rerun_wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a task or a replica slot (``kind``) on ``node`` over ``[start, end)``, and
    how it ended: ``done``, ``killed`` (its node crashed) or ``horizon``."""

    key: str
    kind: str
    node: str
    start: float
    end: float
    how: str


@dataclass(frozen=True, slots=True)
class SiteReport:
    """One mode's run: the figures while cut and outside cuts, every run, each submission's
    wait before its first start (None: never started) and how many schedule cycles ran."""

    mode: str
    cut: Figures
    outside: Figures
    runs: tuple[Run, ...] = field(repr=False)
    waits: Mapping[str, float | None] = field(repr=False)
    cycles: int = 0

    @property
    def total(self) -> Figures:
        a, b = self.cut, self.outside
        return Figures(
            a.replica_down_s + b.replica_down_s,
            a.submissions + b.submissions,
            a.slo_misses + b.slo_misses,
            a.never_ran + b.never_ran,
            a.killed + b.killed,
            a.killed_cpu_s + b.killed_cpu_s,
            a.rerun_wait_s + b.rerun_wait_s,
        )


# --- the run -----------------------------------------------------------------------------------

# The order of events at one instant: work ends first, the WAN before crashes, arrivals last.
_FINISH, _CUT_END, _CUT_START, _BACK, _CRASH, _FAILOVER, _ARRIVE = range(7)


@dataclass(slots=True)
class _Live:
    key: str
    kind: str
    node: int
    start: float
    end: float | None = None
    how: str = ""


@dataclass(slots=True)
class _Counts:
    down_s: float = 0.0
    misses: int = 0
    never: int = 0
    subs: int = 0
    killed: int = 0
    killed_cpu_s: float = 0.0
    rerun_wait_s: float = 0.0

    def figures(self) -> Figures:
        return Figures(
            self.down_s,
            self.subs,
            self.misses,
            self.never,
            self.killed,
            self.killed_cpu_s,
            self.rerun_wait_s,
        )


def _overlap(a: float, b: float, windows: Iterable[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in windows)


def default_policy() -> PolicyConfig:
    """Priority mode without preemption: least-allocated spreading, every node awake."""
    return PolicyConfig(mode=PolicyMode.PRIORITY, preemption=False)


def simulate_sites(
    scenario: SiteScenario, mode: str, policy: PolicyConfig | None = None
) -> SiteReport:
    """Run ``scenario`` under ``mode`` (``node-only`` or ``site``): the module's model."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    policy = policy or default_policy()
    sc = scenario
    site_mode = mode == "site"
    nodes = tuple(sorted(sc.nodes, key=lambda n: n.id))  # the table's row order
    table = NodeTable.build(nodes, ())
    node_index = {n.id: i for i, n in enumerate(nodes)}
    sites = sc.sites
    site_index = {s: i for i, s in enumerate(sites)}
    site_of = [site_index[n.site] for n in nodes]
    members = [[i for i, s in enumerate(site_of) if s == k] for k in range(len(sites))]
    cut_windows = [[(c.start, c.end) for c in sc.cuts if c.site == s] for s in sites]

    # what may be placed: every submission and every replica slot, as tasks of the core
    tasks: dict[str, Task] = {}
    service_of: dict[str, SiteService] = {}
    for svc in sc.services:
        demand = Resources(cpu=svc.cpu, mem_gib=svc.cpu * svc.mem_gib_per_cpu)
        for slot in svc.slots():
            tasks[slot] = Task(slot, svc.name, REPLICA_PRIORITY, demand, 0.0, None)
            service_of[slot] = svc
    subs = [s for s in sc.submissions if s.at < sc.horizon_s]
    for sub in subs:
        demand = Resources(cpu=sub.cpu, mem_gib=2.0 * sub.cpu)
        tasks[sub.id] = Task(sub.id, LOCAL, TASK_PRIORITY, demand, sub.at, sub.duration_s)
    if len(tasks) != len(service_of) + len(subs):
        raise ValueError("submission ids must be unique and differ from replica slots")
    sub_by_id = {s.id: s for s in subs}

    events: list[tuple[float, int, int, int, int]] = []  # (t, kind, seq, index, epoch)
    seq = 0

    def push(t: float, kind: int, index: int, epoch: int = 0) -> None:
        nonlocal seq
        heapq.heappush(events, (t, kind, seq, index, epoch))
        seq += 1

    for c in sc.cuts:
        push(c.start, _CUT_START, site_index[c.site])
        push(c.end, _CUT_END, site_index[c.site])
    for k, crash in enumerate(sc.crashes):
        push(crash.at, _CRASH, node_index[crash.node], k)
        push(crash.back, _BACK, node_index[crash.node], k)
    for k, sub in enumerate(subs):
        push(sub.at, _ARRIVE, k)

    alive = [True] * len(nodes)
    cut = [False] * len(sites)
    crash_epoch = [-1] * len(nodes)
    runs: list[_Live] = []
    running: list[dict[str, int]] = [{} for _ in nodes]  # node -> key -> index in runs
    central: list[str] = list(tasks.keys() - sub_by_id.keys())
    central.sort()
    site_q: list[list[str]] = [[] for _ in sites]
    node_q: list[list[str]] = [[] for _ in nodes]
    orphans: list[list[str]] = [[] for _ in nodes]
    down_since: dict[str, tuple[float, int | None]] = {k: (0.0, None) for k in central}
    waits: dict[str, float | None] = {s.id: None for s in subs}
    in_cut: dict[str, bool] = {}
    counts = {True: _Counts(), False: _Counts()}  # keyed by "while cut"
    cycles = 0
    replicas_on: dict[str, dict[str, int]] = {svc.name: {} for svc in sc.services}
    killed_since: dict[str, tuple[float, bool]] = {}  # killed task -> (when, while cut)

    def charge_down(slot: str, until: float) -> None:
        since, site = down_since.pop(slot)
        total = until - since
        inside = 0.0 if site is None else _overlap(since, until, cut_windows[site])
        counts[True].down_s += inside
        counts[False].down_s += total - inside

    def dispatch(queue: list[str], rows: list[int], now: float) -> None:
        nonlocal cycles
        if not queue or not rows:
            return
        view = table if len(rows) == len(nodes) else table.subset(rows)
        placements = tuple(p for row in view.on_node for p in row)
        groups = {
            key: SpreadGroup(
                service_of[key].name,
                service_of[key].max_per_node,
                ("site", "node"),
                replicas_on[service_of[key].name],
            )
            for key in queue
            if key in service_of
        }
        pending = [tasks[k] for k in queue]
        result = schedule(
            ClusterView(view.nodes, placements, now, table=view), pending, policy, groups
        )
        cycles += 1
        done: set[str] = set()
        for d in result.decisions:
            if d.kind is not DecisionKind.PLACE or d.task_id is None:
                continue
            start(d.task_id, node_index[d.node_id], now)
            done.add(d.task_id)
        if done:
            queue[:] = [k for k in queue if k not in done]

    def start(key: str, node: int, now: float) -> None:
        if not alive[node]:
            raise AssertionError(f"{key} placed on dead node {nodes[node].id}")
        task = tasks[key]
        svc = service_of.get(key)
        runs.append(_Live(key, "task" if svc is None else "replica", node, now))
        running[node][key] = len(runs) - 1
        table.on_node[node] = [*table.on_node[node], Placement(task, nodes[node].id, now)]
        table.add(node, task.demand)
        table.usage[task.workload] = table.usage.get(task.workload, 0.0) + task.demand.cpu
        if svc is not None:
            per = replicas_on[svc.name]
            per[nodes[node].id] = per.get(nodes[node].id, 0) + 1
            charge_down(key, now)
        else:
            if waits[key] is None:
                waits[key] = now - sub_by_id[key].at
            killed_at = killed_since.pop(key, None)
            if killed_at is not None:
                counts[killed_at[1]].rerun_wait_s += now - killed_at[0]
            push(now + sub_by_id[key].duration_s, _FINISH, len(runs) - 1)

    def end(r: int, now: float, how: str) -> None:
        run = runs[r]
        run.end, run.how = now, how
        del running[run.node][run.key]
        task = tasks[run.key]
        table.on_node[run.node] = [p for p in table.on_node[run.node] if p.task.id != run.key]
        table.remove(run.node, task.demand)
        table.usage[task.workload] = max(table.usage[task.workload] - task.demand.cpu, 0.0)
        svc = service_of.get(run.key)
        if svc is not None:
            per = replicas_on[svc.name]
            node_id = nodes[run.node].id
            per[node_id] -= 1
            if per[node_id] <= 0:
                del per[node_id]

    def requeue(keys: list[str], node: int) -> set[str]:
        """Hand ``keys`` (work of ``node``) to whoever owns the node's work now; the owners
        to dispatch."""
        s = site_of[node]
        if cut[s]:
            if site_mode:
                site_q[s].extend(keys)
                return {f"s{s}"}
            node_q[node][:0] = keys
            return {f"n{node}"}
        central.extend(keys)
        return {"c"}

    def owner(node: int) -> str:
        s = site_of[node]
        if cut[s]:
            return f"s{s}" if site_mode else f"n{node}"
        return "c"

    dirty: set[str] = {"c"}
    now = 0.0
    while True:
        for tag in sorted(dirty):
            if tag == "c":
                reach = [i for i in range(len(nodes)) if alive[i] and not cut[site_of[i]]]
                dispatch(central, reach, now)
            elif tag[0] == "s":
                s = int(tag[1:])
                if cut[s]:
                    dispatch(site_q[s], [i for i in members[s] if alive[i]], now)
            else:
                i = int(tag[1:])
                if alive[i] and cut[site_of[i]]:
                    dispatch(node_q[i], [i], now)
        dirty = set()
        if not events or events[0][0] >= sc.horizon_s:
            break
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, index, epoch = heapq.heappop(events)
            if kind == _FINISH:
                run = runs[index]
                if run.end is not None:
                    continue  # killed before
                end(index, now, "done")
                dirty.add(owner(run.node))
            elif kind == _ARRIVE:
                sub = subs[index]
                i = node_index[sub.node]
                s = site_of[i]
                in_cut[sub.id] = cut[s]
                if not cut[s]:
                    central.append(sub.id)
                    dirty.add("c")
                elif site_mode:
                    site_q[s].append(sub.id)
                    dirty.add(f"s{s}")
                else:
                    node_q[i].append(sub.id)
                    dirty.add(f"n{i}")
            elif kind == _CUT_START:
                cut[index] = True
            elif kind == _CUT_END:
                cut[index] = False
                central.extend(site_q[index])
                site_q[index].clear()
                for i in members[index]:
                    central.extend(node_q[i])
                    node_q[i].clear()
                    if not alive[i] and orphans[i]:
                        push(now + sc.failover_s, _FAILOVER, i, crash_epoch[i])
                dirty.add("c")
            elif kind == _CRASH:
                alive[index] = False
                crash_epoch[index] = epoch
                was_cut = cut[site_of[index]]
                lost: list[str] = []
                for key, r in sorted(running[index].items()):
                    end(r, now, "killed")
                    lost.append(key)
                    if key in service_of:
                        down_since[key] = (now, site_of[index])
                    else:
                        killed_since[key] = (now, was_cut)
                        counts[was_cut].killed += 1
                        cpu = tasks[key].demand.cpu
                        counts[was_cut].killed_cpu_s += cpu * (now - runs[r].start)
                orphans[index].extend(lost)
                push(now + sc.failover_s, _FAILOVER, index, epoch)
                dirty.add(owner(index))
            elif kind == _BACK:
                alive[index] = True
                if orphans[index]:
                    dirty |= requeue(orphans[index], index)
                    orphans[index] = []
                dirty.add(owner(index))
            elif kind == _FAILOVER:
                if alive[index] or crash_epoch[index] != epoch or not orphans[index]:
                    continue
                if cut[site_of[index]] and not site_mode:
                    continue  # node-only: nobody but the node owns its work while cut
                dirty |= requeue(orphans[index], index)
                orphans[index] = []

    end_t = sc.horizon_s
    for r, run in enumerate(runs):
        if run.end is None:
            end(r, end_t, "horizon")
    for slot in sorted(down_since):
        charge_down(slot, end_t)
    for when, was_cut in killed_since.values():
        counts[was_cut].rerun_wait_s += end_t - when
    for sub in subs:
        tally = counts[in_cut.get(sub.id, False)]
        tally.subs += 1
        w = waits[sub.id]
        if w is None:
            tally.never += 1
            tally.misses += 1
        elif w > sc.slo_wait_s + _EPS:
            tally.misses += 1
    out_runs = tuple(
        Run(
            run.key,
            run.kind,
            nodes[run.node].id,
            run.start,
            end_t if run.end is None else run.end,
            run.how,
        )
        for run in runs
    )
    return SiteReport(
        mode, counts[True].figures(), counts[False].figures(), out_runs, waits, cycles
    )


def compare(scenario: SiteScenario, policy: PolicyConfig | None = None) -> dict[str, SiteReport]:
    """Both modes over ``scenario``, ``node-only`` first."""
    return {mode: simulate_sites(scenario, mode, policy) for mode in MODES}
