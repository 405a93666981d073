"""The logs request/reply protocol (``edgesched.sync.logstream``): what a node takes as a
request, what central takes as a reply, the signed envelope; and central's channel taking a
reply only from the node it asked, in sequence (issue 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgesched.central.logsproxy import LogsProxy, _Open
from edgesched.sync import logstream as ls
from edgesched.sync.signing import FrameSigning, KeyRing, SignatureRefused, Signer

RID = "0123456789abcdef" * 2


def req(**fields: object) -> bytes:
    return json.dumps({"v": 1, "op": "request", "id": RID, "task": "t-1", **fields}).encode()


def test_a_request_round_trips_and_bounds_hold() -> None:
    request = ls.Request(RID, "t-1", tail=7, follow=True, max_bytes=100, follow_s=9.0)
    assert ls.parse_request(request.encode()) == request
    assert ls.parse_request(ls.Control(RID, "ack", 3).encode()) == ls.Control(RID, "ack", 3)
    assert ls.parse_request(ls.Control(RID, "cancel").encode()) == ls.Control(RID, "cancel")
    assert ls.parse_request(req()) == ls.Request(RID, "t-1")


@pytest.mark.parametrize(
    ("payload", "names", "has_id"),
    [
        (b"not json", "not JSON", False),
        (b"[1]", "JSON object", False),
        (b"{" * 2000, "exceeds", False),
        (b'{"v": 1, "op": "request", "id": "x", "task": "t"}', "id", False),
        (req(v=2), "v:", True),
        (req(op="delete"), "op:", True),
        (req(tail=-1), "tail", True),
        (req(tail=10_001), "tail", True),
        (req(tail=True), "tail", True),
        (req(task="../etc/passwd"), "task", True),
        (req(task=".hidden"), "task", True),
        (req(task="a" * 129), "task", True),
        (req(task=7), "task", True),
        (req(follow="yes"), "follow", True),
        (req(follow_s=1e9), "follow_s", True),
        (req(follow_s=float("nan")), "follow_s", True),
        (req(max_bytes=0), "max_bytes", True),
        (req(max_bytes=ls.MAX_STREAM_BYTES + 1), "max_bytes", True),
    ],
)
def test_malformed_requests_are_refused_naming_what(
    payload: bytes, names: str, has_id: bool
) -> None:
    with pytest.raises(ls.Malformed) as refused:
        ls.parse_request(payload)
    assert names in str(refused.value)
    assert (refused.value.request_id == RID) is has_id


def test_replies_are_bounded() -> None:
    data = ls.Reply(RID, 4, "data", b"x" * ls.CHUNK_BYTES)
    assert ls.parse_reply(data.encode()) == data
    end = ls.Reply(RID, 5, "end", reason="finished")
    assert ls.parse_reply(end.encode()) == end
    error = ls.Reply(RID, 0, "error", code="no_task", reason="node gw-a holds no task t")
    assert ls.parse_reply(error.encode()) == error
    assert len(data.encode()) < 131072 // 2
    for bad in (
        b"no header",
        ls.Reply(RID, 0, "data", b"x" * (ls.CHUNK_BYTES + 1)).encode(),
        ls.Reply(RID, 0, "end", b"body", reason="done").encode(),
        ls.Reply(RID, 0, "end", reason="because").encode(),
        ls.Reply(RID, 0, "error", code="nope").encode(),
        ls.Reply(RID, 0, "shout").encode(),
        ls.Reply("X" * 32, 0, "data").encode(),
        json.dumps({"id": RID, "seq": -1, "kind": "data"}).encode() + b"\n",
        b'{"id": "' + b"a" * 600 + b'"}\n',
    ):
        with pytest.raises(ls.Malformed):
            ls.parse_reply(bad)


def test_topics() -> None:
    assert ls.parse_topic(ls.request_topic("gw-a", "central"), "request") == ("gw-a", "central")
    assert ls.parse_topic(ls.reply_topic("gw-a", "central"), "reply") == ("gw-a", "central")
    assert ls.parse_topic(ls.reply_topic("gw-a", "central"), "request") is None
    assert ls.parse_topic("edgesched/v1/logs/gw-a/reply/central/x", "reply") is None
    assert ls.parse_topic("edgesched/v1/node/gw-a/status", "reply") is None


def signing(identity: str, tmp: Path, *, required: bool = True) -> FrameSigning:
    return FrameSigning(Signer(identity, Ed25519PrivateKey.generate()), KeyRing(tmp),
                        required=required)  # fmt: skip


def test_the_signed_envelope(tmp_path: Path) -> None:
    central, node = signing("central", tmp_path), signing("gw-a", tmp_path)
    assert central.signer is not None and node.signer is not None and node.keys is not None
    node.keys.add("central", central.signer.key.public_key())
    topic = ls.request_topic("gw-a", "central")
    sealed = ls.seal(central, topic, b"body")
    assert ls.unseal(node, topic, "central", sealed) == b"body"
    with pytest.raises(SignatureRefused) as replay:
        ls.unseal(node, topic, "central", sealed)
    assert replay.value.reason == "replay"
    moved = ls.seal(central, topic, b"body")
    with pytest.raises(SignatureRefused):  # moved to another node's topic
        ls.unseal(node, ls.request_topic("gw-b", "central"), "central", moved)
    tampered = bytearray(ls.seal(central, topic, b"body"))
    tampered[-1] ^= 1
    with pytest.raises(SignatureRefused):
        ls.unseal(node, topic, "central", bytes(tampered))
    with pytest.raises(SignatureRefused) as unsigned:
        ls.unseal(node, topic, "central", ls.seal(None, topic, b"body"))
    assert unsigned.value.reason == "unsigned"
    with pytest.raises(SignatureRefused):  # no key for the sender
        ls.unseal(node, topic, "gw-b", ls.seal(signing("gw-b", tmp_path), topic, b"x"))
    # signing not configured here: a signed message is read unverified, an unsigned one taken
    assert ls.unseal(None, topic, "central", ls.seal(central, topic, b"body")) == b"body"
    lenient = signing("gw-a", tmp_path, required=False)
    assert ls.unseal(lenient, topic, "central", ls.seal(None, topic, b"b")) == b"b"
    with pytest.raises(ls.Malformed):
        ls.unseal(None, topic, "central", b"Xbody")


def test_central_takes_a_reply_only_from_the_node_it_asked_in_order() -> None:
    proxy = LogsProxy("central")
    stream = _Open("gw-a", ls.Request(RID, "t-1"))
    proxy._open[RID] = stream

    def send(node: str, reply: ls.Reply, central: str = "central") -> None:
        proxy.handle(ls.reply_topic(node, central), ls.seal(None, "", reply.encode()))

    send("gw-b", ls.Reply(RID, 0, "data", b"forged"))  # another node, the right id
    send("gw-a", ls.Reply(RID, 0, "data", b"to another"), central="central-2")
    send("gw-a", ls.Reply("f" * 32, 0, "data", b"no such request"))
    proxy.handle(ls.reply_topic("gw-a", "central"), b"Ugarbage")
    assert stream.replies.empty()
    assert (proxy.stats["foreign"], proxy.stats["unknown"], proxy.stats["malformed"]) == (1, 1, 1)
    send("gw-a", ls.Reply(RID, 0, "data", b"one"))
    send("gw-a", ls.Reply(RID, 0, "data", b"one again"))  # a redelivery
    assert [stream.replies.get_nowait().body] == [b"one"] and proxy.stats["duplicate"] == 1
    send("gw-a", ls.Reply(RID, 2, "data", b"three"))  # seq 1 lost: the stream breaks
    broken = stream.replies.get_nowait()
    assert broken.kind == "error" and broken.seq == -1 and "lost" in broken.reason
    send("gw-a", ls.Reply(RID, 1, "data", b"two"))
    assert stream.replies.empty()
    # a node sending past its window breaks its stream too
    flood = _Open("gw-a", ls.Request("e" * 32, "t-1"))
    proxy._open[flood.request.id] = flood
    for seq in range(ls.WINDOW + 3):
        send("gw-a", ls.Reply(flood.request.id, seq, "data", b"x"))
    assert flood.broken and "window" in flood.broken
