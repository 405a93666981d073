"""A task's output read through central, over MQTT: the request/reply protocol (issue 14).

Central usually cannot open a connection to a gateway's API (NAT, no address known), but both
hold a connection to the broker. Central asks on the node's request topic, which only centrals
may publish to and only that node (of the nodes) reads::

    edgesched/v1/logs/<node>/request/<central>     central → node: request, ack, cancel
    edgesched/v1/logs/<node>/reply/<central>       node → central: data, end, error

and the node answers on its reply topic, which only that node may publish to and only
centrals read (the ACL of :func:`edgesched.sync.security.acl`). A reply names its request by
a random 128-bit id that no other node hears; central takes a reply only from the node it
asked (the topic's node level, which the ACL binds to its writer), for a request it has open,
in sequence.

Messages (each inside an envelope, :func:`seal` / :func:`unseal`):

* request: ``{"v": 1, "op": "request", "id": <32 hex>, "task": <id>, "tail": 0..10000,
  "follow": bool, "max_bytes": 1..MAX_STREAM_BYTES, "follow_s": 0..FOLLOW_MAX_S}``;
* ``{"v": 1, "op": "ack", "id": ..., "seq": n}``: central has taken every reply up to ``n``
  (the node sends at most :data:`WINDOW` replies past the last ack); ``{"v": 1, "op":
  "cancel", "id": ...}``: central's reader went away;
* reply: a JSON header line, then for ``data`` the bytes of the log (at most
  :data:`CHUNK_BYTES`): ``{"id": ..., "seq": n, "kind": "data" | "end" | "error", "reason":
  ..., "code": ...}``. ``seq`` counts from 0 per request; ``end`` carries why the stream ended
  (``done``, ``finished``, ``follow_limit``, ``byte_limit``); ``error`` a ``code``
  (:data:`ERROR_CODES`) and a one-line ``reason``. A following node sends an empty ``data``
  every :data:`IDLE_S` while the task writes nothing, so a silent stream means a lost node.

The envelope's first byte says whether it is signed: ``U`` and the body, or ``S``, ``seq``
(u64) and an Ed25519 signature over :data:`CONTEXT`, the topic, ``seq`` and the body, by the
sender's signing key (the one of its document messages, :mod:`edgesched.sync.signing`); a
receiver with signing configured checks it and refuses a replayed ``seq``, and with
``require_signed`` refuses an unsigned message.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Any, Final

from edgesched.core.task import MAX_TASK_ID_BYTES
from edgesched.sync.signing import FrameSigning, ReplayWindow, SignatureRefused
from edgesched.sync.wire import TOPIC_ROOT

LOGS_ROOT: Final = f"{TOPIC_ROOT}/logs"
#: Log bytes in one reply: with its header far below the broker's max_packet_size (131072).
CHUNK_BYTES: Final = 32 * 1024
#: Replies a node sends past central's last ack.
WINDOW: Final = 8
#: The most bytes of output one request carries (a tail reads at most 4 MiB of the file).
MAX_STREAM_BYTES: Final = 8 << 20
#: The most lines a tail asks for (as the node's own API).
MAX_TAIL: Final = 10_000
#: The longest a followed stream stays open (the node's cap; central asks for less).
FOLLOW_MAX_S: Final = 3600.0
#: A following node's keepalive while the task writes nothing.
IDLE_S: Final = 5.0
#: How long a node waits for an ack before it drops the stream.
ACK_TIMEOUT_S: Final = 30.0
#: Streams a node serves at once (for every central together).
MAX_STREAMS: Final = 4
#: The largest request, ack or cancel a node reads, and the largest reply header.
MAX_REQUEST_BYTES: Final = 1024
MAX_HEADER_BYTES: Final = 512
#: Why a node refuses a request.
ERROR_CODES: Final = ("no_task", "no_logs", "busy", "malformed", "internal")
END_REASONS: Final = ("done", "finished", "follow_limit", "byte_limit")
KINDS: Final = ("data", "end", "error")
CONTEXT: Final = b"edgesched/v1 logs message\x00"

_ID = re.compile(r"[0-9a-f]{32}")
_SEQ = struct.Struct(">Q")
_SIG = 64
_LEVEL = re.compile(r"[^/+#\x00]{1,64}")
#: The replay windows' key (the documents' are ``(doc, sender)``; no document has this name).
_WINDOW_DOC: Final = "\x00logs"
#: A task id as :class:`~edgesched.core.task.TaskSpec` takes one.
_TASK_ID = re.compile(r"[\w.\-]+")


def request_topic(node: str, central: str) -> str:
    return f"{LOGS_ROOT}/{node}/request/{central}"


def reply_topic(node: str, central: str) -> str:
    return f"{LOGS_ROOT}/{node}/reply/{central}"


def request_filter(node: str) -> str:
    """What a node subscribes: the requests of every central to it."""
    return f"{LOGS_ROOT}/{node}/request/+"


def reply_filter(central: str) -> str:
    """What a central subscribes: every node's replies to it."""
    return f"{LOGS_ROOT}/+/reply/{central}"


def parse_topic(topic: str, kind: str) -> tuple[str, str] | None:
    """``edgesched/v1/logs/<node>/<kind>/<central>`` → ``(node, central)``; else None."""
    prefix = LOGS_ROOT + "/"
    if not topic.startswith(prefix):
        return None
    parts = topic[len(prefix) :].split("/")
    if len(parts) != 3 or parts[1] != kind:
        return None
    node, central = parts[0], parts[2]
    if not (_LEVEL.fullmatch(node) and _LEVEL.fullmatch(central)):
        return None
    return node, central


def _task_id(value: str) -> bool:
    """Whether ``value`` is a task id as :class:`~edgesched.core.task.TaskSpec` takes one
    (so it names a file of the node's, never a path out of its directory)."""
    return (
        bool(_TASK_ID.fullmatch(value))
        and value[0] not in ".-"
        and len(value.encode()) <= MAX_TASK_ID_BYTES
    )


class Malformed(ValueError):
    """A message that is not one of the protocol's; ``request_id`` when it named a valid one
    (the node then answers it with an ``error``)."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


@dataclass(frozen=True)
class Request:
    id: str
    task: str
    tail: int = 100
    follow: bool = False
    max_bytes: int = MAX_STREAM_BYTES
    follow_s: float = FOLLOW_MAX_S

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": 1,
                "op": "request",
                "id": self.id,
                "task": self.task,
                "tail": self.tail,
                "follow": self.follow,
                "max_bytes": self.max_bytes,
                "follow_s": self.follow_s,
            }
        ).encode()


@dataclass(frozen=True)
class Control:
    """An ack (every reply up to ``seq`` taken) or a cancel (``seq`` -1)."""

    id: str
    op: str  # "ack" | "cancel"
    seq: int = -1

    def encode(self) -> bytes:
        body: dict[str, Any] = {"v": 1, "op": self.op, "id": self.id}
        if self.op == "ack":
            body["seq"] = self.seq
        return json.dumps(body).encode()


def _int(data: dict[str, Any], key: str, low: int, high: int, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key}: must be an integer in {low}..{high}")
    return value


def _json(payload: bytes, max_bytes: int, what: str) -> dict[str, Any]:
    if len(payload) > max_bytes:
        raise Malformed(f"{what} of {len(payload)} bytes exceeds {max_bytes}")
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Malformed(f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise Malformed(f"{what} must be a JSON object")
    return data


def parse_request(payload: bytes) -> Request | Control:
    """A node's reading of a message on its request topic; :class:`Malformed` says what is
    wrong (with the request's id when it named a valid one)."""
    data = _json(payload, MAX_REQUEST_BYTES, "request")
    raw_id = data.get("id")
    request_id = raw_id if isinstance(raw_id, str) and _ID.fullmatch(raw_id) else None
    try:
        if data.get("v") != 1:
            raise ValueError("v: must be 1")
        if request_id is None:
            raise ValueError("id: must be 32 lowercase hex digits")
        op = data.get("op")
        if op == "ack":
            return Control(request_id, "ack", _int(data, "seq", 0, 2**31))
        if op == "cancel":
            return Control(request_id, "cancel")
        if op != "request":
            raise ValueError("op: must be request, ack or cancel")
        task = data.get("task")
        if not isinstance(task, str) or not _task_id(task):
            raise ValueError("task: must be a task id (1-128 letters, digits, '-', '_', '.')")
        follow = data.get("follow", False)
        if not isinstance(follow, bool):
            raise ValueError("follow: must be true or false")
        follow_s = data.get("follow_s", FOLLOW_MAX_S)
        if (
            isinstance(follow_s, bool)
            or not isinstance(follow_s, int | float)
            or not 0 <= follow_s <= FOLLOW_MAX_S
        ):
            raise ValueError(f"follow_s: must be a number in 0..{FOLLOW_MAX_S:g}")
        return Request(
            id=request_id,
            task=task,
            tail=_int(data, "tail", 0, MAX_TAIL, 100),
            follow=follow,
            max_bytes=_int(data, "max_bytes", 1, MAX_STREAM_BYTES, MAX_STREAM_BYTES),
            follow_s=float(follow_s),
        )
    except ValueError as exc:
        raise Malformed(str(exc), request_id) from None


@dataclass(frozen=True)
class Reply:
    id: str
    seq: int
    kind: str  # data | end | error
    body: bytes = b""
    code: str = ""  # an error's, of ERROR_CODES
    reason: str = ""

    def encode(self) -> bytes:
        header: dict[str, Any] = {"id": self.id, "seq": self.seq, "kind": self.kind}
        if self.code:
            header["code"] = self.code
        if self.reason:
            header["reason"] = self.reason[:200]
        return json.dumps(header).encode() + b"\n" + self.body


def parse_reply(payload: bytes) -> Reply:
    """Central's reading of a node's reply (untrusted bytes); :class:`Malformed` if it is not
    one: a bounded header, a known kind, a body only on data and at most a chunk."""
    head, sep, body = payload.partition(b"\n")
    if not sep:
        raise Malformed("reply has no header line")
    data = _json(head, MAX_HEADER_BYTES, "reply header")
    request_id, kind = data.get("id"), data.get("kind")
    if not isinstance(request_id, str) or not _ID.fullmatch(request_id):
        raise Malformed("reply id: must be 32 lowercase hex digits")
    if kind not in KINDS:
        raise Malformed(f"reply kind: one of {', '.join(KINDS)}")
    try:
        seq = _int(data, "seq", 0, 2**31)
    except ValueError as exc:
        raise Malformed(f"reply {exc}") from None
    if body and kind != "data":
        raise Malformed(f"a reply of kind {kind} carries no body")
    if len(body) > CHUNK_BYTES:
        raise Malformed(f"reply body of {len(body)} bytes exceeds {CHUNK_BYTES}")
    code = data.get("code", "")
    reason = data.get("reason", "")
    if kind == "error" and code not in ERROR_CODES:
        raise Malformed(f"reply code: one of {', '.join(ERROR_CODES)}")
    if kind == "end" and reason not in END_REASONS:
        raise Malformed(f"end reason: one of {', '.join(END_REASONS)}")
    if not isinstance(code, str) or not isinstance(reason, str):
        raise Malformed("reply code and reason must be strings")
    return Reply(request_id, seq, str(kind), body, code, reason)


# --- the envelope -------------------------------------------------------------------------------


def _signed_bytes(topic: str, seq: bytes) -> bytes:
    name = topic.encode()
    return CONTEXT + struct.pack(">H", len(name)) + name + seq


def seal(signing: FrameSigning | None, topic: str, body: bytes) -> bytes:
    """``body`` in its envelope for ``topic``: signed when ``signing`` has a signer."""
    signer = None if signing is None else signing.signer
    if signer is None:
        return b"U" + body
    seq = _SEQ.pack(signer.clock.next())
    return b"S" + seq + signer.key.sign(_signed_bytes(topic, seq) + body) + body


def unseal(signing: FrameSigning | None, topic: str, sender: str, payload: bytes) -> bytes:
    """The body of an envelope received on ``topic`` from ``sender`` (the identity the ACL
    binds the topic to); :class:`~edgesched.sync.signing.SignatureRefused` (``unsigned``,
    ``signature``, ``replay``) or :class:`Malformed` if it may not be taken."""
    kind = payload[:1]
    if kind == b"U":
        if signing is not None and signing.required:
            raise SignatureRefused("unsigned", f"unsigned logs message from {sender}")
        return payload[1:]
    if kind != b"S":
        raise Malformed("not a logs message envelope")
    if len(payload) < 1 + _SEQ.size + _SIG:
        raise SignatureRefused("signature", f"signed logs message from {sender} is cut short")
    seq = payload[1 : 1 + _SEQ.size]
    signature = payload[1 + _SEQ.size : 1 + _SEQ.size + _SIG]
    body = payload[1 + _SEQ.size + _SIG :]
    if signing is None or (signing.keys is None and not signing.required):
        return body  # (we verify nothing: signing is not configured here)
    key = None if signing.keys is None else signing.keys.get(sender)
    if key is None:
        raise SignatureRefused("signature", f"no public key for {sender}")
    from cryptography.exceptions import InvalidSignature  # (only where signing is configured)

    try:
        key.verify(signature, _signed_bytes(topic, seq) + body)
    except InvalidSignature:
        raise SignatureRefused(
            "signature", f"logs message from {sender} does not verify with its key"
        ) from None
    window = signing.windows.get((_WINDOW_DOC, sender))
    if window is None:
        window = signing.windows[_WINDOW_DOC, sender] = ReplayWindow()
    if not window.take(_SEQ.unpack(seq)[0]):
        raise SignatureRefused("replay", f"logs message from {sender} replayed (seq taken)")
    return body
