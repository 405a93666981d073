"""Real network partitions: hosts in Linux network namespaces joined by a bridge (root only).

A :class:`Fabric` is a namespace of its own holding one or more bridges (``br0``, the WAN,
always; a LAN per site with :meth:`Fabric.add_bridge`) and one namespace per host, each host
joined to a bridge by a veth pair and given an address on that bridge's private /24. A host
may be joined to a second bridge (:meth:`Fabric.attach`: a site broker sits on its site's LAN
and on the WAN). Processes run in a host with :meth:`Host.popen` (``ip netns exec``); the
harness talks to a host's loopback services with :func:`in_namespace`, which runs a function
on a thread switched into that namespace (a socket belongs to the namespace it was created
in; :func:`socket_in` makes one there for a proxy).

Faults are the kernel's, not a proxy's:

* :meth:`Fabric.isolate` sets the bridge side of the host's veths down (or of one of them:
  a site broker's WAN link alone): nothing passes either way, TCP sees a dead link and only
  keepalives notice (a real cut cable);
* :meth:`Fabric.one_way` drops one direction with nftables in the host's namespace (a
  half-open link);
* :meth:`Fabric.heal` undoes both.

Everything is torn down by :meth:`Fabric.close` (deleting a namespace deletes its veths).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000


class FabricError(RuntimeError):
    """The namespaces could not be built (not root, no ``ip``, a kernel without netns)."""


def available() -> str | None:
    """None if this machine can build a fabric, else why not (one line)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or use the fault proxy)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 nftables)"
    return None


def _run(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30)
    except subprocess.CalledProcessError as exc:
        raise FabricError(f"{' '.join(argv)}: {exc.stderr.strip() or exc}") from None
    return done.stdout


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def in_namespace(ns: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on this thread switched into namespace ``ns``, then switch back. Call it
    from a worker thread (``asyncio.to_thread``): it switches the calling thread only."""
    with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{ns}") as target:
        _setns(target.fileno())
        try:
            return fn()
        finally:
            _setns(home.fileno())


def socket_in(ns: str, family: int = socket.AF_INET) -> socket.socket:
    """A non-blocking TCP socket created in namespace ``ns`` (it stays there whichever thread
    or loop uses it): how a proxy in the root namespace listens or connects inside a host."""

    def make() -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        return sock

    return in_namespace(ns, make)


@dataclass(frozen=True)
class Link:
    """One veth of a host: its name inside the host, its peer on a bridge, and its address."""

    bridge: str
    ifname: str  # inside the host's namespace: eth0, eth1
    veth_fabric: str  # inside the fabric namespace, on the bridge
    ip: str


@dataclass
class Host:
    """One host of the fabric: its namespace and the veths that join it to bridges (the
    first one's address is :attr:`ip`)."""

    name: str
    ns: str
    ip: str
    veth_host: str  # inside the host's namespace, named eth0
    veth_fabric: str  # inside the fabric namespace, on the bridge
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    links: dict[str, Link] = field(default_factory=dict)  # bridge -> the veth on it

    def ip_on(self, bridge: str) -> str:
        return self.links[bridge].ip

    def popen(
        self, argv: Sequence[str], *, log: IO[bytes] | None = None, **kw: Any
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in this host's namespace (stopped by :meth:`Fabric.close`)."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *argv],
            stdout=log or subprocess.DEVNULL,
            stderr=log or subprocess.DEVNULL,
            **kw,
        )
        self.procs.append(proc)
        return proc

    def call(self, fn: Callable[[], T]) -> T:
        return in_namespace(self.ns, fn)


class Fabric:
    """Namespaces, a bridge, and the faults between them. A context manager."""

    def __init__(self, run_id: str | None = None) -> None:
        why = available()
        if why is not None:
            raise FabricError(why)
        self.run_id = run_id or secrets.token_hex(2)
        self.prefix = f"es{self.run_id}"
        self.subnet = f"10.{200 + int(self.run_id[:2], 16) % 50}.{int(self.run_id[2:], 16)}"
        self.fabric_ns = f"{self.prefix}-fab"
        self.hosts: dict[str, Host] = {}
        self.bridges: dict[str, str] = {}  # bridge -> its /24 ("10.a.b", without the host)
        self._namespaces: list[str] = []
        self._veths = 0
        self.faults: dict[str, str] = {}  # host -> "isolated" | "one-way in" | ...

    def __enter__(self) -> Fabric:
        try:
            self._add_ns(self.fabric_ns)
            self.add_bridge("br0")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._namespaces.append(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def add_bridge(self, bridge: str) -> str:
        """Another bridge (a site's LAN) with a /24 of its own; returns that subnet. Hosts on
        different bridges reach each other only through a host joined to both, which routes
        nothing: a site's nodes reach their site broker, never central's directly."""
        if bridge in self.bridges:
            raise FabricError(f"bridge {bridge} exists")
        _run(["ip", "-n", self.fabric_ns, "link", "add", bridge, "type", "bridge"])
        _run(["ip", "-n", self.fabric_ns, "link", "set", bridge, "up"])
        # The namespaces are private, so a subnet needs only be unique within this fabric.
        octet = self.subnet.split(".")[2]
        subnet = self.subnet if not self.bridges else f"172.{16 + len(self.bridges) % 16}.{octet}"
        self.bridges[bridge] = subnet
        return subnet

    def add_host(self, name: str, bridge: str = "br0") -> Host:
        """A new namespace joined to ``bridge`` as its ``eth0``."""
        if len(self.hosts) >= 250:
            raise FabricError("at most 250 hosts per fabric")
        ns = f"{self.prefix}-{name}"[:48]
        self._add_ns(ns)
        host = Host(name, ns, "", "eth0", "")
        self.hosts[name] = host
        link = self._join(host, bridge)
        host.ip, host.veth_fabric = link.ip, link.veth_fabric
        return host

    def attach(self, name: str, bridge: str) -> Link:
        """Join host ``name`` to another bridge as its next ``ethN`` (no routing between)."""
        host = self.hosts[name]
        if bridge in host.links:
            raise FabricError(f"{name} is on {bridge} already")
        return self._join(host, bridge)

    def _join(self, host: Host, bridge: str) -> Link:
        if bridge not in self.bridges:
            raise FabricError(f"no bridge {bridge}")
        self._veths += 1
        here, there = f"{self.prefix}h{self._veths}", f"{self.prefix}f{self._veths}"
        ifname = f"eth{len(host.links)}"
        used = sum(1 for h in self.hosts.values() for lk in h.links.values() if lk.bridge == bridge)
        if used >= 250:
            raise FabricError(f"at most 250 hosts on {bridge}")
        ip = f"{self.bridges[bridge]}.{used + 1}"
        _run(["ip", "link", "add", here, "type", "veth", "peer", "name", there])
        _run(["ip", "link", "set", here, "netns", host.ns])
        _run(["ip", "link", "set", there, "netns", self.fabric_ns])
        _run(["ip", "-n", host.ns, "link", "set", here, "name", ifname])
        _run(["ip", "-n", host.ns, "addr", "add", f"{ip}/24", "dev", ifname])
        _run(["ip", "-n", host.ns, "link", "set", ifname, "up"])
        _run(["ip", "-n", self.fabric_ns, "link", "set", there, "master", bridge])
        _run(["ip", "-n", self.fabric_ns, "link", "set", there, "up"])
        link = Link(bridge, ifname, there, ip)
        host.links[bridge] = link
        return link

    # --- faults --------------------------------------------------------------------------

    def isolate(self, name: str, bridge: str | None = None) -> None:
        """Cut the host off: its links (or only the one on ``bridge``) go down, both ways."""
        host = self.hosts[name]
        for link in host.links.values():
            if bridge is None or link.bridge == bridge:
                _run(["ip", "-n", self.fabric_ns, "link", "set", link.veth_fabric, "down"])
        self.faults[name] = "isolated" if bridge is None else f"cut from {bridge}"

    def one_way(self, name: str, drop: str) -> None:
        """Drop the host's ``"in"``bound or ``"out"``bound traffic on eth0 (nftables)."""
        if drop not in ("in", "out"):
            raise ValueError(f"drop must be 'in' or 'out', got {drop!r}")
        host = self.hosts[name]
        hook, iface = ("input", "iifname") if drop == "in" else ("output", "oifname")
        rules = (
            "table inet edgesched_fault {\n"
            f'  chain c {{ type filter hook {hook} priority 0; {iface} "eth0" drop; }}\n'
            "}\n"
        )
        self._clear_rules(host)
        subprocess.run(
            ["ip", "netns", "exec", host.ns, "nft", "-f", "-"],
            input=rules, text=True, check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        self.faults[name] = f"one-way: {drop}bound dropped"

    def reset_tcp(self, name: str) -> None:
        """Answer the host's TCP traffic with resets (nftables ``reject with tcp reset``) until
        :meth:`heal`: its connections die at once, as when a middlebox loses its state."""
        host = self.hosts[name]
        rules = (
            "table inet edgesched_fault {\n"
            '  chain c { type filter hook output priority 0; oifname "eth0" '
            "meta l4proto tcp reject with tcp reset; }\n"
            "}\n"
        )
        self._clear_rules(host)
        subprocess.run(
            ["ip", "netns", "exec", host.ns, "nft", "-f", "-"],
            input=rules, text=True, check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        self.faults[name] = "tcp reset"

    def limit(self, name: str, rate: str = "64kbit") -> None:
        """Throttle the host's egress to ``rate`` with a token bucket (``tc tbf``; this
        kernel has no netem, so latency and loss come from the fault proxy instead)."""
        host = self.hosts[name]
        _run(["ip", "netns", "exec", host.ns, "tc", "qdisc", "replace", "dev", "eth0", "root",
              "tbf", "rate", rate, "burst", "4kb", "latency", "400ms"])  # fmt: skip
        self.faults[name] = f"egress limited to {rate}"

    def heal(self, name: str) -> None:
        host = self.hosts[name]
        for link in host.links.values():
            _run(["ip", "-n", self.fabric_ns, "link", "set", link.veth_fabric, "up"])
        self._clear_rules(host)
        with contextlib.suppress(FabricError):
            _run(["ip", "netns", "exec", host.ns, "tc", "qdisc", "del", "dev", "eth0", "root"])
        self.faults.pop(name, None)

    def _clear_rules(self, host: Host) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            subprocess.run(
                ["ip", "netns", "exec", host.ns, "nft", "delete", "table", "inet",
                 "edgesched_fault"],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip

    # --- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process started in a host, then delete the namespaces."""
        for host in self.hosts.values():
            for proc in host.procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in host.procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for ns in reversed(self._namespaces):
            with contextlib.suppress(FabricError):
                _run(["ip", "netns", "del", ns])
        self._namespaces.clear()
