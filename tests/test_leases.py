"""Shard ownership by etcd leases (edgesched.central.leases), against a real etcd.

Pure: shard_of is stable and spread; the rendezvous split gives every shard to exactly one
live replica and moves only what a join or a leave must move (hypothesis).

A 3-member etcd cluster on loopback ports, started here: three ShardLeases replicas own every
shard exactly once; a clean exit hands its shards over at once (the lease is revoked); a
replica SIGKILLed in a process of its own is taken over within about the TTL; a write with a
stale fencing token is refused by etcd; etcd down at start and mid-run is retried with one
log line and no traceback, and ownership stops before the lease could be granted elsewhere.

As root: etcd members and replicas in network namespaces (the field tests' Fabric), one
replica killed and one etcd member cut off with the replica beside it; an observer's record
shows no shard unowned longer than TTL + margin, every accepted decision carrying its
owner's token at that revision, and no two replicas ever acting on one shard at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aetcd
import pytest
from etcdcluster import EtcdCluster, etcd_missing
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.central.leases import (
    Fence,
    ShardLeases,
    assign_shards,
    default_margin,
    fenced_write,
    local_deadline,
    parse_endpoint,
    shard_of,
)
from edgesched.ports import free_port

HERE = Path(__file__).parent
TTL = 2.0
MARGIN = default_margin(TTL)
#: How much longer than the TTL a dead owner's shard may stay unowned: etcd 3.4's lessor looks
#: for expired leases every 0.5 s, then the revoke is a raft round and the campaign another.
TAKEOVER_SLACK = 1.0
needs_etcd = pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))


# --- pure ------------------------------------------------------------------------------------


def test_shard_of_is_stable_across_processes_and_pythons() -> None:
    # fixed values: blake2b, not Python's salted hash()
    assert [shard_of(n, 64) for n in ("gw-01", "gw-02", "stor6-3", "")] == [
        shard_of(n, 64) for n in ("gw-01", "gw-02", "stor6-3", "")
    ]
    code = "from edgesched.central.leases import shard_of; print(shard_of('gw-01', 64))"
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert int(other.stdout) == shard_of("gw-01", 64)
    assert shard_of("gw-01", 64) == 30  # pinned: a change would move every node's shard
    assert shard_of("gw-01", 1) == 0
    with pytest.raises(ValueError, match="shards"):
        shard_of("gw-01", 0)


def test_shard_of_spreads_nodes_evenly() -> None:
    counts = Counter(shard_of(f"gw-{i:05d}", 64) for i in range(64_000))
    assert len(counts) == 64
    assert max(counts.values()) < 1_000 * 1.15 and min(counts.values()) > 1_000 * 0.85


replica_ids = st.lists(
    st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12),
    min_size=1,
    max_size=8,
    unique=True,
)


def owner_of(split: dict[str, frozenset[int]]) -> dict[int, str]:
    return {shard: r for r, shards in split.items() for shard in shards}


@settings(max_examples=200, deadline=None)
@given(replicas=replica_ids, shards=st.integers(1, 200))
def test_every_shard_is_owned_by_exactly_one_live_replica(replicas: list[str], shards: int) -> None:
    split = assign_shards(replicas, shards)
    assert set(split) == set(replicas)
    assert sum(len(s) for s in split.values()) == shards
    assert set().union(*split.values()) == set(range(shards))
    # the same on every replica, whatever order it lists the members in
    assert assign_shards(reversed(replicas), shards) == split


@settings(max_examples=200, deadline=None)
@given(replicas=replica_ids, shards=st.integers(1, 200), data=st.data())
def test_a_join_or_a_leave_moves_only_what_it_must(
    replicas: list[str], shards: int, data: st.DataObject
) -> None:
    before = owner_of(assign_shards(replicas, shards))
    newcomer = data.draw(st.text("xyz", min_size=13, max_size=14))  # never in replicas
    joined = owner_of(assign_shards([*replicas, newcomer], shards))
    assert all(joined[s] in (before[s], newcomer) for s in range(shards))
    leaver = data.draw(st.sampled_from(replicas))
    rest = [r for r in replicas if r != leaver]
    left = owner_of(assign_shards(rest, shards)) if rest else {}
    for s in range(shards):
        if before[s] != leaver:
            assert left[s] == before[s]


def test_split_of_64_shards_over_3_replicas_is_roughly_fair() -> None:
    split = assign_shards(["central-a", "central-b", "central-c"], 64)
    assert all(10 <= len(s) <= 32 for s in split.values()), {r: len(s) for r, s in split.items()}
    assert assign_shards([], 8) == {}


def test_local_deadline_ends_before_etcd_can_expire_the_lease() -> None:
    # etcd starts the TTL when it receives the keepalive, after we sent it
    assert local_deadline(100.0, 5.0, 1.0) == 104.0 < 100.0 + 5.0
    assert parse_endpoint("10.0.0.1:2379") == ("10.0.0.1", 2379)
    assert parse_endpoint("[::1]:2379") == ("::1", 2379)
    for bad in ("10.0.0.1", ":2379", "h:0", "h:99999", "h:x"):
        with pytest.raises(ValueError, match="host:port"):
            parse_endpoint(bad)
    with pytest.raises(ValueError, match="ttl_s"):
        ShardLeases("a", ["h:1"], ttl_s=1)
    with pytest.raises(ValueError, match="endpoint"):
        ShardLeases("a", [])


# --- a 3-member cluster on loopback -----------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    if etcd_missing() is not None:
        pytest.skip(str(etcd_missing()))
    with EtcdCluster(tmp_path_factory.mktemp("etcd")) as c:
        yield c


async def until(pred: Any, timeout: float, what: str, interval: float = 0.01) -> float:
    """Poll ``pred`` until true; how long it took."""
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(interval)
    return time.monotonic() - start


def union_owned(replicas: list[ShardLeases]) -> Counter[int]:
    return Counter(s for r in replicas for s in r.owned())


def exactly_once(replicas: list[ShardLeases], shards: int) -> bool:
    counts = union_owned(replicas)
    return set(counts) == set(range(shards)) and set(counts.values()) == {1}


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    return f"/test/{request.node.name}"


@pytest.fixture
async def raw(cluster: EtcdCluster) -> AsyncIterator[Any]:
    host, port = parse_endpoint(cluster.endpoints[0])
    async with aetcd.Client(host=host, port=port, timeout=3) as client:
        yield client


async def owner_keys(raw: Any, prefix: str) -> dict[int, tuple[str, int]]:
    got = await raw.get_prefix(f"{prefix}/shards/".encode())
    return {
        int(kv.key.decode().split("/")[-2]): (kv.value.decode(), kv.create_revision) for kv in got
    }


@needs_etcd
async def test_three_replicas_own_every_shard_once_and_a_clean_exit_hands_over_at_once(
    cluster: EtcdCluster, raw: Any, prefix: str
) -> None:
    shards = 32
    replicas = [
        ShardLeases(f"c{i}", cluster.endpoints, shards=shards, ttl_s=TTL, prefix=prefix)
        for i in range(3)
    ]
    for r in replicas:
        await r.__aenter__()
    try:
        split = assign_shards(["c0", "c1", "c2"], shards)

        def settled() -> bool:
            # every shard owned once can hold on the way (the first replica up still owns
            # shards the split gives to another that has not campaigned yet): wait for the
            # rendezvous split itself
            return exactly_once(replicas, shards) and all(
                set(r.owned()) == split[r.replica_id] for r in replicas
            )

        await until(settled, 10, "every shard owned once, by the rendezvous split")
        for r in replicas:
            assert set(r.owned()) == split[r.replica_id]
        # etcd agrees: each owner key names its owner and its create revision is the token
        keys = await owner_keys(raw, prefix)
        for r in replicas:
            for shard, token in r.owned().items():
                assert keys[shard] == (r.replica_id, token)
        assert all(r.changed.is_set() for r in replicas)

        gone = replicas.pop(0)
        start = time.monotonic()
        await gone.close()
        took = await until(lambda: exactly_once(replicas, shards), 5, "takeover after exit")
        assert not gone.owned()
        print(f"\ntakeover after a clean exit: {took * 1000:.0f} ms (ttl {TTL:g}s)")
        assert time.monotonic() - start < 1.5

        # fenced writes: one etcd round trip each
        shard, _ = next(iter(replicas[0].owned().items()))
        t0 = time.perf_counter()
        for i in range(100):
            assert await replicas[0].fenced_put(shard, f"{prefix}/d/{i}", b"x")
        per_write = (time.perf_counter() - t0) / 100
        print(f"fenced write round trip: {per_write * 1000:.2f} ms (3-member loopback cluster)")
        assert not await replicas[1].fenced_put(shard, f"{prefix}/d/x", b"x")  # not its shard
    finally:
        for r in replicas:
            await r.close()


def start_replica(cluster: EtcdCluster, prefix: str, out: Path, rid: str, shards: int) -> Any:
    return subprocess.Popen(
        [sys.executable, str(HERE / "leases_replica.py"), "replica", "--id", rid,
         "--endpoints", ",".join(cluster.endpoints), "--prefix", prefix,
         "--shards", str(shards), "--ttl", str(TTL), "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=(out.parent / f"{rid}.log").open("ab"),
    )  # fmt: skip


@needs_etcd
async def test_a_killed_replica_is_taken_over_within_the_ttl(
    cluster: EtcdCluster, raw: Any, prefix: str, tmp_path: Path
) -> None:
    shards = 16
    proc = start_replica(cluster, prefix, tmp_path / "k.jsonl", "killed", shards)
    replicas = [
        ShardLeases(f"c{i}", cluster.endpoints, shards=shards, ttl_s=TTL, prefix=prefix)
        for i in range(2)
    ]
    try:
        for r in replicas:
            await r.__aenter__()
        theirs = assign_shards(["killed", "c0", "c1"], shards)["killed"]
        assert theirs

        async def killed_owns() -> bool:
            keys = await owner_keys(raw, prefix)
            return all(keys.get(s, ("",))[0] == "killed" for s in theirs)

        deadline = time.monotonic() + 15
        while not await killed_owns():
            assert time.monotonic() < deadline, "the subprocess replica never owned its shards"
            await asyncio.sleep(0.05)
        await until(lambda: sum(union_owned(replicas).values()) == shards - len(theirs), 5, "")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        took = await until(lambda: exactly_once(replicas, shards), TTL + 2, "takeover after kill")
        print(f"\ntakeover after SIGKILL: {took * 1000:.0f} ms (ttl {TTL:g}s)")
        assert took <= TTL + TAKEOVER_SLACK
    finally:
        if proc.poll() is None:
            proc.kill()
        for r in replicas:
            await r.close()


@needs_etcd
async def test_a_write_with_a_stale_token_is_refused_by_etcd(
    cluster: EtcdCluster, raw: Any, prefix: str
) -> None:
    old = ShardLeases("old", cluster.endpoints, shards=4, ttl_s=TTL, prefix=prefix)
    new = ShardLeases("new", cluster.endpoints, shards=4, ttl_s=TTL, prefix=prefix)
    # a shard the split gives to "new" once "old" registers again (as it does, after its lease
    # is revoked below): new keeps it, so every write below is decided by its fence alone
    shard = min(assign_shards(["old", "new"], 4)["new"])
    async with old:
        await until(lambda: len(old.owned()) == 4, 10, "old owns all")
        stale = old.fence(shard)
        assert stale is not None
        assert await fenced_write(raw, stale, "old", {f"{prefix}/d/ok": b"1"})
        # the old owner's lease ends behind its back (as if etcd expired it), a new owner
        # takes the shard: the old token must never write again
        await raw.revoke_lease(old.lease_id)
        async with new:
            await until(lambda: shard in new.owned(), 5, "new owns the shard")
            fresh = new.fence(shard)
            assert fresh is not None and fresh.token > stale.token
            assert not await fenced_write(raw, stale, "old", {f"{prefix}/d/stale": b"1"})
            # a forged fence with the new token but the old owner's name is refused too
            forged = Fence(shard, fresh.token, stale.owner_key)
            assert not await fenced_write(raw, forged, "old", {f"{prefix}/d/forged": b"1"})
            assert await new.fenced_put(shard, f"{prefix}/d/new", b"1")
            assert await raw.get(f"{prefix}/d/stale".encode()) is None
            assert await raw.get(f"{prefix}/d/forged".encode()) is None
            assert not await old.fenced_put(shard, f"{prefix}/d/old-again", b"1")
            await until(lambda: shard not in old.owned(), 5, "old drops the shard")


@needs_etcd
async def test_etcd_down_at_start_and_mid_run_is_retried_and_stops_acting_in_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edgesched.central.leases")
    solo = EtcdCluster(tmp_path / "solo", size=1, ports=(free_port(), free_port()))
    member = solo.members[0]
    leases = ShardLeases("c0", solo.endpoints, shards=8, ttl_s=TTL, prefix="/solo")
    try:
        async with leases:
            await asyncio.sleep(1.0)  # nothing listens yet
            assert not leases.owned() and not leases.connected
            solo.start()
            await until(lambda: len(leases.owned()) == 8, 10, "owns all once etcd is up")
            solo.kill(member)
            lost = time.monotonic()
            took = await until(lambda: not leases.owned(), TTL + 1, "stops acting")
            # it stops before etcd could have expired its lease (TTL after the last keepalive)
            assert took < TTL - MARGIN + 0.1
            assert time.monotonic() - lost < TTL
            solo.launch(member)
            solo.wait_healthy()
            await until(lambda: len(leases.owned()) == 8, 15, "owns all again")
    finally:
        solo.stop()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings, "an unreachable etcd is logged"
    for record in caplog.records:
        assert record.exc_info is None and "\n" not in record.getMessage()
    assert any(solo.endpoints[0] in r.getMessage() for r in warnings)


# --- network namespaces (root) ----------------------------------------------------------------


def fabric_missing() -> str | None:
    from edgesched.fieldtest.netns import available

    return available() or etcd_missing()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def acting_intervals(
    records: list[dict[str, Any]], end_of: dict[str, float]
) -> dict[int, list[tuple[float, float, str, int]]]:
    """shard -> [(start, end, replica, token)] from the replicas' gain/lose lines; an interval
    still open ends when its process stopped (killed, or its last line)."""
    open_: dict[tuple[str, int], tuple[float, int]] = {}
    out: dict[int, list[tuple[float, float, str, int]]] = {}
    for rec in sorted(records, key=lambda r: r["t"]):
        key = (rec.get("replica", ""), rec.get("shard", -1))
        if rec["ev"] == "gain":
            open_[key] = (rec["t"], rec["token"])
        elif rec["ev"] == "lose" and key in open_:
            start, token = open_.pop(key)
            out.setdefault(key[1], []).append((start, rec["t"], key[0], token))
    for (replica, shard), (start, token) in open_.items():
        out.setdefault(shard, []).append((start, end_of[replica], replica, token))
    return out


def check_history(
    events: list[dict[str, Any]], prefix: str
) -> tuple[int, dict[int, list[tuple[float, float]]]]:
    """Replays etcd's history in revision order: every decision must carry the token and
    the name of its shard's owner at its revision. Returns the decisions checked and, per
    shard, the live unowned gaps (delete -> next put of the owner key) by arrival time."""
    seen: set[tuple[int, str]] = set()
    history = []
    for e in events:
        if e["ev"] == "etcd" and (e["rev"], e["key"]) not in seen:
            seen.add((e["rev"], e["key"]))
            history.append(e)
    history.sort(key=lambda e: e["rev"])
    owners: dict[int, tuple[str, int]] = {}
    deleted_at: dict[int, float] = {}
    gaps: dict[int, list[tuple[float, float]]] = {}
    decisions = 0
    for e in history:
        parts = e["key"].removeprefix(prefix + "/").split("/")
        if parts[0] == "shards" and e["kind"] == "PUT":
            owners[int(parts[1])] = (e["value"], e["create"])
            if e["live"] and int(parts[1]) in deleted_at:
                gaps.setdefault(int(parts[1]), []).append((deleted_at.pop(int(parts[1])), e["t"]))
        elif parts[0] == "shards":
            owners.pop(int(parts[1]), None)
            if e["live"]:
                deleted_at[int(parts[1])] = e["t"]
        elif parts[0] == "decisions":
            d = json.loads(e["value"])
            assert owners.get(d["shard"]) == (d["replica"], d["token"]), (e, owners)
            decisions += 1
    return decisions, gaps


@pytest.mark.skipif(fabric_missing() is not None, reason=f"needs root and etcd: {fabric_missing()}")
async def test_in_namespaces_a_kill_and_a_partition_never_leave_a_shard_doubly_or_long_unowned(
    tmp_path: Path,
) -> None:
    from edgesched.fieldtest.netns import Fabric

    shards, prefix = 16, "/ns"
    with Fabric() as fabric:
        hosts = [fabric.add_host(f"c{i}") for i in range(3)]
        obs = fabric.add_host("obs")
        cluster = EtcdCluster(
            tmp_path / "etcd",
            3,
            ips=[h.ip for h in hosts],
            prefixes=[["ip", "netns", "exec", h.ns] for h in hosts],
            ports=(2379, 2380),
        )
        procs: dict[str, subprocess.Popen[bytes]] = {}
        ended: dict[str, float] = {}
        try:
            cluster.start()
            endpoints = ",".join(cluster.endpoints)
            common = ["--endpoints", endpoints, "--prefix", prefix]
            py = [sys.executable, str(HERE / "leases_replica.py")]
            log = (tmp_path / "procs.log").open("ab")
            procs["obs"] = obs.popen([*py, "observe", *common, "--out", str(tmp_path / "obs")])
            for i, h in enumerate(hosts):
                rid = f"r{i}"
                procs[rid] = h.popen(
                    [*py, "replica", "--id", rid, *common, "--shards", str(shards),
                     "--ttl", str(TTL), "--every", "0.1", "--out", str(tmp_path / rid)],
                    log=log,
                )  # fmt: skip

            def owned_by_all() -> bool:
                recs = [r for i in range(3) for r in read_jsonl(tmp_path / f"r{i}")]
                return len({(r["replica"]) for r in recs if r["ev"] == "gain"}) == 3

            await until(owned_by_all, 20, "all three replicas act", interval=0.1)
            await asyncio.sleep(2)
            procs["r0"].send_signal(signal.SIGKILL)  # r0 dies; its etcd member stays
            procs["r0"].wait()
            ended["r0"] = time.monotonic()
            await asyncio.sleep(TTL + 2)
            fabric.isolate("c1")  # etcd member m1 and replica r1 cut off together
            await asyncio.sleep(TTL * 3)
            fabric.heal("c1")
            await asyncio.sleep(TTL * 2)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for name, proc in procs.items():
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGUSR1)  # its stacks into procs.log
                    time.sleep(0.5)
                    proc.kill()
                ended.setdefault(name, time.monotonic())
            cluster.stop()

    records = [r for i in range(3) for r in read_jsonl(tmp_path / f"r{i}")]
    stops = {r["replica"]: r for r in records if r["ev"] == "stop"}
    assert set(stops) == {"r1", "r2"}, "r1 and r2 stopped cleanly"
    assert sum(s["accepted"] for s in stops.values()) > 100
    intervals = acting_intervals(records, {f"r{i}": ended[f"r{i}"] for i in range(3)})
    assert set(intervals) == set(range(shards))
    worst_gap = 0.0
    for shard, spans in intervals.items():
        spans.sort()
        for (_s1, e1, r1, t1), (s2, _e2, r2, t2) in itertools.pairwise(spans):
            assert s2 >= e1, f"shard {shard}: {r1} (token {t1}) and {r2} (token {t2}) overlap"
            # a replica whose local deadline passed (a keepalive late under load, an etcd
            # leader election) resumes with the same token when the next keepalive is
            # answered: its lease, hence its owner key and that key's create revision, never
            # ended, so nobody else held the shard in between. Another replica can only have
            # created the key anew, at a later revision.
            if r2 != r1:
                assert t2 > t1, f"shard {shard}: {r1} -> {r2}: tokens must grow ({t1}, {t2})"
            else:
                assert t2 >= t1, f"shard {shard}: {r1}'s token went back ({t1}, {t2})"
            worst_gap = max(worst_gap, s2 - e1)
    # r0 killed: its shards wait for its lease to expire (<= TTL after its last keepalive);
    # r1 cut off: it stops acting at its deadline, the others are granted its shards when
    # etcd expires its lease, about the margin later
    assert worst_gap <= TTL + TAKEOVER_SLACK, worst_gap
    decisions, gaps = check_history(read_jsonl(tmp_path / "obs"), prefix)
    assert decisions > 100
    etcd_gaps = [b - a for spans in gaps.values() for a, b in spans]
    assert all(g <= TTL + TAKEOVER_SLACK for g in etcd_gaps), etcd_gaps
    print(
        f"\nnetns: {decisions} fenced decisions checked, worst acting gap {worst_gap:.2f}s, "
        f"worst owner-key gap {max(etcd_gaps, default=0):.3f}s"
    )


# --- [central] etcd_endpoints, shards, lease_ttl_s ---------------------------------------------


def test_central_config_defaults_to_no_etcd_and_reads_the_lease_keys() -> None:
    from edgesched.config import CentralConfig, parse_config

    d = CentralConfig()
    assert (d.etcd_endpoints, d.shards, d.lease_ttl_s) == ((), 64, 5.0)
    c = parse_config(
        {
            "central": {
                "etcd_endpoints": ["10.0.0.1:2379", "etcd-b.example:2379", "[::1]:2379"],
                "shards": 128,
                "lease_ttl_s": 3,
            }
        }
    ).central
    assert c.etcd_endpoints == ("10.0.0.1:2379", "etcd-b.example:2379", "[::1]:2379")
    assert (c.shards, c.lease_ttl_s) == (128, 3.0)
    for endpoint in c.etcd_endpoints:
        parse_endpoint(endpoint)  # what the config accepts, the client can dial


@pytest.mark.parametrize(
    ("central", "needle"),
    [
        ({"etcd_endpoints": ["10.0.0.1"]}, "central: etcd_endpoints: expected host:port"),
        ({"etcd_endpoints": ["h:0"]}, "expected host:port"),
        ({"etcd_endpoints": ["h:70000"]}, "expected host:port"),
        ({"etcd_endpoints": ["h:1", "h:1"]}, "listed twice"),
        ({"etcd_endpoints": "h:1"}, "central.etcd_endpoints: expected an array of strings"),
        ({"etcd_endpoints": [""]}, r"central.etcd_endpoints\[0\]: expected a non-empty string"),
        ({"shards": 0}, "central.shards: must be >= 1"),
        ({"shards": 1.5}, "central.shards: expected an integer"),
        ({"shards": 100_000}, "shards must be in 1..65536"),
        ({"lease_ttl_s": 1}, "central.lease_ttl_s: must be >= 2"),
        ({"lease_ttl_s": "5"}, "central.lease_ttl_s: expected a number"),
        ({"lease_tll_s": 5}, "did you mean 'lease_ttl_s'"),
    ],
)
def test_central_lease_keys_are_validated_with_the_key_named(
    central: dict[str, object], needle: str
) -> None:
    from edgesched.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=needle):
        parse_config({"central": central})
