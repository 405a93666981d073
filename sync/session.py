"""A peer's one MQTT connection: reconnect loop, TLS, channels, and cancels never lost.

Each peer (an edge node, central) has exactly one MQTT connection, under its fixed identity:
the broker's ``use_username_as_clientid`` allows one connection per identity, and the ACL
grants topics per identity. :class:`MqttSession` owns it; the things that talk over it (the
central link, one :class:`~edgesched.sync.peer.DocPeer` per document) are :class:`Channel` objects
that it subscribes for, dispatches to by topic, and serves while connected.

aiomqtt has no reconnect of its own; the session runs the loop: connect, serve until an
:class:`aiomqtt.MqttError`, back off with full jitter and a cap, reconnect. Each attempt's TCP
connect is bounded by the keepalive, and :func:`fresh_keepalive_on_open` works around a
paho-mqtt 2.2 trap that made the first attempt after a link came back fail (see there). Two traps
can make such a loop swallow its own cancellation and hang a shutdown forever; the helpers
here close both:

- Python 3.11's ``asyncio.wait_for`` (which aiomqtt uses for every publish, subscribe and
  connect) returns the result instead of raising when the awaited future completes in the same
  loop iteration as the cancel. :func:`checked` re-raises the lost cancellation.
- On cancel, aiomqtt's ``__aexit__`` waits for a graceful disconnect and raises ``MqttError``
  if that times out, replacing the ``CancelledError``. :func:`reraise_if_cancelling` in the
  loop's ``except`` block puts it back.

Both read :meth:`asyncio.Task.cancelling`, which Python 3.11's ``TaskGroup`` leaves raised on
its parent when a child fails while the parent already waits in ``__aexit__`` (fixed in later
Pythons). A session's pair of loops therefore runs under :func:`first_failure`, which gives the
same structure (the first to fail cancels the other, both are awaited) without touching the
caller's cancel count.

Failures are loud (docs/troubleshooting.md): every backoff step after failed connects logs one
WARNING naming each address and why it failed, and :attr:`MqttSession.link` (a
:class:`BrokerLink`) holds the state the status commands and ``/v1/status`` show. Two
processes under one identity take each other's session at the broker; :class:`Presence` and
:meth:`MqttSession._judge_loss` notice it, and the process that never held its session for
:data:`STABLE_S` raises :class:`IdentityInUse` instead of flapping.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import secrets
import socket
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import aiomqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync import pahofast
from edgesched.sync.wire import TOPIC_ROOT

log = logging.getLogger("edgesched.sync.session")

T = TypeVar("T")


#: How long a SUBACK may take. A resumed persistent session gets its queued messages first,
#: and a central's queue can hold tens of thousands (the deployed broker keeps 100,000 per
#: client): behind them, the 5 s default timed out on every reconnect, and each reconnect
#: queued more (``bench/bench_central_scale.py`` at 10,000 nodes). A dead link is noticed by
#: the keepalive, which fails the wait at once.
SUBSCRIBE_TIMEOUT_S = 120.0


#: How often one connection asks again for a subscription the broker refused (a SUBACK with a
#: failure code, 0x80 and up), after 1, 2, ... s (:data:`SUBSCRIBE_RETRY_S` doubling); then
#: the connection is renewed. A refusal is not an error aiomqtt raises: it hands the codes
#: back, and a subscription taken as made would never deliver. NATS refuses one now and then
#: while JetStream is busy after a member's death (its consumer not made in time);
#: Mosquitto refuses a filter its ACL denies, which is a deployment's error (logged each time).
SUBSCRIBE_ATTEMPTS = 3
SUBSCRIBE_RETRY_S = 1.0


#: How long a message of ours may take to come back to us (MQTT 3.1.1 has no no-local
#: subscriptions: the broker sends a peer's own QoS 1 message back through the subscription
#: that hears its topic) before that subscription counts as stalled (:class:`DeliveryStalled`).
#: A granted subscription can deliver nothing: NATS's JetStream consumer behind it stuck after
#: the cluster lost and re-elected its leaders (a CI run of the isolate-central field test: the
#: nodes' updates never reached central, whose connection looked healthy for 29 s). The
#: broker acknowledged the message before this wait starts, so it is queued: on a working
#: subscription it comes back in milliseconds.
ECHO_TIMEOUT_S = 10.0


#: Publishes one connection may have waiting on aiomqtt at once; the rest wait their turn.
#: aiomqtt 2.5 scans every pending call on each new one (``_pending_call``: ``mid in`` a
#: generator, then ``len(list(...))``), so N publishes in flight cost O(N^2): central's 20,000
#: connect-time step 1s held its event loop for 4-13 s at a time, past the keepalive, and the
#: broker dropped it (``bench/bench_central_scale.py``). Bounded, a publish costs O(this).
#: Past the gate a publish is in paho's own queue, first in first out behind paho's window of
#: QoS 1 publishes in flight (20): this bound is also how many publishes an urgent one can find
#: ahead of it there, so it is a few windows, not more. At 256, a fresh assignment waited
#: behind up to 236 answers of a heal in paho's queue (run 19 of the scale harness).
MAX_PENDING_PUBLISHES = 64
#: Of those, what the sync protocol's answers and step 1s may hold at once (the rest are for
#: urgent publishes: a writer's fresh update): paho's window in flight (20) and a few more.
#: With 64, a fresh assignment acknowledged by the broker (its PUBACK) p99 1.0 s into a heal
#: of 1,000 nodes, behind up to 64 answers in paho's queue (run 29 of the scale harness).
MAX_BULK_PUBLISHES = 24


class PublishGate:
    """At most ``slots`` publishes pending at once; the others wait for a turn, urgent ones
    first (each kind first come first served).

    An urgent publish is a writer's fresh update (a new assignment, a stop order, a mode
    switch); the others are the sync protocol's answers and step 1s, which a heal of a
    thousand nodes queues by the thousand. Urgent ones are few (one per decision), so they
    cannot starve the rest for long. The others hold at most ``bulk_slots`` at once (all of
    them by default): past the gate a publish waits in paho's first-in-first-out queue
    behind its window in flight, so bulk publishes kept to about that window leave an
    urgent one little to wait behind there."""

    def __init__(self, slots: int, bulk_slots: int | None = None) -> None:
        if slots < 1:
            raise ValueError("a publish gate needs at least one slot")
        bulk = slots if bulk_slots is None else bulk_slots
        if not 1 <= bulk <= slots:
            raise ValueError(f"bulk_slots must be 1 to {slots}, got {bulk}")
        self.slots = slots
        self.bulk_slots = bulk
        self._bulk_held = 0
        self._free = slots
        self._urgent: collections.deque[asyncio.Future[int]] = collections.deque()
        self._normal: collections.deque[asyncio.Future[int]] = collections.deque()
        self._grants = 0

    @property
    def pending(self) -> int:
        """Publishes holding a slot."""
        return self.slots - self._free

    @property
    def waiting(self) -> tuple[int, int]:
        """Publishes waiting for a slot: ``(urgent, other)``."""
        return len(self._urgent), len(self._normal)

    @property
    def grants(self) -> int:
        """Slots handed out so far (each turn's number is the count before it)."""
        return self._grants

    @contextlib.asynccontextmanager
    async def turn(self, *, urgent: bool = False) -> AsyncIterator[int]:
        """Hold a slot for the block; yields the turn's number (0, 1, ... in the order the
        slots were handed out, which a waiter handed one may resume after a later arrival)."""
        ticket = await self._acquire(urgent)
        try:
            yield ticket
        finally:
            self._release(urgent)

    def _grant(self) -> int:
        ticket, self._grants = self._grants, self._grants + 1
        return ticket

    @property
    def _bulk_may(self) -> bool:
        return self._bulk_held < self.bulk_slots

    async def _acquire(self, urgent: bool) -> int:
        if (
            self._free > 0
            and not self._urgent
            and (urgent or (not self._normal and self._bulk_may))
        ):
            self._free -= 1
            self._bulk_held += not urgent
            return self._grant()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        queue = self._urgent if urgent else self._normal
        queue.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(urgent)  # handed a slot as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
            raise

    def _release(self, urgent: bool) -> None:
        """A slot goes straight to the first waiter (urgent ones first; a bulk one while bulk
        holds fewer than ``bulk_slots``), or back to the pool."""
        self._bulk_held -= not urgent
        while self._urgent:
            waiter = self._urgent.popleft()
            if not waiter.done():
                waiter.set_result(self._grant())
                return
        while self._normal and self._bulk_may:
            waiter = self._normal.popleft()
            if not waiter.done():
                self._bulk_held += 1
                waiter.set_result(self._grant())
                return
        self._free += 1


_publish_gates: weakref.WeakKeyDictionary[aiomqtt.Client, PublishGate] = weakref.WeakKeyDictionary()


def publish_gate(client: aiomqtt.Client) -> PublishGate:
    """``client``'s gate (made on first use, with :data:`MAX_PENDING_PUBLISHES` slots, of
    which bulk publishes hold :data:`MAX_BULK_PUBLISHES` at most)."""
    gate = _publish_gates.get(client)
    if gate is None:
        bulk = min(MAX_BULK_PUBLISHES, MAX_PENDING_PUBLISHES)
        gate = _publish_gates[client] = PublishGate(MAX_PENDING_PUBLISHES, bulk)
    return gate


async def publish(
    client: aiomqtt.Client,
    topic: str,
    payload: bytes,
    *,
    qos: int = 0,
    retain: bool = False,
    timeout: float | None = None,
    urgent: bool = False,
) -> None:
    """``client.publish``, at most :data:`MAX_PENDING_PUBLISHES` of them pending per client
    (:class:`PublishGate`: ``urgent`` ones get the next free slot first), cancel-safe
    (:func:`checked`). ``timeout`` (aiomqtt's: the client's own when None) counts from the
    publish's turn."""
    async with publish_gate(client).turn(urgent=urgent):
        await checked(client.publish(topic, payload, qos=qos, retain=retain, timeout=timeout))


def reraise_if_cancelling() -> None:
    """Raise ``CancelledError`` if the current task has a cancel request pending."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def checked(awaitable: Awaitable[T]) -> T:
    """Await an aiomqtt call; if our task was cancelled meanwhile, raise even if it returned."""
    result = await awaitable
    reraise_if_cancelling()
    return result


class SubscriptionRefused(aiomqtt.MqttError):
    """The broker refused a subscription every time it was asked (:data:`SUBSCRIBE_ATTEMPTS`)."""


class DeliveryStalled(aiomqtt.MqttError):
    """A subscription the broker granted delivers nothing: a message of ours that it carries
    did not come back within :data:`ECHO_TIMEOUT_S`. The session renews the connection with a
    clean session once, so the broker drops the session's subscriptions (NATS: their
    JetStream consumers) and makes them anew; every document peer resyncs on the new
    connection, so nothing queued in the dropped session is lost to the documents."""


def _refused(code: Any) -> bool:
    """Whether a SUBACK reason code (paho's ``ReasonCode``, or a granted QoS as an int) is a
    failure: 0x80 (MQTT 3.1.1's only one) and up."""
    value = getattr(code, "value", code)
    return isinstance(value, int) and value >= 0x80


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; whether it is set. Built on
    ``asyncio.timeout``, which (unlike 3.11's ``wait_for``) never drops an outside cancel."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


def fresh_keepalive_on_open(client: aiomqtt.Client, connect_timeout_s: float) -> None:
    """Make a slow TCP connect count for nothing against the keepalive, and bound it.

    paho-mqtt 2.2 stamps its keepalive clock (``_last_bytes_received``, ``_last_msg_out``)
    *before* its blocking TCP connect. When that connect takes longer than the keepalive, as
    one whose SYNs went out while the link was down and is retransmitted after it came back
    (1 s, then 3 s later), paho's own keepalive check closes the socket right after sending
    CONNECT, and aiomqtt then waits its whole timeout for a CONNACK that cannot come: the
    half-open field test lost 2 s plus a backoff per heal this way. Stamp the clock again
    when the socket opens (paho calls ``on_socket_open`` between the connect and CONNECT),
    and give up a connect after ``connect_timeout_s`` (paho's default is 5 s) so the next
    attempt sends a fresh SYN. Private attributes of paho, so each is checked first: a paho
    without them gets the bound only."""
    paho = getattr(client, "_client", None)
    if paho is None:
        return
    paho.connect_timeout = connect_timeout_s
    mutex = getattr(paho, "_msgtime_mutex", None)
    if mutex is None or not hasattr(paho, "_last_bytes_received"):
        return
    inner = paho.on_socket_open

    def opened(mqttc: Any, userdata: Any, sock: Any) -> None:
        with mutex:
            paho._last_bytes_received = paho._last_msg_out = time.monotonic()
        if inner is not None:
            inner(mqttc, userdata, sock)

    paho.on_socket_open = opened


def no_delay_on_open(client: aiomqtt.Client) -> None:
    """Send small packets at once: ``TCP_NODELAY`` on the client's socket when it opens.

    paho leaves Nagle's algorithm on, so a small packet (a PUBACK of a node's message, a
    one-entry update) written while earlier bytes wait for the broker's ACK is held until
    that ACK comes, which the broker's kernel may delay ~40 ms. The broker's own side is
    ``set_tcp_nodelay`` (:func:`edgesched.sync.security.queue_settings`). A socket that
    refuses the option (not TCP) is left as it is."""
    paho = getattr(client, "_client", None)
    if paho is None:
        return
    inner = paho.on_socket_open

    def opened(mqttc: Any, userdata: Any, sock: Any) -> None:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if inner is not None:
            inner(mqttc, userdata, sock)

    paho.on_socket_open = opened


#: Longest the dispatcher hands out messages without yielding to the event loop. A batch of
#: cheap messages goes in one turn; a batch of expensive ones (a heal's whole documents, a
#: merge of ms each) yields between slices, so a submission's write, a PUBACK's callback or a
#: control step does not wait the whole batch: at 10,000 nodes the loop lagged up to 196 ms
#: while a heal's documents were handed out in one turn. At 20 ms a turn the dispatcher was
#: still what held central's loop most while it was late (a submission's path to the broker
#: takes several turns of the loop; bench_central_scale --hold-sample).
DISPATCH_TURN_S = 0.005

#: Most MQTT packets one readable event of the socket reads (:func:`read_what_is_buffered`),
#: and the longest it reads for. At 64 packets an event, a heal's inbound documents (up to
#: ~370 kB unread on central's socket at 10,000 nodes) took several turns of a busy loop to
#: read, and the PUBACK of a fresh assignment waited behind them up to a second; reading a
#: packet costs ~10 µs, so 10 ms reads ~1,000 of them.
READ_BATCH = 4096
READ_TURN_S = 0.01


def read_what_is_buffered(
    client: aiomqtt.Client, batch: int = READ_BATCH, turn_s: float = READ_TURN_S
) -> None:
    """Make each readable event of the socket read every packet already buffered (up to
    ``batch``, or for ``turn_s``), not one.

    aiomqtt calls paho's ``loop_read`` once per readable event, and paho 2.2 reads a single
    packet there unless messages of its own are in flight: the event loop then runs one
    iteration per incoming message, and whatever a message wakes (central's control loop)
    runs between every two of them, a control step per frame at central's fan-in. Read what
    is there in one go, and the dispatcher gets it as one batch (:meth:`MqttSession._dispatch`).
    paho's own packet reader is called until it says the socket has nothing more (``AGAIN``)
    or fails (handled as paho's ``loop_read`` does). Private attributes of paho
    (``_packet_read``, ``_loop_rc_handle``, ``_sock``), so each is checked first: a paho
    without them keeps its own ``loop_read``."""
    paho = getattr(client, "_client", None)
    names = ("_packet_read", "_loop_rc_handle", "_sock", "loop_read")
    if paho is None or not all(hasattr(paho, name) for name in names):
        return
    packet_read = paho._packet_read
    rc_handle = paho._loop_rc_handle

    def loop_read(max_packets: int = 1) -> MQTTErrorCode:
        until = time.monotonic() + turn_s
        for n in range(batch):
            if paho._sock is None:
                return MQTTErrorCode.MQTT_ERR_NO_CONN
            rc = packet_read()
            if rc == MQTTErrorCode.MQTT_ERR_AGAIN:
                break
            if rc > 0:
                result: MQTTErrorCode = rc_handle(rc)
                return result
            if n % 64 == 63 and time.monotonic() > until:
                break  # (the socket stays readable: the next event reads on)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    paho.loop_read = loop_read


async def first_failure(*loops: Coroutine[Any, Any, object]) -> None:
    """Run ``loops`` as sibling tasks until one ends; cancel and await the rest; re-raise
    the first one's exception. A cancel of the caller cancels and awaits them all."""
    tasks = [asyncio.create_task(loop) for loop in loops]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:  # in start order, so the report does not depend on timing
        if task in done and not task.cancelled() and (exc := task.exception()) is not None:
            raise exc


# --- the shared connection -------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to connect. ``identifier`` is the MQTT client id; with the broker's
    ``use_username_as_clientid`` it is also the username (or the TLS certificate's CN)."""

    host: str
    port: int
    identifier: str
    keepalive_s: int = 5
    username: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None
    session_expiry_s: int = 3600
    #: "5" (the default) or "3.1.1" for a broker that speaks only that (the embedded one of
    #: ``edgesched demo``): a persistent session by ``clean_session=False`` then, and no
    #: no-local subscriptions (peers drop their own messages by topic anyway).
    protocol: str = "5"
    #: More ``(host, port)`` of the same broker tier (the members of a clustered broker, see
    #: docs/brokers.md): after a failed connect or a lost connection the session tries the
    #: next address, round robin, starting from ``host``/``port``.
    alternates: tuple[tuple[str, int], ...] = ()
    #: With "3.1.1": how long our own message may take to come back (:data:`ECHO_TIMEOUT_S`,
    #: :class:`DeliveryStalled`); 0 turns the watch off.
    echo_timeout_s: float = ECHO_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.protocol not in ("5", "3.1.1"):
            raise ValueError(f"MQTT protocol must be '5' or '3.1.1', got {self.protocol!r}")
        for _, port in ((self.host, self.port), *self.alternates):
            if not 0 < port < 65536:
                raise ValueError(f"port must be in 1..65535, got {port}")
        if not self.identifier or any(c in self.identifier for c in "/+#\0"):
            raise ValueError(f"invalid MQTT client id {self.identifier!r}")


def tls_context(ca_file: str, cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """A client TLS context that trusts only ``ca_file`` and presents our certificate."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


class Channel(Protocol):
    """One user of the shared connection (the central link, a document peer, ...).

    ``routes`` are the topic filters whose messages go to :meth:`handle`; ``subscriptions``
    are what the session subscribes for it on every connect (a channel whose messages arrive
    through another channel's wildcard subscribes nothing). :meth:`serve` runs while the
    connection is up and ends only by failing (an ``MqttError`` ends the connection); a return
    is taken as "nothing more to do". :meth:`disconnected` is called when the connection ends.
    """

    routes: tuple[str, ...]
    subscriptions: tuple[tuple[str, SubscribeOptions], ...]

    async def serve(self, client: aiomqtt.Client) -> None: ...
    def handle(self, topic: str, payload: bytes) -> None: ...
    def disconnected(self) -> None: ...


def channel_name(channel: Channel) -> str:
    """A channel as the log names it: its class, and the topic it sends on if it has one."""
    topic = getattr(channel, "topic", None)
    kind = type(channel).__name__
    return f"{kind} {topic}" if isinstance(topic, str) else kind


class Listener:
    """Base of a channel that only hears (its subscriptions and :meth:`Channel.handle`):
    nothing to do while connected, nothing to undo when the connection ends."""

    async def serve(self, client: aiomqtt.Client) -> None:
        return None

    def disconnected(self) -> None:
        return None


@dataclass(frozen=True)
class _Wildcard:
    """A route with wildcards, split once: the same answer as ``aiomqtt.Topic.matches``
    (``$share/<group>/`` dropped, ``+`` one level, a trailing ``#`` the rest, the parent
    included), without building and splitting the filter for every message."""

    levels: tuple[str, ...]
    #: The literal levels before the first wildcard, joined (empty if it starts with one).
    prefix: str
    #: Whether levels follow the prefix (then a topic must continue it with "/").
    more: bool

    @classmethod
    def compile(cls, route: str) -> _Wildcard:
        aiomqtt.Wildcard(route)  # ValueError for what aiomqtt refuses to match against
        levels = route.split("/")
        if levels[0] == "$share":
            levels = levels[2:]
        literal: list[str] = []
        for level in levels:
            if level in ("+", "#"):
                break
            literal.append(level)
        return cls(tuple(levels), "/".join(literal), len(literal) < len(levels))

    def may_match(self, topic: str) -> bool:
        """False only if ``topic`` cannot match (its leading levels differ): a cheap test."""
        prefix = self.prefix
        if not prefix:
            return True
        if not self.more:
            return topic == prefix
        return topic.startswith(prefix) and (len(topic) == len(prefix) or topic[len(prefix)] == "/")

    def matches(self, topic_levels: list[str]) -> bool:
        count = len(topic_levels)
        for i, level in enumerate(self.levels):
            if level == "#":
                return True
            if i >= count or (level != "+" and level != topic_levels[i]):
                return False
        return len(self.levels) == count


# --- loud failure: the link's state, and one identity used twice ------------------------------

#: A connection held this long proves the session was ours: a process that has held one this
#: long keeps its session when another process takes it over (the other one exits).
STABLE_S = 10.0
#: A connection the broker ends sooner than this after its CONNACK ended "at once": what a
#: second process under the same identity does to it (it reconnects within its backoff).
FLAP_S = 5.0
#: Connections in a row ended at once before the session says (without proof) that another
#: process probably uses its identity.
FLAP_COUNT = 3
#: MQTT v5's DISCONNECT reason "Session taken over" (sent by brokers that send it: Mosquitto
#: 2.0.11 closes the old connection without it).
SESSION_TAKEN_OVER = 0x8E


#: The exit code of an engine process that stopped on :class:`IdentityInUse` (its CLIs use
#: it; a systemd unit lists it in ``RestartPreventExitStatus=``: starting the process again
#: would only take the session from the other one once more).
EXIT_IDENTITY_IN_USE = 3


class IdentityInUse(Exception):
    """Another live process connects under this session's identity (client id): the broker
    lets one connection per identity, so the two would take the session from each other
    forever. Raised by :meth:`MqttSession.run` in the process that never held its session
    for :data:`STABLE_S`; the message is the one line to show."""


def presence_topic(identifier: str, tier: str = "node") -> str:
    """Where a session announces its process (retained): ``edgesched/v1/node/<id>/instance``
    for a node (which the fleet's ACL lets read and write ``node/<own id>/#``),
    ``edgesched/v1/central/<id>/instance`` for a central (which writes ``central/#`` and
    reads everything). Nobody else subscribes to either."""
    if tier not in ("node", "central"):
        raise ValueError(f"tier must be node or central, got {tier!r}")
    return f"{TOPIC_ROOT}/{tier}/{identifier}/instance"


@dataclass
class BrokerLink:
    """The broker link's state, as ``/v1/status`` and the status commands show it.

    ``since`` is the wall-clock time (Unix seconds) of the last change between connected and
    not (None: never connected and no attempt has failed yet); ``last_error`` the last
    failed connect or lost connection, with ``last_error_at``; ``failed_attempts`` the
    connects that failed since the last one that worked; ``duplicate`` what is known of
    another process under the same identity (None: none seen)."""

    address: str
    connected: bool = False
    since: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    failed_attempts: int = 0
    connects: int = 0
    duplicate: str | None = None
    #: when ``duplicate`` was last seen (Unix time): it stays after the other process is
    #: gone, so a status read later says when, not only what
    duplicate_at: float | None = None

    def saw_duplicate(self, what: str) -> None:
        self.duplicate, self.duplicate_at = what, time.time()

    def up(self, address: str) -> None:
        self.address, self.connected, self.since = address, True, time.time()
        self.failed_attempts = 0
        self.connects += 1

    def failed(self, address: str, error: str) -> None:
        now = time.time()
        if self.connected or self.since is None:
            self.since = now
        self.address, self.connected = address, False
        self.last_error, self.last_error_at = error, now
        self.failed_attempts += 1

    def lost(self, address: str, error: str) -> None:
        now = time.time()
        self.address, self.connected, self.since = address, False, now
        self.last_error, self.last_error_at = error, now

    def report(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "connected": self.connected,
            "since": None if self.since is None else round(self.since, 3),
            "last_error": self.last_error,
            "last_error_at": None if self.last_error_at is None else round(self.last_error_at, 3),
            "failed_attempts": self.failed_attempts,
            "connects": self.connects,
            "duplicate": self.duplicate,
            "duplicate_at": None if self.duplicate_at is None else round(self.duplicate_at, 3),
        }


@dataclass
class Marker:
    """One process's presence marker, as :class:`Presence` publishes it."""

    instance: str
    host: str
    pid: int
    address: str
    seq: int
    #: when that process's session began (Unix time, its clock)
    started: float
    #: whether it had held a connection for STABLE_S when it wrote this
    held: bool

    def rank(self) -> tuple[bool, float, str]:
        """Lower keeps the session: one that held it, then the earlier start, then the id."""
        return (not self.held, self.started, self.instance)

    def describe(self) -> str:
        where = f" from {self.address}" if self.address else ""
        return f"pid {self.pid} on host {self.host}{where}"


@dataclass
class Presence:
    """A channel: this process's marker on :func:`presence_topic` (retained, on every
    connect), and the markers of other processes that connect under the same identity.

    The proof that another process is live: a marker not ours, heard after our own came back
    to us (the retained marker is the last one written, so another process wrote it after us),
    or one whose ``seq`` changed. A restarted process hears its previous life's marker first,
    before its own: no proof, no false alarm."""

    identifier: str
    topic: str
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    started: float = field(default_factory=time.time)
    #: whether this session has held a connection for STABLE_S (set by the session)
    held: bool = False
    seq: int = 0
    #: whether our own marker came back to us (after it, a foreign one proves a live other)
    echoed: bool = False
    #: the last marker of another process heard, and whether it proves that one live
    #: (during the current connection)
    other: Marker | None = None
    proven: bool = False

    def __post_init__(self) -> None:
        self.routes: tuple[str, ...] = (self.topic,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (self.topic, SubscribeOptions(qos=1)),
        )

    async def serve(self, client: aiomqtt.Client) -> None:
        self.seq += 1
        address = ""
        with contextlib.suppress(AttributeError, OSError, TypeError, ValueError):
            sock = client._client.socket()
            if isinstance(sock, socket.socket):  # (an ssl.SSLSocket is one too)
                host, port = sock.getsockname()[:2]
                address = f"{host}:{port}"
        marker = {
            "instance": self.instance,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "address": address,
            "seq": self.seq,
            "started": round(self.started, 3),
            "held": self.held,
        }
        payload = json.dumps(marker).encode()
        await publish(client, self.topic, payload, qos=1, retain=True)

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            data = json.loads(payload)
            marker = Marker(
                str(data["instance"]),
                str(data.get("host", "?"))[:255],
                int(data.get("pid", 0)),
                str(data.get("address", ""))[:64],
                int(data.get("seq", 0)),
                float(data.get("started", 0.0)),
                bool(data.get("held", False)),
            )
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError):
            # (an empty retained message clears the topic: nothing to learn; anything else
            # that is not a marker, nested past the parser's depth included, is ignored)
            return
        if marker.instance == self.instance:
            self.echoed = True
            return
        before = self.other
        changed = (
            before is not None and before.instance == marker.instance and (before.seq != marker.seq)
        )
        if self.echoed or changed:
            if not self.proven or before is None or before.instance != marker.instance:
                log.warning(
                    "%s: another process connects under the same identity: %s (the broker "
                    "lets one connection per identity; one of the two must stop)",
                    self.identifier,
                    marker.describe(),
                )
            self.proven = True
        self.other = marker

    def disconnected(self) -> None:
        # The proof is per connection (judged before this is called): once the other
        # process is gone, our next connect finds our own marker retained, and no proof.
        self.proven = False

    def yields_to(self, other: Marker) -> bool:
        """Whether this process, not ``other``, is the one to stop: ``other`` ranks lower
        (:meth:`Marker.rank`). Both sides rank alike from what the markers say, and a
        marker can only understate ``held``, so at most one of two processes stops."""
        return (not self.held, self.started, self.instance) > other.rank()


#: What paho reports for a connection whose socket closed (MQTT's "unspecified error").
CLOSED = 0x80


def _closed_at_once(client: aiomqtt.Client) -> bool:
    """Whether the connection closed before aiomqtt's ``__aenter__`` returned: aiomqtt then
    drops the disconnect (it resets its ``_disconnected`` future "if it's already in completed
    state after connecting") and the client would look connected on a closed socket forever.
    A second process under our identity does this when both connect in the same instant.
    paho's socket is gone then. Private attributes, so checked first."""
    paho = getattr(client, "_client", None)
    socket_of = getattr(paho, "socket", None)
    return callable(socket_of) and socket_of() is None


def _disconnect_code(client: aiomqtt.Client | None) -> int | None:
    """The reason code the connection ended with, from aiomqtt's ``_disconnected`` future:
    the DISCONNECT's reason when the broker sent one (0x8E: session taken over), paho's
    "unspecified" (128) when the socket closed; None if it ended otherwise or is unknown."""
    future = getattr(client, "_disconnected", None)
    if not isinstance(future, asyncio.Future) or not future.done() or future.cancelled():
        return None
    exc = future.exception()
    rc = getattr(exc, "rc", None)
    value = getattr(rc, "value", rc)
    return value if isinstance(value, int) else None


class MqttSession:
    """One aiomqtt client for many channels: connect, subscribe, dispatch, reconnect.

    A persistent MQTT v5 session (``clean_start=False`` and a session expiry) so QoS 1
    messages sent while we were away are queued by the broker; reconnect with exponential
    backoff, full jitter (a fleet that lost its broker together does not come back together)
    and a cap. An endpoint with ``alternates`` (the members of a clustered broker) fails over:
    a lost or refused connection moves on to the next address at once, and the backoff sleeps
    only after every address was tried. Channels may be added at any time (:meth:`add`): a
    connected session subscribes for them and starts their :meth:`Channel.serve` at once.
    A message goes to the first channel (in the order added) whose routes match its topic;
    routes without wildcards, or with ``+`` as their last level only (a document's sync
    topic), are found by a dictionary lookup, so central's thousands of replica channels cost
    a message O(1), not one match per channel. Messages whose topic no channel routes are
    counted in ``stats["unrouted"]`` and dropped.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        will: aiomqtt.Will | None = None,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        fallback: Channel | None = None,
        presence: str = "",
    ) -> None:
        """``fallback`` gets the messages no other channel routes (for example central's
        discovery of documents it has not seen yet, which then adds a channel). With
        ``presence`` (a topic: :func:`presence_topic`) the session announces its process
        there and stops with :class:`IdentityInUse` when another live process takes its
        session (the engines ask for it; see :meth:`_judge_loss`). A broker that refuses that
        topic costs the detection only (a WARNING), never the connection."""
        pahofast.install()  # v5 property tables built once, not per message received
        self.endpoint = endpoint
        self.will = will
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.fallback = fallback
        self.channels: list[Channel] = []
        #: route -> (order added, channel) for routes a lookup finds (see the class docstring)
        self._exact: dict[str, tuple[int, Channel]] = {}
        #: (order added, channel, its other routes compiled), in order
        self._general: list[tuple[int, Channel, tuple[_Wildcard, ...]]] = []
        self.connected = False
        self.stats: dict[str, int] = {
            "connects": 0,
            "messages_in": 0,
            "unrouted": 0,
            "subscribe_refused": 0,
            "delivery_stalled": 0,
        }
        self._added: asyncio.Queue[Channel] = asyncio.Queue()
        self._addresses = ((endpoint.host, endpoint.port), *endpoint.alternates)
        self._at = 0  # index into _addresses of the one to connect to next
        #: what ended the last connection, when a channel's own work did (for the log)
        self._failed_in = ""
        #: the link's state for the status commands and /v1/status
        self.link = BrokerLink("{}:{}".format(*self.address))
        self.presence: Presence | None = None
        if presence:
            self.presence = Presence(endpoint.identifier, presence)
            self.add(self.presence)
        #: whether a connection of ours lasted STABLE_S (the session was ours)
        self._held = False
        #: connections in a row the broker ended within FLAP_S
        self._quick_losses = 0
        #: whether the next connect asks for a clean session (after :class:`DeliveryStalled`)
        self._clean_next = False

    @property
    def address(self) -> tuple[str, int]:
        """The broker address the session is connected to, or will try next."""
        return self._addresses[self._at]

    def add(self, channel: Channel) -> None:
        """Register ``channel``; a connected session starts serving it right away."""
        order = len(self.channels)
        self.channels.append(channel)
        watch = getattr(channel, "watch_echoes", None)
        if self.endpoint.protocol == "3.1.1" and self.endpoint.echo_timeout_s > 0 and watch:
            watch(self.endpoint.echo_timeout_s)  # (v5: no-local, nothing comes back)
        general = []
        for route in channel.routes:
            head, _, last = route.rpartition("/")
            if (
                "#" in route
                or "+" in head
                or ("+" in last and (last != "+" or not head))
                or route.startswith("$share/")  # matched without its first two levels
            ):
                general.append(_Wildcard.compile(route))
            else:
                self._exact.setdefault(route, (order, channel))
        if general:
            self._general.append((order, channel, tuple(general)))
        self._added.put_nowait(channel)

    def route(self, topic: aiomqtt.Topic) -> Channel | None:
        """The first channel (in the order added) with a route matching ``topic``."""
        name = topic.value
        best = self._exact.get(name)
        head, sep, _ = name.rpartition("/")
        if sep:
            last_plus = self._exact.get(f"{head}/+")
            if last_plus is not None and (best is None or last_plus[0] < best[0]):
                best = last_plus
        levels: list[str] | None = None  # split once, and only if a literal prefix fits
        for order, channel, routes in self._general:
            if best is not None and order > best[0]:
                break
            for route in routes:
                if route.may_match(name):
                    levels = name.split("/") if levels is None else levels
                    if route.matches(levels):
                        return channel
        return None if best is None else best[1]

    def _client(self) -> aiomqtt.Client:
        common: dict[str, Any] = {
            "identifier": self.endpoint.identifier,
            "username": self.endpoint.username,
            "password": self.endpoint.password,
            "keepalive": self.endpoint.keepalive_s,
            "will": self.will,
            "tls_context": self.endpoint.tls,
            "timeout": max(2.0, float(self.endpoint.keepalive_s)),
        }
        if self.endpoint.protocol == "3.1.1":
            client = aiomqtt.Client(
                *self.address,
                protocol=aiomqtt.ProtocolVersion.V311,
                clean_session=self._clean_next,
                **common,
            )
        else:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = self.endpoint.session_expiry_s
            client = aiomqtt.Client(
                *self.address,
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=False,
                properties=props,
                **common,
            )
        fresh_keepalive_on_open(client, common["timeout"])
        no_delay_on_open(client)
        read_what_is_buffered(client)
        return client

    async def run(self) -> None:
        """Forever: connect, serve every channel, and on any MQTT error back off and retry.

        Failed connects are one WARNING per backoff step, naming each address tried and why
        it failed; a lost connection is one WARNING. Raises :class:`IdentityInUse` (see
        :meth:`_judge_loss`), and nothing else but a cancel."""
        delay = self.backoff_initial_s
        failures: list[str] = []  # this backoff step's failed connects: "address (reason)"
        while True:
            where = "{}:{}".format(*self.address)
            self._failed_in = ""
            client: aiomqtt.Client | None = None
            up_at: float | None = None
            code: int | None = None  # how the connection ended, when known here
            try:
                client = self._client()
                async with client:
                    up_at = time.monotonic()
                    self.connected = True
                    self.stats["connects"] += 1
                    self._clean_next = False  # (a clean session once; persistent again next)
                    self.link.up(where)
                    failures.clear()
                    delay = self.backoff_initial_s
                    log.info("%s connected to broker %s", self.endpoint.identifier, where)
                    if _closed_at_once(client):
                        code = CLOSED
                        raise aiomqtt.MqttError("the broker closed the connection at its CONNACK")
                    await self._connected(client)
            except aiomqtt.MqttError as exc:
                reraise_if_cancelling()
                if isinstance(exc, DeliveryStalled):
                    self.stats["delivery_stalled"] += 1
                    self._clean_next = True
                reason = str(exc) or type(exc).__name__
                if exc.__cause__ is not None and str(exc.__cause__) not in reason:
                    reason = f"{reason}: {exc.__cause__}"
                if up_at is not None:
                    self.link.lost(where, reason)
                    log.warning(
                        "%s lost broker %s: %s%s",
                        self.endpoint.identifier,
                        where,
                        reason,
                        f" (in {self._failed_in})" if self._failed_in else "",
                    )
                    if code is None:
                        code = _disconnect_code(client)
                    self._judge_loss(code, time.monotonic() - up_at)
                else:
                    self.link.failed(where, reason)
                    failures.append(f"{where} ({reason})")
            finally:
                if self.connected:
                    for channel in self.channels:
                        channel.disconnected()
                self.connected = False
            if len(self._addresses) > 1:  # the next member of the tier, at once
                self._at = (self._at + 1) % len(self._addresses)
                if self._at != 0:
                    continue
            pause = random.uniform(0, delay)
            if failures:
                log.warning(
                    "%s: broker unreachable: %s; retrying in %.1f s (failed attempt %d)",
                    self.endpoint.identifier,
                    ", ".join(failures),
                    pause,
                    self.link.failed_attempts,
                )
                failures.clear()
            await asyncio.sleep(pause)
            delay = min(delay * 2, self.backoff_max_s)

    def _judge_loss(self, code: int | None, held_s: float) -> None:
        """After a lost connection: was the session taken over by another process under our
        identity, and must this one stop? ``code``: the reason code it ended with, if known.

        Evidence: MQTT v5's DISCONNECT "session taken over" (0x8E), or a connection the
        broker ended within :data:`FLAP_S` of its CONNACK while :class:`Presence` has proof
        of another live process. The rule: the process that started last stops (raises
        :class:`IdentityInUse`), by the start times the markers carry, unless only it has
        held a connection for :data:`STABLE_S` (then the session was its own first,
        whatever the clocks say): :meth:`Presence.yields_to`. The other one keeps its
        session and logs an ERROR. With 0x8E and no marker of the other, the process that
        never held its session stops. Without proof (no presence, or the other process
        publishes no marker), :data:`FLAP_COUNT` such losses in a row are a WARNING only: a
        flapping link looks the same."""
        if held_s >= STABLE_S:
            self._held = True
            if self.presence is not None:
                self.presence.held = True
        quick = held_s < FLAP_S and code is not None
        self._quick_losses = self._quick_losses + 1 if quick else 0
        me = self.endpoint.identifier
        other = self.presence.other if self.presence is not None else None
        proven = self.presence is not None and self.presence.proven
        if code == SESSION_TAKEN_OVER or (quick and proven and other is not None):
            who = (
                other.describe()
                if other is not None and proven
                else "the broker does not say which process or address"
            )
            what = f"another process connected to broker {self.link.address} as {me}: {who}"
            self.link.saw_duplicate(what)
            if other is None or not proven or self.presence is None:
                stop = not self._held  # (0x8E, and nothing known of the other)
            else:
                stop = self.presence.yields_to(other)
            if stop:
                raise IdentityInUse(
                    f"{what}; the broker allows one connection per identity and this process "
                    f"(pid {os.getpid()}) started after it, so it stops: give one of the two "
                    "another id, or stop the other one"
                )
            log.error("%s; this process was first and keeps the session", what)
        elif self._quick_losses == FLAP_COUNT or (  # (then once per 100: no flood)
            self._quick_losses > FLAP_COUNT and self._quick_losses % 100 == 0
        ):
            what = (
                f"broker {self.link.address} closed our connection right after connect "
                f"{self._quick_losses} times in a row: probably another process connects as "
                f"{me} (the broker does not say which; its log shows 'New client connected "
                f"from ADDRESS as {me}'), or it refuses what we send"
            )
            self.link.saw_duplicate(what)
            log.warning("%s", what)

    async def _connected(self, client: aiomqtt.Client) -> None:
        """Subscribe and serve every channel (and each one added meanwhile) until one fails.

        The same structure as :func:`first_failure`, with a set of tasks that grows."""
        while not self._added.empty():  # everything added so far is served below
            self._added.get_nowait()
        dispatch = asyncio.create_task(self._dispatch(client), name="mqtt-dispatch")
        serving = [dispatch]
        added: asyncio.Task[Channel] | None = None
        try:
            for channel in [*self.channels, *([self.fallback] if self.fallback else [])]:
                serving.append(await self._start(client, channel, dispatch))
            # Every subscription of the connection is granted: a watched peer's echo may come
            # through another channel's (central's policy peer: the replicas' wildcard), so
            # its watch starts now, not when its own channel starts.
            for channel in self.channels:
                if (arm := getattr(channel, "arm_echo_watch", None)) is not None:
                    arm()
            while True:
                added = asyncio.create_task(self._added.get())
                done, _ = await asyncio.wait([*serving, added], return_when=asyncio.FIRST_COMPLETED)
                for task in serving:
                    if task in done and not task.cancelled() and (exc := task.exception()):
                        self._failed_in = task.get_name()
                        raise exc
                serving = [t for t in serving if t not in done]
                if added in done:
                    channel = added.result()
                    serving.append(await self._start(client, channel, dispatch))
                    if (arm := getattr(channel, "arm_echo_watch", None)) is not None:
                        arm()
                else:
                    added.cancel()
        finally:
            if added is not None:
                added.cancel()
            for task in serving:
                task.cancel()
            await asyncio.gather(*serving, return_exceptions=True)

    async def _start(
        self, client: aiomqtt.Client, channel: Channel, dispatch: asyncio.Task[None]
    ) -> asyncio.Task[None]:
        name = channel_name(channel)
        self._failed_in = f"subscribing {name}"
        for topic_filter, options in channel.subscriptions:
            for attempt in range(SUBSCRIBE_ATTEMPTS):
                codes = await self._subscribe(client, topic_filter, options, dispatch, name)
                refused = [c for c in codes if _refused(c)]
                if not refused:
                    break
                self.stats["subscribe_refused"] += 1
                if channel is self.presence:  # (optional: the detection only is lost)
                    log.warning(
                        "%s: broker %s:%d refused the subscription to %s (%s): a second process "
                        "under this identity will not be detected (let it read and write that "
                        "topic in the ACL)",
                        self.endpoint.identifier,
                        *self.address,
                        topic_filter,
                        ", ".join(str(c) for c in refused),
                    )
                    break
                log.warning(
                    "%s: broker %s:%d refused the subscription to %s (%s), attempt %d of %d",
                    self.endpoint.identifier,
                    *self.address,
                    topic_filter,
                    ", ".join(str(c) for c in refused),
                    attempt + 1,
                    SUBSCRIBE_ATTEMPTS,
                )
                if attempt + 1 < SUBSCRIBE_ATTEMPTS:
                    await asyncio.wait({dispatch}, timeout=SUBSCRIBE_RETRY_S * 2**attempt)
                    if dispatch.done():
                        break  # (the connection ended: the check below raises)
            else:
                raise SubscriptionRefused(
                    f"broker refused the subscription to {topic_filter} "
                    f"{SUBSCRIBE_ATTEMPTS} times: reconnecting"
                )
            if dispatch.done():
                exc = None if dispatch.cancelled() else dispatch.exception()
                raise exc or aiomqtt.MqttError(f"connection ended while subscribing {name}")
        self._failed_in = ""
        return asyncio.create_task(channel.serve(client), name=name)

    async def _subscribe(
        self,
        client: aiomqtt.Client,
        topic_filter: str,
        options: SubscribeOptions,
        dispatch: asyncio.Task[None],
        name: str,
    ) -> list[Any]:
        """One SUBSCRIBE and its SUBACK's reason codes; the end of the connection (which the
        dispatch task sees) ends the wait at once."""
        # (the broker sends a resumed session's queued messages before the SUBACK, and
        # central's queue may hold a fleet's burst: its timeout is long)
        if self.endpoint.protocol == "3.1.1":
            call = client.subscribe(topic_filter, qos=options.QoS, timeout=SUBSCRIBE_TIMEOUT_S)
        else:
            call = client.subscribe(topic_filter, options=options, timeout=SUBSCRIBE_TIMEOUT_S)
        subscribing = asyncio.ensure_future(call)
        try:
            first = asyncio.FIRST_COMPLETED
            await checked(asyncio.wait({subscribing, dispatch}, return_when=first))
        finally:
            if not subscribing.done():
                subscribing.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                    await subscribing
        if subscribing.cancelled() or not subscribing.done():
            exc = None if dispatch.cancelled() else dispatch.exception()
            raise exc or aiomqtt.MqttError(f"connection ended while subscribing {name}")
        return list(subscribing.result())  # (raises its MqttError, if it failed)

    async def _dispatch(self, client: aiomqtt.Client) -> None:
        """Hand every incoming message to its channel until the connection ends.

        Takes the messages from aiomqtt's queue itself: a batch read from the socket is handed
        out without yielding to the event loop in between (what the messages woke runs once
        after the batch), up to :data:`DISPATCH_TURN_S` of handling a turn, and
        an idle wait costs one future, where aiomqtt's ``client.messages`` makes a task and an
        ``asyncio.wait`` per message. The end of the connection (aiomqtt's ``_disconnected``)
        puts a marker behind what was received, which then ends the loop. Private attributes
        of aiomqtt, so each is checked first: without them, ``client.messages``."""
        queue = getattr(client, "_queue", None)
        disconnected = getattr(client, "_disconnected", None)
        if not (
            isinstance(queue, asyncio.Queue)
            and queue.maxsize == 0  # (the marker always fits)
            and isinstance(disconnected, asyncio.Future)
        ):
            async for message in client.messages:
                self._deliver(message)
            raise aiomqtt.MqttError("message stream ended")  # so the connection is renewed
        ended = object()

        def end(_: object) -> None:
            queue.put_nowait(ended)

        disconnected.add_done_callback(end)
        since = time.monotonic()  # when this turn of handing out began
        try:
            while True:
                if queue.empty():
                    message = await queue.get()
                    since = time.monotonic()
                else:
                    message = queue.get_nowait()
                if message is ended:  # (as aiomqtt's iterator raises, so it is renewed)
                    cause = None if disconnected.cancelled() else disconnected.exception()
                    raise aiomqtt.MqttError("Disconnected during message iteration") from cause
                self._deliver(message)
                if time.monotonic() - since >= DISPATCH_TURN_S:
                    await asyncio.sleep(0)  # the rest of the batch after the loop's other work
                    since = time.monotonic()
        finally:
            disconnected.remove_done_callback(end)

    def _deliver(self, message: aiomqtt.Message) -> None:
        self.stats["messages_in"] += 1
        payload = bytes(message.payload)  # aiomqtt delivers bytes (or bytearray)
        channel = self.route(message.topic)
        if channel is not None:
            channel.handle(message.topic.value, payload)
        elif self.fallback is not None and any(
            message.topic.matches(route) for route in self.fallback.routes
        ):
            self.fallback.handle(message.topic.value, payload)
        else:
            self.stats["unrouted"] += 1
