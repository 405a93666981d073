"""A central replica for the shard-lease tests, as a process of its own (so it can be
SIGKILLed, or run in a network namespace), and the observer that records etcd's history.

``replica``: runs :class:`ShardLeases` and, every ``--every`` seconds, appends one fenced
decision per owned shard under ``<prefix>/decisions/<shard>/`` (its value names the shard,
the token and the replica). Every gain and loss of a shard (what ``owned()`` returns) is a
JSON line in ``--out`` with the monotonic time (CLOCK_MONOTONIC is one clock for every
process of the machine, namespaces included), so the test can check that two replicas never
act on one shard at once.

``observe``: watches the whole prefix from revision 1 and writes every event, with its
monotonic arrival time, as JSON lines in ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import json
import logging
import signal
import time
from collections.abc import Mapping
from typing import IO, Any

import aetcd

from edgesched.central.leases import LeaseUnavailable, ShardLeases, parse_endpoint


def emit(out: IO[str], **record: Any) -> None:
    out.write(json.dumps({"t": time.monotonic(), **record}) + "\n")
    out.flush()


async def replica(args: argparse.Namespace, stop: asyncio.Event) -> None:
    out = open(args.out, "a")  # noqa: SIM115 - closed at the end
    acting: dict[int, int] = {}

    def changed(now: Mapping[int, int]) -> None:
        for shard, token in list(acting.items()):
            if now.get(shard) != token:
                del acting[shard]
                emit(out, ev="lose", replica=args.id, shard=shard, token=token)
        for shard, token in now.items():
            if shard not in acting:
                acting[shard] = token
                emit(out, ev="gain", replica=args.id, shard=shard, token=token)

    accepted = refused = unknown = 0
    seq = 0
    async with ShardLeases(
        args.id,
        args.endpoints.split(","),
        shards=args.shards,
        ttl_s=args.ttl,
        prefix=args.prefix,
        on_change=changed,
    ) as leases:
        emit(out, ev="start", replica=args.id)
        while not stop.is_set():
            for shard, token in sorted(leases.owned().items()):
                seq += 1
                key = f"{args.prefix}/decisions/{shard}/{args.id}-{seq:08d}"
                value = json.dumps({"shard": shard, "token": token, "replica": args.id})
                try:
                    ok = await leases.fenced_put(shard, key, value.encode())
                except LeaseUnavailable:
                    unknown += 1
                    continue
                accepted += ok
                refused += not ok
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.every)
    emit(out, ev="stop", replica=args.id, accepted=accepted, refused=refused, unknown=unknown)
    out.close()


async def observe(args: argparse.Namespace, stop: asyncio.Event) -> None:
    out = open(args.out, "a")  # noqa: SIM115 - closed at the end
    while not stop.is_set():
        for endpoint in args.endpoints.split(","):
            host, port = parse_endpoint(endpoint)
            client = aetcd.Client(host=host, port=port, timeout=2)
            client.metadata = (("hasleader", "true"),)  # a cut-off member must not stall us
            try:
                got = await client.get_prefix(f"{args.prefix}/".encode())
                start = got.header.revision + 1
                emit(out, ev="snapshot", revision=got.header.revision)
                watch = await client.watch_prefix(f"{args.prefix}/".encode(), start_revision=1)
                follow = asyncio.ensure_future(_follow(watch, out, start))
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait([follow, stopping], return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set():
                    follow.cancel()
                    out.close()
                    return
                follow.result()
            except (aetcd.ClientError, OSError, TimeoutError) as e:
                emit(out, ev="observer-error", error=str(e)[:200])
                await asyncio.sleep(0.2)
            finally:
                await client.close()
    out.close()


async def _follow(watch: Any, out: IO[str], live_from: int) -> None:
    async for e in watch:
        kv = e.kv
        emit(
            out,
            ev="etcd",
            kind=e.kind,
            key=kv.key.decode(),
            value=kv.value.decode(errors="replace"),
            rev=kv.mod_revision,
            create=kv.create_revision,
            live=kv.mod_revision >= live_from,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["replica", "observe"])
    parser.add_argument("--id", default="observer")
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1)  # a hung replica's stacks, for the test's log
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await (replica if args.mode == "replica" else observe)(args, stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
