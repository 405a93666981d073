"""`edgesched install` / `uninstall` and the systemd unit, on real files in temporary roots.

The unit is checked directive by directive and by `systemd-analyze verify` (systemd 252 is
installed here, though not running as PID 1). Installs go into a staging root (`--root`) or
into temporary --prefix/--etc-dir/--unit-dir with `--user root`, so no test makes a system
user or touches /etc. Uninstall stops real task processes started by the real executor.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from edgesched.cli import app
from edgesched.config import default_config_toml, load_config
from edgesched.core.task import TaskSpec
from edgesched.edge.executor import Executor, kill_leftovers
from edgesched.install import Layout, parse_systemd_version, systemd_version
from edgesched.sync.security import issue, make_ca
from edgesched.tomlwrite import toml_dumps
from edgesched.unit import UnitParams, render_unit

runner = CliRunner()
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def cli(*args: object) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def unit_directives(text: str) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> values, in order, of a unit file."""
    out: dict[tuple[str, str], list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key), []).append(value)
    return out


def files_under(root: Path) -> list[str]:
    """Every file and symlink (not directory) under ``root``, relative."""
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_symlink() or not p.is_dir()
    )


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )


def params(role: str = "edge", **kw: Any) -> UnitParams:
    base: dict[str, Any] = {
        "role": role,
        "executable": PurePosixPath(sys.prefix) / "bin" / "edgesched",
        "config": PurePosixPath(f"/etc/edgesched/{role}.toml"),
        "state_directory": "edgesched" if role == "edge" else "edgesched-central",
        "config_dir": PurePosixPath("/etc/edgesched"),
        "user": "edgesched",
        "version": "9.9",
    }
    return UnitParams(**(base | kw))


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    make_ca(tmp_path / "ca")
    return tmp_path / "ca"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root").mkdir()
    return tmp_path / "root"


# --- the unit ---------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["edge"])  # central's sandbox: tests/test_unit_security.py
def test_the_unit_has_the_directives_a_gateway_needs(role: str) -> None:
    d = unit_directives(render_unit(params(role)))
    exe = f"{sys.prefix}/bin/edgesched"
    assert d["Service", "ExecStart"] == [f"{exe} {role} run --config /etc/edgesched/{role}.toml"]
    expected = {
        "Restart": "always",
        "RestartSec": "2",
        "KillMode": "process",  # an upgrade's restart never kills the tasks
        "Delegate": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "CapabilityBoundingSet": "",
        "StateDirectory": "edgesched" if role == "edge" else "edgesched-central",
        "User": "edgesched",
        "Group": "edgesched",
        "Type": "notify",
    }
    for key, value in expected.items():
        assert d["Service", key] == [value], key
    assert d["Service", "ReadWritePaths"] == ["/tmp /var/tmp"]
    assert d["Unit", "After"] == ["network.target"]  # starts with no network at all
    assert d["Unit", "StartLimitIntervalSec"] == ["0"]
    assert d["Install", "WantedBy"] == ["multi-user.target"]
    # options that would break tasks outliving the engine, GPUs or the executor's cgroups
    for absent in ("PrivateTmp", "PrivateDevices", "ProtectClock", "ProtectControlGroups",
                   "ProtectKernelTunables", "RemoveIPC", "SystemCallArchitectures",
                   "DevicePolicy", "MemoryDenyWriteExecute"):  # fmt: skip
        assert ("Service", absent) not in d, absent


def test_the_unit_as_root_and_extra_writable_paths() -> None:
    extra = (PurePosixPath("/srv/camera"), PurePosixPath("/data"))
    d = unit_directives(render_unit(params(user=None, read_write_paths=extra)))
    assert ("Service", "User") not in d and ("Service", "Group") not in d
    assert d["Service", "CapabilityBoundingSet"] == [""]  # root, still without capabilities
    assert d["Service", "ReadWritePaths"] == ["/tmp /var/tmp", "/srv/camera", "/data"]


@pytest.mark.parametrize(
    "change",
    [
        {"config": PurePosixPath("/etc/my edgesched/edge.toml")},
        {"executable": PurePosixPath("relative/edgesched")},
        {"config_dir": PurePosixPath("/etc/%n")},
        {"read_write_paths": (PurePosixPath("/data;rm"),)},
        {"state_directory": "../x"},
        {"user": "Bad User"},
        {"role": "worker"},
    ],
)
def test_the_unit_refuses_what_systemd_would_split_or_expand(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        params(**change)


@needs_analyze
@pytest.mark.parametrize("role", ["edge", "central"])
def test_the_rendered_unit_passes_systemd_analyze_verify(tmp_path: Path, role: str) -> None:
    unit = tmp_path / f"edgesched-{role}.service"
    unit.write_text(render_unit(params(role)))
    done = verify(unit)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stderr
    # the check can fail: a misspelt directive and a missing binary are both reported
    unit.write_text(render_unit(params(role)).replace("KillMode=", "KilMode="))
    assert "Unknown key" in verify(unit).stderr
    missing = params(role, executable=PurePosixPath(tmp_path / "nothing" / "edgesched"))
    unit.write_text(render_unit(missing))
    bad = verify(unit)
    assert bad.returncode != 0 and "not executable" in bad.stderr


# --- install and uninstall ----------------------------------------------------------------------


def local_dirs(tmp_path: Path) -> list[str | Path]:
    """Options that put every install path under tmp_path, on this machine (no --root)."""
    return [
        "--prefix", tmp_path / "opt", "--etc-dir", tmp_path / "etc",
        "--unit-dir", tmp_path / "units", "--user", "root",
    ]  # fmt: skip


@needs_analyze
def test_an_installed_unit_passes_verify_and_runs_the_installed_release(
    tmp_path: Path, ca: Path
) -> None:
    result = cli("install", "--node-id", "gw-01", "--ca-dir", ca, "--broker", "mqtt.example",
                 *local_dirs(tmp_path))  # fmt: skip
    assert result.exit_code == 0, result.output
    unit = tmp_path / "units" / "edgesched-edge.service"
    done = verify(unit)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stderr
    exec_start = unit_directives(unit.read_text())["Service", "ExecStart"][0].split()
    assert exec_start[0] == str(tmp_path / "opt" / "current" / "bin" / "edgesched")
    assert Path(exec_start[0]).resolve() == (Path(sys.prefix) / "bin" / "edgesched").resolve()
    # the installed config passes `edgesched config check` and names the installed identity
    cfg = load_config(Path(exec_start[-1]))
    assert cfg.edge.node_id == "gw-01" and cfg.edge.state_dir == "/var/lib/edgesched"
    assert cfg.edge.mqtt.tls and cfg.edge.mqtt.port == 8883
    assert cfg.edge.mqtt.key_file == str(tmp_path / "etc" / "certs" / "gw-01.key")
    cfg.edge.mqtt.endpoint("gw-01")  # the key and certificates load as the engine loads them
    assert "systemd is not running here" in result.output or "ran: systemctl" in result.output


def test_install_into_a_staging_root_then_purge_leaves_nothing(root: Path, ca: Path) -> None:
    result = cli(
        "install", "--node-id", "gw-01", "--broker", "127.0.0.1", "--ca-dir", ca, "--root", root
    )
    assert result.exit_code == 0, result.output
    assert files_under(root) == [
        "etc/edgesched/certs/ca.crt",
        "etc/edgesched/certs/gw-01.crt",
        "etc/edgesched/certs/gw-01.key",
        "etc/edgesched/edge.toml",
        "etc/systemd/system/edgesched-edge.service",
        "opt/edgesched/current",
    ]
    key = root / "etc/edgesched/certs/gw-01.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((root / "etc/edgesched/edge.toml").stat().st_mode) == 0o640
    assert os.readlink(root / "opt/edgesched/current") == sys.prefix
    # inside the files, the gateway's paths, not the staging root's
    text = (root / "etc/edgesched/edge.toml").read_text()
    assert 'key_file = "/etc/edgesched/certs/gw-01.key"' in text and str(root) not in text
    unit = (root / "etc/systemd/system/edgesched-edge.service").read_text()
    assert "ExecStart=/opt/edgesched/current/bin/edgesched edge run" in unit
    assert "skipped: useradd" in result.output and "skipped: systemctl" in result.output

    (root / "var/lib/edgesched/run").mkdir(parents=True)  # what the service would make
    (root / "var/lib/edgesched/edge.db").write_text("state")
    gone = cli("uninstall", "--root", root, "--purge")
    assert gone.exit_code == 0, gone.output
    assert files_under(root) == []
    for d in ("etc/edgesched", "opt/edgesched", "var/lib/edgesched"):
        assert not (root / d).exists(), d
    again = cli("uninstall", "--root", root, "--purge")
    assert again.exit_code == 0 and "nothing to remove" in again.output


def test_uninstall_without_purge_keeps_config_and_state(root: Path, ca: Path) -> None:
    assert (
        cli(
            "install", "--node-id", "gw-01", "--broker", "127.0.0.1", "--ca-dir", ca, "--root", root
        ).exit_code
        == 0
    )
    gone = cli("uninstall", "--root", root)
    assert gone.exit_code == 0, gone.output
    assert files_under(root) == [
        "etc/edgesched/certs/ca.crt",
        "etc/edgesched/certs/gw-01.crt",
        "etc/edgesched/certs/gw-01.key",
        "etc/edgesched/edge.toml",
    ]
    assert "remove them with --purge" in gone.output


def test_a_second_install_changes_nothing_and_says_so(root: Path, ca: Path) -> None:
    args = [
        "install",
        "--node-id",
        "gw-01",
        "--broker",
        "127.0.0.1",
        "--ca-dir",
        ca,
        "--root",
        root,
        "--site",
        "north",
    ]
    assert cli(*args).exit_code == 0
    before = {p: (root / p).lstat() for p in files_under(root)}
    again = cli(*args)
    assert again.exit_code == 0, again.output
    assert "nothing changed" in again.output
    steps = again.output.splitlines()
    assert not [ln for ln in steps if ln.startswith(("wrote ", "changed ", "linked ", "fixed "))]
    after = {p: (root / p).lstat() for p in files_under(root)}
    assert {p: (s.st_ino, s.st_mtime_ns) for p, s in before.items()} == {
        p: (s.st_ino, s.st_mtime_ns) for p, s in after.items()
    }  # the certificate was not issued again, nothing was rewritten

    # a changed option: the config is replaced, the previous one kept beside it
    old = (root / "etc/edgesched/edge.toml").read_text()
    changed = cli(*args[:-1], "south")
    assert changed.exit_code == 0, changed.output
    assert "changed /etc/edgesched/edge.toml" in changed.output
    backups = list((root / "etc/edgesched").glob("edge.toml.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == old
    assert 'site = "south"' in (root / "etc/edgesched/edge.toml").read_text()
    # a mode changed by hand is put back
    (root / "etc/edgesched/certs/gw-01.key").chmod(0o644)
    fixed = cli(*args[:-1], "south")
    assert "fixed the mode" in fixed.output
    assert stat.S_IMODE((root / "etc/edgesched/certs/gw-01.key").stat().st_mode) == 0o600


def test_the_dry_run_writes_nothing_and_prints_every_file_line_by_line(
    root: Path, ca: Path, tmp_path: Path
) -> None:
    args = [
        "install",
        "--node-id",
        "gw-01",
        "--broker",
        "127.0.0.1",
        "--ca-dir",
        ca,
        "--root",
        root,
    ]
    dry = cli(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert files_under(root) == [] and list(root.iterdir()) == []
    lines = dry.output.splitlines()
    assert lines[0].startswith("edgesched install --dry-run: edge node gw-01; nothing is written")
    known = ("would run: ", "would skip: ", "would create directory ", "would write (",
             "  | ", "would link ", "note: ")  # fmt: skip
    for line in lines[1:]:
        assert line.startswith(known), line
    written = [ln for ln in lines if ln.startswith("would write (")]
    assert [ln.split()[3] for ln in written] == [
        "/etc/edgesched/edge.toml",
        "/etc/edgesched/certs/ca.crt",
        "/etc/edgesched/certs/gw-01.crt",
        "/etc/edgesched/certs/gw-01.key",
        "/etc/systemd/system/edgesched-edge.service",
    ]
    assert "secret: content not shown" in written[3] and "PRIVATE KEY" not in dry.output
    assert "would link /opt/edgesched/current -> " in dry.output
    assert "would skip: useradd --system" in dry.output
    # the commands of a first install: reload, enable, restart (skipped: a staging root)
    assert "would skip: systemctl restart edgesched-edge.service" in dry.output
    assert "enable --now" not in dry.output

    # every line of what a real install writes was printed, in order, under its header
    assert cli(*args).exit_code == 0
    printed = "\n".join(lines)
    for rel in ("etc/edgesched/edge.toml", "etc/systemd/system/edgesched-edge.service",
                "etc/edgesched/certs/ca.crt"):  # fmt: skip
        body = "\n".join(f"  | {ln}" for ln in (root / rel).read_text().splitlines())
        assert body in printed, rel
    # the certificate issued by the real install is not the dry run's (a fresh one each time)
    assert (root / "etc/edgesched/certs/gw-01.crt").read_text().splitlines()[1] not in printed
    # a dry run over an installed node says what is unchanged
    again = cli(*args, "--dry-run")
    assert "would write (unchanged) /etc/edgesched/edge.toml" in again.output
    assert "would write (unchanged) /etc/edgesched/certs/gw-01.crt" in again.output
    assert "would skip: systemctl enable --now edgesched-edge.service" in again.output
    assert "would skip: systemctl restart" not in again.output


def test_install_through_the_entry_point_dry_run(root: Path, tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("edgesched")
    done = subprocess.run(
        [exe, "install", "--node-id", "gw-02", "--broker", "127.0.0.1", "--root", root,
         "--dry-run"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ExecStart=/opt/edgesched/current/bin/edgesched edge run" in done.stdout
    assert list(root.iterdir()) == []


def test_central_role(root: Path, ca: Path) -> None:
    result = cli("install", "--role", "central", "--ca-dir", ca, "--root", root)
    assert result.exit_code == 0, result.output
    cfg = tomllib.loads((root / "etc/edgesched/central.toml").read_text())
    assert cfg["central"]["central_id"] == "central"
    assert cfg["central"]["state_dir"] == "/var/lib/edgesched-central"
    unit = (root / "etc/systemd/system/edgesched-central.service").read_text()
    assert "central run --config /etc/edgesched/central.toml" in unit
    assert "StateDirectory=edgesched-central" in unit
    # an edge node on the same machine shares the CA file; purging central keeps it
    assert (
        cli(
            "install", "--node-id", "gw-01", "--broker", "127.0.0.1", "--ca-dir", ca, "--root", root
        ).exit_code
        == 0
    )
    assert cli("uninstall", "--role", "central", "--purge", "--root", root).exit_code == 0
    left = files_under(root)
    assert "etc/edgesched/certs/ca.crt" in left and "etc/edgesched/central.toml" not in left
    assert "etc/edgesched/certs/central.key" not in left
    assert "etc/systemd/system/edgesched-edge.service" in left
    assert "opt/edgesched/current" in left  # the edge node still runs the release


def test_an_unknown_user_is_refused(tmp_path: Path) -> None:
    args = local_dirs(tmp_path)[:-2]  # without --user root
    result = cli(
        "install", "--node-id", "gw-01", "--broker", "127.0.0.1", *args, "--user", "no-such-user-x"
    )
    assert result.exit_code == 2 and "--user: no user 'no-such-user-x'" in result.output
    assert list(tmp_path.iterdir()) == []


def test_copied_certificates_and_a_base_config(root: Path, ca: Path, tmp_path: Path) -> None:
    from edgesched.sync.security import load_ca

    node = issue(load_ca(ca), "gw-07", tmp_path / "node")
    base = tmp_path / "mine.toml"
    base.write_text(
        '[policy]\nmode = "energy"\n[policy.tidal]\nname = "shift"\n'
        '[[policy.tidal.windows]]\nname = "day"\nstart = "08:00"\nend = "18:00"\n'
        "shares = { face-recognition = 0.5 }\n"
        '[edge]\nnode_id = "gw-07"\nstate_dir = "/srv/else"\nlease_s = 30.0\n'
    )
    result = cli("install", "--config", base, "--ca", node.ca, "--cert", node.cert, "--key",
                 node.key, "--broker", "10.0.0.1:18883", "--root", root)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "state_dir '/srv/else' replaced by /var/lib/edgesched" in result.output
    written = root / "etc/edgesched/edge.toml"
    cfg = tomllib.loads(written.read_text())
    assert cfg["policy"]["tidal"]["windows"][0]["shares"] == {"face-recognition": 0.5}
    assert cfg["edge"]["lease_s"] == 30.0 and cfg["edge"]["mqtt"]["port"] == 18883
    assert (root / "etc/edgesched/certs/gw-07.key").read_bytes() == node.key.read_bytes()
    assert load_config(written).policy.mode.value == "energy"


def test_release_links(root: Path, ca: Path, tmp_path: Path) -> None:
    release = root / "opt/edgesched/releases/0.2.0/bin"
    release.mkdir(parents=True)
    (release / "edgesched").write_text("#!/bin/sh\n")
    (release / "edgesched").chmod(0o755)
    args = ["install", "--node-id", "gw-01", "--broker", "127.0.0.1", "--root", root]
    first = cli(*args, "--release", "/opt/edgesched/releases/0.2.0")
    assert first.exit_code == 0, first.output
    link = root / "opt/edgesched/current"
    assert os.readlink(link) == "/opt/edgesched/releases/0.2.0"
    # run again from a venv outside releases/: the installed release is kept, not replaced
    kept = cli(*args)
    assert "unchanged /opt/edgesched/current -> /opt/edgesched/releases/0.2.0" in kept.output
    bad = cli(*args, "--release", "/opt/edgesched/releases/9.9.9")
    assert bad.exit_code == 2 and "no bin/edgesched" in bad.output


# --- bad input: a clear error and nothing written ---------------------------------------------


def other_identity_cert(ca: Path, tmp_path: Path) -> list[str | Path]:
    from edgesched.sync.security import load_ca

    f = issue(load_ca(ca), "gw-99", tmp_path / "other")
    return ["--ca", f.ca, "--cert", f.cert, "--key", f.key]


def mismatched_key(ca: Path, tmp_path: Path) -> list[str | Path]:
    from edgesched.sync.security import load_ca

    a = issue(load_ca(ca), "gw-01", tmp_path / "a")
    b = issue(load_ca(ca), "gw-01", tmp_path / "b")
    return ["--ca", a.ca, "--cert", a.cert, "--key", b.key]


def foreign_ca(ca: Path, tmp_path: Path) -> list[str | Path]:
    from edgesched.sync.security import load_ca

    other = make_ca(tmp_path / "other-ca")
    f = issue(load_ca(ca), "gw-01", tmp_path / "a")
    return ["--ca", other.cert, "--cert", f.cert, "--key", f.key]


def broker_cert(ca: Path, tmp_path: Path) -> list[str | Path]:
    from edgesched.sync.security import load_ca

    f = issue(load_ca(ca), "gw-01", tmp_path / "srv", server_names=["gw-01"])
    return ["--ca", f.ca, "--cert", f.cert, "--key", f.key]


def bad_config(ca: Path, tmp_path: Path) -> list[str | Path]:
    path = tmp_path / "bad.toml"
    path.write_text("[edge]\nlease_s = -1\n")
    return ["--config", path]


def typo_config(ca: Path, tmp_path: Path) -> list[str | Path]:
    path = tmp_path / "typo.toml"
    path.write_text("[edge]\nleese_s = 3\n")
    return ["--config", path]


def home_config(ca: Path, tmp_path: Path) -> list[str | Path]:
    path = tmp_path / "home.toml"
    path.write_text('[edge.mqtt]\ntls = true\nca_file = "/home/admin/ca.crt"\n')
    return ["--config", path]


def simulated_node(ca: Path, tmp_path: Path) -> list[str | Path]:
    path = tmp_path / "sim.toml"
    path.write_text(f'[edge]\nhal_root = "{tmp_path}"\n')
    return ["--config", path]


def simulated_telemetry(ca: Path, tmp_path: Path) -> list[str | Path]:
    path = tmp_path / "sim-telemetry.toml"
    path.write_text('[edge]\ntelemetry_source = "reserved"\n')
    return ["--config", path]


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda ca, t: ["--ca", t / "nope.crt"], "--ca " + "{t}/nope.crt: no such file"),
        (
            lambda ca, t: ["--ca", ca / "ca.crt", "--cert", t / "x.crt", "--key", t / "x.key"],
            "--cert {t}/x.crt: no such file",
        ),
        (lambda ca, t: ["--cert", ca / "ca.crt"], "--cert and --key go together"),
        (lambda ca, t: ["--ca-dir", t / "no-ca"], "no CA file"),
        (lambda ca, t: ["--ca-dir", ca, "--ca", ca / "ca.crt"], "do not also pass"),
        (lambda ca, t: ["--ca", ca / "ca.key"], "not a PEM certificate"),
        (other_identity_cert, "issued to 'gw-99', not to 'gw-01'"),
        (mismatched_key, "not the private key of"),
        (foreign_ca, "not signed by the CA given"),
        (broker_cert, "not a client certificate"),
        (lambda ca, t: ["--role", "worker"], "--role: must be edge or central"),
        (lambda ca, t: ["--node-id", "gw 01"], "--node-id: invalid identity"),
        (lambda ca, t: ["--broker", "host:99999"], "--broker: port must be 1-65535"),
        (lambda ca, t: ["--prefix", "opt"], "--prefix: must be absolute"),
        (
            lambda ca, t: ["--container-runtime", "dockr"],
            "container_runtime must be docker, podman",
        ),
        (bad_config, "config: edge.lease_s"),
        (typo_config, "did you mean 'lease_s'?"),
        (home_config, "hidden from the service (ProtectHome=yes)"),
        (simulated_node, "a simulated node"),
        (simulated_telemetry, "edge.telemetry_source is 'reserved': a simulated node's"),
        (lambda ca, t: ["--password-file", t / "pw"], "--password-file {t}/pw: no such file"),
        (lambda ca, t: ["--read-write-path", "data"], "--read-write-path: must be absolute"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_input_is_one_clear_error_and_writes_nothing(
    root: Path, ca: Path, tmp_path: Path, make_args: Any, message: str
) -> None:
    args = [
        "install",
        "--node-id",
        "gw-01",
        "--broker",
        "127.0.0.1",
        "--root",
        root,
        *make_args(ca, tmp_path),
    ]
    if "--node-id" in args[3:]:
        args = args[:1] + args[3:]
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert message.format(t=tmp_path) in result.output
    assert result.output.startswith("error: ") and "Traceback" not in result.output
    assert list(root.iterdir()) == []


def test_a_bad_password_file(root: Path, tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("one\ntwo\n")
    bad = cli(
        "install",
        "--node-id",
        "gw-01",
        "--broker",
        "127.0.0.1",
        "--password-file",
        pw,
        "--root",
        root,
    )
    assert bad.exit_code == 2 and "one line with the password" in bad.output
    pw.write_text("s3cret\n")
    ok = cli(
        "install",
        "--node-id",
        "gw-01",
        "--broker",
        "127.0.0.1",
        "--password-file",
        pw,
        "--root",
        root,
    )
    assert ok.exit_code == 0, ok.output
    saved = root / "etc/edgesched/certs/mqtt-password"
    assert saved.read_text() == "s3cret\n" and stat.S_IMODE(saved.stat().st_mode) == 0o600
    cfg = tomllib.loads((root / "etc/edgesched/edge.toml").read_text())
    assert cfg["edge"]["mqtt"]["password_file"] == "/etc/edgesched/certs/mqtt-password"


def test_an_expired_certificate_is_refused(root: Path, ca: Path, tmp_path: Path) -> None:
    from edgesched.sync.security import load_ca

    f = issue(load_ca(ca), "gw-01", tmp_path / "old", days=0)  # not valid after now + 0 days
    result = cli("install", "--node-id", "gw-01", "--broker", "127.0.0.1", "--ca", f.ca,
                 "--cert", f.cert, "--key", f.key, "--root", root)  # fmt: skip
    assert result.exit_code == 2 and "expired on" in result.output
    assert list(root.iterdir()) == []


# --- uninstall stops the node's tasks ---------------------------------------------------------


@pytest.fixture
def running_task(root: Path) -> Iterator[Executor]:
    run_dir = root / "var/lib/edgesched/run"

    async def start() -> Executor:
        ex = Executor(run_dir, cgroup_parent=None)
        await ex.start(TaskSpec(id="cam-1", command=("sleep", "300")))
        return ex

    ex = asyncio.run(start())
    yield ex
    kill_leftovers([run_dir])


def test_uninstall_stops_the_tasks_unless_asked_to_keep_them(
    root: Path, running_task: Executor
) -> None:
    pid = running_task.running()["cam-1"].pid
    kept = cli("uninstall", "--root", root, "--keep-tasks")
    assert kept.exit_code == 0 and "(--keep-tasks)" in kept.output
    os.kill(pid, 0)  # still there
    dry = cli("uninstall", "--root", root, "--dry-run")
    assert "(1 running now)" in dry.output
    os.kill(pid, 0)
    gone = cli("uninstall", "--root", root)
    assert gone.exit_code == 0 and "stopped 1 task process group(s)" in gone.output
    # SIGTERM first: the wrapper recorded the task's exit (SIGKILL would leave no record)
    code = (root / "var/lib/edgesched/run/cam-1.exit").read_text().split()[0]
    assert code == "143"
    assert os.waitpid(pid, 0)[0] == pid  # our child (the test started it): reap it


# --- TOML writing ---------------------------------------------------------------------------

_keys = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
_scalars = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(st.characters(codec="utf-8"), max_size=12)
    | st.times()
    | st.dates()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=5))
def test_toml_dumps_round_trips(data: dict[str, Any]) -> None:
    assert tomllib.loads(toml_dumps(data)) == data


def test_toml_dumps_keeps_the_example_config() -> None:
    example = tomllib.loads(default_config_toml())
    assert tomllib.loads(toml_dumps(example)) == example
    with pytest.raises(ValueError, match="NoneType"):
        toml_dumps({"a": None})
    assert tomllib.loads(toml_dumps({"t": dt.time(8, 30)})) == {"t": dt.time(8, 30)}


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root")
def test_a_real_install_needs_root_but_a_dry_run_does_not(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("edgesched")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(exe)]
    args = ["install", "--node-id", "gw-01", "--broker", "127.0.0.1"]
    real = subprocess.run([*nobody, *args], capture_output=True, text=True, cwd="/", timeout=60)
    assert real.returncode == 2 and "run it as root" in real.stderr, real.stderr
    dry = subprocess.run([*nobody, *args, "--dry-run"], capture_output=True, text=True,
                         cwd="/", timeout=60)  # fmt: skip
    assert dry.returncode == 0 and "/etc/edgesched/edge.toml: mode 0640" in dry.stdout


def test_an_edge_install_without_a_broker_is_one_line_and_writes_nothing(root: Path) -> None:
    """It used to target 127.0.0.1:1883 silently (issue 18)."""
    result = cli("install", "--node-id", "gw-02", "--root", root)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --broker: missing"), result.output
    assert not root.exists() or files_under(root) == []


def test_a_base_config_naming_the_broker_is_enough(root: Path, tmp_path: Path) -> None:
    base = tmp_path / "base.toml"
    base.write_text('[edge.mqtt]\nhost = "127.0.0.1"\nport = 1884\n')
    result = cli("install", "--node-id", "gw-02", "--config", base, "--root", root)
    assert result.exit_code == 0, result.output
    mqtt = tomllib.loads((root / "etc/edgesched/edge.toml").read_text())["edge"]["mqtt"]
    assert (mqtt["host"], mqtt["port"]) == ("127.0.0.1", 1884)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("systemd 252 (252.39-1~deb12u2)\n+PAM +AUDIT", 252),
        ("systemd 256 (256.7)", 256),
        ("", None),
        ("systemctl: command not found", None),
        ("systemd x (y)", None),
    ],
)
def test_the_systemd_version_is_read_from_systemctl(text: str, version: int | None) -> None:
    assert parse_systemd_version(text) == version


def test_a_unit_for_this_machine_fits_its_systemd_and_a_staged_one_assumes_none(
    tmp_path: Path,
) -> None:
    """Installed here, the unit is rendered for this machine's systemd (DelegateSubgroup= only
    from 254 on); staged under --root it is for another machine, whose version is unknown."""
    assert systemd_version(Layout("edge", root=tmp_path)) is None
    here = systemd_version(Layout("edge"))
    if shutil.which("systemctl") is None:
        assert here is None
        return
    real = subprocess.run(["systemctl", "--version"], capture_output=True, text=True).stdout
    assert here == int(real.split()[1])
