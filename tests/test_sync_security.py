"""Broker security against a real Mosquitto: TLS client certificates, the ACL, password mode.

Every ACL claim is checked by what is *delivered* (a SUBACK or PUBACK proves nothing).
"""

from __future__ import annotations

import getpass
import os
import queue
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from conftest import Broker, free_port
from cryptography import x509
from cryptography.x509.oid import NameOID
from paho.mqtt.enums import CallbackAPIVersion

from edgesched.sync import logstream, wire
from edgesched.sync import security as sec

ROOT = "edgesched/v1"


@dataclass
class Pki:
    ca: sec.CaFiles
    server: sec.CertFiles
    certs: dict[str, sec.CertFiles]
    rogue: sec.CertFiles  # "node-a" signed by another CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = sec.make_ca(d / "ca")
    server = sec.issue(ca, "broker", d / "server", server_names=("localhost", "127.0.0.1"))
    certs = {n: sec.issue(ca, n, d / "clients") for n in ("node-a", "node-b", "node-c", "central")}
    other = sec.make_ca(d / "other-ca", name="someone-else")
    rogue = sec.issue(other, "node-a", d / "rogue")
    return Pki(ca, server, certs, rogue)


def start_broker(tmp: Path, conf_text: str, port: int) -> Broker:
    conf = tmp / "mosquitto.conf"
    conf.write_text(conf_text)
    broker = Broker(port, None, conf, tmp / "mosquitto.log")  # type: ignore[arg-type]
    broker.start()
    return broker


@pytest.fixture
def tls_broker(pki: Pki, tmp_path: Path) -> Iterator[Broker]:
    port = free_port()
    acl_path = tmp_path / "acl"
    acl_path.write_text(sec.acl(["central"]))
    conf = sec.broker_config(
        port=port,
        ca=pki.ca,
        server_cert=pki.server,
        acl_path=acl_path,
        user=getpass.getuser(),  # as root Mosquitto would switch to `mosquitto` (no key access)
    )
    broker = start_broker(tmp_path, conf, port)
    try:
        yield broker
    finally:
        broker.stop()


@dataclass
class Conn:
    client: mqtt.Client
    messages: queue.Queue[tuple[str, bytes]] = field(default_factory=queue.Queue)

    def subscribe(self, topic: str) -> None:
        done: queue.Queue[object] = queue.Queue()
        self.client.on_subscribe = lambda *a: done.put(a)
        self.client.subscribe(topic, qos=1)
        done.get(timeout=5)

    def publish(self, topic: str, payload: bytes = b"x") -> None:
        info = self.client.publish(topic, payload, qos=1)
        info.wait_for_publish(5)  # PUBACK: also sent for a publish the ACL dropped

    def drain(self) -> list[tuple[str, bytes]]:
        out = []
        while True:
            try:
                out.append(self.messages.get_nowait())
            except queue.Empty:
                return out

    def wait_for(self, topic: str, timeout: float = 5.0) -> list[tuple[str, bytes]]:
        """Every message up to and including the first on ``topic``."""
        seen: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.messages.get(timeout=0.05)
            except queue.Empty:
                continue
            seen.append(msg)
            if msg[0] == topic:
                return seen
        raise AssertionError(f"{topic} not delivered in {timeout}s; got {seen}")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def connect(
    port: int,
    *,
    ca: Path | None,
    cert: sec.CertFiles | None = None,
    username: str | None = None,
    password: str | None = None,
    client_id: str = "",
    timeout: float = 5.0,
) -> Conn:
    """A connected paho client; ConnectionError if the broker does not accept it."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311)
    client.reconnect_delay_set(30, 30)  # a refused client must not retry within the test
    if ca is not None:
        client.tls_set(
            ca_certs=str(ca),
            certfile=None if cert is None else str(cert.cert),
            keyfile=None if cert is None else str(cert.key),
        )
    if username is not None:
        client.username_pw_set(username, password)
    conn = Conn(client)
    events: queue.Queue[tuple[str, object]] = queue.Queue()
    client.on_connect = lambda c, u, f, rc, p: events.put(("connect", rc))
    client.on_disconnect = lambda c, u, f, rc, p: events.put(("disconnect", rc))
    client.on_message = lambda c, u, m: conn.messages.put((m.topic, bytes(m.payload)))
    try:
        client.connect("127.0.0.1", port, keepalive=10)
    except OSError as exc:  # ssl.SSLError included
        raise ConnectionError(f"connect failed: {exc}") from exc
    client.loop_start()
    try:
        kind, rc = events.get(timeout=timeout)
    except queue.Empty:
        kind, rc = "timeout", None
    if kind != "connect" or getattr(rc, "is_failure", True):
        client.loop_stop()
        client.disconnect()
        raise ConnectionError(f"not accepted: {kind} {rc}")
    return conn


def node(pki: Pki, broker: Broker, name: str, client_id: str = "") -> Conn:
    return connect(broker.port, ca=pki.ca.cert, cert=pki.certs[name], client_id=client_id)


def topics(msgs: list[tuple[str, bytes]]) -> set[str]:
    return {t for t, _ in msgs}


def test_node_cannot_publish_or_read_as_another_node(pki: Pki, tls_broker: Broker) -> None:
    central = node(pki, tls_broker, "central")
    a = node(pki, tls_broker, "node-a")
    b = node(pki, tls_broker, "node-b")
    try:
        central.subscribe(f"{ROOT}/#")
        a.subscribe(f"{ROOT}/#")  # granted (SUBACK), yet filtered per message on delivery
        forged = [
            f"{ROOT}/node/node-b/status",
            f"{ROOT}/doc/node-b/sync/node-b",
            f"{ROOT}/doc/node-b/sync/node-a",  # injecting into node-b's private doc
            f"{ROOT}/central/heartbeat",
            f"{ROOT}/doc/policy/sync/central",
            f"{ROOT}/doc/desired-node-b/sync/node-a",  # into node-b's desired state
            f"{ROOT}/doc/desired-node-a/sync/central",  # as central, into its own
            f"{ROOT}/doc/fleet/sync/node-a",  # into the fleet's desired state
        ]
        for t in forged:
            a.publish(t, b"forged")
        own = [
            f"{ROOT}/node/node-a/status",
            f"{ROOT}/doc/node-node-a/sync/node-a",
            f"{ROOT}/doc/policy/sync/node-a",
            f"{ROOT}/doc/desired-node-a/sync/node-a",
        ]
        for t in own:
            a.publish(t, b"own")
        b.publish(f"{ROOT}/doc/node-node-b/sync/node-b", b"private-b")
        b.publish(f"{ROOT}/node/node-b/status", b"status-b")
        # node-b's step 1 of the policy: central hears it, no other node does (issue 13)
        b.publish(f"{ROOT}/doc/policy/sync/node-b", b"policy-step1-b")
        central.publish(f"{ROOT}/central/heartbeat", b'{"central": "central"}')
        central.publish(f"{ROOT}/doc/policy/sync/central", b"policy")
        central.publish(f"{ROOT}/doc/node-node-b/sync/central", b"to-b")
        central.publish(f"{ROOT}/doc/desired-node-a/sync/central", b"desired-a")
        central.publish(f"{ROOT}/doc/desired-node-b/sync/central", b"desired-b")
        central.publish(f"{ROOT}/doc/fleet/sync/central", b"fleet")
        central.publish(f"{ROOT}/node/end", b"sentinel")  # central reads all; a does not
        central.publish(f"{ROOT}/doc/policy/sync/end", b"sentinel")  # ordered after the rest
        time.sleep(1.0)

        got_central = central.drain()
        # some forged topics are legitimately used by their owners: judge by payload
        assert all(p != b"forged" for _, p in got_central), got_central
        assert not [t for t in topics(got_central) if t.startswith(f"{ROOT}/doc/node-b/")]
        assert set(own) <= topics(got_central)
        assert f"{ROOT}/doc/node-node-b/sync/node-b" in topics(got_central)
        assert (f"{ROOT}/doc/policy/sync/node-b", b"policy-step1-b") in got_central

        got_a = a.drain()
        # node-a hears central's heartbeat and policy, and its own doc/status (echo)...
        assert {f"{ROOT}/central/heartbeat", f"{ROOT}/doc/policy/sync/central"} <= topics(got_a)
        # ...its own desired state, but neither another node's nor the fleet's
        assert (f"{ROOT}/doc/desired-node-a/sync/central", b"desired-a") in got_a
        assert not [t for t in topics(got_a) if "/doc/fleet/" in t], got_a
        assert f"{ROOT}/node/node-a/status" in topics(got_a)
        # ...but nothing of node-b: neither its private doc nor its status, nor its step 1
        # of the policy, nor central's traffic to it.
        assert not [t for t in topics(got_a) if "node-b" in t], got_a
        assert f"{ROOT}/node/end" not in topics(got_a)
    finally:
        for c in (central, a, b):
            c.close()
    assert tls_broker.log is not None
    log = tls_broker.log.read_text()
    # exactly one listener: the configured one (no implicit default listener on 1883)
    assert re.findall(r"listen socket on port (\d+)", log) == [str(tls_broker.port)], log


def test_reply_topics_reach_only_their_asker(pki: Pki, tls_broker: Broker) -> None:
    """Central's answers to a node's step 1 of the policy (``doc/policy/reply/<node>/<central>``)
    reach that node only: another node may subscribe (Mosquitto grants it) but is delivered
    nothing, and may not publish on any reply topic, neither as itself nor as central."""
    central = node(pki, tls_broker, "central")
    a = node(pki, tls_broker, "node-a")
    b = node(pki, tls_broker, "node-b")
    to_a = wire.reply_topic("policy", "node-a", "central")
    to_b = wire.reply_topic("policy", "node-b", "central")
    try:
        central.subscribe(f"{ROOT}/#")
        a.subscribe(wire.reply_filter("policy", "node-a"))
        a.subscribe(wire.reply_filter("policy", "node-b"))  # another's: granted, not delivered
        a.subscribe(f"{ROOT}/doc/+/reply/#")
        a.subscribe(wire.sync_filter("policy"))
        b.subscribe(wire.reply_filter("policy", "node-b"))
        b.subscribe(wire.sync_filter("policy"))
        central.publish(to_a, b"answer-a")
        central.publish(to_b, b"answer-b")
        central.publish(wire.reply_topic("desired-node-b", "node-b", "central"), b"desired-b")
        for forged in (
            to_b,  # as central, to node-b
            wire.reply_topic("policy", "node-b", "node-a"),  # as itself, to node-b
            wire.reply_topic("policy", "node-a", "node-a"),  # even to itself
            wire.reply_topic("policy", "central", "node-a"),  # to central
        ):
            a.publish(forged, b"forged")
        central.publish(wire.sync_topic("policy", "central"), b"live")  # everyone hears it
        got_a = a.wait_for(wire.sync_topic("policy", "central"))
        got_b = b.wait_for(wire.sync_topic("policy", "central"))
        time.sleep(0.5)
        got_a += a.drain()
        got_b += b.drain()
        got_central = central.drain()
        assert sorted(got_a) == [
            (to_a, b"answer-a"),
            (wire.sync_topic("policy", "central"), b"live"),
        ]
        assert sorted(got_b) == [
            (to_b, b"answer-b"),
            (wire.sync_topic("policy", "central"), b"live"),
        ]
        assert all(p != b"forged" for _, p in got_central), got_central
    finally:
        for c in (central, a, b):
            c.close()


def test_client_id_of_another_node_is_replaced(pki: Pki, tls_broker: Broker) -> None:
    central = node(pki, tls_broker, "central")
    b = node(pki, tls_broker, "node-b", client_id="node-b")
    try:
        central.subscribe(f"{ROOT}/node/#")
        # node-a asks for node-b's client id; use_username_as_clientid gives it "node-a",
        # so node-b's session is neither taken over nor kicked.
        a = node(pki, tls_broker, "node-a", client_id="node-b")
        a.publish(f"{ROOT}/node/node-b/status", b"forged")
        b.publish(f"{ROOT}/node/node-b/status", b"real")
        msgs = central.wait_for(f"{ROOT}/node/node-b/status")
        assert msgs[-1][1] == b"real"
        time.sleep(0.2)
        assert b.client.is_connected()  # a session takeover would have disconnected node-b
        a.close()
    finally:
        central.close()
        b.close()


def test_a_packet_past_max_packet_size_reaches_nobody(pki: Pki, tls_broker: Broker) -> None:
    """The generated config caps packets at MAX_PACKET_SIZE (20 MiB reached every peer
    before): the broker drops the sender instead of delivering it; a packet at the cap
    still goes through (every frame and message of the project is below it)."""
    assert f"max_packet_size {sec.MAX_PACKET_SIZE}" in tls_broker.conf.read_text()
    central = node(pki, tls_broker, "central")
    a = node(pki, tls_broker, "node-a")
    try:
        central.subscribe(f"{ROOT}/node/#")
        topic = f"{ROOT}/node/node-a/telemetry"
        big = b"x" * (sec.MAX_PACKET_SIZE + 1)
        a.client.publish(topic, big, qos=1)
        deadline = time.monotonic() + 5
        while a.client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not a.client.is_connected()  # the broker closed the connection
        time.sleep(0.3)
        assert all(len(p) <= sec.MAX_PACKET_SIZE for _, p in central.drain())
        a.close()
        a = node(pki, tls_broker, "node-a")
        fits = b"y" * (sec.MAX_PACKET_SIZE - len(topic) - 64)
        a.publish(topic, fits)
        assert central.wait_for(topic)[-1][1] == fits
    finally:
        a.close()
        central.close()


def test_unauthenticated_clients_cannot_connect(pki: Pki, tls_broker: Broker) -> None:
    port = tls_broker.port
    with pytest.raises(ConnectionError):  # TLS without a client certificate
        connect(port, ca=pki.ca.cert, timeout=3)
    with pytest.raises(ConnectionError):  # a "node-a" certificate from another CA
        connect(port, ca=pki.ca.cert, cert=pki.rogue, timeout=3)
    with pytest.raises(ConnectionError):  # the server's certificate is not a client's
        connect(port, ca=pki.ca.cert, cert=pki.server, timeout=3)
    with pytest.raises(ConnectionError):  # plain MQTT on the TLS port, even with a password
        connect(port, ca=None, username="central", password="x", timeout=3)
    node(pki, tls_broker, "node-a").close()  # and a proper certificate does connect


def test_plain_listener_refused_off_loopback(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    for bind in ("0.0.0.0", "::", "192.168.1.10", "broker.example"):
        with pytest.raises(ValueError, match="non-loopback"):
            sec.broker_config(port=1883, bind=bind, acl_path=tmp_path, password_file=pw, tls=False)
    conf = sec.broker_config(
        port=1883,
        bind="0.0.0.0",
        acl_path=tmp_path,
        password_file=pw,
        tls=False,
        allow_plain_non_loopback=True,
    )
    assert "listener 1883 0.0.0.0" in conf
    with pytest.raises(ValueError, match="password_file"):
        sec.broker_config(port=1883, acl_path=tmp_path, tls=False)
    with pytest.raises(ValueError, match="ca and server_cert"):
        sec.broker_config(port=1883, acl_path=tmp_path)
    with pytest.raises(ValueError, match="Mosquitto config"):
        sec.broker_config(port=1883, acl_path=Path("x\nallow_anonymous true"), password_file=pw)


def test_loopback_password_mode(tmp_path: Path) -> None:
    users = {"central": "c-secret", "node-a": "a-secret", "node-b": "b-secret"}
    pw = sec.write_password_file(tmp_path / "passwords", users)
    assert stat.S_IMODE(pw.stat().st_mode) == 0o600
    assert "a-secret" not in pw.read_text()  # hashed by mosquitto_passwd -U
    acl_path = tmp_path / "acl"
    acl_path.write_text(sec.acl(["central"]))
    port = free_port()
    conf = sec.broker_config(
        port=port,
        acl_path=acl_path,
        password_file=pw,
        tls=False,
        persistence_dir=tmp_path / "db",
        user=getpass.getuser(),
    )
    (tmp_path / "db").mkdir()
    broker = start_broker(tmp_path, conf, port)
    try:
        with pytest.raises(ConnectionError):
            connect(port, ca=None, username="node-a", password="wrong", timeout=3)
        with pytest.raises(ConnectionError):
            connect(port, ca=None, timeout=3)  # anonymous
        central = connect(port, ca=None, username="central", password="c-secret")
        a = connect(port, ca=None, username="node-a", password="a-secret")
        try:
            central.subscribe(f"{ROOT}/#")
            a.publish(f"{ROOT}/node/node-b/status", b"forged")
            a.publish(f"{ROOT}/node/node-a/status", b"own")
            msgs = central.wait_for(f"{ROOT}/node/node-a/status")
            time.sleep(0.3)
            msgs += central.drain()
            assert topics(msgs) == {f"{ROOT}/node/node-a/status"}, msgs
        finally:
            a.close()
            central.close()
    finally:
        broker.stop()


def test_accept_sender_rejects_claims_of_another_writer() -> None:
    expected = {"central": 1, "node-a": 1001, "node-b": 1002}
    topic = f"{ROOT}/doc/node-node-a/sync/node-a"
    assert sec.accept_sender(topic, 1001, expected)
    assert not sec.accept_sender(topic, 1002, expected)  # node-a claiming node-b's writer
    assert not sec.accept_sender(topic, 1, expected)  # ... or central's
    assert not sec.accept_sender(f"{ROOT}/doc/x/sync/node-c", 1003, expected)  # unknown peer
    assert not sec.accept_sender(f"{ROOT}/doc/x/sync/node-a/extra", 1001, expected)
    assert not sec.accept_sender(f"{ROOT}/node/node-a/status", 1001, expected)
    assert not sec.accept_sender("other/doc/x/sync/node-a", 1001, expected)
    assert not sec.accept_sender(topic, True, expected)


def test_certificates(pki: Pki, tmp_path: Path) -> None:
    for files in (pki.ca, pki.server, pki.certs["node-a"]):
        assert stat.S_IMODE(os.stat(files.key).st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(pki.certs["node-a"].cert.read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node-a"
    server = x509.load_pem_x509_certificate(pki.server.cert.read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    before = pki.certs["node-a"].key.read_bytes()
    with pytest.raises(FileExistsError):
        sec.issue(pki.ca, "node-a", pki.certs["node-a"].cert.parent)
    with pytest.raises(FileExistsError):
        sec.make_ca(pki.ca.cert.parent)
    assert pki.certs["node-a"].key.read_bytes() == before
    old = sec.issue(pki.ca, "node-a", tmp_path, days=1).key.read_bytes()
    assert sec.issue(pki.ca, "node-a", tmp_path, force=True).key.read_bytes() != old
    for bad in ("node/a", "node+", "#", "", "a b", "%u"):
        with pytest.raises(ValueError):
            sec.issue(pki.ca, bad, tmp_path)


def test_log_requests_and_replies_reach_only_their_node_and_the_centrals(
    pki: Pki, tls_broker: Broker
) -> None:
    """A task's output read through central (issue 14): only centrals ask
    (``logs/<node>/request/<central>``), only the node asked reads it, and only that node
    answers on ``logs/<node>/reply/<central>``, which no other node reads."""
    central = node(pki, tls_broker, "central")
    a = node(pki, tls_broker, "node-a")
    b = node(pki, tls_broker, "node-b")
    to_a, to_b = (
        logstream.request_topic("node-a", "central"),
        logstream.request_topic("node-b", "central"),
    )
    from_a, from_b = (
        logstream.reply_topic("node-a", "central"),
        logstream.reply_topic("node-b", "central"),
    )
    try:
        central.subscribe(f"{ROOT}/#")
        for conn in (a, b):
            conn.subscribe(f"{ROOT}/logs/#")  # granted, filtered on delivery
        central.publish(to_a, b"request-a")
        central.publish(to_b, b"request-b")
        a.publish(from_a, b"reply-a")
        for forged in (
            from_b,  # as node-b, into a stream of node-b's
            to_b,  # a request to node-b
            to_a,  # a request to itself, as central
            logstream.request_topic("node-b", "node-a"),  # a request to node-b, as itself
        ):
            a.publish(forged, b"forged")
        end = logstream.request_topic("node-c", "central")  # after the rest; nobody else reads
        central.publish(end, b"sentinel")
        got_central = central.wait_for(end)
        got_a = a.wait_for(to_a)
        got_b = b.wait_for(to_b)
        time.sleep(0.5)
        got_a += a.drain()
        got_b += b.drain()
        got_central += central.drain()
        assert sorted(got_a) == [(to_a, b"request-a")], got_a  # nothing of node-b's
        assert sorted(got_b) == [(to_b, b"request-b")], got_b  # nor node-a's reply
        assert (from_a, b"reply-a") in got_central
        assert all(p != b"forged" for _, p in got_central), got_central
    finally:
        for c in (central, a, b):
            c.close()


@pytest.fixture
def site_broker(pki: Pki, tmp_path: Path) -> Iterator[Broker]:
    """The TLS broker with node-a and node-b members of site s1 (node-c is in no site)."""
    port = free_port()
    acl_path = tmp_path / "acl"
    acl_path.write_text(sec.acl(["central"], site_members={"s1": ["node-a", "node-b"]}))
    conf = sec.broker_config(port=port, ca=pki.ca, server_cert=pki.server, acl_path=acl_path,
                             user=getpass.getuser())  # fmt: skip
    broker = start_broker(tmp_path, conf, port)
    try:
        yield broker
    finally:
        broker.stop()


def test_site_members_read_each_others_documents_and_status_only(
    pki: Pki, site_broker: Broker
) -> None:
    """Issue 16: a site member hears its peer's status, its peer's writes to its node document
    and the peer's answers addressed to it; it asks on its own sender topic of the peer's
    document. It cannot write as the peer (its document, its answers), and a node of no site
    hears nothing of either."""
    a = node(pki, site_broker, "node-a")
    b = node(pki, site_broker, "node-b")
    c = node(pki, site_broker, "node-c")
    central = node(pki, site_broker, "central")
    b_doc = wire.sync_topic("node-node-b", "node-b")
    a_asks_b = wire.sync_topic("node-node-b", "node-a")
    b_answers_a = wire.reply_topic("node-node-b", "node-a", "node-b")
    try:
        for conn in (a, c, central):
            conn.subscribe(f"{ROOT}/#")
        b.subscribe(f"{ROOT}/doc/node-node-b/#")
        b.publish(f"{ROOT}/node/node-b/status", b"status-b")
        b.publish(b_doc, b"b-writes")
        a.publish(a_asks_b, b"a-step1")  # allowed: its own sender topic of b's document
        for forged in (b_doc, b_answers_a, f"{ROOT}/node/node-b/status"):
            a.publish(forged, b"forged")  # as b: refused
        c.publish(a_asks_b, b"forged")  # not a member: not even a's topic
        c.publish(wire.sync_topic("node-node-b", "node-c"), b"c-step1")  # not a member
        got_b = b.wait_for(a_asks_b)
        b.publish(b_answers_a, b"b-answers-a")
        central.publish(f"{ROOT}/doc/policy/sync/central", b"sentinel")
        got_a = a.wait_for(f"{ROOT}/doc/policy/sync/central")
        time.sleep(0.5)
        got_a += a.drain()
        got_b += b.drain()
        got_c = c.drain()
        got_central = central.drain()
        assert {(f"{ROOT}/node/node-b/status", b"status-b"), (b_doc, b"b-writes"),
                (b_answers_a, b"b-answers-a")} <= set(got_a)  # fmt: skip
        assert (a_asks_b, b"a-step1") in got_b and (a_asks_b, b"a-step1") in got_central
        for got in (got_a, got_b, got_central):
            assert all(p != b"forged" for _, p in got), got
        assert (wire.sync_topic("node-node-b", "node-c"), b"c-step1") not in got_b
        assert not [t for t, _ in got_c if "node-b" in t], got_c  # no site: nothing of b
    finally:
        for conn in (a, b, c, central):
            conn.close()
