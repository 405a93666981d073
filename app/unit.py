"""The systemd unit of an edge node (or of central), rendered as text for ``edgesched install``.

Role: one pure function, :func:`render_unit`, from a few parameters to the unit file. Both
units are ``Type=notify`` with a watchdog (:mod:`edgesched.sdnotify`: ``READY=1`` once the
engine is up, ``WATCHDOG=1`` while its control loop turns). The comments inside the template
say why each directive is there, and why the two roles differ: central runs no tasks, so it
gets the full sandbox systemd offers (``systemd-analyze security``: 1.1, was 5.6); an edge
node's tasks are its own child processes and inherit the unit's sandbox, so options that would
break ordinary workloads (GPUs, JITs, CAN buses, 32-bit binaries, rootless containers) or the
executor (cgroups, CPU pinning, ``/proc``) are left out on purpose there (4.0, was 5.6).
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
    #: The gateway's systemd version, if known: 254 and later start an edge engine in its
    #: own leaf cgroup (DelegateSubgroup=engine), which lets its task cgroups carry limits.
    systemd_version: int | None = None

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


#: ``WatchdogSec=`` per role: the engine pings every half of it while its control loop turns
#: (every ``cycle_s``, 1 s by default). Central's loop may be held a few seconds by a large
#: fleet (a snapshot batch at 10,000 nodes); a restart of central costs more than a node's.
WATCHDOG_S = {"edge": 30, "central": 60}
#: The first systemd with ``DelegateSubgroup=``.
DELEGATE_SUBGROUP_SINCE = 254
#: ``TimeoutStartSec=`` per role: until ``READY=1``. Central restores every node's replica
#: from SQLite before it is ready (minutes at 10,000 nodes on a slow disk).
START_TIMEOUT_S = {"edge": 120, "central": 600}


def render_unit(p: UnitParams) -> str:
    """The unit file text (ends with a newline)."""
    what = "edge sub-engine" if p.role == "edge" else "central engine"
    state = f"/var/lib/{p.state_directory}"
    user_lines = (
        f"User={p.user}\nGroup={p.user}\n"
        if p.user
        else "# Runs as root (install --user root): still no capability at all, see below.\n"
    )
    body = _edge(p) if p.role == "edge" else _central(p)
    whose = "node's" if p.role == "edge" else "central's"
    kept = (
        "The SQLite store, task logs and exit records, the API token"
        if p.role == "edge"
        else "The SQLite store, the API tokens, the models"
    )
    after = (
        "# network.target, not network-online.target: a gateway must start (and restart its\n"
        "# tasks after a reboot) with no network at all. It reconnects to the broker by itself."
        if p.role == "edge"
        else "# network.target, not network-online.target: central reconnects to the broker by\n"
        "# itself, and its API and dashboard serve what it restored meanwhile."
    )
    unattended = (
        "# Never stop restarting: an unattended gateway has nobody to run `systemctl reset-failed`."
        if p.role == "edge"
        else "# Never stop restarting: without central the nodes go on alone, but its\n"
        "# placements and failovers wait."
    )
    return f"""\
# {p.role} unit written by `edgesched install` (edgesched {p.version}).
# Changes made here are overwritten by the next install: use a drop-in instead
# (`systemctl edit edgesched-{p.role}.service`), for example to add ReadWritePaths=.
# Exposure: `systemd-analyze security edgesched-{p.role}.service`; see docs/systemd.md.
[Unit]
Description=edgesched {what}
{after}
After=network.target
{unattended}
StartLimitIntervalSec=0

[Service]
# Type=notify: the engine sends READY=1 once it is up (edge: store open, tasks recovered,
# link and API started; central: store open, replicas restored, API listening), so
# `systemctl start` returns when it really runs, and `systemctl status` shows its STATUS=
# line (mode, broker, nodes or tasks). NotifyAccess=main: only the engine's own process is
# heard, never a task.
Type=notify
NotifyAccess=main
ExecStart={p.executable} {p.role} run --config {p.config}
{user_lines}WorkingDirectory={state}
# PYTHONFAULTHANDLER: when the watchdog fires (SIGABRT), Python writes every thread's
# stack to the journal first: the place the engine hung.
Environment=PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
# Logs go to the journal (stdout/stderr): `journalctl -u edgesched-{p.role}`.
Restart=always
RestartSec=2
# Exit status 3: another process runs under this {whose} identity and was there first
# (edgesched.sync.session, docs/troubleshooting.md). Starting again would only take the broker
# session from it once more: stay stopped, `systemctl status` shows why.
RestartPreventExitStatus=3
TimeoutStartSec={START_TIMEOUT_S[p.role]}
# The watchdog: the engine pings every {WATCHDOG_S[p.role] // 2} s while its control loop
# turns; a loop held for longer (a deadlock, a hung disk) gets the process killed (SIGABRT)
# and, with Restart=always, started again. The loop must turn well within half of it: keep
# cycle_s under {WATCHDOG_S[p.role] // 4} s, or raise this in a drop-in.
WatchdogSec={WATCHDOG_S[p.role]}

# --- state ---------------------------------------------------------------------------------
# {kept}: made by systemd, owned by the
# service user, kept across restarts and upgrades (uninstall --purge removes it). Here:
# {state}
StateDirectory={p.state_directory}
StateDirectoryMode=0750
{body}
[Install]
WantedBy=multi-user.target
"""


def _edge(p: UnitParams) -> str:
    rw = "".join(f"ReadWritePaths={path}\n" for path in p.read_write_paths)
    if p.systemd_version is not None and p.systemd_version >= DELEGATE_SUBGROUP_SINCE:
        subgroup = (
            "# systemd starts the engine in that leaf itself, so a restart never lands in a\n"
            "# cgroup with controllers enabled: task cgroups carry memory.max and cpu.max.\n"
            "DelegateSubgroup=engine\n"
        )
    else:
        subgroup = (
            "# Before systemd 254 (no DelegateSubgroup=) a restart puts the engine back in the\n"
            "# unit's cgroup itself, which the kernel refuses once controllers are enabled there\n"
            "# while tasks run below: task cgroups then only group the tasks, memory limits are\n"
            "# RLIMIT_AS (docs/systemd.md).\n"
        )
    return f"""\
# Tasks inherit it: files they make are not world-readable (0027), not more, since they may
# share output with the service's group.
UMask=0027

# --- tasks outlive the engine --------------------------------------------------------------
# The executor starts every task in its own session and the next engine *adopts* it by pid
# and start time (edge/executor.py). KillMode=process makes `systemctl stop/restart` (an
# upgrade, a watchdog restart) signal only the engine, never its tasks; the default
# (control-group) would kill every task with it. It is what containerd and dockerd use for
# the same reason. `edgesched uninstall` stops the tasks itself.
KillMode=process
TimeoutStopSec=30
# Delegate=yes hands the unit's cgroup subtree to the engine (owned by the service user):
# systemd will not reset or migrate sub-cgroups made in it, and the controllers are enabled
# for it (again as containerd). The engine lives in the leaf <unit cgroup>/engine and makes
# one cgroup per task under <unit cgroup>/tasks, as the service user, without root
# (edge/executor.py).
Delegate=yes
{subgroup}# Tasks are counted in this unit while they stay in its cgroup: do not cap them at the
# default 15% of pid_max, the node's own scheduler bounds them.
TasksMax=infinity
LimitNOFILE=65536

# --- hardening ------------------------------------------------------------------------------
# Everything below binds the tasks too: they are the engine's children.
# NoNewPrivileges also keeps setuid helpers from working in tasks: rootless podman's newuidmap
# among them (docker, through its socket, is unaffected). Relax it in a drop-in for podman.
NoNewPrivileges=yes
# The engine needs no capability: its tasks are its own children (same uid: signals,
# sched_setaffinity for CPU pinning), /proc and /sys are read without any, and its delegated
# cgroup is owned by the service user. A workload that needs one gets it through a drop-in.
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
# Mounts made on the host later (a USB disk, NFS) still propagate in; none made here leaks out.
PrivateMounts=yes
# Packet sockets need CAP_NET_RAW, which the unit does not have: refused outright. (A drop-in
# that grants it to a task must also reset this with an empty RestrictAddressFamilies=.)
RestrictAddressFamilies=~AF_PACKET
# Realtime scheduling (SCHED_FIFO/RR) needs CAP_SYS_NICE or a LimitRTPRIO=, neither granted
# here: refused outright. (A drop-in granting either for a control loop must also set
# RestrictRealtime=no.)
RestrictRealtime=yes
# personality(2) stays as the kernel set it at exec (32-bit binaries still run); only
# `setarch`-style emulation switches are refused.
LockPersonality=yes
# Other users' processes are hidden in /proc (the node's own tasks, same user, are not);
# without effect on kernels older than 5.8.
ProtectProc=invisible
# System calls that need a capability this unit does not have anyway (setting the clock,
# loading modules, raw I/O ports, reboot, swap) or that nothing current uses (obsolete ones,
# vm86/modify_ldt CPU emulation): refused with EPERM, as without the filter, never a kill.
# A task can no longer read the kernel's NTP state with adjtimex(2).
SystemCallFilter=~@clock @cpu-emulation @module @obsolete @raw-io @reboot @swap
SystemCallErrorNumber=EPERM
# Deliberately not set, because tasks inherit the sandbox or the executor needs the access:
#  PrivateTmp, RemoveIPC: see above (tasks outlive the engine);
#  PrivateDevices, ProtectClock, DevicePolicy: would hide GPUs and NPUs (/dev/nvidia*,
#    /dev/dri, /dev/accel) from AI tasks (ProtectClock adds a device allow-list);
#  ProtectControlGroups: remounts /sys/fs/cgroup read-only, so the executor could not make
#    task cgroups in its delegated subtree (systemd 252; 257's =private would allow it);
#  ProtectKernelTunables: /sys and /proc/sys read-only; installed as root (no capability
#    needed to write root's own files there), park_command switches the CPU governor and
#    tasks drive GPIO, LEDs or PWM through /sys;
#  MemoryDenyWriteExecute: breaks JITs (Java, Node.js, LuaJIT, PyPy) in tasks;
#  SystemCallFilter=@system-service, SystemCallArchitectures=native: tasks are arbitrary
#    programs (debuggers, container runtimes), and ARM gateways often run 32-bit (armhf)
#    binaries on arm64 kernels;
#  RestrictAddressFamilies (an allow-list): tasks may need CAN, Bluetooth or netlink;
#  RestrictNamespaces, PrivateUsers: rootless container runtimes need user namespaces;
#  ProcSubset=pid: the node's agent reads /proc/stat, /proc/meminfo and /proc/pressure.
"""


def _central(p: UnitParams) -> str:
    rw = "".join(f"ReadWritePaths={path}\n" for path in p.read_write_paths)
    return f"""\
# What central writes (tokens, the database) is for the service user alone.
UMask=0077

# --- processes -----------------------------------------------------------------------------
# Central runs no tasks: one process (its threads: the event loop, SQLite's, the resolver's,
# onnxruntime's). `systemctl stop` signals every process of the unit (control-group, the
# default), SIGKILL after TimeoutStopSec, and a bounded TasksMax catches a thread leak.
KillMode=control-group
TimeoutStopSec=30
TasksMax=256
LimitNOFILE=65536

# --- hardening ------------------------------------------------------------------------------
# The full sandbox: central needs its state directory, its config (read-only), TCP to the
# broker and from API clients, and nothing else.
NoNewPrivileges=yes
# No capability at all (the API port is not privileged: 7300 by default).
CapabilityBoundingSet=
AmbientCapabilities=
# Read-only file system but the state directory{" and the ReadWritePaths below" if rw else ""};
# a private /tmp; no home directories; the config ({p.config_dir}) is read-only to us;
# no mount made in here leaks out.
ProtectSystem=strict
{rw}PrivateTmp=yes
PrivateMounts=yes
ProtectHome=yes
# A user namespace mapping only root and the service user: the service cannot act as
# anybody else even if it found a way to change uid.
PrivateUsers=yes
# Only pseudo devices (/dev/null, /dev/urandom...), no device nodes may be made.
PrivateDevices=yes
DevicePolicy=closed
# /proc/sys, /sys and /sys/fs/cgroup read-only; no kernel modules, kernel log, clock or
# hostname changes; other users' processes hidden in /proc.
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
# IPv4 and IPv6 (the broker, etcd, the API), AF_UNIX (the journal, sd_notify) and netlink
# (glibc's getaddrinfo asks it which address families the host has).
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
# No namespaces, no realtime scheduling, no setuid/setgid files, no personality changes.
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
# No writable-and-executable memory: Python, numpy and onnxruntime's CPU kernels are
# ahead-of-time code (checked: tests/test_unit_security.py runs central's models under the
# kernel's equivalent, prctl PR_SET_MDWE).
MemoryDenyWriteExecute=yes
# System V IPC objects and POSIX message queues of the service user go with the service.
RemoveIPC=yes
# The system calls of an ordinary service, none of the privileged ones (setuid, chown...)
# and none that alter resource settings (setrlimit, sched_setaffinity...: onnxruntime
# sessions run one intra-op thread and never pin it, policies/ortsession.py); 64-bit
# (native) calls only.
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
SystemCallErrorNumber=EPERM
SystemCallArchitectures=native
# Deliberately not set:
#  ProcSubset=pid: onnxruntime's CPU detection reads /proc/cpuinfo (on ARM especially);
#  PrivateNetwork, IPAddressDeny: central talks to a broker and to API clients anywhere
#    (narrow it in a drop-in: IPAddressAllow= with the broker's and the operators' nets).
"""
