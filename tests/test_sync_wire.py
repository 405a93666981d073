"""Framing for doc sync: round trips, shuffled/duplicated chunks, corruption, bounds."""

from __future__ import annotations

import contextlib
import random
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesched.sync import wire
from edgesched.sync.wire import FrameError, Kind, Reassembler

DOC = "site-a"
MIN_PACKET = wire.MQTT_HEADROOM + wire.HEADER_SIZE + 200  # leaves ≥ 1 payload byte


def feed_all(r: Reassembler, frames: list[bytes]) -> list[wire.Message]:
    out = []
    for f in frames:
        m = r.feed(f, now=0.0)
        if m is not None:
            out.append(m)
    return out


@settings(max_examples=200, deadline=None)
@given(
    payload=st.binary(max_size=20_000),
    max_packet=st.integers(MIN_PACKET, 70_000),
    kind=st.sampled_from(list(Kind)),
    sender=st.integers(0, 2**32 - 1),
)
def test_round_trip(payload: bytes, max_packet: int, kind: Kind, sender: int) -> None:
    frames = wire.encode(kind, DOC, sender, payload, max_packet)
    budget = wire.chunk_budget(DOC, max_packet)
    topic = wire.sync_topic(DOC, "p" * wire.MAX_PEER_ID_BYTES)
    for f in frames:
        assert len(f) + len(topic) + wire.MQTT_HEADROOM <= max_packet
        assert len(f) <= budget + wire.HEADER_SIZE
    assert len(frames) == max(1, -(-len(payload) // budget))
    [msg] = feed_all(Reassembler(), frames)
    assert (msg.kind, msg.sender, msg.payload) == (kind, sender, payload)


@settings(max_examples=200, deadline=None)
@given(
    payload=st.binary(min_size=1, max_size=8_000),
    max_packet=st.integers(MIN_PACKET, 2_000),
    seed=st.integers(0, 2**32),
)
def test_shuffled_and_duplicated_chunks(payload: bytes, max_packet: int, seed: int) -> None:
    rng = random.Random(seed)
    frames = wire.encode(Kind.SYNC, DOC, 1, payload, max_packet)
    noisy = frames + [rng.choice(frames) for _ in range(rng.randint(0, len(frames)))]
    rng.shuffle(noisy)
    r = Reassembler()
    msgs = feed_all(r, noisy)
    assert [m.payload for m in msgs] == [payload]
    assert len(r) == 0 and r.buffered_bytes == 0
    # Redelivery of a completed message (QoS 1) does not deliver it twice.
    assert feed_all(r, frames) == []


def test_interleaved_messages_from_two_senders() -> None:
    a = wire.encode(Kind.SYNC, DOC, 1, b"a" * 5000, 1000)
    b = wire.encode(Kind.UPDATE, DOC, 2, b"b" * 5000, 1000)
    mixed = [f for pair in zip(a, b, strict=False) for f in pair]
    msgs = feed_all(Reassembler(), mixed)
    assert sorted(m.payload[:1] for m in msgs) == [b"a", b"b"]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2_000))
def test_random_bytes_are_rejected(data: bytes) -> None:
    r = Reassembler()
    try:
        msg = r.feed(data, now=0.0)
    except FrameError:
        assert r.stats["rejected"] == 1
        return
    assert msg is None or data.startswith(wire.MAGIC)  # only a valid frame could pass


@settings(max_examples=300, deadline=None)
@given(
    payload=st.binary(min_size=1, max_size=3_000),
    max_packet=st.integers(MIN_PACKET, 1_500),
    which=st.integers(0, 10_000),
    bit=st.integers(0, 10**9),
)
def test_bit_flips_never_accept_corruption(
    payload: bytes, max_packet: int, which: int, bit: int
) -> None:
    frames = wire.encode(Kind.UPDATE, DOC, 9, payload, max_packet)
    i = which % len(frames)
    bad = bytearray(frames[i])
    bad[(bit // 8) % len(bad)] ^= 1 << (bit % 8)
    frames[i] = bytes(bad)
    r = Reassembler()
    got = []
    for f in frames:
        try:
            m = r.feed(f, now=0.0)
        except FrameError:
            continue
        if m is not None:
            got.append(m)
    assert all(m.payload == payload and m.kind == Kind.UPDATE for m in got)
    assert got == []  # the flipped chunk never made it, so no message completes


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda f: b"XX" + f[2:], "magic"),
        (lambda f: f[:2] + b"\x01" + f[3:], "unsupported version 1"),  # before epochs
        (lambda f: f[:2] + b"\x03" + f[3:], "unsupported version 3"),
        (lambda f: f[:10], "shorter than the header"),
        (lambda f: f + b"!", "CRC"),
        (lambda f: f[:-1], "CRC"),
    ],
)
def test_malformed_frames_name_the_reason(mutate: object, reason: str) -> None:
    [frame] = wire.encode(Kind.SYNC, DOC, 1, b"hello", 4096)
    with pytest.raises(FrameError, match=reason):
        Reassembler().feed(mutate(frame))  # type: ignore[operator]


def forge(
    index: int, count: int, offset: int, total: int, chunk: bytes, crc: int = 0, epoch: int = 0
) -> bytes:
    """A frame with a valid frame CRC but arbitrary (possibly inconsistent) fields."""
    fields = (wire.MAGIC, wire.VERSION, 1, 5, epoch, 77, index, count, offset, total, crc, 0)
    head = wire._HEADER.pack(*fields)[:-4]
    return head + zlib.crc32(chunk, zlib.crc32(head)).to_bytes(4, "big") + chunk


def test_inconsistent_fields_are_rejected() -> None:
    r = Reassembler()
    with pytest.raises(FrameError, match="out of count"):
        r.feed(forge(3, 3, 0, 10, b"x"))
    with pytest.raises(FrameError, match="overruns"):
        r.feed(forge(0, 2, 8, 10, b"xyz"))
    with pytest.raises(FrameError, match="whole payload"):
        r.feed(forge(0, 1, 0, 10, b"xyz"))
    with pytest.raises(FrameError, match="payload CRC"):
        r.feed(forge(0, 1, 0, 3, b"xyz", crc=123))
    r.feed(forge(0, 2, 0, 4, b"ab", crc=zlib.crc32(b"abcd")))
    with pytest.raises(FrameError, match="disagrees"):
        r.feed(forge(1, 2, 2, 5, b"cd", crc=zlib.crc32(b"abcd")))
    with pytest.raises(FrameError, match="gap"):
        r.feed(forge(1, 2, 1, 4, b"cd", crc=zlib.crc32(b"abcd")))


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(2_000, 6_000), min_size=1, max_size=30),
    max_messages=st.integers(1, 8),
    max_bytes=st.integers(6_000, 20_000),
)
def test_bounds_hold(sizes: list[int], max_messages: int, max_bytes: int) -> None:
    r = Reassembler(max_messages=max_messages, max_bytes=max_bytes, ttl_s=30)
    for n, size in enumerate(sizes):
        frames = wire.encode(Kind.SYNC, DOC, n, bytes(size), 1000)
        for f in frames[:-1]:  # never complete: partial messages pile up
            r.feed(f, now=float(n))
            assert len(r) <= max_messages
            assert r.buffered_bytes <= max_bytes
    # Stale partial messages go after ttl_s.
    r.feed(wire.encode(Kind.SYNC, DOC, 999, b"x", 1000)[0], now=len(sizes) + 31.0)
    assert len(r) == 0 and r.buffered_bytes == 0


def test_oversized_message_is_refused_up_front() -> None:
    r = Reassembler(max_bytes=1000)
    frames = wire.encode(Kind.SYNC, DOC, 1, bytes(5000), 1000)
    with pytest.raises(FrameError, match="exceeds"):
        r.feed(frames[0])
    assert len(r) == 0


def test_sync_payloads() -> None:
    import pycrdt

    d: pycrdt.Doc[Any] = pycrdt.Doc()
    d.get("m", type=pycrdt.Map)["k"] = 1
    assert wire.step1_payload(d.get_state()) == pycrdt.create_sync_message(d)
    p = wire.decode_sync(Kind.SYNC, wire.step1_payload(b"\x00"))
    assert (p.step, p.data, p.state_vector) == (pycrdt.YSyncMessageType.SYNC_STEP1, b"\x00", None)
    u = wire.decode_sync(Kind.UPDATE, wire.update_payload(b"upd", b"sv"))
    assert (u.step, u.data, u.state_vector) == (pycrdt.YSyncMessageType.SYNC_UPDATE, b"upd", b"sv")
    for kind, bad in [
        (Kind.SYNC, b""),
        (Kind.SYNC, b"\x01\x00\x00"),
        (Kind.SYNC, b"\x00\x07\x00"),
        (Kind.SYNC, wire.step1_payload(b"abc")[:-1]),
        (Kind.SYNC, wire.step1_payload(b"abc") + b"!"),
        (Kind.SYNC, wire.update_payload(b"u", b"s")),
        (Kind.UPDATE, wire.step2_payload(b"u")),
        (Kind.SYNC, b"\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"),
    ]:
        with pytest.raises(FrameError):
            wire.decode_sync(kind, bad)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(list(Kind)), data=st.binary(max_size=200))
def test_decode_sync_never_crashes(kind: Kind, data: bytes) -> None:
    with contextlib.suppress(FrameError):
        wire.decode_sync(kind, data)


# --- what a reassembler remembers of the messages it completed ------------------------------


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.booleans(),  # add (True) or look up
            st.integers(0, 3),  # sender
            st.sampled_from([0, 1, 2, 5, 255, 256, 2**32, 2**63, 2**64 - 1]),  # message id
            st.floats(0, 50),  # time advance
        ),
        max_size=80,
    ),
    limit=st.integers(1, 12),
    ttl_s=st.floats(1, 100),
)
def test_recent_messages_agree_with_a_plain_model(
    ops: list[tuple[bool, int, int, float]], limit: int, ttl_s: float
) -> None:
    """The packed memory answers as a list of (key, time) that drops the keys past the time
    bound and the oldest past the count bound on each add would."""
    recent = wire.RecentMessages(limit, ttl_s)
    model: list[tuple[tuple[int, int], float]] = []
    now = 0.0
    for add, sender, msg_id, advance in ops:
        now += advance
        key = (sender, msg_id)
        if add:
            recent.add(key, now)
            model.append((key, now))
            model = [(k, t) for k, t in model if t >= now - ttl_s][-limit:]
        assert (key in recent) == any(k == key for k, _ in model)
        assert len(recent) == len(model)
    # keys that differ only where two packed records meet are never confused
    for sender, msg_id in [(1, 0), (0, 1 << 32), (256, 0)]:
        assert ((sender, msg_id) in recent) == any(k == (sender, msg_id) for k, _ in model)


def test_a_redelivery_is_dropped_while_remembered_and_handed_back_after() -> None:
    r = Reassembler(remember=100, remember_s=60.0)
    [frame] = wire.encode(Kind.UPDATE, DOC, 7, b"update", 1000)
    assert r.feed(frame, now=0.0) is not None
    assert r.feed(frame, now=59.0) is None  # a QoS 1 redelivery: a duplicate
    assert r.stats["duplicates"] == 1
    r.feed(wire.encode(Kind.UPDATE, DOC, 7, b"later", 1000)[0], now=61.0)  # forgets the first
    assert r.feed(frame, now=62.0) is not None  # past remember_s: handed back (harmless again)


def test_a_quiet_peer_does_not_keep_a_thousand_keys_for_hours() -> None:
    """A peer that completes a message every 30 s (a node replica's at central) remembers
    the last ``remember_s`` worth, and a busy one at most ``remember``: a few kilobytes,
    where the ordered dict of tuples it replaced kept its last 1,024 keys (~170 kB) for as
    long as the peer lived."""
    quiet = Reassembler(remember=1024, remember_s=600.0)
    busy = Reassembler(remember=1024, remember_s=600.0)
    for i in range(5_000):
        quiet.feed(wire.encode(Kind.UPDATE, DOC, 7, b"u", 1000)[0], now=i * 30.0)
        busy.feed(wire.encode(Kind.UPDATE, DOC, 7, b"u", 1000)[0], now=i * 0.01)
    assert len(quiet._done) == 21  # ten minutes of one every 30 s
    assert len(busy._done) == 1024
    assert len(busy._done._keys or b"") == 1024 * 12
    assert len(quiet) == 0 and quiet._partials is None  # nothing partial held
