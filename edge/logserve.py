"""A node's side of a task's output read through central (issue 14): a channel of its MQTT
session that answers central's requests (:mod:`edgesched.sync.logstream`).

Each request is one stream: the last ``tail`` lines of the task's log (as ``GET
/v1/tasks/{id}/logs`` reads them), then, with ``follow``, what it writes until it has finished,
in replies of at most :data:`~edgesched.sync.logstream.CHUNK_BYTES`, never more than
:data:`~edgesched.sync.logstream.WINDOW` past central's last ack, and an explicit end. Bounded:
:data:`~edgesched.sync.logstream.MAX_STREAMS` streams at once (another is refused ``busy``),
the request's bytes (at most 8 MiB) and follow time (at most an hour), an ack within
:data:`~edgesched.sync.logstream.ACK_TIMEOUT_S`. A malformed request is answered with an
``error`` naming what is wrong when it carries a valid id, else dropped; both are counted, and
nothing a request holds ends the channel. The file readers here are the node API's too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.core.task import TaskRecord
from edgesched.sync import logstream as ls
from edgesched.sync.session import publish
from edgesched.sync.signing import FrameSigning, SignatureRefused

log = logging.getLogger("edgesched.edge.logserve")

#: The most bytes a tail reads from the end of the file for its lines.
MAX_LOG_READ = 4 << 20
#: How often a follower looks for more.
POLL_S = 0.25
#: Messages waiting for the channel's loop (more are dropped and counted).
INBOX = 256


def tail_lines(path: Path, lines: int) -> tuple[bytes, int]:
    """The last ``lines`` lines of ``path`` (at most :data:`MAX_LOG_READ` bytes of them) and
    the file's size then (where a follower goes on from); no file reads as empty."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - MAX_LOG_READ)
            f.seek(start)
            data = f.read(size - start)
    except FileNotFoundError:
        return b"", 0
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()  # (the newline ending the last line)
    if start > 0 and parts:
        parts = parts[1:]  # (the first may be a line cut short by the read)
    kept = parts[-lines:] if lines else []
    return b"".join(line + b"\n" for line in kept), size


def read_from(path: Path, offset: int, limit: int = MAX_LOG_READ) -> tuple[bytes, int]:
    """What ``path`` holds past ``offset`` (at most ``limit`` bytes; from its start again if it
    was rotated, i.e. truncated below it), and the new offset."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read(min(size - offset, limit))
    except FileNotFoundError:
        return b"", offset
    return data, offset + len(data)


class _Dropped(Exception):
    """The stream ends without a word: central cancelled it, or stopped acking."""


class _Stream:
    def __init__(self, central: str, request: ls.Request) -> None:
        self.central = central
        self.request = request
        self.seq = 0  # the next reply's
        self.acked = -1
        self.acks = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class LogServer:
    """The node's logs channel: answers central's requests on ``logs/<node>/request/+``."""

    def __init__(
        self,
        node_id: str,
        get_task: Callable[[str], Awaitable[TaskRecord | None]],
        log_path: Callable[[str], Path],
        signing: FrameSigning | None = None,
    ) -> None:
        self.node_id = node_id
        self.get_task = get_task
        self.log_path = log_path
        self.signing = signing
        topic = ls.request_filter(node_id)
        self.routes: tuple[str, ...] = (topic,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (topic, SubscribeOptions(qos=1)),
        )
        #: requests served, answered with an error, refused (by reason), ...
        self.stats: collections.Counter[str] = collections.Counter()
        self._inbox: asyncio.Queue[tuple[str, ls.Request | ls.Control | ls.Malformed]] = (
            asyncio.Queue(INBOX)
        )
        self._streams: dict[str, _Stream] = {}

    # --- the channel ----------------------------------------------------------------------

    def handle(self, topic: str, payload: bytes) -> None:
        """Parse and check a message; the loop of :meth:`serve` acts on it. Never raises."""
        parsed = ls.parse_topic(topic, "request")
        if parsed is None or parsed[0] != self.node_id:
            self.stats["refused_topic"] += 1
            return
        central = parsed[1]
        try:
            body = ls.unseal(self.signing, topic, central, payload)
            message: ls.Request | ls.Control | ls.Malformed = ls.parse_request(body)
        except SignatureRefused as exc:
            self.stats[f"refused_{exc.reason}"] += 1
            log.warning("logs request from %s refused: %s", central, exc)
            return
        except ls.Malformed as exc:
            self.stats["refused_malformed"] += 1
            log.info("malformed logs request from %s: %s", central, exc)
            if exc.request_id is None:
                return
            message = exc
        try:
            self._inbox.put_nowait((central, message))
        except asyncio.QueueFull:
            self.stats["refused_full"] += 1

    async def serve(self, client: aiomqtt.Client) -> None:
        try:
            while True:
                central, message = await self._inbox.get()
                if isinstance(message, ls.Malformed):
                    assert message.request_id is not None
                    reply = ls.Reply(message.request_id, 0, "error", code="malformed",
                                     reason=str(message))  # fmt: skip
                    await self._send(client, central, reply)
                elif isinstance(message, ls.Control):
                    self._control(central, message)
                else:
                    await self._start(client, central, message)
        finally:
            self._drop_all()

    def disconnected(self) -> None:
        self._drop_all()
        while not self._inbox.empty():
            self._inbox.get_nowait()

    def _drop_all(self) -> None:
        for stream in self._streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self._streams.clear()

    def _control(self, central: str, control: ls.Control) -> None:
        stream = self._streams.get(control.id)
        if stream is None or stream.central != central:
            return  # (a stream that has ended, or another central's)
        if control.op == "cancel":
            if stream.task is not None:
                stream.task.cancel()
            return
        if control.seq > stream.acked:
            stream.acked = control.seq
            stream.acks.set()

    async def _start(self, client: aiomqtt.Client, central: str, request: ls.Request) -> None:
        if request.id in self._streams:
            self.stats["refused_duplicate"] += 1
            return
        if len(self._streams) >= ls.MAX_STREAMS:
            self.stats["busy"] += 1
            reason = f"node {self.node_id} serves {ls.MAX_STREAMS} log streams already"
            await self._send(client, central, ls.Reply(request.id, 0, "error", code="busy",
                                                       reason=reason))  # fmt: skip
            return
        stream = _Stream(central, request)
        self._streams[request.id] = stream
        self.stats["requests"] += 1
        stream.task = asyncio.create_task(self._run(client, stream), name=f"logs {request.id}")

    async def _send(self, client: aiomqtt.Client, central: str, reply: ls.Reply) -> None:
        topic = ls.reply_topic(self.node_id, central)
        await publish(client, topic, ls.seal(self.signing, topic, reply.encode()), qos=1)

    # --- one stream ------------------------------------------------------------------------

    async def _run(self, client: aiomqtt.Client, stream: _Stream) -> None:
        request = stream.request
        try:
            reply = await self._answer(client, stream)
            await self._emit(client, stream, reply)
        except (_Dropped, asyncio.CancelledError):
            self.stats["dropped"] += 1
        except aiomqtt.MqttError:
            pass  # (the session renews the connection; central's reader times out)
        except Exception:  # a node must not lose its channel to one stream
            log.exception("logs stream %s of task %s failed", request.id, request.task)
            self.stats["internal"] += 1
            with contextlib.suppress(Exception):
                reply = ls.Reply(request.id, stream.seq, "error", code="internal",
                                 reason="the node failed reading the log")  # fmt: skip
                await self._send(client, stream.central, reply)
        finally:
            if self._streams.get(request.id) is stream:
                del self._streams[request.id]

    async def _answer(self, client: aiomqtt.Client, stream: _Stream) -> ls.Reply:
        """Stream the log; the last reply (an end or an error) to send."""
        request = stream.request
        record = await self.get_task(request.task)
        if record is None:
            return ls.Reply(request.id, 0, "error", code="no_task",
                            reason=f"node {self.node_id} holds no task {request.task}")  # fmt: skip
        path = self.log_path(request.task)
        if not await asyncio.to_thread(path.exists):
            return ls.Reply(request.id, 0, "error", code="no_logs",
                            reason=f"task {request.task} has no log on node {self.node_id} "
                            "(it has not started there)")  # fmt: skip
        head, offset = await asyncio.to_thread(tail_lines, path, request.tail)
        budget = request.max_bytes
        head = head[-budget:] if len(head) > budget else head
        budget -= len(head)
        for start in range(0, len(head), ls.CHUNK_BYTES):
            await self._data(client, stream, head[start : start + ls.CHUNK_BYTES])
        if not request.follow:
            return self._end(stream, "done")
        deadline = time.monotonic() + request.follow_s
        quiet_since = time.monotonic()
        while True:
            if budget <= 0:
                return self._end(stream, "byte_limit")
            if time.monotonic() >= deadline:
                return self._end(stream, "follow_limit")
            limit = min(budget, ls.CHUNK_BYTES)
            more, offset = await asyncio.to_thread(read_from, path, offset, limit)
            if more:
                budget -= len(more)
                await self._data(client, stream, more)
                quiet_since = time.monotonic()
                continue
            record = await self.get_task(request.task)
            if record is None or record.state.terminal:
                more, offset = await asyncio.to_thread(read_from, path, offset, limit)
                if more:  # (written between the read and the look)
                    continue
                return self._end(stream, "finished")
            if time.monotonic() - quiet_since >= ls.IDLE_S:
                await self._data(client, stream, b"")  # keepalive: the stream is alive
                quiet_since = time.monotonic()
            await asyncio.sleep(POLL_S)

    def _end(self, stream: _Stream, reason: str) -> ls.Reply:
        return ls.Reply(stream.request.id, stream.seq, "end", reason=reason)

    async def _data(self, client: aiomqtt.Client, stream: _Stream, body: bytes) -> None:
        await self._emit(client, stream, ls.Reply(stream.request.id, stream.seq, "data", body))

    async def _emit(self, client: aiomqtt.Client, stream: _Stream, reply: ls.Reply) -> None:
        """Send ``reply`` once it is within the window past central's last ack."""
        while reply.seq - stream.acked > ls.WINDOW:
            stream.acks.clear()
            try:
                async with asyncio.timeout(ls.ACK_TIMEOUT_S):
                    await stream.acks.wait()
            except TimeoutError:
                raise _Dropped from None
        await self._send(client, stream.central, reply)
        stream.seq = reply.seq + 1
