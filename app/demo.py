"""``edgesched demo``: a real fleet on this machine running a campus day at accelerated time.

Everything is a separate process in one work directory:

* a broker (:func:`edgesched.localbroker.start_local_broker`: Mosquitto when installed, else
  the embedded amqtt broker, which speaks MQTT 3.1.1, so every peer is told to);
* central (``edgesched central run``) with a short failover grace and a fast heartbeat;
* edge nodes (``edgesched edge run``), each registering as a different simulated server
  through ``[edge] hal_root`` (:mod:`edgesched.edge.fakehw`: a 48-core ARM general node, an
  x86 AI node with 4 GPUs, an x86 storage node with 6 NVMe disks, a small ARM node, ...)
  and reporting that server's load and power as telemetry (``[edge] telemetry_source =
  "reserved"``: what its tasks reserve, not this machine's CPU). Their tasks are real
  ``sleep`` processes on this machine;
* with Mosquitto and four nodes or more, a **site** (``site-1``): three of the nodes (the last
  three but the AI node, which stays with central) on a site broker of their own, a second
  Mosquitto bridged to central's (:func:`edgesched.fieldtest.brokers.broker_config`) through
  a :class:`~edgesched.fieldtest.faultproxy.FaultProxy` that runs in the demo's own event
  loop and plays the site's WAN link; each member lists the other two as ``site_peers``
  (:mod:`edgesched.edge.site`). Without Mosquitto (the embedded amqtt broker has no bridge)
  or with fewer nodes, one node (the storage node) reaches the broker through the proxy
  instead, as before sites.

A workload driver replays a scaled-down campus day (:mod:`edgesched.core.campus`: its classes,
priorities, tidal hours and durations) on a simulated clock ``speed`` times faster than real
time: cloud desktops, AI training and video analytics are submitted at central, which places
them; face recognition and video conferencing are submitted at a node's own API, and the node
decides. Each node also runs a gate service (restart ``always``) submitted at central; the
storage node's is pinned to it. In the evening the fleet switches to energy mode.

Mid-morning the proxy blackholes the WAN for an hour (simulated) while the driver keeps
submitting to the nodes behind it:

* **a site**: its members lose central's heartbeat and elect a coordinator (the smallest id,
  :mod:`edgesched.core.site`); then the storage node loses power (SIGKILL of its engine and of
  its task processes; it stays down for the rest of the run, and local submissions meant for
  it go to a live member instead), and the coordinator restarts its gate service on a peer
  after the site's failover time (``site_failover_s``), while still cut off: that copy's
  ``decided_by`` is ``site:<coordinator>``. Central's failover grace is set longer than the
  cut here, so what moves during the cut is the site's doing; after the heal central adopts
  the site's placement (its task view names the peer). The demo watches the members'
  ``/v1/status`` (``site_autonomy``) and own task lists to report it;
* **one node**: it decides alone; central fails its pinned gate service over after 2 s and
  reconciles the two copies after the heal.

At the end the demo reads what happened from the fleet's own APIs (offline decisions, merge
time, failovers and reconciles, tasks per node, utilization and energy; for a site, its
coordinator, the dead member's replicas and where they run, the site's decisions), checks that
every replica at central is byte-equal to its node's document (the dead member's left out: it
has none now) and that no task runs on two nodes, prints it and writes it as JSON. SIGINT and
SIGTERM stop everything: nodes first (SIGTERM), then the task processes they leave running
(tasks outlive their engine by design), then central, then the brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from edgesched import demoservice
from edgesched.core.campus import BIN_S, BINS_PER_DAY, arrival_rate_curve, workload_classes
from edgesched.edge.fakehw import SERVER_KINDS, ServerKind, build_server
from edgesched.edge.hal import default_power_model, discover, to_node
from edgesched.fieldtest.brokers import broker_config
from edgesched.fieldtest.faultproxy import FaultProxy
from edgesched.localbroker import LocalBroker, mosquitto_path, start_local_broker
from edgesched.ports import free_port, wait_for_port
from edgesched.rest.client import ApiError, ApiTarget, AsyncApiClient

DAY_S = 86_400.0
#: When the node is cut off, and when the fleet switches to energy mode (simulated time).
CUT_AT_S = 10 * 3600.0
CUT_FOR_S = 3600.0
ENERGY_AT_S = 18 * 3600.0
#: A cut lasts at least this long in real time: the broker notices a silent client after
#: 1.5 keepalives, and central fails services over ``FAILOVER_AFTER_S`` after that. Measured
#: on a loaded 2-core machine, Mosquitto published the will 6-8 s into the cut (not the 3 s
#: the keepalive says), so 8 s left the failover no time in some runs: 12.
MIN_CUT_REAL_S = 12.0
KEEPALIVE_S = 2
FAILOVER_AFTER_S = 2.0
LEASE_S = 2.0
#: Task durations are stretched (and arrivals thinned to keep the same load) so that a class's
#: median task lasts at least this long in real time: a process per 30 ms would measure
#: process spawning, not scheduling.
MIN_REAL_MEDIAN_S = 3.0
#: Classes submitted at a node's own API (the node decides); the others go through central.
LOCAL_CLASSES = frozenset({"face-recognition", "video-conferencing"})
#: Task restart policy per class: sessions never restart, batch jobs restart on failure.
RESTART = {
    "face-recognition": "never",
    "video-conferencing": "never",
    "cloud-desktop": "never",
    "ai-training": "on-failure",
    "video-analytics": "on-failure",
}
ACTIVE = frozenset({"placed", "running"})  # holding resources on a node
REPORT_FILE = "demo-report.json"
TASK_MARKER = "EDGESCHED_DEMO"  # in every task's environment: the work directory
SAMPLE_S = 0.5  # real seconds between utilization samples
READY_TIMEOUT_S = 40.0
CONVERGE_TIMEOUT_S = 45.0
MERGE_TIMEOUT_S = 45.0
DRAIN_TIMEOUT_S = 30.0
#: The site the demo cuts off when it runs on Mosquitto (the bridge needs it): its id, how
#: many of the fleet's nodes it holds, how long a dead member's replicas wait before the
#: coordinator restarts them on a peer, and how long a local submission waits unplaced on its
#: member before it is offered to the site.
SITE_ID = "site-1"
SITE_SIZE = 3
SITE_FAILOVER_S = 2.0
SITE_OFFER_AFTER_S = 1.0
#: Central's failover grace in the site run: the cut's real length plus this, so what moves
#: while the site is cut off is the site's doing (with the 2 s grace of the one-node cut,
#: central would fail the site's services over to the other nodes too, and its copy of the
#: dead member's replica would outrank the site's after the heal: central > site).
SITE_CENTRAL_GRACE_S = 10.0
#: The dead member is killed once the site has elected its coordinator, at the latest this
#: many real seconds before the heal (the restart on a peer takes the failover time and a
#: few cycles).
KILL_BEFORE_HEAL_S = 6.0


class DemoError(Exception):
    """A user-facing failure: one line, no traceback."""


class Interrupted(Exception):
    """SIGINT or SIGTERM stopped the demo (everything was stopped)."""

    def __init__(self, signame: str) -> None:
        super().__init__(f"stopped by {signame}")
        self.signame = signame


# --------------------------------------------------------------------------- options, timeline


@dataclass(frozen=True)
class DemoOptions:
    speed: float = 720.0
    duration_s: float = DAY_S  # simulated seconds to run
    start_s: float | None = None  # time of day to start (None: see :func:`timeline`)
    nodes: int = 4
    seed: int = 0
    workdir: Path | None = None
    keep: bool = False
    partition: bool = True
    broker: str = "auto"
    api_port: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.speed) and 1 <= self.speed <= 20_000):
            raise DemoError(f"--speed: must be between 1 and 20000, got {self.speed:g}")
        if not (math.isfinite(self.duration_s) and 0 < self.duration_s <= DAY_S):
            raise DemoError("--minutes/--hours: between 1 minute and 24 hours of simulated time")
        if self.start_s is not None and not 0 <= self.start_s < DAY_S:
            raise DemoError("--start: a time of day, 00:00 to 23:59")
        if not 2 <= self.nodes <= 12:
            raise DemoError(f"--nodes: between 2 and 12, got {self.nodes}")
        if self.broker not in ("auto", "mosquitto", "embedded"):
            raise DemoError(f"--broker: auto, mosquitto or embedded, got {self.broker!r}")
        if not 0 <= self.api_port < 65536:
            raise DemoError(f"--api-port: 0 to 65535, got {self.api_port}")
        wd = self.workdir
        if wd is not None and wd.exists() and (not wd.is_dir() or any(wd.iterdir())):
            raise DemoError(f"--workdir: {wd} exists and is not an empty directory")


@dataclass(frozen=True)
class Timeline:
    """Simulated seconds since midnight of the first day."""

    start_s: float
    end_s: float
    cut_at: float | None
    heal_at: float | None
    energy_at: float
    speed: float

    def real(self, sim_s: float) -> float:
        """Real seconds from the start to simulated time ``sim_s``."""
        return (sim_s - self.start_s) / self.speed


def timeline(opts: DemoOptions) -> Timeline:
    """The run's window and its moments. A full day starts at midnight; a shorter run starts
    a quarter of its length before 10:00, so the cut falls inside it. The cut is at 10:00 when
    the window holds it (else a quarter into the run) and lasts an hour, or
    ``MIN_CUT_REAL_S`` of real time if that is longer; the run is extended to the heal if
    needed. Energy mode from 18:00 (else three quarters into the run)."""
    d = opts.duration_s
    if opts.start_s is not None:
        start = opts.start_s
    else:
        start = 0.0 if d >= DAY_S else max(0.0, CUT_AT_S - d / 4)
    end = start + d
    cut = heal = None
    if opts.partition:
        cut = CUT_AT_S if start <= CUT_AT_S < end else start + d / 4
        heal = cut + max(CUT_FOR_S, MIN_CUT_REAL_S * opts.speed)
        end = max(end, heal + 2 * opts.speed)  # a little connected time after the heal
    energy = ENERGY_AT_S if start <= ENERGY_AT_S < end else start + 0.75 * (end - start)
    return Timeline(start, end, cut, heal, energy, opts.speed)


def clock_text(sim_s: float) -> str:
    """``HH:MM`` of simulated time, ``24:00`` for the end of the first day."""
    if sim_s == DAY_S:
        return "24:00"
    day, rest = divmod(int(sim_s), int(DAY_S))
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}"
    return text if day == 0 else f"{text} (+{day}d)"


# --------------------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class SimNode:
    """One edge node of the demo and the simulated server it registers as."""

    id: str
    kind: ServerKind
    arch: str
    server_class: str
    cpu: float
    mem_gib: float
    accel: int
    idle_w: float
    peak_w: float


def make_nodes(count: int, hw_dir: Path) -> list[SimNode]:
    """``count`` nodes over :data:`SERVER_KINDS` (cycled), their trees built under ``hw_dir``."""
    nodes = []
    for i in range(count):
        kind = SERVER_KINDS[i % len(SERVER_KINDS)]
        node_id = f"{kind.name}-{i + 1}"
        root = build_server(kind, hw_dir / node_id)
        profile = discover(root)
        power = default_power_model(profile)
        node = to_node(profile, node_id, "campus", power)
        nodes.append(
            SimNode(
                node_id,
                kind,
                node.arch.value,
                node.server_class.value,
                node.capacity.cpu,
                node.capacity.mem_gib,
                node.capacity.accel,
                power.idle_w,
                power.peak_w,
            )
        )
    return nodes


def cut_node_of(nodes: Sequence[SimNode]) -> SimNode:
    """The node the demo cuts off: the storage node, else the last one."""
    for node in nodes:
        if node.server_class == "storage-dense":
            return node
    return nodes[-1]


def site_members_of(nodes: Sequence[SimNode]) -> list[SimNode]:
    """The nodes of the site the demo cuts off: the last ``SITE_SIZE`` nodes but the first AI
    node, which stays with central (an x86 node with the GPUs: cloud desktops and AI training
    keep a place to run during the cut). Empty when fewer than ``SITE_SIZE + 1`` nodes (the
    other nodes must keep working): the demo then cuts one node off."""
    if len(nodes) < SITE_SIZE + 1:
        return []
    ai = next((n for n in nodes if n.server_class == "ai-accelerator"), None)
    rest = [n for n in nodes if n is not ai]
    return rest[-SITE_SIZE:]


def site_victim_of(members: Sequence[SimNode]) -> SimNode:
    """The member that loses power during the cut: the storage node, else the last member;
    never the member the site elects (the smallest id), so the coordinator stays put."""
    coordinator = min(n.id for n in members)
    for node in members:
        if node.server_class == "storage-dense" and node.id != coordinator:
            return node
    return max((n for n in members if n.id != coordinator), key=lambda n: n.id)


# --------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Arrival:
    """A submission: at simulated time ``at``, to ``route`` ("central" or a node id)."""

    at: float
    route: str
    spec: dict[str, Any]
    pin: str | None = None


def plan_workload(
    nodes: Sequence[SimNode],
    tl: Timeline,
    *,
    seed: int,
    cut_node: str | None,
    env: dict[str, str],
    cwd: str,
    site: Sequence[str] = (),
) -> list[Arrival]:
    """The campus day's arrivals in ``tl``'s window, scaled to this fleet: a pure function.

    Per class, the demand curve of :func:`~edgesched.core.campus.workload_classes`
    (calibrated to 42% of this fleet's CPU on average) and its arrival rates; durations are
    lognormal as in the scenario, stretched by the class's factor (and arrivals thinned by
    it) so the median lasts ``MIN_REAL_MEDIAN_S`` real seconds or more. Local classes go to a
    node drawn by CPU capacity among the nodes that can run them; during the cut, half of
    them go to the cut-off node, or with a ``site`` (its members' ids) to a member drawn by
    CPU capacity. Each node also gets a gate service (restart ``always``) at the start,
    submitted at central; ``cut_node``'s (the cut-off node, or the site's member that loses
    power) is pinned to it.
    """
    rng = np.random.default_rng(seed)
    fleet_cpu = sum(n.cpu for n in nodes)
    total_real = tl.real(tl.end_s)
    raw: list[tuple[float, str, str, dict[str, Any]]] = []
    for name, wc in workload_classes(fleet_cpu).items():
        stretch = max(1.0, MIN_REAL_MEDIAN_S * tl.speed / wc.duration_median_s)
        rates = np.asarray(arrival_rate_curve(wc), dtype=np.float64) / stretch
        cpu_p = np.asarray(wc.cpu_weights) / sum(wc.cpu_weights)
        acc_p = np.asarray(wc.accel_weights) / sum(wc.accel_weights) if wc.accel_choices else None
        first, last = int(tl.start_s // BIN_S), math.ceil(tl.end_s / BIN_S)
        for b in range(first, last):
            lo, hi = max(b * BIN_S, tl.start_s), min((b + 1) * BIN_S, tl.end_s)
            for at in np.sort(
                rng.uniform(lo, hi, rng.poisson(rates[b % BINS_PER_DAY] * (hi - lo)))
            ):
                cpu = float(rng.choice(wc.cpu_choices, p=cpu_p))
                accel = int(rng.choice(wc.accel_choices, p=acc_p)) if acc_p is not None else 0
                sim_d = stretch * wc.duration_median_s * math.exp(wc.duration_sigma * rng.normal())
                real_d = max(0.2, sim_d / tl.speed)
                spec: dict[str, Any] = {
                    "command": ["sleep", f"{real_d:.2f}"],
                    "workload": name,
                    "priority": wc.priority,
                    "cpu": cpu,
                    "mem_gib": cpu * wc.mem_gib_per_cpu,
                    "accel": accel,
                    "restart": RESTART[name],
                    "archs": sorted(a.value for a in wc.archs),
                    "server_classes": sorted(c.value for c in wc.server_classes),
                    "preemptible": wc.preemptible,
                    "duration_s": round(real_d, 2),
                    "env": dict(env),
                    "cwd": cwd,
                }
                route = "central"
                if name in LOCAL_CLASSES:
                    route = _local_node(rng, nodes, spec, float(at), tl, cut_node, site)
                raw.append((float(at), wc.code, route, spec))
    raw.sort(key=lambda r: r[0])
    out: list[Arrival] = []
    for i, node in enumerate(nodes):
        service = {
            "id": f"svc-gate-{i + 1}",
            "command": ["sleep", str(int(total_real + 3600))],
            "workload": "face-recognition",
            "priority": 90,
            "cpu": 1.0,
            "mem_gib": 1.0,
            "restart": "always",
            "max_restarts": 100,
            "preemptible": False,
            "env": dict(env),
            "cwd": cwd,
        }
        out.append(
            Arrival(tl.start_s, "central", service, node.id if node.id == cut_node else None)
        )
    for seq, (at, code, route, spec) in enumerate(raw):
        out.append(Arrival(at, route, {"id": f"{code}-{seq:05d}", **spec}))
    return out


def _local_node(
    rng: np.random.Generator,
    nodes: Sequence[SimNode],
    spec: dict[str, Any],
    at: float,
    tl: Timeline,
    cut_node: str | None,
    site: Sequence[str] = (),
) -> str:
    fits = fitting(nodes, spec)
    if not fits:
        return "central"
    cut = tl.cut_at is not None and tl.heal_at is not None and tl.cut_at <= at < tl.heal_at
    if cut and site:
        members = [n for n in fits if n.id in site]
        if members and rng.random() < 0.5:
            return _by_cpu(rng, members)
    elif cut and any(n.id == cut_node for n in fits) and rng.random() < 0.5:
        return str(cut_node)
    return _by_cpu(rng, fits)


def fitting(nodes: Iterable[SimNode], spec: dict[str, Any]) -> list[SimNode]:
    """The nodes that can run ``spec`` (its architectures, CPU and memory)."""
    return [
        n
        for n in nodes
        if (not spec.get("archs") or n.arch in spec["archs"])
        and n.cpu >= spec["cpu"]
        and n.mem_gib >= spec["mem_gib"]
    ]


def _by_cpu(rng: np.random.Generator, nodes: Sequence[SimNode]) -> str:
    weights = np.asarray([n.cpu for n in nodes])
    return nodes[int(rng.choice(len(nodes), p=weights / weights.sum()))].id


# --------------------------------------------------------------------------- processes


def edgesched_argv() -> list[str]:
    """How to run the ``edgesched`` CLI of this installation."""
    return [sys.executable, "-m", "edgesched.cli"]


@dataclass
class Child:
    """A child process with an API: central or an edge node."""

    name: str
    argv: list[str]
    log: Path
    state: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, cwd: Path) -> None:
        with self.log.open("ab") as out:
            # Its own session: a Ctrl-C at the terminal reaches the demo only, which then
            # stops everything in order.
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=out, cwd=cwd, start_new_session=True
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def last_error(self) -> str:
        """The most telling line of the log (an error line, else the last line)."""
        try:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()]
        except OSError:
            return "no log"
        lines = [ln for ln in lines if ln]
        for line in reversed(lines):
            if "error" in line.lower():
                return line[-300:]
        return lines[-1][-300:] if lines else "no output"

    def api(self) -> ApiTarget:
        """Its API's address and token, from the files it writes at start (OSError or
        ValueError until it has)."""
        return ApiTarget.from_state_dir(self.state)


def kill_task_processes(run_dirs: Iterable[Path], marker: str) -> int:
    """Kill the process groups of every task process: the executor's wrapper carries its run
    directory in argv, and every demo task has ``marker`` (the work dir) in its environment.
    Returns how many were found."""
    from edgesched.edge.executor import kill_leftovers

    return kill_leftovers(run_dirs, also=lambda p: p.environ().get(TASK_MARKER) == marker)


def _toml(value: object) -> str:
    return json.dumps(value)  # strings, numbers and booleans are valid TOML this way


def write_config(path: Path, sections: dict[str, dict[str, object]]) -> Path:
    lines = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml(value)}" for key, value in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_site_broker(workdir: Path, wan_port: int, timeout: float = 15.0) -> LocalBroker:
    """The site's Mosquitto on a free loopback port, bridged to central's broker through
    127.0.0.1:``wan_port`` (the fault proxy: the site's WAN link)."""
    exe = mosquitto_path()
    if exe is None:
        raise DemoError("site broker: mosquitto is not installed")
    workdir.mkdir(parents=True)
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(broker_config([("127.0.0.1", port)], bridge=(SITE_ID, "127.0.0.1", wan_port)))
    log = workdir / "broker.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([exe, "-c", str(conf)], stdout=out, stderr=out)
    broker = LocalBroker(port, "mosquitto", "5", proc, log)
    try:
        wait_for_port(port, timeout, proc=proc)
    except (ChildProcessError, TimeoutError) as exc:
        broker.stop()
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise DemoError(f"site broker did not start: {exc} {tail[0]}".strip()) from None
    return broker


# --------------------------------------------------------------------------- the API client


class Api:
    """The shared REST client, bound to one child process (its URL and token)."""

    def __init__(self, session: aiohttp.ClientSession, child: Child) -> None:
        self.child = child
        self.client = AsyncApiClient(session, child.api())

    async def call(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        resp = await self.client.request(method, path, body)
        return resp.status, resp.body

    async def get(self, path: str) -> Any:
        try:
            return await self.client.call("GET", path)
        except ApiError as exc:
            raise DemoError(f"{self.child.name}: GET {path}: {exc}") from None


# --------------------------------------------------------------------------- the display


class Ui(Protocol):
    def note(self, sim_s: float, text: str) -> None: ...

    def tick(self, sim_s: float, status: str) -> None: ...

    def info(self, text: str) -> None: ...


class QuietUi:
    """``--json``: nothing but the final JSON."""

    def note(self, sim_s: float, text: str) -> None:
        pass

    def tick(self, sim_s: float, status: str) -> None:
        pass

    def info(self, text: str) -> None:
        pass


# --------------------------------------------------------------------------- measurements


@dataclass
class Moved:
    """A replica of the member that lost power: where the site restarted it, and when central
    adopted that placement."""

    task: str
    origin: str
    node: str | None = None  # the site peer it runs on
    decided_by: str | None = None  # as that peer's own API says
    after_kill_s: float | None = None  # real seconds from the power loss to running there
    during_cut: bool | None = None  # running there before the heal
    central_node: str | None = None  # central's task view after the heal
    adopted_s: float | None = None  # real seconds from the heal to central's view saying so

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "from": self.origin,
            "to": self.node,
            "decided_by": self.decided_by,
            "restored_after_kill_s": _round(self.after_kill_s, 2),
            "restored_during_cut": self.during_cut,
            "central_node_after_heal": self.central_node,
            "adopted_after_heal_s": _round(self.adopted_s, 2),
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class SiteWatch:
    """What the demo sees of the cut-off site, from its members' ``/v1/status``
    (``site_autonomy``) and own task lists."""

    coordinator: str | None = None
    epoch: int | None = None
    elected_s: float | None = None  # real seconds from the cut to every live member following
    terms: set[tuple[str, int]] = field(default_factory=set)  # (holder, epoch) seen acting
    orders: int = 0  # the most orders the coordinator held at once
    offered: set[str] = field(default_factory=set)  # submissions members offered to the site
    polls: int = 0
    killed: str | None = None
    killed_at: float | None = None  # simulated
    killed_after_cut_s: float | None = None
    killed_processes: int = 0
    moved: dict[str, Moved] = field(default_factory=dict)

    def see(self, statuses: dict[str, dict[str, Any]], since_cut: float) -> None:
        """One poll of the live members' ``site_autonomy`` sections."""
        self.polls += 1
        for member, site in statuses.items():
            lease = site.get("coordinating")
            if lease is not None:
                self.terms.add((member, int(lease["epoch"])))
                self.orders = max(self.orders, int(site.get("orders") or 0))
            self.offered.update(site.get("offered") or ())
        if self.coordinator is not None or not statuses:
            return
        holders = {
            (s["following"]["holder"], int(s["following"]["epoch"])) if s.get("following") else None
            for s in statuses.values()
        }
        if len(holders) == 1 and (term := holders.pop()) is not None:
            holder, epoch = term
            if (statuses.get(holder) or {}).get("coordinating") is not None:
                self.coordinator, self.epoch, self.elected_s = holder, epoch, since_cut


@dataclass
class Measurements:
    """What the demo observes while the day runs."""

    nodes: dict[str, SimNode]
    samples: list[tuple[float, dict[str, tuple[float, int]]]] = field(default_factory=list)
    events: dict[tuple[float, str, str], dict[str, Any]] = field(default_factory=dict)
    submitted: dict[str, int] = field(default_factory=dict)  # by route kind
    refused: list[str] = field(default_factory=list)
    merge_s: float | None = None
    merge_error: str | None = None
    #: The driver's worst lag behind the simulated clock (real seconds): [at nodes, central].
    late_s: list[float] = field(default_factory=lambda: [0.0, 0.0])
    planned: int = 0
    unsent: int = 0  # submissions still unanswered DRAIN_TIMEOUT_S after the last one
    gates: demoservice.ScaleLog = field(default_factory=demoservice.ScaleLog)
    site: SiteWatch = field(default_factory=SiteWatch)
    rerouted: int = 0  # local submissions for a dead node sent to a live site peer instead

    def add_sample(self, sim_s: float, docs: dict[str, dict[str, Any]]) -> None:
        alloc: dict[str, tuple[float, int]] = {}
        for node_id, content in docs.items():
            cpu, accel = 0.0, 0
            for entry in (content.get("tasks") or {}).values():
                if isinstance(entry, dict) and entry.get("state") in ACTIVE:
                    cpu += float(entry.get("cpu") or 0.0)
                    accel += int(entry.get("accel") or 0)
            alloc[node_id] = (cpu, accel)
        self.samples.append((sim_s, alloc))

    def usage(self) -> dict[str, Any]:
        """Utilization (allocated CPU over capacity) and energy (the power model at the
        reserved utilization: ``idle + (peak - idle) * u``, ``u`` the larger of the CPU and
        accelerator shares reserved), integrated over simulated time between samples."""
        from edgesched.core.campus import campus_tariff

        tariff = campus_tariff()
        cap = sum(n.cpu for n in self.nodes.values())
        used = span = joules = cost = 0.0
        hourly: dict[int, list[float]] = {}
        per_node: dict[str, float] = dict.fromkeys(self.nodes, 0.0)
        for (t0, alloc), (t1, _) in itertools.pairwise(self.samples):
            dt = t1 - t0
            if dt <= 0:
                continue
            total = 0.0
            watts = 0.0
            for node_id, node in self.nodes.items():
                cpu, accel = alloc.get(node_id, (0.0, 0))
                total += cpu
                per_node[node_id] += cpu * dt
                share = max(
                    min(1.0, cpu / node.cpu), min(1.0, accel / node.accel) if node.accel else 0.0
                )
                watts += node.idle_w + (node.peak_w - node.idle_w) * share
            used += total * dt
            span += dt
            joules += watts * dt
            cost += watts * dt / 3.6e6 * tariff.price_at(t0)
            hourly.setdefault(int(t0 // 3600) % 24, []).append(total / cap)
        kwh = joules / 3.6e6
        return {
            "utilization": used / (cap * span) if span else 0.0,
            "per_node": {
                n: per_node[n] / (self.nodes[n].cpu * span) if span else 0.0 for n in self.nodes
            },
            "hourly": {f"{h:02d}:00": round(sum(v) / len(v), 4) for h, v in sorted(hourly.items())},
            "energy_kwh": kwh,
            "energy_cost": cost,
            "simulated_s": span,
            "samples": len(self.samples),
        }


# --------------------------------------------------------------------------- the run


@dataclass
class Fleet:
    workdir: Path
    broker: LocalBroker
    central: Child
    nodes: dict[str, Child]
    sim: dict[str, SimNode]
    cut: SimNode | None
    proxy: FaultProxy | None
    session: aiohttp.ClientSession
    capi: Api | None = None
    napi: dict[str, Api] = field(default_factory=dict)
    #: The cut-off site's members (empty: one node is cut off, ``cut``); ``cut`` is then the
    #: member that loses power during the cut.
    site: tuple[str, ...] = ()
    site_broker: LocalBroker | None = None
    #: Nodes the demo killed (power loss): no API, not watched, not checked.
    dead: set[str] = field(default_factory=set)
    failover_after_s: float = FAILOVER_AFTER_S  # central's grace in this run

    def live(self) -> dict[str, Api]:
        return {n: a for n, a in self.napi.items() if n not in self.dead}


class SimClock:
    def __init__(self, start_s: float, speed: float) -> None:
        self.start_s = start_s
        self.speed = speed
        self.t0 = time.monotonic()

    def now(self) -> float:
        return self.start_s + (time.monotonic() - self.t0) * self.speed

    async def until(self, sim_s: float) -> None:
        delay = (sim_s - self.now()) / self.speed
        if delay > 0:
            await asyncio.sleep(delay)


def prepare_workdir(opts: DemoOptions) -> tuple[Path, bool]:
    """(work dir, whether the demo made it as a temporary directory)."""
    if opts.workdir is None:
        return Path(tempfile.mkdtemp(prefix="edgesched-demo-")).resolve(), True
    workdir = opts.workdir.resolve()
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise DemoError(f"--workdir: {workdir} exists and is not an empty directory")
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir, False


async def _wait_ready(child: Child, session: aiohttp.ClientSession) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not child.alive():
            code = None if child.proc is None else child.proc.returncode
            raise DemoError(f"{child.name} did not start (exit {code}): {child.last_error()}")
        with contextlib.suppress(OSError, ValueError, aiohttp.ClientError):
            url = child.api().base_url + "/v1/health"
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise DemoError(
        f"{child.name} did not answer within {READY_TIMEOUT_S:g}s: {child.last_error()}"
    )


async def _poll(
    check: Callable[[], Awaitable[Any]], timeout: float, interval: float = 0.2
) -> tuple[Any, float]:
    """(first truthy result of ``check``, seconds it took); (last result, -1) on timeout."""
    t0 = time.monotonic()
    last: Any = None
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            last = await check()
            if last:
                return last, time.monotonic() - t0
        await asyncio.sleep(interval)
    return last, -1.0


async def run_demo(opts: DemoOptions, ui: Ui) -> dict[str, Any]:
    """Start the fleet, run the day, report; everything is stopped before this returns or
    raises (DemoError for a user-facing failure; cancellation stops it early)."""
    tl = timeline(opts)
    workdir, temporary = prepare_workdir(opts)
    keep = opts.keep or not temporary
    try:
        return await _run_in(workdir, opts, tl, ui, keep)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


async def _run_in(
    workdir: Path, opts: DemoOptions, tl: Timeline, ui: Ui, keep: bool
) -> dict[str, Any]:
    t_begin = time.monotonic()
    sims = make_nodes(opts.nodes, workdir / "hardware")
    tasks_dir = workdir / "tasks"
    tasks_dir.mkdir()
    async with contextlib.AsyncExitStack() as stack:
        try:
            broker = await asyncio.to_thread(
                start_local_broker, workdir / "broker", prefer=opts.broker
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise DemoError(f"broker: {exc}".splitlines()[0]) from None
        stack.callback(broker.stop)
        ui.info(f"broker: {broker.kind} (MQTT {broker.protocol}) on 127.0.0.1:{broker.port}")
        # A site needs a second Mosquitto bridged to the first (amqtt has no bridge), and
        # nodes outside it; else one node is cut off, as before sites.
        members = site_members_of(sims) if opts.partition and broker.kind == "mosquitto" else []
        site = tuple(n.id for n in members)
        cut = (
            (site_victim_of(members) if members else cut_node_of(sims)) if opts.partition else None
        )
        plan = plan_workload(
            sims,
            tl,
            seed=opts.seed,
            cut_node=cut.id if cut else None,
            env={TASK_MARKER: str(workdir)},
            cwd=str(tasks_dir),
            site=site,
        )
        proxy: FaultProxy | None = None
        if cut is not None:
            proxy = await stack.enter_async_context(
                FaultProxy("127.0.0.1", 0, "127.0.0.1", broker.port)
            )
        site_broker: LocalBroker | None = None
        if site and proxy is not None:
            site_broker = await asyncio.to_thread(
                start_site_broker, workdir / "site-broker", proxy.port
            )
            stack.callback(site_broker.stop)
            ui.info(
                f"site {SITE_ID}: {', '.join(site)} on their own broker (127.0.0.1:"
                f"{site_broker.port}), bridged to central's through the fault proxy (the WAN)"
            )
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15))
        )
        mqtt = {
            "port": broker.port,
            "keepalive_s": KEEPALIVE_S,
            "protocol": broker.protocol,
            "reconnect_max_s": 1.0,
        }
        cdir = workdir / "central"
        cdir.mkdir()
        failover = FAILOVER_AFTER_S
        if site and tl.cut_at is not None and tl.heal_at is not None:
            failover = round(tl.real(tl.heal_at) - tl.real(tl.cut_at) + SITE_CENTRAL_GRACE_S, 1)
        config = write_config(
            cdir / "central.toml",
            {
                "central": {
                    "central_id": "central",
                    "state_dir": str(cdir / "state"),
                    "api_port": opts.api_port,
                    "heartbeat_s": 0.5,
                    "snapshot_s": 1.0,
                    "cycle_s": 0.5,
                    "failover_after_s": failover,
                    # the autoscaler's 5-minute bins and its delays, in simulated time
                    "autoscale_time_scale": opts.speed,
                },
                "central.mqtt": mqtt,
                "policy": {"mode": "priority"},
            },
        )
        central = Child(
            "central",
            [*edgesched_argv(), "central", "run", "-c", str(config)],
            cdir / "central.log",
            cdir / "state",
        )
        nodes: dict[str, Child] = {}
        fleet = Fleet(workdir, broker, central, nodes, {s.id: s for s in sims}, cut, proxy, session)
        fleet.site, fleet.site_broker, fleet.failover_after_s = site, site_broker, failover

        async def stop_central() -> None:
            await asyncio.to_thread(central.stop)

        async def stop_nodes() -> None:
            def stop_all() -> None:
                for child in nodes.values():  # SIGTERM to all first, then wait for each
                    if child.alive() and child.proc is not None:
                        with contextlib.suppress(ProcessLookupError):
                            child.proc.send_signal(signal.SIGTERM)
                for child in nodes.values():
                    child.stop()
                kill_task_processes([c.state / "run" for c in nodes.values()], str(workdir))

            await asyncio.to_thread(stop_all)

        stack.push_async_callback(stop_central)
        await asyncio.to_thread(central.start, workdir)
        await _wait_ready(central, session)
        fleet.capi = Api(session, central)
        target = central.api()
        url = f"{target.base_url}/dashboard/#token={target.token}"
        ui.info(f"dashboard: {url}")
        stack.push_async_callback(stop_nodes)
        for sim in sims:
            ndir = workdir / "nodes" / sim.id
            ndir.mkdir(parents=True)
            port = broker.port
            membership: dict[str, object] = {"site": "campus"}
            if site_broker is not None and sim.id in site:
                port = site_broker.port
                membership = {
                    "site": SITE_ID,
                    "site_peers": [p for p in site if p != sim.id],
                    "site_failover_s": SITE_FAILOVER_S,
                    "site_offer_after_s": SITE_OFFER_AFTER_S,
                }
            elif proxy is not None and cut is not None and sim.id == cut.id:
                port = proxy.port
            config = write_config(
                ndir / "edge.toml",
                {
                    "edge": {
                        "node_id": sim.id,
                        **membership,
                        "state_dir": str(ndir / "state"),
                        "api_port": 0,
                        "lease_s": LEASE_S,
                        "cycle_s": 0.5,
                        "sample_s": 1.0,
                        "stop_grace_s": 1.0,
                        "hal_root": str(workdir / "hardware" / sim.id),
                        # the simulated server's load and power, not this host's
                        "telemetry_source": "reserved",
                    },
                    "edge.mqtt": {**mqtt, "port": port},
                },
            )
            child = Child(
                sim.id,
                [*edgesched_argv(), "edge", "run", "-c", str(config)],
                ndir / "edge.log",
                ndir / "state",
            )
            nodes[sim.id] = child
            await asyncio.to_thread(child.start, workdir)
        await asyncio.gather(*(_wait_ready(c, session) for c in nodes.values()))
        fleet.napi = {n: Api(session, c) for n, c in nodes.items()}
        for sim in sims:
            ui.info(f"node {sim.id}: {sim.kind.describe} ({sim.arch}, {sim.server_class})")

        async def all_online() -> bool:
            assert fleet.capi is not None
            seen = {n["id"]: n for n in (await fleet.capi.get("/v1/nodes"))["nodes"]}
            return all(
                seen.get(n, {}).get("status") == "online" and seen[n].get("registration")
                for n in nodes
            )

        ok, _ = await _poll(all_online, READY_TIMEOUT_S)
        if not ok:
            raise DemoError(f"central did not hear from every node within {READY_TIMEOUT_S:g}s")
        ui.info(f"fleet up in {time.monotonic() - t_begin:.1f}s; work dir {workdir}")
        try:
            result = await _day(fleet, plan, tl, opts, ui)
        except* DemoError as group:
            raise group.exceptions[0] from None
        result["dashboard"] = url
        result["workdir"] = str(workdir) if keep else None
        result["processes"] = {
            "broker": broker.proc.pid,
            **({"site_broker": site_broker.proc.pid} if site_broker is not None else {}),
            "central": central.proc.pid if central.proc else None,
            **{n: c.proc.pid if c.proc else None for n, c in nodes.items()},
        }
        result["real_s"] = round(time.monotonic() - t_begin, 1)
        (workdir / REPORT_FILE).write_text(json.dumps(result, indent=2) + "\n")
        result["report"] = str(workdir / REPORT_FILE) if keep else None
        return result


async def _day(
    fleet: Fleet, plan: list[Arrival], tl: Timeline, opts: DemoOptions, ui: Ui
) -> dict[str, Any]:
    assert fleet.capi is not None
    capi = fleet.capi
    m = Measurements(fleet.sim, planned=len(plan))
    clock = SimClock(tl.start_s, tl.speed)
    status = {"text": ""}
    cut = fleet.cut
    site = fleet.site
    cut_name = f"site {SITE_ID}" if site else (cut.id if cut is not None else "")
    cut_real: list[float] = []
    heal_real: list[float] = []

    # Concurrent sends, per destination: a slow central must not hold the nodes' work back.
    sending = {r: asyncio.Semaphore(8 if r == "central" else 4) for r in ("central", *fleet.sim)}
    submits: list[asyncio.Task[None]] = []

    def reroute(arrival: Arrival) -> str:
        """A local submission for a node that lost power goes to a live member of its site
        that can run it (the site's users move to the next gateway), else to central."""
        live = [fleet.sim[n] for n in site if n not in fleet.dead]
        fits = fitting(live, arrival.spec) or fitting(
            (s for n, s in fleet.sim.items() if n not in fleet.dead), arrival.spec
        )
        m.rerouted += 1
        return max(fits, key=lambda n: n.cpu).id if fits else "central"

    async def submit(arrival: Arrival) -> None:
        route = arrival.route
        if route in fleet.dead:
            route = reroute(arrival)
        async with sending[route]:
            late = (clock.now() - arrival.at) / tl.speed
            m.late_s[route == "central"] = max(m.late_s[route == "central"], late)
            body = dict(arrival.spec)
            kind = "central" if route == "central" else "local"
            api = capi if kind == "central" else fleet.napi[route]
            if arrival.pin is not None:
                body["node"] = arrival.pin
            try:
                code, reply = await api.call("POST", "/v1/tasks", body)
            except (aiohttp.ClientError, OSError) as exc:
                # (OSError: the client's Unreachable, a timeout: a node stopped by the day's
                # plan between the check above and this call closes its connection)
                code, reply = 0, f"{type(exc).__name__}: {exc}"
        if code == 201:
            m.submitted[kind] = m.submitted.get(kind, 0) + 1
        else:
            detail = reply.get("detail") if isinstance(reply, dict) else reply
            m.refused.append(f"{body['id']} at {route}: {code} {detail}")

    async def drive(group: asyncio.TaskGroup) -> None:
        for arrival in plan:
            await clock.until(arrival.at)
            submits.append(group.create_task(submit(arrival)))
        if submits:  # bounded: a fleet that cannot keep up is reported, not waited for
            _, unsent = await asyncio.wait(submits, timeout=DRAIN_TIMEOUT_S)
            for task in unsent:
                task.cancel()
            m.unsent = len(unsent)

    async def watch() -> None:
        while True:
            for child in (fleet.central, *fleet.nodes.values()):
                if child.name not in fleet.dead and not child.alive():
                    code = None if child.proc is None else child.proc.returncode
                    raise DemoError(
                        f"{child.name} exited ({code}) during the demo: {child.last_error()}"
                    )
            for name, broker in (("broker", fleet.broker), ("site broker", fleet.site_broker)):
                if broker is not None and broker.proc.poll() is not None:
                    raise DemoError(f"the {name} exited ({broker.proc.returncode})")
            await asyncio.sleep(0.5)

    async def sample() -> None:
        while True:
            now = clock.now()
            docs = {}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                for node_id in fleet.sim:
                    if node_id in fleet.dead:
                        continue  # powered off: runs nothing (central's copy is its last word)
                    docs[node_id] = (await capi.get(f"/v1/nodes/{node_id}")).get("content") or {}
                m.add_sample(min(now, tl.end_s), docs)
            if now >= tl.end_s:
                return
            await asyncio.sleep(SAMPLE_S)

    async def collect_events() -> None:
        while True:
            await _collect_events(capi, m)
            await asyncio.sleep(1.0)

    async def ticker() -> None:
        while True:
            ui.tick(min(clock.now(), tl.end_s), status["text"])
            await asyncio.sleep(0.2)

    async def measure_merge() -> None:
        assert cut is not None
        merging = [n for n in site if n not in fleet.dead] if site else [cut.id]

        async def merged() -> bool:
            seen = {n["id"]: n for n in (await capi.get("/v1/nodes"))["nodes"]}
            for node_id in merging:
                node_hash = (await fleet.napi[node_id].get("/v1/status"))["document"][
                    "content_hash"
                ]
                if seen[node_id]["document"]["content_hash"] != node_hash:
                    return False
            return True

        ok, _ = await _poll(merged, MERGE_TIMEOUT_S, interval=0.05)
        if ok:
            m.merge_s = time.monotonic() - heal_real[0]
            ui.note(clock.now(), f"{cut_name} merged at central {m.merge_s:.2f}s after the heal")
        else:
            m.merge_error = f"{cut_name} not merged within {MERGE_TIMEOUT_S:g}s of the heal"
            ui.note(clock.now(), m.merge_error)

    async def site_statuses() -> dict[str, dict[str, Any]]:
        out = {}
        for node_id in site:
            if node_id in fleet.dead:
                continue
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, DemoError):
                body = await fleet.napi[node_id].get("/v1/status")
                if body.get("site_autonomy") is not None:
                    out[node_id] = body["site_autonomy"]
        return out

    async def observe_site() -> None:
        """The members' view of the site from the cut to the heal: who coordinates, at which
        epoch, how many orders it holds."""
        watch = m.site
        while not heal_real:
            before = watch.coordinator
            watch.see(await site_statuses(), time.monotonic() - cut_real[0])
            if before is None and watch.coordinator is not None:
                ui.note(
                    clock.now(),
                    f"{SITE_ID} elected {watch.coordinator} coordinator (epoch {watch.epoch}), "
                    f"{watch.elected_s:.1f}s into the cut; every live member follows it",
                )
            await asyncio.sleep(0.25)

    async def running_on(node_id: str) -> dict[str, dict[str, Any]]:
        rows = await fleet.napi[node_id].get("/v1/tasks?state=running")
        return {r["id"]: r for r in rows}

    async def power_loss() -> None:
        """Once the site has its coordinator (or ``KILL_BEFORE_HEAL_S`` before the heal), the
        victim loses power: SIGKILL of its engine and of its task processes. It stays down
        for the rest of the run. Then: where its replicas (restart ``always``) come back."""
        assert cut is not None and tl.cut_at is not None and tl.heal_at is not None
        watch = m.site
        latest = cut_real[0] + max(
            1.0, tl.real(tl.heal_at) - tl.real(tl.cut_at) - KILL_BEFORE_HEAL_S
        )
        while watch.coordinator is None and time.monotonic() < latest:
            await asyncio.sleep(0.1)
        victim = fleet.nodes[cut.id]
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, DemoError):
            for task_id, row in (await running_on(cut.id)).items():
                if (row.get("spec") or {}).get("restart") == "always":
                    watch.moved[task_id] = Moved(task_id, cut.id)
        fleet.dead.add(cut.id)
        killed_real = time.monotonic()

        def kill() -> int:
            if victim.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    victim.proc.kill()
                victim.proc.wait()
            from edgesched.edge.executor import kill_leftovers

            return kill_leftovers([victim.state / "run"])  # its tasks only, not the others'

        watch.killed_processes = await asyncio.to_thread(kill)
        watch.killed, watch.killed_at = cut.id, clock.now()
        watch.killed_after_cut_s = killed_real - cut_real[0]
        ui.note(
            clock.now(),
            f"{cut.id} lost power (SIGKILL of its engine and {watch.killed_processes} task "
            f"processes; it stays down); its replicas: {', '.join(sorted(watch.moved)) or 'none'}",
        )
        status["text"] += f" · {cut.id} down"
        deadline = tl.real(tl.heal_at) - tl.real(tl.cut_at) + cut_real[0] + MERGE_TIMEOUT_S
        while time.monotonic() < deadline:
            waiting = [mv for mv in watch.moved.values() if mv.node is None]
            if not waiting:
                break
            for node_id in site:
                if node_id in fleet.dead:
                    continue
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, DemoError):
                    rows = await running_on(node_id)
                    for mv in waiting:
                        found = rows.get(mv.task)
                        if found is None or mv.node is not None:
                            continue
                        mv.node, mv.decided_by = node_id, found.get("decided_by")
                        mv.after_kill_s = time.monotonic() - killed_real
                        mv.during_cut = not heal_real
                        ui.note(
                            clock.now(),
                            f"{mv.task} back on {node_id} ({mv.decided_by}) "
                            f"{mv.after_kill_s:.1f}s after the power loss"
                            + (", the site still cut off" if mv.during_cut else ", after the heal"),
                        )
            await asyncio.sleep(0.2)

    async def adopted() -> None:
        """After the heal: central's view of each moved replica says the peer that runs it."""
        t0 = heal_real[0]
        deadline = t0 + MERGE_TIMEOUT_S
        while time.monotonic() < deadline:
            waiting = [mv for mv in m.site.moved.values() if mv.adopted_s is None]
            if not waiting:
                return
            for mv in waiting:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    code, view = await capi.call("GET", f"/v1/tasks/{mv.task}")
                    if code == 200:
                        mv.central_node = view.get("node")
                        if mv.node is not None and mv.central_node == mv.node:
                            mv.adopted_s = time.monotonic() - t0
                            ui.note(
                                clock.now(),
                                f"central adopted the site's placement of {mv.task} on "
                                f"{mv.node}, {mv.adopted_s:.2f}s after the heal",
                            )
            await asyncio.sleep(0.1)

    async def gate_service() -> None:
        """The autoscaled gate front end: created at the start, its load reported every
        simulated 5 minutes, each change of its count recorded (app/demoservice.py)."""
        fleet_cpu = sum(n.cpu for n in fleet.sim.values())
        curve = demoservice.load_curve(fleet_cpu)
        body = demoservice.service_body(
            curve,
            env={TASK_MARKER: str(fleet.workdir)},
            cwd=str(fleet.workdir / "tasks"),
            real_s=tl.real(tl.end_s),
        )
        code, reply = await capi.call("POST", "/v1/services", body)
        if code != 201:
            raise DemoError(f"central refused the gate service: {code} {reply}")
        ui.note(clock.now(), f"service {demoservice.NAME} created: autoscaled by the forecast")
        at = tl.start_s
        while at < tl.end_s:
            await clock.until(at)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                load = demoservice.load_at(curve, at)
                report = {"cores": load, "at": demoservice.SIM_EPOCH_S + at}
                await capi.call("POST", f"/v1/services/{demoservice.NAME}/load", report)
                code, view = await capi.call("GET", f"/v1/services/{demoservice.NAME}")
                if code == 200 and m.gates.seen(clock.now(), view):
                    ui.note(clock.now(), f"{demoservice.NAME}: {view['reason']}")
            at += BIN_S

    async def control(group: asyncio.TaskGroup) -> None:
        moments: list[tuple[float, str]] = [(tl.energy_at, "energy")]
        if cut is not None and tl.cut_at is not None and tl.heal_at is not None:
            moments += [(tl.cut_at, "cut"), (tl.heal_at, "heal")]
        for at, what in sorted(moments):
            await clock.until(at)
            if what == "energy":
                code, reply = await capi.call("POST", "/v1/policy", {"mode": "energy"})
                if code != 200:
                    raise DemoError(f"central refused the switch to energy mode: {reply}")
                ui.note(at, "fleet policy switched to energy mode (POST /v1/policy)")
                status["text"] = "energy mode" + (" · " + status["text"] if status["text"] else "")
            elif what == "cut" and fleet.proxy is not None and cut is not None:
                fleet.proxy.blackhole()
                cut_real.append(time.monotonic())
                if site:
                    ui.note(
                        at,
                        f"site {SITE_ID} ({', '.join(site)}) cut off from central: its WAN link "
                        "blackholed by the fault proxy; still submitting to its members",
                    )
                    group.create_task(observe_site(), name="site")
                    group.create_task(power_loss(), name="power-loss")
                else:
                    ui.note(
                        at,
                        f"{cut.id} cut off (blackholed by the fault proxy); still submitting to it",
                    )
                status["text"] = f"{cut_name} cut off"
            elif what == "heal" and fleet.proxy is not None and cut is not None:
                fleet.proxy.heal()
                heal_real.append(time.monotonic())
                ui.note(at, f"{SITE_ID} WAN link healed" if site else f"{cut.id} link healed")
                status["text"] = " · ".join(
                    p for p in status["text"].split(" · ") if p and p != f"{cut_name} cut off"
                )
                group.create_task(measure_merge(), name="merge")
                if site:
                    group.create_task(adopted(), name="adopted")

    async with asyncio.TaskGroup() as group:
        loops = [
            group.create_task(watch(), name="watch"),
            group.create_task(collect_events(), name="events"),
            group.create_task(ticker(), name="ticker"),
        ]
        sampler = group.create_task(sample(), name="sample")
        driver = group.create_task(drive(group), name="drive")
        controller = group.create_task(control(group), name="control")
        gates = group.create_task(gate_service(), name="gate-service")
        await driver
        await controller
        await gates
        await clock.until(tl.end_s)
        await sampler
        ui.tick(tl.end_s, "checking the fleet")
        final = await _final_check(fleet, m)
        for task in loops:
            task.cancel()
    return _report(fleet, tl, opts, m, final)


async def _collect_events(capi: Api, m: Measurements) -> None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        for event in (await capi.get("/v1/events"))["events"]:
            m.events[(event["at"], event["kind"], event["detail"])] = event


async def _final_check(fleet: Fleet, m: Measurements) -> dict[str, Any]:
    """Wait (bounded) for every replica to equal its node's document and no task to run on
    two nodes; then read what each node holds. A node the demo killed is left out of both: it
    has no document to compare, and central's copy of it is what it said before it died (its
    tasks "running" there ran nowhere since)."""
    assert fleet.capi is not None
    capi = fleet.capi
    state: dict[str, Any] = {}
    live = fleet.live()

    async def settled() -> bool:
        seen = {n["id"]: n for n in (await capi.get("/v1/nodes"))["nodes"]}
        hashes = {}
        for node_id, api in live.items():
            hashes[node_id] = (await api.get("/v1/status"))["document"]["content_hash"]
        equal = {
            n: seen.get(n, {}).get("document", {}).get("content_hash") == h
            for n, h in hashes.items()
        }
        tasks = (await capi.get("/v1/tasks"))["tasks"]
        doubles = sorted(t["id"] for t in tasks if len(set(t["running_on"]) - fleet.dead) > 1)
        state.update(equal=equal, doubles=doubles, tasks=tasks)
        return all(equal.values()) and not doubles

    ok, took = await _poll(settled, CONVERGE_TIMEOUT_S, interval=0.3)
    await _collect_events(capi, m)
    contents = {n: (await capi.get(f"/v1/nodes/{n}")).get("content") or {} for n in fleet.sim}
    own = {n: await api.get("/v1/tasks") for n, api in live.items()}
    return {
        "settled": bool(ok),
        "settle_s": took,
        "replicas_equal": all(state.get("equal", {}).values()) if state else False,
        "unequal": sorted(n for n, e in state.get("equal", {}).items() if not e),
        "doubles": state.get("doubles", []),
        "tasks": state.get("tasks", []),
        "contents": contents,
        "own": own,
    }


def _report(
    fleet: Fleet, tl: Timeline, opts: DemoOptions, m: Measurements, final: dict[str, Any]
) -> dict[str, Any]:
    usage = m.usage()
    kinds: dict[str, int] = {}
    for event in m.events.values():
        kinds[event["kind"]] = kinds.get(event["kind"], 0) + 1
    nodes_out = []
    for node_id, sim in fleet.sim.items():
        tasks = (final["contents"].get(node_id) or {}).get("tasks") or {}
        states: dict[str, int] = {}
        central_n = local_n = 0
        for entry in tasks.values():
            states[entry.get("state", "?")] = states.get(entry.get("state", "?"), 0) + 1
            if entry.get("assignment") is not None:
                central_n += 1
            else:
                local_n += 1
        nodes_out.append(
            {
                "id": node_id,
                "hardware": sim.kind.describe,
                "arch": sim.arch,
                "server_class": sim.server_class,
                "cpu": sim.cpu,
                "accel": sim.accel,
                "tasks_ran": sum(states.get(s, 0) for s in ("running", "exited", "failed")),
                "tasks_by_state": dict(sorted(states.items())),
                "from_central": central_n,
                "local": local_n,
                "utilization": round(usage["per_node"][node_id], 4),
                "cut_off": node_id in fleet.site
                or (not fleet.site and fleet.cut is not None and node_id == fleet.cut.id),
                "site": SITE_ID if node_id in fleet.site else None,
                "lost_power": node_id in fleet.dead,
            }
        )
    partition = None
    offline_ok = True
    site_checks: dict[str, bool] = {}
    if fleet.site and tl.cut_at is not None and tl.heal_at is not None:
        partition, site_checks = _site_report(fleet, tl, m, final)
        offline_ok = partition["offline_decisions"] > 0 and m.merge_s is not None
    elif fleet.cut is not None and tl.cut_at is not None and tl.heal_at is not None:
        cut_id = fleet.cut.id
        at_central = (final["contents"].get(cut_id) or {}).get("tasks") or {}
        offline_central = sorted(
            t for t, e in at_central.items() if e.get("decided_by") == "edge-autonomous"
        )
        offline_node = sorted(
            r["id"]
            for r in final["own"].get(cut_id, [])
            if r.get("decided_by") == "edge-autonomous"
        )
        partition = {
            "mode": "node",
            "why": "one node cut off: a site needs Mosquitto (a bridged site broker) and at "
            f"least {SITE_SIZE + 1} nodes",
            "node": cut_id,
            "cut_at": clock_text(tl.cut_at),
            "healed_at": clock_text(tl.heal_at),
            "cut_real_s": round(tl.real(tl.heal_at) - tl.real(tl.cut_at), 1),
            "offline_decisions": len(offline_central),
            "offline_decisions_at_node": len(offline_node),
            "merge_s": None if m.merge_s is None else round(m.merge_s, 3),
            "merge_error": m.merge_error,
        }
        offline_ok = len(offline_central) > 0 and m.merge_s is not None
    running_on = {t["id"]: t["running_on"] for t in final["tasks"]}
    checks = {
        "replicas_equal": final["replicas_equal"],
        "no_task_on_two_nodes": not final["doubles"],
        "offline_decisions_merged": offline_ok,
        **site_checks,
    }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "unequal_replicas": final["unequal"],
        "tasks_on_two_nodes": final["doubles"],
        "settle_s": round(final["settle_s"], 2),
        "broker": {"kind": fleet.broker.kind, "protocol": fleet.broker.protocol},
        "speed": opts.speed,
        "seed": opts.seed,
        "window": {"start": clock_text(tl.start_s), "end": clock_text(tl.end_s)},
        "simulated_s": round(tl.end_s - tl.start_s),
        "nodes": nodes_out,
        "partition": partition,
        "policy_switch": {"at": clock_text(tl.energy_at), "mode": "energy"},
        "service": m.gates.summary(clock_text),
        "failovers": kinds.get("failover", 0),
        "reconciled": kinds.get("reconciled", 0),
        "events": dict(sorted(kinds.items())),
        "tasks": {
            "planned": m.planned,
            "submitted_at_central": m.submitted.get("central", 0),
            "submitted_at_nodes": m.submitted.get("local", 0),
            "refused": len(m.refused),
            "rerouted": m.rerouted,
            "unanswered": m.unsent,
            "refusals": m.refused[:20],
            "central_tasks_running_on_one_node": sum(1 for v in running_on.values() if len(v) == 1),
            "worst_lag_s": {"nodes": round(m.late_s[0], 3), "central": round(m.late_s[1], 3)},
        },
        "utilization": {
            "fleet": round(usage["utilization"], 4),
            "hourly": usage["hourly"],
            "source": "CPU reserved by placed and running tasks over capacity, sampled from "
            f"central's replicas every {SAMPLE_S:g}s real time",
        },
        "energy": {
            "kwh": round(usage["energy_kwh"], 3),
            "cost": round(usage["energy_cost"], 3),
            "source": "each node's power model (idle + (peak - idle) * u) at its reserved "
            "utilization u, integrated over simulated time, priced by the campus tariff; the "
            "nodes' telemetry (telemetry_source = reserved) reports the same model at the "
            "same u, sampled in real time",
        },
    }


def _site_report(
    fleet: Fleet, tl: Timeline, m: Measurements, final: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, bool]]:
    """The cut-off site's part of the report, and its checks."""
    assert fleet.cut is not None and tl.cut_at is not None and tl.heal_at is not None
    watch = m.site
    decisions: dict[str, dict[str, int | None]] = {}
    for member in fleet.site:
        at_central = (final["contents"].get(member) or {}).get("tasks") or {}
        by = [str(e.get("decided_by") or "") for e in at_central.values()]
        own = final["own"].get(member)
        mine = None if own is None else [str(r.get("decided_by") or "") for r in own]
        decisions[member] = {
            "site": sum(1 for d in by if d.startswith("site:")),
            "alone": by.count("edge-autonomous"),
            "site_at_node": None if mine is None else sum(1 for d in mine if d.startswith("site:")),
            "alone_at_node": None if mine is None else mine.count("edge-autonomous"),
        }
    by_site = sum(int(d["site"] or 0) for d in decisions.values())
    alone = sum(int(d["alone"] or 0) for d in decisions.values())
    moved = list(watch.moved.values())
    lead = f"site:{watch.coordinator}"
    part: dict[str, Any] = {
        "mode": "site",
        "site": SITE_ID,
        "members": list(fleet.site),
        "node": None,
        "cut_at": clock_text(tl.cut_at),
        "healed_at": clock_text(tl.heal_at),
        "cut_real_s": round(tl.real(tl.heal_at) - tl.real(tl.cut_at), 1),
        "coordinator": watch.coordinator,
        "coordinator_epoch": watch.epoch,
        "elected_after_cut_s": _round(watch.elected_s, 2),
        "terms_seen": sorted(f"{h}@{e}" for h, e in watch.terms),
        "site_orders": watch.orders,
        "offered_to_site": len(watch.offered),
        "lost_power": {
            "node": watch.killed,
            "at": None if watch.killed_at is None else clock_text(watch.killed_at),
            "after_cut_s": _round(watch.killed_after_cut_s, 2),
            "task_processes_killed": watch.killed_processes,
            "how": "SIGKILL of its engine and its task processes; left down for the rest of "
            "the run",
        },
        "moved": [mv.to_json() for mv in moved],
        "decisions": decisions,
        "site_decisions": by_site,
        "site_decided": sorted(
            t
            for member in fleet.site
            for t, e in ((final["contents"].get(member) or {}).get("tasks") or {}).items()
            if str(e.get("decided_by") or "").startswith("site:")
        ),
        "central_failover_after_s": fleet.failover_after_s,
        "offline_decisions": by_site + alone,
        "rerouted_submissions": m.rerouted,
        "merge_s": _round(m.merge_s, 3),
        "merge_error": m.merge_error,
    }
    checks = {
        "site_coordinator_elected": watch.coordinator is not None,
        "site_kept_services": bool(moved)
        and all(mv.during_cut and mv.node in fleet.site and mv.decided_by == lead for mv in moved),
        "site_placement_adopted": bool(moved)
        and all(mv.adopted_s is not None and mv.central_node == mv.node for mv in moved),
    }
    return part, checks


class RichUi:
    """A progress bar on the simulated clock, with what happens printed above it."""

    def __init__(self, console: Console, tl: Timeline) -> None:
        self.console = console
        self.tl = tl
        self.progress = Progress(
            TextColumn("[bold]campus day"),
            BarColumn(),
            TextColumn("{task.fields[clock]}"),
            TextColumn("[yellow]{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not console.is_terminal,
        )
        self.job = self.progress.add_task(
            "day", total=tl.end_s - tl.start_s, clock=clock_text(tl.start_s), status=""
        )

    def __enter__(self) -> RichUi:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def note(self, sim_s: float, text: str) -> None:
        self.progress.console.print(f"[cyan]{clock_text(sim_s)}[/] {text}", highlight=False)

    def tick(self, sim_s: float, status: str) -> None:
        self.progress.update(
            self.job, completed=sim_s - self.tl.start_s, clock=clock_text(sim_s), status=status
        )

    def info(self, text: str) -> None:
        self.progress.console.print(text, highlight=False, soft_wrap=True)


def print_summary(result: dict[str, Any], console: Console) -> None:
    """The human-readable end of a run."""
    tasks = result["tasks"]
    console.print()
    console.print(
        f"[bold]campus day {result['window']['start']}-{result['window']['end']}[/] at "
        f"x{result['speed']:g} in {result['real_s']:g}s real time, {len(result['nodes'])} nodes, "
        f"broker {result['broker']['kind']}",
        highlight=False,
    )
    table = Table(box=None, pad_edge=False)
    for name in ("node", "hardware", "class", "tasks ran", "central/local", "utilization"):
        table.add_column(name, justify="right" if name in ("tasks ran", "utilization") else "left")
    for node in result["nodes"]:
        table.add_row(
            node["id"]
            + (" (cut off, killed)" if node.get("lost_power") else "")
            + (" (cut off)" if node["cut_off"] and not node.get("lost_power") else ""),
            node["hardware"],
            node["server_class"],
            str(node["tasks_ran"]),
            f"{node['from_central']}/{node['local']}",
            f"{node['utilization']:.1%}",
        )
    console.print(table)
    console.print(
        f"tasks: {tasks['submitted_at_central']} submitted at central, "
        f"{tasks['submitted_at_nodes']} at nodes, {tasks['refused']} refused",
        highlight=False,
    )
    part = result["partition"]
    if part is not None and part["mode"] == "site":
        _print_site(part, console)
    elif part is not None:
        merge = f"{part['merge_s']:.2f}s" if part["merge_s"] is not None else "not measured"
        console.print(
            f"partition: {part['node']} cut off {part['cut_at']}-{part['healed_at']} "
            f"({part['cut_real_s']:g}s real): {part['offline_decisions']} decisions made "
            f"offline (edge-autonomous, as central holds them after the heal); merged {merge} "
            "after the heal",
            highlight=False,
        )
    gates = result["service"]
    lead = gates["forecast_lead_min"]
    console.print(
        f"service {gates['name']}: {len(gates['changes'])} changes of its count, up to "
        f"{gates['peak_replicas']} replicas; "
        + (
            f"the forecast scaled it out at {gates['forecast_scale_out_at']}, {lead} min "
            f"before the {gates['morning_peak_at']} gate peak"
            if lead is not None
            else "no forecast scale-out before the morning peak in this run"
        ),
        highlight=False,
    )
    grace = (
        f" (central's failover grace, {part['central_failover_after_s']:g}s, outlasts the cut: "
        "what moved while it lasted, the site moved)"
        if part is not None and part["mode"] == "site"
        else ""
    )
    console.print(
        f"failovers: {result['failovers']}{grace}, conflicts reconciled: {result['reconciled']}; "
        f"policy switched to {result['policy_switch']['mode']} at {result['policy_switch']['at']}",
        highlight=False,
    )
    console.print(
        f"utilization (allocated CPU / capacity, central's view): "
        f"{result['utilization']['fleet']:.1%}; energy {result['energy']['kwh']:.1f} kWh, "
        f"cost {result['energy']['cost']:.2f} (power model at the reserved utilization)",
        highlight=False,
    )
    checks = result["checks"]
    mark = {True: "[green]yes[/]", False: "[red]NO[/]"}
    console.print(
        f"check: every replica byte-equal {mark[checks['replicas_equal']]}, "
        f"no task on two nodes {mark[checks['no_task_on_two_nodes']]}, "
        f"offline decisions merged {mark[checks['offline_decisions_merged']]}"
        + (
            f", site coordinator elected {mark[checks['site_coordinator_elected']]}, "
            f"site kept its services {mark[checks['site_kept_services']]}, "
            f"central adopted the site's placement {mark[checks['site_placement_adopted']]}"
            if "site_kept_services" in checks
            else ""
        )
    )
    if result["report"]:
        console.print(f"report: {result['report']}", highlight=False)
    else:
        console.print("(work dir removed; --keep or --workdir keep the report and the logs)")


def _print_site(part: dict[str, Any], console: Console) -> None:
    """The cut-off site's lines of the summary."""

    def say(text: str) -> None:
        console.print(text, highlight=False)

    elected = (
        f"{part['coordinator']} (epoch {part['coordinator_epoch']}), "
        f"{part['elected_after_cut_s']:g}s into the cut"
        if part["coordinator"] is not None
        else "none seen"
    )
    say(
        f"site {part['site']} ({', '.join(part['members'])}) cut off from central "
        f"{part['cut_at']}-{part['healed_at']} ({part['cut_real_s']:g}s real); "
        f"coordinator elected: {elected}"
    )
    lost = part["lost_power"]
    if lost["node"] is not None:
        say(
            f"  {lost['node']} lost power at {lost['at']}, {lost['after_cut_s']:g}s into the cut "
            f"(SIGKILL of its engine and {lost['task_processes_killed']} task processes; left down)"
        )
    for mv in part["moved"]:
        if mv["to"] is None:
            say(f"  {mv['task']}: not restarted in the site")
            continue
        when = "while still cut off" if mv["restored_during_cut"] else "after the heal"
        adopted = (
            f"central adopted it on {mv['central_node_after_heal']} "
            f"{mv['adopted_after_heal_s']:g}s after the heal"
            if mv["adopted_after_heal_s"] is not None
            else f"central still says {mv['central_node_after_heal']}"
        )
        say(
            f"  {mv['task']} back on {mv['to']}, decided_by {mv['decided_by']}, "
            f"{mv['restored_after_kill_s']:g}s after the power loss, {when}; {adopted}"
        )
    alone = part["offline_decisions"] - part["site_decisions"]
    merge = f"{part['merge_s']:.2f}s" if part["merge_s"] is not None else "not measured"
    say(
        f"  decisions while cut off: {part['site_decisions']} by the site's coordinator "
        f"(site:{part['coordinator']}; {part['site_orders']} "
        f"order{'' if part['site_orders'] == 1 else 's'} at most at once), "
        f"{alone} by members alone (edge-autonomous), as central holds them after the heal; "
        f"{part['rerouted_submissions']} submissions for the dead node sent to a peer; "
        f"merged {merge} after the heal"
    )


# --------------------------------------------------------------------------- entry point


def run(opts: DemoOptions, ui: Ui) -> dict[str, Any]:
    """Run the demo in a fresh event loop; SIGINT/SIGTERM stop it (raises Interrupted)."""

    async def main() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        caught: list[str] = []
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if not caught:  # the first one stops everything; more would cut the cleanup short
                caught.append(sig.name)
                task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await run_demo(opts, ui)
        except asyncio.CancelledError:
            if caught:
                raise Interrupted(caught[0]) from None
            raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())
