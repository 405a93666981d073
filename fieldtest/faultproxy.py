"""A TCP fault-injection proxy for partition field tests, needing no root.

Put :class:`FaultProxy` between a client and a server (an edge node and Mosquitto, say) and
break the link on purpose while both keep running: cut it, blackhole it, make it one-way,
reset connections, add latency or throttle bandwidth. Every control acts at once on existing
and new connections.

The model, and where a proxy differs from a real network:

- The proxy's kernel acknowledges what it receives, so a peer never sees TCP retransmissions.
  A byte the proxy drops (blackhole, one-way) is lost for good, and the connection it belonged
  to can no longer carry a consistent stream. Such a connection is marked *desynchronized* and
  is reset (RST) as soon as the fault that dropped its bytes ends (``heal()``, or a switch to
  another fault that forwards again). A connection that lost nothing lives on.
- A close or reset by one peer reaches the other only in a direction that is forwarding. While
  a blackhole lasts neither peer learns anything: it has to notice by its own keepalive.
- ``cut()`` resets both sides of every connection at once; a real partition would leave both
  to find out later. Use ``blackhole()`` for that.
- Bandwidth is one pacer per direction shared by all connections (the link), with no burst.
  Latency is added per chunk after pacing, pipelined, so it does not cut throughput; jitter
  adds a uniform random extra per chunk, and chunks still leave in order (a stream is never
  reordered, as TCP would not be).

The proxy can live in other network namespaces than its own: ``listen_sock`` is a socket it
listens on (made in a host's namespace, see :func:`edgesched.fieldtest.netns.socket_in`) and
``upstream_sock`` makes the socket it connects upstream with. That puts latency on a link of
the network-namespace fabric, whose kernel has no netem.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

__all__ = ["Direction", "FaultProxy", "ProxyStats"]

_CHUNK = 65536
_QUEUE_CHUNKS = 64


class Direction(enum.StrEnum):
    """A direction of the link: client→server (``"c2s"``) or server→client (``"s2c"``)."""

    C2S = "c2s"
    S2C = "s2c"

    @property
    def reverse(self) -> Direction:
        return Direction.S2C if self is Direction.C2S else Direction.C2S


class _Mode(enum.Enum):
    NORMAL = "normal"
    CUT = "cut"
    BLACKHOLE = "blackhole"
    ONE_WAY_C2S = "one-way c2s"
    ONE_WAY_S2C = "one-way s2c"


@dataclass(frozen=True)
class ProxyStats:
    """A snapshot of the proxy's counters."""

    accepted: int  # TCP connections accepted, refused ones included
    refused: int  # closed right after accept because the link was cut (or closing)
    active: int  # connections open now
    upstream_failures: int  # the target could not be reached
    resets: int  # connections the proxy closed with RST
    bytes_c2s: int  # bytes delivered to the server
    bytes_s2c: int  # bytes delivered to the client
    dropped_c2s: int  # client bytes discarded by a fault
    dropped_s2c: int  # server bytes discarded by a fault


@dataclass(eq=False)
class _Conn:
    reader: asyncio.StreamReader
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None
    rst: bool = False
    desync: bool = False
    closed: bool = False
    broken: set[Direction] = field(default_factory=set)


class _Pacer:
    """Serializes bytes at a rate: the link's transmission, with no burst allowance."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self._next_free = 0.0

    def set_rate(self, rate: float | None) -> None:
        self.rate = rate
        self._next_free = 0.0

    def reserve(self, n: int, now: float) -> float:
        """When the last of ``n`` bytes offered at ``now`` has gone out."""
        if self.rate is None:
            return now
        start = max(now, self._next_free)
        self._next_free = start + n / self.rate
        return self._next_free


def _close_writer(writer: asyncio.StreamWriter, *, rst: bool) -> None:
    if rst:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    else:
        writer.close()


class FaultProxy:
    """Forward TCP from ``listen_host:listen_port`` to ``target_host:target_port``, with faults.

    Use as ``async with FaultProxy("127.0.0.1", 0, host, port) as proxy:``; ``proxy.port`` is
    the bound port. On exit every connection is closed and every task has ended.
    """

    def __init__(
        self,
        listen_host: str,
        listen_port: int,
        target_host: str,
        target_port: int,
        *,
        connect_timeout: float = 5.0,
        listen_sock: socket.socket | None = None,
        upstream_sock: Callable[[], socket.socket] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """``listen_sock`` (bound here if it is not yet) replaces ``listen_host`` and
        ``listen_port``; ``upstream_sock`` makes each upstream socket (not yet connected)."""
        self.listen_sock = listen_sock
        self.upstream_sock = upstream_sock
        self._rng = rng or random.Random()
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.target_host = target_host
        self.target_port = target_port
        self.connect_timeout = connect_timeout
        self._mode = _Mode.NORMAL
        self._latency = {d: 0.0 for d in Direction}
        self._jitter = {d: 0.0 for d in Direction}
        self._pacers = {d: _Pacer() for d in Direction}
        self._conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._closing = False
        self._accepted = 0
        self._refused = 0
        self._upstream_failures = 0
        self._resets = 0
        self._bytes = {d: 0 for d in Direction}
        self._dropped = {d: 0 for d in Direction}

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise RuntimeError("FaultProxy is not reentrant")
        tg = asyncio.TaskGroup()
        await tg.__aenter__()
        self._tg = tg
        try:
            if self.listen_sock is not None:
                if self.listen_sock.getsockname()[1] == 0:
                    self.listen_sock.bind((self.listen_host, self.listen_port))
                self._server = await asyncio.start_server(self._on_accept, sock=self.listen_sock)
            else:
                self._server = await asyncio.start_server(
                    self._on_accept, self.listen_host, self.listen_port
                )
        except BaseException:
            self._closing = True
            await tg.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._tg is not None
        self._closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            self._kill(conn, rst=False)
        # The body's own exception (a failed assertion, a cancel) propagates as it is; the
        # group only waits for the connection tasks, already cancelled above.
        await self._tg.__aexit__(None, None, None)
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def port(self) -> int:
        """The port the proxy listens on."""
        if self._server is None:
            raise RuntimeError("FaultProxy is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def mode(self) -> str:
        """``normal``, ``cut``, ``blackhole``, ``one-way c2s`` or ``one-way s2c``."""
        return self._mode.value

    @property
    def stats(self) -> ProxyStats:
        return ProxyStats(
            accepted=self._accepted,
            refused=self._refused,
            active=len(self._conns),
            upstream_failures=self._upstream_failures,
            resets=self._resets,
            bytes_c2s=self._bytes[Direction.C2S],
            bytes_s2c=self._bytes[Direction.S2C],
            dropped_c2s=self._dropped[Direction.C2S],
            dropped_s2c=self._dropped[Direction.S2C],
        )

    # -- fault controls --------------------------------------------------------------------

    def cut(self) -> None:
        """Partition: reset every open connection and refuse new ones until :meth:`heal`."""
        self._set_mode(_Mode.CUT)

    def blackhole(self) -> None:
        """Silent partition: connections stay open, nothing passes, new ones get nothing.

        Dropped bytes are lost; a connection that lost any is reset when the fault ends.
        """
        self._set_mode(_Mode.BLACKHOLE)

    def one_way(self, direction: Direction | str) -> None:
        """Half-open link: forward only ``direction`` (``"c2s"`` or ``"s2c"``), drop the other."""
        d = Direction(direction)
        self._set_mode(_Mode.ONE_WAY_C2S if d is Direction.C2S else _Mode.ONE_WAY_S2C)

    def heal(self) -> None:
        """Forward normally again; connections that lost bytes to a fault are reset."""
        self._set_mode(_Mode.NORMAL)

    def reset(self) -> None:
        """Send RST on every current connection (both sides); new connections still work."""
        for conn in list(self._conns):
            self._kill(conn, rst=True)

    def set_latency(
        self, seconds: float, direction: Direction | str | None = None, *, jitter: float = 0.0
    ) -> None:
        """Delay every chunk by ``seconds`` plus a uniform ``[0, jitter)`` in ``direction``
        (both when None). Chunks keep their order: one delayed more holds back those after."""
        if seconds < 0 or jitter < 0:
            raise ValueError(f"latency and jitter must be >= 0, got {seconds}, {jitter}")
        for d in self._directions(direction):
            self._latency[d] = float(seconds)
            self._jitter[d] = float(jitter)

    def set_bandwidth(
        self, bytes_per_s: float | None, direction: Direction | str | None = None
    ) -> None:
        """Throttle ``direction`` (both when None) to ``bytes_per_s``; None removes the limit."""
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ValueError(f"bandwidth must be > 0 or None, got {bytes_per_s}")
        for d in self._directions(direction):
            self._pacers[d].set_rate(None if bytes_per_s is None else float(bytes_per_s))

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _directions(direction: Direction | str | None) -> tuple[Direction, ...]:
        return tuple(Direction) if direction is None else (Direction(direction),)

    def _set_mode(self, mode: _Mode) -> None:
        self._mode = mode
        for conn in list(self._conns):
            if mode is _Mode.CUT or (mode is not _Mode.BLACKHOLE and conn.desync):
                self._kill(conn, rst=True)

    def _passes(self, d: Direction) -> bool:
        mode = self._mode
        return (
            mode is _Mode.NORMAL
            or (mode is _Mode.ONE_WAY_C2S and d is Direction.C2S)
            or (mode is _Mode.ONE_WAY_S2C and d is Direction.S2C)
        )

    def _drop(self, conn: _Conn, d: Direction, n: int) -> None:
        self._dropped[d] += n
        conn.desync = True

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.rst:
            self._resets += 1
        for writer in (conn.client, conn.upstream):
            if writer is not None:
                _close_writer(writer, rst=conn.rst)

    def _kill(self, conn: _Conn, *, rst: bool) -> None:
        """Close ``conn``'s sockets now (RST if ``rst``) and cancel its task."""
        conn.rst = conn.rst or rst
        self._close(conn)
        self._conns.discard(conn)
        if conn.task is not None:
            conn.task.cancel()

    def _peer_failed(self, conn: _Conn, toward: Direction) -> None:
        """A peer reset or vanished; the other one learns it only if ``toward`` forwards."""
        if self._passes(toward):
            self._kill(conn, rst=True)
        else:
            conn.desync = True

    def _on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accepted += 1
        if self._closing or self._mode is _Mode.CUT or self._tg is None:
            self._refused += 1
            _close_writer(writer, rst=True)
            return
        conn = _Conn(reader, writer)
        self._conns.add(conn)
        conn.task = self._tg.create_task(self._serve(conn))

    async def _serve(self, conn: _Conn) -> None:
        try:
            if self._mode is _Mode.BLACKHOLE:
                await self._swallow(conn)
                return
            try:
                async with asyncio.timeout(self.connect_timeout):
                    up_reader, up_writer = await self._connect_upstream()
            except (OSError, TimeoutError):
                self._upstream_failures += 1
                conn.rst = True
                return
            conn.upstream = up_writer
            if conn.closed:  # killed while the upstream connection completed
                _close_writer(up_writer, rst=True)
                return
            async with asyncio.TaskGroup() as tg:
                for d, src, dst in (
                    (Direction.C2S, conn.reader, up_writer),
                    (Direction.S2C, up_reader, conn.client),
                ):
                    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
                    tg.create_task(self._read_side(conn, d, src, queue))
                    tg.create_task(self._write_side(conn, d, dst, queue))
        finally:
            self._conns.discard(conn)
            self._close(conn)

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.upstream_sock is None:
            return await asyncio.open_connection(self.target_host, self.target_port)
        sock = self.upstream_sock()
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, (self.target_host, self.target_port))
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)

    async def _swallow(self, conn: _Conn) -> None:
        """A connection accepted during a blackhole: no upstream, read and drop until reset."""
        conn.desync = True
        with contextlib.suppress(OSError):
            while data := await conn.reader.read(_CHUNK):
                self._dropped[Direction.C2S] += len(data)
        await asyncio.Event().wait()  # until heal(), cut(), reset() or shutdown cancels us

    def _chunk(self, d: Direction) -> int:
        rate = self._pacers[d].rate
        return _CHUNK if rate is None else max(512, min(_CHUNK, int(rate / 20)))

    async def _read_side(
        self,
        conn: _Conn,
        d: Direction,
        src: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await src.read(self._chunk(d))
            except OSError:
                self._peer_failed(conn, toward=d)
                return
            if not data:
                await queue.put(None)
                return
            if not self._passes(d):
                self._drop(conn, d, len(data))
                continue
            done = self._pacers[d].reserve(len(data), loop.time())
            delay = done - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            extra = self._rng.uniform(0.0, self._jitter[d]) if self._jitter[d] else 0.0
            await queue.put((loop.time() + self._latency[d] + extra, data))

    async def _write_side(
        self,
        conn: _Conn,
        d: Direction,
        dst: asyncio.StreamWriter,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            item = await queue.get()
            if item is None:
                if self._passes(d) and d not in conn.broken:
                    with contextlib.suppress(OSError):
                        if dst.can_write_eof():
                            dst.write_eof()
                else:
                    conn.desync = True
                return
            due, data = item
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if not self._passes(d) or d in conn.broken:
                self._drop(conn, d, len(data))
                continue
            try:
                dst.write(data)
                await dst.drain()
            except OSError:
                conn.broken.add(d)
                self._drop(conn, d, len(data))
                self._peer_failed(conn, toward=d.reverse)
                continue
            self._bytes[d] += len(data)
