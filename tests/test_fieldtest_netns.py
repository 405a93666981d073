"""A real partition in network namespaces (root only; CI runs as root): the broker and
central in one namespace, two edge nodes in theirs, all bridged. One node's link goes down
(the kernel's, not a proxy's): it turns autonomous and decides alone; after the link comes
back every replica at central is byte-equal to its node and holds every offline decision.
A one-way (half-open) link is also exercised, and a fault proxy made inside a namespace (the
latency of the fabric). Without root the fault-proxy tests cover it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    edgesched_binary,
    kill_task_processes,
    mosquitto_binary,
    write_central_config,
    write_edge_config,
)
from conftest import (
    until as poll,
)

from edgesched.fieldtest.faultproxy import FaultProxy
from edgesched.fieldtest.netns import Fabric, Host, available, socket_in
from edgesched.fieldtest.runner import Proc, Service

pytestmark = pytest.mark.skipif(
    available() is not None, reason=f"real partitions need root: {available()}"
)


class Api(Service):
    """HTTP to a service on a host's loopback, from inside its namespace (the runner's)."""

    def __init__(self, host: Host, state: Path) -> None:
        super().__init__(Proc(host.name, [], state.parent / "unused.log", host), state)
        self.host = host

    def __call__(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.http(method, path, body)

    def ready(self) -> bool:
        try:
            return self("GET", "/v1/health")[0] == 200
        except (OSError, ValueError):
            return False


async def until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """Services restart in these scenarios: a refused connection counts as "not yet"."""
    return await poll(pred, timeout, what, tolerate=(OSError, ValueError), interval=0.25)


@pytest.fixture
def fabric() -> Iterator[Fabric]:
    with Fabric() as f:
        yield f


async def test_a_node_cut_off_by_the_kernel_decides_alone_and_merges(
    fabric: Fabric, tmp_path: Path
) -> None:
    central_host = fabric.add_host("central")
    nodes = {name: fabric.add_host(name) for name in ("gw-a", "gw-b")}
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        f"listener 1883 {central_host.ip}\nlistener 1883 127.0.0.1\n"
        "allow_anonymous true\npersistence false\nlog_dest none\n"
        + ("user root\n" if os.geteuid() == 0 else "")
    )
    central_host.popen([mosquitto_binary(), "-c", str(conf)])
    config, central_state = write_central_config(
        tmp_path, 1883, failover_after_s=3.0, heartbeat_s=0.5
    )
    log = (tmp_path / "central.log").open("ab")
    central_host.popen([edgesched_binary(), "central", "run", "-c", str(config)], log=log)
    central = Api(central_host, central_state)
    apis: dict[str, Api] = {}
    try:
        for name, host in nodes.items():
            d = tmp_path / name
            d.mkdir()
            config, state = write_edge_config(
                d, 1883, node_id=name, lease_s=2.0,
                mqtt={"host": central_host.ip, "allow_plain_remote": True,
                      "reconnect_max_s": 1.0},
            )  # fmt: skip
            node_log = (d / "edge.log").open("ab")
            host.popen([edgesched_binary(), "edge", "run", "-c", str(config)], log=node_log)
            apis[name] = Api(host, state)
        await until(central.ready, 20, "central up")
        for name, api in apis.items():
            await until(api.ready, 20, f"{name} up")

        def converged() -> bool:
            seen = {n["id"]: n for n in central("GET", "/v1/nodes")[1]["nodes"]}
            for name, api in apis.items():
                mine = api("GET", "/v1/status")[1]["document"]["content_hash"]
                if seen.get(name, {}).get("document", {}).get("content_hash") != mine:
                    return False
            return True

        await until(converged, 30, "central holding both documents")
        b = apis["gw-b"]

        fabric.isolate("gw-b")  # the link goes down, as a cut WAN cable does
        await until(lambda: b("GET", "/v1/status")[1]["mode"] == "autonomous", 20, "autonomous")
        await until(
            lambda: (
                {n["id"]: n for n in central("GET", "/v1/nodes")[1]["nodes"]}["gw-b"]["state"]
                in ("suspect", "partitioned")
            ),
            20,
            "central seeing gw-b gone",
        )
        offline = [f"cut-{i}" for i in range(3)]
        for task_id in offline:
            body = {"id": task_id, "command": ["sleep", "120"], "cpu": 0.05, "mem_gib": 0.05}
            status, reply = await asyncio.to_thread(b, "POST", "/v1/tasks", body)
            assert status == 201, reply

        def decided() -> bool:
            tasks = {t["id"]: t for t in b("GET", "/v1/tasks")[1]}
            return all(tasks.get(t, {}).get("state") == "running" for t in offline)

        await until(decided, 20, "gw-b deciding while cut off")
        t_heal = time.monotonic()
        fabric.heal("gw-b")
        await until(converged, 30, "byte-equal replicas after the link returns")
        healed = time.monotonic() - t_heal
        status, detail = await asyncio.to_thread(central, "GET", "/v1/nodes/gw-b")
        for task_id in offline:
            assert detail["content"]["tasks"][task_id]["decided_by"] == "edge-autonomous"
        print(f"netns partition healed in {healed:.2f}s")

        # A half-open link: gw-a hears nothing (inbound dropped) but can still send.
        fabric.one_way("gw-a", "in")
        a = apis["gw-a"]
        await until(lambda: a("GET", "/v1/status")[1]["mode"] == "autonomous", 20, "a deaf")
        fabric.heal("gw-a")
        await until(lambda: a("GET", "/v1/status")[1]["mode"] == "connected", 20, "a back")
        await until(converged, 30, "byte-equal after the half-open link heals")
    finally:
        for api in apis.values():
            for proc in api.host.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in api.host.procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            kill_task_processes(api.state)


async def test_a_fault_proxy_delays_a_link_between_two_namespaces(fabric: Fabric) -> None:
    """This kernel has no netem: latency on the fabric comes from a proxy whose sockets were
    made inside a host's namespace (it listens on that host's loopback and connects out from
    it across the bridge). A round trip through it takes at least the delay both ways."""
    server_host, client_host = fabric.add_host("srv"), fabric.add_host("cli")

    def serve() -> socket.socket:
        sock = socket.create_server((server_host.ip, 0))
        sock.setblocking(False)
        return sock

    listener = await asyncio.to_thread(server_host.call, serve)
    port = listener.getsockname()[1]

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, sock=listener)
    async with server, FaultProxy(
        "127.0.0.1", 0, server_host.ip, port,
        listen_sock=await asyncio.to_thread(socket_in, client_host.ns),
        upstream_sock=lambda: socket_in(client_host.ns),
    ) as proxy:  # fmt: skip
        proxy.set_latency(0.2, jitter=0.1)
        conn = await asyncio.to_thread(socket_in, client_host.ns)
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        await loop.sock_connect(conn, ("127.0.0.1", proxy.port))  # inside cli's namespace
        reader, writer = await asyncio.open_connection(sock=conn)
        writer.write(b"ping")
        assert await reader.read(100) == b"ping"
        assert time.monotonic() - start >= 0.4  # 0.2 s each way at least, jitter on top
        assert proxy.stats.bytes_c2s == 4 and proxy.stats.bytes_s2c == 4
        writer.close()
