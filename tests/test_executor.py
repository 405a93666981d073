"""Tests for edgesched.edge.executor: real processes, no mocks.

Covers exit codes, env/cwd, missing commands, SIGTERM -> SIGKILL escalation, CPU pinning,
rlimits, (fake and, where available, real) cgroup v2, log capture and rotation, and adoption of
tasks whose engine was SIGKILLed (a child Python process plays the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psutil
import pytest

from edgesched.core.model import Arch
from edgesched.core.slices import Device, Grant, Request, device_env, plan
from edgesched.core.task import Limits, TaskSpec
from edgesched.edge.executor import Executor, ExecutorError, ExitEvent, ProcessHandle

CORES = sorted(os.sched_getaffinity(0))
ENGINE = """
import asyncio, json, sys
from pathlib import Path
from edgesched.edge.executor import Executor
from edgesched.core.task import TaskSpec

async def main() -> None:
    ex = Executor(Path(sys.argv[1]), cgroup_parent=None)
    h = await ex.start(TaskSpec(id=sys.argv[2], command=tuple(sys.argv[4:]), cwd=sys.argv[3]))
    print(json.dumps({"pid": h.pid, "started_at": h.started_at}), flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def spec(task_id: str, *command: str, **kw: object) -> TaskSpec:
    return TaskSpec(id=task_id, command=command, **kw)  # type: ignore[arg-type]


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


async def next_exit(ex: Executor, timeout: float = 10.0) -> ExitEvent:
    events = ex.exits()
    try:
        return await asyncio.wait_for(anext(events), timeout)
    finally:
        await events.aclose()


def alive(pid: int, started_at: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return bool(proc.create_time() == started_at and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def live(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def group_pids(handle: ProcessHandle) -> list[int]:
    proc = psutil.Process(handle.pid)
    return [handle.pid, *(p.pid for p in proc.children(recursive=True))]


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
async def ex(run_dir: Path) -> AsyncIterator[Executor]:
    executor = Executor(run_dir, cgroup_parent=None, poll_s=0.05)
    yield executor
    for handle in executor.running().values():
        kill_group(handle.pid)
    await executor.aclose()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Callable[..., tuple[int, float]]]:
    """Start a task from a separate "engine" process, then SIGKILL that engine."""
    engines: list[subprocess.Popen[bytes]] = []
    tasks: list[tuple[int, float]] = []

    def run(run_dir: Path, task_id: str, cwd: Path, *command: str) -> tuple[int, float]:
        proc = subprocess.Popen(
            [sys.executable, "-c", ENGINE, str(run_dir), task_id, str(cwd), *command],
            stdout=subprocess.PIPE,
            cwd=tmp_path,  # not the repo root, whose edge/ would shadow the installed package
        )
        engines.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "engine printed nothing"
        data = json.loads(line)
        pid, started_at = int(data["pid"]), float(data["started_at"])
        tasks.append((pid, started_at))
        assert psutil.Process(pid).ppid() == proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return pid, started_at

    yield run
    for proc in engines:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    for pid, started_at in tasks:
        if alive(pid, started_at):
            kill_group(pid)


# ------------------------------------------------------------------ basics


async def test_exit_codes_zero_and_nonzero(ex: Executor) -> None:
    ok = await ex.start(spec("ok", "true"))
    bad = await ex.start(spec("bad", "sh", "-c", "exit 3"))
    assert ok.pid != bad.pid and ok.log_path.name == "ok.log"
    assert set(ex.running()) == {"ok", "bad"}
    events = {e.task_id: e for e in [await next_exit(ex), await next_exit(ex)]}
    assert events == {
        "ok": ExitEvent("ok", 0, False),
        "bad": ExitEvent("bad", 3, False),
    }
    assert ex.running() == {}


async def test_env_and_cwd_applied(ex: Executor, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    handle = await ex.start(
        spec("envcwd", "sh", "-c", 'echo "$FOO"; pwd', env={"FOO": "bar baz"}, cwd=str(work))
    )
    assert (await next_exit(ex)).exit_code == 0
    assert handle.log_path.read_text().splitlines() == ["bar baz", str(work)]


async def test_accel_unit_handed_to_the_process(ex: Executor) -> None:
    """The granted accelerator unit reaches the process's environment and wins over the
    task's own (a task cannot pick another device than the node granted it)."""
    devices = (Device(0, 1), Device(1, 4, "time"))
    unit = device_env(devices, plan(devices, [], "acc", Request(slices=2)) or Grant("acc", ()))
    handle = await ex.start(
        spec(
            "acc",
            "sh",
            "-c",
            'echo "$CUDA_VISIBLE_DEVICES|$EDGESCHED_ACCEL_SLICE"',
            env={"CUDA_VISIBLE_DEVICES": "0"},
            accel_slices=2,
        ),
        accel_env=unit,
    )
    assert (await next_exit(ex)).exit_code == 0
    assert handle.log_path.read_text().splitlines() == ["1|1:0,1/4"]


async def test_accel_unit_passed_into_a_container(run_dir: Path, tmp_path: Path) -> None:
    """Under a container runtime the unit's variables are passed in by name (``-e``)."""
    runtime = tmp_path / "fake-docker"
    runtime.write_text('#!/bin/sh\necho "$@"\necho "$EDGESCHED_VF_PCI"\n')
    runtime.chmod(0o755)
    executor = Executor(
        run_dir, cgroup_parent=None, poll_s=0.05, arch=Arch.X86_64, container_runtime=str(runtime)
    )
    try:
        task = spec("vf", "infer", images={Arch.X86_64: "infer:1"}, accel_slices=1)
        handle = await executor.start(
            task, accel_env={"EDGESCHED_VF_PCI": "0000:3b:00.1", "EDGESCHED_ACCEL_SLICE": "0:0/4"}
        )
        assert (await next_exit(executor)).exit_code == 0
        argv, vf = handle.log_path.read_text().splitlines()
        assert "-e EDGESCHED_VF_PCI" in argv and "-e EDGESCHED_ACCEL_SLICE" in argv
        assert vf == "0000:3b:00.1"
    finally:
        await executor.aclose()


async def test_missing_command_raises_naming_it(ex: Executor, tmp_path: Path) -> None:
    with pytest.raises(ExecutorError, match="no-such-command-xyz"):
        await ex.start(spec("m1", "no-such-command-xyz", "arg"))
    with pytest.raises(ExecutorError, match="/nonexistent/bin/tool"):
        await ex.start(spec("m2", "/nonexistent/bin/tool"))
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")
    with pytest.raises(ExecutorError, match=r"plain\.sh.*not executable"):
        await ex.start(spec("m3", str(plain)))
    with pytest.raises(ExecutorError, match="exit"):  # a shell builtin is not a command
        await ex.start(spec("m4", "exit", "3"))
    with pytest.raises(ExecutorError, match="cwd"):
        await ex.start(spec("m5", "true", cwd=str(tmp_path / "missing")))
    assert ex.running() == {}
    assert not list(ex.run_dir.glob("m*.log")), "nothing was spawned"


async def test_exec_failure_records_127(ex: Executor, tmp_path: Path) -> None:
    script = tmp_path / "bad-interpreter"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    handle = await ex.start(spec("e127", str(script)))  # exists and is executable
    assert await next_exit(ex) == ExitEvent("e127", 127, False)
    assert (ex.run_dir / "e127.exit").read_text().split() == ["127", str(handle.pid)]
    assert "not found" in handle.log_path.read_text()


async def test_start_twice_refused(ex: Executor) -> None:
    await ex.start(spec("dup", "sleep", "5"))
    with pytest.raises(ExecutorError, match="already running"):
        await ex.start(spec("dup", "sleep", "5"))


# ------------------------------------------------------------------ stopping


async def test_stop_sigterm(ex: Executor) -> None:
    handle = await ex.start(spec("term", "sleep", "30"))
    t0 = time.monotonic()
    event = await ex.stop("term", grace_s=5.0)
    assert time.monotonic() - t0 < 2.0
    assert event == ExitEvent("term", 128 + signal.SIGTERM, True)
    assert not alive(handle.pid, handle.started_at)
    assert ex.running() == {}
    assert await ex.stop("term") is None
    with pytest.raises(TimeoutError):  # a stopped task is not reported again by exits()
        await next_exit(ex, timeout=0.3)


async def test_concurrent_stops_stop_once(ex: Executor) -> None:
    await ex.start(spec("twice", "sleep", "30"))
    events = await asyncio.gather(ex.stop("twice", 2.0), ex.stop("twice", 2.0))
    assert sorted(events, key=str) == sorted([ExitEvent("twice", 143, True), None], key=str)


async def test_stop_escalates_to_sigkill(ex: Executor) -> None:
    handle = await ex.start(spec("stubborn", "sh", "-c", 'trap "" TERM; sleep 30'))
    wait_until(lambda: len(group_pids(handle)) >= 3)  # wrapper, task sh, sleep
    members = group_pids(handle)
    t0 = time.monotonic()
    event = await ex.stop("stubborn", grace_s=0.5)
    elapsed = time.monotonic() - t0
    assert 0.5 <= elapsed < 0.5 + 2.0
    assert event == ExitEvent("stubborn", 128 + signal.SIGKILL, True)
    assert not any(live(p) for p in members)  # zombies at most, waiting for their reaper
    # recorded for a later engine, since the wrapper itself was killed
    assert (ex.run_dir / "stubborn.exit").read_text().split() == ["137", str(handle.pid)]


async def test_graceful_handler_exit_code(ex: Executor) -> None:
    await ex.start(spec("graceful", "sh", "-c", "trap 'exit 0' TERM; sleep 30 & wait"))
    await asyncio.sleep(0.2)
    assert await ex.stop("graceful", grace_s=5.0) == ExitEvent("graceful", 0, False)


# ------------------------------------------------------------------ pinning and limits


async def test_pin_at_start_and_later(ex: Executor) -> None:
    threads = (
        "import threading, time\n"
        "for _ in range(2): threading.Thread(target=time.sleep, args=(10,), daemon=True).start()\n"
        "time.sleep(10)\n"
    )
    handle = await ex.start(
        spec("pinned", "sh", "-c", 'sleep 10 & "$0" -c "$1"; wait', sys.executable, threads),
        cores=[CORES[0]],
    )

    def tids() -> list[int]:
        return [int(t) for pid in group_pids(handle) for t in os.listdir(f"/proc/{pid}/task")]

    wait_until(lambda: len(tids()) >= 6)  # wrapper, sh, sleep, python with 3 threads
    assert {frozenset(os.sched_getaffinity(t)) for t in tids()} == {frozenset({CORES[0]})}
    if len(CORES) < 2:
        pytest.skip("needs two cores to re-pin")
    ex.pin("pinned", [CORES[-1]])
    assert {frozenset(os.sched_getaffinity(t)) for t in tids()} == {frozenset({CORES[-1]})}
    ex.pin("pinned", CORES)
    assert {frozenset(os.sched_getaffinity(t)) for t in tids()} == {frozenset(CORES)}
    with pytest.raises(ExecutorError, match="cores"):
        ex.pin("pinned", [])
    with pytest.raises(ExecutorError, match="not running"):
        ex.pin("nope", CORES)


async def test_bad_cores_rejected_with_reason(ex: Executor) -> None:
    with pytest.raises(ExecutorError, match="sched_setaffinity"):
        await ex.start(spec("badcore", "true"), cores=[4096])
    assert ex.running() == {}


def proc_limits(pid: int) -> dict[str, str]:
    rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    return {row[:26].strip(): row[26:47].strip() for row in rows}


async def test_rlimits_applied(ex: Executor) -> None:
    limits = Limits(memory_mb=512, nofile=64, cpu_seconds=100)
    handle = await ex.start(spec("limited", "sh", "-c", "ulimit -n; sleep 10", limits=limits))
    assert handle.limits_via == "rlimit"
    wait_until(lambda: len(group_pids(handle)) >= 3 and handle.log_path.read_text() != "")
    assert handle.log_path.read_text() == "64\n"
    for pid in group_pids(handle):  # the wrapper and the command alike
        lim = proc_limits(pid)
        assert lim["Max open files"] == "64"
        assert lim["Max address space"] == str(512 << 20)
        assert lim["Max cpu time"] == "100"
    plain = await ex.start(spec("plain", "true"))
    assert plain.limits_via == "none"


async def test_rlimit_too_high_is_a_clear_error(ex: Executor) -> None:
    if os.geteuid() == 0:
        pytest.skip("root may raise hard limits")
    too_many = Limits(nofile=os.sysconf("SC_OPEN_MAX") * 1024 * 1024)
    with pytest.raises(ExecutorError, match="RLIMIT_NOFILE"):
        await ex.start(spec("toohigh", "true", limits=too_many))


async def test_no_cgroup_v2_falls_back_to_rlimits(tmp_path: Path) -> None:
    parent = tmp_path / "not-a-cgroupfs" / "edgesched"
    ex = Executor(tmp_path / "run", cgroup_parent=parent, poll_s=0.05)
    handle = await ex.start(spec("fb", "sleep", "5", limits=Limits(memory_mb=256)))
    try:
        assert handle.limits_via == "rlimit"
        assert proc_limits(handle.pid)["Max address space"] == str(256 << 20)
        assert not parent.exists()
    finally:
        await ex.stop("fb", grace_s=1.0)


def fake_cgroupfs(root: Path) -> Path:
    """A directory tree shaped like cgroup v2 (plain files: nothing is enforced)."""
    parent = root / "edgesched"
    parent.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (parent / "cgroup.controllers").write_text("cpu memory\n")
    return parent


async def test_cgroup_files_written_and_child_joins(tmp_path: Path) -> None:
    parent = fake_cgroupfs(tmp_path / "cg")
    task_cg = parent / "task-cg1"
    task_cg.mkdir()
    (task_cg / "cgroup.procs").write_text("")  # exists in a real cgroup
    ex = Executor(tmp_path / "run", cgroup_parent=parent, poll_s=0.05)
    limits = Limits(memory_mb=64, nofile=128)
    handle = await ex.start(spec("cg1", "sleep", "5", cpu=0.5, limits=limits))
    try:
        assert handle.limits_via == "cgroup"
        assert (parent / "cgroup.subtree_control").read_text() == "+memory +cpu"
        assert (task_cg / "memory.max").read_text() == str(64 << 20)
        assert (task_cg / "cpu.max").read_text() == "50000 100000"
        assert (task_cg / "cgroup.procs").read_text() == str(handle.pid)  # joined pre-exec
        lim = proc_limits(handle.pid)
        assert lim["Max open files"] == "128"  # no cgroup knob for these: still rlimits
        assert lim["Max address space"] == proc_limits(os.getpid())["Max address space"]
    finally:
        await ex.stop("cg1", grace_s=1.0)


async def test_cgroup_join_failure_falls_back_in_the_child(tmp_path: Path) -> None:
    parent = fake_cgroupfs(tmp_path / "cg")  # no cgroup.procs in the task's cgroup: join fails
    ex = Executor(tmp_path / "run", cgroup_parent=parent, poll_s=0.05)
    handle = await ex.start(spec("cg2", "sleep", "5", limits=Limits(memory_mb=300)))
    try:
        assert handle.limits_via == "rlimit"
        assert proc_limits(handle.pid)["Max address space"] == str(300 << 20)
        later = await ex.start(spec("cg3", "sleep", "5"))
        assert later.limits_via == "none"  # cgroups now off for this executor
    finally:
        await ex.stop("cg2", grace_s=1.0)
        await ex.stop("cg3", grace_s=1.0)


def real_cgroup_v2() -> bool:
    try:
        controllers = Path("/sys/fs/cgroup/cgroup.controllers").read_text().split()
    except OSError:
        return False
    return os.geteuid() == 0 and {"memory", "cpu"} <= set(controllers)


@pytest.mark.skipif(not real_cgroup_v2(), reason="needs root and cgroup v2 with memory, cpu")
async def test_real_cgroup_v2(tmp_path: Path) -> None:
    parent = Path(f"/sys/fs/cgroup/edgesched-test-{os.getpid()}")
    ex = Executor(tmp_path / "run", cgroup_parent=parent, poll_s=0.05)
    try:
        handle = await ex.start(spec("real", "sleep", "5", cpu=0.25, limits=Limits(memory_mb=64)))
        if handle.limits_via != "cgroup":
            await ex.stop("real", grace_s=1.0)
            pytest.skip("cgroup v2 present but not writable here (e.g. a container)")
        rel = f"/{parent.name}/task-real"
        assert f"0::{rel}\n" in Path(f"/proc/{handle.pid}/cgroup").read_text()
        assert (parent / "task-real" / "memory.max").read_text().strip() == str(64 << 20)
        assert (parent / "task-real" / "cpu.max").read_text().split() == ["25000", "100000"]
        await ex.stop("real", grace_s=1.0)
        assert not (parent / "task-real").exists()
    finally:
        with contextlib.suppress(OSError):
            parent.rmdir()


# ------------------------------------------------------------------ logs


async def test_log_capture_and_rotation(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ex = Executor(run_dir, cgroup_parent=None, log_max_bytes=100, log_backups=2, poll_s=0.05)
    go = tmp_path / "go"
    script = (
        'i=0; while [ $i -lt 20 ]; do echo "line $i"; i=$((i+1)); done; echo oops >&2; '
        f"while [ ! -e {go} ]; do sleep 0.02; done; echo after"
    )
    handle = await ex.start(spec("chatty", "sh", "-c", script))
    log = handle.log_path
    wait_until(lambda: log.read_text().endswith("oops\n"))
    first = log.read_text()
    assert first.startswith("line 0\n") and first.count("\n") == 21
    assert ex.rotate_logs() == 1
    assert log.stat().st_size == 0
    assert (run_dir / "chatty.log.1").read_text() == first
    assert ex.rotate_logs() == 0  # under the limit now
    go.touch()
    assert (await next_exit(ex)).exit_code == 0
    assert log.read_bytes() == b"after\n"  # O_APPEND: no hole of NULs where the data was
    # more rotations keep at most log_backups copies, newest first
    for n in range(3):
        log.write_text(f"round {n}\n" * 20)
        assert ex.rotate_logs() == 1
    assert (run_dir / "chatty.log.1").read_text().startswith("round 2")
    assert (run_dir / "chatty.log.2").read_text().startswith("round 1")
    assert not (run_dir / "chatty.log.3").exists()


# ------------------------------------------------------------------ adoption


def waiter(go: Path, code: int) -> tuple[str, ...]:
    return ("sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; exit {code}")


async def test_adopt_after_engine_sigkill(
    run_dir: Path, tmp_path: Path, engine: Callable[..., tuple[int, float]]
) -> None:
    go = tmp_path / "go"
    pid, started_at = engine(run_dir, "survivor", tmp_path, *waiter(go, 7))
    await asyncio.sleep(0.2)
    assert alive(pid, started_at), "the task outlives its engine"

    ex = Executor(run_dir, cgroup_parent=None, poll_s=0.05)
    with pytest.raises(ExecutorError, match="adopt"):  # never started twice
        await ex.start(spec("survivor", *waiter(go, 7)))
    handle = ex.adopt("survivor", pid, started_at)
    assert handle is not None
    assert (handle.pid, handle.started_at, handle.limits_via) == (pid, started_at, "none")
    assert ex.running() == {"survivor": handle}
    assert ex.adopt("survivor", pid, started_at) == handle  # idempotent
    go.touch()
    assert await next_exit(ex) == ExitEvent("survivor", 7, False)
    assert ex.running() == {}
    await ex.aclose()


async def test_adopt_wrong_identity_returns_none(
    run_dir: Path, tmp_path: Path, engine: Callable[..., tuple[int, float]]
) -> None:
    pid, started_at = engine(run_dir, "victim", tmp_path, "sleep", "30")
    ex = Executor(run_dir, cgroup_parent=None, poll_s=0.05)
    assert ex.adopt("victim", pid, started_at - 3600.0) is None  # same pid, another process
    assert ex.adopt("victim", os.getpid(), started_at) is None  # someone else's pid
    assert ex.recorded("victim") == (pid, started_at)
    assert ex.running() == {}
    with pytest.raises(TimeoutError):  # no exit was recorded: nothing is queued
        await next_exit(ex, timeout=0.2)
    # and the adopted task can be stopped like our own
    assert ex.adopt("victim", pid, started_at) is not None
    assert await ex.stop("victim", grace_s=2.0) == ExitEvent("victim", 143, True)
    assert not alive(pid, started_at)


async def test_exit_while_no_engine_is_recovered_on_adopt(
    run_dir: Path, tmp_path: Path, engine: Callable[..., tuple[int, float]]
) -> None:
    go = tmp_path / "go"
    pid, started_at = engine(run_dir, "orphan", tmp_path, *waiter(go, 5))
    go.touch()
    wait_until(lambda: not alive(pid, started_at))
    assert (run_dir / "orphan.exit").read_text().split() == ["5", str(pid)]

    ex = Executor(run_dir, cgroup_parent=None, poll_s=0.05)
    assert ex.adopt("orphan", pid, started_at) is None
    assert await next_exit(ex) == ExitEvent("orphan", 5, False)
    ex.forget("orphan")
    assert ex.recorded("orphan") is None
    assert ex.adopt("orphan", pid, started_at) is None
    with pytest.raises(TimeoutError):
        await next_exit(ex, timeout=0.2)


async def test_adopt_survives_wall_clock_step(ex: Executor) -> None:
    handle = await ex.start(spec("clock", "sleep", "10"))
    pid_file = ex.run_dir / "clock.pid"
    record = json.loads(pid_file.read_text())
    # As if the task had been started (and its create time stored) before NTP stepped the
    # clock forward by a day: the stored value no longer equals psutil's current view.
    stepped = handle.started_at - 86_400.0
    record["started_at"] = stepped
    pid_file.write_text(json.dumps(record))
    other = Executor(ex.run_dir, cgroup_parent=None)
    adopted = other.adopt("clock", handle.pid, stepped)
    assert adopted is not None and adopted.started_at == stepped
    # without the matching record it is refused, as a reused pid would be
    third = Executor(ex.run_dir, cgroup_parent=None)
    assert third.adopt("clock", handle.pid, stepped - 10.0) is None


async def test_aclose_ends_exits_and_leaves_tasks_running(ex: Executor) -> None:
    handle = await ex.start(spec("keeps", "sleep", "5"))
    events = ex.exits()
    pending = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.1)
    await ex.aclose()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 2.0)
    assert alive(handle.pid, handle.started_at)
    with pytest.raises(ExecutorError, match="closed"):
        await ex.start(spec("late", "true"))


def test_wrapper_runs_nothing_unless_the_engine_recorded_the_spawn(tmp_path: Path) -> None:
    """An engine killed between spawn and recording closes the wrapper's stdin without a
    "go": the wrapper must exit without running the command (so it can never run twice)."""
    from edgesched.edge.executor import _WRAPPER

    marker = tmp_path / "ran"
    argv = ["/bin/sh", "-c", _WRAPPER, "edgesched", str(tmp_path / "t.exit"), "touch", str(marker)]
    orphaned = subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=10)
    assert orphaned.returncode == 125 and not marker.exists()
    go = subprocess.run(argv, input=b"go\n", timeout=10)
    assert go.returncode == 0 and marker.exists()
    assert (tmp_path / "t.exit").read_text().split()[0] == "0"
