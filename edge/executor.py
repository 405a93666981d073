"""Run an edge node's tasks as real processes that outlive the engine which started them.

Role: the edge sub-engine hands a :class:`~edgesched.core.task.TaskSpec` to :class:`Executor`,
which starts it as a process, limits and pins it, captures its output, reports its exit, and
stops it on request. The engine may be SIGKILLed or restarted at any time; its tasks keep
running, and the next engine *adopts* them by ``(pid, started_at)`` instead of starting them
twice. Linux only (``/proc``, ``sched_setaffinity``, cgroup v2).

How a task survives its engine:

* It runs in its own session / process group (``start_new_session``), with stdin on
  ``/dev/null`` and stdout + stderr appended (``O_APPEND``) to ``<run_dir>/<task_id>.log``:
  no pipe to the engine that could die with it. :meth:`Executor.rotate_logs` rotates by
  copy-then-truncate, which the ``O_APPEND`` writer follows without holes.
* The command runs under a tiny ``/bin/sh`` wrapper (the group leader) that waits for it and
  writes ``"<code> <wrapper pid>"`` atomically (tmp file + ``mv``) to ``<task_id>.exit``; a
  signal-killed command gives ``128 + signal`` (shell convention). The wrapper catches
  TERM/INT/HUP, so a group-wide SIGTERM stops the command but not the bookkeeping; only SIGKILL
  of the whole group (our stop escalation) kills it, and then the engine records ``137``
  itself. The command is run with ``exec``, so a shell builtin name never runs in the wrapper.
* Right after spawning, ``<task_id>.pid`` records the identity: pid, psutil create time,
  boot id and the boot-relative start time in clock ticks. A process is matched by pid *and*
  start time, so a reused pid is never mistaken for the task. psutil's create time is wall
  clock (it moves when NTP steps the clock, common on boards without an RTC); adopt() therefore
  also accepts a pid whose boot id and start ticks equal the ones recorded for that
  ``(pid, started_at)``. While tracking, liveness is checked by start ticks only. The record
  also lets an engine that died between spawning and committing the pid find the task
  (:meth:`Executor.recorded`), and :meth:`Executor.start` refuses to start a second copy
  while the recorded process lives.
* start() returns once the command itself has been exec'd (milliseconds), so a stop() right
  after it cannot hit the wrapper before it forked the command. stop() signals the whole
  group and waits until no live member is left (zombies awaiting a slow reaper don't count).
* Exit events are delivered at least once across engine restarts (the ``.exit`` file stays
  until :meth:`Executor.forget` or the next :meth:`Executor.start` of the same id).

Images: a task that names an image per architecture runs the one for ``arch`` (the node's;
default this host's) with ``container_runtime``, or its command as it is with the image in
``EDGESCHED_IMAGE`` when there is no runtime; one with no image for ``arch`` is refused
(:mod:`edgesched.edge.container`).

Limits: with a writable cgroup v2 (the parent of ``cgroup_parent`` has ``cgroup.controllers``
and we can create ``cgroup_parent`` with the ``memory`` and ``cpu`` controllers enabled) each
task gets ``<cgroup_parent>/task-<id>`` with ``memory.max`` (``limits.memory_mb``) and
``cpu.max`` (``spec.cpu`` CPUs), and the child moves itself in before ``exec``; otherwise
``limits.memory_mb`` becomes ``RLIMIT_AS``. ``nofile`` and ``cpu_seconds`` are rlimits either
way. Missing cgroups never fail a start: the handle says what was used (``limits_via``).

Where the task cgroups go (``cgroup_parent="auto"``, the engine's choice;
:func:`cgroup_layout`): under systemd with ``Delegate=yes`` (the unit's cgroup carries
systemd's ``trusted.delegate``/``user.delegate`` mark) they go *inside the subtree systemd
handed over*, ``<unit cgroup>/tasks/task-<id>``, and the engine first moves itself into the
leaf ``<unit cgroup>/engine`` (cgroup v2 allows processes in leaves only once controllers are
enabled). Controllers (``memory.max``, ``cpu.max``) are enabled in the unit's cgroup only when
systemd started the engine in that leaf itself (``DelegateSubgroup=engine``, systemd 254 and
later): otherwise a restart, which puts the new engine in the unit's cgroup while the tasks
of the old one still run below it, would fail (219/CGROUP, systemd issue #24064), so task
cgroups only group and account the tasks, and memory limits fall back to ``RLIMIT_AS``. Not
under a delegating systemd (a shell, a container, a test): ``/sys/fs/cgroup/edgesched`` as
before (needs root).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import shlex
import shutil
import signal
import subprocess
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import psutil

from edgesched.core.model import Arch
from edgesched.core.task import TaskSpec
from edgesched.edge.container import (
    ARCH_ENV,
    IMAGE_ENV,
    NoImage,
    container_argv,
    image_env,
    image_for,
)
from edgesched.edge.hal import UnsupportedHardware, arch_of
from edgesched.sync.session import wait_event

__all__ = [
    "CgroupLayout",
    "Executor",
    "ExecutorError",
    "ExitEvent",
    "LimitsVia",
    "ProcessHandle",
    "cgroup_layout",
]

log = logging.getLogger(__name__)

LimitsVia = Literal["cgroup", "rlimit", "none"]

_MV = shutil.which("mv", path="/usr/bin:/bin") or "mv"
# $1 is the exit file; the rest is the command. Caught signals reset to default in the
# subshell, so the command gets TERM normally while the wrapper survives it and records.
# The wrapper first waits for the engine's "go" on stdin, sent only once the spawn is recorded
# (pid file written): an engine killed in between leaves a wrapper that exits 125 without
# running anything, so a task is never running unrecorded (and never started twice).
_WRAPPER = (
    "IFS= read -r go || exit 125; exec </dev/null; "
    'f=$1; shift; trap : HUP INT TERM; ( exec "$@" ); c=$?; '
    f'printf "%s %s\\n" "$c" "$$" > "$f.tmp" && {shlex.quote(_MV)} -f "$f.tmp" "$f"; exit $c'
)
_CPU_PERIOD_US = 100_000
_MIN_CPU_QUOTA_US = 1_000
_CREATE_TIME_TOLERANCE_S = 2.0  # btime (/proc/stat) may tick by a second under NTP slewing
_KILL_WAIT_S = 5.0
#: Where task cgroups go when no systemd delegated a subtree (needs root).
LEGACY_CGROUP_PARENT = Path("/sys/fs/cgroup/edgesched")


class ExecutorError(Exception):
    """A task could not be started, adopted or pinned; the message names the task and cause."""


@dataclass(frozen=True, slots=True)
class ProcessHandle:
    """A running task: its wrapper process (the process-group leader) and where it logs."""

    task_id: str
    pid: int
    started_at: float  # psutil create_time at start: with pid, the identity to adopt by
    log_path: Path
    limits_via: LimitsVia


@dataclass(frozen=True, slots=True)
class ExitEvent:
    """A task ended. ``exit_code`` follows the shell (128 + N: killed by signal N); ``None``
    when unknown (its process vanished without an exit record). ``signalled``: ended by a
    signal, as far as the code tells (a program exiting 130 by itself looks the same)."""

    task_id: str
    exit_code: int | None
    signalled: bool


@dataclass(slots=True)
class _Tracked:
    handle: ProcessHandle
    ticks: int  # boot-relative start time of the wrapper, in clock ticks
    popen: subprocess.Popen[bytes] | None  # None when adopted
    cgroup: Path | None


class Executor:
    """Starts, watches, pins and stops task processes; see the module docstring."""

    def __init__(
        self,
        run_dir: Path,
        *,
        log_max_bytes: int = 1 << 20,
        log_backups: int = 3,
        cgroup_parent: Path | Literal["auto"] | None = LEGACY_CGROUP_PARENT,
        poll_s: float = 0.2,
        arch: Arch | None = None,
        container_runtime: str = "",
    ) -> None:
        if log_max_bytes <= 0 or log_backups < 0 or poll_s <= 0:
            raise ValueError("log_max_bytes and poll_s must be > 0, log_backups >= 0")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        #: where task cgroups go and how (see the module docstring); None: as cgroup_parent says
        self.cgroup_layout: CgroupLayout | None = None
        if cgroup_parent == "auto":
            self.cgroup_layout = cgroup_layout()
            cgroup_parent = self.cgroup_layout.tasks
        self.cgroup_parent = cgroup_parent
        self.poll_s = poll_s
        # the node's architecture picks a task's image (edge/container.py); None: this host's
        self.arch = arch
        self.container_runtime = container_runtime
        self._cgroup_ok: bool | None = None  # decided at the first start
        if self.cgroup_layout is not None and self.cgroup_layout.unit is not None:
            self._cgroups_usable()  # delegated: the engine into its leaf now, tasks or not
        self._tasks: dict[str, _Tracked] = {}
        self._stopping: set[str] = set()
        self._events: deque[ExitEvent] = deque()
        self._wake = asyncio.Event()
        self._closed = False

    # ----------------------------------------------------------------- public API

    async def start(
        self,
        spec: TaskSpec,
        cores: Sequence[int] | None = None,
        accel_env: Mapping[str, str] | None = None,
    ) -> ProcessHandle:
        """Start ``spec.command`` in its own session, limited, optionally pinned to ``cores``.

        The environment is the engine's overlaid with ``spec.env``, then with ``accel_env``:
        the accelerator unit the node granted the task (``CUDA_VISIBLE_DEVICES``,
        ``EDGESCHED_VF_PCI``, ``EDGESCHED_ACCEL_SLICE``; see
        :func:`edgesched.core.slices.device_env`), which the task's own env cannot override.
        Raises
        :class:`ExecutorError`, before spawning anything, when the command is not found or
        not executable, ``cwd`` is not a directory, or the task is already running.
        """
        if self._closed:
            raise ExecutorError(f"{spec.id}: executor is closed")
        task_id = spec.id
        if task_id in self._tasks:
            raise ExecutorError(
                f"{task_id}: already running (pid {self._tasks[task_id].handle.pid})"
            )
        survivor = self._recorded_alive(task_id)
        if survivor is not None:
            raise ExecutorError(
                f"{task_id}: already running as pid {survivor[0]} from an earlier engine; "
                "adopt it instead of starting it twice"
            )
        env = {**os.environ, **spec.env, **(accel_env or {})}
        cwd = spec.cwd
        if cwd is not None and not os.path.isdir(cwd):
            raise ExecutorError(f"{task_id}: cwd {cwd!r} is not a directory")
        cpus = _check_cores(task_id, cores) if cores is not None else None
        command = self._command(spec, env, cpus, tuple(accel_env or ()))
        _resolve_command(task_id, command[0], env.get("PATH", os.defpath), cwd)

        exit_path = self._path(task_id, ".exit")
        for stale in (exit_path, self._path(task_id, ".exit.tmp"), self._path(task_id, ".pid")):
            stale.unlink(missing_ok=True)
        cgroup = self._make_cgroup(spec)
        limited = cgroup is not None and self._cgroup_limits
        lim = spec.limits
        memory = lim.memory_mb << 20 if lim.memory_mb is not None else None
        rlimits: list[tuple[str, int, int]] = []
        if memory is not None and not limited:
            rlimits.append(("RLIMIT_AS", resource.RLIMIT_AS, memory))
        if lim.nofile is not None:
            rlimits.append(("RLIMIT_NOFILE", resource.RLIMIT_NOFILE, lim.nofile))
        if lim.cpu_seconds is not None:
            rlimits.append(("RLIMIT_CPU", resource.RLIMIT_CPU, lim.cpu_seconds))

        log_path = self._path(task_id, ".log")
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        err_r, err_w = os.pipe()  # the child's setup errors and notes (both close-on-exec)
        go_r, go_w = os.pipe()  # the wrapper's stdin: "go" once the spawn is recorded
        try:
            popen = subprocess.Popen(
                ["/bin/sh", "-c", _WRAPPER, "edgesched", str(exit_path), *command],
                stdin=go_r,
                stdout=log_fd,
                stderr=log_fd,
                cwd=cwd,
                env=env,
                start_new_session=True,
                preexec_fn=_child_setup(rlimits, cpus, cgroup, memory if limited else None, err_w),
            )
        except subprocess.SubprocessError:
            os.close(go_w)
            self._remove_cgroup(cgroup)
            detail = _read_note(err_r) or "unknown error"
            raise ExecutorError(f"{task_id}: setting up the process failed: {detail}") from None
        except OSError as exc:
            os.close(go_w)
            self._remove_cgroup(cgroup)
            raise ExecutorError(f"{task_id}: cannot spawn /bin/sh: {exc}") from exc
        else:
            note = _read_note(err_r)  # only the child's failure to join the cgroup
        finally:
            for fd in (err_r, err_w, log_fd, go_r):
                os.close(fd)
        if note and cgroup is not None:
            log.warning("%s: %s; cgroups off, memory limit via RLIMIT_AS", task_id, note)
            self._cgroup_ok = False
            self._remove_cgroup(cgroup)
            if memory is not None and limited:
                rlimits.append(("RLIMIT_AS", resource.RLIMIT_AS, memory))
            cgroup = None
            limited = False
        limits_via: LimitsVia = "cgroup" if limited else "rlimit" if rlimits else "none"

        pid = popen.pid
        ticks = _start_ticks(pid, zombie_ok=True)
        started_at = psutil.Process(pid).create_time()  # an unreaped child: exists even if done
        assert ticks is not None, "own unreaped child has a /proc entry"
        handle = ProcessHandle(task_id, pid, started_at, log_path, limits_via)
        self._write_json(
            self._path(task_id, ".pid"),
            {
                "pid": pid,
                "started_at": started_at,
                "boot_id": _boot_id(),
                "ticks": ticks,
                "limits_via": limits_via,
                "cgroup": str(cgroup) if cgroup else None,
            },
        )
        self._tasks[task_id] = _Tracked(handle, ticks, popen, cgroup)
        try:
            os.write(go_w, b"go\n")  # recorded: the wrapper may run the command now
        except BrokenPipeError:  # it died first (nofile=1: /bin/sh cannot even load libc)
            log.warning("%s: pid %d ended before its command could start", task_id, pid)
        finally:
            os.close(go_w)
        log.info("started %s as pid %d (limits via %s)", task_id, pid, limits_via)
        await _until_exec(popen)
        return handle

    def _command(
        self,
        spec: TaskSpec,
        env: dict[str, str],
        cpus: Sequence[int] | None,
        extra_names: tuple[str, ...] = (),
    ) -> tuple[str, ...]:
        """What to run for ``spec``: its command, or its image's (edge/container.py); ``env``
        gains the image's variables. ``extra_names``: more variables passed into a container
        (the accelerator unit's)."""
        if not spec.images:
            return spec.command
        try:
            arch = self.arch or arch_of(os.uname().machine)
            image = image_for(spec, arch)
        except (NoImage, UnsupportedHardware) as exc:
            raise ExecutorError(f"{spec.id}: {exc}") from None
        assert image is not None
        env.update(image_env(image, arch))
        if not self.container_runtime:
            return spec.command
        if not extra_names:
            return container_argv(self.container_runtime, spec, image, cores=cpus)
        names = dict.fromkeys({*spec.env, IMAGE_ENV, ARCH_ENV, *extra_names}, "")
        return container_argv(self.container_runtime, spec, image, cores=cpus, env=names)

    def adopt(self, task_id: str, pid: int, started_at: float) -> ProcessHandle | None:
        """Track a task an earlier engine started, identified by ``(pid, started_at)``.

        Returns ``None`` when that process is gone or the pid now belongs to another process;
        if the task's exit was recorded meanwhile, its :class:`ExitEvent` is queued for
        :meth:`exits`.
        """
        tracked = self._tasks.get(task_id)
        if tracked is not None:
            if tracked.handle.pid == pid:
                return tracked.handle
            raise ExecutorError(f"{task_id}: already tracked as pid {tracked.handle.pid}")
        rec = self._read_json(self._path(task_id, ".pid"))
        if rec.get("pid") != pid:
            rec = {}
        ticks = _start_ticks(pid)
        same = False
        if ticks is not None:
            try:
                now = psutil.Process(pid).create_time()
            except psutil.Error:
                now = None
            if now is not None and abs(now - started_at) <= _CREATE_TIME_TOLERANCE_S:
                same = True
            elif (
                isinstance(rec.get("started_at"), float)
                and abs(rec["started_at"] - started_at) <= _CREATE_TIME_TOLERANCE_S
                and rec.get("boot_id") == _boot_id()
                and rec.get("ticks") == ticks
            ):
                same = True  # the wall clock moved since the start; the process did not
        if not same:
            code = self._read_exit(task_id, pid)
            if code is not None:
                self._queue(ExitEvent(task_id, code, code > 128))
            return None
        assert ticks is not None
        via = rec.get("limits_via")
        limits_via: LimitsVia = via if via in ("cgroup", "rlimit", "none") else "none"
        cgroup = Path(rec["cgroup"]) if isinstance(rec.get("cgroup"), str) else None
        handle = ProcessHandle(task_id, pid, started_at, self._path(task_id, ".log"), limits_via)
        self._tasks[task_id] = _Tracked(handle, ticks, None, cgroup)
        log.info("adopted %s (pid %d)", task_id, pid)
        return handle

    def exit_pending(self, task_id: str) -> bool:
        """Whether an exit of ``task_id`` is queued for :meth:`exits` (e.g. found by adopt)."""
        return any(event.task_id == task_id for event in self._events)

    def recorded(self, task_id: str) -> tuple[int, float] | None:
        """The ``(pid, started_at)`` last started for ``task_id`` in this run dir, if any: for
        an engine that died between spawning a task and committing its pid."""
        rec = self._read_json(self._path(task_id, ".pid"))
        pid, started_at = rec.get("pid"), rec.get("started_at")
        if isinstance(pid, int) and isinstance(started_at, float):
            return pid, started_at
        return None

    async def stop(self, task_id: str, grace_s: float = 10.0) -> ExitEvent | None:
        """SIGTERM the task's process group, SIGKILL it after ``grace_s``; return how it ended.

        ``None`` for a task not tracked. A stopped task's event is returned here only, never
        also yielded by :meth:`exits`.
        """
        while task_id in self._stopping:  # another stop() is at it: let it finish first
            await asyncio.sleep(self.poll_s)
        tracked = self._tasks.get(task_id)
        if tracked is None:
            return None
        self._stopping.add(task_id)
        try:
            killed = False
            if not self._gone(tracked):
                self._signal(tracked, signal.SIGTERM)
                if not await self._wait_gone(tracked, grace_s):
                    log.warning("%s ignored SIGTERM for %.1fs; killing", task_id, grace_s)
                    self._signal(tracked, signal.SIGKILL)
                    killed = True
                    await self._wait_gone(tracked, _KILL_WAIT_S)
            event = self._exit_event(tracked, killed=killed)
        finally:
            self._stopping.discard(task_id)
        self._untrack(tracked)
        return event

    def pin(self, task_id: str, cores: Sequence[int]) -> None:
        """Set the CPU affinity of every thread of every process of the task to ``cores``."""
        tracked = self._tasks.get(task_id)
        if tracked is None:
            raise ExecutorError(f"{task_id}: not running here")
        cpus = _check_cores(task_id, cores)
        pid = tracked.handle.pid
        pids: set[int] = set()
        if _start_ticks(pid) == tracked.ticks:
            pids.add(pid)
            with contextlib.suppress(psutil.Error):
                pids.update(p.pid for p in psutil.Process(pid).children(recursive=True))
        if tracked.cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (tracked.cgroup / "cgroup.procs").read_text().split())
        for member in sorted(pids):
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{member}/task")]
            except FileNotFoundError:
                continue
            for tid in tids:
                try:
                    os.sched_setaffinity(tid, cpus)
                except ProcessLookupError:
                    pass
                except OSError as exc:
                    raise ExecutorError(f"{task_id}: cannot pin to cores {cpus}: {exc}") from exc

    def running(self) -> dict[str, ProcessHandle]:
        """Tracked tasks whose exit has not been reported yet."""
        return {task_id: t.handle for task_id, t in self._tasks.items()}

    async def exits(self) -> AsyncGenerator[ExitEvent, None]:
        """Yield an :class:`ExitEvent` as each tracked task ends (own and adopted), polling
        every ``poll_s``; ends after :meth:`aclose`. One consumer at a time."""
        while True:
            self._poll()
            while self._events:
                yield self._events.popleft()
            if self._closed:
                return
            self._wake.clear()
            await wait_event(self._wake, self.poll_s)

    def rotate_logs(self) -> int:
        """Rotate every ``*.log`` in the run dir larger than ``log_max_bytes`` by copy then
        truncate, keeping ``log_backups`` old copies (``.log.1`` newest); return how many."""
        rotated = 0
        for path in sorted(self.run_dir.glob("*.log")):
            try:
                if path.stat().st_size <= self.log_max_bytes:
                    continue
                if self.log_backups > 0:
                    for n in range(self.log_backups - 1, 0, -1):
                        older = path.with_name(f"{path.name}.{n}")
                        if older.exists():
                            older.replace(path.with_name(f"{path.name}.{n + 1}"))
                    shutil.copyfile(path, path.with_name(f"{path.name}.1"))
                os.truncate(path, 0)  # writers use O_APPEND: they continue at the new end
                rotated += 1
            except OSError as exc:
                log.warning("rotating %s failed: %s", path, exc)
        return rotated

    def log_path(self, task_id: str) -> Path:
        """Where ``task_id``'s stdout and stderr go (rotated by :meth:`rotate_logs`)."""
        return self._path(task_id, ".log")

    def forget(self, task_id: str) -> None:
        """Drop a finished task's exit and identity records once the engine has committed its
        outcome (its log stays). A no-op for a running task."""
        if task_id in self._tasks:
            return
        for suffix in (".exit", ".exit.tmp", ".pid"):
            self._path(task_id, suffix).unlink(missing_ok=True)

    async def aclose(self) -> None:
        """Stop watching and end :meth:`exits`; the tasks keep running (they outlive us)."""
        self._closed = True
        self._wake.set()

    # ----------------------------------------------------------------- internals

    def _path(self, task_id: str, suffix: str) -> Path:
        return self.run_dir / f"{task_id}{suffix}"

    def _queue(self, event: ExitEvent) -> None:
        self._events.append(event)
        self._wake.set()

    def _poll(self) -> None:
        for task_id, tracked in list(self._tasks.items()):
            if task_id in self._stopping or not self._wrapper_dead(tracked):
                continue
            event = self._exit_event(tracked, killed=False)
            self._untrack(tracked)
            log.info("%s exited with %s", task_id, event.exit_code)
            self._queue(event)

    def _wrapper_dead(self, tracked: _Tracked) -> bool:
        if tracked.popen is not None:
            return tracked.popen.poll() is not None
        return _ended(tracked.handle.pid, tracked.ticks)

    def _gone(self, tracked: _Tracked) -> bool:
        """The wrapper has ended and nothing is left in its process group."""
        return self._wrapper_dead(tracked) and not _group_alive(tracked.handle.pid)

    async def _wait_gone(self, tracked: _Tracked, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        step = min(self.poll_s, 0.05)
        while not self._gone(tracked):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(step)
        return True

    def _signal(self, tracked: _Tracked, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(tracked.handle.pid, sig)  # pgid == wrapper pid (its own session)
        if sig == signal.SIGKILL and tracked.cgroup is not None:
            with contextlib.suppress(OSError):  # also whatever left the group (kernel >= 5.14)
                (tracked.cgroup / "cgroup.kill").write_text("1")

    def _exit_event(self, tracked: _Tracked, *, killed: bool) -> ExitEvent:
        task_id, pid = tracked.handle.task_id, tracked.handle.pid
        code = self._read_exit(task_id, pid)
        if code is not None:
            return ExitEvent(task_id, code, code > 128)
        rc = tracked.popen.returncode if tracked.popen is not None else None
        if rc is not None:
            code, signalled = (128 - rc, True) if rc < 0 else (rc, False)
        elif killed:
            code, signalled = 128 + signal.SIGKILL, True
        else:
            return ExitEvent(task_id, None, False)
        # The wrapper died before recording: record for the next engine.
        with contextlib.suppress(OSError):
            tmp = self._path(task_id, ".exit.tmp")
            tmp.write_text(f"{code} {pid}\n")
            tmp.replace(self._path(task_id, ".exit"))
        return ExitEvent(task_id, code, signalled)

    def _read_exit(self, task_id: str, pid: int) -> int | None:
        try:
            code_s, pid_s = self._path(task_id, ".exit").read_text().split()
            code, writer = int(code_s), int(pid_s)
        except (OSError, ValueError):
            return None
        return code if writer == pid else None  # else a record of another incarnation

    def _recorded_alive(self, task_id: str) -> tuple[int, int] | None:
        rec = self._read_json(self._path(task_id, ".pid"))
        pid, ticks = rec.get("pid"), rec.get("ticks")
        if not isinstance(pid, int) or not isinstance(ticks, int):
            return None
        if rec.get("boot_id") != _boot_id() or _start_ticks(pid) != ticks:
            return None
        return pid, ticks

    def _untrack(self, tracked: _Tracked) -> None:
        self._tasks.pop(tracked.handle.task_id, None)
        self._remove_cgroup(tracked.cgroup)

    # cgroups ---------------------------------------------------------------

    @property
    def _cgroup_limits(self) -> bool:
        """Whether task cgroups carry memory.max and cpu.max (else they only group)."""
        return self.cgroup_layout is None or self.cgroup_layout.controllers

    def _cgroups_usable(self) -> bool:
        """Decide once whether per-task cgroups work under ``cgroup_parent``."""
        if self._cgroup_ok is not None:
            return self._cgroup_ok
        self._cgroup_ok = False
        parent = self.cgroup_parent
        if parent is None:
            return False
        layout = self.cgroup_layout
        if layout is not None and layout.unit is not None:
            self._cgroup_ok = self._enter_delegated(layout)
            return self._cgroup_ok
        root = parent.parent
        if not (root / "cgroup.controllers").is_file():
            log.info("no cgroup v2 at %s; limits via rlimits", root)
            return False
        created = not parent.exists()
        try:
            parent.mkdir(exist_ok=True)
            if not {"memory", "cpu"} <= set((parent / "cgroup.controllers").read_text().split()):
                (root / "cgroup.subtree_control").write_text("+memory +cpu")
            (parent / "cgroup.subtree_control").write_text("+memory +cpu")
        except OSError as exc:
            log.info("cgroup v2 not usable at %s (%s); limits via rlimits", parent, exc)
            if created:
                self._remove_cgroup(parent)
            return False
        log.info("limits via cgroup v2 under %s", parent)
        self._cgroup_ok = True
        return True

    def _enter_delegated(self, layout: CgroupLayout) -> bool:
        """Under systemd's delegation: the engine into its leaf, ``tasks/`` made, controllers
        enabled for it when the layout allows. False (logged) if the subtree is not ours."""
        unit, engine, tasks = layout.unit, layout.engine, layout.tasks
        assert unit is not None and engine is not None
        try:
            engine.mkdir(exist_ok=True)
            if _own_cgroup_dir(layout.mount) != engine:
                (engine / "cgroup.procs").write_text(str(os.getpid()))
            tasks.mkdir(exist_ok=True)
            if layout.controllers:
                wanted = {"memory", "cpu"}
                if not wanted <= set((unit / "cgroup.controllers").read_text().split()):
                    raise OSError(f"{unit} lacks the memory and cpu controllers")
                (unit / "cgroup.subtree_control").write_text("+memory +cpu")
                (tasks / "cgroup.subtree_control").write_text("+memory +cpu")
        except OSError as exc:
            log.warning(
                "cgroup subtree %s delegated by systemd is not usable (%s); limits via rlimits",
                unit,
                exc,
            )
            return False
        how = (
            "memory.max and cpu.max"
            if layout.controllers
            else "no controllers (memory limits via RLIMIT_AS; DelegateSubgroup=engine, "
            "systemd 254+, enables them)"
        )
        log.info(
            "task cgroups under %s, delegated by systemd; engine in %s; %s", tasks, engine, how
        )
        return True

    def _make_cgroup(self, spec: TaskSpec) -> Path | None:
        if self.cgroup_parent is None or not self._cgroups_usable():
            return None
        path = self.cgroup_parent / f"task-{spec.id}"
        memory = spec.limits.memory_mb
        quota = max(_MIN_CPU_QUOTA_US, round(spec.cpu * _CPU_PERIOD_US))
        try:
            path.mkdir(exist_ok=True)
            if not self._cgroup_limits:
                return path
            (path / "memory.max").write_text(str(memory << 20) if memory is not None else "max")
            (path / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")
        except OSError as exc:
            log.warning("%s: cgroup setup at %s failed (%s); using rlimits", spec.id, path, exc)
            self._remove_cgroup(path)
            return None
        return path

    @staticmethod
    def _remove_cgroup(path: Path | None) -> None:
        if path is not None:
            with contextlib.suppress(OSError):  # busy (leftover processes) or already gone
                path.rmdir()

    # small files -------------------------------------------------------------

    @staticmethod
    def _write_json(path: Path, data: Mapping[str, Any]) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    @staticmethod
    def _read_json(path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


# --------------------------------------------------------------------- cgroup layout

#: The leaf the engine lives in, inside its delegated cgroup (``DelegateSubgroup=engine``).
ENGINE_LEAF = "engine"
#: The parent of the task cgroups, inside the delegated cgroup.
TASKS_DIR = "tasks"
_DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where an engine's task cgroups go (see the module docstring)."""

    mode: Literal["subgroup", "delegated", "legacy"]
    mount: Path  # the cgroup v2 mount point
    unit: Path | None  # the cgroup systemd delegated to the unit; None: legacy
    engine: Path | None  # the engine's leaf in it
    tasks: Path  # the task cgroups' parent
    controllers: bool  # memory.max and cpu.max set on task cgroups

    def describe(self) -> str:
        if self.unit is None:
            return f"not delegated: task cgroups under {self.tasks}"
        return f"delegated ({self.mode}): engine in {self.engine}, task cgroups under {self.tasks}"


def unified_path(proc_cgroup: str) -> PurePosixPath | None:
    """The cgroup v2 path in ``/proc/<pid>/cgroup`` text: the ``0::<path>`` line."""
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "" and path.startswith("/"):
            return PurePosixPath(path)
    return None


def cgroup2_mount(mounts: str) -> Path | None:
    """The cgroup v2 mount point in ``/proc/self/mounts`` text (``/sys/fs/cgroup``, or
    ``/sys/fs/cgroup/unified`` on a hybrid host), or None."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1].replace("\\040", " "))
    return None


def plan_layout(
    proc_cgroup: str,
    mount: Path | None,
    delegated: Callable[[Path], bool],
    legacy: Path = LEGACY_CGROUP_PARENT,
) -> CgroupLayout:
    """Where task cgroups go, for a process in ``proc_cgroup`` (``/proc/self/cgroup`` text)
    with the cgroup v2 hierarchy at ``mount``; ``delegated(dir)`` says whether systemd marked
    a cgroup directory as delegated. Pure but for ``delegated``."""
    own = unified_path(proc_cgroup)
    if mount is not None and own is not None and own != PurePosixPath("/"):
        here = mount / own.relative_to("/")
        if own.name == ENGINE_LEAF and delegated(here.parent):
            # DelegateSubgroup=engine: systemd put us in the leaf; the unit's cgroup may
            # enable controllers, a restart lands in the leaf again
            unit = here.parent
            return CgroupLayout("subgroup", mount, unit, here, unit / TASKS_DIR, True)
        if delegated(here):
            return CgroupLayout(
                "delegated", mount, here, here / ENGINE_LEAF, here / TASKS_DIR, False
            )
    return CgroupLayout("legacy", mount or legacy.parent, None, None, legacy, True)


def is_delegated(path: Path) -> bool:
    """Whether systemd marked the cgroup directory ``path`` as delegated (systemd 251+)."""
    for name in _DELEGATE_XATTRS:
        try:
            if os.getxattr(path, name).strip() == b"1":
                return True
        except OSError:  # absent, not readable (trusted.* needs CAP_SYS_ADMIN), unsupported
            continue
    return False


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


@cache
def cgroup_layout() -> CgroupLayout:
    """This process's layout, decided once, from where the process *started*: the engine
    moves itself into its leaf later, which must not read as ``DelegateSubgroup=``."""
    layout = plan_layout(
        _read("/proc/self/cgroup"), cgroup2_mount(_read("/proc/self/mounts")), is_delegated
    )
    log.debug("cgroups: %s", layout.describe())
    return layout


def _own_cgroup_dir(mount: Path) -> Path | None:
    own = unified_path(_read("/proc/self/cgroup"))
    return None if own is None else mount / own.relative_to("/")


# --------------------------------------------------------------------- helpers


def kill_leftovers(
    run_dirs: Iterable[Path], also: Callable[[psutil.Process], bool] | None = None
) -> int:
    """SIGKILL the process group of every task a node started under ``run_dirs``, or that
    ``also`` picks: tasks outlive their engine by design, and whoever ran a fleet of its own
    (a test, the demo, a field test) stops them at the end. A task's wrapper carries its
    exit-record path, inside the run dir, in its argv. Returns how many were found."""
    runs = [str(d) for d in run_dirs]
    me, found = os.getpid(), 0
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            argv = proc.info.get("cmdline") or ()
            ours = any(r in arg for r in runs for arg in argv)
            if not ours and also is not None:
                with contextlib.suppress(psutil.Error):
                    ours = also(proc)
            if ours:
                found += 1
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGKILL)
    return found


def _resolve_command(task_id: str, name: str, path_env: str, cwd: str | None) -> str:
    """The executable ``name`` runs, or :class:`ExecutorError` naming it."""
    if "/" in name:
        full = os.path.join(cwd or os.getcwd(), name)
        if not os.path.isfile(full):
            raise ExecutorError(f"{task_id}: command {name!r} not found")
        if not os.access(full, os.X_OK):
            raise ExecutorError(f"{task_id}: command {name!r} is not executable")
        return full
    found = shutil.which(name, path=path_env)
    if found is None:
        raise ExecutorError(f"{task_id}: command {name!r} not found on PATH ({path_env})")
    return found


def _check_cores(task_id: str, cores: Sequence[int]) -> list[int]:
    cpus = sorted(set(cores))
    if not cpus or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in cpus):
        raise ExecutorError(f"{task_id}: cores must be a non-empty list of core ids >= 0")
    return cpus


def _child_setup(
    rlimits: Sequence[tuple[str, int, int]],
    cpus: list[int] | None,
    cgroup: Path | None,
    memory: int | None,
    err: int,
) -> Callable[[], None]:
    """The preexec function: runs in the forked child before exec, so all of it is inherited
    by the command. Only os-level calls. A failure is written to ``err`` and re-raised; failing
    to join the cgroup is not fatal: the child notes it on ``err`` and falls back to
    ``RLIMIT_AS = memory``."""
    procs = str(cgroup / "cgroup.procs") if cgroup is not None else None

    def setup() -> None:
        step = ""
        try:
            for name, res, value in rlimits:
                step = f"setrlimit({name}, {value})"
                resource.setrlimit(res, (value, value))
            if cpus is not None:
                step = f"sched_setaffinity({cpus})"
                os.sched_setaffinity(0, cpus)
            if procs is not None:
                try:
                    fd = os.open(procs, os.O_WRONLY)
                    try:
                        os.write(fd, str(os.getpid()).encode())
                    finally:
                        os.close(fd)
                except OSError as exc:
                    os.write(err, f"joining cgroup failed: {exc}".encode())
                    if memory is not None:
                        step = f"setrlimit(RLIMIT_AS, {memory})"
                        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        except (OSError, ValueError) as exc:
            os.write(err, f"{step}: {exc}".encode())
            raise

    return setup


def _read_note(fd: int) -> str:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 4096).decode(errors="replace")
    except BlockingIOError:
        return ""


async def _until_exec(popen: subprocess.Popen[bytes], timeout_s: float = 2.0) -> None:
    """Wait until the wrapper's child has exec'd the command (or the wrapper ended).

    Until then a SIGTERM to the group could reach the wrapper before it forked the command,
    or the forked subshell before it reset the wrapper's trap: the command would never see
    it. Once start() returns, stop() is reliable. Typically a few milliseconds.
    """
    deadline = time.monotonic() + timeout_s
    try:
        wrapper = psutil.Process(popen.pid)
        own = wrapper.cmdline()
    except psutil.Error:
        return
    while popen.poll() is None and time.monotonic() < deadline:
        try:
            children = wrapper.children()
        except psutil.Error:
            return
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.cmdline() != own:
                    return
        await asyncio.sleep(0.002)
    if popen.returncode is None:
        log.warning("pid %d: command not exec'd after %.1fs", popen.pid, timeout_s)


def _stat(pid: int) -> tuple[bytes, int, int, int] | None:
    """``(state, ppid, pgrp, start ticks)`` from ``/proc/<pid>/stat``; ``None`` if gone. The
    start time counts clock ticks since boot: unlike psutil's create time, the wall clock
    moving does not change it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def _start_ticks(pid: int, *, zombie_ok: bool = False) -> int | None:
    """Start ticks of a process; ``None`` if it is gone (or a zombie, unless ``zombie_ok``)."""
    st = _stat(pid)
    if st is None or (st[0] in (b"Z", b"X") and not zombie_ok):
        return None
    return st[3]


def _ended(pid: int, ticks: int) -> bool:
    """Whether the process ``(pid, ticks)`` has ended. If it is a zombie child of ours (the
    engine adopted a task it started itself), it is reaped."""
    st = _stat(pid)
    if st is None or st[3] != ticks:
        return True
    if st[0] not in (b"Z", b"X"):
        return False
    if st[1] == os.getpid():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a process group has a member that is not a zombie (zombies wait for their
    reaper, which may be slow: they hold no resources worth waiting for)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[2] == pgid and st[0] not in (b"Z", b"X"):
                return True
    return False


_BOOT_ID: str | None = None


def _boot_id() -> str:
    global _BOOT_ID
    if _BOOT_ID is None:
        try:
            _BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            _BOOT_ID = ""
    return _BOOT_ID
