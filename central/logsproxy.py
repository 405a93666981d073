"""A task's output read through central (issue 14): ``GET /v1/tasks/{id}/logs[?tail=N&follow=1]``
proxied to the node holding the task over MQTT (:mod:`edgesched.sync.logstream`).

Central rarely has a route to a gateway's API (NAT, no known address), but both hold the broker
connection. :class:`LogsProxy` is a channel of central's session: it publishes a request on the
node's request topic and takes the node's replies from ``logs/<node>/reply/<central>``, each
only for a request it has open *to that node* (the topic's node level, which the broker's ACL
binds to its writer), in sequence, within the window it acked, as bytes it decodes as UTF-8
(invalid bytes replaced). Anything else is dropped and counted in :attr:`LogsProxy.stats`.

The route finds the node as central's task view has it (the node running a copy, else the
task's node), and answers 503 naming the node when it cannot reach it: not connected as
central's liveness has it (with why), or no answer within :data:`ANSWER_TIMEOUT_S`. 429 past
:data:`MAX_PER_NODE` streams to one node. Without ``follow`` the answer is read whole (at most
8 MiB) before it is sent, so a node lost halfway is a 503 too; with ``follow`` it is streamed
(chunked) as it comes, acked as it is written, until the node ends it (the task finished, or
:data:`FOLLOW_S`), and a node lost halfway cuts the connection (the client sees an incomplete
chunked body, never a quiet end).
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import logging
import secrets
import time
import weakref
from typing import Any

import aiomqtt
from aiohttp import web
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.central.engine import CentralEngine
from edgesched.rest.server import problem
from edgesched.sync import logstream as ls
from edgesched.sync.session import publish
from edgesched.sync.signing import FrameSigning, SignatureRefused

log = logging.getLogger("edgesched.central.logs")

#: How long central waits for a node's first reply, and between two of a stream's (a
#: following node sends a keepalive every IDLE_S).
ANSWER_TIMEOUT_S = 5.0
SILENT_S = 3 * ls.IDLE_S
#: Streams central has open to one node at once.
MAX_PER_NODE = 4
#: How long a stream followed through central stays open.
FOLLOW_S = 1800.0
#: The most lines a tail asks for.
MAX_TAIL = ls.MAX_TAIL

_WHY = {
    "will": "its connection dropped (its last will)",
    "site": "its site's bridge to central's broker is down",
    "silent": "nothing heard from it",
    None: "it never connected",
}


class Unreachable(Exception):
    """The node cannot be asked, or stopped answering; ``str()`` says why."""


class _Open:
    """One request central has open: the replies taken for it, in order."""

    def __init__(self, node: str, request: ls.Request) -> None:
        self.node = node
        self.request = request
        self.next_seq = 0
        self.replies: asyncio.Queue[ls.Reply] = asyncio.Queue()
        self.broken = ""  # why the node's replies can no longer be taken
        self.ended = False
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")


class LogsProxy:
    """Central's logs channel: requests out, replies in (see the module docstring)."""

    def __init__(self, central_id: str, signing: FrameSigning | None = None) -> None:
        self.central_id = central_id
        self.signing = signing
        topic = ls.reply_filter(central_id)
        self.routes: tuple[str, ...] = (topic,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (topic, SubscribeOptions(qos=1)),
        )
        #: replies taken; dropped by why (``unknown``: no such request open, ``foreign``: a
        #: request open to another node, ``malformed``, ``signature``, ``replay``, ...)
        self.stats: collections.Counter[str] = collections.Counter()
        self._client: aiomqtt.Client | None = None
        self._open: dict[str, _Open] = {}
        self._per_node: collections.Counter[str] = collections.Counter()

    # --- the channel ----------------------------------------------------------------------

    async def serve(self, client: aiomqtt.Client) -> None:
        self._client = client

    def disconnected(self) -> None:
        self._client = None
        for stream in self._open.values():
            self._break(stream, "central lost its broker connection")

    def handle(self, topic: str, payload: bytes) -> None:
        """Take a node's reply for the request it answers, or drop it. Never raises."""
        parsed = ls.parse_topic(topic, "reply")
        if parsed is None or parsed[1] != self.central_id:
            self.stats["topic"] += 1
            return
        node = parsed[0]
        try:
            reply = ls.parse_reply(ls.unseal(self.signing, topic, node, payload))
        except SignatureRefused as exc:
            self.stats[exc.reason] += 1
            log.warning("a logs reply from %s refused: %s", node, exc)
            return
        except ls.Malformed as exc:
            self.stats["malformed"] += 1
            log.debug("a malformed logs reply from %s: %s", node, exc)
            return
        stream = self._open.get(reply.id)
        if stream is None:
            self.stats["unknown"] += 1
            return
        if stream.node != node:
            self.stats["foreign"] += 1
            log.debug(
                "dropped a logs reply from %s for request %s, which is open to %s",
                node,
                reply.id,
                stream.node,
            )
            return
        if stream.broken or stream.ended:
            return
        if reply.seq < stream.next_seq:
            self.stats["duplicate"] += 1  # (a QoS 1 redelivery)
            return
        if reply.seq > stream.next_seq:
            self._break(stream, f"a reply of node {node} was lost")
            return
        if stream.replies.qsize() > ls.WINDOW:
            self._break(stream, f"node {node} sent past its window")
            return
        stream.next_seq += 1
        stream.ended = reply.kind != "data"
        self.stats["replies"] += 1
        stream.replies.put_nowait(reply)

    def _break(self, stream: _Open, why: str) -> None:
        if not stream.broken:
            stream.broken = why
            self.stats["broken"] += 1
            stream.replies.put_nowait(ls.Reply(stream.request.id, -1, "error", reason=why))

    # --- requests ---------------------------------------------------------------------------

    async def open(self, node: str, task_id: str, tail: int, follow: bool) -> _Open:
        """Ask ``node`` for ``task_id``'s log; :class:`Unreachable` if central cannot,
        :class:`Busy` past :data:`MAX_PER_NODE`."""
        client = self._client
        if client is None:
            raise Unreachable("central is not connected to its broker")
        if self._per_node[node] >= MAX_PER_NODE:
            raise Busy(f"central has {MAX_PER_NODE} log streams open to node {node} already")
        request = ls.Request(
            secrets.token_hex(16),
            task_id,
            tail=tail,
            follow=follow,
            max_bytes=ls.MAX_STREAM_BYTES,
            follow_s=FOLLOW_S if follow else 0.0,
        )
        stream = _Open(node, request)
        self._open[request.id] = stream
        self._per_node[node] += 1
        log.debug(
            "logs request %s: task %s on node %s (tail %d, follow %s)",
            request.id,
            task_id,
            node,
            tail,
            follow,
        )
        try:
            await self._send(client, node, request.encode())
        except aiomqtt.MqttError as exc:
            self.close(stream)
            raise Unreachable(f"central could not publish to the broker: {exc}") from None
        return stream

    async def next(self, stream: _Open, timeout: float) -> ls.Reply:
        """The stream's next reply (an ``error`` with seq -1 if it broke); TimeoutError."""
        async with asyncio.timeout(timeout):
            return await stream.replies.get()

    async def ack(self, stream: _Open, seq: int) -> None:
        client = self._client
        if client is not None and not stream.ended and not stream.broken:
            control = ls.Control(stream.request.id, "ack", seq)
            try:
                await self._send(client, stream.node, control.encode())
            except aiomqtt.MqttError:
                self._break(stream, "central lost its broker connection")

    def close(self, stream: _Open) -> None:
        """Forget the request; a node still streaming is told to stop."""
        if self._open.pop(stream.request.id, None) is None:
            return
        self._per_node[stream.node] -= 1
        if self._per_node[stream.node] <= 0:
            del self._per_node[stream.node]
        client = self._client
        if client is not None and not stream.ended:
            cancel = ls.Control(stream.request.id, "cancel").encode()
            task = asyncio.create_task(self._send_quietly(client, stream.node, cancel))
            _pending.add(task)
            task.add_done_callback(_pending.discard)

    async def _send(self, client: aiomqtt.Client, node: str, body: bytes) -> None:
        topic = ls.request_topic(node, self.central_id)
        # QoS 0: a node that is not connected gets nothing queued to read later
        await publish(client, topic, ls.seal(self.signing, topic, body), qos=0)

    async def _send_quietly(self, client: aiomqtt.Client, node: str, body: bytes) -> None:
        with contextlib.suppress(aiomqtt.MqttError):
            await self._send(client, node, body)

    @property
    def open_streams(self) -> int:
        return len(self._open)


class Busy(Exception):
    """Central has :data:`MAX_PER_NODE` streams open to the node already."""


_pending: set[asyncio.Task[None]] = set()
_proxies: weakref.WeakKeyDictionary[CentralEngine, LogsProxy] = weakref.WeakKeyDictionary()
PROXY_KEY = web.AppKey("logs-proxy", LogsProxy)
ENGINE_KEY = web.AppKey("logs-engine", CentralEngine)


def proxy_of(engine: CentralEngine) -> LogsProxy:
    """``engine``'s logs channel, added to its session the first time."""
    proxy = _proxies.get(engine)
    if proxy is None:
        proxy = _proxies[engine] = LogsProxy(engine.central.central_id, engine.signing)
        engine.session.add(proxy)
    return proxy


def add_routes(app: web.Application, engine: CentralEngine) -> None:
    """``GET /v1/tasks/{id}/logs`` on central's API, served through ``engine``'s session."""
    app[PROXY_KEY] = proxy_of(engine)
    app[ENGINE_KEY] = engine
    app.router.add_get("/v1/tasks/{id}/logs", task_logs)


# --- the route ------------------------------------------------------------------------------------


def _unreachable(node: str, why: str) -> web.Response:
    body = {
        "type": "about:blank",
        "title": "Node unreachable",
        "status": 503,
        "detail": f"node {node} unreachable: {why}",
        "node": node,
    }
    return web.json_response(body, status=503, content_type="application/problem+json")


def holder(engine: CentralEngine, task_id: str) -> tuple[bool, str | None]:
    """Whether central knows ``task_id``, and the node holding it as central's task view has
    it: the node running a copy, else the task's node (None: none yet)."""
    entry = None if engine.fleet is None else engine.fleet.assignment(task_id)
    if entry is not None:
        view: dict[str, Any] | None = engine.task_view(task_id, entry)
    else:
        engine.sync_index()
        view = engine.any_task_view(task_id)
    if view is None:
        return False, None
    running = view.get("running_on") or []
    node = running[0] if running else view.get("node")
    return True, node if isinstance(node, str) and node else None


def not_connected(engine: CentralEngine, node: str) -> str | None:
    """Why ``node`` is not connected as central's liveness has it; None if it is."""
    status = engine.liveness.nodes.get(node)
    if status is not None and status.state == "online":
        return None
    if status is None:
        return "not connected: it never connected"
    since = time.strftime("%H:%M:%S", time.localtime(status.since))
    return f"not connected since {since}: {_WHY.get(status.cause, status.cause)}"


_ERRORS = {"no_task": 404, "no_logs": 404, "busy": 429}


async def task_logs(request: web.Request) -> web.StreamResponse:
    """A task's output, read from its node: the last ``tail`` lines (100; at most 10,000),
    then with ``follow=1`` what it writes until it has finished (chunked)."""
    engine = request.app[ENGINE_KEY]
    proxy = request.app[PROXY_KEY]
    task_id = request.match_info["id"]
    try:
        tail = int(request.query.get("tail", "100"))
    except ValueError:
        tail = -1
    if not 0 <= tail <= MAX_TAIL:
        return problem(400, "Bad query", f"must be an integer in 0..{MAX_TAIL}", "tail")
    follow_arg = request.query.get("follow", "0")
    if follow_arg not in ("0", "1", "true", "false"):
        return problem(400, "Bad query", "must be 1 or 0", "follow")
    follow = follow_arg in ("1", "true")
    known, node = holder(engine, task_id)
    if not known:
        return problem(404, "Not Found", f"no task {task_id!r}", "id")
    if node is None:
        return problem(409, "Not placed", f"task {task_id!r} is on no node yet", "id")
    why = not_connected(engine, node)
    if why is not None:
        return _unreachable(node, why)
    try:
        stream = await proxy.open(node, task_id, tail, follow)
    except Busy as exc:
        return problem(429, "Too many log streams", str(exc))
    except Unreachable as exc:
        return _unreachable(node, str(exc))
    try:
        try:
            first = await proxy.next(stream, ANSWER_TIMEOUT_S)
        except TimeoutError:
            return _unreachable(node, f"no answer within {ANSWER_TIMEOUT_S:g} s")
        if first.kind == "error":
            if first.seq < 0:
                return _unreachable(node, first.reason)
            status = _ERRORS.get(first.code, 502)
            title = "Node refused" if status == 502 else "Not Found"
            if status == 429:
                title = "Too many log streams"
            detail = first.reason or first.code
            return problem(status, title, detail, "id" if status == 404 else None)
        headers = {"X-Edgesched-Node": node}
        if not follow:
            return await _whole(engine, proxy, stream, first, node, headers)
        return await _follow(engine, request, proxy, stream, first, node, headers)
    finally:
        proxy.close(stream)


async def _next(engine: CentralEngine, proxy: LogsProxy, stream: _Open) -> ls.Reply:
    """The stream's next reply; :class:`Unreachable` once its node reads not connected at
    central (looked at every second) or has sent nothing for :data:`SILENT_S`."""
    waited = 0.0
    while True:
        try:
            return await proxy.next(stream, 1.0)
        except TimeoutError:
            waited += 1.0
        why = not_connected(engine, stream.node)
        if why is not None:
            raise Unreachable(why)
        if waited >= SILENT_S:
            raise Unreachable(f"nothing from it for {SILENT_S:g} s")


async def _whole(
    engine: CentralEngine,
    proxy: LogsProxy,
    stream: _Open,
    reply: ls.Reply,
    node: str,
    headers: dict[str, str],
) -> web.Response:
    parts: list[str] = []
    while True:
        if reply.kind == "error":
            why = reply.reason if reply.seq < 0 else f"{reply.code}: {reply.reason}"
            return _unreachable(node, f"its answer broke off ({why})")
        if reply.kind == "end":
            parts.append(stream.decoder.decode(b"", final=True))
            return web.Response(
                text="".join(parts), content_type="text/plain", charset="utf-8", headers=headers
            )
        parts.append(stream.decoder.decode(reply.body))
        await proxy.ack(stream, reply.seq)
        try:
            reply = await _next(engine, proxy, stream)
        except Unreachable as exc:
            return _unreachable(node, f"its answer broke off: {exc}")


async def _follow(
    engine: CentralEngine,
    request: web.Request,
    proxy: LogsProxy,
    stream: _Open,
    reply: ls.Reply,
    node: str,
    headers: dict[str, str],
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8", **headers})
    await response.prepare(request)
    while True:
        if reply.kind == "error":
            why = reply.reason if reply.seq < 0 else f"{reply.code}: {reply.reason}"
            return _cut(request, response, stream, node, why)
        if reply.kind == "end":
            tail = stream.decoder.decode(b"", final=True)
            if tail:
                await response.write(tail.encode())
            await response.write_eof()
            return response
        text = stream.decoder.decode(reply.body)
        if request.transport is None or request.transport.is_closing():
            return response  # (the reader went away: close() tells the node)
        if text:
            try:
                await response.write(text.encode())
            except ConnectionError:
                return response
        await proxy.ack(stream, reply.seq)
        try:
            reply = await _next(engine, proxy, stream)
        except Unreachable as exc:
            return _cut(request, response, stream, node, str(exc))


def _cut(
    request: web.Request, response: web.StreamResponse, stream: _Open, node: str, why: str
) -> web.StreamResponse:
    """End a followed stream the node broke off, so the reader sees it broken (no chunked
    end), not finished."""
    log.warning("logs of task %s from node %s broke off: %s", stream.request.task, node, why)
    if request.transport is not None:
        request.transport.close()
    return response
