"""A three-server NATS cluster with its MQTT gateway, for the clustered broker tier (issue 19).

One implementation for the tests (``tests/natscluster.py`` re-exports it) and the field-test
runner (``edgesched fieldtest run --broker nats``, which builds its members with
:func:`build_members` in its own fabric).

NATS serves MQTT 3.1.1 only on top of JetStream: sessions, QoS 1 messages and retained
messages are JetStream streams (``$MQTT_sess``, ``$MQTT_msgs``, ``$MQTT_rmsgs``), replicated
across the cluster (R3 here, :data:`STREAM_REPLICAS`). A clustered MQTT therefore needs a
JetStream cluster: every member has a ``server_name``, a ``cluster {}`` with routes to the
others, ``jetstream {}`` with a store directory of its own, and an ``mqtt {}`` listener.

Two layouts:

* :func:`loopback_cluster`: the three servers on 127.0.0.1, each on free ports, stores in a
  temporary directory;
* :func:`netns_cluster` (root only; :func:`netns_unavailable` says why not): each server in
  its own network namespace on a bridge (:class:`edgesched.fieldtest.netns.Fabric`), on the
  standard ports of its own address; a ``clients`` namespace on the same bridge is where the
  harness's proxies (:class:`~edgesched.fieldtest.faultproxy.FaultProxy` with
  ``upstream_sock``) connect from, so processes in the root namespace reach a member through
  ``127.0.0.1:<proxy port>``. :meth:`Fabric.isolate` of a member is a real partition of it.

Both wait until the cluster is *ready*: every running member answers ``/healthz``, has a
route to every other running member, agrees on a JetStream meta leader, and then an MQTT
round trip (subscribe QoS 1 at every member, publish at one, hear it at all) has worked, so
the MQTT streams exist (NATS creates them on the first MQTT connect of an account) and
subscriptions get their JetStream consumers. Everything is stopped, and the namespaces
deleted, on the way out, also after a failure.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edgesched.fieldtest import netns
from edgesched.ports import free_port, wait_for_port

#: The replicas of the MQTT streams (sessions, QoS 1 messages, retained messages).
STREAM_REPLICAS = 3
#: JetStream's standard ports, used inside a member's own namespace.
NS_CLIENT_PORT, NS_CLUSTER_PORT, NS_HTTP_PORT, NS_MQTT_PORT = 4222, 6222, 8222, 1883


def nats_binary() -> str | None:
    """``nats-server`` on PATH or in /usr/sbin (Debian's package), or None."""
    found = shutil.which("nats-server")
    if found is None and os.access("/usr/sbin/nats-server", os.X_OK):
        found = "/usr/sbin/nats-server"
    return found


def nats_config(
    name: str,
    *,
    host: str,
    client_port: int,
    cluster_port: int,
    http_port: int,
    mqtt_port: int,
    routes: list[str],
    store_dir: Path | str,
    cluster_name: str = "edgesched",
    max_payload: int = 8 << 20,
    ack_wait: str = "5s",
) -> str:
    """One member's configuration (the shape docs/brokers.md documents).

    ``routes`` are ``host:port`` of every member's cluster listener (its own may be in it: NATS
    drops a route to itself). ``ack_wait``: how long a QoS 1 message may stay unacknowledged
    before the member redelivers it (NATS's default is 30 s). ``max_payload``: the largest
    message; edgesched's frames are at most 64 KiB (``wire.DEFAULT_MAX_PACKET``), any larger
    limit is head room."""
    route_urls = ", ".join(f'"nats-route://{r}"' for r in routes)
    return (
        f"server_name: {name}\n"
        f"listen: {host}:{client_port}\n"
        f"http: {host}:{http_port}\n"
        f"max_payload: {max_payload}\n"
        "jetstream {\n"
        f'  store_dir: "{store_dir}"\n'
        "  max_memory_store: 256MB\n"
        "  max_file_store: 2GB\n"
        "}\n"
        "cluster {\n"
        f"  name: {cluster_name}\n"
        f"  listen: {host}:{cluster_port}\n"
        f"  routes: [{route_urls}]\n"
        "}\n"
        "mqtt {\n"
        f"  listen: {host}:{mqtt_port}\n"
        f"  ack_wait: {ack_wait!r}\n"
        f"  stream_replicas: {STREAM_REPLICAS}\n"
        "}\n"
    ).replace("'", '"')


@dataclass
class Member:
    """One ``nats-server`` of the cluster. ``mqtt_host``/``mqtt_port``: where a client in the
    harness's namespace connects (the member itself, or in netns the proxy's job)."""

    name: str
    conf: Path
    log: Path
    http: tuple[str, int]
    mqtt_host: str
    mqtt_port: int
    netns_host: netns.Host | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        binary = nats_binary()
        if binary is None:
            raise FileNotFoundError("nats-server is not installed (apt-get install nats-server)")
        with self.log.open("ab") as out:
            argv = [binary, "-c", str(self.conf)]
            if self.netns_host is not None:
                self.proc = self.netns_host.popen(argv, log=out)
            else:
                self.proc = subprocess.Popen(argv, stdout=out, stderr=out)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (``SIGKILL``: it dies at once, as a crashed machine)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.netns_host is not None and self.proc in self.netns_host.procs:
            self.netns_host.procs.remove(self.proc)
        self.proc = None

    def monitor(self, path: str) -> Any:
        """GET the member's monitoring endpoint ``path`` (JSON); OSError/ValueError if not up."""
        url = f"http://{self.http[0]}:{self.http[1]}{path}"

        def get() -> Any:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return json.loads(resp.read())

        return get() if self.netns_host is None else self.netns_host.call(get)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"


@dataclass
class NatsCluster:
    members: list[Member]
    root: Path
    fabric: netns.Fabric | None = None
    #: In netns: the namespace the harness's proxies connect from, and each member's address.
    clients: netns.Host | None = None
    member_ips: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Member:
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(name)

    def running(self) -> list[Member]:
        return [m for m in self.members if m.running]

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def health(self, expect: list[Member] | None = None) -> str | None:
        """None if ``expect`` (default: the running members) form a ready JetStream cluster,
        else what is missing (one line)."""
        up = expect if expect is not None else self.running()
        names = {m.name for m in up}
        leaders = set()
        for member in up:
            if not member.running:
                return f"{member.name} has exited:\n{member.output()}"
            try:
                if member.monitor("/healthz").get("status") != "ok":
                    return f"{member.name} not healthy"
                routes = int(member.monitor("/routez").get("num_routes", 0))
                meta = member.monitor("/jsz").get("meta_cluster") or {}
            except (OSError, ValueError, KeyError) as exc:
                return f"{member.name}: {exc}"
            if routes < len(names) - 1:
                return f"{member.name} has {routes} routes, not {len(names) - 1}"
            leader = meta.get("leader")
            if not leader:
                return f"{member.name} knows no JetStream meta leader"
            if leader == member.name:  # only the leader lists its peers
                current = {r.get("name") for r in meta.get("replicas") or [] if r.get("current")}
                if not names - {member.name} <= current:
                    return f"meta leader {leader}: peers current {sorted(current)}"
            leaders.add(leader)
        if len(leaders) != 1:
            return f"members disagree on the meta leader: {sorted(leaders)}"
        if not leaders <= names:
            return f"meta leader {sorted(leaders)} is not among {sorted(names)}"
        return None

    def wait_ready(self, timeout: float = 30.0, expect: list[Member] | None = None) -> None:
        """Until :meth:`health` is None and an MQTT round trip through every member works."""
        deadline = time.monotonic() + timeout
        why: str | None = "not checked"
        while time.monotonic() < deadline:
            why = self.health(expect)
            if why is None:
                members = expect or self.running()
                wait = max(1.0, min(10.0, deadline - time.monotonic()))
                why = in_clients(self, functools.partial(mqtt_round_trip, members, wait))
                if why is None:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"NATS cluster not ready after {timeout}s: {why}")


def mqtt_round_trip(members: list[Member], timeout: float) -> str | None:
    """Subscribe QoS 1 at every member, publish once at the first, hear it everywhere; None
    if that worked, else what failed. Clean sessions, so nothing of it stays behind."""
    topic = f"edgesched-probe/{secrets.token_hex(4)}"
    heard: dict[str, threading.Event] = {m.name: threading.Event() for m in members}
    clients: list[mqtt.Client] = []
    try:
        for member in members:
            ready = threading.Event()
            granted: list[int] = []
            c = mqtt.Client(
                CallbackAPIVersion.VERSION2,
                client_id=f"probe-{member.name}-{secrets.token_hex(3)}",
                protocol=mqtt.MQTTv311,
                clean_session=True,
                reconnect_on_failure=False,
            )
            got = heard[member.name]
            c.on_message = lambda _c, _u, _m, got=got: got.set()

            def on_subscribe(
                _c: Any,
                _u: Any,
                _mid: int,
                codes: Any,
                _p: Any,
                g: list[int] = granted,
                r: threading.Event = ready,
            ) -> None:
                g.extend(int(getattr(code, "value", code)) for code in codes)
                r.set()

            c.on_subscribe = on_subscribe
            c.on_connect = lambda cl, _u, _f, rc, _p: (
                cl.subscribe(topic, qos=1) if not rc.is_failure else None
            )
            c.connect(member.mqtt_host, member.mqtt_port, keepalive=5)
            c.loop_start()
            clients.append(c)
            if not ready.wait(timeout) or not granted or granted[0] >= 0x80:
                return f"{member.name}: MQTT subscribe not granted ({granted})"
        info = clients[0].publish(topic, b"probe", qos=1)
        info.wait_for_publish(timeout)
        for name, event in heard.items():
            if not event.wait(timeout):
                return f"{name} did not deliver the probe message"
        return None
    except (OSError, ValueError, RuntimeError) as exc:
        return f"MQTT probe: {exc}"
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                c.disconnect()
            c.loop_stop()


def build_members(
    root: Path, size: int = 3, *, hosts: list[netns.Host] | None = None, **config: Any
) -> list[Member]:
    """``size`` members' configurations written under ``root`` (not started): on 127.0.0.1
    with free ports, or with ``hosts`` one member per namespace on its own address and the
    standard ports. ``config``: extra :func:`nats_config` keywords. The field-test runner and
    the tests' clusters build their members here."""
    if hosts is not None and len(hosts) != size:
        raise ValueError(f"{size} members need {size} hosts, got {len(hosts)}")
    if hosts is None:
        ports = [
            {k: free_port() for k in ("client", "cluster", "http", "mqtt")} for _ in range(size)
        ]
        addrs = ["127.0.0.1"] * size
    else:
        std = {"client": NS_CLIENT_PORT, "cluster": NS_CLUSTER_PORT, "http": NS_HTTP_PORT,
               "mqtt": NS_MQTT_PORT}  # fmt: skip
        ports = [dict(std) for _ in range(size)]
        addrs = [h.ip for h in hosts]
    routes = [f"{a}:{p['cluster']}" for a, p in zip(addrs, ports, strict=True)]
    members = []
    for i, (addr, p) in enumerate(zip(addrs, ports, strict=True)):
        name = f"nats{i + 1}" if hosts is None else hosts[i].name
        conf = root / f"{name}.conf"
        conf.write_text(
            nats_config(
                name,
                host=addr,
                client_port=p["client"],
                cluster_port=p["cluster"],
                http_port=p["http"],
                mqtt_port=p["mqtt"],
                routes=routes,
                store_dir=root / name,
                **config,
            )
        )
        members.append(
            Member(
                name,
                conf,
                root / f"{name}.log",
                (addr, p["http"]),
                addr,
                p["mqtt"],
                netns_host=None if hosts is None else hosts[i],
            )
        )
    return members


def start_all(cluster: NatsCluster, timeout: float) -> None:
    """Start every member and wait until the cluster is ready (:meth:`NatsCluster.wait_ready`)."""
    for member in cluster.members:
        member.start()
    if cluster.fabric is None:
        for member in cluster.members:
            assert member.proc is not None
            try:
                wait_for_port(member.http[1], timeout=10, proc=member.proc)
            except (TimeoutError, ChildProcessError) as exc:
                raise RuntimeError(
                    f"{member.name} did not start: {exc}\n{member.output()}"
                ) from None
    cluster.wait_ready(timeout)


@contextlib.contextmanager
def loopback_cluster(
    size: int = 3, *, timeout: float = 40.0, **config: Any
) -> Iterator[NatsCluster]:
    """``size`` members on 127.0.0.1 (free ports, temporary stores), ready; stopped after.
    ``config``: extra :func:`nats_config` keywords (``ack_wait``, ``max_payload``)."""
    if nats_binary() is None:
        raise FileNotFoundError("nats-server is not installed (apt-get install nats-server)")
    with tempfile.TemporaryDirectory(prefix="edgesched-nats-") as tmp:
        root = Path(tmp)
        members = build_members(root, size, **config)
        cluster = NatsCluster(members, root)
        try:
            start_all(cluster, timeout)
            yield cluster
        finally:
            cluster.stop()


def netns_unavailable() -> str | None:
    """None if :func:`netns_cluster` can run here, else why not."""
    if nats_binary() is None:
        return "nats-server is not installed (apt-get install nats-server)"
    return netns.available()


@contextlib.contextmanager
def netns_cluster(size: int = 3, *, timeout: float = 40.0, **config: Any) -> Iterator[NatsCluster]:
    """``size`` members, each in its own network namespace on one bridge, plus a
    ``clients`` namespace there; ready; servers stopped and namespaces deleted after.

    A member's ``mqtt_host``/``mqtt_port`` is its bridge address and 1883: reachable from the
    ``clients`` namespace (``cluster.clients``), not from the root one; put a proxy in front
    (``socket_in(cluster.clients.ns)`` as its upstream socket)."""
    why = netns_unavailable()
    if why is not None:
        raise netns.FabricError(why)
    with tempfile.TemporaryDirectory(prefix="edgesched-natsns-") as tmp, netns.Fabric() as fabric:
        root = Path(tmp)
        hosts = [fabric.add_host(f"nats{i}") for i in range(1, size + 1)]
        clients = fabric.add_host("clients")
        members = build_members(root, size, hosts=hosts, **config)
        cluster = NatsCluster(members, root, fabric, clients, {h.name: h.ip for h in hosts})
        try:
            start_all(cluster, timeout)
            yield cluster
        finally:
            cluster.stop()


def in_clients(cluster: NatsCluster, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in the clients' namespace (netns layout) or here (loopback)."""
    return fn() if cluster.clients is None else cluster.clients.call(fn)
