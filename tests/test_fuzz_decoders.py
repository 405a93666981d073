"""Fuzzers over the decoders a peer runs on bytes from the network (issue 13): the frame
decoder and reassembler, the signed envelope, a peer's whole receive path, and the document
schema. Each gets mutants of valid input (bit flips, truncations, splices, duplicated and
reordered chunks) as well as random bytes; only the documented refusal may escape, and what
is accepted is what was sent.

A few hundred cases each here; ``EDGESCHED_SLOW=1`` runs 100,000 of each (minutes).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.core.task import TaskState
from edgesched.sync import wire
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.peer import DocPeer
from edgesched.sync.schema import ENTRY_KINDS, Refusals, SchemaError, TaskReport, decode_one
from edgesched.sync.signing import FrameSigning, KeyRing, SignatureRefused, Signer

SLOW = os.environ.get("EDGESCHED_SLOW") == "1"
CASES = 100_000 if SLOW else 400
FUZZ = settings(
    max_examples=CASES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
DOC = "node-gw1"
WRITER = client_id_for("gw1")


def _update_payload(entries: int) -> bytes:
    doc = NodeDoc(DOC, WRITER)
    for i in range(entries):
        doc.put_task(f"t{i}", TaskReport(TaskState.RUNNING, 1.0 + i))
    return wire.update_payload(doc.diff(), doc.state_vector())


PAYLOADS = [_update_payload(n) for n in (1, 3, 40)]
KEY = Ed25519PrivateKey.generate()


def _frames(payload: bytes, max_packet: int, signed: bool) -> list[bytes]:
    msg_id = wire.new_msg_id()
    body = payload
    if signed:
        body = Signer("gw1", KEY).seal(DOC, int(wire.Kind.UPDATE), WRITER, 0, msg_id, payload)
    return wire.encode(
        wire.Kind.UPDATE, DOC, WRITER, body, max_packet, msg_id=msg_id, signed=signed
    )


def _mutate(frames: list[bytes], rng: random.Random, ops: int) -> list[bytes]:
    out = list(frames)
    for _ in range(ops):
        op = rng.randrange(6)
        i = rng.randrange(len(out))
        frame = bytearray(out[i])
        if op == 0 and frame:  # a bit flip
            bit = rng.randrange(len(frame) * 8)
            frame[bit // 8] ^= 1 << (bit % 8)
        elif op == 1:  # truncated
            del frame[rng.randrange(len(frame) + 1) :]
        elif op == 2:  # bytes spliced in
            at = rng.randrange(len(frame) + 1)
            frame[at:at] = rng.randbytes(rng.randrange(1, 9))
        elif op == 3:  # a chunk twice
            out.insert(rng.randrange(len(out) + 1), bytes(frame))
        elif op == 4:  # reordered
            rng.shuffle(out)
        else:  # a header field overwritten with an extreme value
            at = rng.randrange(min(len(frame), wire.HEADER_SIZE) + 1)
            frame[at : at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00"])
        out[i if i < len(out) else -1] = bytes(frame)
    return out


mutants = st.tuples(
    st.sampled_from(range(len(PAYLOADS))),
    st.sampled_from([512, 1024, 65536]),
    st.booleans(),
    st.integers(0, 2**32),
    st.integers(0, 4),
)


@pytest.mark.timeout(3600 if SLOW else 180)
@FUZZ
@given(mutants)
def test_the_reassembler_refuses_only_with_frame_errors(
    case: tuple[int, int, bool, int, int],
) -> None:
    which, max_packet, signed, seed, ops = case
    payload = PAYLOADS[which]
    frames = _mutate(_frames(payload, max_packet, signed), random.Random(seed), ops)
    reassembler = wire.Reassembler()
    for frame in frames:
        try:
            message = reassembler.feed(frame)
        except wire.FrameError:
            continue
        if message is None:
            continue
        # The CRCs (frame and payload) let nothing changed through as a whole message.
        assert message.signed == signed
        if not signed:
            assert message.payload == payload
        else:
            assert message.payload[:-72] == payload


@pytest.mark.timeout(3600 if SLOW else 180)
@FUZZ
@given(st.binary(max_size=300), st.integers(0, 2**32))
def test_the_signed_envelope_opens_nothing_but_what_was_signed(junk: bytes, seed: int) -> None:
    """A signed message with its payload (body, seq, signature) replaced by random bytes, or
    mutated at random, never opens: SignatureRefused and nothing else escapes."""
    ring = KeyRing(Path(__file__))  # (a file, never read: the key is added)
    ring.add("gw1", KEY.public_key())
    checker = FrameSigning(None, ring)
    good = wire.Reassembler().feed(_frames(PAYLOADS[0], 65536, True)[0])
    assert good is not None
    rng = random.Random(seed)
    changed = bytearray(good.payload)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(changed))
        changed[at] ^= rng.randrange(1, 256)
    for payload in (junk, bytes(changed)):
        with pytest.raises(SignatureRefused):
            checker.open(DOC, "gw1", good._replace(payload=payload))


@pytest.mark.timeout(3600 if SLOW else 180)
@FUZZ
@given(mutants, st.binary(max_size=200))
def test_a_peer_survives_anything_on_its_topics(
    case: tuple[int, int, bool, int, int], junk: bytes
) -> None:
    """central's replica peer fed mutants and random bytes: never raises; its replica holds
    only what the writer wrote (equal to a prefix of the writer's states or empty)."""
    which, max_packet, signed, seed, ops = case
    ring = KeyRing(Path(__file__))
    ring.add("gw1", KEY.public_key())
    replica = NodeDoc(DOC, client_id_for("central"))
    peer = DocPeer(
        replica,
        "central",
        writers=frozenset({WRITER}),
        signing=FrameSigning(None, ring) if signed else None,
    )
    topic = wire.sync_topic(DOC, "gw1")
    for frame in [
        junk,
        *_mutate(_frames(PAYLOADS[which], max_packet, signed), random.Random(seed), ops),
    ]:
        peer.handle(topic, frame)
    held = set(replica.tasks())
    assert held <= {f"t{i}" for i in range(40)}


def _json_values(depth: int = 3) -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(2**64), 2**64)
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(max_size=20)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
        ),
        max_leaves=20,
    )


@pytest.mark.timeout(3600 if SLOW else 180)
@FUZZ
@given(st.sampled_from(ENTRY_KINDS), _json_values(), st.booleans())
def test_the_schema_refuses_only_with_its_own_error(
    kind: type[Any], raw: Any, as_text: bool
) -> None:
    """Any value, nested or as the JSON text a packed entry is, decodes to an entry or is
    refused and counted; nothing else escapes (a policy entry of the wrong type crashed central
    and the nodes before issue 13)."""
    if as_text:
        try:
            raw = json.dumps(raw)
        except ValueError:
            return
    refusals = Refusals("fuzz")
    with contextlib.suppress(SchemaError):  # (its only refusal)
        kind.from_entry(raw)
    entry = decode_one(kind, raw, refusals, where="x")
    refused = sum(refusals.by_kind().values())
    assert (entry is None) == (raw is None or refused == 1)  # (None: an absent entry)


_JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_MARKER_KEYS = ("instance", "host", "pid", "address", "seq", "started", "held")


@FUZZ
@given(
    payload=st.one_of(
        st.binary(max_size=300),
        _JSON.map(lambda v: json.dumps(v).encode()),
        st.dictionaries(st.sampled_from(_MARKER_KEYS), _JSON).map(lambda d: json.dumps(d).encode()),
        st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n),  # past the parser's depth
    )
)
def test_a_presence_marker_decoder_takes_anything(payload: bytes) -> None:
    """A marker on a session's presence topic (retained, written by whatever holds the
    identity, or a broken one): never raises, and a marker it keeps is one it could build
    from a JSON object."""
    from edgesched.sync.session import Presence, presence_topic

    presence = Presence("gw1", presence_topic("gw1"))
    presence.handle(presence.topic, payload)
    other = presence.other
    if other is not None:
        data = json.loads(payload)
        assert isinstance(data, dict) and str(data["instance"]) == other.instance
        assert other.instance != presence.instance and not presence.proven  # (not echoed)


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=400),
        _JSON.map(lambda v: json.dumps(v).encode()),
        st.integers(1, 50_000).map(lambda n: b"[" * n + b"]" * n),
    ),
    token=st.one_of(st.none(), st.text(max_size=80)),
)
def test_the_join_decoders_refuse_only_with_their_own_errors(
    data: bytes, token: str | None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """What a gateway reads before it trusts anything (a join file, the join server's
    answers, read before and after the CA pin) and what an operator types (a token, a TTL):
    each refuses with its own one-line error, never anything else."""
    from edgesched.joinclient import JoinClientError, _answer, _message
    from edgesched.joinfile import JoinFileError, read
    from edgesched.jointoken import TokenError, parse, parse_ttl

    assert isinstance(_message(data), str)
    with contextlib.suppress(JoinClientError):
        assert isinstance(_answer(data), dict)
    path = tmp_path_factory.mktemp("join") / "gw.join"
    path.write_bytes(data)
    with contextlib.suppress(JoinFileError):
        read(path, token)
    text = data.decode("utf-8", "replace")
    for decode in (parse, parse_ttl):
        with contextlib.suppress(TokenError):
            decode(text)
    if token is not None:
        with contextlib.suppress(TokenError):
            parse(token)
        with contextlib.suppress(TokenError):
            assert 0 < parse_ttl(token) < 1e9 * 86400
