"""Field-test scenarios: which faults, when, against which hosts; generated from a seed.

A scenario turns a seeded ``random.Random`` and the node ids into a schedule of
:class:`Fault`\\ s (times are seconds after the workload starts). The same seed gives the same
schedule, so a failing run is replayed exactly with ``--seed``. Every schedule ends healed;
the runner heals everything again anyway before the quiet period.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ACTIONS = frozenset(
    {
        "isolate", "heal", "drop-in", "drop-out", "kill", "restart", "stop", "cont",
        "broker-restart", "reset", "throttle",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the workload starts
    action: str  # one of ACTIONS
    target: str  # a node id, "central" (its host: central and the broker) or "broker"

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}")

    def to_json(self) -> dict[str, object]:
        return {"at": round(self.at, 3), "action": self.action, "target": self.target}


Schedule = Callable[[random.Random, Sequence[str]], list[Fault]]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float  # how long the workload runs (faults fall inside it)
    schedule: Schedule
    soak: bool = False  # long: only with --soak
    broker_persistence: bool = False  # the broker keeps its sessions across a restart


def _isolate_node(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    node = rng.choice(list(nodes))
    start = rng.uniform(2.0, 4.0)
    return [Fault(start, "isolate", node), Fault(start + rng.uniform(6.0, 10.0), "heal", node)]


def _isolate_central(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    start = rng.uniform(2.0, 4.0)
    end = start + rng.uniform(6.0, 9.0)
    return [Fault(start, "isolate", "central"), Fault(end, "heal", "central")]


def _flapping(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    node = rng.choice(list(nodes))
    faults, t = [], 2.0
    for _ in range(4):  # cuts shorter and longer than the 2 s keepalive
        down = rng.choice([rng.uniform(0.5, 1.5), rng.uniform(3.0, 5.0)])
        faults += [Fault(t, "isolate", node), Fault(t + down, "heal", node)]
        t += down + rng.uniform(1.0, 2.0)
    return faults  # the last heal by 2 + 4 * (5 + 2) = 30 s


def _one_way(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    node = rng.choice(list(nodes))
    first, second = rng.sample(["drop-in", "drop-out"], 2)
    return [
        Fault(2.0, first, node),
        Fault(8.0, "heal", node),
        Fault(10.0, second, node),
        Fault(16.0, "heal", node),
    ]


def _kill_while_cut(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    node = rng.choice(list(nodes))
    return [
        Fault(2.0, "isolate", node),
        Fault(5.0, "kill", node),  # power loss while cut off
        Fault(7.0, "restart", node),  # reboot while still offline
        Fault(12.0, "heal", node),
    ]


def _stop_cont(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    node = rng.choice(list(nodes))
    start = rng.uniform(2.0, 4.0)
    return [Fault(start, "stop", node), Fault(start + rng.uniform(4.0, 7.0), "cont", node)]


def _broker_restart(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    return [Fault(rng.uniform(3.0, 6.0), "broker-restart", "broker")]


def _tcp_reset(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    node = rng.choice(list(nodes))
    start = rng.uniform(2.0, 4.0)
    return [Fault(start, "reset", node), Fault(start + rng.uniform(3.0, 6.0), "heal", node)]


def _throttle(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    node = rng.choice(list(nodes))
    start = rng.uniform(2.0, 3.0)
    return [Fault(start, "throttle", node), Fault(start + rng.uniform(6.0, 9.0), "heal", node)]


def _soak(rng: random.Random, nodes: Sequence[str]) -> list[Fault]:
    """An hour with a partition every few minutes, of every kind, at random."""
    faults: list[Fault] = []
    t = 30.0
    kinds = [_isolate_node, _isolate_central, _flapping, _one_way, _kill_while_cut, _stop_cont,
             _tcp_reset, _throttle]  # fmt: skip
    while t < 3500.0:
        for fault in rng.choice(kinds)(rng, nodes):
            faults.append(Fault(t + fault.at, fault.action, fault.target))
        t = faults[-1].at + rng.uniform(60.0, 240.0)
    return faults


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("isolate-node", "one node's link goes down for 6-10 s", 16.0, _isolate_node),
        Scenario(
            "isolate-central", "central and its broker cut from every node", 14.0, _isolate_central
        ),
        Scenario("flapping", "a node's link flaps 4 times around the keepalive", 31.0, _flapping),
        Scenario("one-way", "a half-open link: inbound, then outbound dropped", 18.0, _one_way),
        Scenario("kill-while-cut", "power loss and reboot while cut off", 14.0, _kill_while_cut),
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
        Scenario("soak", "an hour of partitions every few minutes", 3600.0, _soak, soak=True),
    )
}

#: The short matrix CI runs.
QUICK = (
    "isolate-node", "isolate-central", "flapping", "one-way", "kill-while-cut", "tcp-reset",
    "throttle", "broker-restart-persistent",
)  # fmt: skip


def schedule_for(name: str, seed: int, nodes: Sequence[str]) -> list[Fault]:
    scenario = SCENARIOS[name]
    return sorted(scenario.schedule(random.Random(seed), nodes), key=lambda f: f.at)
