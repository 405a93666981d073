"""Broker security for document sync: a private CA, per-node certificates, Mosquitto config, ACL.

Identity model: one name per device. The node id is the certificate's CN, which Mosquitto
takes as the MQTT *username* (``use_identity_as_username``), which also replaces the client id
(``use_username_as_clientid``), so one device's credentials can neither publish as another nor
take over (and drain) another's session. The ACL is written against ``%u`` only, never ``%c``
(a client chooses its own client id).

* :func:`make_ca` / :func:`issue`: an EC P-256 CA and leaf certificates (client certs with the
  node id as CN, server certs with DNS/IP SANs). Keys are written 0600 and never overwritten
  unless ``force=True``.
* :func:`broker_config`: a Mosquitto 2.0 config (TLS with client certificates; or, for
  loopback tests and dev only, a password file). Plain TCP on a non-loopback address is refused.
* :func:`acl`: what each node and each central may publish and receive.
* :func:`accept_sender`: the check central makes before applying a document frame.
* :func:`write_crl`: the revocation list of removed nodes' certificates (``crlfile``).
* :func:`sign_client_csr`: a node's client certificate on a key the node made (join by URL).

Mosquitto 2.0 grants every SUBSCRIBE (a granted SUBACK proves nothing) and enforces ``read``
per message at delivery; a denied PUBLISH is acknowledged and dropped. Test what is delivered.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edgesched.sync import wire
from edgesched.sync.doc import client_id_for

#: What a node id / central id / MQTT username may look like. No ``/``, ``+``, ``#``, spaces or
#: ``%``: the name is substituted into ACL topic patterns and must stay one topic level.
IDENTITY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ROOT = wire.TOPIC_ROOT


@dataclass(frozen=True)
class CaFiles:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CertFiles:
    identity: str
    cert: Path
    key: Path
    ca: Path  # the CA certificate peers verify against


def check_identity(identity: str) -> str:
    """``identity`` if it is a valid node/central id, else ValueError."""
    if not isinstance(identity, str) or not IDENTITY_RE.fullmatch(identity):
        raise ValueError(
            f"invalid identity {identity!r}: use 1-64 of [A-Za-z0-9._-], starting alphanumeric"
        )
    return identity


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _refuse_existing(paths: Sequence[Path], force: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise FileExistsError(
            f"refusing to overwrite {', '.join(existing)} (pass force=True to replace)"
        )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tmp.chmod(0o644)
    tmp.replace(path)


def make_ca(
    dir: Path, name: str = "edgesched-ca", days: int = 3650, *, force: bool = False
) -> CaFiles:
    """Create ``dir/ca.crt`` and ``dir/ca.key`` (0600): a self-signed EC P-256 CA."""
    dir = Path(dir)
    files = CaFiles(dir / "ca.crt", dir / "ca.key")
    _refuse_existing([files.cert, files.key], force)
    dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(files.key, key)
    _write_cert(files.cert, cert)
    return files


def load_ca(dir: Path) -> CaFiles:
    """The CA in ``dir`` made by :func:`make_ca` (FileNotFoundError if it is not there)."""
    files = CaFiles(Path(dir) / "ca.crt", Path(dir) / "ca.key")
    for p in (files.cert, files.key):
        if not p.is_file():
            raise FileNotFoundError(f"no CA file {p}")
    return files


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    identity: str,
    public: CertificatePublicKeyTypes,
    days: int,
) -> x509.CertificateBuilder:
    """A leaf certificate for ``identity`` (its CN) and ``public``, issued by the CA, valid
    ``days`` (from five minutes ago), signing only; the caller adds its extended key usage."""
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )


def issue(
    ca: CaFiles,
    identity: str,
    dir: Path,
    *,
    server_names: Sequence[str] = (),
    days: int = 825,
    force: bool = False,
) -> CertFiles:
    """Issue ``dir/<identity>.crt`` and ``dir/<identity>.key`` (0600), signed by ``ca``.

    Without ``server_names``: a *client* certificate (extended key usage clientAuth) whose CN
    is ``identity``, the node id the broker uses as username and client id. With
    ``server_names``: a *server* certificate (serverAuth) with those host names and IP
    addresses as subject alternative names (e.g. ``("localhost", "127.0.0.1")``); it cannot
    be used to log in as a client.
    """
    check_identity(identity)
    dir = Path(dir)
    files = CertFiles(identity, dir / f"{identity}.crt", dir / f"{identity}.key", ca.cert)
    _refuse_existing([files.cert, files.key], force)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key} is not an EC private key")
    dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _leaf(ca_cert, ca_key, identity, key.public_key(), days)
    if server_names:
        sans: list[x509.GeneralName] = []
        for host in server_names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        builder = builder.add_extension(
            x509.SubjectAlternativeName(sans), critical=False
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(files.key, key)
    _write_cert(files.cert, cert)
    return files


def write_crl(ca: CaFiles, path: Path, revoked_serials: Iterable[int], days: int = 3650) -> Path:
    """Write ``path``: a certificate revocation list signed by ``ca`` naming
    ``revoked_serials`` (Mosquitto's ``crlfile``: a listed certificate fails the TLS handshake;
    a SIGHUP rereads it for new connections). Valid ``days``: Mosquitto refuses every client
    once a CRL's next update has passed, so it is long and rewritten at each change."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key} is not an EC private key")
    now = _now()
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - dt.timedelta(minutes=5))
        .next_update(now + dt.timedelta(days=days))
    )
    for serial in sorted(set(revoked_serials)):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder()
            .serial_number(serial)
            .revocation_date(now - dt.timedelta(minutes=1))
            .build()
        )
    crl = builder.sign(ca_key, hashes.SHA256())
    _write_cert_bytes(path, crl.public_bytes(serialization.Encoding.PEM))
    return path


def _write_cert_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    tmp.replace(path)


def is_loopback(bind: str) -> bool:
    """True for ``localhost`` and loopback IP literals; any other name or address is not."""
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


def _conf_value(value: object, what: str) -> str:
    text = str(value)
    if not text or any(c in text for c in "\r\n\0"):
        raise ValueError(f"{what} {text!r} cannot be written into a Mosquitto config")
    return text


#: Messages (QoS 1) Mosquitto queues per client beyond those in flight, and the bytes they may
#: take. Central is a single subscriber for the whole fleet, so a fan-in burst queues at the
#: broker for it: Mosquitto's default of 1,000 dropped most of a 1,000-node burst
#: (``bench/bench_central_fanin.py --broker``), silently to the node, which then needs a
#: resync. 100,000 is a burst of 100 updates from each of 1,000 nodes; the byte cap bounds a
#: client's queue whatever its messages' size (Mosquitto drops past either limit).
MAX_QUEUED_MESSAGES = 100_000
MAX_QUEUED_BYTES = 256 * 2**20
#: The largest MQTT packet the broker takes or sends (``max_packet_size``, a global
#: setting): twice a document frame's (:data:`edgesched.sync.wire.DEFAULT_MAX_PACKET`, which
#: every peer chunks below), so status, telemetry and heartbeats (a few KiB) and every frame
#: fit, and a client sending a larger packet is disconnected instead of its message reaching
#: every subscriber (20 MiB did, before issue 13). MQTT 5 clients learn it in the CONNACK.
MAX_PACKET_SIZE = 2 * wire.DEFAULT_MAX_PACKET


def queue_settings(
    max_queued_messages: int = MAX_QUEUED_MESSAGES, max_queued_bytes: int = MAX_QUEUED_BYTES
) -> list[str]:
    """The mosquitto.conf lines of the per-client queue limits and the packet size limit
    (:data:`MAX_PACKET_SIZE`), all global settings."""
    if max_queued_messages < 0 or max_queued_bytes < 0:
        raise ValueError("queue limits must be >= 0 (0: unlimited)")
    return [
        f"max_queued_messages {max_queued_messages}",
        f"max_queued_bytes {max_queued_bytes}",
        f"max_packet_size {MAX_PACKET_SIZE}",
        # Small packets (a PUBACK) leave at once, not after Nagle's wait for the client's
        # delayed ACK of what the broker sent before (~40 ms each, bench_central_scale
        # --capture): off by default in Mosquitto.
        "set_tcp_nodelay true",
    ]


def broker_config(
    *,
    port: int,
    bind: str = "127.0.0.1",
    ca: CaFiles | Path | None = None,
    server_cert: CertFiles | None = None,
    acl_path: Path,
    password_file: Path | None = None,
    tls: bool = True,
    allow_plain_non_loopback: bool = False,
    persistence_dir: Path | None = None,
    username_as_clientid: bool = True,
    log_dest: str = "stderr",
    user: str | None = None,
) -> str:
    """A Mosquitto 2.0 configuration with one listener on ``bind:port``.

    ``tls=True``: TLS (1.2 minimum) with ``require_certificate true`` and
    ``use_identity_as_username true``: the client certificate's CN, signed by ``ca``, is the
    username; MQTT passwords are ignored. ``tls=False``: plain TCP authenticated by
    ``password_file`` (see :func:`write_password_file`): for loopback tests and dev only, so a
    non-loopback ``bind`` raises ValueError unless ``allow_plain_non_loopback``.
    ``allow_anonymous false`` and ``acl_file`` always. ``username_as_clientid`` (default)
    replaces every client id with the username: one connection per identity at a time.
    ``persistence_dir`` enables persistence there (QoS 1 sessions survive a broker restart).
    ``user``: the account Mosquitto switches to when started as root (its default is
    ``mosquitto``, which must then be able to read the key, ACL and password files).
    """
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range")
    bind = _conf_value(bind, "bind address")
    if any(c.isspace() for c in bind):
        raise ValueError(f"bind address {bind!r} contains whitespace")
    lines = [
        "# edgesched broker configuration (generated by edgesched.sync.security)",
        "per_listener_settings false",
        "allow_anonymous false",
        f"acl_file {_conf_value(acl_path, 'acl_file')}",
    ]
    if persistence_dir is not None:
        location = _conf_value(Path(persistence_dir), "persistence_dir").rstrip("/") + "/"
        lines += ["persistence true", f"persistence_location {location}"]
    else:
        lines.append("persistence false")
    if user is not None:
        lines.append(f"user {_conf_value(user, 'user')}")
    lines += queue_settings()
    lines.append(f"log_dest {_conf_value(log_dest, 'log_dest')}")
    lines.append("log_type error")
    lines.append("log_type warning")
    lines.append("log_type notice")
    lines.append("log_type information")
    lines.append("")
    # Listener options must come after ``listener``: placed before it, Mosquitto applies
    # them to an implicit default listener on 0.0.0.0:1883 (plain TCP) and opens that too.
    lines.append(f"listener {port} {bind}")
    if username_as_clientid:
        lines.append("use_username_as_clientid true")
    if tls:
        if ca is None or server_cert is None:
            raise ValueError("a TLS listener needs ca and server_cert")
        if password_file is not None:
            raise ValueError(
                "password_file is not used with TLS client certificates "
                "(the certificate CN is the username)"
            )
        ca_cert = ca.cert if isinstance(ca, CaFiles) else Path(ca)
        lines += [
            f"cafile {_conf_value(ca_cert, 'cafile')}",
            f"certfile {_conf_value(server_cert.cert, 'certfile')}",
            f"keyfile {_conf_value(server_cert.key, 'keyfile')}",
            "tls_version tlsv1.2",
            "require_certificate true",
            "use_identity_as_username true",
        ]
    else:
        if not is_loopback(bind) and not allow_plain_non_loopback:
            raise ValueError(
                f"refusing a plain-TCP (no TLS) listener on non-loopback address {bind!r}: "
                "credentials and document updates would cross the network in clear; use "
                "tls=True, bind 127.0.0.1, or pass allow_plain_non_loopback=True"
            )
        if password_file is None:
            raise ValueError("a plain listener needs a password_file (anonymous access is off)")
        lines.insert(3, f"password_file {_conf_value(password_file, 'password_file')}")
    return "\n".join(lines) + "\n"


def acl(
    central_ids: Sequence[str],
    *,
    site_members: Mapping[str, Sequence[str]] | None = None,
    nodes: Sequence[str] | None = None,
    bridges: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """A Mosquitto ACL file: nodes confined to their own topics, centrals see everything.

    Every authenticated user that is not a central is a node whose id is its username
    (``%u``). A node may

    * write ``edgesched/v1/node/<self>/#`` (status, will) and its own sender topic of the
      documents it takes part in: ``doc/node-<self>/sync/<self>``, ``doc/policy/sync/<self>``
      and ``doc/desired-<self>/sync/<self>`` (it must send y-sync step 1 there; no
      peer takes content a node sends on either: see :class:`edgesched.sync.peer.DocPeer`'s
      ``relays``), and ``doc/site-<site>/sync/<self>`` for the sites listed
      for it in ``site_members``;
    * read ``edgesched/v1/central/#`` (heartbeat), ``edgesched/v1/node/<self>/#``,
      ``doc/node-<self>/#``, the centrals' sender topics of the policy
      ``doc/policy/sync/<central>`` (not another node's: its step 1s are of no use to us, and
      no peer takes content from a node on the policy) and the answers addressed to it,
      ``doc/policy/reply/<self>/#``, ``doc/desired-<self>/#`` (its own shard of the fleet's
      desired state), its sites' ``doc/site-<site>/#`` and the centrals' requests for a
      task's output, ``logs/<self>/request/+`` (never another node's). Not
      ``doc/fleet``: the fleet's assignments are for centrals only. Not another node's
      reply topic of the policy (``doc/policy/reply/<other>/...``): answers to a node's step
      1 are for that node only (:func:`edgesched.sync.wire.reply_topic`).

    A node answers central's requests for a task's output on ``logs/<self>/reply/+`` only
    (:mod:`edgesched.sync.logstream`; no node reads them).

    A node writes one document's reply topics only, its own node document's
    (``doc/node-<self>/reply/+/<self>``): its site peers ask it for its document
    (:mod:`edgesched.edge.site`), and a member of a site listed in ``site_members``
    reads each peer's status and sender topic of its node document, the answers
    addressed to it there, and sends its step 1 on its own sender topic of each peer's
    document (no peer takes content from it there: authorship is per writer).

    Deliberately narrower than "write ``doc/+/sync/<self>``": that would let a node inject
    updates into another node's private document under its own name. And a node does not read
    other nodes' status: it needs only central's heartbeat, and the fleet's liveness and
    membership is information a compromised device should not get. MQTT wildcards match
    whole levels only, so "every ``site-*`` document" cannot be written as ``site-+``: sites
    are granted per member. Centrals (``user`` blocks) read ``edgesched/v1/#`` and write
    ``edgesched/v1/central/#``, ``doc/+/sync/<central>``, their answers to any asker,
    ``doc/+/reply/+/<central>``, and their requests to any node, ``logs/+/request/<central>``.

    ``nodes`` (the join flow, :mod:`edgesched.brokerinit`): the node rules are written as
    ``user`` blocks for these nodes only instead of patterns for every user, so a certificate
    the CA signed for anyone else (a removed node whose certificate is still valid, a
    typo) gets no right at all, and removing a node from the list and reloading the broker
    (SIGHUP) takes its rights away, from its open connection too (Mosquitto checks the ACL
    at each message). ``bridges`` (bridge identity → the site's members): the user a site
    broker's bridge logs in as at central's broker may carry what those members may write
    and read (their node rules, with each member's id for ``%u``), read central's
    heartbeat, and write its notification topic ``site/<site>/bridge``; the site is the
    identity with a leading ``bridge-`` removed.
    """
    centrals = [check_identity(c) for c in central_ids]
    if not centrals:
        raise ValueError("at least one central id is needed")
    if nodes is not None:
        return _acl_for_nodes(centrals, nodes, site_members or {}, bridges or {})
    lines = [
        "# edgesched MQTT ACL (generated by edgesched.sync.security). No anonymous section:",
        "# allow_anonymous is false. Patterns use %u (the certificate CN), never %c.",
        "",
        "# Nodes (patterns apply to every user, centrals included).",
        f"pattern write {ROOT}/node/%u/#",
        f"pattern write {ROOT}/doc/node-%u/sync/%u",
        f"pattern write {ROOT}/doc/policy/sync/%u",
        f"pattern write {ROOT}/doc/desired-%u/sync/%u",
        "# A node answers its site peers' step 1 on its own document (edgesched.edge.site).",
        f"pattern write {ROOT}/doc/node-%u/reply/+/%u",
        f"pattern read {ROOT}/central/#",
        f"pattern read {ROOT}/node/%u/#",
        f"pattern read {ROOT}/doc/node-%u/#",
        f"pattern read {ROOT}/doc/policy/reply/%u/#",
        f"pattern read {ROOT}/doc/desired-%u/#",
        "# A task's output read through central (edgesched.sync.logstream): a node reads",
        "# the centrals' requests to it only and answers on its own reply topics only.",
        f"pattern read {ROOT}/logs/%u/request/+",
        f"pattern write {ROOT}/logs/%u/reply/+",
    ]
    # The policy's content comes from the centrals only: a node hears their sender topics,
    # never another node's (whose step 1s it has no use for, and whose content no peer takes).
    lines += [f"pattern read {ROOT}/doc/policy/sync/{central}" for central in centrals]
    for central in centrals:
        lines += [
            "",
            f"user {central}",
            f"topic read {ROOT}/#",
            f"topic write {ROOT}/central/#",
            f"topic write {ROOT}/doc/+/sync/{central}",
            f"topic write {ROOT}/doc/+/reply/+/{central}",
            f"topic write {ROOT}/logs/+/request/{central}",
        ]
    for site, members in sorted((site_members or {}).items()):
        check_identity(site)
        for node in members:
            check_identity(node)
            if node in centrals:
                raise ValueError(f"central {node!r} cannot also be a site member")
            lines += [
                "",
                f"user {node}",
                f"topic read {ROOT}/doc/site-{site}/#",
                f"topic write {ROOT}/doc/site-{site}/sync/{node}",
            ]
            # Site autonomy (edgesched.edge.site): each member replicates its peers' node
            # documents (their writer's updates, and the answers to its own step 1 on its
            # reply topic) and follows their status; it sends a step 1 on its own sender
            # topic of each, where no peer takes content from it (authorship).
            for peer in members:
                if peer == node:
                    continue
                lines += [
                    f"topic read {ROOT}/node/{peer}/status",
                    f"topic read {ROOT}/doc/node-{peer}/sync/{peer}",
                    f"topic read {ROOT}/doc/node-{peer}/reply/{node}/{peer}",
                    f"topic write {ROOT}/doc/node-{peer}/sync/{node}",
                ]
    return "\n".join(lines) + "\n"


def _acl_for_nodes(
    centrals: Sequence[str],
    nodes: Sequence[str],
    site_members: Mapping[str, Sequence[str]],
    bridges: Mapping[str, Sequence[str]],
) -> str:
    """:func:`acl` with ``nodes``: its node patterns, made ``user`` blocks for ``nodes`` only
    (derived from the pattern text, so the two cannot drift apart)."""
    allowed = [check_identity(n) for n in nodes]
    for node in allowed:
        if node in centrals:
            raise ValueError(f"central {node!r} cannot also be a node")
    members = {site: [m for m in ms if m in allowed] for site, ms in sorted(site_members.items())}
    base = acl(centrals, site_members={s: ms for s, ms in members.items() if ms})
    lines = base.splitlines()
    rules = [line.split(" ", 2)[1:] for line in lines if line.startswith("pattern ")]
    first_user = next(i for i, line in enumerate(lines) if line.startswith("user "))
    out = [
        "# edgesched MQTT ACL (generated by edgesched.sync.security) for the nodes listed",
        "# below only: a certificate issued to anyone else gets no right. No anonymous",
        "# section: allow_anonymous is false. Users are certificate CNs (%u), never client ids.",
    ]

    def grants(node: str) -> list[str]:
        return [f"topic {access} {pattern.replace('%u', node)}" for access, pattern in rules]

    for node in sorted(set(allowed)):
        out += ["", f"user {node}", *grants(node)]
    for bridge, site_nodes in sorted(bridges.items()):
        check_identity(bridge)
        if bridge in centrals or bridge in allowed:
            raise ValueError(f"bridge {bridge!r} cannot also be a node or a central")
        site = bridge.removeprefix("bridge-")
        out += [
            "",
            f"# The bridge of site {site}'s broker: what its members may carry, both ways.",
            f"user {bridge}",
            f"topic write {ROOT}/site/{site}/bridge",
            f"topic readwrite {ROOT}/doc/site-{site}/#",
        ]
        for node in sorted({m for m in site_nodes if m in allowed}):
            out += grants(node)
    return "\n".join([*out, "", *lines[first_user:]]) + "\n"


def write_password_file(path: Path, users: Mapping[str, str]) -> Path:
    """Write a Mosquitto password file (0600) for ``users`` with ``mosquitto_passwd -U``."""
    exe = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    if not os.access(exe, os.X_OK):
        raise FileNotFoundError("mosquitto_passwd not found (it ships with the mosquitto package)")
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        for user, password in users.items():
            check_identity(user)
            if any(c in password for c in "\r\n\0"):
                raise ValueError(f"password of {user!r} contains a line break or NUL")
            f.write(f"{user}:{password}\n")
    subprocess.run([exe, "-U", str(path)], check=True, capture_output=True, timeout=30)
    return path


_SYNC_TOPIC = re.compile(rf"{re.escape(ROOT)}/doc/([^/+#]+)/sync/([^/+#]+)")


def sender_check(node_id: str, centrals: Iterable[str]) -> Callable[[str, int], bool]:
    """The ``accept`` of a central peer of node ``node_id``'s documents: :func:`accept_sender`
    with the node itself and the central replicas as the expected senders."""
    expected = {node_id: client_id_for(node_id)} | {c: client_id_for(c) for c in centrals}
    return lambda topic, claimed: accept_sender(topic, claimed, expected)


def accept_sender(topic: str, claimed_client_id: int, expected: Mapping[str, int]) -> bool:
    """Whether central may apply a frame from ``topic`` whose header claims ``claimed_client_id``.

    The topic must be ``edgesched/v1/doc/<doc>/sync/<sender>`` (the broker's ACL guarantees
    that only ``<sender>`` publishes there), ``<sender>`` must be a known peer in
    ``expected`` (peer id → its fixed pycrdt client id), and the claimed client id must be
    exactly that peer's: a frame claiming another writer's client id would diverge replicas
    silently, so it is rejected.
    """
    m = _SYNC_TOPIC.fullmatch(topic)
    if m is None:
        return False
    sender = m.group(2)
    if sender not in expected:
        return False
    want = expected[sender]
    if isinstance(claimed_client_id, bool) or not isinstance(claimed_client_id, int):
        return False
    return claimed_client_id == want


def sign_client_csr(
    ca: CaFiles, csr_pem: bytes, identity: str, *, days: int = 825
) -> x509.Certificate:
    """A client certificate for ``identity`` (as :func:`issue` makes: CN ``identity``,
    clientAuth) on the public key of ``csr_pem``, signed by ``ca``: the key stays with whoever
    made the request (the join by URL). The request must be self-signed correctly, hold an EC
    P-256/P-384 or RSA >= 2048 key and name nobody else: a subject other than empty or
    ``CN=identity``, or any subject alternative name but ``identity``, is a ValueError (the
    certificate is always made for ``identity``, whatever the request says)."""
    check_identity(identity)
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError:
        raise ValueError("csr_pem is not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise ValueError("the CSR's signature does not verify")
    public = csr.public_key()
    if isinstance(public, ec.EllipticCurvePublicKey):
        if public.curve.name not in ("secp256r1", "secp384r1"):
            raise ValueError(f"the CSR's key is on curve {public.curve.name}: use P-256 or P-384")
    elif isinstance(public, rsa.RSAPublicKey):
        if public.key_size < 2048:
            raise ValueError(f"the CSR's RSA key has {public.key_size} bits: use 2048 or more")
    else:
        raise ValueError("the CSR's key must be EC (P-256, P-384) or RSA")
    for attr in csr.subject:
        if attr.oid != NameOID.COMMON_NAME or attr.value != identity:
            raise ValueError(
                f"the CSR names {attr.rfc4514_string()!r}: this token is for {identity} only"
            )
    try:
        sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        sans = None
    for san in sans or ():
        if not (isinstance(san, x509.DNSName) and san.value == identity):
            raise ValueError(
                f"the CSR names {san.value!r} (subject alternative name): this token is for "
                f"{identity} only"
            )
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key} is not an EC private key")
    return (
        _leaf(ca_cert, ca_key, identity, public, days)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
