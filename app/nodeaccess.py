"""``edgesched central add-node`` / ``remove-node``: admit a node to the fleet's broker, or
revoke it.

Role: on central's machine, with the broker directory of ``broker init``
(:mod:`edgesched.brokerinit`). ``add_node`` issues the node's client certificate from the
fleet CA (its CN is the node id: the broker's username and client id), adds it to
``fleet.json``, regenerates the ACL (``user`` blocks for admitted nodes only), reloads
Mosquitto (SIGHUP) and writes the join file (:mod:`edgesched.joinfile`) with its token.
``remove_node`` takes the node out of the ACL and puts its certificate's serial in the CRL,
then reloads: its open connection loses every right at once (Mosquitto checks the ACL at
each message) and its next TLS handshake is refused (``certificate revoked``). For a node of
a site the site broker's directory (registered by ``broker init --site --central-dir``) is
updated too; its Mosquitto is reloaded when it runs here, else the directory is to be copied
to the site broker again.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509

from edgesched.brokerinit import BrokerDir, BrokerDirError, FleetState, admitted, reload, render
from edgesched.joinfile import JoinFile, write
from edgesched.sync.security import check_identity, issue


@dataclass
class Admission:
    """What ``add_node`` did: the join file and its token, and one line per step."""

    join_file: Path
    token: str
    done: list[str] = field(default_factory=list)

    def join_line(self) -> str:
        return f"edgesched join {self.join_file} {self.token}"


def add_node(
    broker_dir: Path, node_id: str, site: str | None = None, *, force: bool = False
) -> Admission:
    """Admit ``node_id`` (of ``site``) at the broker in ``broker_dir``; BrokerDirError."""
    bd = BrokerDir(broker_dir)
    state = bd.load()
    if state.role != "central":
        raise BrokerDirError(
            f"{broker_dir} is site {state.site}'s broker: add nodes at central's broker "
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
    site_dir: BrokerDir | None = None
    address = state.address
    if site is not None:
        if site not in state.sites:
            known = ", ".join(sorted(state.sites)) or "none"
            raise BrokerDirError(
                f"--site {site}: no site broker registered (known: {known}); make it with "
                f"`edgesched broker init --site {site} --central-broker HOST:PORT "
                f"--central-dir {broker_dir} --dir DIR` first"
            )
        address = state.sites[site]["address"]
        site_dir = BrokerDir(Path(state.sites[site]["dir"]))
    ca = bd.ca()
    out = Admission(bd.join_file(node_id), "")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            files = issue(ca, node_id, Path(tmp))
        except (ValueError, OSError) as exc:
            raise BrokerDirError(f"cannot issue {node_id}'s certificate: {exc}") from None
        cert_pem, key_pem = files.cert.read_bytes(), files.key.read_bytes()
    serial = x509.load_pem_x509_certificate(cert_pem).serial_number
    bd.node_cert(node_id).parent.mkdir(exist_ok=True)
    bd.node_cert(node_id).write_bytes(cert_pem)
    out.done.append(f"issued {node_id}'s certificate (serial {serial:x}) from the fleet CA")
    if node_id in state.removed:
        state.removed.remove(node_id)
    state.nodes[node_id] = {"site": site, "serial": f"{serial:x}"}
    bd.save(state)
    out.done += _apply(bd, state, site_dir, site, f"admitted {node_id}")
    peers = tuple(n for n in admitted(state, site) if n != node_id) if site else ()
    join = JoinFile(
        node_id=node_id,
        broker=address,
        ca=ca.cert.read_text(),
        cert=cert_pem.decode(),
        key=key_pem.decode(),
        site=site,
        site_peers=peers,
        centrals=tuple(state.centrals),
    )
    out.token = write(out.join_file, join)
    out.done.append(f"wrote the join file {out.join_file} (0600: it holds the node's key)")
    return out


def remove_node(broker_dir: Path, node_id: str) -> list[str]:
    """Revoke ``node_id``'s access at the broker in ``broker_dir``; one line per step."""
    bd = BrokerDir(broker_dir)
    state = bd.load()
    info = state.nodes.pop(node_id, None)
    if info is None:
        if node_id in state.removed:
            raise BrokerDirError(f"{node_id} was removed already")
        raise BrokerDirError(
            f"{node_id}: not a node of this broker (admitted: "
            f"{', '.join(admitted(state)) or 'none'})"
        )
    if info.get("serial") and info["serial"] not in state.revoked:
        state.revoked.append(info["serial"])
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
