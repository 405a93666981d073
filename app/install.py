"""``edgesched install`` / ``uninstall``: put an edge node (or central) on a gateway as a service.

Role: lay out the agreed install tree, write the node's config, identity and systemd unit,
and undo it. The layout (shared with the offline bundle and upgrade/rollback):

* ``<prefix>`` (``/opt/edgesched``): ``releases/<version>/`` is one virtual environment with
  edgesched installed; ``current`` is a symlink to the active release. The unit runs
  ``<prefix>/current/bin/edgesched``. ``install`` points ``current`` at the virtual
  environment it runs from when that is under ``releases/`` (a bundle put it there); run from
  anywhere else (a ``pip install`` in some venv), it keeps an existing ``current`` that points
  at a real release, and otherwise records its own ``sys.prefix`` as the release (``--release``
  overrides both).
* ``<etc>`` (``/etc/edgesched``): ``edge.toml`` or ``central.toml`` (0640 root:<user>),
  ``certs/`` (``ca.crt``, ``<id>.crt``, ``<id>.key`` 0600 owned by the service user, or
  ``mqtt-password`` 0600).
* state: systemd's ``StateDirectory=`` (``/var/lib/edgesched``, central
  ``/var/lib/edgesched-central``); the config's ``state_dir`` points there. Logs: the journal.
* the unit ``<unit_dir>/edgesched-<role>.service`` (:mod:`edgesched.unit`), run as the system
  user ``edgesched`` (created with ``useradd --system`` unless ``--user`` names another).

How it works: :func:`plan_install` reads and checks every input (the base config, certificate
files, the CA) and builds a :class:`Plan` of directories, files, one link and commands, and
raises :class:`InstallError` on bad input before anything is written. :func:`apply` then
carries the plan out (or, with ``dry_run``, only prints it: every path with its full content,
private keys excepted, and every command). Files are written atomically (temporary file,
fsync, rename); a file whose content changed is first renamed to ``<name>.bak-<time>``; an
install that would change nothing says so. ``root`` (like ``DESTDIR``) stages everything under
another directory: the paths written *inside* files stay the gateway's, and no user is made
and no ``systemctl`` runs there.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal

from edgesched.fileplan import (
    Command,
    Link,
    MakeDir,
    Outcome,
    Owner,
    Plan,
    PlanError,
    Say,
    WriteFile,
    apply,
    command_line,
    link_target,
    print_plan,
    run,
)
from edgesched.nodecerts import CertError, NodeCerts, from_ca_dir, from_files, read_file
from edgesched.tomlwrite import toml_dumps

Role = Literal["edge", "central"]
ROLES: Final[tuple[Role, ...]] = ("edge", "central")

DEFAULT_PREFIX: Final = Path("/opt/edgesched")
DEFAULT_ETC_DIR: Final = Path("/etc/edgesched")
DEFAULT_UNIT_DIR: Final = Path("/etc/systemd/system")
#: Where systemd's ``StateDirectory=`` lives for system services.
STATE_ROOT: Final = Path("/var/lib")
SERVICE_USER: Final = "edgesched"
RELEASES: Final = "releases"
CURRENT: Final = "current"
CERTS: Final = "certs"
PASSWORD_FILE: Final = "mqtt-password"
#: The first line of every file install writes (the unit, the config).
MARK: Final = "written by `edgesched install`"
#: Directories a service with ProtectHome=yes cannot see: config files must not live there.
_HIDDEN: Final = (Path("/home"), Path("/root"), Path("/run/user"))


def unit_name(role: Role) -> str:
    """``edgesched-edge.service`` or ``edgesched-central.service``."""
    return f"edgesched-{role}.service"


def config_name(role: Role) -> str:
    """``edge.toml`` or ``central.toml`` (in the config directory)."""
    return f"{role}.toml"


def state_dir_name(role: Role) -> str:
    """The unit's ``StateDirectory=``: ``edgesched`` for an edge node (the edge config's
    default state_dir), ``edgesched-central`` for central (central's default)."""
    return "edgesched" if role == "edge" else "edgesched-central"


def releases_dir(prefix: Path = DEFAULT_PREFIX) -> Path:
    return prefix / RELEASES


def release_dir(version: str, prefix: Path = DEFAULT_PREFIX) -> Path:
    """One release: a virtual environment with edgesched ``version`` installed."""
    return prefix / RELEASES / version


def current_link(prefix: Path = DEFAULT_PREFIX) -> Path:
    """The symlink to the active release; the unit runs ``current/bin/edgesched``."""
    return prefix / CURRENT


def executable(prefix: Path = DEFAULT_PREFIX) -> Path:
    """What the unit's ``ExecStart=`` runs."""
    return current_link(prefix) / "bin" / "edgesched"


class InstallError(Exception):
    """Bad input, found before anything is written; the message names the option or key."""


class StepFailed(InstallError):
    """A step failed on the way (a command, a file in the way): some steps were done."""


# --- where things go ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layout:
    """The install's paths as the gateway sees them, and ``root`` where they are staged."""

    role: Role
    prefix: Path = DEFAULT_PREFIX
    etc_dir: Path = DEFAULT_ETC_DIR
    unit_dir: Path = DEFAULT_UNIT_DIR
    root: Path = Path("/")

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InstallError(f"--role: must be edge or central, got {self.role!r}")
        for name in ("prefix", "etc_dir", "unit_dir", "root"):
            value = getattr(self, name)
            if not value.is_absolute():
                raise InstallError(f"--{name.replace('_', '-')}: must be absolute, got {value}")
            if any(c in str(value) for c in " \t\n\"'\\%$;"):
                raise InstallError(
                    f"--{name.replace('_', '-')}: no spaces, quotes, '%', '$' or ';' "
                    f"(it goes into a systemd unit): {value}"
                )

    @property
    def staged(self) -> bool:
        return self.root != Path("/")

    def host(self, path: Path) -> Path:
        """Where ``path`` (a gateway path) is on this machine: under ``root``."""
        return self.root / path.relative_to("/")

    @property
    def config(self) -> Path:
        return self.etc_dir / config_name(self.role)

    @property
    def certs(self) -> Path:
        return self.etc_dir / CERTS

    @property
    def unit(self) -> Path:
        return self.unit_dir / unit_name(self.role)

    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / state_dir_name(self.role)

    @property
    def current(self) -> Path:
        return current_link(self.prefix)


@dataclass(frozen=True, slots=True)
class InstallOptions:
    """What ``edgesched install`` was asked for (CLI options, one field each)."""

    layout: Layout
    node_id: str | None = None  # edge: node_id; central: central_id
    site: str | None = None
    base_config: Path | None = None  # a TOML config to start from
    broker: str | None = None  # host[:port]
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    ca_dir: Path | None = None  # issue the node's certificate from this CA (ca.crt + ca.key)
    password_file: Path | None = None
    user: str | None = None  # None: the edgesched system user, created when missing
    release: Path | None = None
    read_write_paths: tuple[Path, ...] = ()
    container_runtime: str | None = None
    start: bool = True


def systemd_running() -> bool:
    """Whether systemd is PID 1 here (sd_booted(): ``/run/systemd/system`` exists)."""
    return os.path.isdir("/run/systemd/system")


def parse_systemd_version(text: str) -> int | None:
    """The version number ``systemctl --version`` prints first ("systemd 252 (252.30-1)")."""
    words = text.split()
    if len(words) >= 2 and words[0] == "systemd" and words[1].isdigit():
        return int(words[1])
    return None


def systemd_version(layout: Layout) -> int | None:
    """The version of this machine's systemd, for a unit installed here (newer ones get
    ``DelegateSubgroup=``, :mod:`edgesched.unit`); None when staged under ``--root`` (the
    unit is for another machine) or when ``systemctl`` is not there."""
    if layout.staged or shutil.which("systemctl") is None:
        return None
    try:
        out = subprocess.run(
            ["systemctl", "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_systemd_version(out)


def _pid1() -> str:
    try:
        return Path("/proc/1/comm").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _systemctl_skip(layout: Layout) -> str:
    if layout.staged:
        return f"staged under --root {layout.root}: systemctl acts on this machine, not there"
    if not systemd_running():
        return f"systemd is not running here (PID 1 is {_pid1()})"
    return ""


# --- install ------------------------------------------------------------------------------


def _need_root(lay: Layout, dry_run: bool) -> None:
    if not dry_run and not lay.staged and os.geteuid() != 0:
        raise InstallError(
            "run it as root (it writes under /etc and /opt), or see what it would do with "
            "--dry-run, or stage it with --root DIR"
        )


def install(opts: InstallOptions, *, dry_run: bool = False, say: Say = print) -> Outcome:
    """Plan (checking every input: InstallError, nothing written), then carry the plan out
    or, with ``dry_run``, print it. InstallError if a step fails on the way."""
    plan = plan_install(opts)
    _need_root(opts.layout, dry_run)
    if dry_run:
        heading = f"edgesched install --dry-run: {plan.title}; nothing is written, nothing runs"
        print_plan(plan, say, heading=heading)
        return Outcome()
    try:
        out = apply(plan, say)
    except (PlanError, OSError) as exc:
        raise StepFailed(f"install stopped half-way: {exc}") from exc
    if not out.anything:
        say(f"nothing changed: the {plan.title} is installed as asked")
    return out


def plan_install(opts: InstallOptions, *, version: str | None = None) -> Plan:
    """Check every input and build the install plan; :class:`InstallError` on bad input."""
    from edgesched.version import __version__

    version = version or __version__
    lay = opts.layout
    role = lay.role
    plan = Plan(f"{role} {'node' if role == 'edge' else 'engine'}", lay.root)

    user, service_owner = _service_user(opts, plan)
    base = _read_base(opts.base_config)
    section = base.setdefault(role, {})
    if not isinstance(section, dict):
        raise InstallError(f"{opts.base_config}: [{role}] must be a table")
    id_key = "node_id" if role == "edge" else "central_id"
    identity = opts.node_id or section.get(id_key) or ("central" if role == "central" else "")
    if not identity:
        raise InstallError("--node-id: missing (an edge node needs its fixed identity)")
    if not isinstance(identity, str):
        raise InstallError(f"{role}.{id_key}: expected a string")
    from edgesched.sync.security import check_identity

    try:
        check_identity(identity)
    except ValueError as exc:
        raise InstallError(f"--node-id: {exc}") from None
    plan.title += f" {identity}"
    if opts.node_id and section.get(id_key) not in (None, opts.node_id):
        plan.notes.append(f"--node-id {opts.node_id} replaces {id_key} {section[id_key]!r}")
    section[id_key] = identity
    if opts.site is not None:
        if role != "edge":
            raise InstallError("--site: only for --role edge")
        section["site"] = opts.site
    if opts.container_runtime is not None:
        if role != "edge":
            raise InstallError("--container-runtime: only for --role edge")
        section["container_runtime"] = opts.container_runtime
    state = str(lay.state_dir)
    if section.get("state_dir", state) != state:
        plan.notes.append(
            f"{role}.state_dir {section['state_dir']!r} replaced by {state} (the unit's "
            "StateDirectory; the sandbox lets the service write nowhere else)"
        )
    section["state_dir"] = state
    mqtt = section.setdefault("mqtt", {})
    if not isinstance(mqtt, dict):
        raise InstallError(f"{opts.base_config}: [{role}.mqtt] must be a table")
    _broker(opts.broker, mqtt, tls=bool(opts.ca or opts.ca_dir))
    if role == "edge" and "host" not in mqtt:
        raise InstallError(
            "--broker: missing: an edge node needs its broker (HOST or HOST:PORT; or "
            "[edge.mqtt] host in --config); `edgesched join FILE` fills it in from a join file"
        )
    credentials = _credentials(opts, identity, mqtt, service_owner)

    if not mqtt:
        del section["mqtt"]
    try:
        text = _config_text(base, version)
    except ValueError as exc:
        raise InstallError(f"config: {exc}") from None
    _check_config(text, role, lay)
    _check_visible(mqtt, section, lay, {f.path for f in credentials})

    # directories (created in order, missing ones only) and files
    cfg_owner = Owner("root", service_owner.group)
    plan.dirs += [
        MakeDir(lay.etc_dir, 0o755),
        *([MakeDir(lay.certs, 0o750, cfg_owner)] if credentials else []),
        MakeDir(lay.unit_dir, 0o755),
        MakeDir(lay.prefix, 0o755),
    ]
    plan.files.append(WriteFile(lay.config, text.encode(), 0o640, cfg_owner))
    plan.files += credentials
    plan.files.append(_unit_file(opts, user, version))
    plan.link = _release_link(opts)

    skip = _systemctl_skip(lay)
    unit = unit_name(role)
    if opts.start:
        plan.after = [
            Command(("systemctl", "daemon-reload"), "load the new unit", skip),
            Command(("systemctl", "enable", unit), "start at boot", skip),
            Command(("systemctl", "restart", unit), "run it with the new files", skip),
        ]
        plan.after_unchanged = [
            Command(("systemctl", "enable", "--now", unit), "make sure it runs", skip)
        ]
        plan.notes.append(f"see it with `systemctl status {unit}` and `journalctl -u {unit}`")
    else:
        plan.after = [Command(("systemctl", "daemon-reload"), "load the new unit", skip)]
        plan.notes.append(f"--no-start: start it with `systemctl enable --now {unit}`")
    return plan


def _service_user(opts: InstallOptions, plan: Plan) -> tuple[str | None, Owner]:
    """(User= of the unit or None for root, owner of the service's files)."""
    name = opts.user or SERVICE_USER
    if name == "root":
        return None, Owner()
    exists = _user_exists(name)
    if opts.user is not None and not exists and not opts.layout.staged:
        raise InstallError(
            f"--user: no user {name!r} here (omit --user to create the {SERVICE_USER} system user)"
        )
    if not exists:
        argv = (
            "useradd", "--system", "--user-group", "--no-create-home",
            "--home-dir", str(opts.layout.state_dir), "--shell", "/usr/sbin/nologin",
            "--comment", "edgesched service", name,
        )  # fmt: skip
        skip = ""
        if opts.layout.staged:
            skip = (
                f"staged under --root {opts.layout.root}: make the user on the gateway; "
                "files stay root-owned here"
            )
        plan.before.append(Command(argv, f"the service user {name}", skip))
    return name, Owner(name, _primary_group(name) or name)


def _primary_group(user: str) -> str | None:
    """The name of ``user``'s primary group here (``nogroup`` for Debian's ``nobody``)."""
    try:
        return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    except KeyError:
        return None


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _read_base(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InstallError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallError(f"--config {path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(f"--config {path}: not valid TOML: {exc}") from None
    return data


def _broker(broker: str | None, mqtt: dict[str, Any], *, tls: bool) -> None:
    if broker is None:
        return
    host, sep, port = broker.rpartition(":")
    if not sep or "]" in port:  # no port, or an IPv6 literal in brackets without one
        host, port = broker, ""
    host = host.strip("[]")
    if not host:
        raise InstallError(f"--broker: expected HOST or HOST:PORT, got {broker!r}")
    mqtt["host"] = host
    if port:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InstallError(f"--broker: port must be 1-65535, got {port!r}")
        mqtt["port"] = int(port)
    elif tls:
        mqtt["port"] = 8883  # MQTT over TLS


def _credentials(
    opts: InstallOptions, identity: str, mqtt: dict[str, Any], owner: Owner
) -> list[WriteFile]:
    """The node's identity files for ``<etc>/certs``, and the mqtt keys pointing at them."""
    lay = opts.layout
    if opts.ca_dir and (opts.ca or opts.cert or opts.key):
        raise InstallError("--ca-dir issues the certificate: do not also pass --ca/--cert/--key")
    if bool(opts.cert) != bool(opts.key):
        raise InstallError("--cert and --key go together")
    if opts.cert and not opts.ca:
        raise InstallError("--cert needs --ca (the fleet CA that signed it)")
    ca_path = lay.certs / "ca.crt"
    crt_path, key_path = lay.certs / f"{identity}.crt", lay.certs / f"{identity}.key"
    files: list[WriteFile] = []
    if opts.ca or opts.ca_dir:
        mqtt["tls"], mqtt["ca_file"] = True, str(ca_path)
    try:
        certs: NodeCerts | None = None
        if opts.ca_dir:
            certs = from_ca_dir(opts.ca_dir, identity, _installed(lay, crt_path, key_path))
            how = "kept: still valid" if certs.reused else f"issued by the CA in {opts.ca_dir}"
            ca_origin, crt_origin, key_origin = f"copied from {opts.ca_dir}/ca.crt", how, how
        elif opts.ca and opts.cert and opts.key:
            certs = from_files(opts.ca, opts.cert, opts.key, identity)
            ca_origin = f"copied from {opts.ca}"
            crt_origin, key_origin = f"copied from {opts.cert}", f"copied from {opts.key}"
        elif opts.ca:  # server authentication only (a password, or an anonymous broker)
            from edgesched.nodecerts import check_ca

            ca_pem = read_file(opts.ca, "--ca")
            check_ca(ca_pem, f"--ca {opts.ca}")
            files.append(WriteFile(ca_path, ca_pem, 0o644, origin=f"copied from {opts.ca}"))
        secret = read_file(opts.password_file, "--password-file") if opts.password_file else None
    except CertError as exc:
        raise InstallError(str(exc)) from None
    if certs is not None:
        files += [
            WriteFile(ca_path, certs.ca, 0o644, origin=ca_origin),
            WriteFile(crt_path, certs.cert, 0o644, origin=crt_origin),
            WriteFile(key_path, certs.key, 0o600, owner, secret=True, origin=key_origin),
        ]
        mqtt["cert_file"], mqtt["key_file"] = str(crt_path), str(key_path)
    if secret is not None:
        line = secret.strip()
        if not line or b"\n" in line or b"\0" in line:
            raise InstallError(
                f"--password-file {opts.password_file}: expected one line with the password"
            )
        pw = lay.certs / PASSWORD_FILE
        origin = f"copied from {opts.password_file}"
        files.append(WriteFile(pw, secret, 0o600, owner, secret=True, origin=origin))
        mqtt["password_file"] = str(pw)
    return files


def _installed(lay: Layout, crt: Path, key: Path) -> tuple[bytes, bytes] | None:
    try:
        return lay.host(crt).read_bytes(), lay.host(key).read_bytes()
    except OSError:
        return None


def _config_text(data: Mapping[str, Any], version: str) -> str:
    head = (
        f"# {MARK} (edgesched {version}); check it with `edgesched config check`.\n"
        "# A re-install keeps the file it replaces as <name>.bak-<time>.\n"
    )
    return head + toml_dumps(data)


def _check_config(text: str, role: Role, lay: Layout) -> None:
    """What ``edgesched config check`` and ``<role> run`` would refuse, refused now."""
    from edgesched.config import ConfigError, TelemetrySource, parse_config

    try:
        data = tomllib.loads(text)
        cfg = parse_config(data, str(lay.config))
    except tomllib.TOMLDecodeError as exc:  # pragma: no cover - toml_dumps writes valid TOML
        raise InstallError(f"config: cannot write it as TOML: {exc}") from None
    except ConfigError as exc:
        raise InstallError(f"config: {exc}") from None
    if role == "edge" and cfg.edge.hal_root != "/":
        raise InstallError(
            f"config: edge.hal_root is {cfg.edge.hal_root!r}: a simulated node, not this gateway"
        )
    if role == "edge" and cfg.edge.telemetry_source != TelemetrySource.HOST:
        raise InstallError(
            f"config: edge.telemetry_source is {cfg.edge.telemetry_source.value!r}: a simulated "
            "node's telemetry; a gateway reports what it measures, 'host'"
        )


def _check_visible(
    mqtt: Mapping[str, Any], section: Mapping[str, Any], lay: Layout, written: set[Path]
) -> None:
    """Files the config names must exist (or be written now) and be visible to the sandboxed
    service."""
    named = [(f"mqtt.{k}", mqtt.get(k)) for k in ("ca_file", "cert_file", "key_file")]
    named += [("mqtt.password_file", mqtt.get("password_file"))]
    named += [(k, section.get(k)) for k in ("forecast_model", "placement_model")]
    for key, value in named:
        if not isinstance(value, str) or not value:
            continue
        path = Path(value)
        if not path.is_absolute():
            raise InstallError(f"config: {lay.role}.{key} {value!r} must be an absolute path")
        if any(path.is_relative_to(h) for h in _HIDDEN):
            raise InstallError(
                f"config: {lay.role}.{key} {value} is hidden from the service (ProtectHome=yes):"
                " pass it with --ca/--cert/--key/--password-file, or move it"
            )
        if path not in written and not lay.host(path).is_file():
            raise InstallError(f"config: {lay.role}.{key} {value}: no such file")


def _unit_file(opts: InstallOptions, user: str | None, version: str) -> WriteFile:
    from edgesched.unit import UnitParams, render_unit

    lay = opts.layout
    for p in opts.read_write_paths:
        if not p.is_absolute():
            raise InstallError(f"--read-write-path: must be absolute, got {p}")
    try:
        params = UnitParams(
            role=lay.role,
            executable=PurePosixPath(executable(lay.prefix)),
            config=PurePosixPath(lay.config),
            state_directory=state_dir_name(lay.role),
            config_dir=PurePosixPath(lay.etc_dir),
            user=user,
            version=version,
            read_write_paths=tuple(PurePosixPath(p) for p in opts.read_write_paths),
            systemd_version=systemd_version(lay),
        )
    except ValueError as exc:
        raise InstallError(f"unit: {exc}") from None
    return WriteFile(lay.unit, render_unit(params).encode(), 0o644)


def _release_link(opts: InstallOptions) -> Link:
    """Where ``current`` points; see the module docstring."""
    lay = opts.layout
    releases = releases_dir(lay.prefix)
    here = Path(sys.prefix)
    if opts.release is not None:
        target, why = opts.release, "--release"
        if not opts.release.is_absolute():
            raise InstallError(f"--release: must be absolute, got {opts.release}")
    elif here.is_relative_to(lay.host(releases)):
        target = releases / here.relative_to(lay.host(releases))
        why = "the release this install runs from"
    else:
        existing = link_target(lay.host(lay.current))
        if existing is not None and _release_ok(lay, existing):
            target, why = existing, "kept: it points at an installed release"
        else:
            target, why = here, "the virtual environment this install runs from: its sys.prefix"
    if not _release_ok(lay, target):
        raise InstallError(
            f"release {target}: no bin/edgesched in it (a release is a virtual environment "
            "with edgesched installed)"
        )
    return Link(lay.current, target, why)


def _release_ok(lay: Layout, release: Path) -> bool:
    """``release/bin/edgesched`` exists on the gateway (under root) or, for this machine's own
    environment, here."""
    if not release.is_absolute():
        release = lay.prefix / release
    exe = Path("bin") / "edgesched"
    return (lay.host(release) / exe).is_file() or (
        release == Path(sys.prefix) and (release / exe).is_file()
    )


# --- uninstall ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UninstallOptions:
    layout: Layout
    purge: bool = False  # also the config, certificates and state
    keep_tasks: bool = False  # leave the node's task processes running
    grace_s: float = 10.0


def uninstall(opts: UninstallOptions, *, dry_run: bool = False, say: Say = print) -> Outcome:
    """Stop and disable the service, stop its tasks, remove the unit and ``current``; with
    ``purge`` also the config, certificates and state. Releases and the user are kept."""
    lay = opts.layout
    _need_root(lay, dry_run)
    try:
        return _uninstall(opts, dry_run, say)
    except (PlanError, OSError) as exc:
        raise StepFailed(f"uninstall stopped half-way: {exc}") from exc


def _uninstall(opts: UninstallOptions, dry_run: bool, say: Say) -> Outcome:
    lay = opts.layout
    out = Outcome()
    would = "would " if dry_run else ""
    unit = unit_name(lay.role)
    skip = _systemctl_skip(lay)
    if dry_run:
        say(f"edgesched uninstall --dry-run: {lay.role}; nothing is removed and nothing runs")
    if not skip and not lay.host(lay.unit).exists():
        skip = f"{lay.unit} is not there"
    stop = Command(("systemctl", "disable", "--now", unit), "stop it, and not at boot", skip)
    _maybe_run(stop, dry_run, say, out)

    run_dir = lay.host(lay.state_dir) / "run"
    if opts.keep_tasks:
        say(f"{would}leave the tasks started from {lay.state_dir}/run running (--keep-tasks)")
    elif dry_run:
        n = len(_task_groups(run_dir))
        say(f"would stop the node's task processes started from {run_dir} ({n} running now)")
    else:
        n = stop_tasks(run_dir, opts.grace_s)
        say(f"stopped {n} task process group(s) started from {run_dir}")

    remove: list[Path] = [lay.unit]
    other = Layout(_other(lay.role), lay.prefix, lay.etc_dir, lay.unit_dir, lay.root)
    if lay.host(other.unit).exists():  # both roles on one machine share the release
        say(f"kept {lay.current}: {other.unit} still runs it")
    else:
        remove.append(lay.current)
    if opts.purge:
        remove += _purge_paths(lay)
    for path in remove:
        host = lay.host(path)
        if not (host.exists() or host.is_symlink()):
            continue
        say(f"{would}remove {path}{'/' if host.is_dir() and not host.is_symlink() else ''}")
        if not dry_run:
            if host.is_dir() and not host.is_symlink():
                shutil.rmtree(host)
            else:
                host.unlink()
            out.removed.append(path)
    for d in _emptied_dirs(lay, opts.purge):
        host = lay.host(d)
        if host.is_dir() and not any(host.iterdir()):
            say(f"{would}remove the empty directory {d}")
            if not dry_run:
                host.rmdir()
                out.removed.append(d)
    reload = Command(("systemctl", "daemon-reload"), "forget the unit", skip)
    _maybe_run(reload, dry_run, say, out)
    if not opts.purge:
        say(f"kept {lay.config}, {lay.certs} and {lay.state_dir} (remove them with --purge)")
    releases = releases_dir(lay.prefix)
    if lay.host(releases).exists():
        say(f"kept {releases} (the installed releases; remove them with rm -r when done)")
    if _user_exists(SERVICE_USER):
        say(f"kept the user {SERVICE_USER} (userdel {SERVICE_USER} removes it)")
    if not dry_run and not out.removed:
        say(f"nothing to remove: edgesched {lay.role} is not installed here")
    return out


def _maybe_run(c: Command, dry_run: bool, say: Say, out: Outcome) -> None:
    if dry_run:
        say(command_line(c, "would run"))
    else:
        run(c, say, out)


def _purge_paths(lay: Layout) -> list[Path]:
    """The role's config, the certificate files only it uses (with their backups), its state."""
    mine = _config_files(lay, lay.role)
    theirs = _config_files(lay, _other(lay.role))
    paths = [lay.config, *(p for p in mine if p not in theirs)]
    backups: list[Path] = []
    for p in paths:
        host_dir = lay.host(p.parent)
        if host_dir.is_dir():
            backups += [p.parent / b.name for b in host_dir.glob(f"{p.name}.bak-*")]
    return [*paths, *sorted(backups), lay.state_dir]


def _other(role: Role) -> Role:
    return "central" if role == "edge" else "edge"


def _config_files(lay: Layout, role: Role) -> set[Path]:
    """Files under ``<etc>/certs`` that ``role``'s installed config names."""
    try:
        data = tomllib.loads(lay.host(lay.etc_dir / config_name(role)).read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return set()
    mqtt = data.get(role, {}).get("mqtt", {})
    found = set()
    for key in ("ca_file", "cert_file", "key_file", "password_file"):
        value = mqtt.get(key) if isinstance(mqtt, dict) else None
        if isinstance(value, str) and Path(value).parent == lay.certs:
            found.add(Path(value))
    return found


def _emptied_dirs(lay: Layout, purge: bool) -> list[Path]:
    dirs = [lay.certs, lay.etc_dir] if purge else []
    return [*dirs, lay.prefix]


def _task_groups(run_dir: Path) -> list[int]:
    """Process groups of the tasks a node started from ``run_dir`` (their wrapper carries its
    exit-record path, inside the run dir, in its argv: see edge/executor.py)."""
    import psutil

    mark, groups = str(run_dir) + "/", set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and any(mark in a for a in proc.info["cmdline"] or ()):
                groups.add(os.getpgid(proc.pid))
    return sorted(groups)


def stop_tasks(run_dir: Path, grace_s: float = 10.0) -> int:
    """SIGTERM every task group started from ``run_dir``, SIGKILL what is left after
    ``grace_s``; the number of groups found."""
    groups = _task_groups(run_dir)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(g) for g in groups):
        time.sleep(0.1)
    for pgid in groups:
        if _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
    return len(groups)


def _group_alive(pgid: int) -> bool:
    """Whether a member of ``pgid`` still runs (zombies awaiting their reaper do not count)."""
    import psutil

    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
    return False
