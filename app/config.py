"""TOML configuration: load, validate and turn into the core's frozen config objects.

Every problem raises :class:`ConfigError` whose message starts with the dotted key path of the
offending value (``policy.tidal.windows[2].shares.face-recognition: ...``), so a typo or an
out-of-range number is found without reading code. Unknown keys are errors everywhere.

Each section is one small ``_parse_<section>(table)`` function over a :class:`_Table`, which
checks key names and value types; a new section is a dataclass, a parse function and one line
in :func:`parse_config`.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import math
import os
import re
import shutil
import ssl
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from edgesched.core.plugins import SCORES
from edgesched.core.policy import PolicyConfig, PolicyMode
from edgesched.core.tidal import (
    TidalProfile,
    TidalWindow,
    campus_profile,
    format_clock,
    parse_clock,
)

if TYPE_CHECKING:
    from edgesched.sync.session import Endpoint
    from edgesched.sync.signing import FrameSigning

T = TypeVar("T")
E = TypeVar("E", bound=StrEnum)

#: Score plugin names a ``[policy.weights]`` table may set.
KNOWN_WEIGHTS: frozenset[str] = frozenset(SCORES)

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class ConfigError(ValueError):
    """A config problem; ``str(err)`` is ``"<key path>: <problem>"``.

    ``key`` is the dotted path of the offending value (or the file for file-level problems),
    ``source`` the file (or ``"<config>"``) the data came from.
    """

    def __init__(self, key: str, problem: str, source: str = "<config>") -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem
        self.source = source


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The simulator's knobs: scenario name, seed, length, load scale and scheduling cycle.

    ``step_s`` is how long after an event the scheduling cycle it triggers runs (events within
    it share one cycle). ``affinity_load`` is the load of the 48-core ARM affinity experiment.
    """

    scenario: str = "campus"
    seed: int = 0
    days: float = 1.0
    scale: float = 1.0
    step_s: float = 1.0
    affinity_load: float = 0.7

    def __post_init__(self) -> None:
        if not self.scenario:
            raise ValueError("scenario must not be empty")
        if self.seed < 0:
            raise ValueError("seed must be >= 0")
        _check_positive(self, "days", "scale", "step_s")
        if not 0 <= self.affinity_load <= 1:
            raise ValueError(f"affinity_load must be in [0, 1], got {self.affinity_load}")


_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: An etcd client endpoint: host:port, [v6]:port
_ENDPOINT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}")


def parse_host_port(text: str) -> tuple[str, int]:
    """``(host, port)`` from ``"host:port"`` (an IPv6 address in brackets: ``"[::1]:1883"``,
    returned without them); ValueError says what is wrong: an empty host, a missing or bad
    port (1-65535), a bare IPv6 address, a character no host name has."""
    head, colon, tail = text.rpartition(":")
    if not colon:
        raise ValueError(f'expected "host:port", got {text!r} (no port)')
    if not head:
        raise ValueError(f'expected "host:port", got {text!r} (empty host)')
    if not tail.isascii() or not tail.isdigit():
        raise ValueError(f'expected "host:port", got {text!r} (port {tail!r} is not a number)')
    port = int(tail)
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port} in {text!r}")
    if head.startswith("[") and head.endswith("]"):
        host = head[1:-1]
        if not host or not re.fullmatch(r"[0-9A-Fa-f:.]+", host) or ":" not in host:
            raise ValueError(f"expected an IPv6 address in brackets, got {text!r}")
        return host, port
    if ":" in head:
        raise ValueError(f'an IPv6 address goes in brackets ("[::1]:1883"), got {text!r}')
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", head):
        raise ValueError(f"expected a host name or address before the port, got {text!r}")
    return head, port


def _check_positive(config: object, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be finite and > 0, got {value}")


def _check_id(value: str, what: str) -> None:
    if not _NODE_ID.fullmatch(value):
        raise ValueError(
            f"{what} must be 1-64 letters, digits, '-' or '_' starting with a letter or "
            f"digit, got {value!r}"
        )


def _check_api(host: str, port: int, allow_remote: bool) -> None:
    if not 0 <= port < 65536:
        raise ValueError(f"api_port must be in 0..65535, got {port}")
    if host not in _LOOPBACK and not allow_remote:
        raise ValueError(
            f"api_host {host!r} is not loopback; set allow_remote_api = true to "
            "expose the API beyond this machine"
        )


@dataclass(frozen=True, slots=True)
class MqttConfig:
    """The broker and how to reach it: one connection per peer, under its fixed identity.

    ``tls`` with ``ca_file`` (the fleet CA from ``edgesched certs init``) and, for certificate
    identity, ``cert_file``/``key_file`` (the broker then takes the certificate's CN as the
    username). Without TLS, ``password_file`` holds the password of ``username`` (default: the
    peer's own id). Plain TCP to a broker that is not on loopback is refused unless
    ``allow_plain_remote``: credentials and documents would cross the network in clear.
    ``session_expiry_s``: how long the broker keeps our QoS 1 messages while we are away.
    ``reconnect_max_s``: the cap of the reconnect backoff (full jitter below it): after a long
    partition the link returns within about this long, and a fleet cut off together spreads its
    reconnects over it. ``hosts``: the other members of a clustered broker (``"host:port"``,
    ``"[v6]:port"``), the session's :attr:`~edgesched.sync.session.Endpoint.alternates`: a
    refused or lost connection moves on to the next address at once, round robin from
    ``host``/``port`` (docs/brokers.md); the TLS and plain-remote rules apply to each.
    ``signing_key``: this peer's Ed25519 key (``edgesched certs signing-key``), and
    ``peer_keys``: the directory of the peers' public keys (``<identity>.pub``): with both,
    every document message is signed and every one received must carry a valid signature
    (``require_signed``; false only while a fleet is being keyed: unsigned messages are then
    taken, signed ones still checked). See :mod:`edgesched.sync.signing`.
    """

    host: str = "127.0.0.1"
    port: int = 1883
    keepalive_s: int = 5
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    username: str = ""
    password_file: str = ""
    allow_plain_remote: bool = False
    session_expiry_s: int = 86400
    reconnect_max_s: float = 10.0
    protocol: str = "5"
    hosts: tuple[str, ...] = ()
    signing_key: str = ""
    peer_keys: str = ""
    require_signed: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in ("5", "3.1.1"):
            raise ValueError(f"protocol must be '5' or '3.1.1', got {self.protocol!r}")
        if bool(self.signing_key) != bool(self.peer_keys):
            raise ValueError("signing_key and peer_keys go together")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        seen = {(self.host, self.port): "host/port"}
        for i, (host, port) in enumerate(self.alternates):
            # (self.alternates raised "hosts[i]: ..." for an entry that is not host:port)
            if (host, port) in seen:
                raise ValueError(
                    f"hosts[{i}]: {self.hosts[i]!r} is already listed (as {seen[host, port]})"
                )
            seen[host, port] = f"hosts[{i}]"
        if not 1 <= self.keepalive_s <= 3600:
            raise ValueError(f"keepalive_s must be in 1..3600, got {self.keepalive_s}")
        if not 0 <= self.session_expiry_s <= 2**32 - 1:
            raise ValueError(
                f"session_expiry_s must be in 0..4294967295, got {self.session_expiry_s}"
            )
        if not (math.isfinite(self.reconnect_max_s) and self.reconnect_max_s > 0):
            raise ValueError(f"reconnect_max_s must be finite and > 0, got {self.reconnect_max_s}")
        if self.tls and not self.ca_file:
            raise ValueError("tls = true needs ca_file (the fleet CA certificate)")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together")
        if (self.cert_file or self.ca_file) and not self.tls:
            raise ValueError("ca_file / cert_file / key_file are set but tls is false")
        for where, (host, _) in zip(seen.values(), seen, strict=True):
            if not self.tls and host not in _LOOPBACK and not self.allow_plain_remote:
                which = "" if where == "host/port" else f" ({where})"
                raise ValueError(
                    f"refusing plain MQTT (no TLS) to non-loopback host {host!r}{which}: set "
                    "tls = true with ca_file, or allow_plain_remote = true on a trusted network"
                )

    @property
    def alternates(self) -> tuple[tuple[str, int], ...]:
        """``hosts`` as ``(host, port)`` pairs (ValueError ``"hosts[i]: ..."`` for a bad one)."""
        out = []
        for i, text in enumerate(self.hosts):
            try:
                out.append(parse_host_port(text))
            except ValueError as exc:
                raise ValueError(f"hosts[{i}]: {exc}") from None
        return tuple(out)

    def frame_signing(self, identifier: str) -> FrameSigning | None:
        """The signing of peer ``identifier``'s document messages (None: not configured);
        reads the key now, so a missing or bad one fails at start with its path named
        (ValueError)."""
        if not self.signing_key:
            return None
        from edgesched.sync.signing import FrameSigning, KeyRing, Signer, load_signing_key

        key = load_signing_key(Path(self.signing_key))
        keys = Path(self.peer_keys)
        if not keys.is_dir():
            raise ValueError(f"peer_keys {self.peer_keys}: not a directory")
        return FrameSigning(Signer(identifier, key), KeyRing(keys), required=self.require_signed)

    def endpoint(self, identifier: str) -> Endpoint:
        """The connection parameters for peer ``identifier``; reads the key files now, so a
        missing or unreadable one fails at start with its path named (ValueError)."""
        from edgesched.sync.session import Endpoint, tls_context

        password: str | None = None
        if self.password_file:
            try:
                password = Path(self.password_file).read_text().strip()
            except OSError as exc:
                raise ValueError(f"password_file {self.password_file}: {exc.strerror}") from None
        context = None
        if self.tls:
            try:
                context = tls_context(self.ca_file, self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"TLS files (ca_file {self.ca_file}, cert_file {self.cert_file}): {exc}"
                ) from None
        return Endpoint(
            self.host,
            self.port,
            identifier,
            keepalive_s=self.keepalive_s,
            username=self.username or (identifier if password is not None else None),
            password=password,
            tls=context,
            session_expiry_s=self.session_expiry_s,
            protocol=self.protocol,
            alternates=self.alternates,
        )


class TelemetrySource(StrEnum):
    """Where an edge node's telemetry takes its utilization and power (``[edge]
    telemetry_source``; :mod:`edgesched.edge.telemetry`)."""

    HOST = "host"  # this machine, as the agent measures it (psutil, power sensors)
    RESERVED = "reserved"  # the server the node registered as: what its tasks reserve


_TELEMETRY_SOURCES = tuple(m.value for m in TelemetrySource)


#: The finest time-slicing share of one accelerator ``[edge] accel_time_slices`` may ask.
MAX_ACCEL_TIME_SLICES = 64


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    """The edge sub-engine: identity, state directory, local API, lease and loop timings.

    ``node_id`` is the node's fixed identity (also its MQTT client id). The local API listens
    on loopback only unless ``allow_remote_api`` is set. The node is *connected* while it has
    heard central within ``lease_s``, *autonomous* after that. ``forecast_model`` (the
    per-class 15-minute forecaster) and ``placement_model`` (the ``learned`` mode's score) are
    ONNX files; empty: the ones shipped in ``edgesched.policies``. Central can swap either at
    run time (``PUT /v1/models/{kind}``). ``park_command`` / ``wake_command``: argv run when
    central parks or wakes this node (``edgesched.edge.power``; empty: bookkeeping only).
    ``hal_root``: read hardware from this directory tree instead of ``/`` (simulated nodes:
    the demo, tests); the node's tasks still run on this machine. ``container_runtime``
    (``docker``, ``podman`` or a path) runs a task that names an image for this node's
    architecture in that image; empty: such a task runs its command as it is, with the image
    in ``EDGESCHED_IMAGE`` (see :mod:`edgesched.edge.container`). ``history_retention_s``:
    finished tasks (exited, failed, cancelled) and decisions older than this leave the node's
    SQLite tables, a bounded batch every ``sample_s``; their counts per day and state stay
    (``Store.history``). Default a day; keep it at least central's ``assignment_retention_s``
    (a task central still assigns is never pruned, whatever this says).
    ``telemetry_source``: where the telemetry central shows takes its CPU, memory and power:
    ``host`` (the default, a real gateway) measures this machine; ``reserved`` reports the
    server the node registered as, from what its placed and running tasks reserve and its
    registered power model (a simulated node, ``hal_root`` elsewhere: several of them share
    one host, whose measurements would describe none of them).
    ``accel_time_slices``: the time-slicing share of each compute accelerator that offers no
    hardware slices (MIG instances, SR-IOV virtual functions): a task may ask ``accel_slices``
    of one (1..this); 1 (the default): whole devices only (see :mod:`edgesched.core.slices`).
    """

    node_id: str = ""
    site: str = "default"
    state_dir: str = "/var/lib/edgesched"
    api_host: str = "127.0.0.1"
    api_port: int = 7380
    allow_remote_api: bool = False
    lease_s: float = 15.0
    cycle_s: float = 1.0
    sample_s: float = 5.0
    stop_grace_s: float = 10.0
    forecast_model: str = ""
    placement_model: str = ""
    park_command: tuple[str, ...] = ()
    wake_command: tuple[str, ...] = ()
    centrals: tuple[str, ...] = ("central",)
    hal_root: str = "/"
    container_runtime: str = ""
    history_retention_s: float = 86_400.0
    telemetry_source: TelemetrySource = TelemetrySource.HOST
    accel_time_slices: int = 1
    #: The other members of this node's site (the nodes behind the same site broker, listed
    #: alike in each member's config): while central is unreachable they elect one of them
    #: to schedule for the whole site (edgesched.edge.site). Empty: the node is alone.
    site_peers: tuple[str, ...] = ()
    #: How long a site member must be gone before the coordinator restarts its service
    #: replicas on the others (while central is unreachable).
    site_failover_s: float = 10.0
    #: How long a local submission waits unplaced before it is offered to the site.
    site_offer_after_s: float = 2.0
    mqtt: MqttConfig = field(default_factory=MqttConfig)

    def __post_init__(self) -> None:
        for peer in self.site_peers:
            _check_id(peer, "site_peers")
        if self.node_id and self.node_id in self.site_peers:
            raise ValueError("site_peers: lists the node itself; list the other members only")
        if len(set(self.site_peers)) != len(self.site_peers):
            raise ValueError("site_peers: a member is listed twice")
        if not 1 <= self.accel_time_slices <= MAX_ACCEL_TIME_SLICES:
            raise ValueError(
                f"accel_time_slices must be an integer in [1, {MAX_ACCEL_TIME_SLICES}], "
                f"got {self.accel_time_slices}"
            )
        if self.telemetry_source not in _TELEMETRY_SOURCES:
            raise ValueError(
                f"telemetry_source must be one of {', '.join(_TELEMETRY_SOURCES)}, got "
                f"{self.telemetry_source!r}"
            )
        if not math.isfinite(self.history_retention_s) or self.history_retention_s <= 0:
            raise ValueError(
                f"history_retention_s must be a finite number > 0, got {self.history_retention_s}"
            )
        if self.container_runtime not in ("", "docker", "podman") and not (
            self.container_runtime.startswith("/") and "\0" not in self.container_runtime
        ):
            raise ValueError(
                "container_runtime must be docker, podman or an absolute path, got "
                f"{self.container_runtime!r}"
            )
        for central in self.centrals:
            _check_id(central, "centrals")
        if not self.centrals:
            raise ValueError("centrals: at least one central id is needed")
        if self.node_id:
            _check_id(self.node_id, "node_id")
        _check_api(self.api_host, self.api_port, self.allow_remote_api)
        _check_positive(self, "lease_s", "cycle_s", "sample_s", "site_failover_s")
        if self.stop_grace_s < 0:
            raise ValueError("stop_grace_s must be >= 0")
        if not math.isfinite(self.site_offer_after_s) or self.site_offer_after_s < 0:
            raise ValueError(f"site_offer_after_s must be >= 0, got {self.site_offer_after_s}")


@dataclass(frozen=True, slots=True)
class CentralConfig:
    """The central engine: identity, state, heartbeat, REST API and the broker.

    ``central_id`` is central's fixed identity (MQTT username and client id; the ACL's
    ``user`` block). ``nodes``: the node ids central accepts documents from; empty accepts
    any node id that publishes its own document on its own topic (the broker's ACL decides
    who may). ``heartbeat_s``: how often central tells nodes it is alive (keep it well under
    the nodes' ``lease_s``). ``snapshot_s``: how often changed replicas are written to SQLite.
    ``cycle_s``: how often central places waiting tasks and checks failovers and conflicts.
    ``failover_after_s``: how long a node must have been offline before its services
    (restart ``always``) are placed elsewhere. ``reconcile``: which copy of a task placed twice
    keeps running after a heal (keep-original, keep-replacement, best-score, longest-running).
    ``peers``: fellow central replicas that co-write the policy document. A node offline for
    less than ``failover_after_s`` is *suspect*, then *partitioned*, and *dead* past
    ``dead_after_s`` (central cannot tell a cut link from a dead node by itself: these are
    policy). ``k8s_extender`` serves the kube-scheduler extender endpoints under ``/v1/k8s``.
    ``forecast_model`` / ``placement_model``: ONNX files central starts with (empty: the
    shipped ones); an admin swaps them for the whole fleet with ``PUT /v1/models/{kind}``.
    ``park_nodes``: in energy and learned modes, park idle nodes beyond the forecast's need
    and wake them ahead of a peak (``edgesched.central.power``); off by default.
    ``assignment_retention_s``: a finished (or cancelled) task submitted at central leaves the
    policy document this long after its node reported it finished (default a day).
    ``etcd_endpoints`` (``"host:port"``): the etcd cluster that grants central replicas the
    ownership of ``shards`` shards of the fleet by leases of ``lease_ttl_s`` seconds
    (``edgesched.central.leases``, [scaling.md](docs/scaling.md)); empty: no etcd, the
    replicas elect a leader among their peers as before.
    ``silent_after_s``: a node whose status says online but of which central heard nothing
    (document sync, telemetry, status) for longer than this reads offline ("silent"), since
    it was last heard: the liveness signal that does not need the broker's last will (a will
    is lost with a clustered broker's member, docs/brokers.md). 0 disables it.
    ``cold_after_s``: a node's replica and desired-state document that nobody used for
    between one and two of these periods are held as their encoded state only (about a tenth
    of the memory) until next used (``edgesched.sync.freezer``). 0 keeps every document live.
    ``replica_cold_after_s``: the period of the node replicas' own sweep (with
    ``cold_after_s`` > 0): a replica unused for one to two of these (2 s) is frozen, so one
    whose node changes a task every half minute is live only a few seconds after each change
    (under the minute's sweep alone nearly every replica of such a fleet stayed live:
    ~80-110 KB each, a gigabyte at 10,000 nodes); a thaw and a freeze cost ~0.25 ms. 0: the
    replicas wait for the ``cold_after_s`` sweep like the desired-state documents.
    ``resync_per_s``: how many step 1s per second central's document peers send on their own
    initiative, after a burst of 100 (on every connect each of its two documents per node
    resyncs; ``edgesched.sync.pacer``): 20,000 at once at 10,000 nodes lost central its broker.
    Answers to the nodes' own step 1s are not paced.
    """

    central_id: str = "central"
    state_dir: str = "/var/lib/edgesched-central"
    api_host: str = "127.0.0.1"
    api_port: int = 7300
    allow_remote_api: bool = False
    heartbeat_s: float = 1.0
    snapshot_s: float = 5.0
    cycle_s: float = 1.0
    failover_after_s: float = 30.0
    dead_after_s: float = 3600.0
    reconcile: str = "keep-original"
    k8s_extender: bool = False
    forecast_model: str = ""
    placement_model: str = ""
    park_nodes: bool = False
    assignment_retention_s: float = 86_400.0
    cold_after_s: float = 60.0
    replica_cold_after_s: float = 2.0
    nodes: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()
    etcd_endpoints: tuple[str, ...] = ()
    shards: int = 64
    lease_ttl_s: float = 5.0
    #: 20 s: nodes publish telemetry every ``sample_s`` (5 s by default), QoS 0, so four
    #: intervals ride out three lost samples in a row and a slow sample step; the document
    #: peers are no steady signal (they resync on connect or when asked, and send updates
    #: only on change). Longer than a will's 1.5 keepalives (7.5 s at the default 5 s), so on
    #: one Mosquitto the will still says it first; well under ``failover_after_s`` (30 s),
    #: which counts from the moment the node was last heard. Keep it above 3x the nodes'
    #: ``sample_s`` when they sample more slowly.
    silent_after_s: float = 20.0
    #: 1,000/s: 20,000 documents (10,000 nodes) resync within 20 s of a connect, inside
    #: ``silent_after_s`` (the nodes' answers are signs of life too)
    resync_per_s: float = 1000.0
    #: An assignment its node has not taken up this long after it was made, while the node is
    #: connected and its document fresh, is placed again (a node that ignored it: a task of
    #: its own with that id). 0: never.
    take_up_s: float = 30.0
    #: The services' autoscaler runs on a clock this many times faster than real time (its
    #: 5-minute load bins, its decisions every 15 s, the scale-in delay, a report's
    #: freshness): for a demo replaying a day at accelerated time. 1 in production.
    autoscale_time_scale: float = 1.0
    mqtt: MqttConfig = field(default_factory=MqttConfig)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.silent_after_s) and self.silent_after_s >= 0):
            raise ValueError(
                f"silent_after_s must be finite and >= 0 (0 disables), got {self.silent_after_s}"
            )
        if not (math.isfinite(self.resync_per_s) and self.resync_per_s > 0):
            raise ValueError(f"resync_per_s must be finite and > 0, got {self.resync_per_s}")
        for endpoint in self.etcd_endpoints:
            if (
                not _ENDPOINT.fullmatch(endpoint)
                or not 0 < int(endpoint.rpartition(":")[2]) < 65536
            ):
                raise ValueError(
                    f"etcd_endpoints: expected host:port (port 1-65535), got {endpoint!r}"
                )
        if len(set(self.etcd_endpoints)) != len(self.etcd_endpoints):
            raise ValueError("etcd_endpoints: an endpoint is listed twice")
        if not 1 <= self.shards <= 65536:
            raise ValueError(f"shards must be in 1..65536, got {self.shards}")
        if not (math.isfinite(self.lease_ttl_s) and self.lease_ttl_s >= 2):
            raise ValueError(
                f"lease_ttl_s must be >= 2 (etcd's shortest lease), got {self.lease_ttl_s}"
            )
        for name in (self.central_id, *self.nodes, *self.peers):
            _check_id(name, "ids")
        _check_api(self.api_host, self.api_port, self.allow_remote_api)
        from edgesched.sync.reconcile import ReconcilePolicy

        if self.reconcile not in {p.value for p in ReconcilePolicy}:
            choices = ", ".join(p.value for p in ReconcilePolicy)
            raise ValueError(f"reconcile must be one of {choices}, got {self.reconcile!r}")
        if self.central_id in self.peers:
            raise ValueError("peers must not include central_id itself")
        if self.failover_after_s < 0 or not math.isfinite(self.failover_after_s):
            raise ValueError(
                f"failover_after_s must be finite and >= 0, got {self.failover_after_s}"
            )
        _check_positive(self, "heartbeat_s", "snapshot_s", "cycle_s")


@dataclass(frozen=True, slots=True)
class EdgeschedConfig:
    """The whole configuration, one field per top-level TOML table."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    edge: EdgeConfig = field(default_factory=EdgeConfig)
    central: CentralConfig = field(default_factory=CentralConfig)


def builtin_profiles() -> dict[str, TidalProfile]:
    """Tidal profiles a config can name with ``policy.tidal.profile``."""
    return {"campus": campus_profile(), "none": TidalProfile()}


def load_config(path: Path) -> EdgeschedConfig:
    """Read and validate the TOML file at ``path``."""
    source = str(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(source, "no such file", source) from None
    except OSError as e:
        raise ConfigError(source, f"cannot read: {e.strerror or e}", source) from e
    except UnicodeDecodeError as e:
        raise ConfigError(source, f"not valid UTF-8: {e.reason} at byte {e.start}", source) from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, f"not valid TOML: {e}", source) from e
    return parse_config(data, source)


def parse_config(data: Mapping[str, object], source: str = "<config>") -> EdgeschedConfig:
    """Validate already-parsed TOML ``data`` (``source`` names it in errors)."""
    if not isinstance(data, Mapping):
        raise ConfigError(source, f"expected a table, got {_type_name(data)}", source)
    root = _Table(data, "", source)
    root.check_keys("policy", "sim", "edge", "central")
    return EdgeschedConfig(
        policy=_parse_policy(root.table("policy")),
        sim=_parse_sim(root.table("sim")),
        edge=_parse_edge(root.table("edge")),
        central=_parse_central(root.table("central")),
    )


# --- sections ----------------------------------------------------------------------------------


def _parse_policy(t: _Table) -> PolicyConfig:
    d = PolicyConfig()
    t.check_keys(
        "mode",
        "preemption",
        "park_idle_after_s",
        "spare_cpu_fraction",
        "min_spare_cpu",
        "max_migrations_per_cycle",
        "consolidate_below",
        "max_preemptions_per_task",
        "accel_reserve_cpu",
        "accel_reserve_mem_gib",
        "score_nodes",
        "weights",
        "tidal",
    )
    mode = t.choice("mode", d.mode)
    tidal = _parse_tidal(t.table("tidal"))
    weights = _parse_weights(t.table("weights"))
    preemption = t.boolean("preemption", d.preemption)
    park_idle_after_s = t.number("park_idle_after_s", d.park_idle_after_s, low=0)
    spare_cpu_fraction = t.number("spare_cpu_fraction", d.spare_cpu_fraction, 0, 10)
    min_spare_cpu = t.number("min_spare_cpu", d.min_spare_cpu, low=0)
    max_migrations = t.integer("max_migrations_per_cycle", d.max_migrations_per_cycle, low=0)
    consolidate_below = t.number("consolidate_below", d.consolidate_below, 0, 1)
    max_preemptions = t.integer("max_preemptions_per_task", d.max_preemptions_per_task, low=0)
    reserve_cpu = t.number("accel_reserve_cpu", d.accel_reserve_cpu, low=0)
    reserve_mem = t.number("accel_reserve_mem_gib", d.accel_reserve_mem_gib, low=0)
    score_nodes = t.integer("score_nodes", d.score_nodes, low=0)
    return t.build(
        lambda: PolicyConfig(
            mode=mode,
            tidal=tidal,
            weights=weights,
            preemption=preemption,
            park_idle_after_s=park_idle_after_s,
            spare_cpu_fraction=spare_cpu_fraction,
            min_spare_cpu=min_spare_cpu,
            max_migrations_per_cycle=max_migrations,
            consolidate_below=consolidate_below,
            max_preemptions_per_task=max_preemptions,
            accel_reserve_cpu=reserve_cpu,
            accel_reserve_mem_gib=reserve_mem,
            score_nodes=score_nodes,
        )
    )


def _parse_weights(t: _Table) -> dict[str, float]:
    t.check_keys(*sorted(KNOWN_WEIGHTS))
    return {name: t.number(name, 0.0, low=0) for name in t.data}


def _parse_tidal(t: _Table) -> TidalProfile:
    t.check_keys("profile", "name", "windows")
    if "profile" in t.data and "windows" in t.data:
        raise ConfigError(t.path, "set either profile or windows, not both", t.source)
    if "windows" not in t.data:
        if "name" in t.data:
            raise t.error("name", "only valid together with windows")
        profiles = builtin_profiles()
        name = t.string("profile", "none")
        if name not in profiles:
            raise t.error("profile", f"unknown profile {name!r} (built-in: {_listing(profiles)})")
        return profiles[name]
    windows = tuple(_parse_window(w) for w in t.tables("windows"))
    seen: set[str] = set()
    for i, w in enumerate(windows):
        if w.name in seen:
            path = f"{t.child('windows')}[{i}].name"
            raise ConfigError(path, f"duplicate window name {w.name!r}", t.source)
        seen.add(w.name)
    return TidalProfile(name=t.string("name", "custom"), windows=windows)


def _parse_window(t: _Table) -> TidalWindow:
    t.check_keys("name", "start", "end", "shares", "rotate", "rotate_share", "slice_minutes")
    name = t.string("name")
    start_s = t.clock("start")
    end_s = t.clock("end")
    shares_table = t.table("shares")
    shares = {k: shares_table.number(k, 0.0, 0, 1) for k in shares_table.data}
    rotate = t.strings("rotate")
    if not rotate:
        for key in ("rotate_share", "slice_minutes"):
            if key in t.data:
                raise t.error(key, "only valid together with a non-empty rotate")
    elif "rotate_share" not in t.data:
        raise t.error("rotate_share", "missing (required when rotate is set)")
    rotate_share = t.number("rotate_share", 0.0, 0, 1)
    slice_minutes = t.number("slice_minutes", 30.0, low=0, low_open=True)
    total = sum(shares.values()) + rotate_share
    if total > 1 + 1e-9:
        extra = " (with rotate_share)" if rotate_share else ""
        raise t.error("shares", f"add up to {total:g}{extra}, more than 1")
    return t.build(
        lambda: TidalWindow(
            name=name,
            start_s=start_s,
            end_s=end_s,
            shares=shares,
            rotate=rotate,
            rotate_share=rotate_share,
            slice_s=60.0 * slice_minutes,
        )
    )


def _parse_sim(t: _Table) -> SimConfig:
    d = SimConfig()
    t.check_keys(*(f.name for f in fields(SimConfig)))
    scenario = t.string("scenario", d.scenario)
    seed = t.integer("seed", d.seed, low=0)
    days = t.number("days", d.days, low=0, low_open=True)
    scale = t.number("scale", d.scale, low=0, low_open=True)
    step_s = t.number("step_s", d.step_s, low=0, low_open=True)
    affinity_load = t.number("affinity_load", d.affinity_load, 0, 1)
    return t.build(lambda: SimConfig(scenario, seed, days, scale, step_s, affinity_load))


def _parse_edge(t: _Table) -> EdgeConfig:
    d = EdgeConfig()
    t.check_keys(*(f.name for f in fields(EdgeConfig)))
    mqtt = _parse_mqtt(t.table("mqtt"))
    return t.build(
        lambda: EdgeConfig(
            node_id=t.string("node_id", ""),
            site=t.string("site", d.site),
            state_dir=t.string("state_dir", d.state_dir),
            api_host=t.string("api_host", d.api_host),
            api_port=t.integer("api_port", d.api_port, low=0),
            allow_remote_api=t.boolean("allow_remote_api", d.allow_remote_api),
            lease_s=t.number("lease_s", d.lease_s, low=0, low_open=True),
            cycle_s=t.number("cycle_s", d.cycle_s, low=0, low_open=True),
            sample_s=t.number("sample_s", d.sample_s, low=0, low_open=True),
            stop_grace_s=t.number("stop_grace_s", d.stop_grace_s, low=0),
            forecast_model=t.string("forecast_model", d.forecast_model, allow_empty=True),
            placement_model=t.string("placement_model", d.placement_model, allow_empty=True),
            park_command=t.strings("park_command"),
            wake_command=t.strings("wake_command"),
            centrals=t.strings("centrals") if "centrals" in t.data else d.centrals,
            hal_root=t.string("hal_root", d.hal_root),
            container_runtime=t.string("container_runtime", d.container_runtime, allow_empty=True),
            history_retention_s=t.number(
                "history_retention_s", d.history_retention_s, low=0, low_open=True
            ),
            telemetry_source=t.choice("telemetry_source", d.telemetry_source),
            accel_time_slices=t.integer("accel_time_slices", d.accel_time_slices, low=1),
            site_peers=t.strings("site_peers") if "site_peers" in t.data else d.site_peers,
            site_failover_s=t.number("site_failover_s", d.site_failover_s, low=0, low_open=True),
            site_offer_after_s=t.number("site_offer_after_s", d.site_offer_after_s, low=0),
            mqtt=mqtt,
        )
    )


def _parse_central(t: _Table) -> CentralConfig:
    d = CentralConfig()
    t.check_keys(*(f.name for f in fields(CentralConfig)))
    mqtt = _parse_mqtt(t.table("mqtt"))
    return t.build(
        lambda: CentralConfig(
            central_id=t.string("central_id", d.central_id),
            state_dir=t.string("state_dir", d.state_dir),
            api_host=t.string("api_host", d.api_host),
            api_port=t.integer("api_port", d.api_port, low=0),
            allow_remote_api=t.boolean("allow_remote_api", d.allow_remote_api),
            heartbeat_s=t.number("heartbeat_s", d.heartbeat_s, low=0, low_open=True),
            snapshot_s=t.number("snapshot_s", d.snapshot_s, low=0, low_open=True),
            cycle_s=t.number("cycle_s", d.cycle_s, low=0, low_open=True),
            failover_after_s=t.number("failover_after_s", d.failover_after_s, low=0),
            dead_after_s=t.number("dead_after_s", d.dead_after_s, low=0),
            k8s_extender=t.boolean("k8s_extender", d.k8s_extender),
            forecast_model=t.string("forecast_model", d.forecast_model, allow_empty=True),
            placement_model=t.string("placement_model", d.placement_model, allow_empty=True),
            park_nodes=t.boolean("park_nodes", d.park_nodes),
            assignment_retention_s=t.number(
                "assignment_retention_s", d.assignment_retention_s, low=0
            ),
            reconcile=t.string("reconcile", d.reconcile),
            nodes=t.strings("nodes"),
            peers=t.strings("peers"),
            etcd_endpoints=t.strings("etcd_endpoints"),
            shards=t.integer("shards", d.shards, low=1),
            lease_ttl_s=t.number("lease_ttl_s", d.lease_ttl_s, low=2),
            silent_after_s=t.number("silent_after_s", d.silent_after_s, low=0),
            take_up_s=t.number("take_up_s", d.take_up_s, low=0),
            autoscale_time_scale=t.number(
                "autoscale_time_scale", d.autoscale_time_scale, low=1, high=100_000
            ),
            cold_after_s=t.number("cold_after_s", d.cold_after_s, low=0),
            replica_cold_after_s=t.number("replica_cold_after_s", d.replica_cold_after_s, low=0),
            resync_per_s=t.number("resync_per_s", d.resync_per_s, low=0, low_open=True),
            mqtt=mqtt,
        )
    )


def _parse_mqtt(t: _Table) -> MqttConfig:
    d = MqttConfig()
    t.check_keys(*(f.name for f in fields(MqttConfig)))

    def text(key: str) -> str:
        return t.string(key, "") if key in t.data else ""

    hosts = t.strings("hosts")
    for i, item in enumerate(hosts):  # each entry named by its own path
        try:
            parse_host_port(item)
        except ValueError as exc:
            raise ConfigError(f"{t.child('hosts')}[{i}]", str(exc), t.source) from None

    return t.build(
        lambda: MqttConfig(
            host=t.string("host", d.host),
            port=t.integer("port", d.port, low=1),
            keepalive_s=t.integer("keepalive_s", d.keepalive_s, low=1),
            tls=t.boolean("tls", d.tls),
            ca_file=text("ca_file"),
            cert_file=text("cert_file"),
            key_file=text("key_file"),
            username=text("username"),
            password_file=text("password_file"),
            allow_plain_remote=t.boolean("allow_plain_remote", d.allow_plain_remote),
            session_expiry_s=t.integer("session_expiry_s", d.session_expiry_s, low=0),
            reconnect_max_s=t.number("reconnect_max_s", d.reconnect_max_s, low=0, low_open=True),
            protocol=t.string("protocol", d.protocol),
            hosts=hosts,
            signing_key=text("signing_key"),
            peer_keys=text("peer_keys"),
            require_signed=t.boolean("require_signed", d.require_signed),
        )
    )


# --- files a config names ---------------------------------------------------------------------


def _file_problem(path: Path, kind: str) -> str | None:
    """Why ``path`` is not a readable ``kind`` ("file", "directory", "program"), or None."""
    try:
        if not path.exists():
            return "no such file or directory"
        if kind == "directory":
            if not path.is_dir():
                return "not a directory"
            if not os.access(path, os.R_OK | os.X_OK):
                return "not readable by this user"
            return None
        if path.is_dir():
            return "a directory, not a file"
        if not os.access(path, os.R_OK):
            return "not readable by this user"
        if kind == "program" and not os.access(path, os.X_OK):
            return "not executable by this user"
    except OSError as exc:  # (a path component not searchable, a name too long)
        return exc.strerror or str(exc)
    return None


def _mqtt_files(prefix: str, mqtt: MqttConfig) -> list[tuple[str, str, str]]:
    keys = ("ca_file", "cert_file", "key_file", "password_file", "signing_key")
    named = [(f"{prefix}.{key}", getattr(mqtt, key), "file") for key in keys]
    return [*named, (f"{prefix}.peer_keys", mqtt.peer_keys, "directory")]


def _state_dir_problem(path: Path) -> str | None:
    """A state directory that exists must be a writable directory (one that does not is made
    at start, or by systemd's ``StateDirectory``)."""
    if not path.exists():
        return None
    if not path.is_dir():
        return "not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable by this user"
    return None


def file_problems(config: EdgeschedConfig, sections: Iterable[str]) -> list[str]:
    """``"<key>: <path>: <problem>"`` for each file, directory or program the config's
    ``sections`` ("edge", "central") name that is missing or not readable (writable, for a
    state directory) by this user: the CA, certificate, key, password and signing-key files,
    the peer keys' directory, model files, ``hal_root``, ``state_dir`` (when it exists), a
    container runtime or power command given as a path (or a name not on ``PATH``). Relative
    paths are taken from the current directory, as the engines do."""
    wanted = set(sections)
    checks: list[tuple[str, str, str]] = []
    if "edge" in wanted:
        e = config.edge
        checks += _mqtt_files("edge.mqtt", e.mqtt)
        checks += [
            ("edge.forecast_model", e.forecast_model, "file"),
            ("edge.placement_model", e.placement_model, "file"),
            ("edge.hal_root", e.hal_root, "directory"),
            ("edge.state_dir", e.state_dir, "state"),
        ]
        if e.container_runtime.startswith("/"):
            checks.append(("edge.container_runtime", e.container_runtime, "program"))
        for key, argv in (("park_command", e.park_command), ("wake_command", e.wake_command)):
            if argv and "/" in argv[0]:
                checks.append((f"edge.{key}[0]", argv[0], "program"))
            elif argv and shutil.which(argv[0]) is None:
                checks.append((f"edge.{key}[0]", argv[0], "on-path"))
    if "central" in wanted:
        c = config.central
        checks += _mqtt_files("central.mqtt", c.mqtt)
        checks += [
            ("central.forecast_model", c.forecast_model, "file"),
            ("central.placement_model", c.placement_model, "file"),
            ("central.state_dir", c.state_dir, "state"),
        ]
    problems = []
    for key, value, kind in checks:
        if not value:
            continue
        path = Path(value)
        if kind == "on-path":
            problem: str | None = "not found on this user's PATH"
        elif kind == "state":
            problem = _state_dir_problem(path)
        else:
            problem = _file_problem(path, kind)
        if problem is not None:
            problems.append(f"{key}: {value}: {problem}")
    return problems


# --- the example config ------------------------------------------------------------------------


#: A comment for a key of the example (section, key) -> text; keys without one still appear.
_EXAMPLE_COMMENTS: dict[tuple[str, str], str] = {
    ("policy", "mode"): " | ".join(m.value for m in PolicyMode),
    ("policy", "preemption"): "higher priorities may evict lower ones",
    ("policy", "park_idle_after_s"): "park a node idle this long (energy)",
    ("policy", "spare_cpu_fraction"): "awake headroom over forecast demand",
    ("policy", "min_spare_cpu"): "... but at least this many cores",
    ("policy", "max_migrations_per_cycle"): "consolidation moves",
    ("policy", "consolidate_below"): "drain nodes used less than this",
    ("policy", "accel_reserve_cpu"): "left free per free accelerator",
    ("policy", "score_nodes"): "past twice this many nodes, score a sample",
    ("sim", "scale"): "multiplies the scenario's load",
    ("sim", "step_s"): "delay from an event to the cycle it triggers",
    ("edge", "node_id"): "required: the node's fixed identity (= MQTT client id)",
    ("edge", "state_dir"): "SQLite, task logs, api-token, api-port",
    ("edge", "api_port"): "the local API (0: any free port, written to api-port)",
    ("edge", "lease_s"): "connected while central was heard within this",
    ("edge", "forecast_model"): "ONNX file; empty: the shipped one",
    ("edge", "placement_model"): "ONNX file; empty: the shipped one",
    ("edge", "park_command"): "argv run when central parks this node",
    ("edge", "wake_command"): "argv run when central wakes it",
    ("edge", "centrals"): "the central ids this node follows",
    ("edge", "hal_root"): "read hardware under this tree (simulated nodes)",
    ("edge", "container_runtime"): "docker | podman | an absolute path",
    ("edge", "history_retention_s"): "finished tasks and decisions leave SQLite",
    ("edge", "telemetry_source"): "host | reserved (a simulated node's bookings)",
    ("edge", "accel_time_slices"): "time-slicing share of an accelerator (1: whole)",
    ("edge", "site_peers"): "the other members of this node's site",
    ("central", "nodes"): "node ids accepted; empty: any the ACL lets publish",
    ("central", "peers"): "fellow central replicas",
    ("central", "etcd_endpoints"): '"host:port" of etcd for shard leases',
    ("central", "reconcile"): "keep-original | keep-replacement | best-score | longest-running",
    ("mqtt", "host"): "the broker",
    ("mqtt", "tls"): "true in production (with ca_file)",
    ("mqtt", "ca_file"): "the fleet CA (edgesched certs init)",
    ("mqtt", "cert_file"): "this peer's certificate (certs issue)",
    ("mqtt", "key_file"): "... and its private key",
    ("mqtt", "username"): "default: the peer's own id",
    ("mqtt", "password_file"): "without client certificates",
    ("mqtt", "reconnect_max_s"): "cap of the reconnect backoff",
    ("mqtt", "protocol"): '"5" or "3.1.1"',
    ("mqtt", "hosts"): "more members of a clustered broker",
    ("mqtt", "signing_key"): "certs signing-key; with peer_keys",
    ("mqtt", "peer_keys"): "directory of the peers' <id>.pub",
}

#: What a key whose default is empty ("unset", which TOML cannot write as a value the parser
#: takes) looks like set; the example shows it commented out.
_EXAMPLE_SET: dict[tuple[str, str], object] = {
    ("edge", "node_id"): "gw-01",
    ("edge", "forecast_model"): "/etc/edgesched/forecast.onnx",
    ("edge", "placement_model"): "/etc/edgesched/placement.onnx",
    ("edge", "container_runtime"): "podman",
    ("central", "forecast_model"): "/etc/edgesched/forecast.onnx",
    ("central", "placement_model"): "/etc/edgesched/placement.onnx",
    ("mqtt", "ca_file"): "/etc/edgesched/ca.crt",
    ("mqtt", "cert_file"): "/etc/edgesched/node.crt",
    ("mqtt", "key_file"): "/etc/edgesched/node.key",
    ("mqtt", "username"): "gw-01",
    ("mqtt", "password_file"): "/etc/edgesched/mqtt-password",
    ("mqtt", "signing_key"): "/etc/edgesched/gw-01.signing.key",
    ("mqtt", "peer_keys"): "/etc/edgesched/keys",
}

#: The example's sections made from their dataclass: every field is a key (nested
#: dataclasses are their own section), so a new field appears in the example by itself.
_EXAMPLE_SECTIONS: tuple[tuple[str, type], ...] = (
    ("sim", SimConfig),
    ("edge", EdgeConfig),
    ("edge.mqtt", MqttConfig),
    ("central", CentralConfig),
    ("central.mqtt", MqttConfig),
)


#: Fields of the config dataclasses that are not config keys (set at run time).
NOT_CONFIG_KEYS: frozenset[tuple[str, str]] = frozenset({("policy", "learned_score")})


def example_sections() -> dict[str, type]:
    """The example's sections and the dataclass each one's keys come from."""
    return {"policy": PolicyConfig, **dict(_EXAMPLE_SECTIONS)}


def _section_lines(section: str, cls: type) -> list[str]:
    """Every field of ``cls`` as ``key = default`` (or, when unset by default, a commented
    example), with its comment; nested dataclasses are left to their own section."""
    default = cls()
    short = section.rpartition(".")[2]
    lines = [f"[{section}]"]
    for f in fields(cls):
        value = getattr(default, f.name)
        if hasattr(type(value), "__dataclass_fields__"):
            continue  # (its own section)
        comment = _EXAMPLE_COMMENTS.get((short, f.name), "")
        if value == "" or (short, f.name) in _EXAMPLE_SET:
            shown = _EXAMPLE_SET.get((short, f.name), "")
            if section.startswith("central") and isinstance(shown, str):
                shown = shown.replace("gw-01", "central").replace("node.", "central.")
            lines.append(_line(f.name, shown, comment, commented=True))
        else:
            lines.append(_line(f.name, value, comment))
    return lines


def default_config_toml() -> str:
    """A commented example config with every key of every section: the defaults (generated
    from the config dataclasses, so it cannot drift from them), with energy mode and the
    campus profile; a key unset by default is shown commented out, set to an example."""
    p = PolicyConfig()
    gates = builtin_profiles()["campus"].windows[0]
    policy = [
        _line(f.name, getattr(p, f.name), _EXAMPLE_COMMENTS.get(("policy", f.name), ""))
        for f in fields(PolicyConfig)
        if f.name not in ("mode", "tidal", "weights") and ("policy", f.name) not in NOT_CONFIG_KEYS
    ]
    lines = [
        "# edgesched configuration: every key of every section. Every key is optional (but",
        "# [edge] node_id to run a node); the values below are the defaults except mode",
        '# (default "priority") and the tidal profile (default "none"); a commented-out key',
        "# is unset by default. A node's config needs [edge] and [edge.mqtt], central's",
        "# [central] and [central.mqtt]: docs/configuration.md.",
        "",
        "[policy]",
        _line("mode", PolicyMode.ENERGY.value, _EXAMPLE_COMMENTS["policy", "mode"]),
        *policy,
        "",
        "# Overrides of the mode's score plugin weights, any of:",
        f"# {_listing(KNOWN_WEIGHTS)}.",
        "[policy.weights]",
        _line("energy_efficiency", 2.0, commented=True),
        "",
        "[policy.tidal]",
        f"# A built-in profile ({_listing(builtin_profiles())}) or your own windows, not both.",
        _line("profile", "campus"),
        _line("name", "my-campus", "names a profile made of windows", commented=True),
        "#",
        "# [[policy.tidal.windows]]",
        _line("name", gates.name, commented=True),
        _line(
            "start",
            format_clock(gates.start_s),
            "HH:MM; end < start wraps midnight",
            commented=True,
        ),
        _line("end", format_clock(gates.end_s), commented=True),
        f"{'# shares = { face-recognition = 0.7 }':<42} # guaranteed fraction of fleet CPU",
        '# rotate = ["ai-training", "video-analytics"]  # optional: take turns holding ...',
        _line("rotate_share", 0.3, "... this extra share", commented=True),
        _line("slice_minutes", 30, "... for this long each", commented=True),
    ]
    for section, cls in _EXAMPLE_SECTIONS:
        lines += ["", *_section_lines(section, cls)]
    return "\n".join(lines) + "\n"


def _line(key: str, value: object, comment: str = "", *, commented: bool = False) -> str:
    """``key = value`` with ``comment`` aligned; ``commented`` comments the line out."""
    text = f"{'# ' if commented else ''}{key} = {_toml_value(value)}"
    return f"{text:<42} # {comment}" if comment else text


# --- typed access to one table -----------------------------------------------------------------


class _Missing:
    """Marks a key that is absent from its table."""


_MISSING = _Missing()


@dataclass(frozen=True, slots=True)
class _Table:
    """One TOML table and its dotted path; typed getters raise ConfigError naming the key."""

    data: Mapping[str, object]
    path: str
    source: str

    def child(self, key: str) -> str:
        quoted = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
        return f"{self.path}.{quoted}" if self.path else quoted

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.child(key), problem, self.source)

    def check_keys(self, *allowed: str) -> None:
        for key in self.data:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"expected {_listing(allowed)}"
                raise self.error(key, f"unknown key ({hint})")

    def build(self, factory: Callable[[], T]) -> T:
        """``factory()``, with a core dataclass's ValueError re-raised on this table's path."""
        try:
            return factory()
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(self.path or self.source, str(e), self.source) from e

    def _get(self, key: str) -> object:
        return self.data.get(key, _MISSING)

    def _wrong(self, key: str, expected: str, value: object) -> ConfigError:
        return self.error(key, f"expected {expected}, got {_describe(value)}")

    def table(self, key: str) -> _Table:
        """The sub-table ``key`` (empty when absent)."""
        value = self._get(key)
        if value is _MISSING:
            return _Table({}, self.child(key), self.source)
        if not isinstance(value, Mapping):
            raise self._wrong(key, "a table", value)
        return _Table(value, self.child(key), self.source)

    def tables(self, key: str) -> list[_Table]:
        """The array of tables ``key`` (empty when absent)."""
        value = self._get(key)
        if value is _MISSING:
            return []
        if not isinstance(value, list):
            raise self._wrong(key, "an array of tables", value)
        out: list[_Table] = []
        for i, item in enumerate(value):
            path = f"{self.child(key)}[{i}]"
            if not isinstance(item, Mapping):
                raise ConfigError(path, f"expected a table, got {_describe(item)}", self.source)
            out.append(_Table(item, path, self.source))
        return out

    def strings(self, key: str) -> tuple[str, ...]:
        """The array of non-empty strings ``key`` (empty when absent)."""
        value = self._get(key)
        if value is _MISSING:
            return ()
        if not isinstance(value, list):
            raise self._wrong(key, "an array of strings", value)
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise ConfigError(
                    f"{self.child(key)}[{i}]",
                    f"expected a non-empty string, got {_describe(item)}",
                    self.source,
                )
        return tuple(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise self._wrong(key, "a boolean (true or false)", value)
        return value

    def string(self, key: str, default: str | None = None, *, allow_empty: bool = False) -> str:
        """A non-empty string (or empty, where ``allow_empty`` says it means "the default");
        required when ``default`` is None."""
        value = self._get(key)
        if value is _MISSING:
            if default is None:
                raise self.error(key, "missing (required)")
            return default
        if not isinstance(value, str):
            raise self._wrong(key, "a string", value)
        if not value and not allow_empty:
            raise self.error(key, "must not be empty")
        return value

    def choice(self, key: str, default: E) -> E:
        """A string naming a member of ``default``'s enum."""
        enum = type(default)
        value = self.string(key, default.value)
        try:
            return enum(value)
        except ValueError:
            names = ", ".join(m.value for m in enum)
            raise self.error(key, f"must be one of {names}, got {value!r}") from None

    def integer(self, key: str, default: int, *, low: int | None = None) -> int:
        value = self._get(key)
        if value is _MISSING:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._wrong(key, "an integer", value)
        if low is not None and value < low:
            raise self.error(key, f"must be >= {low}, got {value!r}")
        return value

    def number(
        self,
        key: str,
        default: float,
        low: float | None = None,
        high: float | None = None,
        *,
        low_open: bool = False,
    ) -> float:
        """An integer or float (not a bool), finite and within ``[low, high]``.

        With ``low_open`` the lower bound is exclusive.
        """
        value = self._get(key)
        if value is _MISSING:
            return default
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._wrong(key, "a number", value)
        number = float(value)
        if not math.isfinite(number):
            raise self.error(key, f"must be a finite number, got {value!r}")
        if low is not None and high is not None and not low <= number <= high:
            raise self.error(key, f"must be between {low:g} and {high:g}, got {value!r}")
        if low is not None and (number <= low if low_open else number < low):
            raise self.error(key, f"must be {'>' if low_open else '>='} {low:g}, got {value!r}")
        if high is not None and number > high:
            raise self.error(key, f"must be <= {high:g}, got {value!r}")
        return number

    def clock(self, key: str) -> float:
        """A required time of day: ``"HH:MM"``, ``"HH:MM:SS"`` or a TOML local time."""
        value = self._get(key)
        if value is _MISSING:
            raise self.error(key, "missing (required)")
        if isinstance(value, dt.time):
            return float(value.hour * 3600 + value.minute * 60 + value.second)
        if not isinstance(value, str):
            raise self._wrong(key, 'a time of day like "07:30"', value)
        try:
            return parse_clock(value)
        except ValueError as e:
            raise self.error(key, str(e)) from None


# --- helpers -----------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    """The TOML name of a parsed value's type."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, dt.datetime):
        return "datetime"
    for kind, name in (
        (int, "integer"),
        (float, "float"),
        (str, "string"),
        (list, "array"),
        (Mapping, "table"),
        (dt.date, "date"),
        (dt.time, "time"),
    ):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _describe(value: object) -> str:
    """``"integer 3"``, ``"string 'x'"``, ``"a table"``: what a bad value was."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return f"{_type_name(value)} {_toml_value(value)}"


def _toml_value(value: object) -> str:
    """A TOML literal for a scalar."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(str(value))
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value) if isinstance(value, int | float) else str(value)


def _listing(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))
