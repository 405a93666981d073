"""``edgesched upgrade`` / ``rollback``: change the edge sub-engine's release, tasks running.

Role: move a gateway from one installed release to another (the layout of
:mod:`edgesched.install`: ``<prefix>/releases/<version>`` venvs and the ``current`` symlink)
without losing state or stopping tasks. Tasks survive because they run in their own sessions
and the next engine adopts them (see :mod:`edgesched.edge.executor`); only the engine process
is restarted (systemd's ``KillMode=process``, or SIGTERM to the pid in a pidfile).

One transition, for an upgrade and a rollback alike (:func:`_transition`):

1. stop the engine (its tasks keep running);
2. copy the state database with SQLite's backup API to
   ``<state_dir>/backups/edge-<version being left>-<UTC time>.db`` (consistent, checked);
3. for a rollback with ``restore_db``: replace the database with the backup taken when the
   target was left (the newer one stays in the backup of step 2);
4. point ``current`` at the target (a new symlink renamed over the old one), start the engine,
   and wait until its health endpoint answers (the API comes up after recovery, so a healthy
   engine has adopted or requeued every task);
5. if it does not within the timeout (or it exits), stop it and go back: put the database the
   way it was when it no longer fits the release we go back to (a newer engine may have
   migrated its schema), switch ``current`` back, start, wait for health again.

``<prefix>/upgrades.json`` records every transition (from, to, backup, outcome); a rollback
goes back to the release the last successful transition came from. The database schema a
release understands is asked from that release itself (``edgesched.sync.store``'s
``SCHEMA_VERSION``), so a rollback past a schema migration is refused unless told to restore
the backup, which forgets what changed since the upgrade. Successful upgrades keep ``keep``
older releases and prune the rest (and their backups).

Engines run under systemd (``edgesched-edge.service``) or, where there is none, as a detached
process with a pidfile (:class:`PidfileEngine`, which the tests use).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import psutil

from edgesched.bundle import BundleError, host_arch, read_manifest
from edgesched.install import CURRENT, DEFAULT_PREFIX, RELEASES, unit_name

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Engine",
    "Layout",
    "PidfileEngine",
    "RollbackRefused",
    "SystemdEngine",
    "UpgradeError",
    "UpgradeFailed",
    "backup_db",
    "db_schema",
    "rollback",
    "supported_schema",
    "upgrade",
]

DEFAULT_TIMEOUT_S: Final = 60.0
DEFAULT_KEEP: Final = 2
RELEASE_MARKER: Final = ".edgesched-release.json"
HISTORY: Final = "upgrades.json"
DB_NAME: Final = "edge.db"

Progress = Callable[[str], None]


class UpgradeError(Exception):
    """Nothing was changed, or everything was put back; the message says why."""


class RollbackRefused(UpgradeError):
    """The rollback would lose state unless told so; nothing was changed."""


class UpgradeFailed(UpgradeError):
    """The new release did not come up; the previous one runs again (rolled back)."""


# ---------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """The install tree under ``prefix``."""

    prefix: Path = DEFAULT_PREFIX

    @property
    def releases(self) -> Path:
        return self.prefix / RELEASES

    @property
    def current_link(self) -> Path:
        return self.prefix / CURRENT

    @property
    def history_path(self) -> Path:
        return self.prefix / HISTORY

    def release(self, version: str) -> Path:
        return self.releases / version

    def installed(self, version: str) -> bool:
        rel = self.release(version)
        return (rel / RELEASE_MARKER).is_file() and (rel / "bin" / "edgesched").is_file()

    def current(self) -> str | None:
        """The version ``current`` points at, or None."""
        try:
            target = os.readlink(self.current_link)
        except OSError:
            return None
        return Path(target).name

    def switch(self, version: str) -> None:
        """Point ``current`` at ``releases/<version>``: a new link renamed over the old."""
        tmp = self.prefix / f".{CURRENT}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(f"{RELEASES}/{version}", tmp)
        os.replace(tmp, self.current_link)

    def history(self) -> list[dict[str, Any]]:
        try:
            entries: list[dict[str, Any]] = json.loads(self.history_path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, json.JSONDecodeError) as exc:
            raise UpgradeError(
                f"{self.history_path} is unreadable ({exc}); fix or remove it"
            ) from None
        return entries

    def record(self, entries: list[dict[str, Any]]) -> None:
        tmp = self.history_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries, indent=2) + "\n")
        os.replace(tmp, self.history_path)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One upgrade or rollback at a time."""
        with (self.prefix / ".upgrade.lock").open("w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UpgradeError(
                    f"another upgrade or rollback is running on {self.prefix}"
                ) from None
            yield


# --------------------------------------------------------------------------------- engines


class Engine(Protocol):
    """The edge engine's process, however it is supervised."""

    def describe(self) -> str: ...

    def running(self) -> bool: ...

    def stop(self, timeout: float) -> None:
        """Stop the engine process only (never its tasks); return once it is gone."""

    def start(self) -> None:
        """Start ``<prefix>/current/bin/edgesched edge run``."""

    def exited(self) -> str | None:
        """Why the engine started last is no longer running, or None while it runs."""


@dataclass
class SystemdEngine:
    """The engine as a systemd unit whose ``KillMode=process`` leaves tasks alone."""

    unit: str = unit_name("edge")

    def describe(self) -> str:
        return f"systemd unit {self.unit}"

    def _systemctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["systemctl", *args, self.unit],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def running(self) -> bool:
        return self._systemctl("is-active").stdout.strip() in ("active", "activating", "reloading")

    def stop(self, timeout: float) -> None:
        done = self._systemctl("stop", timeout=timeout + 5)
        if done.returncode != 0:
            raise UpgradeError(f"systemctl stop {self.unit}: {done.stderr.strip()}")

    def start(self) -> None:
        done = self._systemctl("start")
        if done.returncode != 0:
            raise UpgradeError(f"systemctl start {self.unit}: {done.stderr.strip()}")

    def exited(self) -> str | None:
        state = self._systemctl("is-active").stdout.strip()
        if state in ("failed", "inactive"):
            return f"{self.unit} is {state} (journalctl -u {self.unit})"
        return None


@dataclass
class PidfileEngine:
    """The engine as a detached process recorded in ``pidfile``, for machines without
    systemd: stopped by SIGTERM to that pid alone, started in its own session."""

    pidfile: Path
    config: Path
    prefix: Path = DEFAULT_PREFIX
    log: Path | None = None  # the engine's output; default: next to the pidfile
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def describe(self) -> str:
        return f"engine with pidfile {self.pidfile}"

    @property
    def log_path(self) -> Path:
        return self.log if self.log is not None else self.pidfile.with_suffix(".log")

    def pid(self) -> int | None:
        """The recorded pid if it is a live ``edgesched ... run`` process, else None (a stale
        pidfile never gets a signal sent to whoever has that pid now)."""
        try:
            pid = int(self.pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            argv = proc.cmdline()
        except psutil.Error:
            return None
        if "run" in argv and any("edgesched" in part for part in argv):
            return pid
        return None

    def running(self) -> bool:
        return self.pid() is not None

    def stop(self, timeout: float) -> None:
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, timeout):
            # The engine alone: its tasks live in sessions of their own.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 10.0)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(1)

    def start(self) -> None:
        exe = self.prefix / CURRENT / "bin" / "edgesched"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [str(exe), "edge", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd="/",
                start_new_session=True,
            )
        tmp = self.pidfile.with_suffix(".tmp")
        tmp.write_text(f"{self._proc.pid}\n")
        os.replace(tmp, self.pidfile)

    def exited(self) -> str | None:
        if self._proc is None or self._proc.poll() is None:
            return None
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            tail = []
        return f"the engine exited with code {self._proc.returncode}:\n" + "\n".join(tail)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


# -------------------------------------------------------------------------------- database


def db_schema(db: Path) -> int:
    """``PRAGMA user_version`` of ``db`` (the edge store's schema version)."""
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def backup_db(db: Path, to: Path) -> Path:
    """A consistent copy of ``db`` at ``to`` through SQLite's backup API (WAL content
    included), checked with ``quick_check`` and written under a temporary name first."""
    to.parent.mkdir(parents=True, exist_ok=True)
    tmp = to.with_name(to.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    src = sqlite3.connect(db)
    try:
        dst = sqlite3.connect(tmp)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            ok = dst.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            dst.close()
    finally:
        src.close()
    if ok != "ok":
        tmp.unlink()
        raise UpgradeError(f"the backup of {db} does not check out ({ok}); nothing was changed")
    os.chmod(tmp, 0o600)  # the node's state: for the engine's owner and root only
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            was = db.stat()
            os.chown(tmp, was.st_uid, was.st_gid)
    os.replace(tmp, to)
    return to


def _replace_db(db: Path, source: Path) -> None:
    """Make ``db`` a copy of ``source`` (engine stopped): fold the WAL in, copy, swap. The
    copy gets the owner and mode ``db`` had (the service user must still write it)."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    was = db.stat()
    fresh = backup_db(source, db.with_name(db.name + ".restoring"))
    os.chmod(fresh, was.st_mode & 0o7777)
    if os.geteuid() == 0:
        os.chown(fresh, was.st_uid, was.st_gid)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            db.with_name(db.name + suffix).unlink()
    os.replace(fresh, db)


def supported_schema(release: Path) -> int:
    """The newest store schema the edgesched in ``release`` (a venv) understands."""
    done = subprocess.run(
        [
            str(release / "bin" / "python"),
            "-c",
            "from edgesched.sync.store import SCHEMA_VERSION; print(SCHEMA_VERSION)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        return int(done.stdout.strip())
    except ValueError:
        raise UpgradeError(
            f"cannot ask {release} which database schema it supports: {done.stderr.strip()}"
        ) from None


# ---------------------------------------------------------------------------------- health


@dataclass(frozen=True)
class Node:
    """Where the engine keeps its state and serves its API (from the edge config)."""

    state_dir: Path
    api_host: str

    @property
    def db(self) -> Path:
        return self.state_dir / DB_NAME

    @classmethod
    def from_config(cls, config: Path) -> Node:
        from edgesched.config import ConfigError, load_config

        try:
            cfg = load_config(config)
        except ConfigError as exc:
            raise UpgradeError(str(exc)) from None
        return cls(Path(cfg.edge.state_dir), cfg.edge.api_host)

    def health(self) -> bool:
        try:
            port = int((self.state_dir / "api-port").read_text())
        except (OSError, ValueError):
            return False
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.api_host, self.api_host)
        host = f"[{host}]" if ":" in host else host
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/v1/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False


def _start_healthy(engine: Engine, node: Node, timeout: float) -> None:
    """Start the engine and wait until its API answers; UpgradeError (engine stopped) if
    it exits or does not answer within ``timeout``."""
    with contextlib.suppress(FileNotFoundError):
        (node.state_dir / "api-port").unlink()  # the old engine's; wait for the new one's
    engine.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.health():
            return
        why = engine.exited()
        if why is not None:
            raise UpgradeError(why)
        time.sleep(0.2)
    engine.stop(10.0)
    raise UpgradeError(f"the engine did not answer on /v1/health within {timeout:g} s")


# ----------------------------------------------------------------------------- transitions


def _now() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _transition(
    layout: Layout,
    engine: Engine,
    node: Node,
    *,
    kind: str,
    old: str,
    new: str,
    restore: Path | None,
    timeout: float,
    progress: Progress,
) -> dict[str, Any]:
    """Steps 1-5 of the module docstring; the history entry on success, UpgradeFailed (the
    old release running again) or UpgradeError on failure."""
    entries = layout.history()
    entry: dict[str, Any] = {
        "kind": kind,
        "from": old,
        "to": new,
        "at": _now(),
        "backup": None,
        "schema_before": None,
        "restored": None,
        "status": "pending",
    }
    progress(f"stopping the {engine.describe()} (its tasks keep running)")
    stopped_at = time.monotonic()
    engine.stop(30.0)
    aside: Path | None = None
    try:
        if node.db.is_file():
            backup = node.state_dir / "backups" / f"edge-{old}-{entry['at']}.db"
            progress(f"backing up {node.db} to {backup}")
            backup_db(node.db, backup)
            entry["backup"] = str(backup)
            entry["schema_before"] = db_schema(backup)
            if restore is not None:
                aside = backup  # the database being left, kept
                progress(f"restoring {restore} (the newer database is kept as {aside})")
                _replace_db(node.db, restore)
                entry["restored"] = str(restore)
    except (OSError, sqlite3.Error, UpgradeError) as exc:
        progress(f"could not back up the database ({exc}); starting {old} again")
        _start_healthy(engine, node, timeout)
        raise UpgradeError(f"database backup failed, nothing changed: {exc}") from exc
    layout.record([*entries, entry])
    progress(f"current -> {new}; starting the engine")
    layout.switch(new)
    try:
        _start_healthy(engine, node, timeout)
    except UpgradeError as exc:
        reason = str(exc)
        progress(f"{new} did not come up ({reason.splitlines()[0]}); going back to {old}")
        engine.stop(30.0)
        _put_back(layout, node, old, entry, aside, progress)
        layout.switch(old)
        try:
            _start_healthy(engine, node, timeout)
        except UpgradeError as again:
            entry["status"] = "failed, going back failed too"
            layout.record([*entries, entry])
            raise UpgradeError(
                f"{new} did not come up ({reason}), and neither did {old} after going back "
                f"({again}); current -> {old}; the backup is {entry['backup']}"
            ) from again
        entry["status"] = "failed, rolled back"
        layout.record([*entries, entry])
        raise UpgradeFailed(
            f"{kind} to {new} failed, {old} runs again and its tasks kept running: {reason}"
        ) from exc
    entry["status"] = "done"
    entry["engine_down_s"] = round(time.monotonic() - stopped_at, 2)
    layout.record([*entries, entry])
    progress(f"{new} is up and healthy; the engine was down {entry['engine_down_s']} s")
    return entry


def _put_back(
    layout: Layout,
    node: Node,
    old: str,
    entry: dict[str, Any],
    aside: Path | None,
    progress: Progress,
) -> None:
    """Give ``old`` back a database it understands after a failed transition."""
    if aside is not None:  # we restored an older one for the new release: put ours back
        progress(f"putting back the database kept as {aside}")
        _replace_db(node.db, aside)
        return
    if entry["backup"] is None or not node.db.is_file():
        return
    if db_schema(node.db) > supported_schema(layout.release(old)):
        progress(f"the failed release migrated the database; restoring {entry['backup']}")
        _replace_db(node.db, Path(entry["backup"]))
        entry["restored"] = entry["backup"]


def _prune(layout: Layout, keep: int, progress: Progress) -> list[str]:
    """Remove releases beyond the ``keep`` most recently left ones (never ``current``) and
    the backups no remaining release can be rolled back with."""
    current = layout.current()
    history = layout.history()
    recency: dict[str, int] = {}
    for i, entry in enumerate(history):
        recency[entry["from"]] = i
        recency[entry["to"]] = i
    others = [
        p.name
        for p in layout.releases.iterdir()
        if p.is_dir() and p.name != current and not p.name.startswith(".")
    ]
    others.sort(key=lambda v: (recency.get(v, -1), layout.release(v).stat().st_mtime))
    removed = others[: max(0, len(others) - keep)]
    for version in removed:
        progress(f"pruning release {version}")
        shutil.rmtree(layout.release(version), ignore_errors=True)
    kept = {current, *others[len(removed) :]}
    for entry in history:
        backup = entry.get("backup")
        if backup and entry["from"] not in kept:
            with contextlib.suppress(FileNotFoundError):
                Path(backup).unlink()
    return removed


@contextlib.contextmanager
def _opened(bundle: Path) -> Iterator[Path]:
    """The bundle directory, extracting a tarball to a temporary directory first."""
    if bundle.is_dir():
        yield bundle
        return
    if not tarfile.is_tarfile(bundle):
        raise UpgradeError(f"--bundle: {bundle} is neither a bundle directory nor a tarball")
    with tempfile.TemporaryDirectory(prefix="edgesched-bundle-") as tmp:
        with tarfile.open(bundle) as tf:
            _extract(tf, Path(tmp))
        found = [p.parent for p in Path(tmp).glob("*/manifest.json")]
        if len(found) != 1:
            raise UpgradeError(f"--bundle: {bundle} holds no single edgesched bundle")
        yield found[0]


def _extract(tf: tarfile.TarFile, dest: Path) -> None:
    """Extract regular files and folders only, all inside ``dest`` (Debian 12's Python
    3.11.2 has no ``filter="data"``)."""
    members = tf.getmembers()
    for m in members:
        inside = Path(os.path.normpath(dest / m.name))
        if not (m.isfile() or m.isdir()) or dest not in inside.parents:
            raise UpgradeError(f"--bundle: unsafe entry {m.name!r} in the tarball; refusing it")
    tf.extractall(dest, members=members)  # every member checked above


def _base_python(release: Path) -> str:
    """The interpreter ``release`` (a venv) was made from, to make the next one alike."""
    cfg: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in (release / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            cfg[key.strip()] = value.strip()
    for candidate in (cfg.get("executable"), cfg.get("home", "") + "/python3"):
        if candidate and Path(candidate).is_file():
            return candidate
    return "python3"


def upgrade(
    bundle: Path,
    *,
    engine: Engine,
    config: Path,
    prefix: Path = DEFAULT_PREFIX,
    timeout: float = DEFAULT_TIMEOUT_S,
    keep: int = DEFAULT_KEEP,
    progress: Progress = lambda _msg: None,
) -> dict[str, Any]:
    """Install ``bundle`` as a release beside the current one and switch to it (module
    docstring); rolls back by itself when the new engine does not come up."""
    if keep < 1:
        raise UpgradeError("--keep: at least 1 (the release being left is the way back)")
    layout = Layout(prefix)
    node = Node.from_config(config)
    old = layout.current()
    if old is None or not layout.installed(old):
        raise UpgradeError(
            f"no installed release at {layout.current_link}: install with the bundle's "
            "install.sh first"
        )
    with layout.lock(), _opened(bundle) as where:
        try:
            manifest = read_manifest(where)
        except BundleError as exc:
            raise UpgradeError(str(exc)) from None
        new = str(manifest["version"])
        if manifest["arch"] != host_arch():
            raise UpgradeError(
                f"the bundle is for {manifest['arch']}, this machine is {host_arch()}"
            )
        if new == old:
            raise UpgradeError(f"{new} is already the current release")
        if layout.installed(new):
            progress(f"release {new} is already installed; reusing it")
        else:
            progress(f"installing release {new} beside {old} (offline, from the bundle)")
            argv = ["sh", str(where / "install.sh"), "--prefix", str(prefix)]
            argv += ["--python", _base_python(layout.release(old)), "--no-switch", "--no-service"]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0 or not layout.installed(new):
                raise UpgradeError(
                    f"installing {new} failed; nothing else was changed:\n"
                    + (done.stderr or done.stdout).strip()
                )
        entry = _transition(
            layout,
            engine,
            node,
            kind="upgrade",
            old=old,
            new=new,
            restore=None,
            timeout=timeout,
            progress=progress,
        )
        entry["pruned"] = _prune(layout, keep, progress)
        return entry


def rollback(
    *,
    engine: Engine,
    config: Path,
    prefix: Path = DEFAULT_PREFIX,
    timeout: float = DEFAULT_TIMEOUT_S,
    restore_db: bool = False,
    progress: Progress = lambda _msg: None,
) -> dict[str, Any]:
    """Go back to the release the current one replaced. RollbackRefused, with nothing
    changed, when the database has a schema that release does not understand and
    ``restore_db`` is not given."""
    layout = Layout(prefix)
    node = Node.from_config(config)
    with layout.lock():
        current = layout.current()
        # "pending": a transition interrupted (power loss) after it switched ``current``.
        came = [
            e for e in layout.history() if e["to"] == current and e["status"] in ("done", "pending")
        ]
        if current is None or not came:
            raise UpgradeError(
                f"no earlier release recorded in {layout.history_path} to roll back to"
            )
        last = came[-1]
        target = str(last["from"])
        if not layout.installed(target):
            raise UpgradeError(f"release {target} is no longer installed (pruned)")
        restore: Path | None = None
        if node.db.is_file():
            have, understood = db_schema(node.db), supported_schema(layout.release(target))
            if have > understood:
                backup = Path(last["backup"]) if last.get("backup") else None
                if not restore_db:
                    raise RollbackRefused(
                        f"{current} migrated the state database to schema {have}; {target} "
                        f"understands up to {understood} and would not start on it. Rolling "
                        f"back needs the backup taken before the move to {current} "
                        f"({backup}): pass --restore-db to use it. That forgets every change "
                        f"since then: tasks submitted, finished or cancelled since {last['at']} "
                        "(their processes keep running, unmanaged). The newer database is "
                        "kept aside. Nothing was changed."
                    )
                if backup is None or not backup.is_file():
                    raise UpgradeError(
                        f"the backup taken before the move to {current} is gone ({backup}); "
                        "cannot roll back past the schema change"
                    )
                restore = backup
        return _transition(
            layout,
            engine,
            node,
            kind="rollback",
            old=current,
            new=target,
            restore=restore,
            timeout=timeout,
            progress=progress,
        )
