"""The real engine's shard leases in network namespaces (issue 19; root and etcd needed).

Three hosts, each with one etcd member and one central replica (`edgesched central run`,
16 shards, lease TTL 2 s), and a fourth host with Mosquitto, three edge nodes and an
observer that records etcd's history of the owner keys. A steady stream of tasks goes to
the replicas over REST (each host's API on its own loopback) for the whole run. central-0
is SIGKILLed (its etcd member stays); later host 1 is cut off (its etcd member and
central-1 together) and healed. Work for the dead or cut-off replica's shards is submitted
at once at a survivor, and work is submitted at the cut-off replica itself.

What the replicas logged (``shards held``: each change of what their leases allow, with
both clocks), the decisions in the documents (every assignment's ``decided_by``, ``lease``
and ``at``), the nodes' tasks and etcd's history must show:

- every task placed exactly once (one ``placed`` line over all replicas, epoch 1, one copy
  running on one node), including the work submitted during the outages, after takeover;
  but one exception, the window leases cannot close: a replica placing a task in its last
  moments before the cut (its lease still valid), whose decision never leaves it, and the
  survivor placing it again once it holds the shard. The documents then keep one of the two
  assignments, every replica the same one, and one copy runs;
- every decision made by a replica that held the task's shard with that token at that
  instant, and that token an owner key etcd really granted it;
- no two replicas ever holding one shard at once (the engine acts on a subset of that:
  `_acting`), tokens growing from one owner to the next;
- no shard left with nobody holding it longer than the TTL plus a second.

``EDGESCHED_SLOW=1`` holds each outage 20 s instead of 3 (a longer stream, same checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from conftest import edgesched_binary, kill_task_processes, mosquitto_binary, write_edge_config
from etcdcluster import EtcdCluster, etcd_missing
from test_leases import check_history, read_jsonl

from edgesched.central.leases import assign_shards, shard_of
from edgesched.fieldtest.brokers import broker_config
from edgesched.fieldtest.netns import Fabric, Host, available
from edgesched.fieldtest.runner import Proc, Service


def _missing() -> str | None:
    return available() or etcd_missing()


pytestmark = pytest.mark.skipif(
    _missing() is not None, reason=f"needs root, ip, nft and etcd: {_missing()}"
)

HERE = Path(__file__).parent
SHARDS = 16
TTL = 2.0
#: As in test_leases: etcd 3.4 looks for expired leases every 0.5 s, then a raft round for
#: the revoke and another for the campaign.
TAKEOVER_SLACK = 1.0
#: What cutting off etcd's leader adds: the others elect a new one (an election timeout,
#: 0.5 s here, up to twice that randomised, plus the pre-vote round), and the new leader
#: extends every lease by an election timeout on top of a full TTL (etcd's lessor Promote).
#: The cut replica's lease outlives its local deadline by that much more.
ELECTION_S = 1.5
SLOW = os.environ.get("EDGESCHED_SLOW") == "1"
HOLD_S = 20.0 if SLOW else 3.0  # how long each outage lasts once taken over
SUBMIT_EVERY_S = 0.25
CENTRALS = ("central-0", "central-1", "central-2")
NODES = ("gw-a", "gw-b", "gw-c")
PREFIX = "/edgesched"  # the engine's
MQTT_PORT = 1883
HELD = re.compile(r"shards held (\{.*\})\s*$")
PLACED = re.compile(r"edgesched\.central\.engine: placed: (\S+) on (\S+?):")
#: How long before the cut a decision of the replica cut off may be made and still never
#: leave it: written to its journal (an fsync, slow on a loaded machine), then published.
UNDELIVERED_S = 1.0


def log_wall(line: str) -> float:
    """The wall-clock time of a log line (logging's ``asctime``, local time, milliseconds)."""
    stamp, millis = line[:23].split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def task_body(task_id: str) -> dict[str, Any]:
    return {"id": task_id, "command": ["sleep", "600"], "cpu": 0.01, "mem_gib": 0.01}


@dataclass
class Submission:
    task: str
    at: str  # the replica it was submitted at
    phase: str
    wall: float
    state: str  # the reply's: active (placed at once) or pending


@dataclass
class Interval:
    """A replica holding a shard with one token, on both clocks ([start, end])."""

    replica: str
    shard: int
    token: int
    start: float  # monotonic
    end: float
    start_wall: float
    end_wall: float


@dataclass
class Run:
    """The processes of the run and what the harness did when."""

    fabric: Fabric
    tmp: Path
    hosts: dict[str, Host] = field(default_factory=dict)
    centrals: dict[str, Service] = field(default_factory=dict)
    nodes: dict[str, Service] = field(default_factory=dict)
    submitted: list[Submission] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    targets: list[str] = field(default_factory=lambda: list(CENTRALS))
    phase: str = "steady"
    marks: dict[str, tuple[float, float]] = field(default_factory=dict)  # (mono, wall)
    ended: dict[str, tuple[float, float]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    seq: itertools.count[int] = field(default_factory=itertools.count)

    def mark(self, what: str) -> None:
        self.marks[what] = (time.monotonic(), time.time())

    async def status(self, cid: str) -> dict[str, Any]:
        code, body = await asyncio.to_thread(self.centrals[cid].http, "GET", "/v1/status")
        assert code == 200, body
        return dict(body)

    async def submit(self, task_id: str, at: str) -> Submission | None:
        """One POST /v1/tasks at replica ``at`` (under the lock: a kill never lands mid-way)."""
        async with self.lock:
            wall = time.time()
            try:
                code, reply = await asyncio.to_thread(
                    self.centrals[at].http, "POST", "/v1/tasks", task_body(task_id), timeout=15
                )
            except (OSError, ValueError) as e:
                self.failed.append((task_id, at, repr(e)))
                return None
            if code != 201:
                self.failed.append((task_id, at, f"{code} {reply}"))
                return None
            sub = Submission(task_id, at, self.phase, wall, str(reply["state"]))
            self.submitted.append(sub)
            return sub

    async def stream(self, stop: asyncio.Event) -> None:
        """A task every SUBMIT_EVERY_S, round-robin over the replicas still running."""
        turn = 0
        while not stop.is_set():
            targets = list(self.targets)
            await self.submit(f"t-{next(self.seq):04d}", targets[turn % len(targets)])
            turn += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SUBMIT_EVERY_S)


async def until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``pred`` (plain or async) until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if inspect.isawaitable(last):
                last = await last
        except (OSError, ValueError) as e:  # a service between states
            last = e
        else:
            if last:
                return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}; last={last!r}")


def tasks_in(shards: Iterable[int], prefix: str, n: int) -> list[str]:
    wanted = set(shards)
    ids = (f"{prefix}-{i:03d}" for i in itertools.count())
    return list(itertools.islice((t for t in ids if shard_of(t, SHARDS) in wanted), n))


def central_config(d: Path, cid: str, broker_ip: str, etcd: list[str]) -> tuple[Path, Path]:
    state = d / "state"
    settings = {
        "central_id": cid,
        "state_dir": str(state),
        "api_port": 0,
        "heartbeat_s": 0.5,
        "snapshot_s": 0.5,
        "cycle_s": 0.5,
        "failover_after_s": 60.0,  # the nodes never go; no failover may muddy the count
        "peers": [c for c in CENTRALS if c != cid],
        "etcd_endpoints": etcd,
        "shards": SHARDS,
        "lease_ttl_s": TTL,
    }
    lines = ["[central]"] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    lines += ["[central.mqtt]", f'host = "{broker_ip}"', f"port = {MQTT_PORT}",
              "keepalive_s = 2", "reconnect_max_s = 1.0",
              "allow_plain_remote = true  # the fabric's private bridge"]  # fmt: skip
    config = d / "central.toml"
    config.write_text("\n".join(lines) + "\n")
    return config, state


def etcd_leader(etcd: EtcdCluster) -> int | None:
    """The index of the member that leads etcd now (None: no member answered)."""
    ids: dict[int, int] = {}
    leader = None
    for i, m in enumerate(etcd.members):
        try:
            out = etcd.etcdctl(m, "endpoint", "status", "-w", "json", "--command-timeout=1s")
        except (RuntimeError, subprocess.TimeoutExpired):
            continue
        status = json.loads(out)[0]["Status"]
        ids[int(status["header"]["member_id"])] = i
        leader = int(status["leader"])
    return None if leader is None else ids.get(leader)


def move_leader(etcd: EtcdCluster, to: int) -> bool:
    """Ask etcd to hand its leadership to member ``to``; whether it leads now."""
    now = etcd_leader(etcd)
    if now == to:
        return True
    if now is None:
        return False
    out = etcd.etcdctl(etcd.members[to], "endpoint", "status", "-w", "json")
    target = int(json.loads(out)[0]["Status"]["header"]["member_id"])
    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
        etcd.etcdctl(etcd.members[now], "move-leader", format(target, "x"))
    return etcd_leader(etcd) == to


def held_intervals(
    logs: dict[str, Path], ended: dict[str, tuple[float, float]]
) -> tuple[dict[int, list[Interval]], int]:
    """Each replica's ``shards held`` lines -> per shard, its holding intervals; an interval
    still open ends when the replica's process ended (killed or stopped). Also how many
    lines were read."""
    out: dict[int, list[Interval]] = {}
    lines = 0
    for cid, path in logs.items():
        open_: dict[int, tuple[int, float, float]] = {}
        for line in path.read_text(errors="replace").splitlines():
            m = HELD.search(line)
            if m is None:
                continue
            lines += 1
            rec = json.loads(m.group(1))
            assert rec["replica"] == cid, rec
            now = {int(s): int(t) for s, t in rec["tokens"].items()}
            for shard, (token, start, start_wall) in list(open_.items()):
                if now.get(shard) != token:
                    del open_[shard]
                    out.setdefault(shard, []).append(
                        Interval(cid, shard, token, start, rec["mono"], start_wall, rec["wall"])
                    )
            for shard, token in now.items():
                if shard not in open_:
                    open_[shard] = (token, rec["mono"], rec["wall"])
        end, end_wall = ended[cid]
        for shard, (token, start, start_wall) in open_.items():
            out.setdefault(shard, []).append(
                Interval(cid, shard, token, start, end, start_wall, end_wall)
            )
    for spans in out.values():
        spans.sort(key=lambda i: i.start)
    return out, lines


async def test_a_killed_and_a_cut_off_central_never_leave_a_shard_doubly_or_long_unowned(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    with Fabric() as fabric:
        run = Run(fabric, tmp_path)
        for i in range(3):
            run.hosts[CENTRALS[i]] = fabric.add_host(f"c{i}")
        edge = run.hosts["edge"] = fabric.add_host("edge")  # Mosquitto, the nodes, observer
        central_hosts = [run.hosts[c] for c in CENTRALS]
        # etcd's data on tmpfs where there is one: a shared CI disk's fsync stalls (etcd:
        # "leader failed to send out heartbeat on time ... slow disk") delay lease expiry
        shm = Path("/dev/shm")
        etcd_root = Path(tempfile.mkdtemp(prefix="es-etcd-", dir=shm if shm.is_dir() else None))
        etcd = EtcdCluster(
            etcd_root, 3,
            ips=[h.ip for h in central_hosts],
            prefixes=[["ip", "netns", "exec", h.ns] for h in central_hosts],
            ports=(2379, 2380),
        )  # fmt: skip
        stop_stream = asyncio.Event()
        streaming: asyncio.Task[None] | None = None
        views: dict[str, dict[str, Any]] = {}
        other_views: dict[str, dict[str, Any]] = {}
        on_nodes: dict[str, list[str]] = {}
        try:
            await asyncio.to_thread(etcd.start)
            conf = tmp_path / "mosquitto.conf"
            conf.write_text(broker_config([("127.0.0.1", MQTT_PORT), (edge.ip, MQTT_PORT)]))
            Proc("mosquitto", [mosquitto_binary(), "-c", str(conf)],
                 tmp_path / "mosquitto.log", edge).start()  # fmt: skip
            observer = Proc(
                "observer",
                [sys.executable, str(HERE / "leases_replica.py"), "observe",
                 "--endpoints", ",".join(etcd.endpoints), "--prefix", PREFIX,
                 "--out", str(tmp_path / "etcd-history.jsonl")],
                tmp_path / "observer.log", edge,
            )  # fmt: skip
            observer.start()
            for cid in CENTRALS:
                d = tmp_path / cid
                d.mkdir()
                config, state = central_config(d, cid, edge.ip, etcd.endpoints)
                argv = [edgesched_binary(), "central", "run", "-c", str(config)]
                proc = Proc(cid, argv, d / "central.log", run.hosts[cid])
                proc.start()
                run.centrals[cid] = Service(proc, state)
            for node_id in NODES:
                d = tmp_path / node_id
                d.mkdir()
                config, state = write_edge_config(
                    d, MQTT_PORT, node_id=node_id, centrals=list(CENTRALS),
                    mqtt={"reconnect_max_s": 1.0},
                )  # fmt: skip
                argv = [edgesched_binary(), "edge", "run", "-c", str(config)]
                proc = Proc(node_id, argv, d / "edge.log", edge)
                proc.start()
                run.nodes[node_id] = Service(proc, state)

            async def healthy(svc: Service) -> bool:
                if svc.proc.proc is not None and svc.proc.proc.poll() is not None:
                    raise AssertionError(f"{svc.proc.name} exited: {svc.proc.log.read_text()}")
                code, _ = await asyncio.to_thread(svc.http, "GET", "/v1/health")
                return code == 200

            for svc in [*run.centrals.values(), *run.nodes.values()]:
                await until(partial(healthy, svc), 40, f"{svc.proc.name} up")

            async def split_held(members: tuple[str, ...]) -> bool:
                """Each of ``members`` holds (and acts on) its rendezvous share."""
                split = assign_shards(members, SHARDS)
                for cid in members:
                    shards = (await run.status(cid))["shards"]
                    if set(shards["owned"]) != split[cid] or len(shards["tokens"]) != len(
                        split[cid]
                    ):
                        return False
                return True

            async def nodes_known() -> bool:
                for c in run.centrals.values():
                    code, body = await asyncio.to_thread(c.http, "GET", "/v1/nodes")
                    if code != 200 or len(body["nodes"]) != len(NODES):
                        return False
                return True

            await until(lambda: split_held(CENTRALS), 30, "the three replicas hold the split")
            await until(nodes_known, 30, "every node known to every replica")
            ready = time.monotonic()
            split3 = assign_shards(CENTRALS, SHARDS)

            async def placed(at: str, ids: list[str]) -> dict[str, dict[str, Any]] | None:
                code, body = await asyncio.to_thread(run.centrals[at].http, "GET", "/v1/tasks")
                assert code == 200, body
                got = {v["id"]: v for v in body["tasks"]}
                done = all(
                    got.get(t, {}).get("state") == "active" and got[t].get("running_on")
                    for t in ids
                )
                return got if done else None

            def so_far() -> list[str]:
                return [s.task for s in run.submitted]

            streaming = asyncio.create_task(run.stream(stop_stream))
            await until(lambda: len(run.submitted) >= 8, 15, "the stream started")
            await until(lambda: placed("central-1", so_far()), 30, "steady work placed")

            # --- kill central-0: its lease must expire; work for its shards waits till then
            async with run.lock:
                run.phase = "kill"
                run.targets = ["central-1", "central-2"]
                run.centrals["central-0"].proc.signal(signal.SIGKILL)
                assert run.centrals["central-0"].proc.proc is not None
                await asyncio.to_thread(run.centrals["central-0"].proc.proc.wait, 10)
                run.mark("kill")
                run.ended["central-0"] = run.marks["kill"]
            kill_burst = tasks_in(split3["central-0"], "kill", 4)
            for i, task_id in enumerate(kill_burst):
                await run.submit(task_id, ("central-1", "central-2")[i % 2])
            await until(lambda: split_held(("central-1", "central-2")), TTL + 10, "takeover")
            run.mark("kill-taken-over")
            await until(lambda: placed("central-1", so_far()), 30, "work after the kill placed")
            await asyncio.sleep(HOLD_S)  # the scenario: two replicas for a while

            # --- cut host 1 off: etcd member m1 and central-1 together
            split2 = assign_shards(("central-1", "central-2"), SHARDS)
            # the harder case, every run: m1 leads, so the survivors must elect a new leader
            await until(lambda: asyncio.to_thread(move_leader, etcd, 1), 15, "m1 leading")
            async with run.lock:
                run.phase = "partition"
                fabric.isolate(run.hosts["central-1"].name)
                run.mark("isolate")
            cut_burst = tasks_in(split2["central-1"], "cut", 4)
            for task_id in cut_burst:
                await run.submit(task_id, "central-2")

            async def stopped_acting() -> bool:
                shards = (await run.status("central-1"))["shards"]
                return not shards["owned"] and not shards["tokens"]

            await until(stopped_acting, TTL + 5, "the cut-off replica stops acting")
            run.mark("cut-off-stopped")
            at_cut_off = [f"at-cut-off-{i}" for i in range(3)]  # accepted, left pending
            for task_id in at_cut_off:
                sub = await run.submit(task_id, "central-1")
                assert sub is not None and sub.state == "pending", sub
            await until(lambda: split_held(("central-2",)), TTL + 10, "central-2 takes all")
            run.mark("partition-taken-over")
            at_survivor = [
                s.task for s in run.submitted if (s.at, s.phase) == ("central-2", "partition")
            ]
            await until(lambda: placed("central-2", at_survivor), 30, "work at central-2 placed")
            await asyncio.sleep(HOLD_S)  # the scenario: one replica for a while

            # --- heal: central-1 registers again and takes its share back
            async with run.lock:
                run.phase = "healed"
                fabric.heal(run.hosts["central-1"].name)
                run.mark("heal")
            await until(lambda: split_held(("central-1", "central-2")), 30, "the split again")
            run.mark("healed-split")
            await asyncio.sleep(2.0)  # the scenario: a little work after the heal
            stop_stream.set()
            await streaming
            run.mark("stream-stopped")

            ids = so_far()
            views = await until(lambda: placed("central-2", ids), 40, "every task placed")

            async def agreed() -> dict[str, dict[str, Any]] | None:
                got = await placed("central-1", ids)
                if got is None:
                    return None
                same = all(
                    (got[t]["decided_by"], got[t]["lease"], got[t]["node"])
                    == (views[t]["decided_by"], views[t]["lease"], views[t]["node"])
                    for t in ids
                )
                return got if same else None

            other_views = await until(agreed, 30, "both replicas' documents agree")

            async def running_once() -> dict[str, list[str]] | None:
                where: dict[str, list[str]] = {t: [] for t in ids}
                for node_id, svc in run.nodes.items():
                    code, rows = await asyncio.to_thread(svc.http, "GET", "/v1/tasks")
                    assert code == 200, rows
                    for row in rows:
                        if row["id"] in where and row["state"] == "running":
                            where[row["id"]].append(node_id)
                return where if all(len(n) == 1 for n in where.values()) else None

            on_nodes = await until(running_once, 40, "every task running on one node")
            run.mark("checked")
        finally:
            stop_stream.set()
            if streaming is not None and not streaming.done():
                streaming.cancel()
            for svc in run.centrals.values():  # a clean exit: leases revoked, lines logged
                if svc.proc.proc is not None and svc.proc.proc.poll() is None:
                    await asyncio.to_thread(svc.proc.stop)
                run.ended.setdefault(svc.proc.name, (time.monotonic(), time.time()))
            for svc in run.nodes.values():
                await asyncio.to_thread(svc.proc.stop)
                kill_task_processes(svc.state)
            await asyncio.to_thread(etcd.stop)
            (tmp_path / "etcd").mkdir()
            for member_log in etcd_root.glob("*.log"):
                shutil.copy(member_log, tmp_path / "etcd")
            shutil.rmtree(etcd_root, ignore_errors=True)
    wall = time.monotonic() - began

    # --- the checks ----------------------------------------------------------------------
    assert not run.failed, run.failed
    ids = [s.task for s in run.submitted]
    assert len(ids) == len(set(ids))
    logs = {cid: run.centrals[cid].proc.log for cid in CENTRALS}

    # every task placed exactly once: one placed line over all replicas, epoch 1, one copy;
    # or twice: first by the replica cut off, just before the cut (its decision never left
    # it), then by the survivor after it took the shard over
    placed_by: dict[str, list[tuple[float, str]]] = {}
    for cid, path in logs.items():
        for line in path.read_text(errors="replace").splitlines():
            m = PLACED.search(line)
            if m is not None:
                placed_by.setdefault(m.group(1), []).append((log_wall(line), cid))
    _, cut_wall = run.marks["isolate"]
    twice = {t: sorted(placed_by.get(t, [])) for t in ids if len(placed_by.get(t, [])) != 1}
    for task_id, both in twice.items():
        assert len(both) == 2, (task_id, both)
        (first_at, first_by), (second_at, second_by) = both
        assert first_by == "central-1" and second_by == "central-2", (task_id, both)
        assert cut_wall - UNDELIVERED_S <= first_at, (task_id, both, cut_wall)
        assert second_at > cut_wall + TTL, (task_id, both, cut_wall)
    if twice:
        print(f"\nplaced again after the cut (the cut-off replica's last decisions): {twice}")
    for task_id in ids:
        view = views[task_id]
        assert view["epoch"] == 1 and view["running_on"] == on_nodes[task_id], view
        assert {c["epoch"] for c in view["copies"].values()} == {1}, view
        assert view["node"] == on_nodes[task_id][0], view
        assert other_views[task_id]["decided_by"] == view["decided_by"]

    # who held which shard when, from the replicas' own lines
    intervals, lines = held_intervals(logs, run.ended)
    assert set(intervals) == set(range(SHARDS)), sorted(intervals)
    iso_mono = run.marks["isolate"][0]
    worst: dict[str, tuple[float, str]] = {"kill": (0.0, ""), "cut": (0.0, "")}
    for shard, spans in intervals.items():
        for a, b in itertools.pairwise(spans):
            assert b.start >= a.end, f"shard {shard}: {a} and {b} overlap"
            if b.replica != a.replica:
                assert b.token > a.token, f"shard {shard}: tokens must grow: {a} -> {b}"
            else:  # the same replica resuming under the same lease (see test_leases)
                assert b.token >= a.token, f"shard {shard}: {a} -> {b}"
            outage = "cut" if b.start > iso_mono else "kill"
            if b.start - a.end > worst[outage][0]:
                worst[outage] = (b.start - a.end, f"shard {shard}: {a.replica}->{b.replica}")
    assert worst["kill"][0] <= TTL + TAKEOVER_SLACK, worst
    assert worst["cut"][0] <= TTL + TAKEOVER_SLACK + ELECTION_S, worst

    # every decision made by a replica holding the task's shard with that token, then
    decided_in: dict[str, Interval] = {}
    for task_id in ids:
        view = views[task_id]
        shard = shard_of(task_id, SHARDS)
        holding = [
            i
            for i in intervals[shard]
            if (i.replica, i.token) == (view["decided_by"], view["lease"])
            and i.start_wall <= view["at"] <= i.end_wall
        ]
        assert len(holding) == 1, (task_id, view["decided_by"], view["lease"], view["at"],
                                   intervals[shard])  # fmt: skip
        decided_in[task_id] = holding[0]
    # ...and etcd granted that token to that replica: an owner key it really created
    history = read_jsonl(tmp_path / "etcd-history.jsonl")
    granted = {
        (int(e["key"].split("/")[-2]), e["value"], e["create"])
        for e in history
        if e["ev"] == "etcd" and e["kind"] == "PUT" and e["key"].endswith("/owner")
    }
    for task_id in ids:
        view = views[task_id]
        assert (shard_of(task_id, SHARDS), view["decided_by"], view["lease"]) in granted, view
    for span in (span for spans in intervals.values() for span in spans):
        assert (span.shard, span.replica, span.token) in granted, span
    _, key_gaps = check_history(history, PREFIX)
    worst_key_gap = max((b - a for spans in key_gaps.values() for a, b in spans), default=0.0)
    assert worst_key_gap <= TTL + TAKEOVER_SLACK, key_gaps

    # work submitted during the outages: waiting, then placed after the takeover
    kill_mono, _ = run.marks["kill"]
    subs = {s.task: s for s in run.submitted}
    assert "pending" in [subs[t].state for t in kill_burst], [subs[t] for t in kill_burst]
    for task_id in kill_burst:
        by = decided_in[task_id]
        assert by.replica != "central-0" and by.start > kill_mono, (task_id, by)
    _, isolate_wall = run.marks["isolate"]
    assert "pending" in [subs[t].state for t in cut_burst], [subs[t] for t in cut_burst]
    for task_id in cut_burst:
        assert views[task_id]["at"] > isolate_wall, views[task_id]
    _, heal_wall = run.marks["heal"]
    for task_id in at_cut_off:  # heard of only after the heal
        assert views[task_id]["at"] > heal_wall, views[task_id]

    latency: dict[str, list[float]] = {}
    for s in run.submitted:
        phase = f"{s.phase} at {s.at}" if s.phase == "partition" else s.phase
        latency.setdefault(phase, []).append(views[s.task]["at"] - s.wall)
    by_replica = Counter(views[t]["decided_by"] for t in ids)

    def took(a: str, b: str) -> float:
        return run.marks[b][0] - run.marks[a][0]

    c0_shards = split3["central-0"]
    c1_shards = split2["central-1"]
    kill_takeover = max(
        min(i.start for i in intervals[s] if i.start > kill_mono) - kill_mono for s in c0_shards
    )
    c1_stop = (
        max(
            i.end - iso_mono
            for s in c1_shards
            for i in intervals[s]
            if i.replica == "central-1" and i.start < iso_mono < i.end
        )
        if c1_shards
        else float("nan")
    )
    cut_takeover = max(
        min(i.start for i in intervals[s] if i.replica == "central-2" and i.start > iso_mono)
        - iso_mono
        for s in c1_shards
    )
    print(
        f"\nnetns engine shards: {len(ids)} tasks placed once each "
        f"({dict(sorted(by_replica.items()))}); {lines} 'shards held' lines, "
        f"{sum(len(s) for s in intervals.values())} holding intervals; "
        f"{len(granted)} owner keys granted by etcd\n"
        f"  kill: last of central-0's {len(c0_shards)} shards taken over "
        f"{kill_takeover:.2f}s after the kill (status saw it at "
        f"{took('kill', 'kill-taken-over'):.2f}s)\n"
        f"  cut:  central-1 stopped acting {c1_stop:.2f}s after the cut; central-2 held its "
        f"{len(c1_shards)} shards {cut_takeover:.2f}s after it; split again "
        f"{took('heal', 'healed-split'):.2f}s after the heal\n"
        f"  worst holding gap {worst['kill'][0]:.2f}s after the kill ({worst['kill'][1]}), "
        f"{worst['cut'][0]:.2f}s after the cut ({worst['cut'][1]}); worst owner-key gap "
        f"{worst_key_gap * 1000:.0f} ms\n"
        f"  submit -> placed, max per phase: "
        + ", ".join(f"{p} {max(v):.2f}s (n={len(v)})" for p, v in latency.items())
        + f"\n  wall time {wall:.1f}s (cluster up in {ready - began:.1f}s)"
    )
