"""`edgesched upgrade` / `rollback` for real, with a task running all along.

Three releases are built as real offline bundles (`edgesched bundle --set-version`) from
copies of this source tree: 0.0.1 as it is, 0.0.2 with one more store migration (a newer
schema), and 0.0.3 with that migration and an engine that crashes once it has migrated the
database (a broken release). Each is installed as a real virtual environment (install.sh, no
index): no shortcut through this checkout's venv, so an upgrade here is what it is on a
gateway. The engine runs detached with a pidfile (no systemd here); the upgrades and rollbacks
are run by the installed release's own `edgesched`.

The task (`sleep`) must keep its pid through every step and be adopted by each new engine;
the task rows and the CRDT log must survive; the node's document identity must not change.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import (
    EdgeNode,
    edgesched_binary,
    free_port,
    kill_task_processes,
    write_edge_config,
)

from edgesched.bundle import host_arch
from edgesched.sync.store import SCHEMA_VERSION
from edgesched.upgrade import (
    Layout,
    Node,
    PidfileEngine,
    UpgradeError,
    _extract,
    _prune,
    backup_db,
    db_schema,
)

REPO = Path(__file__).resolve().parents[1]
TARGET_PY = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")

# One more schema step, appended to the copy's sync/store.py (never to this checkout).
NEWER_SCHEMA = """
# test_upgrade: this release's schema is one step newer
MIGRATIONS = (*MIGRATIONS, ("CREATE TABLE upgrade_probe (x INTEGER)",))
SCHEMA_VERSION = len(MIGRATIONS)
"""
# Appended to the copy's edge/engine.py: the store is opened (and migrated), then it dies.
BROKEN_ENGINE = """
# test_upgrade: a release that migrates the database and then fails to start


async def _broken_recover(self: EdgeEngine) -> None:
    raise RuntimeError("test_upgrade: this release is broken on purpose")


EdgeEngine._recover = _broken_recover  # type: ignore[method-assign]
"""


def _source_copy(where: Path, patches: dict[str, str]) -> Path:
    src = where / "source"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in ("app", "core", "edge", "sync", "rest", "central", "policies", "fieldtest"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, tail in patches.items():
        with (src / rel).open("a") as f:
            f.write(tail)
    return src


def _bundle(where: Path, version: str, patches: dict[str, str], tar: bool = False) -> Path:
    src = _source_copy(where, patches) if patches else REPO
    argv = [edgesched_binary(), "bundle", "--arch", host_arch(), "--python", _pyver()]
    argv += ["--source", str(src), "--set-version", version, "--out", str(where / "dist")]
    done = subprocess.run([*argv, *(["--tar"] if tar else [])], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _pyver() -> str:
    assert TARGET_PY is not None
    return subprocess.run(
        [TARGET_PY, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if TARGET_PY is None:
        pytest.skip("no system python3 to make releases with")
    root = tmp_path_factory.mktemp("releases")
    jobs = {
        "0.0.1": (root / "a", {}, False),
        "0.0.2": (root / "b", {"sync/store.py": NEWER_SCHEMA}, False),
        "0.0.3": (
            root / "c",
            {"sync/store.py": NEWER_SCHEMA, "edge/engine.py": BROKEN_ENGINE},
            True,  # a tarball, as shipped
        ),
    }
    started = time.monotonic()
    with ThreadPoolExecutor(3) as pool:
        futures = {v: pool.submit(_bundle, d, v, p, t) for v, (d, p, t) in jobs.items()}
        built = {v: f.result() for v, f in futures.items()}
    print(f"three bundles built in {time.monotonic() - started:.1f} s")
    return built


def _db(db: Path) -> dict[str, Any]:
    """What must survive: the task rows that matter, the CRDT log and snapshots (with their
    epochs), the node's identity, and the schema."""
    conn = sqlite3.connect(db)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return {
            "schema": conn.execute("PRAGMA user_version").fetchone()[0],
            "probe_table": "upgrade_probe" in tables,
            "tasks": {
                r[0]: r[1:]
                for r in conn.execute("SELECT id, spec, pid, pid_started_at, restarts FROM tasks")
            },
            "log": set(conn.execute("SELECT doc, seq, data FROM doc_updates")),
            "snapshots": set(conn.execute("SELECT doc, seq, epoch FROM doc_snapshots")),
            "meta": dict(
                conn.execute("SELECT key, value FROM meta WHERE key IN ('node_id', 'client_id')")
            ),
        }
    finally:
        conn.close()


def _seed_snapshot(db: Path, name: str, epoch: int) -> None:
    """A document snapshot at a later epoch (the node's own has none yet: it is still a log
    of updates), so that epochs have something to lose. A real pycrdt state, in its own
    document, which the engine never opens."""
    from pycrdt import Doc, Map

    doc: Doc[Any] = Doc(client_id=7)
    doc.get("probe", type=Map)["epoch"] = epoch
    conn = sqlite3.connect(db, timeout=10)
    with conn:
        conn.execute(
            "INSERT INTO doc_snapshots (doc, seq, data, epoch) VALUES (?, 0, ?, ?)",
            (name, doc.get_update(), epoch),
        )
    conn.close()


def _intact(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["tasks"]["long"] == before["tasks"]["long"]  # same spec, pid, start, restarts
    assert set(before["tasks"]) <= set(after["tasks"])
    assert before["log"] <= after["log"], "CRDT log rows lost"
    assert before["snapshots"] <= after["snapshots"], "document snapshots or epochs changed"
    assert after["meta"] == before["meta"]


def _gone(pid: int) -> bool:
    """Exited (a zombie of this test process, which started it, counts)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=170)
    print(f"$ {' '.join(argv[1:3])}: exit {done.returncode} in {time.monotonic() - started:.1f} s")
    return done


@dataclass
class Gateway:
    """0.0.1 installed by install.sh, its engine running detached, one long task on it."""

    prefix: Path
    home: Path
    engine: PidfileEngine
    node: Node
    api: EdgeNode
    pid: int = 0  # the task's
    created: float = 0.0
    client_id: int = 0
    before: dict[str, Any] = field(default_factory=dict)  # the database before any upgrade

    @property
    def layout(self) -> Layout:
        return Layout(self.prefix)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The installed release's own `edgesched` (what an operator runs)."""
        exe = str(self.prefix / "current" / "bin" / "edgesched")
        common = ["--prefix", str(self.prefix), "--config", str(self.engine.config)]
        return _run([exe, *args, *common, "--pidfile", str(self.engine.pidfile)], self.home)

    def healthy_engine(self) -> int:
        self.api.wait(self.node.health, 60, "engine health")
        pid = self.engine.pid()
        assert pid is not None
        return pid

    def task(self) -> dict[str, Any]:
        return self.api.tasks()["long"]

    def log_mark(self) -> int:
        return self.engine.log_path.stat().st_size

    def adopted_since(self, mark: int) -> bool:
        return "1 task(s) adopted alive" in self.engine.log_path.read_text()[mark:]

    def same_task(self, version: str) -> None:
        """``version`` is current and the task is the very same process, never restarted."""
        assert self.layout.current() == version
        record = self.task()
        assert record["state"] == "running" and record["pid"] == self.pid, record
        assert record["restarts"] == 0
        assert psutil.Process(self.pid).create_time() == self.created
        assert self.api.get("/v1/status")[1]["document"]["client_id"] == self.client_id


@pytest.fixture
def gateway(bundles: dict[str, Path], tmp_path: Path) -> Iterator[Gateway]:
    assert TARGET_PY is not None
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": f"{Path(TARGET_PY).parent}:/usr/bin:/bin", "HOME": str(home)}
    prefix = tmp_path / "opt" / "edgesched"
    done = subprocess.run(
        ["sh", str(bundles["0.0.1"] / "install.sh"), "--prefix", str(prefix), "--no-service"],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
    )
    assert done.returncode == 0, done.stderr
    config, state = write_edge_config(tmp_path, free_port())
    engine = PidfileEngine(tmp_path / "run" / "edge.pid", config, prefix)
    gw = Gateway(
        prefix, home, engine, Node.from_config(config), EdgeNode(config, state, engine.log_path)
    )
    assert gw.layout.current() == "0.0.1"
    engine.start()
    try:
        gw.healthy_engine()
        status, record = gw.api.request(
            "POST", "/v1/tasks", {"id": "long", "command": ["sleep", "600"], "cpu": 0.5}
        )
        assert status == 201, record
        gw.api.wait(lambda: gw.task()["state"] == "running", 30, "task running")
        gw.pid = gw.task()["pid"]
        gw.created = psutil.Process(gw.pid).create_time()
        gw.client_id = gw.api.get("/v1/status")[1]["document"]["client_id"]
        gw.api.wait(lambda: _db(gw.node.db)["log"], 10, "the CRDT log written")
        _seed_snapshot(gw.node.db, "site-upgrade-probe", epoch=4)
        gw.before = _db(gw.node.db)
        assert gw.before["schema"] == SCHEMA_VERSION and not gw.before["probe_table"]
        assert ("site-upgrade-probe", 0, 4) in gw.before["snapshots"]
        yield gw
    finally:
        engine.stop(15)
        kill_task_processes(state)
        shutil.rmtree(prefix, ignore_errors=True)  # releases of ~300 MB each


def test_upgrade_then_rollback_keep_the_task_running_and_the_database_intact(
    gateway: Gateway, bundles: dict[str, Path]
) -> None:
    gw = gateway
    first_engine = gw.healthy_engine()

    # 1. Upgrade to a release with a newer schema: the task is adopted, rows survive.
    mark = gw.log_mark()
    done = gw.cli("upgrade", "--bundle", str(bundles["0.0.2"]))
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)
    assert (entry["from"], entry["to"], entry["status"]) == ("0.0.1", "0.0.2", "done")
    print(f"upgrade: engine down {entry['engine_down_s']} s, task never stopped")
    second_engine = gw.healthy_engine()
    assert second_engine != first_engine and _gone(first_engine)
    gw.same_task("0.0.2")
    assert gw.adopted_since(mark)
    upgraded = _db(gw.node.db)
    assert upgraded["schema"] == SCHEMA_VERSION + 1 and upgraded["probe_table"]
    _intact(gw.before, upgraded)
    backup = Path(entry["backup"])
    assert backup.name.startswith("edge-0.0.1-") and db_schema(backup) == SCHEMA_VERSION
    _intact(gw.before, _db(backup))

    # 2. A plain rollback would hand 0.0.1 a schema it does not know: refused, untouched.
    done = gw.cli("rollback")
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    for words in ("schema", "--restore-db", "forgets every change", "Nothing was changed"):
        assert words in message, message
    assert gw.engine.pid() == second_engine
    gw.same_task("0.0.2")

    # 3. Told to restore the backup: back on 0.0.1 with the pre-upgrade database, owned
    # like the database it replaces (a service user must be able to write it).
    if os.geteuid() == 0:
        os.chown(gw.node.db, 65534, 65534)
    mark = gw.log_mark()
    done = gw.cli("rollback", "--restore-db")
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)
    assert entry["restored"] == str(backup)
    print(f"rollback --restore-db: engine down {entry['engine_down_s']} s")
    gw.healthy_engine()
    gw.same_task("0.0.1")
    assert gw.adopted_since(mark)
    restored = _db(gw.node.db)
    if os.geteuid() == 0:
        assert (gw.node.db.stat().st_uid, gw.node.db.stat().st_gid) == (65534, 65534)
    assert restored["schema"] == SCHEMA_VERSION and not restored["probe_table"]
    _intact(gw.before, restored)
    statuses = [(e["kind"], e["to"], e["status"]) for e in gw.layout.history()]
    assert statuses == [("upgrade", "0.0.2", "done"), ("rollback", "0.0.1", "done")]


def test_a_broken_release_is_rolled_back_by_itself_and_the_task_runs_on(
    gateway: Gateway, bundles: dict[str, Path]
) -> None:
    gw = gateway
    first_engine = gw.healthy_engine()
    # It migrates the database, then dies: the upgrade puts the database and 0.0.1 back.
    done = gw.cli("upgrade", "--bundle", str(bundles["0.0.3"]), "--timeout", "30")
    assert done.returncode == 1, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "upgrade to 0.0.3 failed, 0.0.1 runs again" in message, message
    assert "broken on purpose" in message
    assert "migrated the database; restoring" in message
    second_engine = gw.healthy_engine()
    assert second_engine != first_engine and _gone(first_engine)
    gw.same_task("0.0.1")
    after = _db(gw.node.db)
    assert after["schema"] == SCHEMA_VERSION and not after["probe_table"]
    _intact(gw.before, after)
    statuses = [(e["kind"], e["to"], e["status"]) for e in gw.layout.history()]
    assert statuses == [("upgrade", "0.0.3", "failed, rolled back")]
    # Nothing to roll back to: the failed upgrade is no transition that happened.
    done = gw.cli("rollback")
    assert done.returncode == 2 and "no earlier release recorded" in done.stderr


# -- the parts, quickly ----------------------------------------------------------------------


def test_backup_is_consistent_while_a_writer_commits(tmp_path: Path) -> None:
    db = tmp_path / "edge.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (n INTEGER PRIMARY KEY, pair INTEGER NOT NULL)")
    conn.execute("PRAGMA user_version = 7")
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)\n"
            "for i in range(20000):\n"
            "    c.execute('BEGIN'); c.execute('INSERT INTO t VALUES (?, ?)', (2*i, 2*i+1))\n"
            "    c.execute('INSERT INTO t VALUES (?, ?)', (2*i+1, 2*i)); c.execute('COMMIT')\n",
            str(db),
        ]
    )
    try:
        copies = []
        for i in range(5):
            time.sleep(0.05)
            copies.append(backup_db(db, tmp_path / f"copy-{i}.db"))
    finally:
        writer.kill()
        writer.wait()
    counts = []
    for copy in copies:
        assert sorted(p.name for p in tmp_path.glob(copy.name + "*")) == [copy.name]  # one file
        c = sqlite3.connect(copy)
        (n,) = c.execute("SELECT count(*) FROM t").fetchone()
        assert n % 2 == 0  # never half a transaction
        assert c.execute("PRAGMA user_version").fetchone()[0] == 7
        counts.append(n)
        c.close()
    assert counts == sorted(counts) and counts[-1] > 0


def test_switch_is_a_rename_and_prune_keeps_the_newest(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    for v in ("1.0", "1.1", "1.2", "1.3"):
        (layout.release(v) / "bin").mkdir(parents=True)
    layout.switch("1.0")
    assert os.readlink(layout.current_link) == "releases/1.0"
    layout.switch("1.3")
    assert os.readlink(layout.current_link) == "releases/1.3"
    assert not list(tmp_path.glob(".current.*"))
    backups = tmp_path / "backups"
    backups.mkdir()
    entries = []
    for old, new in (("1.0", "1.1"), ("1.1", "1.2"), ("1.2", "1.3")):
        b = backups / f"edge-{old}.db"
        b.write_text("x")
        entries.append({"from": old, "to": new, "backup": str(b), "status": "done"})
    layout.record(entries)
    assert _prune(layout, 2, lambda _m: None) == ["1.0"]
    assert sorted(p.name for p in layout.releases.iterdir()) == ["1.1", "1.2", "1.3"]
    assert sorted(p.name for p in backups.iterdir()) == ["edge-1.1.db", "edge-1.2.db"]


def test_a_stale_pidfile_never_signals_a_stranger(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        pidfile = tmp_path / "edge.pid"
        pidfile.write_text(f"{stranger.pid}\n")
        engine = PidfileEngine(pidfile, tmp_path / "edge.toml", tmp_path)
        assert engine.pid() is None and not engine.running()
        engine.stop(1.0)
        assert stranger.poll() is None
    finally:
        stranger.send_signal(signal.SIGKILL)
        stranger.wait()


def test_unsafe_tarball_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    payload = tmp_path / "payload"
    payload.write_text("x")
    with tarfile.open(evil, "w:gz") as tf:
        tf.add(payload, arcname="../escaped")
    with tarfile.open(evil) as tf, pytest.raises(UpgradeError, match="unsafe entry"):
        _extract(tf, tmp_path / "into")
    assert not (tmp_path / "escaped").exists()


def test_upgrade_without_an_install_or_with_a_bad_bundle_is_refused(tmp_path: Path) -> None:
    config, _ = write_edge_config(tmp_path, free_port())
    argv = [edgesched_binary(), "upgrade", "--bundle", str(tmp_path), "--prefix", str(tmp_path)]
    argv += ["--config", str(config), "--pidfile", str(tmp_path / "e.pid")]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 2
    assert "no installed release" in done.stderr and "install.sh" in done.stderr
    (tmp_path / "releases" / "1.0" / "bin").mkdir(parents=True)
    (tmp_path / "releases" / "1.0" / "bin" / "edgesched").touch()
    (tmp_path / "releases" / "1.0" / ".edgesched-release.json").write_text("{}")
    Layout(tmp_path).switch("1.0")
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 2
    assert "is not an edgesched bundle" in done.stderr and "Traceback" not in done.stderr
