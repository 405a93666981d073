"""The systemd unit of an edge node (or of central), rendered as text for ``edgesched install``.

Role: one pure function, :func:`render_unit`, from a few parameters to the unit file. The
comments inside the template say why each directive is there, and why some hardening that
systemd offers is *not* used: the engine's tasks are its own child processes, so they inherit
the unit's sandbox, and options that would break ordinary workloads (GPUs, JITs, CAN buses,
32-bit binaries) or the executor (cgroups, CPU pinning, ``/proc``) are left out on purpose.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

# A path in a unit must not carry what systemd would split, expand or quote: whitespace,
# quotes, backslashes, '%' (specifiers), '$' (variables), ';'.
_UNSAFE = set(" \t\n\r\"'\\%$;")
_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")


@dataclass(frozen=True, slots=True)
class UnitParams:
    """What varies between installs; everything else in the unit is fixed policy."""

    role: str  # "edge" or "central"
    executable: PurePosixPath  # <prefix>/current/bin/edgesched
    config: PurePosixPath  # <etc>/edge.toml
    state_directory: str  # StateDirectory= name, under /var/lib
    config_dir: PurePosixPath  # <etc>: read-only for the service
    user: str | None  # None: run as root (still without capabilities)
    version: str
    read_write_paths: Sequence[PurePosixPath] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.role not in ("edge", "central"):
            raise ValueError(f"role must be edge or central, got {self.role!r}")
        for p in (self.executable, self.config, self.config_dir, *self.read_write_paths):
            text = str(p)
            if not p.is_absolute() or _UNSAFE & set(text):
                raise ValueError(
                    f"unit paths must be absolute, without spaces, quotes, '%', '$' or ';': "
                    f"{text!r}"
                )
        if not _NAME.fullmatch(self.state_directory):
            raise ValueError(f"bad StateDirectory name {self.state_directory!r}")
        if self.user is not None and not _NAME.fullmatch(self.user):
            raise ValueError(f"bad user name {self.user!r}")


def render_unit(p: UnitParams) -> str:
    """The unit file text (ends with a newline)."""
    what = "edge sub-engine" if p.role == "edge" else "central engine"
    state = f"/var/lib/{p.state_directory}"
    user_lines = (
        f"User={p.user}\nGroup={p.user}\n"
        if p.user
        else "# Runs as root (install --user root): still no capability at all, see below.\n"
    )
    rw = "".join(f"ReadWritePaths={path}\n" for path in p.read_write_paths)
    return f"""\
# {p.role} unit written by `edgesched install` (edgesched {p.version}).
# Changes made here are overwritten by the next install: use a drop-in instead
# (`systemctl edit edgesched-{p.role}.service`), for example to add ReadWritePaths=.
[Unit]
Description=edgesched {what}
# network.target, not network-online.target: a gateway must start (and restart its tasks
# after a reboot) with no network at all. The engine reconnects to the broker by itself.
After=network.target
# Never stop restarting: an unattended gateway has nobody to run `systemctl reset-failed`.
StartLimitIntervalSec=0

[Service]
Type=exec
ExecStart={p.executable} {p.role} run --config {p.config}
{user_lines}WorkingDirectory={state}
Environment=PYTHONUNBUFFERED=1
# Logs go to the journal (stdout/stderr): `journalctl -u edgesched-{p.role}`.
Restart=always
RestartSec=2

# --- tasks outlive the engine --------------------------------------------------------------
# The executor starts every task in its own session and the next engine *adopts* it by pid
# and start time (edge/executor.py). KillMode=process makes `systemctl stop/restart` (an
# upgrade) signal only the engine, never its tasks; the default (control-group) would kill
# every task with it. It is what containerd and dockerd use for the same reason. `edgesched
# uninstall` stops the tasks itself.
KillMode=process
TimeoutStopSec=30
# Delegate=yes hands the unit's cgroup subtree to the engine: systemd will not reset or
# migrate sub-cgroups made in it, and every controller is enabled for it (again as
# containerd). The executor's per-task cgroups (memory.max, cpu.max) are made under
# /sys/fs/cgroup/edgesched, which needs root; as a non-root user limits fall back to rlimits.
Delegate=yes
# Tasks are counted in this unit while they stay in its cgroup: do not cap them at the
# default 15% of pid_max, the node's own scheduler bounds them.
TasksMax=infinity
LimitNOFILE=65536

# --- state ---------------------------------------------------------------------------------
# The SQLite store, task logs and exit records, the API token: made by systemd, owned by the
# service user, kept across restarts and upgrades (uninstall --purge removes it). Here:
# {state}
StateDirectory={p.state_directory}
StateDirectoryMode=0750
UMask=0027

# --- hardening ------------------------------------------------------------------------------
# NoNewPrivileges also keeps setuid helpers from working in tasks: rootless podman's newuidmap
# among them (docker, through its socket, is unaffected). Relax it in a drop-in for podman.
NoNewPrivileges=yes
# The engine needs no capability: its tasks are its own children (same uid: signals,
# sched_setaffinity for CPU pinning), /proc and /sys are read without any, and cgroup files
# are written by their owner. A workload that needs one gets it through a drop-in.
CapabilityBoundingSet=
AmbientCapabilities=
# The whole file system is read-only except the state directory (and ReadWritePaths below);
# /dev, /proc and /sys stay as they are. The config ({p.config_dir}) is read-only to us.
ProtectSystem=strict
# PrivateTmp=no, the host's /tmp writable instead: systemd deletes a private /tmp when the
# service stops, under the feet of the tasks that outlive it (and RemoveIPC= would remove
# their shared memory at every restart).
ReadWritePaths=/tmp /var/tmp
{rw}ProtectHome=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
# Deliberately not set, because tasks inherit the sandbox or the executor needs the access:
#  PrivateDevices, ProtectClock, DevicePolicy: would hide GPUs and NPUs (/dev/nvidia*,
#    /dev/dri, /dev/accel) from AI tasks (ProtectClock adds a device allow-list);
#  ProtectKernelTunables, ProtectControlGroups: remount /sys or /sys/fs/cgroup read-only,
#    so the executor could not create task cgroups;
#  MemoryDenyWriteExecute: breaks JITs (Java, Node.js, LuaJIT, PyPy) in tasks;
#  SystemCallFilter, SystemCallArchitectures=native: tasks are arbitrary programs, and ARM
#    gateways often run 32-bit (armhf) binaries on arm64 kernels;
#  RestrictAddressFamilies: tasks may need CAN, Bluetooth or packet sockets;
#  RestrictRealtime: control loops may need SCHED_FIFO;
#  RestrictNamespaces, PrivateUsers: rootless container runtimes need user namespaces;
#  ProtectProc=invisible: harmless for our own tasks, but unavailable on older vendor kernels.

[Install]
WantedBy=multi-user.target
"""
