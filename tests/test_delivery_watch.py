"""The delivery watch on MQTT 3.1.1 (``DocPeer.watch_echoes``, ``DeliveryStalled``): a
subscription the broker granted but that delivers nothing is noticed by our own message not
coming back, and the session renews the connection with a clean session.

The failure is made for real on a three-member NATS cluster: the JetStream consumer behind a
peer's MQTT subscription is deleted through JetStream's own API (what a consumer stuck after
the cluster re-elected its leaders looks like to the client: the subscription stays granted,
nothing arrives). Neither subscribing again nor a persistent reconnect brings it back (checked
here); a clean session does. On Mosquitto at 3.1.1 the watch must never fire on a healthy link.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest
from conftest import Broker, cancel_all, until
from natscluster import Member, NatsCluster, loopback_cluster, nats_binary
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.sync.doc import SiteDoc
from edgesched.sync.peer import DocPeer, wait_converged
from edgesched.sync.session import Endpoint, Listener, MqttSession
from edgesched.sync.topics import DOC_SYNC_FILTER

DOC = "site-watch"


def jetstream_request(member: Member, subject: str) -> dict[str, object]:
    """One JetStream API request over the NATS client protocol (no NATS client library in
    the project: the protocol is lines of text); its JSON answer."""
    port = int(member.monitor("/varz")["port"])
    with socket.create_connection((member.mqtt_host, port), timeout=5) as sock:
        reader = sock.makefile("rb")
        reader.readline()  # the server's INFO
        sock.sendall(
            b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB _INBOX.watch 1\r\n'
            + f"PUB {subject} _INBOX.watch 0\r\n\r\nPING\r\n".encode()
        )
        while line := reader.readline():
            if line.startswith(b"MSG "):
                size = int(line.split()[-1])
                answer: dict[str, object] = json.loads(reader.read(size + 2)[:-2])
                return answer
            if line.startswith(b"-ERR"):
                raise RuntimeError(line.decode())
    raise RuntimeError(f"no answer to {subject}")


def mqtt_consumers(member: Member) -> set[str]:
    names = jetstream_request(member, "$JS.API.CONSUMER.NAMES.$MQTT_msgs")["consumers"]
    assert isinstance(names, list)
    return set(names)


@pytest.fixture(scope="module")
def nats() -> Iterator[NatsCluster]:
    if nats_binary() is None:
        pytest.skip("nats-server is not installed")
    with loopback_cluster() as cluster:
        yield cluster


Start = Callable[[str, int, str, int, float], tuple[SiteDoc, DocPeer, MqttSession]]


@asynccontextmanager
async def sessions() -> AsyncIterator[Start]:
    """Start peers of one document, each on a 3.1.1 session of its own; all stopped after."""
    tasks: list[asyncio.Task[None]] = []

    def start(
        peer_id: str, client_id: int, host: str, port: int, echo_timeout_s: float
    ) -> tuple[SiteDoc, DocPeer, MqttSession]:
        doc = SiteDoc(DOC, client_id)
        peer = DocPeer(doc, peer_id)
        session = MqttSession(
            Endpoint(host, port, f"watch-{peer_id}", keepalive_s=2, protocol="3.1.1",
                     echo_timeout_s=echo_timeout_s),
            backoff_initial_s=0.1,
            backoff_max_s=0.5,
        )  # fmt: skip
        session.add(peer)
        tasks.append(asyncio.create_task(session.run()))
        return doc, peer, session

    try:
        yield start
    finally:
        await cancel_all(tasks)


async def _stall_b(nats: NatsCluster, start: Start, echo_timeout_s: float, tag: str) -> tuple[
    SiteDoc, SiteDoc, DocPeer, MqttSession
]:  # fmt: skip
    """Peers a (member 1) and b (member 2) in sync; then b's consumers deleted, and a fresh
    write on each side (b's own write is what the watch waits to hear back). ``tag``: the
    peers' names end with it (the cluster is the module's: each test's sessions are new)."""
    first, second = nats.members[0], nats.members[1]
    before = await asyncio.to_thread(mqtt_consumers, first)
    a, _, _ = start(f"peer-a-{tag}", 1, first.mqtt_host, first.mqtt_port, 0.0)
    await until(lambda: mqtt_consumers(first) - before, 10, "a's consumers")
    of_a = await asyncio.to_thread(mqtt_consumers, first)
    b, pb, session_b = start(f"peer-b-{tag}", 2, second.mqtt_host, second.mqtt_port, echo_timeout_s)
    a.set("synced", 1)
    await wait_converged([a, b], timeout=10)
    of_b = await asyncio.to_thread(mqtt_consumers, first) - of_a
    assert of_b, "b's subscription made no JetStream consumer"
    for name in of_b:
        deleted = jetstream_request(first, f"$JS.API.CONSUMER.DELETE.$MQTT_msgs.{name}")
        assert deleted.get("success") is True, deleted
    a.set("after", 2)
    b.set("from-b", 3)
    return a, b, pb, session_b


async def test_a_stalled_subscription_is_renewed_with_a_clean_session(nats: NatsCluster) -> None:
    async with sessions() as start:
        a, b, pb, session_b = await _stall_b(nats, start, echo_timeout_s=1.5, tag="watched")
        await wait_converged([a, b], timeout=20)
    assert b.get("after") == 2 and a.get("from-b") == 3
    assert session_b.stats["delivery_stalled"] >= 1
    assert session_b.stats["connects"] >= 2  # the renewed connection
    assert pb.stats["own_dropped"] >= 1  # the echoes the watch reads


async def test_without_the_watch_the_stalled_subscription_stays_silent(nats: NatsCluster) -> None:
    """The control: the same deleted consumer with the watch off, and b never hears a's write
    although its connection stays up (so the test above passes because of the watch)."""
    async with sessions() as start:
        a, b, pb, session_b = await _stall_b(nats, start, echo_timeout_s=0.0, tag="control")
        await asyncio.sleep(4.0)  # (the watched run above renews within 1.5 s)
        assert b.get("after") is None
        assert session_b.stats["connects"] == 1 and session_b.stats["delivery_stalled"] == 0
        assert pb.connected
    assert a.get("from-b") == 3  # (b's publishing works: only its hearing is gone)


async def test_no_stall_on_a_healthy_mosquitto_at_3_1_1(broker: Broker) -> None:
    """Echoes come back at once on a working link: a short watch never fires over a busy run."""
    async with sessions() as start:
        a, pa, session_a = start("peer-a", 1, "127.0.0.1", broker.port, 0.5)
        b, pb, session_b = start("peer-b", 2, "127.0.0.1", broker.port, 0.5)
        await until(lambda: pa.connected and pb.connected, 10, "both connected")
        for i in range(60):
            a.set(f"a{i}", i)
            b.set(f"b{i}", i)
            await asyncio.sleep(0.05)
        await wait_converged([a, b], timeout=10)
        await asyncio.sleep(1.0)  # (past the watch's timeout after the last write)
    assert pa.stats["own_dropped"] >= 10 and pb.stats["own_dropped"] >= 10
    assert session_a.stats["delivery_stalled"] == session_b.stats["delivery_stalled"] == 0
    assert session_a.stats["connects"] == session_b.stats["connects"] == 1


class Wildcard(Listener):
    """Subscribes every document's sync topics and drops what it hears: as central's replicas
    (the session's fallback, subscribed last) carry its policy peer's messages."""

    routes: tuple[str, ...] = ()
    subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
        (DOC_SYNC_FILTER, SubscribeOptions(qos=1)),
    )

    def handle(self, topic: str, payload: bytes) -> None:
        return None


async def test_the_watch_starts_once_the_subscription_carrying_the_echo_is_made(
    broker: Broker,
) -> None:
    """A peer that subscribes nothing itself (central's policy peer) starts serving, and sends
    its step 1, before the fallback's wildcard that carries its echo is subscribed: that first
    message never comes back, and the watch must not count it (a NATS field test renewed
    central's connection 10 s after every start until the watch waited for the session's
    subscriptions)."""
    doc = SiteDoc(DOC, 3)
    peer = DocPeer(doc, "central-x", subscribe=False)
    session = MqttSession(
        Endpoint("127.0.0.1", broker.port, "watch-central-x", keepalive_s=2, protocol="3.1.1",
                 echo_timeout_s=0.5),
        backoff_initial_s=0.1,
        fallback=Wildcard(),
    )  # fmt: skip
    session.add(peer)
    task = asyncio.create_task(session.run())
    try:
        await until(lambda: peer.connected, 10, "the peer served")
        await asyncio.sleep(1.0)  # (past the timeout of the step 1 sent ahead of the wildcard)
        for i in range(5):
            doc.set(f"k{i}", i)
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert peer.stats["own_dropped"] >= 1
    assert session.stats["delivery_stalled"] == 0 and session.stats["connects"] == 1


def test_the_watch_is_only_for_peers_that_hear_their_own_topic() -> None:
    """On 3.1.1 a peer hearing its document's whole sync filter is watched; one listening to
    named peers only (a node following central's documents) never hears itself, so is not;
    and on MQTT 5 (no-local) no peer is."""
    for protocol, listen_to, watched in (
        ("3.1.1", None, True),
        ("3.1.1", ["central"], False),
        ("5", None, False),
    ):
        session = MqttSession(Endpoint("127.0.0.1", 1883, f"w-{protocol}", protocol=protocol))
        peer = DocPeer(SiteDoc(DOC, 7), "gw-1", listen_to=listen_to)
        session.add(peer)
        assert (peer.echo_timeout_s > 0) is watched, (protocol, listen_to)
