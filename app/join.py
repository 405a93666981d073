"""``edgesched join FILE [TOKEN]``: make this gateway a node of the fleet, in one command.

Role: the gateway side of the join flow (central's side: :mod:`edgesched.nodeaccess`). From
the join file (:mod:`edgesched.joinfile`) it

1. checks the broker as the node will reach it (:mod:`edgesched.brokercheck`: DNS, TCP,
   TLS, auth, ACL) and stops at the first failure, one line, with nothing installed;
2. installs the node with everything filled in (:func:`edgesched.install.install`: config,
   certificate, key, unit; ``--root`` and the other layout options as ``install`` has);
3. waits until the running node says it is connected: its broker link up and central's
   heartbeat heard (its ``/v1/status``), or says what is missing.

Errors are :class:`JoinError`, one line.
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
from edgesched.joinfile import JoinFileError, read
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
    #: Where the node's engine keeps its state (its API's port and token): default, the
    #: installed config's (the unit's StateDirectory).
    state_dir: Path | None = None
    dry_run: bool = False


def join(opts: JoinOptions, say: Say = print) -> None:
    """Join this gateway (see the module docstring); JoinError naming the failed step."""
    if str(opts.source).startswith(("http:/", "https:/")):
        raise JoinError(
            f"{opts.source}: join URLs are not served yet: copy the join file that "
            "`central add-node` wrote to this gateway and give its path"
        )
    try:
        j = read(opts.source, opts.token)
        host, port = split_address(j.broker)
    except (JoinFileError, BrokerDirError) as exc:
        raise JoinError(str(exc)) from None
    mode = stat.S_IMODE(opts.source.stat().st_mode)
    if mode & 0o077:
        say(f"warning: {opts.source} is readable by others (mode {mode:o}): it holds a key")
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
    if opts.dry_run or opts.wait_s <= 0:
        return
    wait_connected(opts, j.node_id, say)


def wait_connected(opts: JoinOptions, node_id: str, say: Say) -> dict[str, Any]:
    """Poll the node's ``/v1/status`` until its broker link is up and central is heard;
    its status then, or JoinError saying what was missing after ``opts.wait_s``."""
    from edgesched.rest.client import ApiClient, ApiTarget, Unreachable

    lay = opts.layout
    state = opts.state_dir or lay.host(lay.state_dir)
    config = lay.config
    if not (systemd_running() and not lay.staged and opts.start):
        say(
            f"systemd does not start it here: start the node with `edgesched edge run "
            f"--config {config}`; waiting up to {opts.wait_s:g} s for it to connect"
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
