"""Shard ownership for central replicas, by etcd leases ([scaling.md](../docs/scaling.md)).

The fleet is split into ``shards`` shards (:func:`shard_of`: a node's shard, the same on every
replica and every Python). Each live central replica owns a share of them, decided by
rendezvous hashing over the live replica ids (:func:`assign_shards`, pure: every replica
computes the same split, and a replica joining or leaving moves only the shards it gains or
loses). Ownership itself is not decided here but granted by etcd:

- a replica holds one etcd lease (``ttl_s``) and keeps it alive; its membership key
  ``<prefix>/members/<id>`` is bound to it;
- for each shard the split gives it, it campaigns for ``<prefix>/shards/<n>/owner`` with a
  create-if-absent transaction bound to the same lease, and deletes the ones it should no
  longer hold (after it has stopped acting on them);
- the owner key's create revision is the shard's **fencing token**: every decision is written
  with a transaction comparing it (:meth:`ShardLeases.fenced_put`), so a replica whose lease
  is gone can never write as the owner, whatever its clock says;
- locally a replica considers itself owner only until ``last successful keepalive (sent) +
  TTL - safety margin`` on the monotonic clock: etcd cannot expire the lease before that
  instant, so a replica cut off from etcd stops acting before another can be granted its
  shards.

:class:`ShardLeases` is the effectful part, one per replica: an async context manager whose
background task connects (rotating through the endpoints, backing off, logging one line per
problem), keeps the lease alive, watches membership and owner keys, and campaigns or releases.
On a clean exit it revokes the lease, so the other replicas take over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Self

import aetcd
import aetcd.rpc

log = logging.getLogger("edgesched.central.leases")

#: Errors that mean "etcd did not answer as it should": logged in one line and retried.
ETCD_ERRORS: tuple[type[BaseException], ...] = (
    aetcd.ClientError,
    aetcd.rpc.RpcError,  # grpc's, re-exported
    aetcd.rpc.AioRpcError,
    OSError,
    TimeoutError,
)


# --- pure: shards and the fair split ---------------------------------------------------------


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def shard_of(node_id: str, shards: int) -> int:
    """The shard of ``node_id`` among ``shards``: blake2b of the id, the same everywhere
    (Python's ``hash`` is salted per process; this is not)."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    return _hash64(node_id) % shards


def assign_shards(replicas: Iterable[str], shards: int) -> dict[str, frozenset[int]]:
    """Which shards each live replica should own: rendezvous (highest random weight) hashing.

    Shard ``n`` goes to the replica with the largest ``blake2b(f"{n}/{replica}")``. Every
    replica that sees the same live set computes the same split; when a replica joins, the
    only shards that move are those it takes, and when one leaves, only its own move. Every
    replica id gets an entry (possibly empty); no replicas, no owners."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    ids = sorted(set(replicas))
    out: dict[str, set[int]] = {r: set() for r in ids}
    if ids:
        for n in range(shards):
            best = max(ids, key=lambda r: (_hash64(f"{n}/{r}"), r))
            out[best].add(n)
    return {r: frozenset(s) for r, s in out.items()}


def parse_endpoint(text: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:2379"`` for IPv6) -> (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"etcd endpoint must be host:port, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def local_deadline(sent_at: float, ttl_s: float, margin_s: float) -> float:
    """Until when a replica may act on its shards after a keepalive *sent* at ``sent_at``
    (monotonic) was answered with ``ttl_s``: etcd counts the TTL from when it received the
    request, which is later, so the lease cannot expire before ``sent_at + ttl_s``; the margin
    covers clock-rate drift and the time to stop acting."""
    return sent_at + ttl_s - margin_s


def default_margin(ttl_s: float) -> float:
    """The safety margin for a TTL: a fifth of it, at least 0.3 s."""
    return max(0.3, ttl_s / 5)


# --- the effectful part ----------------------------------------------------------------------


class LeaseUnavailable(ConnectionError):
    """etcd did not answer a fenced write: its outcome is unknown (it may have been applied);
    retry it (idempotently) or let the next owner redo it."""


class _LeaseLost(Exception):
    """etcd says our lease no longer exists (it expired while we were cut off)."""


@dataclass(frozen=True, slots=True)
class Fence:
    """What a decision carries to prove it was made by the shard's owner: the shard, its
    owner key and the fencing token (the owner key's create revision)."""

    shard: int
    token: int
    owner_key: str


class ShardLeases:
    """One central replica's shard ownership, granted by etcd leases.

    ::

        async with ShardLeases("central-a", ["10.0.0.1:2379"], shards=64) as leases:
            while True:
                await leases.changed.wait(); leases.changed.clear()
                mine = leases.owned()          # {shard: fencing token}
                ...
                ok = await leases.fenced_put(shard, key, value)

    ``owned()`` is empty until etcd grants something and again as soon as the local deadline
    passes. ``changed`` is set (and ``on_change`` called with the new mapping) whenever what
    ``owned()`` returns changes, expiry included.
    """

    def __init__(
        self,
        replica_id: str,
        endpoints: Sequence[str],
        *,
        shards: int = 64,
        ttl_s: float = 5.0,
        prefix: str = "/edgesched",
        margin_s: float | None = None,
        rpc_timeout_s: float | None = None,
        reconnect_max_s: float | None = None,
        on_change: Callable[[Mapping[int, int]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        if not ttl_s >= 2:
            raise ValueError(f"ttl_s must be >= 2 (etcd's minimum lease), got {ttl_s}")
        self.replica_id = replica_id
        self.endpoints = [parse_endpoint(e) for e in endpoints]
        self.shards = shards
        self.ttl_s = ttl_s
        self.prefix = prefix.rstrip("/")
        self.margin_s = default_margin(ttl_s) if margin_s is None else margin_s
        if not 0 < self.margin_s < ttl_s / 2:
            raise ValueError(f"margin_s must be in (0, ttl_s/2), got {self.margin_s}")
        self.rpc_timeout_s = rpc_timeout_s or min(2.0, max(0.3, ttl_s / 6))
        self.reconnect_max_s = reconnect_max_s or min(2.0, ttl_s / 2)
        self.keepalive_s = ttl_s / 4
        self.on_change = on_change
        self.clock = clock
        self.changed = asyncio.Event()
        self.members: dict[str, int] = {}  # live replica id -> its lease (as last seen)
        self.lease_id = 0
        self.connected = False
        self._held: dict[int, int] = {}  # shard -> token, as etcd granted it
        self._owners: dict[int, tuple[str, int]] = {}  # shard -> (owner, create revision)
        self._deadline = -math.inf
        self._expiry: asyncio.TimerHandle | None = None
        self._published: dict[int, int] = {}
        self._client: Any = None
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_endpoint = 0

    # --- keys --------------------------------------------------------------------------

    @property
    def members_prefix(self) -> str:
        return f"{self.prefix}/members/"

    @property
    def shards_prefix(self) -> str:
        return f"{self.prefix}/shards/"

    def owner_key(self, shard: int) -> str:
        return f"{self.shards_prefix}{shard}/owner"

    def _shard_from_key(self, key: bytes) -> int | None:
        text = key.decode(errors="replace")
        rest = text.removeprefix(self.shards_prefix)
        number, _, tail = rest.partition("/")
        if rest == text or tail != "owner" or not number.isdigit():
            return None
        return int(number)

    # --- what the engine reads ---------------------------------------------------------

    def owned(self) -> Mapping[int, int]:
        """The shards this replica may act on now -> their fencing tokens (read-only)."""
        if self.clock() >= self._deadline:
            return MappingProxyType({})
        return MappingProxyType(dict(self._held))

    def fence(self, shard: int) -> Fence | None:
        """The fence a decision about ``shard`` must carry, or None if not ours now."""
        token = self.owned().get(shard)
        return None if token is None else Fence(shard, token, self.owner_key(shard))

    def valid_for(self) -> float:
        """Seconds left before this replica must stop acting without a new keepalive."""
        return max(0.0, self._deadline - self.clock())

    def desired(self) -> frozenset[int]:
        """The shards the fair split gives this replica among the members it sees."""
        if self.replica_id not in self.members:
            return frozenset()
        return assign_shards(self.members, self.shards)[self.replica_id]

    async def fenced_put(self, shard: int, key: str, value: bytes) -> bool:
        """Write ``key`` only if this replica still owns ``shard`` (one etcd transaction
        comparing the owner key's create revision with our token and its value with our id).
        False: refused (not ours locally, or etcd says the token is stale, and then the shard
        is dropped at once). :class:`LeaseUnavailable`: no answer, outcome unknown."""
        return await self.fenced_puts(shard, {key: value})

    async def fenced_puts(self, shard: int, items: Mapping[str, bytes]) -> bool:
        """:meth:`fenced_put` of several keys in one atomic transaction."""
        fence = self.fence(shard)
        if fence is None:
            return False
        client = self._client
        if client is None:
            raise LeaseUnavailable(f"fenced write for shard {shard}: not connected to etcd")
        try:
            ok = await fenced_write(client, fence, self.replica_id, items)
        except ETCD_ERRORS as e:
            raise LeaseUnavailable(f"fenced write for shard {shard}: {_describe(e)}") from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller is being cancelled
            # grpc cancels calls on a channel that is closed under them (the session ended)
            raise LeaseUnavailable(f"fenced write for shard {shard}: connection closed") from None
        if not ok and self._held.get(shard) == fence.token:
            log.warning("shard %d: etcd refused token %d; dropping it", shard, fence.token)
            del self._held[shard]
            self._publish()
            self._dirty.set()
        return bool(ok)

    # --- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"shard-leases-{self.replica_id}"
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop acting, stop the background task, revoke the lease (immediate takeover)."""
        self._held.clear()
        self._set_deadline(-math.inf)
        if self._task is not None:
            self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=5.0)
            if not done:
                log.warning("%s: the leases task did not stop within 5s", self.replica_id)
            self._task = None
        if self._expiry is not None:
            self._expiry.cancel()
        if self.lease_id:
            await self._revoke(self.lease_id)
            self.lease_id = 0

    async def _revoke(self, lease_id: int) -> None:
        for host, port in self._endpoint_order():
            client = self._new_client(host, port)
            try:
                await client.revoke_lease(lease_id)
                log.info("%s: lease revoked; shards free for the others", self.replica_id)
                return
            except ETCD_ERRORS as e:
                log.warning("revoke via %s:%d failed: %s", host, port, _describe(e))
            finally:
                await _close(client)
        log.warning("lease not revoked: its shards are free when it expires (<= %gs)", self.ttl_s)

    # --- the background task -----------------------------------------------------------

    def _endpoint_order(self) -> list[tuple[str, int]]:
        i = self._next_endpoint % len(self.endpoints)
        return self.endpoints[i:] + self.endpoints[:i]

    def _new_client(self, host: str, port: int) -> Any:
        client = aetcd.Client(host=host, port=port, timeout=self.rpc_timeout_s)
        # a member without a leader refuses at once instead of serving stale reads or
        # holding a watch that never fires
        client.metadata = (("hasleader", "true"),)
        return client

    async def _run(self) -> None:
        failures = 0
        while True:
            host, port = self.endpoints[self._next_endpoint % len(self.endpoints)]
            self._next_endpoint += 1
            client = self._new_client(host, port)
            try:
                await self._session(client, f"{host}:{port}")
            except _LeaseLost:
                log.warning(
                    "%s: etcd says our lease expired (cut off longer than %gs): shards "
                    "dropped, registering again",
                    self.replica_id,
                    self.ttl_s,
                )
                self._lose_lease()
                failures = 0
                continue
            except ETCD_ERRORS as e:
                # a session that was up tries the next endpoint at once; a round of endpoints
                # that all failed backs off
                failures = 1 if self.connected else failures + 1
                state = (
                    f"acting on {len(self.owned())} shards for {self.valid_for():.1f}s more"
                    if self.owned()
                    else "acting on no shard"
                )
                log.warning(
                    "%s: etcd %s:%d: %s (%s)", self.replica_id, host, port, _describe(e), state
                )
            except Exception:  # a bug, not etcd: say so loudly, and keep trying
                failures += 1
                log.exception("%s: shard leases session failed", self.replica_id)
            finally:
                self.connected = False
                self._client = None
                await _close(client)
            if failures and failures % len(self.endpoints) == 0:
                rounds = failures // len(self.endpoints)
                cap = min(self.reconnect_max_s, 0.1 * 2**rounds)
                await asyncio.sleep(random.uniform(cap / 2, cap))

    def _lose_lease(self) -> None:
        self.lease_id = 0
        self._held.clear()
        self._set_deadline(-math.inf)

    async def _session(self, client: Any, where: str) -> None:
        """One connection: lease, registration, snapshot, then keepalive + watches +
        reconcile until something fails (it raises). Returns only by raising."""
        await client.connect()
        if self.lease_id:
            await self._keepalive_once(client)
        else:
            sent = self.clock()
            lease = await client.lease(math.ceil(self.ttl_s))
            self.lease_id = int(lease.id)
            self._set_deadline(local_deadline(sent, float(lease.ttl), self.margin_s))
        await client.put(
            f"{self.members_prefix}{self.replica_id}".encode(),
            json.dumps({"replica": self.replica_id}).encode(),
            self.lease_id,
        )
        members = await client.get_prefix(self.members_prefix.encode())
        owners = await client.get_prefix(self.shards_prefix.encode())
        self.members = {}
        for kv in members:
            self._member_put(kv)
        self._owners = {}
        mine: dict[int, int] = {}
        for kv in owners:
            self._owner_put(kv)
            shard = self._shard_from_key(kv.key)
            if shard is not None and (kv.value.decode(), kv.lease) == (
                self.replica_id,
                self.lease_id,
            ):
                mine[shard] = int(kv.create_revision)
        self._held = mine
        self._client = client
        self.connected = True
        log.info(
            "%s: etcd %s: lease %x, %d members, holding %d shards",
            self.replica_id,
            where,
            self.lease_id,
            len(self.members),
            len(mine),
        )
        self._publish()
        watch_members = await client.watch_prefix(
            self.members_prefix.encode(), start_revision=members.header.revision + 1
        )
        watch_owners = await client.watch_prefix(
            self.shards_prefix.encode(), start_revision=owners.header.revision + 1
        )
        self._dirty.set()
        await _first_failure(
            self._keepalive_loop(client),
            self._follow(watch_members, self._member_event),
            self._follow(watch_owners, self._owner_event),
            self._reconcile_loop(client),
        )

    async def _keepalive_once(self, client: Any) -> None:
        sent = self.clock()
        reply = await client.refresh_lease(self.lease_id)
        if reply is None or reply.TTL <= 0:
            raise _LeaseLost
        self._set_deadline(max(self._deadline, local_deadline(sent, reply.TTL, self.margin_s)))

    async def _keepalive_loop(self, client: Any) -> None:
        while True:
            await asyncio.sleep(self.keepalive_s)
            await self._keepalive_once(client)

    async def _follow(self, watch: Any, handle: Callable[[Any], None]) -> None:
        try:
            async for event in watch:
                handle(event)
                self._dirty.set()
        finally:
            with contextlib.suppress(*ETCD_ERRORS, RuntimeError):
                await asyncio.wait_for(watch.cancel(), self.rpc_timeout_s)
        raise ConnectionError("watch ended")

    def _member_put(self, kv: Any) -> None:
        self.members[kv.key.decode().removeprefix(self.members_prefix)] = int(kv.lease)

    def _member_event(self, event: Any) -> None:
        if event.kind == "PUT":
            self._member_put(event.kv)
        else:
            self.members.pop(event.kv.key.decode().removeprefix(self.members_prefix), None)

    def _owner_put(self, kv: Any) -> None:
        shard = self._shard_from_key(kv.key)
        if shard is not None:
            self._owners[shard] = (kv.value.decode(), int(kv.create_revision))

    def _owner_event(self, event: Any) -> None:
        shard = self._shard_from_key(event.kv.key)
        if shard is None:
            return
        if event.kind == "PUT":
            self._owner_put(event.kv)
            owner, token = self._owners[shard]
            if shard in self._held and (owner, token) != (self.replica_id, self._held[shard]):
                del self._held[shard]  # overwritten by hand: not ours any more
                self._publish()
        else:
            self._owners.pop(shard, None)
            if shard in self._held:
                log.warning("%s: shard %d's owner key was deleted", self.replica_id, shard)
                del self._held[shard]
                self._publish()

    async def _reconcile_loop(self, client: Any) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.ttl_s / 2)
            self._dirty.clear()
            await self._reconcile(client)

    async def _reconcile(self, client: Any) -> None:
        want = self.desired()
        for shard in sorted(set(self._held) - want):
            await self._release(client, shard)
        for shard in sorted(want - set(self._held)):
            owner = self._owners.get(shard)
            if shard not in self._held and (owner is None or owner[0] == self.replica_id):
                await self._campaign(client, shard)

    async def _release(self, client: Any, shard: int) -> None:
        token = self._held.pop(shard, None)
        if token is None:  # dropped meanwhile (its key was deleted)
            return
        self._publish()  # stop acting first, then let go
        tx = client.transactions
        key = self.owner_key(shard).encode()
        await client.transaction(
            compare=[tx.create(key) == token], success=[tx.delete(key)], failure=[]
        )
        log.debug("%s: released shard %d", self.replica_id, shard)

    async def _campaign(self, client: Any, shard: int) -> None:
        tx = client.transactions
        key = self.owner_key(shard).encode()
        ok, responses = await client.transaction(
            compare=[tx.create(key) == 0],
            success=[tx.put(key, self.replica_id.encode(), self.lease_id), tx.get(key)],
            failure=[tx.get(key)],
        )
        found = responses[-1]
        if not found:
            return
        kv = found[0][1]
        self._owner_put(kv)
        if kv.value.decode() == self.replica_id and kv.lease == self.lease_id:
            self._held[shard] = int(kv.create_revision)
            log.debug("%s: shard %d, token %d", self.replica_id, shard, kv.create_revision)
            self._publish()
        elif ok:  # pragma: no cover - etcd put our value and lease
            raise AssertionError(f"shard {shard}: campaign won but key is {kv!r}")

    # --- change notification -----------------------------------------------------------

    def _set_deadline(self, deadline: float) -> None:
        self._deadline = deadline
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to schedule
            loop = asyncio.get_running_loop()
            if math.isfinite(deadline):
                self._expiry = loop.call_later(
                    max(0.0, deadline - self.clock()) + 0.001, self._publish
                )
        self._publish()

    def _publish(self) -> None:
        now = dict(self.owned())
        if now == self._published:
            return
        self._published = now
        self.changed.set()
        if self.on_change is not None:
            self.on_change(MappingProxyType(now))


async def fenced_write(
    client: Any, fence: Fence, replica_id: str, items: Mapping[str, bytes]
) -> bool:
    """Put ``items`` in one etcd transaction that succeeds only while the owner key of
    ``fence.shard`` still has ``fence.token`` as its create revision and ``replica_id`` as
    its value (``client``: an ``aetcd.Client``). A lease that expired deleted the key, and a
    new owner's key has a larger create revision, so a stale fence is always refused."""
    tx = client.transactions
    owner = fence.owner_key.encode()
    ok, _ = await client.transaction(
        compare=[tx.create(owner) == fence.token, tx.value(owner) == replica_id],
        success=[tx.put(k.encode(), v) for k, v in items.items()],
        failure=[],
    )
    return bool(ok)


def _describe(error: BaseException) -> str:
    """One line for an etcd problem: no traceback, no multi-line gRPC debug string."""
    if isinstance(error, aetcd.rpc.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


async def _close(client: Any) -> None:
    with contextlib.suppress(*ETCD_ERRORS, RuntimeError):
        await asyncio.wait_for(client.close(), 2.0)


async def _first_failure(*coros: Awaitable[None]) -> None:
    """Run the coroutines together until the first one fails; cancel the rest, re-raise."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        raise ConnectionError("a session task ended")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
