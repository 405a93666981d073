"""``edgesched join URL TOKEN`` or ``join FILE [TOKEN]``: make this gateway a node of the
fleet, in one command.

Role: the gateway side of the join flow (central's side: :mod:`edgesched.nodeaccess` and
the join server :mod:`edgesched.joinserver`). With a URL it first gets the node's
certificate from the join server for a key it makes here (:mod:`edgesched.joinclient`:
the server's CA pinned by the token); with a join file (:mod:`edgesched.joinfile`, the
offline bundle) it has them already. Then it

1. checks the broker as the node will reach it (:mod:`edgesched.brokercheck`: DNS, TCP,
   TLS, auth, ACL) and stops at the first failure, one line, with nothing installed;
2. installs the node with everything filled in (:func:`edgesched.install.install`: config,
   certificate, key, unit; ``--root`` and the other layout options as ``install`` has);
3. waits until the running node says it is connected: its broker link up and central's
   heartbeat heard (its ``/v1/status``), or says what is missing.

Errors are :class:`JoinError`, one line. A URL join that fails after the token was spent
(step 1 or 2) keeps the node's certificate and key in ``<etc-dir>/<node>.join`` (0600) and
says so: ``edgesched join`` that file retries without a new token.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesched.brokercheck import Target, check
from edgesched.brokerinit import BrokerDirError, split_address
from edgesched.install import InstallError, InstallOptions, Layout, install, systemd_running
from edgesched.joinclient import JoinClientError, join_by_url, probe
from edgesched.joinfile import JoinFile, JoinFileError, read, write
from edgesched.tomlwrite import toml_dumps

Say = Callable[[str], None]


class JoinError(Exception):
    """The join stopped; the message says at which step and why."""


@dataclass(frozen=True)
class JoinOptions:
    source: Path
    layout: Layout
    token: str | None = None
    user: str | None = None
    release: Path | None = None
    start: bool = True
    check: bool = True
    wait_s: float = 90.0
    #: Where the node's engine keeps its state (its API's port and token), for the wait: the
    #: installed config says the unit's StateDirectory (install insists); another one is for
    #: an engine started by hand with its ``state_dir`` set there.
    state_dir: Path | None = None
    dry_run: bool = False


def is_url(source: str | Path) -> bool:
    return str(source).startswith(("http:/", "https:/"))


def join(opts: JoinOptions, say: Say = print) -> None:
    """Join this gateway (see the module docstring); JoinError naming the failed step."""
    if is_url(opts.source):
        j = _from_url(opts, say)
        if j is None:
            return
    else:
        try:
            j = read(opts.source, opts.token)
        except JoinFileError as exc:
            raise JoinError(str(exc)) from None
        mode = stat.S_IMODE(opts.source.stat().st_mode)
        if mode & 0o077:
            say(f"warning: {opts.source} is readable by others (mode {mode:o}): it holds a key")
    try:
        _check_and_install(opts, j, say)
    except JoinError as exc:
        if not is_url(opts.source):
            raise
        # The token is spent and the key exists nowhere else: keep them for a retry.
        kept = opts.layout.host(opts.layout.etc_dir) / f"{j.node_id}.join"
        try:
            write(kept, j)
        except OSError as err:
            raise JoinError(f"{exc}; and the node's key could not be kept: {err}") from None
        raise JoinError(
            f"{exc}; the token is spent: the node's certificate and key are kept in {kept} "
            f"(0600), retry with `edgesched join {kept}`"
        ) from None
    if opts.dry_run or opts.wait_s <= 0:
        return
    if opts.layout.staged:
        say(
            f"staged under --root {opts.layout.root}: nothing runs here, so no wait; on the "
            f"gateway the unit starts {j.node_id}"
        )
        return
    wait_connected(opts, j.node_id, say)


def _from_url(opts: JoinOptions, say: Say) -> JoinFile | None:
    """The node's files from the join server (None after a dry run: nothing spent)."""
    url = str(opts.source).replace(":/", "://", 1) if "://" not in str(opts.source) else ""
    url = url or str(opts.source)
    if opts.token is None:
        raise JoinError(f"{url}: a join URL needs its token (the line `central add-node` printed)")
    try:
        if opts.dry_run:
            say(probe(url, opts.token))
            say("dry run: the node's key is not made, nothing is written")
            return None
        say(f"asking the join server {url} for this node's certificate (its key is made here)")
        j = join_by_url(url, opts.token)
    except JoinClientError as exc:
        raise JoinError(str(exc)) from None
    say(f"the join server admitted {j.node_id}; its certificate is issued by the pinned CA")
    return j


def _check_and_install(opts: JoinOptions, j: JoinFile, say: Say) -> None:
    try:
        host, port = split_address(j.broker)
    except BrokerDirError as exc:
        raise JoinError(f"broker address: {exc}") from None
    say(f"joining {j.node_id} to the fleet through the broker {j.broker}")
    with tempfile.TemporaryDirectory(prefix="edgesched-join-") as tmp:
        d = Path(tmp)
        ca, cert, key = d / "ca.crt", d / f"{j.node_id}.crt", d / f"{j.node_id}.key"
        for path, text in ((ca, j.ca), (cert, j.cert), (key, j.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        if opts.check:
            result = check(Target(host, port, j.node_id, str(ca), str(cert), str(key)), say=say)
            failed = result.failure
            if failed is not None:
                raise JoinError(f"{failed.name}: {failed.detail} (nothing was installed)") from None
        edge: dict[str, Any] = {"centrals": list(j.centrals)}
        if j.site_peers:
            edge["site_peers"] = list(j.site_peers)
        base = d / "base.toml"
        base.write_text(toml_dumps({"edge": edge}))
        install_opts = InstallOptions(
            opts.layout,
            node_id=j.node_id,
            site=j.site,
            base_config=base,
            broker=j.broker,
            ca=ca,
            cert=cert,
            key=key,
            user=opts.user,
            release=opts.release,
            start=opts.start,
        )
        try:
            install(install_opts, dry_run=opts.dry_run, say=say)
        except InstallError as exc:
            raise JoinError(f"install: {exc}") from None


def wait_connected(opts: JoinOptions, node_id: str, say: Say) -> dict[str, Any]:
    """Poll the node's ``/v1/status`` until its broker link is up and central is heard;
    its status then, or JoinError saying what was missing after ``opts.wait_s``."""
    from edgesched.rest.client import ApiClient, ApiTarget, Unreachable

    lay = opts.layout
    state = opts.state_dir or lay.host(lay.state_dir)
    config = lay.config
    if not (systemd_running() and not lay.staged and opts.start):
        where = "" if state == lay.host(lay.state_dir) else f" with its state_dir set to {state}"
        say(
            f"systemd does not start it here: start the node with `edgesched edge run "
            f"--config {config}`{where}; waiting up to {opts.wait_s:g} s for it to connect"
        )
    else:
        say(f"waiting up to {opts.wait_s:g} s for {node_id} to connect")
    deadline = time.monotonic() + opts.wait_s
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        try:
            resp = ApiClient(ApiTarget.from_state_dir(state), timeout=2.0).request(
                "GET", "/v1/status"
            )
        except (OSError, ValueError, Unreachable):
            time.sleep(0.25)
            continue
        if resp.status == 200 and isinstance(resp.body, dict):
            last = resp.body
            if last.get("broker_connected") and last.get("central_heard_s_ago") is not None:
                say(f"{node_id} is connected: broker link up, central's heartbeat heard")
                return last
        time.sleep(0.25)
    if last is None:
        raise JoinError(
            f"wait: the node's engine never answered (no API in {state} after "
            f"{opts.wait_s:g} s): see `journalctl -u edgesched-edge` or run it by hand"
        )
    if not last.get("broker_connected"):
        raise JoinError(
            f"wait: the node runs but is not connected to its broker after {opts.wait_s:g} s "
            f"(run `edgesched broker check` with its files while it is stopped)"
        )
    raise JoinError(
        f"wait: {node_id} is connected to its broker but central's heartbeat never came in "
        f"{opts.wait_s:g} s: is central running (edgesched central run) on that broker?"
    )
