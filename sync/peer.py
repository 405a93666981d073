"""One document's peer over MQTT v5: y-sync steps and live updates, framed by :mod:`.wire`.

:class:`DocPeer` is a channel of the peer's one :class:`~edgesched.sync.session.MqttSession`
(a persistent MQTT v5 session, so QoS 1 messages sent while it was away are queued by the
broker; :meth:`DocPeer.run` gives it a connection of its own, for tests and benchmarks).
Whatever the session kept, on every (re)connect it subscribes to
``edgesched/v1/doc/<doc>/sync/+`` (QoS 1, no-local) and sends sync step 1 (its state
vector); every peer answers a step 1 with step 2 (the diff), and sends its own step 1 back
when the asker has something it lacks.

Answers only the asker hears: a peer that hears only some peers (``listen_to``, a node
following central's documents) marks its step 1 (:func:`~edgesched.sync.wire.step1_payload`
with ``replies=True``) and also subscribes to its reply topics
``edgesched/v1/doc/<doc>/reply/<self>/<peer>``; a peer answers a marked step 1 (its step 2,
and its own step 1 back) on the asker's reply topic instead of its own sender topic, which
every other node of a shared document hears. Live updates still go to everyone on the sender
topic. An older peer reads the mark as a client that wrote nothing and answers on its sender
topic, which the asker still hears: both ways converge (docs/sync-protocol.md).

Local updates are queued by the doc callback (never published from inside it) and published
QoS 1 by a sender task, merged, with the sender's state vector attached: a receiver still
behind after applying (out-of-order updates can leave a replica stuck) asks for a resync.
They go ahead of the answers the peer owes and are urgent at the connection's
:class:`~edgesched.sync.session.PublishGate`: a fresh assignment is not queued behind a heal.
Remote updates are applied with ``sender`` as origin, so they are not echoed. Malformed input
is dropped and counted in :attr:`DocPeer.stats`; the peer keeps going.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

import aiomqtt
from paho.mqtt.client import topic_matches_sub
from paho.mqtt.subscribeoptions import SubscribeOptions
from pycrdt import YSyncMessageType, merge_updates

from edgesched.core.shared import SharedValues
from edgesched.sync import epochs, wire
from edgesched.sync.doc import UpdateRejected, client_id_for, decode_state_vector
from edgesched.sync.pacer import ResyncPacer
from edgesched.sync.session import DeliveryStalled, Endpoint, MqttSession, publish
from edgesched.sync.signing import TRAILER, FrameSigning, Sealed, SignatureRefused
from edgesched.sync.yupdate import (
    DecodedUpdate,
    UpdateDecodeError,
    brings_nothing,
    decode_update,
    decoded_violation,
)

log = logging.getLogger("edgesched.sync.peer")

#: Local updates queued while offline are merged into one beyond this many.
MAX_QUEUED_UPDATES = 256
#: How long one frame's publish may wait for its acknowledgement. Longer than the session's
#: own timeout (its keepalive, 2 s and up): central shares one connection among two peers per
#: node, and when it connects each sends its step 1 at once, so a frame can wait behind
#: thousands of others in paho's in-flight window. A publish that timed out ended the whole
#: connection (central lost its broker at 1,000 nodes, ``bench_central_fanin.py --broker``);
#: a link that is really dead is noticed by the keepalive, which fails every publish waiting.
PUBLISH_TIMEOUT_S = 120.0
#: Bytes of remote updates applied while still behind their sender (pycrdt holds those whose
#: dependencies have not arrived, unbounded) before a replica is dropped and resynced.
MAX_PENDING_BYTES = 8 << 20
#: A writer rotates past an epoch a peer claims (an epoch its store lost) at most once in
#: this many seconds; claims in between are dropped and counted (``epoch_rotate_limited``).
#: One rotation settles a real loss. Without a bound, a gateway could make central rotate
#: the gateway's own desired-state document (a snapshot written, ~15 KiB sent) with each
#: frame of ~50 bytes it sends.
ROTATE_PAST_EVERY_S = 60.0


#: One shared copy of each set of writers' client ids or relays' peer ids (``frozenset()``
#: of strs or ints: equality is identity for those).
_PEER_SETS: SharedValues[frozenset[Any]] = SharedValues(limit=4096)

#: What :attr:`DocPeer.stats` counts (a name not counted yet reads 0).
STAT_NAMES = (
    "connects",
    "frames_in",
    "frames_out",
    "bytes_out",
    "messages_in",
    "step1_in",
    "step1_out",
    "step2_in",
    "step2_out",
    "replies_out",
    "answers_spared",
    "updates_in",
    "updates_out",
    "resync_requests",
    "behind_non_writer",
    "own_dropped",
    "rejected_frames",
    "rejected_payloads",
    "rejected_updates",
    "rejected_senders",
    "rejected_authorship",
    "echoes_dropped",
    "rejected_signatures",
    "rejected_replays",
    "epoch_adopted",
    "epoch_stale",
    "epoch_refused",
    "epoch_rotated",
    "epoch_rotate_limited",
    "replica_drops",
)


class DocLike(Protocol):
    """What a peer needs of :class:`edgesched.sync.doc.SyncedDoc`."""

    @property
    def name(self) -> str: ...
    @property
    def client_id(self) -> int: ...
    def state_vector(self) -> bytes: ...
    def diff(self, state_vector: bytes | None = None) -> bytes: ...
    def apply_remote(
        self,
        update: bytes,
        *,
        sender: str,
        writer_whole: bool = False,
        writer_state: bytes | None = None,
    ) -> bool: ...
    def on_local_update(self, callback: Callable[[bytes], None]) -> None: ...
    def content_hash(self) -> str: ...
    def missing_from(self, remote_state_vector: bytes) -> bool: ...
    @property
    def epoch(self) -> int: ...
    def rotate(self, *, min_epoch: int | None = None) -> bytes: ...
    def reset_to_epoch(self, epoch: int) -> None: ...
    def authored_here(self) -> bool: ...
    def settle(self, *, complete: bool = True) -> None: ...
    def may_hold_pending(self) -> None: ...


class DocPeer:
    """Syncs one document with every other peer of it: a :class:`Channel` of a session."""

    #: (slotted: central holds two peers per node, 20,000 at 10,000 nodes)
    __slots__ = (
        "_answers",
        "_echo_armed",
        "_echo_timer",
        "_last_step1",
        "_local",
        "_pending_bytes",
        "_rotated_past_at",
        "_stalled",
        "_step1_slot",
        "_step1_to",
        "_unechoed_since",
        "_waiter",
        "_want_step1",
        "_woken",
        "accept",
        "backoff_initial_s",
        "backoff_max_s",
        "before_publish",
        "clock",
        "connected",
        "doc",
        "echo_timeout_s",
        "filter",
        "heard_at",
        "host",
        "keepalive",
        "max_packet",
        "max_pending_bytes",
        "on_synced",
        "pacer",
        "peer_id",
        "port",
        "reassembler",
        "relays",
        "replies",
        "resync_interval_s",
        "routes",
        "session_expiry_s",
        "signing",
        "sole_asker",
        "stats",
        "subscriptions",
        "synced_at",
        "topic",
        "writer",
        "writers",
    )

    def __init__(
        self,
        doc: DocLike,
        peer_id: str,
        host: str = "127.0.0.1",
        port: int = 1883,
        *,
        keepalive: int = 5,
        session_expiry_s: int = 3600,
        max_packet: int = 65536,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        resync_interval_s: float = 0.2,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        reassembler: wire.Reassembler | None = None,
        before_publish: Callable[[], Awaitable[object]] | None = None,
        accept: Callable[[str, int], bool] | None = None,
        writers: frozenset[int] | None = None,
        relays: Collection[str] = (),
        signing: FrameSigning | None = None,
        subscribe: bool = True,
        listen_to: Collection[str] | None = None,
        replies: bool | None = None,
        clock: Callable[[], float] = time.time,
        pacer: ResyncPacer | None = None,
        sole_asker: bool = False,
    ) -> None:
        """``before_publish`` is awaited before anything leaves: the owner's way to make sure
        every local update in it is persisted first (a published but unpersisted update would
        be reissued under the same client clock after a crash and diverge silently).

        ``accept(topic, claimed_client_id)`` vets each reassembled message before it is
        applied (central's :func:`edgesched.sync.security.accept_sender`); refused ones are
        counted in ``stats["rejected_senders"]``. ``writers``: the client ids allowed to
        author content in this document (a node's own document: the node's alone; the policy
        and desired-state documents: the central replicas'). ``relays``: the peer ids (topic
        senders) that may deliver any writer's operations (the central replicas, whose
        answers carry what they hold of everybody's); any other sender may deliver only its
        own (``client_id_for(sender)``, if a writer): a node can send content on the policy
        document's topics under no client id at all, and none on another node's document.
        Every operation of an update, inserted or deleted, is checked
        (:func:`edgesched.sync.yupdate.authorship_violation`); an update with one that is not
        the sender's to deliver is refused whole and counted in
        ``stats["rejected_authorship"]``. ``signing``: sign every message we send and check
        the signature of every message we receive before anything of it is decoded
        (:mod:`edgesched.sync.signing`; refusals counted in ``stats["rejected_signatures"]``
        and ``stats["rejected_replays"]``). ``subscribe=False`` for a peer whose
        messages arrive through a wildcard another channel subscribes. ``listen_to``: hear
        only these peers (their sender topics) instead of every peer of the document: a
        node following central's documents hears the centrals, not every other node's
        step 1 (which would grow each node's traffic with the fleet). ``replies``: ask to be
        answered on our reply topics (and hear them), so that answers to our step 1 reach
        us only, not every peer hearing the answerer's sender topic; by default when
        ``listen_to`` is given. ``pacer``: the step 1s we send on our own (on every connect,
        and when we find ourselves behind) wait for a slot of it, shared with the other peers
        of the connection (:mod:`edgesched.sync.pacer`); answers never wait. ``sole_asker``:
        no peer but us sends the writer a step 1 on this document (central alone with its
        replica of a node's document), so each step 2 of the writer is a diff against a state
        vector of ours, and one that changes nothing is a duplicate, not an update pycrdt
        holds pending (:meth:`SyncedDoc.apply_remote`'s ``writer_whole``); the step 1 we
        send back to the writer's own (when it holds what we lack) stands for a resync asked
        for meanwhile; and a step 1 of the writer that holds every operation we have is not
        answered (every deletion here is the writer's own: our step 2 would bring it
        nothing). ``host``, ``port``,
        ``keepalive``, ``session_expiry_s`` and the backoff apply only to :meth:`run`, the
        stand-alone mode with a connection of its own."""
        self.doc = doc
        self.before_publish = before_publish
        self.accept = accept
        # (shared: central's 20,000 peers name the same few sets of centrals)
        self.writers = None if writers is None else _PEER_SETS(frozenset(writers))
        self.relays = _PEER_SETS(frozenset(relays))
        self.signing = signing
        self.sole_asker = sole_asker
        self.clock = clock
        #: sender → when (``clock``) its last y-sync step 2 arrived: a full answer to our
        #: state vector, delete set included, so our replica held all it had at that moment.
        self.synced_at: dict[str, float] = {}
        #: sender → when (``clock``) any message of it last arrived.
        self.heard_at: dict[str, float] = {}
        #: Called with the sender after each full answer (step 2) was applied: whoever
        #: tracks freshness (central's fleet index) learns of it without polling.
        self.on_synced: Callable[[str], None] | None = None
        self.peer_id = peer_id
        self.topic = wire.sync_topic(doc.name, peer_id)  # validates both names
        self.filter = wire.sync_filter(doc.name)
        heard = (
            (self.filter,)
            if listen_to is None
            else tuple(wire.sync_topic(doc.name, p) for p in sorted(set(listen_to)))
        )
        #: Whether our step 1 asks to be answered on our reply topics (which we then hear).
        self.replies = listen_to is not None if replies is None else replies
        if self.replies:
            heard += (
                (wire.reply_filter(doc.name, peer_id),)
                if listen_to is None
                else tuple(wire.reply_filter(doc.name, peer_id, p) for p in sorted(set(listen_to)))
            )
        self.routes: tuple[str, ...] = heard
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            tuple((f, SubscribeOptions(qos=1, noLocal=True)) for f in heard) if subscribe else ()
        )
        self.host = host
        self.port = port
        self.keepalive = keepalive
        self.session_expiry_s = session_expiry_s
        self.max_packet = max_packet
        wire.chunk_budget(doc.name, max_packet)  # fails early if no room
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.resync_interval_s = resync_interval_s
        self.max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0  # applied while still behind their senders, since caught up
        self._rotated_past_at: float | None = None  # (clock) the last rotation past a claim
        self.reassembler = reassembler or wire.Reassembler()
        self.connected = False
        #: Counters by name (:data:`STAT_NAMES`), each from its first count: a name not
        #: counted yet reads 0 (a dict of all 29 was ~0.9 kB a peer, 20,000 peers at central).
        self.stats: Counter[str] = Counter()
        self._local: list[bytes] = []
        #: (remote state vector, our epoch then, the topic to answer on)
        self._answers: list[tuple[bytes, int, str]] = []
        #: Reply topics of askers that hold what we lack: our step 1 goes to each (dict: a
        #: set in order of asking).
        self._step1_to: dict[str, None] = {}
        writer = getattr(doc, "writer", None)  # single-writer documents name their writer
        self.writer: str | None = writer if isinstance(writer, str) else None
        self._want_step1 = False
        self._last_step1 = -1e9
        self.pacer = pacer
        #: the pacer's slot (time.monotonic) for the step 1 we want to send, once reserved
        self._step1_slot: float | None = None
        #: the send loop's wait, while it waits (a future: an asyncio.Event holds an empty
        #: deque, ~0.7 KiB, for as long as the peer lives), and whether it was woken since
        #: it last looked at what is due
        self._waiter: asyncio.Future[None] | None = None
        self._woken = False
        #: The delivery watch (:meth:`watch_echoes`; 0: off): since when a message we sent
        #: on our own topic waits to come back, the timer that checks it, and whether it
        #: did not (the send loop then ends the connection).
        self.echo_timeout_s = 0.0
        self._echo_armed = False  # (by the session, once the connection's subscriptions are)
        self._unechoed_since: float | None = None
        self._echo_timer: asyncio.TimerHandle | None = None
        self._stalled = False
        doc.on_local_update(self._on_local_update)  # once per doc lifetime

    # -- local side ------------------------------------------------------------------------

    def _on_local_update(self, update: bytes) -> None:
        """Called by the doc inside its transaction: only queue and wake the sender."""
        if getattr(update, "rotation", False):
            # A new epoch's whole state: what was queued belongs to the old epoch.
            self._local = [update]
            self._answers.clear()
            self._step1_to.clear()
        else:
            self._local.append(update)
            if len(self._local) > MAX_QUEUED_UPDATES:
                self._local = [merge_updates(*self._local)]
        self._wake_up()

    def take_outgoing(self) -> tuple[bytes, int] | None:
        """The local updates queued since the last call, merged into one, and the epoch they
        belong to (None: nothing queued). What the sender publishes next."""
        if not self._local:
            return None
        updates, self._local = self._local, []
        epoch = getattr(updates[-1], "epoch", self.doc.epoch)
        return (updates[0] if len(updates) == 1 else merge_updates(*updates)), epoch

    def _request_step1(self) -> None:
        self._want_step1 = True
        self._wake_up()

    def request_resync(self) -> None:
        """Send our state vector again soon: every peer answers with what we lack."""
        self._request_step1()

    # -- MQTT ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Stand-alone: a connection of our own (client id ``edgesched-doc-<doc>-<peer>``),
        kept up forever. A node or central shares one :class:`MqttSession` instead."""
        session = MqttSession(
            Endpoint(
                self.host,
                self.port,
                f"edgesched-doc-{self.doc.name}-{self.peer_id}",
                keepalive_s=self.keepalive,
                session_expiry_s=self.session_expiry_s,
            ),
            backoff_initial_s=self.backoff_initial_s,
            backoff_max_s=self.backoff_max_s,
        )
        session.add(self)
        await session.run()

    def watch_echoes(self, timeout_s: float) -> None:
        """Watch that the subscription hearing our own topic delivers: on MQTT 3.1.1 (no
        no-local) the broker sends each message we publish there back to us, and one that
        has not come back after ``timeout_s`` ends the connection (:class:`DeliveryStalled`:
        the session renews it with a clean session). The session calls this on a 3.1.1
        connection; a peer that does not hear its own sender topic (``listen_to``) is not
        watched."""
        if any(topic_matches_sub(route, self.topic) for route in self.routes):
            self.echo_timeout_s = timeout_s

    def arm_echo_watch(self) -> None:
        """The session: every subscription of this connection is granted, so from now on a
        message we send on our own topic comes back (before, one sent ahead of the
        subscription that carries it back is never delivered to us)."""
        self._echo_armed = self.echo_timeout_s > 0

    def _echoed(self) -> None:
        self._unechoed_since = None
        if self._echo_timer is not None:
            self._echo_timer.cancel()
            self._echo_timer = None

    def _echo_overdue(self) -> None:
        self._echo_timer = None
        if self.connected and self._unechoed_since is not None:
            self._stalled = True
            self._wake_up()

    async def serve(self, client: aiomqtt.Client) -> None:
        """While connected: resync by state vector, then send whatever is due."""
        self._echoed()
        self._stalled = False
        self.connected = True
        self.stats["connects"] += 1
        log.info("doc %s: %s connected", self.doc.name, self.peer_id)
        self._want_step1 = True  # resync by state vector on every connect
        self._last_step1 = -1e9
        self._step1_slot = None  # (a slot of a previous connection is void)
        await self._send_loop(client)

    def disconnected(self) -> None:
        self.connected = False
        self._echo_armed = False
        self._echoed()
        self._stalled = False

    async def _publish(
        self,
        client: aiomqtt.Client,
        kind: wire.Kind,
        payload: bytes,
        epoch: int,
        topic: str | None = None,
    ) -> None:
        """``epoch``: read with the state ``payload`` was built from, before any await.
        ``topic``: an asker's reply topic (default: our sender topic, heard by every peer)."""
        if self.before_publish is not None:
            await self.before_publish()
        msg_id = wire.new_msg_id()
        sealed = (
            None
            if self.signing is None
            else self.signing.seal(
                self.doc.name, int(kind), self.doc.client_id, epoch, msg_id, payload
            )
        )
        frames = wire.encode(
            kind,
            self.doc.name,
            self.doc.client_id,
            payload if sealed is None else sealed,
            self.max_packet,
            epoch=epoch,
            msg_id=msg_id,
            signed=sealed is not None,
        )
        to = self.topic if topic is None else topic
        if to == self.topic and self._echo_armed and self._unechoed_since is None:
            # (before the publish: its echo may be read before our PUBACK is)
            self._unechoed_since = time.monotonic()
            self._echo_timer = asyncio.get_running_loop().call_later(
                self.echo_timeout_s, self._echo_overdue
            )
        urgent = kind is wire.Kind.UPDATE  # a fresh write goes ahead of the sync protocol's
        for frame in frames:
            await publish(client, to, frame, qos=1, timeout=PUBLISH_TIMEOUT_S, urgent=urgent)
            self.stats["frames_out"] += 1
            self.stats["bytes_out"] += len(frame)
        if to != self.topic:
            self.stats["replies_out"] += 1

    def _wake_up(self) -> None:
        self._woken = True  # (no send loop yet: it looks at what is queued when it starts)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _send_loop(self, client: aiomqtt.Client) -> None:
        """Publish what this peer owes, then wait to be woken. Every payload is built and
        published by a helper (:meth:`_send_step1`, :meth:`_send_answer`,
        :meth:`_send_outgoing`), never in this loop's own frame: a local here would keep the
        last payload alive while the loop waits, for as long as the peer lives (a node
        replica's last answer to its node's step 1 is its whole document: ~260 MB at
        10,000 nodes, the harness's ``--memory-breakdown`` found)."""
        loop = asyncio.get_running_loop()
        while True:
            if self._stalled:
                raise DeliveryStalled(
                    f"doc {self.doc.name}: our message on {self.topic} did not come back "
                    f"within {self.echo_timeout_s:g} s: the broker's subscription delivers "
                    "nothing"
                )
            self._woken = False  # anything arriving while we publish sets it again
            if self._want_step1:
                now = time.monotonic()
                due = self._last_step1 + self.resync_interval_s  # coalesce resync requests
                if self.pacer is not None:
                    if self._step1_slot is None:
                        self._step1_slot = self.pacer.reserve()
                    due = max(due, self._step1_slot)
                if due > now:
                    loop.call_later(due - now, self._wake_up)
                else:
                    self._want_step1 = False
                    self._step1_slot = None
                    self._last_step1 = now
                    self._step1_to.clear()  # every asker hears this one
                    await self._send_step1(client, None)
            await self._send_outgoing(client)
            while self._answers:
                await self._send_answer(client, *self._answers.pop(0))
                await self._send_outgoing(client)  # a fresh write skips the answers left
            while self._step1_to:  # (after the answers: the asker applies them first)
                topic = next(iter(self._step1_to))
                del self._step1_to[topic]
                if self.sole_asker:
                    # The asker is the writer, the one peer we ask: this step 1 answers a
                    # resync asked for before it (central's, when the node came online),
                    # which would bring the writer's whole answer a second time.
                    self._want_step1, self._step1_slot = False, None
                await self._send_step1(client, topic)
            await self._send_outgoing(client)
            if not (self._local or self._answers or self._step1_to or self._woken):
                waiter = self._waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    self._waiter = None

    async def _send_step1(self, client: aiomqtt.Client, topic: str | None) -> None:
        """Our step 1 (state vector), to every peer (``topic`` None) or to one asker."""
        step1 = wire.step1_payload(self.doc.state_vector(), replies=self.replies)
        await self._publish(client, wire.Kind.SYNC, step1, self.doc.epoch, topic)
        self.stats["step1_out"] += 1

    async def _send_answer(
        self, client: aiomqtt.Client, remote_sv: bytes, epoch: int, topic: str
    ) -> None:
        """Our step 2 to an asker's step 1: what we hold that its state vector lacks."""
        if epoch != self.doc.epoch:
            return  # asked of an epoch we left: the asker learns of the new one
        try:
            diff = self.doc.diff(remote_sv)
        except ValueError as exc:
            self.stats["rejected_payloads"] += 1
            log.warning("doc %s: bad state vector in step 1: %s", self.doc.name, exc)
            return
        step2 = wire.step2_payload(diff)
        del diff  # (the payload is a copy: one of them is enough while it is published)
        await self._publish(client, wire.Kind.SYNC, step2, epoch, topic)
        self.stats["step2_out"] += 1

    async def _send_outgoing(self, client: aiomqtt.Client) -> None:
        """Publish the local updates queued so far, merged (nothing if none). The send loop
        calls it before and between the answers it owes: an answer is built from the state at
        its turn, so a fresh write sent ahead of it costs the asker nothing, while a
        write queued behind a heal's answers to a shared document would wait for all of them."""
        outgoing = self.take_outgoing()
        if outgoing is not None:
            update, epoch = outgoing
            payload = wire.update_payload(update, self.doc.state_vector())
            await self._publish(client, wire.Kind.UPDATE, payload, epoch)
            self.stats["updates_out"] += 1

    # -- remote side -----------------------------------------------------------------------

    def handle(self, topic: str, payload: bytes) -> None:
        sender = topic.rsplit("/", 1)[-1]
        if sender == self.peer_id:
            self.stats["own_dropped"] += 1
            if self._unechoed_since is not None:
                self._echoed()  # (in order: an echo means the subscription delivers)
            return
        self.stats["frames_in"] += 1
        try:
            message = self.reassembler.feed(payload)
        except wire.FrameError as exc:
            self.stats["rejected_frames"] += 1
            log.warning("doc %s: dropped frame from %s: %s", self.doc.name, sender, exc)
            return
        if message is None:
            return
        self.stats["messages_in"] += 1
        signing = self.signing
        if message.signed or signing is not None:
            try:
                if signing is not None and signing.verifier is not None and message.signed:
                    sealed = signing.prepare(self.doc.name, sender, message)
                    if isinstance(sealed, Sealed):  # checked on the verifier's thread
                        then = functools.partial(self._verified, topic, sender, message, sealed)
                        signing.verifier.submit(sealed, sender, then)
                        return
                    message = message._replace(payload=sealed, signed=False)
                else:
                    message = self._opened(sender, message)
            except SignatureRefused as exc:
                self._refused(sender, exc)
                return
        self._process(topic, sender, message)

    def _refused(self, sender: str, exc: SignatureRefused) -> None:
        key = "rejected_replays" if exc.reason == "replay" else "rejected_signatures"
        self.stats[key] += 1
        log.warning("doc %s: refused a message from %s: %s", self.doc.name, sender, exc)

    def _verified(
        self,
        topic: str,
        sender: str,
        message: wire.Message,
        sealed: Sealed,
        refused: SignatureRefused | None,
    ) -> None:
        """A signature checked on the verifier's thread: the rest of :meth:`handle`, on the
        loop, in the order the messages came."""
        assert self.signing is not None
        try:
            if refused is not None:
                raise refused
            body = self.signing.admit(self.doc.name, sender, sealed)
        except SignatureRefused as exc:
            self._refused(sender, exc)
            return
        self._process(topic, sender, message._replace(payload=body, signed=False))

    def _process(self, topic: str, sender: str, message: wire.Message) -> None:
        """A whole message, its signature checked (or none needed): the sync protocol."""
        self.heard_at[sender] = self.clock()
        if self.accept is not None and not self.accept(topic, message.sender):
            self.stats["rejected_senders"] += 1
            log.warning(
                "doc %s: refused a message on %s claiming client id %d",
                self.doc.name,
                topic,
                message.sender,
            )
            return
        if message.sender == self.doc.client_id:
            # Two peers with one client_id diverge silently: refuse, loudly.
            self.stats["rejected_payloads"] += 1
            log.error("doc %s: %s uses our client id %d", self.doc.name, sender, message.sender)
            return
        if message.epoch != self.doc.epoch and not self._follow_epoch(sender, message.epoch):
            return
        try:
            sync = wire.decode_sync(message.kind, message.payload)
            # (a sole writer's own answer is complete; a relay's may not be)
            from_writer = self.writers is not None and self.writers == {message.sender}
            self._handle_sync(sender, sync, from_writer=from_writer)
        except ValueError as exc:  # FrameError, UpdateRejected, a bad state vector
            key = (
                "rejected_payloads"
                if isinstance(exc, wire.FrameError)
                else "rejected_authorship"
                if isinstance(exc, AuthorshipRefused)
                else "rejected_updates"
            )
            self.stats[key] += 1
            log.warning("doc %s: dropped message from %s: %s", self.doc.name, sender, exc)

    def _opened(self, sender: str, message: wire.Message) -> wire.Message:
        """``message`` with its signature checked and its trailer removed (with no signing of
        our own, a signed message's trailer is only removed: a peer not yet keyed reads a
        keyed peer's messages); SignatureRefused if it fails the check."""
        if self.signing is None:
            if len(message.payload) < TRAILER:
                raise SignatureRefused("signature", f"signed message from {sender} is too short")
            return message._replace(payload=message.payload[:-TRAILER], signed=False)
        payload = self.signing.open(self.doc.name, sender, message)
        return message._replace(payload=payload, signed=False)

    def _handle_sync(
        self, sender: str, sync: wire.SyncPayload, *, from_writer: bool = False
    ) -> None:
        if sync.step == YSyncMessageType.SYNC_STEP1:
            self.stats["step1_in"] += 1
            state_vector, marked = wire.split_reply_mark(sync.data)
            behind = self._behind(state_vector)  # ValueError if garbage
            if behind and self.authors_of(sender) == frozenset():
                # It holds what we lack (a writer's operations it heard and we missed) but may
                # deliver none of it: asking would only bring answers we refuse. The writer
                # itself, or a relay, brings it.
                self.stats["behind_non_writer"] += 1
                behind = False
            reply = self._reply_topic(sender) if marked else None
            asked = (state_vector, self.doc.epoch, reply or self.topic)
            if from_writer and self.sole_asker and self._holds_ours(state_vector):
                # The writer holds every operation we do, and every deletion here is its own:
                # our answer would bring it nothing (a node's step 1 to central's replica).
                self.stats["answers_spared"] += 1
            else:
                self._answers = [a for a in self._answers if a != asked] + [asked]
            if behind and reply is not None:
                self._step1_to[reply] = None  # only the asker need answer it
            elif behind:
                self._request_step1()
            self._wake_up()
            return
        self.stats["step2_in" if sync.step == YSyncMessageType.SYNC_STEP2 else "updates_in"] += 1
        if sync.data != b"\x00\x00" and not (
            self.writers is not None and self._echo_refused(sender, sync.data)
        ):
            step2 = sync.step == YSyncMessageType.SYNC_STEP2
            self.doc.apply_remote(
                sync.data,
                sender=sender,
                writer_whole=from_writer and step2 and self.sole_asker,
                writer_state=sync.state_vector if from_writer else None,
            )
        behind = sync.state_vector is not None and self._behind(sync.state_vector)
        if behind and sync.data != b"\x00\x00":
            self.doc.may_hold_pending()  # applied with something of the sender's missing
        if sync.step == YSyncMessageType.SYNC_STEP2:
            self.synced_at[sender] = self.clock()
            if from_writer:  # the sole writer's whole answer: see SyncedDoc.settle
                self.doc.settle(complete=not behind)
            if self.on_synced is not None:
                self.on_synced(sender)
        if behind:
            self.stats["resync_requests"] += 1
            self._request_step1()
            self._pending_bytes += len(sync.data)
            if self._pending_bytes > self.max_pending_bytes:
                self._drop_pending(sender)
        elif sync.state_vector is not None:
            self._pending_bytes = 0  # caught up with a sender: nothing is held back

    def _holds_ours(self, remote_state_vector: bytes) -> bool:
        """Whether the holder of ``remote_state_vector`` has every operation we have."""
        theirs = decode_state_vector(remote_state_vector)
        ours = decode_state_vector(self.doc.state_vector())
        return all(theirs.get(client, 0) >= clock for client, clock in ours.items())

    def _reply_topic(self, asker: str) -> str | None:
        """Where an answer only ``asker`` hears goes; None if its name cannot be a topic level
        of ours (then it is answered on our sender topic, as an older peer would)."""
        try:
            return wire.reply_topic(self.doc.name, asker, self.peer_id)
        except ValueError:
            return None

    def _behind(self, remote_state_vector: bytes) -> bool:
        """Whether the holder of ``remote_state_vector`` has operations we lack
        (:meth:`DocLike.missing_from`); a vector equal to ours, the usual answer once an
        update is applied, says no without decoding either."""
        if remote_state_vector == self.doc.state_vector():
            return False
        return self.doc.missing_from(remote_state_vector)

    def _drop_pending(self, sender: str) -> None:
        """Too much applied while still behind: updates whose dependencies never came."""
        self._pending_bytes = 0
        drop = getattr(self.doc, "drop_replica", None)
        authored = getattr(self.doc, "authored_here", None)
        if drop is None or authored is None or authored():
            log.error(
                "doc %s: over %d bytes of updates from %s wait for missing dependencies; "
                "this replica authored content, so it cannot be dropped",
                self.doc.name,
                self.max_pending_bytes,
                sender,
            )
            return
        self.stats["replica_drops"] += 1
        drop()
        self._answers.clear()
        self._step1_to.clear()
        self._request_step1()

    def _follow_epoch(self, sender: str, epoch: int) -> bool:
        """Apply :func:`edgesched.sync.wire.epoch_action`; True if the message is to be
        handled (at our epoch, possibly after adopting the writer's newer one)."""
        if self.writer is not None:
            from_writer = sender == self.writer
        else:
            # A multi-writer document (central's fleet, co-written by the central replicas)
            # follows a fellow writer's newer epoch while it holds nothing of its own: a
            # replica joining a central that rotated its fleet document while it ran alone.
            from_writer = (
                sender in self.relays
                and epochs.newer(epoch, self.doc.epoch)
                and not self.doc.authored_here()
            )
        action = wire.epoch_action(
            self.doc.epoch,
            epoch,
            from_writer=from_writer,
            is_writer=self.writer is not None and self.peer_id == self.writer,
        )
        if action == "apply":
            return True
        if action == "adopt":
            log.info("doc %s: %s moved to epoch %d", self.doc.name, sender, epoch)
            self.doc.reset_to_epoch(epoch)
            self._local.clear()
            self._answers.clear()
            self._step1_to.clear()
            self.stats["epoch_adopted"] += 1
            return True
        if action == "announce":  # the sender is behind: our step 1 tells it our epoch
            self.stats["epoch_stale"] += 1
            self._request_step1()
        elif action == "rotate_past":
            now = self.clock()
            last = self._rotated_past_at
            if last is not None and 0 <= now - last < ROTATE_PAST_EVERY_S:
                self.stats["epoch_rotate_limited"] += 1  # (not logged: the sender sets the pace)
                return False
            self._rotated_past_at = now
            self.stats["epoch_rotated"] += 1
            log.warning(
                "doc %s: %s holds epoch %d, newer than ours (%d): our store lost an epoch; "
                "rotating past it",
                self.doc.name,
                sender,
                epoch,
                self.doc.epoch,
            )
            try:
                self.doc.rotate(min_epoch=epochs.after(epoch))
            except ValueError as exc:
                log.error("doc %s: cannot rotate past epoch %d: %s", self.doc.name, epoch, exc)
        else:
            self.stats["epoch_refused"] += 1
            log.warning(
                "doc %s: dropped epoch %d from %s (only the writer starts epochs)",
                self.doc.name,
                epoch,
                sender,
            )
        return False

    def authors_of(self, sender: str) -> frozenset[int] | None:
        """The client ids whose operations a message from ``sender`` (the topic's last level,
        which the broker's ACL lets only that identity publish) may carry; None: unchecked."""
        if self.writers is None:
            return None
        if sender in self.relays:
            return self.writers
        own = client_id_for(sender)
        return frozenset((own,)) if own in self.writers else frozenset()

    def _echo_refused(self, sender: str, update: bytes) -> bool:
        """Check ``update`` against what ``sender`` may deliver (:meth:`authors_of`): False if
        it may be applied; True if it is an echo to drop (operations it may not deliver, but
        all of them ones we already hold: a reader's answer to a step 1 of ours that crossed
        our own newer update on the way, say); AuthorshipRefused if it brings anything new
        it may not deliver, each inserted item and each deletion checked."""
        authors = self.authors_of(sender)
        if authors is None:
            return False
        try:
            decoded = decode_update(update)
        except UpdateDecodeError as exc:
            raise UpdateRejected(f"update from {sender} is not decodable: {exc}") from None
        if authors:
            violation = decoded_violation(decoded, authors)
        else:
            violation = (
                f"writes nothing in {self.doc.name}: only a writer's own operations are accepted"
            )
        if violation is None:
            return False
        if self._holds_all(decoded):
            self.stats["echoes_dropped"] += 1
            return True
        if authors:
            raise AuthorshipRefused(f"update from {sender} {violation} of {self.doc.name}")
        raise AuthorshipRefused(f"update from {sender}, which {violation}")

    def _holds_all(self, decoded: DecodedUpdate) -> bool:
        """Whether we hold every operation of ``decoded`` (:func:`brings_nothing`). Only asked
        of an update we would otherwise refuse; reading our delete set costs a diff."""
        ours = self.doc.state_vector()
        state = decode_state_vector(ours)
        if decoded.delete_set:
            try:
                deleted = decode_update(self.doc.diff(ours)).delete_set
            except UpdateDecodeError:  # our own encoding: never, but refuse rather than guess
                return False
        else:
            deleted = ()
        return brings_nothing(decoded, state, deleted)


#: A peer's refusal counters (:attr:`DocPeer.stats` keys) and the reason each counts.
REFUSAL_REASONS: dict[str, str] = {
    "rejected_frames": "frame",  # not a frame of ours, corrupt, oversized
    "rejected_payloads": "payload",  # not a y-sync message, or our own client id
    "rejected_updates": "update",  # an update or state vector pycrdt or the decoder refused
    "rejected_senders": "sender",  # a header claiming another peer's client id
    "rejected_authorship": "authorship",  # an operation the sender may not deliver
    "rejected_signatures": "signature",  # unsigned where required, no key, does not verify
    "rejected_replays": "replay",  # a signed message already taken
    "epoch_refused": "epoch",  # a newer epoch from a peer that is not the writer
}


def refusals(stats: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Reason → messages refused, summed over peers' :attr:`DocPeer.stats`."""
    out = dict.fromkeys(REFUSAL_REASONS.values(), 0)
    for one in stats:
        for key, reason in REFUSAL_REASONS.items():
            out[reason] += one[key]
    return out


class AuthorshipRefused(UpdateRejected):
    """An update carrying an operation (an insertion or a deletion) its sender may not
    deliver: not authored under a client id the sender writes with, or, from a relay, under
    no writer's."""


async def wait_converged(
    docs: Iterable[DocLike], timeout: float = 10.0, interval: float = 0.02
) -> float:
    """Wait until every doc has the same content hash; return the seconds it took."""
    docs = list(docs)
    start = time.monotonic()
    while True:
        if len({d.content_hash() for d in docs}) == 1:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            hashes = {d.name + "@" + str(d.client_id): d.content_hash() for d in docs}
            raise TimeoutError(f"docs not converged after {timeout}s: {hashes}")
        await asyncio.sleep(interval)
