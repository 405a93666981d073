"""``edgesched central add-node`` / ``remove-node``: admit a node to the fleet's broker, or
revoke it.

Role: on central's machine, with the broker directory of ``broker init``
(:mod:`edgesched.brokerinit`). ``add_node`` issues the node's client certificate from the
fleet CA (its CN is the node id: the broker's username and client id), adds it to
``fleet.json``, regenerates the ACL (``user`` blocks for admitted nodes only), reloads
Mosquitto (SIGHUP) and writes the join file (:mod:`edgesched.joinfile`) with its token:
the offline flow. ``invite`` records a one-time join token instead
(:mod:`edgesched.jointoken`); ``join_by_token``, called by the join server
(:mod:`edgesched.joinserver`), spends it: it signs the certificate request the gateway made
(its key never leaves it) for the token's node only, and admits the node as ``add_node``
does. Every change of the directory is made under its lock (``.lock``).
``remove_node`` takes the node out of the ACL and puts its certificate's serial in the CRL,
then reloads: its open connection loses every right at once (Mosquitto checks the ACL at
each message) and its next TLS handshake is refused (``certificate revoked``). For a node of
a site the site broker's directory (registered by ``broker init --site --central-dir``) is
updated too; its Mosquitto is reloaded when it runs here, else the directory is to be copied
to the site broker again.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from edgesched import jointoken
from edgesched.brokerinit import (
    BrokerDir,
    BrokerDirError,
    FleetState,
    admitted,
    join_address,
    reload,
    render,
    split_address,
)
from edgesched.joinfile import JoinFile, write
from edgesched.sync.security import check_identity, issue, sign_client_csr

#: The join server's port when ``central join-server --listen`` does not say (the broker's
#: is 8883).
DEFAULT_JOIN_PORT = 8884


@dataclass
class Admission:
    """What ``add_node`` did: the join file and its token, and one line per step."""

    join_file: Path
    token: str
    done: list[str] = field(default_factory=list)

    def join_line(self) -> str:
        return f"edgesched join {self.join_file} {self.token}"


@dataclass
class Invitation:
    """What ``invite`` did: the join server's URL and the one-time token."""

    url: str
    token: str
    expires: float
    done: list[str] = field(default_factory=list)

    def join_line(self) -> str:
        return f"edgesched join {self.url} {self.token}"


def _check_new(
    bd: BrokerDir, state: FleetState, node_id: str, site: str | None, force: bool
) -> tuple[str, BrokerDir | None]:
    """Refuse what cannot be admitted; (the broker address the node dials, its site's
    broker directory)."""
    if state.role != "central":
        raise BrokerDirError(
            f"{bd.root} is site {state.site}'s broker: add nodes at central's broker "
            "directory (with --site)"
        )
    try:
        check_identity(node_id)
    except ValueError as exc:
        raise BrokerDirError(f"node id: {exc}") from None
    if node_id in state.centrals or node_id.startswith("bridge-"):
        raise BrokerDirError(f"node id {node_id!r} is taken by a central or a site bridge")
    if node_id in state.nodes and not force:
        raise BrokerDirError(
            f"{node_id} is admitted already (pass --force to issue it a new certificate; the "
            "old one stays valid until `central remove-node`)"
        )
    if site is None:
        return state.address, None
    if site not in state.sites:
        known = ", ".join(sorted(state.sites)) or "none"
        raise BrokerDirError(
            f"--site {site}: no site broker registered (known: {known}); make it with "
            f"`edgesched broker init --site {site} --central-broker HOST:PORT "
            f"--central-dir {bd.root} --dir DIR` first"
        )
    return state.sites[site]["address"], BrokerDir(Path(state.sites[site]["dir"]))


def _admit(
    bd: BrokerDir,
    state: FleetState,
    node_id: str,
    site: str | None,
    site_dir: BrokerDir | None,
    cert_pem: bytes,
) -> list[str]:
    """Record ``node_id`` with its certificate, regenerate the ACLs, reload."""
    serial = x509.load_pem_x509_certificate(cert_pem).serial_number
    bd.node_cert(node_id).parent.mkdir(exist_ok=True)
    bd.node_cert(node_id).write_bytes(cert_pem)
    done = [f"issued {node_id}'s certificate (serial {serial:x}) from the fleet CA"]
    if node_id in state.removed:
        state.removed.remove(node_id)
    # A node issued anew (--force) keeps its older serials, for remove-node to revoke too.
    before = state.nodes.get(node_id) or {}
    previous = [*before.get("previous", []), *([before["serial"]] if "serial" in before else [])]
    state.nodes[node_id] = {"site": site, "serial": f"{serial:x}"}
    if previous:
        state.nodes[node_id]["previous"] = previous
    bd.save(state)
    return done + _apply(bd, state, site_dir, site, f"admitted {node_id}")


def add_node(
    broker_dir: Path, node_id: str, site: str | None = None, *, force: bool = False
) -> Admission:
    """Admit ``node_id`` (of ``site``) at the broker in ``broker_dir`` and write its join
    file (the offline flow: the file holds the key); BrokerDirError."""
    bd = BrokerDir(broker_dir)
    with _locked(bd):
        state = bd.load()
        address, site_dir = _check_new(bd, state, node_id, site, force)
        ca = bd.ca()
        out = Admission(bd.join_file(node_id), "")
        with tempfile.TemporaryDirectory() as tmp:
            try:
                files = issue(ca, node_id, Path(tmp))
            except (ValueError, OSError) as exc:
                raise BrokerDirError(f"cannot issue {node_id}'s certificate: {exc}") from None
            cert_pem, key_pem = files.cert.read_bytes(), files.key.read_bytes()
        out.done += _admit(bd, state, node_id, site, site_dir, cert_pem)
        join = JoinFile(
            node_id=node_id,
            broker=address,
            ca=ca.cert.read_text(),
            cert=cert_pem.decode(),
            key=key_pem.decode(),
            site=site,
            site_peers=_peers(state, node_id, site),
            centrals=tuple(state.centrals),
        )
        out.token = write(out.join_file, join)
    out.done.append(f"wrote the join file {out.join_file} (0600: it holds the node's key)")
    return out


def _peers(state: FleetState, node_id: str, site: str | None) -> tuple[str, ...]:
    return tuple(n for n in admitted(state, site) if n != node_id) if site else ()


def default_join_url(state: FleetState) -> str:
    """``https://<the broker's host>:8884``: the join server shows the broker's server
    certificate, so the host nodes dial the broker by is one its certificate names."""
    host, _ = split_address(state.address)
    return f"https://{join_address(host, DEFAULT_JOIN_PORT)}"


def invite(
    broker_dir: Path,
    node_id: str,
    site: str | None = None,
    *,
    ttl_s: float = jointoken.DEFAULT_TTL_S,
    url: str | None = None,
    force: bool = False,
) -> Invitation:
    """Record a one-time join token for ``node_id`` (of ``site``), good for ``ttl_s``; the
    node is admitted when a gateway spends it at the join server (:func:`join_by_token`).
    BrokerDirError."""
    bd = BrokerDir(broker_dir)
    with _locked(bd):
        state = bd.load()
        _check_new(bd, state, node_id, site, force)
        ca = bd.ca()
        try:
            token = jointoken.create(bd.root, ca.cert.read_bytes(), node_id, site, ttl_s)
        except jointoken.TokenError as exc:
            raise BrokerDirError(str(exc)) from None
        except OSError as exc:
            raise BrokerDirError(str(exc)) from None
    expires = time.time() + ttl_s
    out = Invitation(url or default_join_url(state), str(token), expires)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expires))
    out.done.append(
        f"made a one-time join token for {node_id} (valid until {when}; its hash is in "
        f"{bd.root / jointoken.TOKENS})"
    )
    return out


@dataclass(frozen=True)
class Joined:
    """The join server's answer to a gateway that spent its token."""

    node_id: str
    site: str | None
    broker: str
    ca_pem: str
    cert_pem: str
    site_peers: tuple[str, ...]
    centrals: tuple[str, ...]
    done: tuple[str, ...]


def join_by_token(broker_dir: Path, secret: str, csr_pem: bytes) -> Joined:
    """Spend the token whose secret is ``secret``: sign ``csr_pem`` for its node only,
    admit the node, mark the token used. ``jointoken.TokenError("refused")`` for a token
    unknown, expired or used (not saying which), ValueError for a CSR that cannot be signed
    for that node (the token is not spent), BrokerDirError if the broker's files cannot be
    changed (nor spent)."""
    bd = BrokerDir(broker_dir)
    with _locked(bd):
        digest, grant = jointoken.find(bd.root, secret)
        state = bd.load()
        address, site_dir = _check_new(bd, state, grant.node_id, grant.site, force=True)
        ca = bd.ca()
        cert = sign_client_csr(ca, csr_pem, grant.node_id)
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        done = _admit(bd, state, grant.node_id, grant.site, site_dir, cert_pem)
        jointoken.mark_used(bd.root, digest)
    return Joined(
        node_id=grant.node_id,
        site=grant.site,
        broker=address,
        ca_pem=ca.cert.read_text(),
        cert_pem=cert_pem.decode(),
        site_peers=_peers(state, grant.node_id, grant.site),
        centrals=tuple(state.centrals),
        done=tuple(done),
    )


@contextlib.contextmanager
def _locked(bd: BrokerDir) -> Iterator[None]:
    if not bd.root.is_dir():
        bd.load()  # raises the "no broker here" error
    try:
        with jointoken.locked(bd.root):
            yield
    except OSError as exc:  # the broker directory's files (joins.json, nodes/, the lock)
        raise BrokerDirError(f"{bd.root}: {exc}") from None


def remove_node(broker_dir: Path, node_id: str) -> list[str]:
    """Revoke ``node_id``'s access at the broker in ``broker_dir``; one line per step."""
    bd = BrokerDir(broker_dir)
    with _locked(bd):
        return _remove(bd, node_id)


def _remove(bd: BrokerDir, node_id: str) -> list[str]:
    state = bd.load()
    withdrawn = jointoken.withdraw(bd.root, node_id)
    info = state.nodes.pop(node_id, None)
    if info is None:
        if withdrawn:
            return [f"withdrew {node_id}'s unused join token (it had not joined)"]
        if node_id in state.removed:
            raise BrokerDirError(f"{node_id} was removed already")
        raise BrokerDirError(
            f"{node_id}: not a node of this broker (admitted: "
            f"{', '.join(admitted(state)) or 'none'})"
        )
    for serial in [*info.get("previous", []), info.get("serial")]:
        if serial and serial not in state.revoked:
            state.revoked.append(serial)
    state.removed.append(node_id)
    bd.save(state)
    bd.node_cert(node_id).unlink(missing_ok=True)
    bd.join_file(node_id).unlink(missing_ok=True)
    site = info.get("site")
    site_dir = BrokerDir(Path(state.sites[site]["dir"])) if site in state.sites else None
    done = [f"revoked {node_id}'s certificate (serial {info.get('serial')}: in {bd.crl})"]
    return done + _apply(bd, state, site_dir, site, f"removed {node_id}")


def _apply(
    bd: BrokerDir, state: FleetState, site_dir: BrokerDir | None, site: str | None, what: str
) -> list[str]:
    """Regenerate central's files (and the site broker's), reload what runs here."""
    render(bd)
    done = [f"{what} in {bd.acl}; {reload(bd)}"]
    if site_dir is not None and site is not None:
        if not site_dir.state.exists():
            return [*done, f"site {site}'s broker directory {site_dir.root} is not here"]
        sstate = site_dir.load()
        sstate.nodes = {n: v for n, v in state.nodes.items() if v.get("site") == site}
        sstate.revoked = list(state.revoked)
        site_dir.save(sstate)
        _copy_crl(bd, site_dir)
        render(site_dir)
        done.append(
            f"site {site}'s broker: {what} in {site_dir.acl}; {reload(site_dir)} (copy "
            f"{site_dir.acl} and {site_dir.crl} to the site broker if it runs elsewhere)"
        )
    return done


def _copy_crl(bd: BrokerDir, site_dir: BrokerDir) -> None:
    site_dir.crl.write_bytes(bd.crl.read_bytes())
