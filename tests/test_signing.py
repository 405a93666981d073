"""Signed document messages (``edgesched.sync.signing``): what verifies, what is refused and
why, the replay window, the key files, and a peer signing and checking (issue 13)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.config import MqttConfig
from edgesched.sync import wire
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import TaskReport
from edgesched.sync.signing import (
    REPLAY_WINDOW_US,
    TRAILER,
    FrameSigning,
    KeyRing,
    ReplayWindow,
    SeqClock,
    SignatureRefused,
    Signer,
    load_signing_key,
    write_signing_key,
)

DOC = "node-gw1"


class Clock:
    def __init__(self, ns: int = 10**18) -> None:
        self.ns = ns

    def __call__(self) -> int:
        return self.ns


def signing_for(identity: str, keys: dict[str, Ed25519PrivateKey], tmp: Path) -> FrameSigning:
    """``identity``'s signing, verifying with the public keys of ``keys`` (written to tmp)."""
    ring = KeyRing(tmp / "none")
    for name, key in keys.items():
        ring.add(name, key.public_key())
    return FrameSigning(Signer(identity, keys[identity]), ring)


def message(
    signing: FrameSigning,
    payload: bytes,
    *,
    doc: str = DOC,
    client_id: int = 7,
    epoch: int = 0,
    kind: wire.Kind = wire.Kind.UPDATE,
) -> wire.Message:
    """``payload`` sealed by ``signing``, framed and reassembled as a receiver gets it."""
    msg_id = wire.new_msg_id()
    sealed = signing.seal(doc, int(kind), client_id, epoch, msg_id, payload)
    assert sealed is not None and len(sealed) == len(payload) + TRAILER
    frames = wire.encode(kind, doc, client_id, sealed, 512, msg_id=msg_id, epoch=epoch, signed=True)
    reassembler = wire.Reassembler()
    out = None
    for frame in frames:
        out = reassembler.feed(frame) or out
    assert out is not None and out.signed
    return out


@pytest.fixture
def keys() -> dict[str, Ed25519PrivateKey]:
    return {name: Ed25519PrivateKey.generate() for name in ("gw1", "central", "gw2")}


def test_a_signed_message_opens_to_its_payload_once(keys: dict[str, Any], tmp_path: Path) -> None:
    sender, receiver = signing_for("gw1", keys, tmp_path), signing_for("central", keys, tmp_path)
    payload = bytes(range(256)) * 5  # several frames of 512 bytes
    got = message(sender, payload)
    assert receiver.open(DOC, "gw1", got) == payload
    with pytest.raises(SignatureRefused) as refused:
        receiver.open(DOC, "gw1", got)  # the same message again: a replay
    assert refused.value.reason == "replay"


def test_what_does_not_verify(keys: dict[str, Any], tmp_path: Path) -> None:
    receiver = signing_for("central", keys, tmp_path)
    honest = signing_for("gw1", keys, tmp_path)
    wrong_key = FrameSigning(Signer("gw1", Ed25519PrivateKey.generate()), None)
    as_gw2 = signing_for("gw2", keys, tmp_path)  # gw2's own key, claiming to be gw1
    cases = {
        "wrong key": (message(wrong_key, b"payload"), DOC, "gw1"),
        "another sender's key": (message(as_gw2, b"payload"), DOC, "gw1"),
        "moved to another document": (message(honest, b"payload"), "node-gw9", "gw1"),
        "moved to another sender's topic": (message(honest, b"payload"), DOC, "gw2"),
        "no key for the sender": (message(honest, b"payload"), DOC, "stranger"),
    }
    for what, (got, doc, sender) in cases.items():
        with pytest.raises(SignatureRefused) as refused:
            receiver.open(doc, sender, got)
        assert refused.value.reason == "signature", what
    good = message(honest, b"payload")
    for changed in (
        good._replace(payload=b"X" + good.payload[1:]),  # the payload
        good._replace(epoch=1),  # the header's epoch
        good._replace(sender=8),  # the header's client id
        good._replace(kind=wire.Kind.SYNC),
        good._replace(payload=good.payload[:-1] + bytes([good.payload[-1] ^ 1])),  # signature
        good._replace(payload=good.payload[:5]),  # no room for a trailer
    ):
        with pytest.raises(SignatureRefused) as refused:
            receiver.open(DOC, "gw1", changed)
        assert refused.value.reason == "signature"
    assert receiver.open(DOC, "gw1", good) == b"payload"  # (the untouched one still opens)


def test_unsigned_messages_are_refused_when_signing_is_required(
    keys: dict[str, Any], tmp_path: Path
) -> None:
    unsigned = wire.Message(wire.Kind.UPDATE, 7, 1, b"payload")
    required = signing_for("central", keys, tmp_path)
    with pytest.raises(SignatureRefused) as refused:
        required.open(DOC, "gw1", unsigned)
    assert refused.value.reason == "unsigned"
    keying = FrameSigning(required.signer, required.keys, required=False)  # a fleet being keyed
    assert keying.open(DOC, "gw1", unsigned) == b"payload"
    with pytest.raises(SignatureRefused):  # a signed one is still checked
        keying.open(DOC, "gw1", message(signing_for("gw2", keys, tmp_path), b"p"))


def test_replay_window() -> None:
    window = ReplayWindow()
    assert window.take(1_000_000_000) and window.take(1_000_000_005)
    assert window.take(1_000_000_002)  # reordered within the window: taken once
    assert not window.take(1_000_000_002) and not window.take(1_000_000_005)
    assert window.take(1_000_000_000 + 2 * REPLAY_WINDOW_US)
    assert not window.take(1_000_000_003)  # behind the window now: a replay


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3 * REPLAY_WINDOW_US), max_size=80))
def test_a_seq_is_taken_at_most_once(seqs: list[int]) -> None:
    window = ReplayWindow()
    taken = [s for s in seqs if window.take(s)]
    assert len(taken) == len(set(taken))


def test_seq_clock_never_goes_back_even_when_the_clock_does() -> None:
    clock = Clock(5_000_000_000)
    seq = SeqClock(clock)
    first = seq.next()
    clock.ns -= 10**12  # stepped back 1,000 s
    assert seq.next() == first + 1
    clock.ns += 2 * 10**12
    assert seq.next() == clock.ns // 1000


@settings(max_examples=200, deadline=None)
@given(flip=st.integers(0, 10_000), payload=st.binary(min_size=1, max_size=600))
def test_no_single_bit_flip_of_a_signed_payload_opens(flip: int, payload: bytes) -> None:
    """Every bit of the sealed payload (body, seq, signature) is covered."""
    signer = Ed25519PrivateKey.generate()
    sender = FrameSigning(Signer("gw1", signer), None)
    ring = KeyRing(Path("/nonexistent"))
    ring.add("gw1", signer.public_key())
    receiver = FrameSigning(None, ring)
    got = message(sender, payload)
    bit = flip % (len(got.payload) * 8)
    flipped = bytearray(got.payload)
    flipped[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(SignatureRefused):
        receiver.open(DOC, "gw1", got._replace(payload=bytes(flipped)))


def test_key_files(tmp_path: Path) -> None:
    key_path, pub_path = write_signing_key(tmp_path, "gw1")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        write_signing_key(tmp_path, "gw1")
    with pytest.raises(ValueError):
        write_signing_key(tmp_path, "../gw1")
    key = load_signing_key(key_path)
    ring = KeyRing(pub_path.parent)
    assert ring.get("gw1") is not None
    assert ring.get("gw1").public_bytes_raw() == key.public_key().public_bytes_raw()  # type: ignore[union-attr]
    for name in ("../gw1", ".hidden", "", "a/b"):
        assert ring.get(name) is None
    (tmp_path / "not-a-key").write_text("hello")
    with pytest.raises(ValueError, match="not-a-key"):
        load_signing_key(tmp_path / "not-a-key")
    with pytest.raises(ValueError, match="missing"):
        load_signing_key(tmp_path / "missing")


def test_a_key_enrolled_later_is_found_after_the_miss_ttl(tmp_path: Path) -> None:
    now = [0.0]
    ring = KeyRing(tmp_path / "keys", clock=lambda: now[0])
    assert ring.get("gw2") is None
    write_signing_key(tmp_path, "gw2")
    assert ring.get("gw2") is None  # the miss is remembered for a while
    now[0] += 11
    assert ring.get("gw2") is not None


def test_config(tmp_path: Path) -> None:
    key_path, pub_path = write_signing_key(tmp_path, "gw1")
    signing = MqttConfig(signing_key=str(key_path), peer_keys=str(pub_path.parent)).frame_signing(
        "gw1"
    )
    assert signing is not None and signing.required and signing.signer is not None
    assert MqttConfig().frame_signing("gw1") is None
    with pytest.raises(ValueError, match="go together"):
        MqttConfig(signing_key=str(key_path))
    with pytest.raises(ValueError, match="not a directory"):
        MqttConfig(signing_key=str(key_path), peer_keys=str(key_path)).frame_signing("gw1")
    with pytest.raises(ValueError, match="nope"):
        MqttConfig(signing_key=str(tmp_path / "nope"), peer_keys=str(tmp_path)).frame_signing("x")


def _report() -> TaskReport:
    from edgesched.core.task import TaskState

    return TaskReport(state=TaskState.RUNNING, updated_at=1.0)


def test_a_peer_signs_what_it_sends_and_checks_what_it_receives(
    keys: dict[str, Any], tmp_path: Path
) -> None:
    """DocPeer end to end without a broker: the writer's frames as it would publish them, into
    central's replica peer: taken once; a replay, a frame signed with another key and an
    unsigned frame refused and counted; an unkeyed peer still reads a signed frame."""
    writer = NodeDoc(DOC, client_id_for("gw1"))
    writer.put_task("t1", _report())
    update = writer.diff()
    payload = wire.update_payload(update, writer.state_vector())
    topic = wire.sync_topic(DOC, "gw1")

    def frames(signing: FrameSigning | None) -> list[bytes]:
        msg_id = wire.new_msg_id()
        cid = writer.client_id
        sealed = None if signing is None else signing.seal(DOC, 2, cid, 0, msg_id, payload)
        body = payload if sealed is None else sealed
        return wire.encode(
            wire.Kind.UPDATE, DOC, cid, body, msg_id=msg_id, signed=sealed is not None
        )

    def replica_peer(signing: FrameSigning | None) -> tuple[NodeDoc, DocPeer]:
        replica = NodeDoc(DOC, client_id_for("central"))
        peer = DocPeer(replica, "central", writers=frozenset({writer.client_id}), signing=signing)
        return replica, peer

    replica, peer = replica_peer(signing_for("central", keys, tmp_path))
    signed = frames(signing_for("gw1", keys, tmp_path))
    for frame in signed:
        peer.handle(topic, frame)
    assert replica.task("t1") is not None and replica.content_hash() == writer.content_hash()
    for frame in signed:  # the same frames again
        peer.handle(topic, frame)
    assert peer.stats["rejected_replays"] == 1
    for frame in frames(FrameSigning(Signer("gw1", Ed25519PrivateKey.generate()), None)):
        peer.handle(topic, frame)
    for frame in frames(None):
        peer.handle(topic, frame)
    assert peer.stats["rejected_signatures"] == 2

    unkeyed, plain = replica_peer(None)
    for frame in signed:
        plain.handle(topic, frame)
    assert unkeyed.task("t1") is not None and plain.stats["rejected_signatures"] == 0


async def test_checks_on_the_verifier_thread_keep_each_senders_order(
    keys: dict[str, Any], tmp_path: Path
) -> None:
    """With a VerifyThread (central's), signatures are checked off the loop and the messages
    then handled on it in the order they came: every update of the writer applied in order,
    a replay and a forged one refused and counted, nothing handled before its check."""
    from edgesched.sync.signing import VerifyThread

    writer = NodeDoc(DOC, client_id_for("gw1"))
    updates: list[bytes] = []
    writer.on_local_update(updates.append)
    for i in range(60):
        writer.put_task(f"t{i}", _report())
    sender = signing_for("gw1", keys, tmp_path)
    checking = signing_for("central", keys, tmp_path)
    checking.verifier = VerifyThread()
    replica = NodeDoc(DOC, client_id_for("central"))
    order: list[int] = []

    class Recording(DocPeer):
        def _process(self, topic: str, sender: str, message: wire.Message) -> None:
            order.append(message.msg_id)
            super()._process(topic, sender, message)

    peer = Recording(replica, "central", writers=frozenset({writer.client_id}), signing=checking)
    topic = wire.sync_topic(DOC, "gw1")
    sent: list[int] = []
    frames: list[bytes] = []
    for update in updates:
        payload = wire.update_payload(update, writer.state_vector())
        msg_id = wire.new_msg_id()
        sealed = sender.seal(DOC, int(wire.Kind.UPDATE), writer.client_id, 0, msg_id, payload)
        assert sealed is not None
        sent.append(msg_id)
        frames += wire.encode(wire.Kind.UPDATE, DOC, writer.client_id, sealed, msg_id=msg_id,
                              signed=True)  # fmt: skip
    forged = FrameSigning(Signer("gw1", Ed25519PrivateKey.generate()), None)
    try:
        for i, frame in enumerate(frames):
            peer.handle(topic, frame)
            if i % 7 == 0:
                await asyncio.sleep(0)  # the loop turns now and then, as central's does
        assert not checking.verifier._executor._shutdown  # (still running)
        peer.handle(topic, frames[3])  # a replay
        (bad,) = wire.encode(wire.Kind.UPDATE, DOC, writer.client_id,
                             forged.seal(DOC, 2, writer.client_id, 0, 1, b"x") or b"",
                             msg_id=1, signed=True)  # fmt: skip
        peer.handle(topic, bad)
        await checking.verifier.drain()
    finally:
        checking.verifier.close()
    assert order == sent  # each handled once, in the order sent
    assert replica.content_hash() == writer.content_hash()
    assert peer.stats["rejected_replays"] == 1 and peer.stats["rejected_signatures"] == 1
