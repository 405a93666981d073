"""The MQTT session: cancellation guards (the cause of a CI hang), and one connection per
peer carrying several channels through a real Mosquitto with the fleet's ACL, TLS or passwords."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import glob
import json
import math
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import pytest
from conftest import Broker, free_port
from paho.mqtt.subscribeoptions import SubscribeOptions

from edgesched.central.heartbeat import Heartbeat
from edgesched.config import MqttConfig
from edgesched.core.task import TaskState
from edgesched.edge.link import CentralLink
from edgesched.sync import security as sec
from edgesched.sync import session as session_mod
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import TaskReport
from edgesched.sync.session import (
    SUBSCRIBE_ATTEMPTS,
    Endpoint,
    MqttSession,
    checked,
    first_failure,
    reraise_if_cancelling,
)
from edgesched.sync.topics import status_topic

#: A node's report of a running task (the content these documents sync).
RUNNING = TaskReport(state=TaskState.RUNNING, updated_at=1.0)


async def _race(guard: bool) -> asyncio.Task[None]:
    """A cancel that lands in the same loop iteration as the awaited future's result: Python
    3.11's wait_for (used by aiomqtt for every publish) returns the result and drops it."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    parked = asyncio.Event()

    async def child() -> None:
        call = asyncio.wait_for(fut, 5)
        await (checked(call) if guard else call)
        await parked.wait()  # a send loop idling for work

    task = asyncio.create_task(child())
    await asyncio.sleep(0)
    fut.set_result(1)
    task.cancel()
    await asyncio.wait({task}, timeout=0.5)
    return task


async def test_checked_keeps_a_cancel_that_wait_for_dropped() -> None:
    task = await _race(guard=True)
    assert task.done() and task.cancelled()


async def test_the_race_is_real_without_the_guard() -> None:
    """Guards the guard: if this starts failing, the interpreter fixed the race and
    :func:`checked` is no longer needed."""
    task = await _race(guard=False)
    if task.done():  # pragma: no cover - interpreters without the race
        pytest.skip("this interpreter's wait_for does not drop the cancel")
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.cancelled()


async def test_reraise_if_cancelling_only_when_a_cancel_is_pending() -> None:
    reraise_if_cancelling()  # no cancel pending: nothing happens
    me = asyncio.current_task()
    assert me is not None
    me.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)
    with pytest.raises(asyncio.CancelledError):
        reraise_if_cancelling()
    me.uncancel()


async def test_first_failure_cancels_the_sibling_and_raises_its_error() -> None:
    sibling_cancelled = asyncio.Event()

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ConnectionError("lost")

    async def idles() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            sibling_cancelled.set()
            raise

    with pytest.raises(ConnectionError, match="lost"):
        await first_failure(idles(), fails())
    assert sibling_cancelled.is_set()
    me = asyncio.current_task()
    assert me is not None and me.cancelling() == 0  # unlike 3.11's TaskGroup


async def test_first_failure_is_cancelled_as_a_whole() -> None:
    finished: list[str] = []

    async def loop(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            finished.append(name)

    task = asyncio.create_task(first_failure(loop("a"), loop("b")))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(finished) == ["a", "b"]


# --- one connection per peer, against a real Mosquitto with the generated ACL ------------------


def _secured_broker(tmp: Path, *, tls: bool) -> tuple[Broker, sec.CaFiles, Path]:
    """Mosquitto as the fleet runs it: no anonymous access, use_username_as_clientid, the ACL;
    TLS with client certificates, or (loopback only) passwords."""
    port = free_port()
    ca = sec.make_ca(tmp / "ca")
    acl_path = tmp / "acl"
    acl_path.write_text(sec.acl(["central"]))
    if tls:
        server = sec.issue(ca, "broker", tmp / "server", server_names=("127.0.0.1",))
        for name in ("node-a", "central"):
            sec.issue(ca, name, tmp / "clients")
        conf = sec.broker_config(
            port=port, ca=ca, server_cert=server, acl_path=acl_path, user=getpass.getuser()
        )
    else:
        users = {"node-a": "a-secret", "central": "c-secret"}
        for name, secret in users.items():
            (tmp / f"{name}.pw").write_text(secret + "\n")
        pw = sec.write_password_file(tmp / "passwords", users)
        conf = sec.broker_config(
            port=port, acl_path=acl_path, password_file=pw, tls=False, user=getpass.getuser()
        )
    (tmp / "mosquitto.conf").write_text(conf)
    broker = Broker(port, None, tmp / "mosquitto.conf", tmp / "mosquitto.log")  # type: ignore[arg-type]
    broker.start()
    return broker, ca, tmp


def _mqtt(tmp: Path, port: int, name: str, *, tls: bool) -> MqttConfig:
    if tls:
        return MqttConfig(
            port=port,
            tls=True,
            ca_file=str(tmp / "ca" / "ca.crt"),
            cert_file=str(tmp / "clients" / f"{name}.crt"),
            key_file=str(tmp / "clients" / f"{name}.key"),
            keepalive_s=2,
        )
    return MqttConfig(port=port, password_file=str(tmp / f"{name}.pw"), keepalive_s=2)


async def _until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("tls", [False, True], ids=["password", "tls"])
async def test_one_connection_carries_link_and_document(tmp_path: Path, tls: bool) -> None:
    """A node's heartbeat link and its document peer share one connection under the node's
    identity (two would take each other over: use_username_as_clientid), through the ACL."""
    broker, _, tmp = _secured_broker(tmp_path, tls=tls)
    try:
        node_cfg = _mqtt(tmp, broker.port, "node-a", tls=tls)
        link = CentralLink("node-a", node_cfg)
        node_doc = NodeDoc("node-node-a", client_id_for("node-a"))
        node = MqttSession(node_cfg.endpoint("node-a"), will=link.will(), backoff_max_s=0.5)
        node.add(link)
        node.add(DocPeer(node_doc, "node-a"))

        replica = NodeDoc("node-node-a", client_id_for("central"))
        heard: list[tuple[str, bytes]] = []
        central = MqttSession(
            _mqtt(tmp, broker.port, "central", tls=tls).endpoint("central"), backoff_max_s=0.5
        )
        central.add(DocPeer(replica, "central"))
        central.add(_Recorder(status_topic("node-a"), heard))
        central.add(Heartbeat("central", interval_s=0.2))
        node_doc.put_task("t1", RUNNING)

        async with asyncio.TaskGroup() as group:
            runs = [group.create_task(node.run()), group.create_task(central.run())]
            await _until(lambda: node.connected and central.connected)
            await _until(lambda: replica.task("t1") is not None)
            assert replica.content_hash() == node_doc.content_hash()
            # central's heartbeat reaches the node's link over the same connection
            await _until(lambda: link.last_heard is not None)
            await _until(lambda: any(b'"online"' in p for _, p in heard))
            node_doc.put_task("t2", RUNNING)
            await _until(lambda: replica.task("t2") is not None)
            await asyncio.sleep(1.0)  # a second connection as node-a would have kicked us off
            assert node.stats["connects"] == 1 and central.stats["connects"] == 1
            assert link.broker_connected
            # both sockets send small packets at once (no Nagle wait for an ACK)
            socks = [c._client._sock for c in list(session_mod._publish_gates) if c._client._sock]
            assert len(socks) >= 2
            for sock in socks:
                assert isinstance(sock, socket.socket)  # (an SSLSocket is one too)
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            for run in runs:
                run.cancel()
    finally:
        broker.stop()


class _Recorder:
    """A channel that records what arrives on one topic."""

    def __init__(self, topic: str, into: list[tuple[str, bytes]]) -> None:
        self.routes: tuple[str, ...] = (topic,)
        self.subscriptions: tuple[tuple[str, SubscribeOptions], ...] = (
            (topic, SubscribeOptions(qos=1)),
        )
        self.into = into

    async def serve(self, client: aiomqtt.Client) -> None:
        return None

    def handle(self, topic: str, payload: bytes) -> None:
        self.into.append((topic, payload))

    def disconnected(self) -> None:
        return None


async def test_publishes_pending_on_one_client_are_bounded(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiomqtt scans every pending call on each new publish: thousands at once cost O(N^2) and
    held central's loop for seconds. Through :func:`edgesched.sync.session.publish` no more
    than ``MAX_PENDING_PUBLISHES`` are ever inside ``client.publish`` at once, and every one
    of a larger burst is still delivered, in order of asking."""
    from edgesched.sync import session as session_module

    monkeypatch.setattr(session_module, "MAX_PENDING_PUBLISHES", 8)
    received: list[bytes] = []
    ready = asyncio.Event()

    async def ear() -> None:
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="ear") as client:
            await client.subscribe("bounded/#", qos=1)
            ready.set()
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                received.append(message.payload)

    listening = asyncio.create_task(ear())
    await asyncio.wait_for(ready.wait(), 10)
    inside = peak = 0
    try:
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="burst") as client:
            real = client.publish

            async def counting(*args: object, **kwargs: object) -> None:
                nonlocal inside, peak
                inside += 1
                peak = max(peak, inside)
                try:
                    await real(*args, **kwargs)  # type: ignore[arg-type]
                finally:
                    inside -= 1

            monkeypatch.setattr(client, "publish", counting)
            burst = [f"{i:04d}".encode() for i in range(300)]
            await asyncio.gather(
                *(session_module.publish(client, "bounded/x", p, qos=1) for p in burst)
            )
            deadline = asyncio.get_running_loop().time() + 10
            while len(received) < len(burst):
                assert asyncio.get_running_loop().time() < deadline, len(received)
                await asyncio.sleep(0.02)
        assert 1 < peak <= 8
        assert sorted(received) == burst
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
            await listening


# --- a subscription the broker refuses -------------------------------------------------------


def _dynsec_plugin() -> str:
    """Mosquitto's dynamic-security plugin (in Debian's ``mosquitto`` package)."""
    found = sorted(glob.glob("/usr/lib/*/mosquitto_dynamic_security.so"))
    if not found:
        pytest.fail("mosquitto_dynamic_security.so not found: run `make setup`")
    return found[0]


def _dynsec_broker(tmp: Path) -> Broker:
    """Mosquitto whose anonymous clients may subscribe to ``open/#`` and to nothing else
    (Mosquitto 2.0's plain ACL file grants every SUBSCRIBE and filters at delivery; its
    dynamic-security plugin refuses one), and may change that role over ``$CONTROL``."""
    port = free_port()
    control = "$CONTROL/dynamic-security/#"
    roles = [
        {
            "rolename": "anon",
            "acls": [
                {"acltype": "subscribePattern", "topic": "open/#", "allow": True},
                {"acltype": "publishClientSend", "topic": "#", "allow": True},
                {"acltype": "publishClientSend", "topic": control, "allow": True},
            ],
        }
    ]
    dynsec = {
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": True,
            "subscribe": False,
            "unsubscribe": True,
        },
        "clients": [],
        "groups": [{"groupname": "anon", "roles": [{"rolename": "anon"}]}],
        "roles": roles,
        "anonymousGroup": "anon",
    }
    (tmp / "dynsec.json").write_text(json.dumps(dynsec))
    conf = tmp / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        f"plugin {_dynsec_plugin()}\nplugin_opt_config_file {tmp / 'dynsec.json'}\n"
        f"user {getpass.getuser()}\n"
    )
    broker = Broker(port, None, conf, tmp / "mosquitto.log")  # type: ignore[arg-type]
    broker.start()
    return broker


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_a_refused_subscription_is_asked_again_until_granted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """A SUBACK with a failure code is not a subscription: aiomqtt hands the code back without
    raising, and a session that took it as made would never hear the topic (NATS refuses one
    now and then while JetStream is busy after a member's death). The session asks again,
    renews the connection after SUBSCRIBE_ATTEMPTS refusals, and once the broker grants the
    filter the channel is served and hears it."""
    monkeypatch.setattr(session_mod, "SUBSCRIBE_RETRY_S", 0.05)
    broker = _dynsec_broker(tmp_path)
    try:
        heard: list[tuple[str, bytes]] = []
        recorder = _Recorder("closed/x", heard)
        served: list[bool] = []
        recorder.serve = lambda client: _note(served)  # type: ignore[method-assign]
        endpoint = Endpoint("127.0.0.1", broker.port, "refused-sub", protocol=protocol)
        session = MqttSession(endpoint, backoff_initial_s=0.05, backoff_max_s=0.2)
        session.add(recorder)
        async with asyncio.TaskGroup() as group:
            run = group.create_task(session.run())
            await _until(lambda: session.stats["subscribe_refused"] >= 2 * SUBSCRIBE_ATTEMPTS)
            assert served == []  # a refused channel is never served
            assert session.stats["connects"] >= 2  # renewed after SUBSCRIBE_ATTEMPTS refusals
            grant = {
                "commands": [
                    {
                        "command": "addRoleACL",
                        "rolename": "anon",
                        "acltype": "subscribePattern",
                        "topic": "closed/#",
                        "allow": True,
                    }
                ]
            }
            async with aiomqtt.Client("127.0.0.1", broker.port) as admin:
                await admin.publish("$CONTROL/dynamic-security/v1", json.dumps(grant), qos=0)
            await _until(lambda: served != [])
            async with aiomqtt.Client("127.0.0.1", broker.port) as pub:
                await pub.publish("closed/x", b"heard", qos=1)
            await _until(lambda: ("closed/x", b"heard") in heard)
            run.cancel()
    finally:
        broker.stop()


async def _note(served: list[bool]) -> None:
    served.append(True)


class _Slow(_Recorder):
    """A channel whose messages each take ``cost_s`` of the loop's time (a merge), and which
    notes in which turn of the event loop (``turns[0]``) each message was handled."""

    def __init__(
        self, topic: str, into: list[tuple[str, bytes]], cost_s: float, turns: list[int]
    ) -> None:
        super().__init__(topic, into)
        self.cost_s = cost_s
        self.turns = turns
        self.handled_in: list[int] = []

    def handle(self, topic: str, payload: bytes) -> None:
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        self.handled_in.append(self.turns[0])
        super().handle(topic, payload)


async def test_a_batch_of_costly_messages_yields_to_the_loop(broker: Broker) -> None:
    """200 messages of 1 ms each arrive at once (a heal's documents): the session hands them
    all out, in order, but gives the event loop a turn after at most DISPATCH_TURN_S of
    handling, not after a whole read batch (64 × 1 ms).

    Counted, not timed: a task that only yields counts the loop's turns, and no turn may
    handle more messages than fit in DISPATCH_TURN_S (plus the one that crosses it). A slow
    machine makes the turns shorter in messages, never longer, so this cannot flake; the
    check that some turn handled several shows the messages did arrive as batches."""
    heard: list[tuple[str, bytes]] = []
    turns = [0]
    slow = _Slow("heal/#", heard, 0.001, turns)
    session = MqttSession(Endpoint("127.0.0.1", broker.port, "slow-sub"), backoff_max_s=0.2)
    session.add(slow)

    async def count_turns() -> None:
        while True:
            await asyncio.sleep(0)
            turns[0] += 1

    async with asyncio.TaskGroup() as group:
        run = group.create_task(session.run())
        await _until(lambda: session.connected)
        await asyncio.sleep(0.3)  # (subscribed)
        counter = group.create_task(count_turns())
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="healer") as pub:
            for k in range(200):
                await pub.publish(f"heal/{k}", str(k).encode(), qos=0)
        await _until(lambda: len(heard) == 200, 30)
        counter.cancel()
        run.cancel()
    assert [int(p) for _, p in heard] == list(range(200))
    per_turn = Counter(slow.handled_in)
    most = math.ceil(session_mod.DISPATCH_TURN_S / slow.cost_s) + 1
    assert max(per_turn.values()) <= most, per_turn.most_common(3)
    assert max(per_turn.values()) >= 2, per_turn.most_common(3)
