"""The rendered units under a real systemd (252 here), booted in namespaces for the test.

This machine's PID 1 is not systemd (a microVM init), so there is no system manager to hand
a unit to and no ``systemd-nspawn``. But ``/usr/lib/systemd/systemd`` is installed, and as
root it runs as PID 1 of new PID, mount, UTS, IPC and cgroup namespaces (``unshare``), with a
private ``/run``, ``/tmp``, ``/var/lib`` and ``/etc/systemd/system``, ``/sys`` read-only and
a cgroup v2 hierarchy of its own (a child cgroup of this host's, so the host is untouched).
It starts only the test's units (``--unit=`` a target of ours, no sysinit). The units are
the ones ``edgesched install`` writes, rendered by app/unit.py, with a drop-in for what this
machine lacks or the test needs: no default dependencies (the host's early-boot units are
not ours to run), ``ProtectHome=tmpfs`` with this machine's Python (under /root) bound in,
output to a file (no journald), and a 3 s watchdog.

What is checked, for real: ``systemctl start`` returns once the engine sent READY=1; its
STATUS line and watchdog show in ``systemctl show``; central runs under its sandbox
(seccomp, no capabilities, no new privileges, a user namespace); the edge engine lives in
``<unit>/engine`` and its task in ``<unit>/tasks/task-<id>``; a hung engine (SIGSTOP) is
killed by the watchdog and restarted, and its task survives and is adopted; ``systemctl
restart`` (an upgrade) keeps the task too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from conftest import free_port

from edgesched.edge.executor import cgroup2_mount
from edgesched.unit import UnitParams, render_unit

SYSTEMD = Path("/usr/lib/systemd/systemd")
SERVICE_UID = 61234  # the test's `edgesched` user, in the namespace's /etc/passwd only
SLOW = os.environ.get("EDGESCHED_SLOW") == "1"


def _why_not() -> str:
    if os.geteuid() != 0:
        return "needs root (namespaces, cgroups)"
    if not SYSTEMD.exists():
        return f"no {SYSTEMD}"
    for tool in ("unshare", "nsenter", "systemctl"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    if cgroup2_mount(Path("/proc/self/mounts").read_text()) is None:
        return "no cgroup v2 mounted"
    here = (os.path.realpath(sys.prefix), str(Path(__file__).resolve().parents[1]))
    if any(p == "/tmp" or p.startswith(("/tmp/", "/var/tmp/")) for p in here):
        # The units' PrivateTmp= gives the engine an empty /tmp, so a checkout or venv there
        # (a CI clone) is not there for it; binding it back in failed too (not understood yet).
        return f"this checkout or its venv is under /tmp ({', '.join(here)}): PrivateTmp hides it"
    return ""


pytestmark = pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "-")

BOOT = """\
set -e
mount --make-rprivate /
mount -t tmpfs -o mode=755 tmpfs /run
mount --bind {base}/units /etc/systemd/system
mount --bind {base}/passwd /etc/passwd
mount --bind {base}/group /etc/group
mount --bind {base}/varlib /var/lib
mount -t tmpfs -o mode=755 tmpfs /opt
mkdir -p /opt/edgesched-test/etc
mount --bind {base}/etc /opt/edgesched-test/etc
mount -t tmpfs -o mode=1777 tmpfs /tmp
umount -R /sys/fs/cgroup
mount -o remount,bind,ro /sys
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
export container=edgesched-test
exec {systemd} --unit=edgesched-test.target --log-target=console --log-level=notice
"""

DROP_IN = """\
[Unit]
DefaultDependencies=no
[Service]
ProtectHome=tmpfs
BindReadOnlyPaths={pyenv}
StandardOutput=append:/run/{role}.log
StandardError=inherit
WatchdogSec=3
TimeoutAbortSec=3
"""


@dataclass
class Booted:
    """A systemd booted in namespaces: ``systemctl`` in its mount and PID namespaces."""

    pid: int  # systemd's pid, as this host sees it
    base: Path
    cgroup: Path  # its cgroup (the namespace's root), as this host sees it

    def ns(self, *argv: str, check: bool = True, timeout: float = 60) -> str:
        done = subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "-C", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        return done.stdout

    def systemctl(self, *args: str, check: bool = True) -> str:
        return self.ns("systemctl", "--no-pager", *args, check=check)

    def show(self, unit: str) -> dict[str, str]:
        props = "ActiveState,SubState,StatusText,WatchdogUSec,MainPID,NRestarts,Result"
        out = self.systemctl("show", "-p", props, unit)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def log(self, role: str) -> str:
        return self.ns("cat", f"/run/{role}.log", check=False)

    def wait(self, unit: str, pred: Any, timeout: float, what: str) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        seen = self.show(unit)
        while not pred(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
            seen = self.show(unit)
        assert pred(seen), f"{what}: {seen}\n{self.log(unit.split('-')[1].split('.')[0])}"
        return seen


def _units(base: Path) -> None:
    units = base / "units"
    units.mkdir()
    pyenv = Path(os.path.realpath(sys.executable)).parents[2]  # ~/.pyenv/versions/X
    for role in ("edge", "central"):
        params = UnitParams(
            role=role,
            executable=PurePosixPath(sys.prefix) / "bin" / "edgesched",
            config=PurePosixPath(f"/opt/edgesched-test/etc/{role}.toml"),
            state_directory="edgesched" if role == "edge" else "edgesched-central",
            config_dir=PurePosixPath("/opt/edgesched-test/etc"),
            user="edgesched",
            version="test",
        )
        (units / f"edgesched-{role}.service").write_text(render_unit(params))
        drop = units / f"edgesched-{role}.service.d"
        drop.mkdir()
        (drop / "test.conf").write_text(DROP_IN.format(pyenv=pyenv, role=role))
    (units / "edgesched-test.target").write_text(
        "[Unit]\nDescription=edgesched systemd test\nDefaultDependencies=no\n"
    )
    port = free_port()  # no broker listens: both engines run alone
    (base / "etc").mkdir()
    (base / "etc" / "edge.toml").write_text(
        "[edge]\nnode_id = 'gw-sd'\nstate_dir = '/var/lib/edgesched'\napi_port = 0\n"
        f"cycle_s = 0.2\nsample_s = 1.0\n[edge.mqtt]\nport = {port}\n"
    )
    from edgesched.policies.models import shipped

    (base / "etc" / "central.toml").write_text(
        "[central]\nstate_dir = '/var/lib/edgesched-central'\napi_port = 0\ncycle_s = 0.2\n"
        f"forecast_model = '{shipped('forecast')}'\nplacement_model = '{shipped('placement')}'\n"
        f"[central.mqtt]\nport = {port}\n"
    )
    passwd = Path("/etc/passwd").read_text()
    passwd += f"edgesched:x:{SERVICE_UID}:{SERVICE_UID}::/var/lib/edgesched:/usr/sbin/nologin\n"
    (base / "passwd").write_text(passwd)
    (base / "group").write_text(Path("/etc/group").read_text() + f"edgesched:x:{SERVICE_UID}:\n")
    (base / "varlib").mkdir()


def _remove_cgroup(path: Path) -> None:
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if "populated 0" in (path / "cgroup.events").read_text():
                break
        time.sleep(0.05)
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


@pytest.fixture(scope="module")
def booted() -> Iterator[Booted]:
    mount = cgroup2_mount(Path("/proc/self/mounts").read_text())
    assert mount is not None
    base = Path(tempfile.mkdtemp(prefix="edgesched-systemd-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    cgroup = mount / f"edgesched-systemd-test-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    _units(base)
    (base / "boot.sh").write_text(BOOT.format(base=base, systemd=SYSTEMD))
    launcher = (
        f"echo $$ > {cgroup}/cgroup.procs && exec unshare --fork --pid --mount --uts --ipc "
        f"--cgroup --mount-proc sh {base}/boot.sh"
    )
    console = (base / "console.log").open("wb")
    outer = subprocess.Popen(["sh", "-c", launcher], stdout=console, stderr=console)
    booted: Booted | None = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and booted is None:
            assert outer.poll() is None, (base / "console.log").read_text()
            with contextlib.suppress(OSError, ValueError, IndexError):
                children = Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text()
                pid = int(children.split()[0])
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    booted = Booted(pid, base, cgroup)
            time.sleep(0.1)
        assert booted is not None, (base / "console.log").read_text()
        while time.monotonic() < deadline:
            state = booted.ns("systemctl", "is-system-running", check=False).strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.2)
        yield booted
    finally:
        if booted is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(booted.pid, 9)  # the namespace's init: everything in it goes
        outer.kill()
        outer.wait()
        console.close()
        _remove_cgroup(cgroup)
        shutil.rmtree(base, ignore_errors=True)


def _proc_status(b: Booted, pid: str) -> dict[str, str]:
    out = b.ns("cat", f"/proc/{pid}/status")
    return {k: v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def test_central_is_ready_notified_watched_and_sandboxed(booted: Booted) -> None:
    t0 = time.monotonic()
    booted.systemctl("start", "edgesched-central.service")  # returns on READY=1
    started_s = time.monotonic() - t0
    seen = booted.show("edgesched-central.service")
    assert (seen["ActiveState"], seen["SubState"]) == ("active", "running"), seen
    assert seen["StatusText"].startswith("central central: broker not connected"), seen
    assert "API on port" in seen["StatusText"] and seen["WatchdogUSec"] == "3s", seen
    # its API answers at once: READY=1 came after the listener
    port = (booted.base / "varlib" / "edgesched-central" / "api-port").read_text().strip()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=5) as r:
        assert r.status == 200
    status = _proc_status(booted, seen["MainPID"])
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
    assert int(status["CapBnd"], 16) == 0 and int(status["CapEff"], 16) == 0, status
    uid_map = booted.ns("cat", f"/proc/{seen['MainPID']}/uid_map").split()
    assert str(SERVICE_UID) in uid_map and len(uid_map) <= 6  # PrivateUsers: two users only
    # the watchdog is fed: still running well past WatchdogSec
    time.sleep(max(0.0, 4.0 - (time.monotonic() - t0 - started_s)))
    again = booted.show("edgesched-central.service")
    assert again["NRestarts"] == "0" and again["ActiveState"] == "active", again
    booted.systemctl("stop", "edgesched-central.service")
    assert booted.show("edgesched-central.service")["ActiveState"] == "inactive"
    log = booted.log("central")
    assert "Traceback" not in log, log
    # onnxruntime ran both models under MemoryDenyWriteExecute and @system-service
    assert "forecast model in use" in log and "placement model in use" in log, log


def _edge_api(b: Booted, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    state = b.base / "varlib" / "edgesched"
    port = (state / "api-port").read_text().strip()
    token = (state / "api-token").read_text().strip()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _running_pid(b: Booted, task_id: str, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            code, rec = _edge_api(b, "GET", f"/v1/tasks/{task_id}")
            if code == 200 and rec["state"] == "running" and rec.get("pid"):
                return int(rec["pid"])
        time.sleep(0.2)
    raise AssertionError(f"{task_id} not running: {_edge_api(b, 'GET', '/v1/tasks')}")


def _cgroup_of(b: Booted, pid: int | str) -> str:
    """The cgroup v2 line of ``/proc/<pid>/cgroup`` (a hybrid host lists v1 ones too)."""
    lines = b.ns("cat", f"/proc/{pid}/cgroup").splitlines()
    return next(line for line in lines if line.startswith("0::"))


def test_edge_delegation_watchdog_restart_and_task_survival(booted: Booted) -> None:
    unit = "edgesched-edge.service"
    booted.systemctl("start", unit)
    seen = booted.show(unit)
    assert seen["ActiveState"] == "active", seen
    assert seen["StatusText"].startswith("edge node gw-sd autonomous: broker not connected")
    code, _ = _edge_api(
        booted, "POST", "/v1/tasks", {"id": "keeper", "command": ["sleep", "600"], "cpu": 0.1}
    )
    assert code == 201
    task = _running_pid(booted, "keeper")
    cg = "/system.slice/edgesched-edge.service"
    assert _cgroup_of(booted, task) == f"0::{cg}/tasks/task-keeper"
    engine_cg = _cgroup_of(booted, seen["MainPID"])
    assert engine_cg == f"0::{cg}/engine", booted.log("edge")  # moved itself to its leaf
    task_uid = _proc_status(booted, str(task))["Uid"].split()[0]
    assert task_uid == str(SERVICE_UID)  # the task runs as the service user, in the sandbox
    environ = booted.ns("cat", f"/proc/{task}/environ").split("\0")
    assert not [v for v in environ if v.startswith(("NOTIFY_SOCKET=", "WATCHDOG_"))], environ

    # a hung engine: the watchdog (3 s here) kills it, Restart=always brings it back
    booted.ns("kill", "-STOP", seen["MainPID"])
    booted.wait(unit, lambda s: s["Result"] == "watchdog", 15, "the watchdog fired")
    back = booted.wait(
        unit,
        lambda s: (
            s["NRestarts"] == "1" and s["ActiveState"] == "active" and s["SubState"] == "running"
        ),
        30,
        "restarted after the watchdog",
    )
    assert back["MainPID"] != seen["MainPID"]
    assert _running_pid(booted, "keeper") == task  # the same process, adopted
    assert _cgroup_of(booted, back["MainPID"]) == f"0::{cg}/engine"

    # an upgrade's restart: the task stays, the new engine adopts it again
    booted.systemctl("restart", unit)
    after = booted.show(unit)
    assert after["ActiveState"] == "active" and after["MainPID"] != back["MainPID"]
    assert _running_pid(booted, "keeper") == task
    booted.systemctl("stop", unit)
    assert booted.show(unit)["ActiveState"] == "inactive"
    assert _cgroup_of(booted, task) == f"0::{cg}/tasks/task-keeper"  # KillMode=process
