"""Run one field-test scenario against real processes and judge it.

A broker (Mosquitto, or with ``broker="nats"`` a three-member NATS cluster serving MQTT 3.1.1,
:mod:`.natscluster`), central and N edge nodes run as separate processes; with sites, each
site has a Mosquitto of its own bridged to central's (:mod:`.brokers`) and its nodes connect to
it. On NATS central is on the first member and the nodes are spread over the members (gw-*i* on
nats(*i* mod 3 + 1)), each configured with the other members as ``hosts``; as root each member
is a namespace of its own, and a cut of central's host cuts its member with it.

With root every host lives in a network namespace (:mod:`.netns`: the kernel cuts links;
a site broker sits on its site's LAN and on the WAN, and a WAN cut takes its WAN link down);
without root every link goes through a :class:`~edgesched.fieldtest.faultproxy.FaultProxy`
(a node's to its broker, a site broker's WAN link to central's). A scenario that needs latency
puts a proxy on every node's link in the namespaces too (this kernel has no netem). The
report says which was used.

A workload (:mod:`.workload`) submits tasks of several classes at central and locally at
nodes throughout, a tidal window opens mid-run, the seeded fault schedule runs, everything is
healed, and after a quiet period the harness reads the final state and
:func:`edgesched.fieldtest.checker.check` gives the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesched.core.model import MAX_PRIORITY
from edgesched.edge.executor import kill_leftovers
from edgesched.fieldtest.brokers import broker_config
from edgesched.fieldtest.checker import (
    FinalState,
    Reboot,
    Submission,
    Verdict,
    brought_back,
    check,
    undelivered,
)
from edgesched.fieldtest.faultproxy import FaultProxy
from edgesched.fieldtest.natscluster import (
    Member,
    NatsCluster,
    build_members,
    nats_binary,
    start_all,
)
from edgesched.fieldtest.netns import Fabric, Host, available, socket_in
from edgesched.fieldtest.scenarios import BREAKS, SCENARIOS, Fault, Topology, schedule_for
from edgesched.fieldtest.workload import TidalWindow, submit_loop
from edgesched.localbroker import mosquitto_path
from edgesched.ports import free_port
from edgesched.rest.client import ApiClient, ApiError, ApiTarget

KEEPALIVE_S = 2
LEASE_S = 2.0
BROKER_PORT = 1883  # in the namespaces, where every host has its own addresses
BROKERS = ("mosquitto", "nats")
#: Members of the NATS cluster (``--broker nats``); central is on the first.
NATS_MEMBERS = 3
#: Central's ``silent_after_s`` on NATS: a node's will is lost when its member dies or is cut
#: off, so central calls such a node away by its silence (nodes send telemetry every second).
NATS_SILENT_AFTER_S = 5.0
#: How long a NATS member may stay unacknowledged with a QoS 1 message (the tests' value).
NATS_ACK_WAIT = "5s"
#: The test hook of ``edgesched edge run`` / ``central run`` that offsets the wall clock.
SKEW_ENV = "EDGESCHED_CLOCK_SKEW_S"
#: Seconds from writing the configs to the workload's start, about (the processes come up):
#: the tidal window is placed from it, and the report gives where it actually fell.
STARTUP_S = 6.0
#: How long central may take to call a cut-off node away: Mosquitto 2.0.11 dropped a silent
#: client with a 2 s keepalive that had been publishing after 2 to 8 s (measured; ~3 s for an
#: idle one), then the will reaches central, plus the harness's sampling.
NODE_DETECT_S = 10.0
#: The same for a site's WAN link, had central listened to the bridge's will: 1.5 × its 5 s
#: keepalive, plus a second.
SITE_DETECT_S = 8.5
#: How long a node that booted after a power loss has to bring its running tasks back.
BRING_BACK_S = 8.0
#: Site autonomy (a scenario's ``site_autonomy``): how long a member must be gone before its
#: site's coordinator restarts its replicas on the others, and how long a local submission
#: waits unplaced before its node offers it to the site.
SITE_FAILOVER_S = 2.0
SITE_OFFER_AFTER_S = 0.5
#: The longest a cut-off site may run a lost member's replicas short: its failover time, the
#: election's cycles and the member's will (at once for a power loss: its socket closes),
#: and the harness's polling.
SITE_RESTORE_LIMIT_S = SITE_FAILOVER_S + 6.0
_LINK_ACTIONS = ("isolate", "drop-in", "drop-out", "heal", "reset", "throttle", "wan-cut",
                 "latency")  # fmt: skip


def _edgesched() -> str:
    exe = Path(sys.executable).with_name("edgesched")
    return str(exe) if exe.exists() else (shutil.which("edgesched") or "edgesched")


@dataclass
class Proc:
    """A process of the run: how to start it again, and where it lives."""

    name: str
    argv: list[str]
    log: Path
    host: Host | None = None
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # on top of ours, at every start

    def start(self) -> None:
        env = {**os.environ, **self.env} if self.env else None
        with self.log.open("ab") as out:
            if self.host is not None:
                self.proc = self.host.popen(self.argv, log=out, env=env)
            else:
                self.proc = subprocess.Popen(self.argv, stdout=out, stderr=out, env=env)

    def signal(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.host is None:
            self.proc.send_signal(sig)
            return
        # `ip netns exec` execs the command, so the pid is the program's own.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Service:
    """A process with an HTTP API on its loopback (central, a node)."""

    proc: Proc
    state: Path

    def _client(self) -> ApiClient:
        return ApiClient(ApiTarget.from_state_dir(self.state))

    def _call(self, go: Callable[[], Any]) -> Any:
        host = self.proc.host
        return host.call(go) if host is not None else go()

    def http(
        self, method: str, path: str, body: Any = None, *, timeout: float = 5.0
    ) -> tuple[int, Any]:
        client = self._client()

        def go() -> tuple[int, Any]:
            resp = client.request(method, path, body, timeout=timeout)
            return resp.status, resp.body

        result: tuple[int, Any] = self._call(go)
        return result

    def text(self, path: str) -> str:
        """A plain-text GET (``/metrics``)."""
        client = self._client()

        def go() -> str:
            resp = client.request("GET", path, timeout=5)
            if resp.status != 200:
                raise ApiError(resp.status, resp.body, client.target.base_url + path)
            return str(resp.body)

        result: str = self._call(go)
        return result


@dataclass
class Run:
    scenario: str
    seed: int
    workdir: Path
    nodes: int = 3
    backend: str = ""
    sites: int = 0
    broker: str = "mosquitto"
    history: list[Submission] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # samples of node modes
    faults_done: list[dict[str, Any]] = field(default_factory=list)
    cut: set[str] = field(default_factory=set)
    started: float = 0.0
    started_wall: float = 0.0
    heals: list[dict[str, Any]] = field(default_factory=list)  # per heal: time to converge
    reboots: list[Reboot] = field(default_factory=list)
    bring_back: list[dict[str, Any]] = field(default_factory=list)  # per reboot: how long
    #: per member lost while its site was cut off: its replicas and where and when they ran
    #: again inside the site (site autonomy)
    site_restores: list[dict[str, Any]] = field(default_factory=list)
    #: site -> coordinating epoch -> the members seen acting at that epoch
    coordinators: dict[str, dict[int, set[str]]] = field(default_factory=dict)


class Harness:
    """Owns the processes and the links of one run (a context manager)."""

    def __init__(self, run: Run, backend: str, duration_s: float | None = None) -> None:
        self.run = run
        self.duration_s = duration_s
        self.backend = backend
        self.scenario = SCENARIOS[run.scenario]
        self.topo = Topology.of(run.nodes, run.sites)
        self.node_ids = list(self.topo.nodes)
        self.fabric: Fabric | None = None
        self.hosts: dict[str, Host] = {}
        self.proxies: dict[str, FaultProxy] = {}  # a node's, a site's WAN, central's own
        #: On NATS: a peer's proxies to the members after its first (its ``hosts``).
        self.alt_proxies: dict[str, list[FaultProxy]] = {}
        self.nats: NatsCluster | None = None
        self.brokers: dict[str, Proc] = {}  # "broker" (central's) and one per site
        self.central: Service | None = None
        self.services: dict[str, Service] = {}
        self.tidal = TidalWindow(0.0)
        self._measuring: list[asyncio.Task[None]] = []
        self._before_reboot: dict[str, dict[str, int]] = {}
        self._link_cut: set[str] = set()  # targets whose link a fault cut (not a power loss)

    @property
    def links(self) -> str:
        """How links are cut, for the report."""
        on = ""
        if self.run.broker == "nats":
            on = f", a {NATS_MEMBERS}-member NATS cluster"
            on += " (a member per namespace)" if self.fabric is not None else " on loopback"
        if self.fabric is None:
            return "fault proxy on every link" + on
        if any(n in self.proxies for n in self.node_ids):
            return "network namespaces (kernel faults) + a fault proxy on every node link" + on
        return "network namespaces (kernel faults)" + on

    async def __aenter__(self) -> Harness:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- start ---------------------------------------------------------------------------

    async def _start(self) -> None:
        wd = self.run.workdir
        wd.mkdir(parents=True, exist_ok=True)
        nats = self.run.broker == "nats"
        exe = mosquitto_path() if not nats else nats_binary()
        if exe is None:
            what = "nats-server (apt-get install nats-server)" if nats else "mosquitto"
            raise RuntimeError(f"{what} is not installed (make setup installs mosquitto)")
        tidal_at = self.scenario.tidal_at
        if tidal_at is None:
            tidal_at = (self.duration_s or self.scenario.duration_s) / 2
        self.tidal = TidalWindow(float(math.ceil(time.time() + STARTUP_S + tidal_at)))
        if self.backend == "netns":
            self.fabric = Fabric().__enter__()
            self.hosts["central"] = self.fabric.add_host("central")
            for i, site in enumerate(self.topo.sites, 1):
                self.fabric.add_bridge(f"lan{i}")
                self.hosts[site] = self.fabric.add_host(site, f"lan{i}")
                self.fabric.attach(site, "br0")
            for node in self.node_ids:
                home = self.topo.site_of(node)
                lan = "br0" if home is None else f"lan{self.topo.sites.index(home) + 1}"
                self.hosts[node] = self.fabric.add_host(node, lan)
            if nats:
                for i in range(1, NATS_MEMBERS + 1):
                    self.hosts[f"nats{i}"] = self.fabric.add_host(f"nats{i}")
        if nats:
            await self._start_nats()
            return
        central_addr = self._broker("broker", "central", exe, None)
        # Where each node's broker is: central's, or its site's (bridged over the WAN).
        node_broker: dict[str, tuple[str, int]] = {}
        for site in self.topo.sites:
            wan = central_addr
            if self.fabric is None:
                wan = await self._proxy(site, *central_addr)
            site_addr = self._broker(site, site, exe, wan)
            for node in self.topo.members(site):
                node_broker[node] = site_addr
        await asyncio.sleep(0.3)
        central_port = BROKER_PORT  # central reaches its broker on its own loopback
        if self.fabric is None:
            central_port = (await self._proxy("central", *central_addr))[1]
        self.central = self._service(
            "central", "central", [f"127.0.0.1:{central_port}"],
            {"central_id": "central", "failover_after_s": 4.0, "heartbeat_s": 0.5,
             "snapshot_s": 1.0, "cycle_s": 0.5},
        )  # fmt: skip
        for node in self.node_ids:
            host, port = node_broker.get(node, central_addr)
            if self.fabric is None or self.scenario.proxy_links:
                ns = None if self.fabric is None else self.hosts[node].ns
                host, port = await self._proxy(node, host, port, ns=ns)
            settings: dict[str, Any] = {"node_id": node, "lease_s": LEASE_S, "cycle_s": 0.2,
                                        "sample_s": 1.0, "stop_grace_s": 1.0}  # fmt: skip
            home = self.topo.site_of(node)
            if home is not None:
                settings["site"] = home
                if self.scenario.site_autonomy:
                    settings["site_peers"] = [p for p in self.topo.members(home) if p != node]
                    settings["site_failover_s"] = SITE_FAILOVER_S
                    settings["site_offer_after_s"] = SITE_OFFER_AFTER_S
            self.services[node] = self._service(node, "edge", [f"{host}:{port}"], settings)
        for service in [self.central, *self.services.values()]:
            await self._wait_up(service)

    async def _start_nats(self) -> None:
        """The NATS cluster (ready), then central on nats1 and gw-*i* on nats(*i* mod 3 + 1),
        each with the other members as ``hosts`` (through a fault proxy per member where
        the link is proxied, so a cut link cuts every address)."""
        root = self.run.workdir / "nats"
        shutil.rmtree(root, ignore_errors=True)  # no JetStream state of an earlier run
        root.mkdir()
        hosts = None
        if self.fabric is not None:
            hosts = [self.hosts[f"nats{i}"] for i in range(1, NATS_MEMBERS + 1)]
        members = build_members(root, NATS_MEMBERS, hosts=hosts, ack_wait=NATS_ACK_WAIT)
        self.nats = NatsCluster(members, root, self.fabric, self.hosts.get("central"))
        await asyncio.to_thread(start_all, self.nats, 40.0)

        def order(first: int) -> list[Member]:
            return [members[(first + k) % len(members)] for k in range(len(members))]

        async def addrs(name: str, first: int, ns: str | None, proxied: bool) -> list[str]:
            out = []
            for k, member in enumerate(order(first)):
                host, port = member.mqtt_host, member.mqtt_port
                if proxied:
                    proxy_name = name if k == 0 else f"{name}~{member.name}"
                    host, port = await self._proxy(proxy_name, host, port, ns=ns)
                    if k > 0:
                        self.alt_proxies.setdefault(name, []).append(self.proxies.pop(proxy_name))
                out.append(f"{host}:{port}")
            return out

        central = await addrs("central", 0, None, self.fabric is None)
        self.central = self._service(
            "central", "central", central, {"central_id": "central", "failover_after_s": 4.0,
             "heartbeat_s": 0.5, "snapshot_s": 1.0, "cycle_s": 0.5,
             "silent_after_s": NATS_SILENT_AFTER_S},
        )  # fmt: skip
        for i, node in enumerate(self.node_ids, 1):
            proxied = self.fabric is None or self.scenario.proxy_links
            ns = None if self.fabric is None else self.hosts[node].ns
            where = await addrs(node, i % len(members), ns, proxied)
            settings: dict[str, Any] = {"node_id": node, "lease_s": LEASE_S, "cycle_s": 0.2,
                                        "sample_s": 1.0, "stop_grace_s": 1.0}  # fmt: skip
            self.services[node] = self._service(node, "edge", where, settings)
        for service in [self.central, *self.services.values()]:
            await self._wait_up(service)

    def _broker(
        self, name: str, host: str, exe: str, bridge_to: tuple[str, int] | None
    ) -> tuple[str, int]:
        """Start a broker on ``host`` (bridged to ``bridge_to``); its address for its clients:
        the host's address on its first bridge (a site broker's: on its LAN), or loopback."""
        wd = self.run.workdir
        if self.fabric is not None:
            ip, port = self.hosts[host].ip, BROKER_PORT
            listeners = [("127.0.0.1", port), (ip, port)]
        else:
            ip, port = "127.0.0.1", free_port()
            listeners = [(ip, port)]
        persist = None
        if name == "broker" and self.scenario.broker_persistence:
            persist = wd / "mosquitto"
            persist.mkdir(exist_ok=True)
        bridge = None if bridge_to is None else (name, *bridge_to)
        conf = wd / f"{name}-mosquitto.conf"
        conf.write_text(broker_config(listeners, persistence_dir=persist, bridge=bridge))
        proc = Proc(name, [exe, "-c", str(conf)], wd / f"{name}.log", self.hosts.get(host))
        proc.start()
        self.brokers[name] = proc
        return ip, port

    async def _proxy(
        self, name: str, host: str, port: int, *, ns: str | None = None
    ) -> tuple[str, int]:
        """A fault proxy in front of ``host:port`` for ``name``'s link; its address. With
        ``ns`` it listens and connects inside that namespace (a node's, in the fabric)."""
        if ns is None:
            proxy = FaultProxy("127.0.0.1", 0, host, port)
        else:
            proxy = FaultProxy(
                "127.0.0.1", 0, host, port,
                listen_sock=await asyncio.to_thread(socket_in, ns),
                upstream_sock=lambda: socket_in(ns),
            )  # fmt: skip
        self.proxies[name] = await proxy.__aenter__()
        return "127.0.0.1", proxy.port

    def _service(
        self, name: str, tier: str, brokers: list[str], settings: dict[str, Any]
    ) -> Service:
        """Write ``name``'s config and start it. ``brokers``: ``"host:port"``, the first its
        broker, any others the members of a cluster to try in turn (``hosts``, MQTT 3.1.1)."""
        d = self.run.workdir / name
        d.mkdir(exist_ok=True)
        state = d / "state"
        section = "central" if tier == "central" else "edge"
        lines = [f"[{section}]", f'state_dir = "{state}"', "api_port = 0"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
        broker_host, port = brokers[0].rsplit(":", 1)
        lines += [f"[{section}.mqtt]", f'host = "{broker_host}"', f"port = {port}",
                  f"keepalive_s = {KEEPALIVE_S}", "reconnect_max_s = 1.0"]  # fmt: skip
        if self.run.broker == "nats":
            lines += [
                'protocol = "3.1.1"  # NATS refuses MQTT 5',
                f"hosts = {json.dumps(brokers[1:])}",
            ]
        if any(not b.startswith("127.0.0.1:") for b in brokers):
            lines.append("allow_plain_remote = true  # a lab network of the harness's own")
        lines += self.tidal.config_lines()
        config = d / f"{name}.toml"
        config.write_text("\n".join(lines) + "\n")
        argv = [_edgesched(), tier, "run", "-c", str(config)]
        proc = Proc(name, argv, d / f"{name}.log", self.hosts.get(name))
        proc.start()
        return Service(proc, state)

    async def _wait_up(self, service: Service, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if service.proc.proc is not None and service.proc.proc.poll() is not None:
                tail = service.proc.log.read_text()[-800:]
                raise RuntimeError(f"{service.proc.name} exited: {tail}")
            with contextlib.suppress(OSError, ValueError):
                if (await asyncio.to_thread(service.http, "GET", "/v1/health"))[0] == 200:
                    return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{service.proc.name} not up after {timeout}s")

    # --- faults --------------------------------------------------------------------------

    def cut_off(self, node: str) -> bool:
        """Whether ``node`` is cut off from central now (its link, central's, its site's)."""
        cut = self.run.cut
        return node in cut or "central" in cut or self.topo.site_of(node) in cut

    def nodes_of(self, target: str) -> list[str]:
        """The nodes a fault on ``target`` cuts off."""
        if target == "central":
            return list(self.node_ids)
        if target in self.topo.sites:
            return list(self.topo.members(target))
        return [target] if target in self.services else []

    async def apply(self, fault: Fault) -> None:
        target, action = fault.target, fault.action
        if action in _LINK_ACTIONS:
            self._link(target, action, fault.arg)
        elif action == "kill":
            self.services[target].proc.signal(signal.SIGKILL)
        elif action == "reboot":
            await self._power_loss(target)
        elif action == "burst":
            await self._burst(target, int(fault.arg or 1))
        elif action == "services":
            await self._services(target)
        elif action == "restart":
            await self._restart(target)
        elif action == "skew":
            self.services[target].proc.env[SKEW_ENV] = repr(fault.arg or 0.0)
        elif action in ("stop", "cont"):
            sig = signal.SIGSTOP if action == "stop" else signal.SIGCONT
            self.services[target].proc.signal(sig)
        elif action == "broker-restart" and self.nats is not None:
            member = self.nats.members[0]  # central's
            await asyncio.to_thread(member.stop)
            await asyncio.sleep(0.5)
            member.start()
        elif action == "broker-restart":
            broker = self.brokers["broker"]
            await asyncio.to_thread(broker.stop)
            await asyncio.sleep(0.5)
            broker.start()
        if action in _LINK_ACTIONS and action != "heal":
            self._link_cut.add(target)
        elif action == "heal":
            self._link_cut.discard(target)
        if action in BREAKS:
            self.run.cut.add(target)
        elif action in ("heal", "cont"):
            self.run.cut.discard(target)
            self._measuring.append(asyncio.create_task(self._time_to_converge(target)))
        elif action == "restart" and target not in self._link_cut:
            self.run.cut.discard(target)  # it lost power only: booted, it is back
        self.run.faults_done.append({**fault.to_json(), "done_at": self._t()})

    async def _power_loss(self, node: str) -> None:
        """The node's engine and every task process it started die at once."""
        service = self.services[node]
        before: dict[str, int] = {}
        replicas: list[str] = []
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            rows = (await asyncio.to_thread(service.http, "GET", "/v1/tasks"))[1]
            before = {r["id"]: r["pid"] for r in rows if r["state"] == "running" and r["pid"]}
            replicas = [r["id"] for r in rows if r["state"] == "running"
                        and r["spec"].get("restart") == "always"]  # fmt: skip
        service.proc.signal(signal.SIGKILL)
        kill_leftovers([service.state / "run"])
        self._before_reboot[node] = before
        site = self.topo.site_of(node)
        if self.scenario.site_autonomy and site is not None and site in self.run.cut and replicas:
            self._measuring.append(asyncio.create_task(self._site_restore(node, site, replicas)))

    async def _site_restore(self, node: str, site: str, replicas: list[str]) -> None:
        """After a member of a cut-off site lost power: poll its site peers until each of its
        service replicas runs on one of them (site autonomy), while the site is still cut."""
        peers = [p for p in self.topo.members(site) if p != node]
        start = time.monotonic()
        record: dict[str, Any] = {"node": node, "site": site, "at": self._t(),
                                  "replicas": sorted(replicas), "restored": {},
                                  "seconds": None, "healed_first": False}  # fmt: skip
        self.run.site_restores.append(record)
        while time.monotonic() - start < SITE_RESTORE_LIMIT_S + 10.0:
            if site not in self.run.cut:
                record["healed_first"] = True
                return
            for peer in peers:
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                    rows = (await asyncio.to_thread(self.services[peer].http, "GET",
                                                    "/v1/tasks", timeout=1.0))[1]  # fmt: skip
                    for r in rows:
                        if r["id"] in replicas and r["state"] == "running":
                            record["restored"].setdefault(r["id"], peer)
            if set(record["restored"]) == set(replicas):
                record["seconds"] = round(time.monotonic() - start, 3)
                return
            await asyncio.sleep(0.25)

    async def _services(self, site: str) -> None:
        """A restart-always service at central pinned to each member of ``site``."""
        central = self.central
        assert central is not None
        for node in self.topo.members(site):
            task_id = f"svc-{node}"
            body = {"id": task_id, "command": ["sleep", "600"], "cpu": 0.1, "mem_gib": 0.05,
                    "restart": "always", "workload": "service", "priority": 50,
                    "node": node}  # fmt: skip
            at = time.monotonic() - self.run.started
            try:
                status, _ = await asyncio.to_thread(central.http, "POST", "/v1/tasks", body)
                acked = status == 201
            except (OSError, ValueError):
                acked = False
            self.run.history.append(Submission(at, task_id, "central", acked))

    async def _burst(self, node: str, count: int) -> None:
        """``count`` submissions to ``node`` at once, each asking most of a core: more than one
        node has room for (site autonomy places the rest on its site peers)."""
        service = self.services[node]
        cut = self.cut_off(node)
        for i in range(count):
            task_id = f"{node}-burst-{len(self.run.history)}-{i}"
            body = {"id": task_id, "command": ["sleep", "30"], "cpu": 0.9, "mem_gib": 0.05,
                    "restart": "never", "workload": "burst"}  # fmt: skip
            at = time.monotonic() - self.run.started
            try:
                status, _ = await asyncio.to_thread(service.http, "POST", "/v1/tasks", body)
                acked = status == 201
            except (OSError, ValueError):
                acked = False
            self.run.history.append(Submission(at, task_id, node, acked, while_cut=cut))

    async def _restart(self, node: str) -> None:
        service = self.services[node]
        if service.proc.proc is not None:
            await asyncio.to_thread(service.proc.proc.wait, 10)
        with contextlib.suppress(FileNotFoundError):
            (service.state / "api-port").unlink()
        service.proc.start()
        await self._wait_up(service)
        before = self._before_reboot.pop(node, None)
        if before is not None:
            self._measuring.append(asyncio.create_task(self._bring_back(node, before)))

    async def _bring_back(self, node: str, before: dict[str, int]) -> None:
        """After a boot that followed a power loss: poll for BRING_BACK_S until every task that
        was running has been seen back (see :func:`edgesched.fieldtest.checker.brought_back`)
        at least once: a restart-always task may be back, exit and wait its backoff again
        between two polls."""
        service = self.services[node]
        start = time.monotonic()
        seen: dict[str, tuple[str, int | None]] = {}  # the first sighting back, else the last
        back: set[str] = set()
        record: dict[str, Any] = {"node": node, "booted_at": self._t(), "tasks": len(before),
                                  "seconds": None, "still_cut": None}  # fmt: skip
        self.run.bring_back.append(record)
        while time.monotonic() - start < BRING_BACK_S:
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                rows = (await asyncio.to_thread(service.http, "GET", "/v1/tasks"))[1]
                for r in rows:
                    task_id = r["id"]
                    if task_id in before and task_id not in back:
                        seen[task_id] = (r["state"], r["pid"])
                        one = Reboot(node, {task_id: before[task_id]}, seen)
                        if not brought_back(one):
                            back.add(task_id)  # keep this sighting
                if back == set(before):
                    record["seconds"] = round(time.monotonic() - start, 3)
                    record["still_cut"] = self.cut_off(node)
                    break
            await asyncio.sleep(0.25)
        self.run.reboots.append(Reboot(node, before, seen))

    async def _time_to_converge(self, target: str, limit: float = 30.0) -> None:
        """From a heal until central's replica of the node(s) equals the node's own; cut short
        (``interrupted``) when one of them is cut off again first, as a flapping link is."""
        # (a site's member that lost power and has not booted yet is not part of its heal)
        nodes = [n for n in self.nodes_of(target) if n == target or n not in self.run.cut]
        assert self.central is not None
        central = self.central
        start = time.monotonic()
        record: dict[str, Any] = {"target": target, "healed_at": self._t(), "seconds": None,
                                  "interrupted": None}  # fmt: skip
        if not nodes:
            return
        self.run.heals.append(record)
        while time.monotonic() - start < limit:
            if any(self.cut_off(n) for n in nodes):
                record["interrupted"] = round(time.monotonic() - start, 3)
                return
            try:
                same = True
                for node in nodes:
                    status = (await asyncio.to_thread(self.services[node].http, "GET",
                                                       "/v1/status"))[1]  # fmt: skip
                    code, replica = await asyncio.to_thread(
                        central.http, "GET", f"/v1/nodes/{node}"
                    )
                    mine = status["document"]["content_hash"]
                    same = same and code == 200 and replica["document"]["content_hash"] == mine
                if same:
                    record["seconds"] = round(time.monotonic() - start, 3)
                    return
            except (OSError, ValueError, KeyError, TypeError):
                pass
            await asyncio.sleep(0.1)

    def _link(self, target: str, action: str, arg: float | None = None) -> None:
        if target in self.topo.sites:  # the site broker's WAN link (its LAN stays up)
            if self.fabric is not None:
                if action == "heal":
                    self.fabric.heal(target)
                else:
                    self.fabric.isolate(target, "br0")
            elif action == "heal":
                self.proxies[target].heal()
            else:
                self.proxies[target].blackhole()
            return
        if self.fabric is not None and action != "latency":
            # Central's host on NATS: central and its member (a partition of the member).
            for host in [target, *(["nats1"] if target == "central" and self.nats else [])]:
                if action in ("isolate", "wan-cut"):
                    self.fabric.isolate(host)
                elif action == "heal":
                    self.fabric.heal(host)
                elif action == "reset":
                    self.fabric.reset_tcp(host)
                elif action == "throttle":
                    self.fabric.limit(host, "64kbit")
                else:
                    self.fabric.one_way(host, "in" if action == "drop-in" else "out")
            if action != "heal":
                return
        for proxy in self._proxies_of(target):
            # The proxy sits between the host and its broker: c2s is what the host sends.
            if action in ("isolate", "wan-cut"):
                proxy.blackhole()
            elif action == "heal":
                proxy.heal()
                proxy.set_bandwidth(None)
                proxy.set_latency(0.0)
            elif action == "reset":
                proxy.cut()  # resets every connection and refuses new ones until healed
            elif action == "throttle":
                proxy.set_bandwidth(8_000)  # 64 kbit/s
            elif action == "latency":
                proxy.set_latency(arg or 0.0, jitter=arg or 0.0)
            else:
                proxy.one_way("c2s" if action == "drop-in" else "s2c")

    def _proxies_of(self, target: str) -> list[FaultProxy]:
        """The proxies on ``target``'s link: to its broker, and on NATS to every member."""
        if target != "central":
            names = [target]
        elif self.fabric is not None:
            return []  # central's host is cut by the kernel
        else:
            # Cutting central's host cuts every link to its broker, central's own included:
            # the nodes' (no sites) or the site brokers' WAN links.
            names = ["central", *(self.topo.sites or self.node_ids)]
        out = [self.proxies[n] for n in names if n in self.proxies]
        return out + [p for n in names for p in self.alt_proxies.get(n, [])]

    async def heal_all(self) -> None:
        for name in [*self.node_ids, *self.topo.sites, "central"]:
            with contextlib.suppress(Exception):
                self._link(name, "heal")
        for service in self.services.values():
            service.proc.signal(signal.SIGCONT)
        self.run.cut.clear()

    def _t(self) -> float:
        return round(time.monotonic() - self.run.started, 3)

    # --- teardown ------------------------------------------------------------------------

    async def close(self) -> None:
        for task in self._measuring:
            task.cancel()
        await asyncio.gather(*self._measuring, return_exceptions=True)
        for service in self.services.values():
            await asyncio.to_thread(service.proc.stop)
        if self.central is not None:
            await asyncio.to_thread(self.central.proc.stop)
        for broker in reversed(list(self.brokers.values())):
            await asyncio.to_thread(broker.stop)
        if self.nats is not None:
            await asyncio.to_thread(self.nats.stop)
        for proxy in [*self.proxies.values(), *(p for ps in self.alt_proxies.values() for p in ps)]:
            await proxy.__aexit__(None, None, None)
        if self.fabric is not None:
            self.fabric.close()
        kill_leftovers([s.state / "run" for s in self.services.values()])


# --- the run -------------------------------------------------------------------------------


async def _watch(harness: Harness, until: float) -> None:
    """Sample every node's mode, and central's view of every node, twice a second: all at
    once, each given a second (a frozen or rebooting node is ``unreachable``, not a gap)."""
    assert harness.central is not None
    central = harness.central

    async def mode(service: Service) -> str:
        try:
            status = (await asyncio.to_thread(service.http, "GET", "/v1/status", timeout=1.0))[1]
            site = status.get("site_autonomy") or {}
            acting = site.get("coordinating")
            if acting is not None:  # (one coordinator per site and epoch: the checker's)
                epochs = harness.run.coordinators.setdefault(str(status["site"]), {})
                epochs.setdefault(int(acting["epoch"]), set()).add(str(status["node"]))
            return str(status["mode"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return "unreachable"

    async def view() -> dict[str, str]:
        try:
            seen = (await asyncio.to_thread(central.http, "GET", "/v1/nodes", timeout=1.0))[1]
            return {n["id"]: n["state"] for n in seen["nodes"]}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    while time.monotonic() < until:
        sample: dict[str, Any] = {"t": round(time.monotonic() - harness.run.started, 2)}
        nodes = list(harness.services)
        *modes, seen = await asyncio.gather(*(mode(harness.services[n]) for n in nodes), view())
        sample.update(zip(nodes, modes, strict=True))
        sample["central_view"] = seen
        sample["cut"] = sorted(harness.run.cut)
        harness.run.timeline.append(sample)
        await asyncio.sleep(0.5)


async def _final_state(harness: Harness) -> FinalState:
    assert harness.central is not None
    central = harness.central
    node_hashes, replica_hashes, node_tasks, replica_tasks = {}, {}, {}, {}
    for node, service in harness.services.items():
        status = (await asyncio.to_thread(service.http, "GET", "/v1/status"))[1]
        node_hashes[node] = status["document"]["content_hash"]
        rows = (await asyncio.to_thread(service.http, "GET", "/v1/tasks"))[1]
        node_tasks[node] = {r["id"]: r for r in rows}
        code, detail = await asyncio.to_thread(central.http, "GET", f"/v1/nodes/{node}")
        if code == 200:
            replica_hashes[node] = detail["document"]["content_hash"]
            replica_tasks[node] = detail["content"].get("tasks", {})
    # (central placed these; the ones nodes decided are in node_tasks)
    url = "/v1/tasks?origin=central&limit=10000"
    tasks = (await asyncio.to_thread(central.http, "GET", url))[1]["tasks"]
    return FinalState(
        node_hashes, replica_hashes, node_tasks, replica_tasks, {t["id"]: t for t in tasks}
    )


async def _settled_state(harness: Harness, limit: float = 10.0) -> FinalState:
    """The final state, read again (briefly) while a node's document and central's replica
    of it differ, or an assignment of central's has not reached its node. Tasks keep finishing
    after the workload stops (and central keeps placing what waited), so a read that catches
    an update on its way is no divergence; one that lasts is."""
    deadline = time.monotonic() + limit
    while True:
        final = await _final_state(harness)
        same = all(final.replica_hashes.get(n) == h for n, h in final.node_hashes.items())
        if (same and not undelivered(final)) or time.monotonic() > deadline:
            return final
        await asyncio.sleep(0.25)


async def _converged(harness: Harness) -> bool:
    final = await _final_state(harness)
    same = all(final.replica_hashes.get(n) == h for n, h in final.node_hashes.items())
    running: dict[str, int] = {}
    for tasks in final.node_tasks.values():
        for task_id, record in tasks.items():
            if record.get("decided_by") == "central" and record.get("state") in (
                "accepted", "placed", "running",
            ):  # fmt: skip
                running[task_id] = running.get(task_id, 0) + 1
    return same and all(v == 1 for v in running.values())


def _preemptions(workdir: Path, nodes: list[str]) -> dict[str, dict[str, int]]:
    """Each node's preemptions over the whole run, read from its SQLite decision log once it
    stopped: how many, how many it decided while autonomous, and how many gave a tidal class
    its share back (the preemptor's effective priority boosted above every plain one)."""
    counts: dict[str, dict[str, int]] = {}
    for node in nodes:
        db = workdir / node / "state" / "edge.db"
        row = {"total": 0, "autonomous": 0, "tidal": 0}
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
                rows = con.execute("SELECT source, body FROM decisions WHERE kind = 'preempt'")
                for source, body in rows:
                    row["total"] += 1
                    row["autonomous"] += source == "edge-autonomous"
                    found = re.search(r"effective priority \d+ < (\d+)", body)
                    row["tidal"] += bool(found and int(found.group(1)) > MAX_PRIORITY)
        except sqlite3.Error:
            continue  # the store's layout changed: the report goes without it
        counts[node] = row
    return counts


def _skew_effects(harness: Harness, final: FinalState) -> dict[str, dict[str, Any]]:
    """For every node started with a skewed clock: its offset, the offset measured in its
    records (local submissions' ``submitted_at`` against the harness's clock when it sent
    them, the median), and when it and the fleet saw the tidal window open."""
    out: dict[str, dict[str, Any]] = {}
    started = harness.run.started_wall
    for node, service in harness.services.items():
        raw = service.proc.env.get(SKEW_ENV)
        if raw is None:
            continue
        skew = float(raw)
        rows = final.node_tasks.get(node, {})
        offsets = sorted(
            float(rows[s.task_id]["submitted_at"]) - (started + s.at)
            for s in harness.run.history
            if s.where == node and s.acknowledged and s.task_id in rows
        )
        out[node] = {
            "skew_s": round(skew, 1),
            "records_offset_s": round(offsets[len(offsets) // 2], 1) if offsets else None,
            "window_opened_for_fleet_at_s": round(harness.tidal.opens_at - started, 2),
            "window_opened_for_node_at_s": round(harness.tidal.opens_at - skew - started, 2),
        }
    return out


#: Faults that cut a link (not only slow it), whose target central should see go away.
_CUTS = frozenset({"isolate", "drop-out", "stop", "kill", "reboot", "reset", "wan-cut"})


def _central_view(harness: Harness) -> list[dict[str, Any]]:
    """For every cut: what central called the nodes it cut off meanwhile, and whether it was
    expected to notice: the cut outlasted :data:`NODE_DETECT_S` on a node's link, or
    :data:`SITE_DETECT_S` on a site's WAN link. A WAN cut leaves the site's nodes' retained
    status online at central, so central notices nothing of it today."""
    views: list[dict[str, Any]] = []
    open_: dict[str, float] = {}
    for fault in harness.run.faults_done:
        target, at = fault["target"], fault["done_at"]
        if fault["action"] in _CUTS and target not in open_:
            open_[target] = at
        elif fault["action"] in ("heal", "cont") and target in open_:
            start = open_.pop(target)
            nodes = harness.nodes_of(target)
            states: dict[str, list[str]] = {n: [] for n in nodes}
            for sample in harness.run.timeline:
                if start <= sample["t"] <= at:
                    for n in nodes:
                        state = sample.get("central_view", {}).get(n)
                        if state is not None and state not in states[n]:
                            states[n].append(state)
            detect = SITE_DETECT_S if target in harness.topo.sites else NODE_DETECT_S
            noticed = all(any(s != "connected" for s in v) for v in states.values())
            views.append({"target": target, "from": start, "to": at, "states": states,
                          "noticed": noticed, "expected": at - start > detect})  # fmt: skip
    return views


def choose_backend(requested: str = "auto") -> str:
    if requested == "netns" or (requested == "auto" and available() is None):
        why = available()
        if why is not None:
            raise RuntimeError(f"netns backend unavailable: {why}")
        return "netns"
    return "proxy"


async def run_scenario(
    scenario: str,
    seed: int,
    workdir: Path,
    *,
    nodes: int = 3,
    sites: int | None = None,
    backend: str = "auto",
    broker: str = "mosquitto",
    duration_s: float | None = None,
    quiet_timeout_s: float = 30.0,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Run it; return the report (also written to ``workdir/report.json``). ``sites``: bridged
    site brokers (default: as many as the scenario needs); ``duration_s``: a soak's length;
    ``broker``: ``mosquitto`` or ``nats`` (a three-member cluster; no sites)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; see `edgesched fieldtest list`")
    spec = SCENARIOS[scenario]
    nodes = max(nodes, spec.min_nodes)
    sites = spec.sites if sites is None else sites
    if sites < spec.sites:
        raise ValueError(f"{scenario} needs at least {spec.sites} site(s), got {sites}")
    if sites > nodes:
        raise ValueError(f"{sites} sites need at least as many nodes, got {nodes}")
    if duration_s is not None and not spec.soak:
        raise ValueError("--duration applies to the soak only")
    if broker not in BROKERS:
        raise ValueError(f"unknown broker {broker!r}: one of {', '.join(BROKERS)}")
    if broker == "nats" and sites:
        raise ValueError(
            f"{scenario}: sites are Mosquitto bridges; on NATS (leaf nodes, not tried) "
            "run a scenario without sites"
        )
    chosen = choose_backend(backend)
    run = Run(scenario, seed, workdir, nodes, chosen, sites, broker)
    rng = random.Random(seed)
    async with Harness(run, chosen, duration_s) as harness:
        duration = duration_s or spec.duration_s
        schedule = schedule_for(scenario, seed, harness.topo, duration_s)
        progress(
            f"{scenario} seed {seed} on {chosen} ({harness.links}), {sites} site(s): "
            f"{len(schedule)} faults over {duration:g}s"
        )
        run.started = time.monotonic()
        run.started_wall = time.time()
        end = run.started + duration + 2.0
        async with asyncio.TaskGroup() as group:
            group.create_task(
                submit_loop(
                    rng, harness.services, _need(harness.central), until=end,
                    started=run.started, cut_off=harness.cut_off, history=run.history,
                    pace=spec.pace,
                )
            )  # fmt: skip
            watch = group.create_task(_watch(harness, end + quiet_timeout_s))
            for fault in schedule:
                await asyncio.sleep(max(0.0, run.started + fault.at - time.monotonic()))
                arg = "" if fault.arg is None else f" {fault.arg:g}"
                progress(f"t={fault.at:6.2f}s {fault.action} {fault.target}{arg}")
                await harness.apply(fault)
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            await harness.heal_all()
            healed_at = time.monotonic()
            converge_s: float | None = None
            while time.monotonic() - healed_at < quiet_timeout_s:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    if await _converged(harness):
                        converge_s = round(time.monotonic() - healed_at, 3)
                        break
                await asyncio.sleep(0.25)
            final = await _settled_state(harness)
            await asyncio.gather(*harness._measuring, return_exceptions=True)
            watch.cancel()  # the timeline ends when the run is judged
        verdict: Verdict = check(
            run.history, final, run.reboots, site_restores=run.site_restores,
            coordinators=run.coordinators, restore_limit_s=SITE_RESTORE_LIMIT_S,
        )  # fmt: skip
        heal_times = [h["seconds"] for h in run.heals if h["interrupted"] is None]
        extra = {
            "links": harness.links,
            "topology": {"sites": list(harness.topo.sites),
                         "site_of": {n: harness.topo.site_of(n) for n in harness.node_ids}},
            "tidal_window_opens_at_s": round(harness.tidal.opens_at - run.started_wall, 2),
            "skew": _skew_effects(harness, final),
            "central_view": _central_view(harness),
        }  # fmt: skip
    extra["preemptions"] = _preemptions(workdir, harness.node_ids)
    report = {
        "scenario": scenario,
        "seed": seed,
        "backend": chosen,
        "broker": broker,
        "nodes": harness.node_ids,
        **extra,
        "duration_s": duration,
        "schedule": [f.to_json() for f in schedule],
        "faults": run.faults_done,
        "converged_after_heal_s": converge_s,
        "heals": run.heals,
        "max_heal_convergence_s": max((t for t in heal_times if t is not None), default=None),
        "reboots": run.bring_back,
        "site_restores": run.site_restores,
        "coordinators": {
            site: {str(e): sorted(n) for e, n in sorted(epochs.items())}
            for site, epochs in sorted(run.coordinators.items())
        },
        "verdict": verdict.to_json(),
        "ok": verdict.ok and converge_s is not None and None not in heal_times,
        "submissions": len(run.history),
        "timeline": run.timeline,
    }
    (workdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _need(service: Service | None) -> Service:
    assert service is not None
    return service
