"""Field-test scenarios: which faults, when, against which hosts; generated from a seed.

A scenario turns a seeded ``random.Random`` and the :class:`Topology` (node ids, site ids)
into a schedule of :class:`Fault`\\ s (times are seconds after the workload starts). The same
seed and topology give the same schedule, so a failing run is replayed exactly with ``--seed``.
Every schedule ends healed; the runner heals everything again anyway before the quiet period.

Targets: a node id, ``central`` (central's host: central and its broker), ``broker``
(central's broker alone) or a site id (``site-1``: the site broker's WAN link). Two actions are
not faults but work: ``burst`` (``arg`` submissions to one node at once) and ``services`` (a
restart-always service submitted at central pinned to each member of a site, so a member lost
later has one).

``site-split`` needs a precise meaning with one central broker: every message between two
sites goes through central's broker, so sites can only be split from each other by cutting
some of them from central. The sites are split in two halves A and B, and for the whole fault
no message passes between A and B while central changes sides: first B's WAN links are cut
(central with A), then A's too (every site alone), then B's heal (central with B), then A's.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from edgesched.fieldtest.workload import STEADY, Pace

ACTIONS = frozenset(
    {
        "isolate", "heal", "drop-in", "drop-out", "kill", "restart", "stop", "cont",
        "broker-restart", "reset", "throttle", "wan-cut", "latency", "reboot", "skew",
        "burst", "services",
    }
)  # fmt: skip
#: Actions that leave their target cut off from central until a heal (or cont, or restart).
BREAKS = frozenset({"isolate", "drop-in", "drop-out", "stop", "kill", "reset", "wan-cut",
                    "reboot", "latency"})  # fmt: skip
#: Actions that end a break; a heal and a cont are timed until the target converges.
MENDS = frozenset({"heal", "cont", "restart"})


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the workload starts
    action: str  # one of ACTIONS
    target: str  # a node id, "central", "broker" or a site id
    #: latency: seconds each way; skew: the clock's offset in seconds; burst: how many tasks
    arg: float | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}")

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"at": round(self.at, 3), "action": self.action,
                                  "target": self.target}  # fmt: skip
        if self.arg is not None:
            out["arg"] = round(self.arg, 3)
        return out


@dataclass(frozen=True)
class Topology:
    """The hosts a schedule may name: edge nodes, and the sites they are spread over (none:
    every node on central's broker). Node ``i`` belongs to site ``i mod len(sites)``."""

    nodes: tuple[str, ...]
    sites: tuple[str, ...] = ()

    @classmethod
    def of(cls, nodes: int, sites: int = 0) -> Topology:
        return cls(tuple(f"gw-{i}" for i in range(1, nodes + 1)),
                   tuple(f"site-{i}" for i in range(1, sites + 1)))  # fmt: skip

    def site_of(self, node: str) -> str | None:
        if not self.sites:
            return None
        return self.sites[self.nodes.index(node) % len(self.sites)]

    def members(self, site: str) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if self.site_of(n) == site)


Schedule = Callable[[random.Random, Topology], list[Fault]]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float  # how long the workload runs (faults fall inside it)
    schedule: Schedule
    soak: bool = False  # long: only with --soak
    broker_persistence: bool = False  # the broker keeps its sessions across a restart
    sites: int = 0  # sites with bridged brokers it needs (0: every node on central's broker)
    proxy_links: bool = False  # every node's link through a fault proxy, even in namespaces
    #: when the tidal window opens, in seconds after the workload starts (None: mid-run)
    tidal_at: float | None = None
    pace: Pace = field(default_factory=Pace)  # how fast the workload submits
    #: The members of each site list each other as ``site_peers`` (edgesched.edge.site):
    #: while cut off from central they elect a coordinator and schedule as one.
    site_autonomy: bool = False
    min_nodes: int = 1  # the fewest nodes it runs with (more if asked)


def _isolate_node(rng: random.Random, topo: Topology) -> list[Fault]:
    node = rng.choice(topo.nodes)
    start = rng.uniform(2.0, 4.0)
    return [Fault(start, "isolate", node), Fault(start + rng.uniform(6.0, 10.0), "heal", node)]


def _isolate_central(rng: random.Random, topo: Topology) -> list[Fault]:
    start = rng.uniform(2.0, 4.0)
    end = start + rng.uniform(6.0, 9.0)
    return [Fault(start, "isolate", "central"), Fault(end, "heal", "central")]


def _flapping(rng: random.Random, topo: Topology) -> list[Fault]:
    node = rng.choice(topo.nodes)
    faults, t = [], 2.0
    for _ in range(4):  # cuts shorter and longer than the 2 s keepalive
        down = rng.choice([rng.uniform(0.5, 1.5), rng.uniform(3.0, 5.0)])
        faults += [Fault(t, "isolate", node), Fault(t + down, "heal", node)]
        t += down + rng.uniform(1.0, 2.0)
    return faults  # the last heal by 2 + 4 * (5 + 2) = 30 s


def _one_way(rng: random.Random, topo: Topology) -> list[Fault]:
    node = rng.choice(topo.nodes)
    first, second = rng.sample(["drop-in", "drop-out"], 2)
    return [
        Fault(2.0, first, node),
        Fault(8.0, "heal", node),
        Fault(10.0, second, node),
        Fault(16.0, "heal", node),
    ]


def _kill_while_cut(rng: random.Random, topo: Topology) -> list[Fault]:
    node = rng.choice(topo.nodes)
    return [
        Fault(2.0, "isolate", node),
        Fault(5.0, "kill", node),  # power loss while cut off
        Fault(7.0, "restart", node),  # reboot while still offline
        Fault(12.0, "heal", node),
    ]


def _stop_cont(rng: random.Random, topo: Topology) -> list[Fault]:
    node = rng.choice(topo.nodes)
    start = rng.uniform(2.0, 4.0)
    return [Fault(start, "stop", node), Fault(start + rng.uniform(4.0, 7.0), "cont", node)]


def _broker_restart(rng: random.Random, topo: Topology) -> list[Fault]:
    return [Fault(rng.uniform(3.0, 6.0), "broker-restart", "broker")]


def _tcp_reset(rng: random.Random, topo: Topology) -> list[Fault]:
    node = rng.choice(topo.nodes)
    start = rng.uniform(2.0, 4.0)
    return [Fault(start, "reset", node), Fault(start + rng.uniform(3.0, 6.0), "heal", node)]


def _throttle(rng: random.Random, topo: Topology) -> list[Fault]:
    node = rng.choice(topo.nodes)
    start = rng.uniform(2.0, 3.0)
    return [Fault(start, "throttle", node), Fault(start + rng.uniform(6.0, 9.0), "heal", node)]


def _wan_cut(rng: random.Random, topo: Topology) -> list[Fault]:
    """One site's WAN link cut: its broker stays up, its nodes keep talking to it."""
    site = rng.choice(topo.sites)
    start = rng.uniform(2.0, 4.0)
    return [Fault(start, "wan-cut", site), Fault(start + rng.uniform(6.0, 10.0), "heal", site)]


def _site_split(rng: random.Random, topo: Topology) -> list[Fault]:
    """The sites split in two halves; central first with A, then alone, then with B (see the
    module's docstring). With two sites: one site each."""
    sites = list(topo.sites)
    rng.shuffle(sites)
    half = max(1, len(sites) // 2)
    a, b = sites[:half], sites[half:] or sites[:half]
    t1 = rng.uniform(2.0, 3.0)
    t2 = t1 + rng.uniform(3.0, 5.0)
    t3 = t2 + rng.uniform(2.0, 4.0)
    t4 = t3 + rng.uniform(3.0, 5.0)
    return [
        *(Fault(t1, "wan-cut", s) for s in b),
        *(Fault(t2, "wan-cut", s) for s in a if s not in b),
        *(Fault(t3, "heal", s) for s in b),
        *(Fault(t4, "heal", s) for s in a if s not in b),
    ]


def _latency(rng: random.Random, topo: Topology) -> list[Fault]:
    """A node's link slowed: first below the keepalive (0.1-0.3 s each way, jitter up to as
    much again), then above it (2-3 s each way: every keepalive round trip fails)."""
    node = rng.choice(topo.nodes)
    return [
        Fault(2.0, "latency", node, rng.uniform(0.1, 0.3)),
        Fault(rng.uniform(7.0, 8.0), "heal", node),
        Fault(10.0, "latency", node, rng.uniform(2.0, 3.0)),
        Fault(rng.uniform(15.0, 16.0), "heal", node),
    ]


def _reboot_while_cut(rng: random.Random, topo: Topology) -> list[Fault]:
    """Power loss while cut off (the engine and every task process it started die at once),
    then a boot while still offline: its workloads must come back without central."""
    node = rng.choice(topo.nodes)
    return [
        Fault(2.0, "isolate", node),
        Fault(rng.uniform(4.0, 5.0), "reboot", node),
        Fault(6.0, "restart", node),
        Fault(rng.uniform(12.0, 13.0), "heal", node),
    ]


def _clock_skew(rng: random.Random, topo: Topology) -> list[Fault]:
    """A node boots while cut off with its clock minutes ahead or behind (a board without a
    real-time clock): it crosses the tidal window's boundary at another time than the fleet.
    The skew stays after the heal (nothing steps it back)."""
    node = rng.choice(topo.nodes)
    skew = rng.choice([-1.0, 1.0]) * rng.uniform(120.0, 600.0)
    return [
        Fault(2.0, "isolate", node),
        Fault(3.0, "skew", node, skew),
        Fault(3.5, "reboot", node),
        Fault(4.5, "restart", node),
        Fault(rng.uniform(13.0, 15.0), "heal", node),
    ]


def _site_of_three(topo: Topology) -> tuple[str, tuple[str, ...]]:
    """The first site with three members or more (a majority survives one member lost)."""
    for site in topo.sites:
        members = topo.members(site)
        if len(members) >= 3:
            return site, members
    raise ValueError("site autonomy scenarios need a site of three members (see min_nodes)")


def _site_member_lost(rng: random.Random, topo: Topology) -> list[Fault]:
    """A site's WAN cut, then one of its members (not the coordinator, the smallest id) loses
    power: its service replicas must run on a site peer within the site's failover time,
    while the site is still cut. It boots again while still cut, with its own copies: the
    site settles them (one copy each), then the WAN heals. (Booted after the heal, central's
    queued work would fill it before its own tasks are back.)"""
    site, members = _site_of_three(topo)
    victim = rng.choice(members[1:])
    lost = rng.uniform(4.0, 5.0)
    boot = lost + rng.uniform(7.0, 8.0)
    return [Fault(0.2, "services", site), Fault(2.0, "wan-cut", site),
            Fault(lost, "reboot", victim), Fault(boot, "restart", victim),
            Fault(boot + rng.uniform(3.0, 4.0), "heal", site)]  # fmt: skip


def _site_burst(rng: random.Random, topo: Topology) -> list[Fault]:
    """A site's WAN cut, then a burst of submissions to one member, more than it has room for:
    its coordinator places what the member cannot on its peers."""
    site, members = _site_of_three(topo)
    node = rng.choice(members)
    start = rng.uniform(4.0, 5.0)
    return [Fault(2.0, "wan-cut", site), Fault(start, "burst", node, float(rng.randint(6, 8))),
            Fault(start + rng.uniform(9.0, 11.0), "heal", site)]  # fmt: skip


def _split_in_site(rng: random.Random, topo: Topology) -> list[Fault]:
    """A site's WAN cut, then one member cut from its site broker too (a split inside the
    site): the majority keeps (or elects) a coordinator, the member alone schedules alone."""
    site, members = _site_of_three(topo)
    node = rng.choice(members)
    start = rng.uniform(4.0, 5.0)
    back = start + rng.uniform(6.0, 8.0)
    return [Fault(0.2, "services", site), Fault(2.0, "wan-cut", site),
            Fault(start, "isolate", node),
            Fault(back, "heal", node),
            Fault(back + rng.uniform(2.0, 3.0), "heal", site)]  # fmt: skip


def _coordinator_killed(rng: random.Random, topo: Topology) -> list[Fault]:
    """A site's WAN cut, then its coordinator (the smallest id) loses power: the others elect
    the next at a higher epoch and restart its replicas; it boots again while still cut."""
    site, members = _site_of_three(topo)
    lost = rng.uniform(4.0, 5.0)
    boot = lost + rng.uniform(8.0, 9.0)
    return [Fault(0.2, "services", site), Fault(2.0, "wan-cut", site),
            Fault(lost, "reboot", members[0]),
            Fault(boot, "restart", members[0]),
            Fault(boot + rng.uniform(3.0, 4.0), "heal", site)]  # fmt: skip


def _site_failover_race(rng: random.Random, topo: Topology) -> list[Fault]:
    """A site's WAN cut long past central's failover time, a member lost: the site restarts
    its replicas inside the site while central fails them over outside it; after the heal one
    copy of each is kept, the same on every peer (central's: it ranks first at one epoch)."""
    site, members = _site_of_three(topo)
    victim = rng.choice(members[1:])
    heal = rng.uniform(17.0, 19.0)  # central fails over ~12 s into the cut (the bridge's
    # will after 7.5 s, then its 4 s grace)
    # the lost member boots 2 s before the heal, still cut (after central, not before its
    # queued work, reaches it): three copies of its replicas meet at the heal
    return [Fault(0.2, "services", site), Fault(2.0, "wan-cut", site),
            Fault(3.0, "reboot", victim), Fault(heal - 2.0, "restart", victim),
            Fault(heal, "heal", site)]  # fmt: skip


def soak_schedule(duration_s: float) -> Schedule:
    """Partitions of every kind at random for ``duration_s``: one every one to four minutes
    over an hour, the gaps shrunk in proportion for a shorter soak (5 to 20 s in 5 minutes)."""

    def schedule(rng: random.Random, topo: Topology) -> list[Fault]:
        kinds: list[Schedule] = [_isolate_node, _isolate_central, _flapping, _one_way,
                                 _kill_while_cut, _stop_cont, _tcp_reset, _throttle, _latency,
                                 _reboot_while_cut, _clock_skew]  # fmt: skip
        if topo.sites:
            kinds += [_wan_cut, _site_split]
        scale = min(1.0, duration_s / 3600.0)
        faults: list[Fault] = []
        t = 30.0 * scale
        while t < duration_s - 45.0:
            for fault in rng.choice(kinds)(rng, topo):
                faults.append(Fault(t + fault.at, fault.action, fault.target, fault.arg))
            t = max(f.at for f in faults) + rng.uniform(60.0, 240.0) * scale
        return faults

    return schedule


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("isolate-node", "one node's link goes down for 6-10 s", 16.0, _isolate_node),
        Scenario(
            "isolate-central", "central and its broker cut from every node", 14.0, _isolate_central
        ),
        Scenario("flapping", "a node's link flaps 4 times around the keepalive", 31.0, _flapping),
        Scenario("one-way", "a half-open link: inbound, then outbound dropped", 18.0, _one_way),
        Scenario(
            "kill-while-cut",
            "the engine SIGKILLed while cut off, restarted still cut (its tasks live on)",
            14.0,
            _kill_while_cut,
        ),
        Scenario(
            "reboot-while-cut",
            "power loss while cut off (engine and tasks die), boot still offline",
            15.0,
            _reboot_while_cut,
        ),
        Scenario("stop-cont", "a node frozen (SIGSTOP) then thawed", 12.0, _stop_cont),
        Scenario("broker-restart", "the broker restarts (no persistence)", 10.0, _broker_restart),
        Scenario(
            "broker-restart-persistent",
            "the broker restarts, keeping its sessions on disk",
            10.0,
            _broker_restart,
            broker_persistence=True,
        ),
        Scenario("tcp-reset", "a node's TCP connections answered by resets", 12.0, _tcp_reset),
        Scenario("throttle", "a node's link throttled to 64 kbit/s", 14.0, _throttle),
        Scenario(
            "latency",
            "a node's link delayed with jitter, below then above the keepalive",
            17.0,
            _latency,
            proxy_links=True,
        ),
        Scenario(
            "clock-skew",
            "a node boots while cut off with its clock minutes off, across a tidal boundary",
            16.0,
            _clock_skew,
            tidal_at=8.0,
        ),
        Scenario(
            "wan-cut",
            "one site's WAN link cut; its broker and nodes carry on (2 bridged sites)",
            16.0,
            _wan_cut,
            sites=2,
        ),
        Scenario(
            "site-split",
            "sites split from each other while central changes sides (2 bridged sites)",
            20.0,
            _site_split,
            sites=2,
        ),
        Scenario(
            "site-member-lost",
            "a site's WAN cut, a member loses power: its replicas restart on a peer while cut",
            20.0,
            _site_member_lost,
            sites=1,
            site_autonomy=True,
            min_nodes=3,
        ),
        Scenario(
            "site-burst",
            "a site's WAN cut, a burst beyond one member's room: placed on its site peers",
            16.0,
            _site_burst,
            sites=1,
            site_autonomy=True,
            min_nodes=3,
        ),
        Scenario(
            "split-in-site",
            "a site's WAN cut, then one member cut from its site broker too",
            17.0,
            _split_in_site,
            sites=1,
            site_autonomy=True,
            min_nodes=3,
        ),
        Scenario(
            "coordinator-killed",
            "a site's WAN cut, its coordinator loses power and boots again while cut",
            19.0,
            _coordinator_killed,
            sites=1,
            site_autonomy=True,
            min_nodes=3,
        ),
        Scenario(
            "site-failover-race",
            "a site's WAN cut past central's failover, a member lost: site and central both "
            "fail over (2 sites, 5 nodes)",
            22.0,
            _site_failover_race,
            sites=2,
            site_autonomy=True,
            min_nodes=5,
        ),
        Scenario(
            "soak",
            "an hour of partitions of every kind every few minutes (2 bridged sites)",
            3600.0,
            soak_schedule(3600.0),
            soak=True,
            sites=2,
            proxy_links=True,
            pace=STEADY,
        ),
    )
}

#: The short matrix CI runs.
QUICK = (
    "isolate-node", "isolate-central", "flapping", "one-way", "kill-while-cut", "tcp-reset",
    "throttle", "broker-restart-persistent", "wan-cut", "reboot-while-cut",
    "site-member-lost", "site-burst", "split-in-site", "coordinator-killed", "site-failover-race",
)  # fmt: skip


def schedule_for(
    name: str, seed: int, topo: Topology, duration_s: float | None = None
) -> list[Fault]:
    """The scenario's faults for ``seed`` over ``topo`` (``duration_s``: a soak's length)."""
    scenario = SCENARIOS[name]
    schedule = scenario.schedule
    if scenario.soak and duration_s is not None:
        schedule = soak_schedule(duration_s)
    return sorted(schedule(random.Random(seed), topo), key=lambda f: f.at)
