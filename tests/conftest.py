"""Shared fixtures: a real Mosquitto broker on 127.0.0.1, free ports, and an edge node process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgesched.edge.executor import kill_leftovers
from edgesched.localbroker import mosquitto_path
from edgesched.ports import free_port, wait_for_port
from edgesched.rest.client import ApiClient, ApiTarget

__all__ = ["free_port", "wait_for_port"]  # the tests import them from here

#: A node document's ``registration``, as an 8-core x86 general node writes it.
REG = {
    "site": "s1",
    "arch": "x86_64",
    "server_class": "general",
    "cpu": 8.0,
    "mem_gib": 16.0,
    "accel": 0,
    "perf": 1.0,
    "power": {"idle_w": 60.0, "peak_w": 200.0, "parked_w": 8.0, "wake_latency_s": 45.0},
}


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for each to end (a task that ended otherwise is let be)."""
    every = list(tasks)
    for task in every:
        task.cancel()
    for task in every:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(
    pred: Callable[[], Any],
    timeout: float,
    what: str,
    *,
    tolerate: tuple[type[Exception], ...] = (),
    interval: float = 0.2,
) -> Any:
    """Poll the blocking ``pred`` (on a thread) until it is truthy; return its value.
    TimeoutError naming ``what`` and the last value after ``timeout``. Exceptions of the
    ``tolerate`` types count as "not yet" (a service between restarts)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await asyncio.to_thread(pred)
        except tolerate as exc:
            last = exc
        else:
            if last:
                return last
        await asyncio.sleep(interval)
    raise TimeoutError(f"{what} not reached in {timeout}s; last={last!r}")


def mosquitto_binary() -> str:
    found = mosquitto_path()
    if found is None:
        pytest.fail("Mosquitto is not installed: run `make setup` (apt-get install mosquitto)")
    return found


@dataclass
class Broker:
    """A Mosquitto process with the config file at ``conf``; output goes to ``log`` if set."""

    port: int
    proc: subprocess.Popen[bytes]
    conf: Path
    log: Path | None = None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def start(self) -> None:
        argv = [mosquitto_binary(), "-c", str(self.conf)]
        if self.log is None:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            with self.log.open("ab") as out:
                self.proc = subprocess.Popen(argv, stdout=out, stderr=out)
        try:
            wait_for_port(self.port)
        except TimeoutError:
            self.stop()
            output = self.log.read_text() if self.log is not None else "(output not kept)"
            raise AssertionError(f"broker did not start:\n{output}") from None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """Mosquitto on 127.0.0.1 on a free port (anonymous, no persistence), stopped after."""
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest none\n"
    )
    b = Broker(port, None, conf)  # type: ignore[arg-type]
    b.start()
    try:
        yield b
    finally:
        b.stop()


def edgesched_binary() -> str:
    exe = Path(sys.executable).with_name("edgesched")
    found = str(exe) if exe.exists() else shutil.which("edgesched")
    assert found, "the edgesched console script is not installed"
    return found


def central_cli(central: EdgeNode, *args: str) -> subprocess.CompletedProcess[str]:
    """``edgesched <args>`` against ``central``'s API, with its admin token, as an operator
    runs it (``EDGESCHED_ADDR`` / ``EDGESCHED_TOKEN``)."""
    env = {
        **os.environ,
        "EDGESCHED_ADDR": central.url(""),
        "EDGESCHED_TOKEN": (central.state / "api-token").read_text().strip(),
    }
    return subprocess.run(
        [edgesched_binary(), *args], capture_output=True, text=True, timeout=60, env=env
    )


@dataclass
class EdgeNode:
    """A real `edgesched edge run` (or, with ``tier="central"``, `edgesched central run`)
    process and a small client for its API."""

    config: Path
    state: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    tier: str = "edge"

    def start(self, timeout: float = 20.0) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.state / "api-port").unlink()
        logf = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                edgesched_binary(),
                self.tier,
                "run",
                "--config",
                str(self.config),
                "--log-level",
                "debug",
            ],
            stdout=logf,
            stderr=logf,
            cwd=self.config.parent,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.tier} exited {self.proc.returncode}:\n{self.log.read_text()}"
                )
            with contextlib.suppress(OSError, ValueError):
                port = int((self.state / "api-port").read_text())
                if self.get("/v1/health", auth=False)[0] == 200:
                    self.port = port
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{self.tier} not up after {timeout}s:\n{self.log.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(15)

    def url(self, path: str) -> str:
        port = int((self.state / "api-port").read_text())
        return f"http://127.0.0.1:{port}{path}"

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        auth: bool = True,
        raw: bytes | None = None,
    ) -> tuple[int, Any]:
        client = ApiClient(ApiTarget.from_state_dir(self.state))
        resp = client.request(method, path, body, auth=auth, raw=raw)
        return resp.status, resp.body

    def get(self, path: str, *, auth: bool = True) -> tuple[int, Any]:
        return self.request("GET", path, auth=auth)

    def tasks(self) -> dict[str, dict[str, Any]]:
        status, rows = self.get("/v1/tasks")
        assert status == 200, rows
        return {r["id"]: r for r in rows}

    def wait(self, predicate: Any, timeout: float = 20.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(0.1)
        raise TimeoutError(
            f"{what} not reached in {timeout}s; last={last!r}\n{self.log.read_text()[-4000:]}"
        )


def write_edge_config(
    tmp_path: Path, mqtt_port: int, *, mqtt: dict[str, Any] | None = None, **edge: Any
) -> tuple[Path, Path]:
    state = tmp_path / "state"
    settings = {
        "node_id": "gw-test",
        "state_dir": str(state),
        "api_port": 0,
        "lease_s": 2.0,
        "cycle_s": 0.2,
        "sample_s": 0.5,
        "stop_grace_s": 2.0,
        **edge,
    }
    lines = ["[edge]"]
    for key, value in settings.items():
        lines.append(f"{key} = {json.dumps(value)}")
    lines += ["[edge.mqtt]", f"port = {mqtt_port}", "keepalive_s = 2"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in (mqtt or {}).items()]
    config = tmp_path / "edge.toml"
    config.write_text("\n".join(lines) + "\n")
    return config, state


def write_central_config(
    tmp_path: Path, mqtt_port: int, *, mqtt: Mapping[str, Any] | None = None, **central: Any
) -> tuple[Path, Path]:
    state = tmp_path / "central-state"
    settings = {
        "central_id": "central",
        "state_dir": str(state),
        "api_port": 0,
        "heartbeat_s": 0.5,
        "snapshot_s": 0.5,
        **central,
    }
    lines = ["[central]"] + [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    lines += ["[central.mqtt]", f"port = {mqtt_port}", "keepalive_s = 2"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in (mqtt or {}).items()]
    config = tmp_path / "central.toml"
    config.write_text("\n".join(lines) + "\n")
    return config, state


@pytest.fixture
def edge_node(tmp_path: Path) -> Iterator[EdgeNode]:
    """An edge node with no broker reachable (a free port nobody listens on)."""
    config, state = write_edge_config(tmp_path, free_port())
    node = EdgeNode(config, state, tmp_path / "edge.log")
    node.start()
    try:
        yield node
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.kill(signal.SIGTERM)
        kill_task_processes(state)


def kill_task_processes(state: Path) -> None:
    """Tasks outlive the engine by design; tests clean up the ones they started."""
    kill_leftovers([state / "run"])


@asynccontextmanager
async def central_and_nodes(
    tmp_path: Path,
    central_port: int,
    node_ports: Mapping[str, int],
    *,
    central: Mapping[str, Any] | None = None,
    policy: Mapping[str, Any] | None = None,
    edge: Callable[[str, Path], Mapping[str, Any]] | None = None,
    central_mqtt: Mapping[str, Any] | None = None,
    edge_mqtt: Callable[[str], Mapping[str, Any]] | None = None,
) -> AsyncIterator[tuple[EdgeNode, dict[str, EdgeNode]]]:
    """Central (MQTT on ``central_port``, ``[central]`` extras, an optional ``[policy]``,
    ``[central.mqtt]`` extras) and one edge node per ``node_ports`` entry (node ``n`` talks
    MQTT on ``node_ports[n]``, lease 2 s, ``edge(n, its dir)`` extras and
    ``edge_mqtt(n)`` ``[edge.mqtt]`` extras) as processes; all stopped and their tasks killed
    after."""
    config, state = write_central_config(
        tmp_path, central_port, mqtt=central_mqtt, **(central or {})
    )
    if policy:
        with config.open("a") as out:
            out.write("[policy]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in policy.items()))
    main = EdgeNode(config, state, tmp_path / "central.log", tier="central")
    nodes: dict[str, EdgeNode] = {}
    try:
        await asyncio.to_thread(main.start)
        for node_id, port in node_ports.items():
            d = tmp_path / node_id
            d.mkdir()
            extra = dict(edge(node_id, d)) if edge is not None else {}
            mqtt = {"reconnect_max_s": 1.0, **(edge_mqtt(node_id) if edge_mqtt else {})}
            cfg, st = write_edge_config(d, port, node_id=node_id, lease_s=2.0, mqtt=mqtt, **extra)
            nodes[node_id] = EdgeNode(cfg, st, d / "edge.log")
            await asyncio.to_thread(nodes[node_id].start)
        yield main, nodes
    finally:
        for proc in [main, *nodes.values()]:
            if proc.proc is not None and proc.proc.poll() is None:
                await asyncio.to_thread(proc.kill, signal.SIGTERM)
        for node in nodes.values():
            kill_task_processes(node.state)
