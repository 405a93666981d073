"""``edgesched broker init``: one directory holding everything a fleet's Mosquitto needs.

Role: write, from one command, a complete broker for central (or for a site, bridged to
central's) and keep it in step as nodes join and leave (:mod:`edgesched.nodeaccess`). The
directory (``--dir``, ``/etc/edgesched/broker`` by default) holds:

* ``fleet.json``: what the rest is generated from (the address nodes dial, the listener,
  the centrals, the nodes admitted and their sites, the serials revoked, the site brokers);
* ``ca/``: the fleet CA (``ca.crt``, ``ca.key`` 0600), made here unless ``--ca-dir`` names
  one (``edgesched certs init``); a site broker keeps ``ca.crt`` only;
* ``server/broker.crt`` and ``.key``: the broker's server certificate (the address's host,
  ``--name`` extras, ``localhost`` and ``127.0.0.1`` as names);
* ``clients/<central>.crt`` and ``.key``: each central's client certificate, and a site
  broker's bridge certificate ``bridge-<site>``; ``central-mqtt.toml``, the
  ``[central.mqtt]`` table that uses it;
* ``acl``: :func:`edgesched.sync.security.acl` for the admitted nodes only (``user`` blocks),
  ``crl.pem``: the revoked serials (``crlfile``), ``mosquitto.conf``:
  :func:`edgesched.sync.security.broker_config` with TLS, certificate identities
  (``use_identity_as_username``), persistence in ``data/``, ``max_packet_size``, a
  ``pid_file`` (``mosquitto.pid``: what :func:`reload` signals) and, for a site, the bridge;
* ``edgesched-mosquitto.service``: a systemd unit running Mosquitto with that config.

Nothing is overwritten without ``force``; errors are :class:`BrokerDirError`, one line.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from edgesched.sync.security import (
    CaFiles,
    CertFiles,
    acl,
    broker_config,
    check_identity,
    issue,
    load_ca,
    make_ca,
    write_crl,
)
from edgesched.sync.topics import site_bridge_topic
from edgesched.sync.wire import TOPIC_ROOT

DEFAULT_DIR: Final = Path("/etc/edgesched/broker")
DEFAULT_PORT: Final = 8883
STATE: Final = "fleet.json"
SERVER_ID: Final = "broker"
#: (pattern, direction, qos) of a site broker's bridge, relative to it (``in``: from central):
#: the same as the field tests' (:mod:`edgesched.fieldtest.brokers`, which explains each).
BRIDGE_TOPICS: Final = (
    (f"{TOPIC_ROOT}/central/#", "in", 1),
    (f"{TOPIC_ROOT}/node/#", "out", 1),
    (f"{TOPIC_ROOT}/doc/#", "both", 1),
)


class BrokerDirError(Exception):
    """A broker directory that cannot be made, read or changed; the message says why."""


def bridge_id(site: str) -> str:
    """The identity a site broker's bridge logs in with at central's broker."""
    return f"bridge-{site}"


def split_address(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT`` or ``[V6]:PORT`` → (host, port); BrokerDirError if malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or "]" in port or (host.count(":") and not host.startswith("[")):
        host, port = text, ""
    host = host.strip("[]")
    if not host or any(c.isspace() for c in host):
        raise BrokerDirError(f"expected HOST or HOST:PORT, got {text!r}")
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise BrokerDirError(f"{text!r}: port must be 1-65535")
    return host, int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class FleetState:
    """``fleet.json``: what the broker's files are generated from."""

    role: str  # "central" or "site"
    address: str  # HOST:PORT the nodes dial
    port: int
    bind: str
    centrals: list[str]
    ca_dir: str
    user: str | None  # the account Mosquitto drops to (None: its default, mosquitto)
    site: str | None = None
    central_broker: str | None = None  # a site broker's bridge target
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {site, serial}
    revoked: list[str] = field(default_factory=list)  # hex serials
    removed: list[str] = field(default_factory=list)  # node ids removed
    sites: dict[str, dict[str, Any]] = field(default_factory=dict)  # site -> {address, dir}

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class BrokerDir:
    """The paths of one broker directory."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / STATE

    @property
    def conf(self) -> Path:
        return self.root / "mosquitto.conf"

    @property
    def acl(self) -> Path:
        return self.root / "acl"

    @property
    def crl(self) -> Path:
        return self.root / "crl.pem"

    @property
    def pid_file(self) -> Path:
        return self.root / "mosquitto.pid"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def server(self) -> CertFiles:
        d = self.root / "server"
        return CertFiles(SERVER_ID, d / f"{SERVER_ID}.crt", d / f"{SERVER_ID}.key", self.ca_cert)

    @property
    def ca_cert(self) -> Path:
        return Path(self.load().ca_dir) / "ca.crt"

    def client(self, identity: str) -> CertFiles:
        d = self.root / "clients"
        return CertFiles(identity, d / f"{identity}.crt", d / f"{identity}.key", self.ca_cert)

    def node_cert(self, node: str) -> Path:
        return self.root / "nodes" / f"{node}.crt"

    def join_file(self, node: str) -> Path:
        return self.root / "joins" / f"{node}.join"

    @property
    def unit(self) -> Path:
        return self.root / "edgesched-mosquitto.service"

    @property
    def central_snippet(self) -> Path:
        return self.root / "central-mqtt.toml"

    def load(self) -> FleetState:
        try:
            data = json.loads(self.state.read_text())
            return FleetState(**data)
        except FileNotFoundError:
            raise BrokerDirError(
                f"{self.root}: no broker here (no {STATE}; make one with `edgesched broker init "
                f"--dir {self.root}`)"
            ) from None
        except (OSError, ValueError, TypeError, RecursionError) as exc:
            raise BrokerDirError(f"{self.state}: unreadable: {exc}") from None

    def save(self, state: FleetState) -> None:
        tmp = self.state.with_name(STATE + ".tmp")
        tmp.write_text(state.to_json())
        tmp.chmod(0o600)
        tmp.replace(self.state)

    def ca(self) -> CaFiles:
        """The fleet CA with its key (BrokerDirError if only the certificate is here)."""
        try:
            return load_ca(Path(self.load().ca_dir))
        except FileNotFoundError as exc:
            raise BrokerDirError(
                f"{exc}: issuing certificates needs the fleet CA's key (on central's machine)"
            ) from None


@dataclass(frozen=True)
class InitOptions:
    """What ``edgesched broker init`` was asked for."""

    dir: Path = DEFAULT_DIR
    address: str | None = None  # HOST[:PORT] the nodes dial; default: this host's name
    port: int | None = None  # the listener's port (default: the address's, or 8883)
    bind: str = "0.0.0.0"
    names: tuple[str, ...] = ()  # more names/IPs for the server certificate
    centrals: tuple[str, ...] = ("central",)
    ca_dir: Path | None = None  # an existing fleet CA (certs init); default dir/ca
    site: str | None = None
    central_broker: str | None = None  # HOST:PORT of central's broker (a site's bridge)
    central_dir: Path | None = None  # central's broker dir: register the site there
    user: str | None = None  # the account Mosquitto runs as (default: mosquitto)
    force: bool = False


def init_broker(opts: InitOptions) -> tuple[BrokerDir, list[str]]:
    """Make the broker directory (see the module docstring); (its paths, what was done)."""
    bd = BrokerDir(opts.dir)
    if bd.state.exists() and not opts.force:
        raise BrokerDirError(
            f"{bd.state} exists: this directory has a broker already (pass --force to remake "
            "its files; admitted nodes are kept)"
        )
    if (opts.site is None) != (opts.central_broker is None):
        raise BrokerDirError("--site and --central-broker go together (a site broker's bridge)")
    centrals = [_identity(c, "--central-id") for c in opts.centrals] or ["central"]
    site = _identity(opts.site, "--site") if opts.site is not None else None
    try:
        host, port = split_address(opts.address or socket.getfqdn())
    except BrokerDirError as exc:
        raise BrokerDirError(f"--address: {exc}") from None
    if opts.port is not None:
        if not 0 < opts.port < 65536:
            raise BrokerDirError(f"--port: must be 1-65535, got {opts.port}")
        port = opts.port if opts.address is None or ":" not in opts.address else port
    listen_port = opts.port or port
    if opts.central_broker is not None:
        try:
            split_address(opts.central_broker)
        except BrokerDirError as exc:
            raise BrokerDirError(f"--central-broker: {exc}") from None
    done: list[str] = []
    previous = bd.load() if bd.state.exists() else None
    ca_dir = Path(opts.ca_dir) if opts.ca_dir else bd.root / "ca"
    bd.root.mkdir(parents=True, exist_ok=True)
    bd.root.chmod(0o755)
    try:
        if site is None and not (ca_dir / "ca.crt").exists():
            make_ca(ca_dir)
            done.append(f"made the fleet CA {ca_dir}/ca.crt (its key ca.key stays here, 0600)")
        ca = load_ca(ca_dir)
    except (FileNotFoundError, ValueError, OSError) as exc:
        hint = " (--ca-dir: central's broker directory's ca/, or `edgesched certs init`)"
        raise BrokerDirError(f"CA: {exc}{hint if site else ''}") from None
    state = FleetState(
        role="site" if site else "central",
        address=join_address(host, port),
        port=listen_port,
        bind=opts.bind,
        centrals=centrals,
        ca_dir=str(ca_dir.resolve()),
        user=opts.user,
        site=site,
        central_broker=opts.central_broker,
    )
    if previous is not None:
        state.nodes, state.revoked, state.removed = (
            previous.nodes,
            previous.revoked,
            previous.removed,
        )
        state.sites = previous.sites
    bd.save(state)
    names = list(dict.fromkeys([host, *opts.names, "localhost", "127.0.0.1"]))
    try:
        issue(ca, SERVER_ID, bd.root / "server", server_names=names, force=True)
        done.append(f"issued the broker's server certificate for {', '.join(names)}")
        for identity in [bridge_id(site)] if site else centrals:
            issue(ca, identity, bd.root / "clients", force=True)
            done.append(f"issued {identity}'s client certificate in {bd.root / 'clients'}")
    except (ValueError, OSError) as exc:
        raise BrokerDirError(f"cannot issue a certificate: {exc}") from None
    if site is not None and opts.central_dir is not None:
        central = BrokerDir(opts.central_dir)
        cstate = central.load()
        cstate.sites[site] = {"address": state.address, "dir": str(bd.root.resolve())}
        central.save(cstate)
        render(central)
        done.append(f"registered site {site} at central's broker {opts.central_dir}")
    render(bd)
    if site is None:
        _central_snippet(bd, state)
        done.append(f"wrote {bd.central_snippet}: central's [central.mqtt] table")
    bd.unit.write_text(mosquitto_unit(bd))
    done.append(f"wrote {bd.conf}, {bd.acl}, {bd.crl} and the unit {bd.unit}")
    return bd, done


def _identity(value: str, option: str) -> str:
    try:
        return check_identity(value)
    except ValueError as exc:
        raise BrokerDirError(f"{option}: {exc}") from None


def admitted(state: FleetState, site: str | None = None) -> list[str]:
    """The nodes with access (of ``site`` only, when given)."""
    return sorted(n for n, v in state.nodes.items() if site is None or v.get("site") == site)


def render(bd: BrokerDir) -> None:
    """(Re)write the ACL, the CRL and ``mosquitto.conf`` from ``fleet.json``."""
    state = bd.load()
    ca = CaFiles(Path(state.ca_dir) / "ca.crt", Path(state.ca_dir) / "ca.key")
    if state.role == "site":
        assert state.site is not None
        nodes = admitted(state, state.site)
        members = {state.site: nodes} if nodes else {}
        text = acl(state.centrals, nodes=nodes, site_members=members)
    else:
        nodes = admitted(state)
        sites: dict[str, list[str]] = {}
        for node, info in state.nodes.items():
            if info.get("site"):
                sites.setdefault(info["site"], []).append(node)
        bridges = {bridge_id(s): sites.get(s, []) for s in state.sites}
        text = acl(state.centrals, nodes=nodes, site_members=sites, bridges=bridges)
    _write(bd.acl, text.encode(), 0o640)
    if ca.key.exists():
        write_crl(ca, bd.crl, [int(s, 16) for s in state.revoked])
    elif not bd.crl.exists():
        raise BrokerDirError(f"{bd.crl}: missing, and no CA key here to make it")
    bd.data.mkdir(exist_ok=True)
    _write(bd.conf, mosquitto_conf(bd, state).encode(), 0o644)
    _hand_to_user(bd, state)


def mosquitto_conf(bd: BrokerDir, state: FleetState) -> str:
    try:
        text = broker_config(
            port=state.port,
            bind=state.bind,
            ca=Path(state.ca_dir) / "ca.crt",
            server_cert=bd.server,
            acl_path=bd.acl,
            persistence_dir=bd.data,
            user=state.user,
        )
    except ValueError as exc:
        raise BrokerDirError(str(exc)) from None
    head = f"# {state.role} broker of edgesched; regenerated from {bd.state}: do not edit.\n"
    lines = [
        # listener options (broker_config's listener block is last): removed nodes' serials
        f"crlfile {bd.crl}",
        "",
        f"pid_file {bd.pid_file}",
    ]
    if state.role == "site":
        assert state.site is not None and state.central_broker is not None
        host, port = split_address(state.central_broker)
        bridge = bd.client(bridge_id(state.site))
        lines += [
            "",
            "# The bridge to central's broker (edgesched.fieldtest.brokers says why each is so).",
            f"connection {bridge_id(state.site)}",
            f"address {join_address(host, port)}",
            f"remote_clientid {bridge_id(state.site)}",
            f"local_clientid {bridge_id(state.site)}.local",
            "cleansession false",
            "bridge_protocol_version mqttv311",
            "try_private true",
            "notifications true",
            f"notification_topic {site_bridge_topic(state.site)}",
            "keepalive_interval 5",
            "restart_timeout 1 2",
            "start_type automatic",
            f"bridge_cafile {Path(state.ca_dir) / 'ca.crt'}",
            f"bridge_certfile {bridge.cert}",
            f"bridge_keyfile {bridge.key}",
            "bridge_tls_version tlsv1.2",
            *[f"topic {pattern} {way} {qos}" for pattern, way, qos in BRIDGE_TOPICS],
        ]
    return head + text + "\n".join(lines) + "\n"


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)


def _hand_to_user(bd: BrokerDir, state: FleetState) -> None:
    """When root, let the account Mosquitto drops to read its key, ACL and CRL and write its
    persistence directory (group-readable, the CA key stays root's)."""
    name = state.user or "mosquitto"
    if os.geteuid() != 0 or name == "root":
        return
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return
    for path in (bd.server.key, bd.acl, bd.crl):
        os.chown(path, 0, entry.pw_gid)
        path.chmod(0o640)
    if state.role == "site":
        key = bd.client(bridge_id(state.site or "")).key
        os.chown(key, 0, entry.pw_gid)
        key.chmod(0o640)
    os.chown(bd.data, entry.pw_uid, entry.pw_gid)
    # Mosquitto writes its pid file after dropping to the user, in a directory it cannot write.
    bd.pid_file.touch(0o644)
    os.chown(bd.pid_file, entry.pw_uid, entry.pw_gid)


def _central_snippet(bd: BrokerDir, state: FleetState) -> None:
    lines = ["# [central.mqtt] for central's own connection to this broker (broker init)."]
    for central in state.centrals:
        files = bd.client(central)
        lines += [
            "[central.mqtt]" if central == state.centrals[0] else f"# {central}: [central.mqtt]",
            'host = "127.0.0.1"',
            f"port = {state.port}",
            "tls = true",
            f'ca_file = "{Path(state.ca_dir) / "ca.crt"}"',
            f'cert_file = "{files.cert}"',
            f'key_file = "{files.key}"',
        ]
    bd.central_snippet.write_text("\n".join(lines) + "\n")


def mosquitto_path() -> str:
    return shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def mosquitto_unit(bd: BrokerDir) -> str:
    """A systemd unit running Mosquitto with this directory's config; ``systemctl reload``
    is the SIGHUP that rereads the ACL and the CRL."""
    return (
        "# written by `edgesched broker init`: Mosquitto for edgesched's fleet\n"
        "[Unit]\n"
        "Description=Mosquitto MQTT broker for edgesched\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={mosquitto_path()} -c {bd.conf}\n"
        "ExecReload=/bin/kill -HUP $MAINPID\n"
        "Restart=on-failure\n"
        "RestartSec=2\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def running_pid(bd: BrokerDir) -> int | None:
    """The pid in ``mosquitto.pid`` if that process is a running Mosquitto, else None."""
    try:
        pid = int(bd.pid_file.read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm == "mosquitto" else None


def reload(bd: BrokerDir) -> str:
    """SIGHUP the running Mosquitto of ``bd`` (it rereads the ACL and, for new connections,
    the CRL); one line saying what happened."""
    pid = running_pid(bd)
    if pid is None:
        return (
            f"the broker is not running (no live Mosquitto in {bd.pid_file}): it reads the new "
            f"files when started (mosquitto -c {bd.conf})"
        )
    # A Mosquitto that has written its pid file but not yet set its handlers would die of
    # the SIGHUP (its default action): wait until it catches it (SigCgt in /proc).
    deadline = time.monotonic() + 5.0
    while not _catches_sighup(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        raise BrokerDirError(f"cannot signal Mosquitto (pid {pid}): {exc.strerror}") from None
    return f"reloaded the broker (SIGHUP to Mosquitto pid {pid})"


def _catches_sighup(pid: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGHUP - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return True  # cannot tell: signal it


def start_command(bd: BrokerDir) -> Sequence[str]:
    """How to run this broker in the foreground."""
    return (mosquitto_path(), "-c", str(bd.conf))
