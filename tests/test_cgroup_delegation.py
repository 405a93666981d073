"""Task cgroups inside the subtree systemd delegates (edge/executor.py, ``cgroup_parent="auto"``).

The layout is computed from ``/proc/self/cgroup`` and systemd's delegation mark (pure tests
below). Then, as root on a writable cgroup v2 (this machine: the hybrid hierarchy at
``/sys/fs/cgroup/unified``, where no memory or cpu controller is available), a real engine
process is started inside a temporary cgroup marked ``user.delegate=1`` as systemd 251+ marks
a ``Delegate=yes`` unit's: it must move itself into ``<unit>/engine``, put its task in
``<unit>/tasks/task-<id>``, and leave the unit's ``cgroup.subtree_control`` empty, which is
what lets systemd put a restarted engine back into the unit's cgroup while tasks run below
it; the kernel's refusal once a controller is enabled there is shown too.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from edgesched.edge.executor import (
    LEGACY_CGROUP_PARENT,
    cgroup2_mount,
    plan_layout,
    unified_path,
)

MOUNT = Path("/sys/fs/cgroup")
UNIT = "/system.slice/edgesched-edge.service"


def marked(*dirs: str) -> set[Path]:
    return {MOUNT / d.lstrip("/") for d in dirs}


def test_unified_path_reads_the_v2_line_of_pure_and_hybrid_hosts() -> None:
    assert unified_path(f"0::{UNIT}\n") == PurePosixPath(UNIT)
    hybrid = f"9:name=systemd:{UNIT}\n4:memory:/x\n1:cpu:/\n0::{UNIT}\n"
    assert unified_path(hybrid) == PurePosixPath(UNIT)
    assert unified_path("9:name=systemd:/a\n4:memory:/b\n") is None  # cgroup v1 only
    assert unified_path("") is None


def test_cgroup2_mount_finds_the_unified_hierarchy() -> None:
    pure = "sysfs /sys sysfs rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
    assert cgroup2_mount(pure) == Path("/sys/fs/cgroup")
    hybrid = (
        "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    )
    assert cgroup2_mount(hybrid) == Path("/sys/fs/cgroup/unified")
    assert cgroup2_mount("tmpfs /sys/fs/cgroup tmpfs rw 0 0\n") is None


def test_a_delegated_unit_gets_an_engine_leaf_and_tasks_without_controllers() -> None:
    layout = plan_layout(f"0::{UNIT}\n", MOUNT, marked(UNIT).__contains__)
    unit = MOUNT / UNIT.lstrip("/")
    assert (layout.mode, layout.unit) == ("delegated", unit)
    assert layout.engine == unit / "engine" and layout.tasks == unit / "tasks"
    assert not layout.controllers  # a restart must still fit in the unit's own cgroup


def test_delegate_subgroup_puts_the_engine_in_its_leaf_and_allows_controllers() -> None:
    layout = plan_layout(f"0::{UNIT}/engine\n", MOUNT, marked(UNIT).__contains__)
    unit = MOUNT / UNIT.lstrip("/")
    assert (layout.mode, layout.unit, layout.engine) == ("subgroup", unit, unit / "engine")
    assert layout.tasks == unit / "tasks" and layout.controllers


@pytest.mark.parametrize(
    ("proc", "mount", "delegated"),
    [
        ("0::/\n", MOUNT, set()),  # a shell or a container: the root of its namespace
        (f"0::{UNIT}\n", MOUNT, set()),  # a unit without Delegate=yes
        (f"0::{UNIT}/engine\n", MOUNT, set()),
        ("4:memory:/x\n", MOUNT, marked(UNIT)),  # cgroup v1 only
        (f"0::{UNIT}\n", None, marked(UNIT)),  # no cgroup2 mounted
    ],
)
def test_not_delegated_keeps_the_legacy_parent(
    proc: str, mount: Path | None, delegated: set[Path]
) -> None:
    layout = plan_layout(proc, mount, delegated.__contains__)
    assert (layout.mode, layout.unit, layout.tasks) == ("legacy", None, LEGACY_CGROUP_PARENT)


# --- a real cgroup v2 --------------------------------------------------------------------------


def _writable_cgroup2() -> Path | None:
    if os.geteuid() != 0:
        return None
    mount = cgroup2_mount(Path("/proc/self/mounts").read_text())
    if mount is None:
        return None
    probe = mount / f"edgesched-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        os.setxattr(probe, "user.delegate", b"1")
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return mount


CGROUP2 = _writable_cgroup2()
needs_cgroup2 = pytest.mark.skipif(
    CGROUP2 is None, reason="needs root and a writable cgroup v2 with user xattrs"
)

#: An engine started by "systemd" in ``argv[1]`` (it joins that cgroup before importing the
#: executor, as systemd places the main process before exec), running one task.
ENGINE = r"""
import asyncio, json, os, sys
from pathlib import Path
start, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
(start / "cgroup.procs").write_text(str(os.getpid()))
from edgesched.core.task import Limits, TaskSpec
from edgesched.edge.executor import Executor

async def main() -> None:
    ex = Executor(run_dir, cgroup_parent="auto", poll_s=0.05)
    spec = TaskSpec(id="t1", command=("sleep", "30"), cpu=0.5,
                    limits=Limits(memory_mb=256))
    handle = await ex.start(spec)
    layout = ex.cgroup_layout
    print(json.dumps({
        "mode": layout.mode, "controllers": layout.controllers,
        "engine_cgroup": Path("/proc/self/cgroup").read_text(),
        "task_cgroup": Path(f"/proc/{handle.pid}/cgroup").read_text(),
        "limits_via": handle.limits_via,
        "as_limit": Path(f"/proc/{handle.pid}/limits").read_text(),
    }), flush=True)
    sys.stdin.readline()  # the test looks at the tree, then lets us stop the task
    await ex.stop("t1", grace_s=2)
    await ex.aclose()

asyncio.run(main())
"""


def _rmtree_cgroup(path: Path) -> None:
    """Remove a cgroup tree: kill what is left in it, wait until it is empty, then rmdir
    bottom-up."""
    if not path.is_dir():
        return
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if "populated 0" in (path / "cgroup.events").read_text():
                break
        time.sleep(0.02)
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    path.rmdir()


@pytest.fixture
def unit_cgroup() -> Iterator[Path]:
    assert CGROUP2 is not None
    unit = CGROUP2 / f"edgesched-test-{uuid.uuid4().hex[:8]}.service"
    unit.mkdir()
    os.setxattr(unit, "user.delegate", b"1")  # what systemd 251+ sets with Delegate=yes
    try:
        yield unit
    finally:
        _rmtree_cgroup(unit)


def _start_engine(start: Path, run_dir: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(start), str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise AssertionError(proc.stderr.read() if proc.stderr else "engine died")
    return proc, json.loads(line)


def _finish(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(BrokenPipeError):
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
    assert proc.wait(15) == 0, proc.stderr.read() if proc.stderr else ""


@needs_cgroup2
def test_real_delegated_cgroup_engine_leaf_task_cgroups_and_a_restart_fits(
    unit_cgroup: Path, tmp_path: Path
) -> None:
    assert CGROUP2 is not None
    rel = "/" + str(unit_cgroup.relative_to(CGROUP2))
    proc, seen = _start_engine(unit_cgroup, tmp_path / "run")
    try:
        assert seen["mode"] == "delegated" and not seen["controllers"]
        assert f"0::{rel}/engine\n" in seen["engine_cgroup"]  # moved itself into its leaf
        assert f"0::{rel}/tasks/task-t1\n" in seen["task_cgroup"]
        assert seen["limits_via"] == "rlimit"  # no controllers: memory via RLIMIT_AS
        as_line = next(x for x in seen["as_limit"].splitlines() if "address space" in x)
        assert str(256 << 20) in as_line
        assert (unit_cgroup / "cgroup.procs").read_text() == ""  # the unit's cgroup is empty
        assert (unit_cgroup / "cgroup.subtree_control").read_text().strip() == ""
        # the engine dies (watchdog, upgrade: KillMode=process), its task lives on below the
        # unit's cgroup; systemd puts the next engine in the unit's cgroup: that still works
        proc.kill()
        proc.wait(10)
        task_pids = (unit_cgroup / "tasks" / "task-t1" / "cgroup.procs").read_text().split()
        assert task_pids, "the task outlives its engine"
        again, seen2 = _start_engine(unit_cgroup, tmp_path / "run2")
        assert f"0::{rel}/engine\n" in seen2["engine_cgroup"]
        _finish(again)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def a_controller() -> Iterator[str]:
    """A controller enabled for the children of the cgroup v2 root (enabled for the test if it
    was not: on this hybrid host only hugetlb is on v2, and nothing else uses v2 here)."""
    assert CGROUP2 is not None
    root = CGROUP2
    enabled = (root / "cgroup.subtree_control").read_text().split()
    if enabled:
        yield enabled[0]
        return
    available = (root / "cgroup.controllers").read_text().split()
    if not available:
        pytest.skip("no cgroup v2 controller on this host")
    name = available[0]
    (root / "cgroup.subtree_control").write_text(f"+{name}")
    try:
        yield name
    finally:
        with contextlib.suppress(OSError):
            (root / "cgroup.subtree_control").write_text(f"-{name}")


@needs_cgroup2
def test_why_no_controllers_without_delegate_subgroup(a_controller: str, unit_cgroup: Path) -> None:
    """Once a controller is enabled in the unit's cgroup, the kernel refuses to put a process
    there (cgroup v2's no-internal-process rule): a systemd older than 254 restarting the
    unit would fail with 219/CGROUP."""
    controllers = (unit_cgroup / "cgroup.controllers").read_text().split()
    assert a_controller in controllers
    (unit_cgroup / "tasks").mkdir()
    (unit_cgroup / "cgroup.subtree_control").write_text(f"+{controllers[0]}")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(OSError) as refused:
            (unit_cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        assert refused.value.errno == errno.EBUSY
        (unit_cgroup / "tasks" / "cgroup.procs").write_text(str(sleeper.pid))  # a leaf: fine
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_cgroup2
def test_real_delegate_subgroup_without_memory_and_cpu_falls_back_to_rlimits(
    unit_cgroup: Path, tmp_path: Path
) -> None:
    """DelegateSubgroup=engine: systemd starts the engine in the leaf. Without the memory and
    cpu controllers (this hybrid host has them on cgroup v1) the engine says so and uses
    rlimits; the task runs."""
    controllers = set((unit_cgroup / "cgroup.controllers").read_text().split())
    if {"memory", "cpu"} <= controllers:
        pytest.skip("memory and cpu are available here: the limits path runs instead")
    (unit_cgroup / "engine").mkdir()
    proc, seen = _start_engine(unit_cgroup / "engine", tmp_path / "run")
    try:
        assert seen["mode"] == "subgroup" and seen["controllers"]
        assert seen["limits_via"] == "rlimit"
        _finish(proc)
        assert proc.stderr is not None
        assert "lacks the memory and cpu controllers" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
