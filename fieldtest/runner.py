"""Run one field-test scenario against real processes and judge it.

A broker (Mosquitto), central and N edge nodes run as separate processes. With root they live
in network namespaces (:mod:`.netns`: the kernel cuts links); without root every link to the
broker goes through a :class:`~edgesched.fieldtest.faultproxy.FaultProxy`. The report says
which was used. A workload submits tasks at central and locally at nodes throughout, the
seeded fault schedule runs, everything is healed, and after a quiet period the harness reads
the final state and :func:`edgesched.fieldtest.checker.check` gives the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesched.edge.executor import kill_leftovers
from edgesched.fieldtest.checker import FinalState, Submission, Verdict, check
from edgesched.fieldtest.faultproxy import FaultProxy
from edgesched.fieldtest.netns import Fabric, Host, available
from edgesched.fieldtest.scenarios import SCENARIOS, Fault, schedule_for
from edgesched.localbroker import mosquitto_path
from edgesched.ports import free_port

KEEPALIVE_S = 2
LEASE_S = 2.0


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

    def start(self) -> None:
        with self.log.open("ab") as out:
            if self.host is not None:
                self.proc = self.host.popen(self.argv, log=out)
            else:
                self.proc = subprocess.Popen(self.argv, stdout=out, stderr=out)

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

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        token = (self.state / "api-token").read_text().strip()
        port = int((self.state / "api-port").read_text())
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )

        def go() -> tuple[int, Any]:
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read() or b"null")

        host = self.proc.host
        return host.call(go) if host is not None else go()


@dataclass
class Run:
    scenario: str
    seed: int
    workdir: Path
    nodes: int = 3
    backend: str = ""
    history: list[Submission] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # samples of node modes
    faults_done: list[dict[str, Any]] = field(default_factory=list)
    cut: set[str] = field(default_factory=set)
    started: float = 0.0
    heals: list[dict[str, Any]] = field(default_factory=list)  # per heal: time to converge


class Harness:
    """Owns the processes and the links of one run (a context manager)."""

    def __init__(self, run: Run, backend: str) -> None:
        self.run = run
        self.backend = backend
        self.node_ids = [f"gw-{i}" for i in range(1, run.nodes + 1)]
        self.fabric: Fabric | None = None
        self.hosts: dict[str, Host] = {}
        self.proxies: dict[str, FaultProxy] = {}
        self.broker: Proc | None = None
        self.central: Service | None = None
        self.services: dict[str, Service] = {}
        self.broker_port = 1883
        self._measuring: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Harness:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _start(self) -> None:
        wd = self.run.workdir
        wd.mkdir(parents=True, exist_ok=True)
        exe = mosquitto_path()
        if exe is None:
            raise RuntimeError("mosquitto is not installed (make setup installs it)")
        central_ip = "127.0.0.1"
        if self.backend == "netns":
            self.fabric = Fabric().__enter__()
            self.hosts["central"] = self.fabric.add_host("central")
            for node in self.node_ids:
                self.hosts[node] = self.fabric.add_host(node)
            central_ip = self.hosts["central"].ip
        else:
            self.broker_port = free_port()
        conf = wd / "mosquitto.conf"
        listeners = [f"listener {self.broker_port} 127.0.0.1"]
        if central_ip != "127.0.0.1":
            listeners.append(f"listener {self.broker_port} {central_ip}")
        root = ["user root"] if os.geteuid() == 0 else []
        persistence = ["persistence false"]
        if SCENARIOS[self.run.scenario].broker_persistence:
            (wd / "mosquitto").mkdir(exist_ok=True)
            persistence = ["persistence true", f"persistence_location {wd / 'mosquitto'}/"]
        conf.write_text(
            "\n".join([*listeners, "allow_anonymous true", *persistence,
                       "log_dest stderr", *root]) + "\n"
        )  # fmt: skip
        self.broker = Proc("broker", [exe, "-c", str(conf)], wd / "broker.log",
                           self.hosts.get("central"))  # fmt: skip
        self.broker.start()
        await asyncio.sleep(0.3)
        central_port = self.broker_port
        if self.backend == "proxy":
            proxy = FaultProxy("127.0.0.1", 0, "127.0.0.1", self.broker_port)
            self.proxies["central"] = await proxy.__aenter__()
            central_port = proxy.port
        self.central = self._service(
            "central", "central", central_port, "127.0.0.1",
            {"central_id": "central", "failover_after_s": 4.0, "heartbeat_s": 0.5,
             "snapshot_s": 1.0, "cycle_s": 0.5},
        )  # fmt: skip
        for node in self.node_ids:
            port = self.broker_port
            if self.backend == "proxy":
                proxy = FaultProxy("127.0.0.1", 0, "127.0.0.1", self.broker_port)
                self.proxies[node] = await proxy.__aenter__()
                port = proxy.port
            self.services[node] = self._service(
                node, "edge", port, central_ip,
                {"node_id": node, "lease_s": LEASE_S, "cycle_s": 0.2, "sample_s": 1.0,
                 "stop_grace_s": 1.0},
            )  # fmt: skip
        for service in [self.central, *self.services.values()]:
            await self._wait_up(service)

    def _service(
        self, name: str, tier: str, port: int, broker_host: str, settings: dict[str, Any]
    ) -> Service:
        d = self.run.workdir / name
        d.mkdir(exist_ok=True)
        state = d / "state"
        section = "central" if tier == "central" else "edge"
        lines = [f"[{section}]", f'state_dir = "{state}"', "api_port = 0"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
        lines += [f"[{section}.mqtt]", f'host = "{broker_host}"', f"port = {port}",
                  f"keepalive_s = {KEEPALIVE_S}", "reconnect_max_s = 1.0"]  # fmt: skip
        if broker_host != "127.0.0.1":
            lines.append("allow_plain_remote = true  # a lab network of the harness's own")
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

    async def apply(self, fault: Fault) -> None:
        target, action = fault.target, fault.action
        if action in ("isolate", "drop-in", "drop-out", "heal", "reset", "throttle"):
            self._link(target, action)
        elif action == "kill":
            self.services[target].proc.signal(signal.SIGKILL)
        elif action == "restart":
            service = self.services[target]
            if service.proc.proc is not None:
                service.proc.proc.wait(10)
            with contextlib.suppress(FileNotFoundError):
                (service.state / "api-port").unlink()
            service.proc.start()
            await self._wait_up(service)
        elif action in ("stop", "cont"):
            sig = signal.SIGSTOP if action == "stop" else signal.SIGCONT
            self.services[target].proc.signal(sig)
        elif action == "broker-restart":
            assert self.broker is not None
            self.broker.stop()
            await asyncio.sleep(0.5)
            self.broker.start()
        if action in ("isolate", "drop-in", "drop-out", "stop", "kill", "reset"):
            self.run.cut.add(target)
        elif action in ("heal", "cont"):
            self.run.cut.discard(target)
            self._measuring.append(asyncio.create_task(self._time_to_converge(target)))
        self.run.faults_done.append({**fault.to_json(), "done_at": self._t()})

    async def _time_to_converge(self, target: str, limit: float = 30.0) -> None:
        """From a heal until central's replica of the node(s) equals the node's own."""
        nodes = self.node_ids if target == "central" else [target]
        assert self.central is not None
        central = self.central
        start = time.monotonic()
        record: dict[str, Any] = {"target": target, "healed_at": self._t(), "seconds": None}
        self.run.heals.append(record)
        while time.monotonic() - start < limit:
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

    def _link(self, target: str, action: str) -> None:
        if self.fabric is not None:
            if action == "isolate":
                self.fabric.isolate(target)
            elif action == "heal":
                self.fabric.heal(target)
            elif action == "reset":
                self.fabric.reset_tcp(target)
            elif action == "throttle":
                self.fabric.limit(target, "64kbit")
            else:
                self.fabric.one_way(target, "in" if action == "drop-in" else "out")
            return
        # The proxy sits between the host and the broker: c2s is what the host sends.
        # Cutting central's host cuts every link to the broker, central's own included.
        proxies = list(self.proxies.values()) if target == "central" else [self.proxies[target]]
        for proxy in proxies:
            if action == "isolate":
                proxy.blackhole()
            elif action == "heal":
                proxy.heal()
                proxy.set_bandwidth(None)
            elif action == "reset":
                proxy.cut()  # resets every connection and refuses new ones until healed
            elif action == "throttle":
                proxy.set_bandwidth(8_000)  # 64 kbit/s
            else:
                proxy.one_way("c2s" if action == "drop-in" else "s2c")

    async def heal_all(self) -> None:
        for name in [*self.node_ids, "central"]:
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
        if self.broker is not None:
            await asyncio.to_thread(self.broker.stop)
        for proxy in self.proxies.values():
            await proxy.__aexit__(None, None, None)
        if self.fabric is not None:
            self.fabric.close()
        kill_leftovers([s.state / "run" for s in self.services.values()])


# --- the run -------------------------------------------------------------------------------


async def _workload(harness: Harness, rng: random.Random, until: float) -> None:
    """Submit a task every ~0.4 s: locally at a node (it decides, cut off or not) or at
    central (a service or a batch job)."""
    n = 0
    while time.monotonic() < until:
        n += 1
        seconds = rng.choice([2, 5, 10, 60])
        body: dict[str, Any] = {"command": ["sleep", str(seconds)], "cpu": 0.05,
                                "mem_gib": 0.05, "priority": rng.randint(10, 90)}  # fmt: skip
        if rng.random() < 0.6:
            where = rng.choice(harness.node_ids)
            service = harness.services[where]
            task_id = f"{where}-local-{n}"
        else:
            where = "central"
            assert harness.central is not None
            service = harness.central
            task_id = f"central-{n}"
            body["restart"] = "always" if rng.random() < 0.4 else "never"
        body["id"] = task_id
        # Cutting central's host cuts every node off from it, so a node decides alone then.
        cut = where in harness.run.cut or (where != "central" and "central" in harness.run.cut)
        at = time.monotonic() - harness.run.started
        try:
            status, _ = await asyncio.to_thread(service.http, "POST", "/v1/tasks", body)
            acked = status == 201
        except (OSError, ValueError):
            acked = False  # a frozen (SIGSTOPped) or restarting node: unknown outcome
        harness.run.history.append(Submission(at, task_id, where, acked, while_cut=cut))
        await asyncio.sleep(rng.uniform(0.2, 0.6))


async def _watch(harness: Harness, until: float) -> None:
    """Sample every node's mode twice a second for the timeline."""
    while time.monotonic() < until:
        sample: dict[str, Any] = {"t": round(time.monotonic() - harness.run.started, 2)}
        for node, service in harness.services.items():
            try:
                status = (await asyncio.to_thread(service.http, "GET", "/v1/status"))[1]
                sample[node] = status["mode"]
            except (OSError, ValueError, KeyError, TypeError):
                sample[node] = "unreachable"
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
    tasks = (await asyncio.to_thread(central.http, "GET", "/v1/tasks"))[1]["tasks"]
    return FinalState(
        node_hashes, replica_hashes, node_tasks, replica_tasks, {t["id"]: t for t in tasks}
    )


async def _settled_state(harness: Harness, limit: float = 10.0) -> FinalState:
    """The final state, read again (briefly) while a node's document and central's replica
    of it differ. Tasks keep finishing after the workload stops, so a read that catches a node
    between an update and its arrival at central is no divergence; one that lasts is."""
    deadline = time.monotonic() + limit
    while True:
        final = await _final_state(harness)
        same = all(final.replica_hashes.get(n) == h for n, h in final.node_hashes.items())
        if same or time.monotonic() > deadline:
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
    backend: str = "auto",
    quiet_timeout_s: float = 30.0,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Run it; return the report (also written to ``workdir/report.json``)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; see `edgesched fieldtest list`")
    chosen = choose_backend(backend)
    run = Run(scenario, seed, workdir, nodes, chosen)
    rng = random.Random(seed)
    async with Harness(run, chosen) as harness:
        schedule = schedule_for(scenario, seed, harness.node_ids)
        duration = SCENARIOS[scenario].duration_s
        progress(f"{scenario} seed {seed} on {chosen}: {len(schedule)} faults over {duration:g}s")
        run.started = time.monotonic()
        end = run.started + duration + 2.0
        async with asyncio.TaskGroup() as group:
            group.create_task(_workload(harness, rng, end))
            watch = group.create_task(_watch(harness, end + quiet_timeout_s))
            for fault in schedule:
                await asyncio.sleep(max(0.0, run.started + fault.at - time.monotonic()))
                progress(f"t={fault.at:6.2f}s {fault.action} {fault.target}")
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
        verdict: Verdict = check(run.history, final)
        heal_times = [h["seconds"] for h in run.heals]
    report = {
        "scenario": scenario,
        "seed": seed,
        "backend": chosen,
        "nodes": harness.node_ids,
        "schedule": [f.to_json() for f in schedule],
        "faults": run.faults_done,
        "converged_after_heal_s": converge_s,
        "heals": run.heals,
        "max_heal_convergence_s": max((t for t in heal_times if t is not None), default=None),
        "verdict": verdict.to_json(),
        "ok": verdict.ok and converge_s is not None and None not in heal_times,
        "submissions": len(run.history),
        "timeline": run.timeline,
    }
    (workdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
