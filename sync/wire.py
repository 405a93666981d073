"""Framing for document sync over MQTT: pure bytes in, bytes out, no I/O.

A *message* (a y-sync step, an update) is cut into *frames*, each small enough for the
broker's ``max_packet_size`` (oversized MQTT messages vanish or break the connection). Every
frame carries a fixed binary header::

    magic b"ES" | version 2 | kind | sender client id (u32) | document epoch (u32)
    | message id (u64) | chunk index (u32) | chunk count (u32) | chunk offset (u32)
    | payload length (u32) | CRC32 of the whole payload (u32)
    | CRC32 of this frame (header fields above + chunk)

Version 2 added the epoch (see :mod:`.doc`: a single-writer document restarts as a fresh
pycrdt document at each epoch, with client clocks starting over, so data of two epochs must
never be merged). Every chunk of a message carries the same epoch; version 1 frames are
refused. :func:`epoch_action` is the receive rule.

The pycrdt decoder is no integrity check (bit flips apply silently), so a frame whose CRC
does not match, or a reassembled payload whose CRC does not match, is rejected.

:class:`Reassembler` takes frames in any order, drops duplicates, hands back the whole payload
when every chunk is in, and keeps its memory bounded (message count, bytes, age). The
messages it completed are remembered (:class:`RecentMessages`) for ``remember_s`` and at
most ``remember`` of them, in 20 bytes each: central holds a reassembler per peer, 20,000 at
10,000 nodes, and a count alone let a quiet peer keep its last 1,024 keys for hours (as
tuples in an ordered dict, ~170 kB a peer: gigabytes in a day).

A frame travels on its sender's topic ``doc/<doc>/sync/<sender>`` (:func:`sync_topic`),
heard by every peer of the document, or, when it answers a step 1 whose asker asked for it
(:data:`REPLY_MARK`), on the asker's reply topic ``doc/<doc>/reply/<asker>/<sender>``
(:func:`reply_topic`), heard by the asker only. The sender is the last level of both.

Payloads of kind :attr:`Kind.SYNC` are y-sync messages (``pycrdt.create_sync_message`` and
friends); :attr:`Kind.UPDATE` payloads are a y-sync update message followed by the sender's
state vector (length-prefixed), so a receiver still behind after applying can ask to resync.
"""

from __future__ import annotations

import itertools
import random
import struct
import time
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal, NamedTuple

from pycrdt import YMessageType, YSyncMessageType, create_update_message, write_message

from edgesched.sync import epochs

MAGIC = b"ES"
VERSION = 2
TOPIC_ROOT = "edgesched/v1"

_HEADER = struct.Struct(">2sBBIIQIIIIII")
HEADER_SIZE = _HEADER.size  # 44 bytes
#: MQTT PUBLISH overhead we leave room for besides the topic: fixed header (≤ 5), topic
#: length (2), packet id (2), v5 properties (a few bytes), and generous slack.
MQTT_HEADROOM = 256
#: Longest sender name (peer id) a topic may carry; the chunk budget accounts for it.
MAX_PEER_ID_BYTES = 64
DEFAULT_MAX_PACKET = 64 * 1024
MAX_PAYLOAD = 0xFFFFFFFF
MAX_EPOCH = epochs.MAX_EPOCH


class Kind(IntEnum):
    SYNC = 1  # a y-sync message (step 1 or step 2)
    UPDATE = 2  # a y-sync update message + the sender's state vector after it


#: Set in a frame's kind byte when its message is signed: the payload ends with the sender's
#: seq and Ed25519 signature (:mod:`edgesched.sync.signing`). A peer of a release before it
#: refuses such frames as of an unknown kind.
SIGNED_FLAG = 0x80


_KINDS = {int(k): k for k in Kind}
_STEPS = {int(s): s for s in YSyncMessageType}


class FrameError(ValueError):
    """A malformed, corrupted or out-of-bounds frame; the reason is in the message."""


def doc_topic_prefix(doc: str) -> str:
    if not doc or any(c in doc for c in "/+#\0"):
        raise ValueError(f"invalid document name {doc!r}")
    return f"{TOPIC_ROOT}/doc/{doc}/sync"


def sync_topic(doc: str, sender: str) -> str:
    """``edgesched/v1/doc/<doc>/sync/<sender>``."""
    return f"{doc_topic_prefix(doc)}/{_check_peer_id(sender)}"


def sync_filter(doc: str) -> str:
    """The subscription that hears every peer of ``doc``."""
    return f"{doc_topic_prefix(doc)}/+"


def _check_peer_id(peer: str) -> str:
    if not peer or any(c in peer for c in "/+#\0") or len(peer.encode()) > MAX_PEER_ID_BYTES:
        raise ValueError(f"invalid peer id {peer!r}")
    return peer


def reply_topic(doc: str, asker: str, sender: str) -> str:
    """``edgesched/v1/doc/<doc>/reply/<asker>/<sender>``: ``sender``'s answers to a step 1 of
    ``asker`` that asked for them there (:func:`step1_payload` with ``replies=True``). Only
    the asker hears it; the sender is the last level, as on a sync topic."""
    prefix = doc_topic_prefix(doc).removesuffix("/sync")
    return f"{prefix}/reply/{_check_peer_id(asker)}/{_check_peer_id(sender)}"


def reply_filter(doc: str, asker: str, sender: str = "+") -> str:
    """The subscription that hears the answers addressed to ``asker`` (from ``sender``, or
    from every peer)."""
    prefix = doc_topic_prefix(doc).removesuffix("/sync")
    last = sender if sender == "+" else _check_peer_id(sender)
    return f"{prefix}/reply/{_check_peer_id(asker)}/{last}"


def chunk_budget(doc: str, max_packet: int) -> int:
    """How many payload bytes one frame of ``doc`` may carry under ``max_packet``, on the
    longest topic it may travel (a reply topic: ``.../reply/<asker>/<sender>``)."""
    reply_prefix = doc_topic_prefix(doc).removesuffix("/sync") + "/reply"
    topic_max = len(reply_prefix.encode()) + 2 * (1 + MAX_PEER_ID_BYTES)
    budget = max_packet - MQTT_HEADROOM - topic_max - HEADER_SIZE
    if budget < 1:
        raise ValueError(f"max_packet {max_packet} leaves no room for a payload")
    return budget


_msg_ids = itertools.count(random.getrandbits(62))


def new_msg_id() -> int:
    """A message id for :func:`encode` (a signed message is signed with its id)."""
    return next(_msg_ids)


def _frame_crc(header_wo_crc: bytes, chunk: bytes) -> int:
    return zlib.crc32(chunk, zlib.crc32(header_wo_crc))


def encode(
    kind: Kind,
    doc: str,
    sender: int,
    payload: bytes,
    max_packet: int = DEFAULT_MAX_PACKET,
    *,
    msg_id: int | None = None,
    epoch: int = 0,
    signed: bool = False,
) -> list[bytes]:
    """Frames carrying ``payload``, each at most ``max_packet`` bytes including MQTT overhead.

    ``epoch`` is the document epoch the payload belongs to: read it together with the state
    the payload was built from (``doc.epoch`` in the same synchronous step as
    ``doc.state_vector()`` / ``doc.diff()``), not later. ``signed``: ``payload`` ends with
    a signature trailer (:mod:`edgesched.sync.signing`); the kind byte says so.
    """
    kind = Kind(kind)
    if not 0 <= sender < 2**32:
        raise ValueError(f"sender client id {sender} is not a u32")
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch {epoch} is not a u32")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes is too large")
    mid = next(_msg_ids) if msg_id is None else msg_id
    if not 0 <= mid < 2**64:
        raise ValueError(f"message id {mid} is not a u64")
    budget = chunk_budget(doc, max_packet)
    count = max(1, -(-len(payload) // budget))
    total_crc = zlib.crc32(payload)
    frames = []
    for index in range(count):
        offset = index * budget
        chunk = payload[offset : offset + budget]
        kind_byte = int(kind) | (SIGNED_FLAG if signed else 0)
        fields = (MAGIC, VERSION, kind_byte, sender, epoch, mid, index, count, offset)
        head = _HEADER.pack(*fields, len(payload), total_crc, 0)[:-4]
        frames.append(head + struct.pack(">I", _frame_crc(head, chunk)) + chunk)
    return frames


@dataclass(frozen=True)
class Frame:
    kind: Kind
    sender: int
    epoch: int
    msg_id: int
    index: int
    count: int
    offset: int
    total: int
    total_crc: int
    chunk: bytes
    signed: bool = False


_Fields = tuple[Kind, int, int, int, int, int, int, int, int, bytes, bool]


def decode_frame(data: bytes) -> Frame:
    """Parse and check one frame; :class:`FrameError` says why it is not one."""
    return Frame(*_parse_frame(data))


def _parse_frame(data: bytes) -> _Fields:
    """:func:`decode_frame`'s checks, the fields as a tuple (in :class:`Frame`'s order)."""
    if len(data) < HEADER_SIZE:
        raise FrameError(f"frame of {len(data)} bytes is shorter than the header")
    magic, version, kind, sender, epoch, mid, index, count, offset, total, total_crc, crc = (
        _HEADER.unpack_from(data)
    )
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}")
    if version != VERSION:
        raise FrameError(f"unsupported version {version}")
    chunk = bytes(data[HEADER_SIZE:])
    if _frame_crc(bytes(data[: HEADER_SIZE - 4]), chunk) != crc:
        raise FrameError("frame CRC mismatch")
    k = _KINDS.get(kind & ~SIGNED_FLAG)
    if k is None:
        raise FrameError(f"unknown kind {kind}")
    if count < 1 or index >= count:
        raise FrameError(f"chunk index {index} out of count {count}")
    if offset + len(chunk) > total:
        raise FrameError(f"chunk [{offset}, +{len(chunk)}) overruns payload length {total}")
    if count > 1 and not chunk:
        raise FrameError("empty chunk in a multi-chunk message")
    if count > max(1, total):
        raise FrameError(f"{count} chunks for {total} bytes")
    if count == 1 and (offset != 0 or len(chunk) != total):
        raise FrameError("single-chunk frame does not carry the whole payload")
    return (k, sender, epoch, mid, index, count, offset, total, total_crc, chunk, kind != k)


class Message(NamedTuple):
    kind: Kind
    sender: int
    msg_id: int
    payload: bytes
    epoch: int = 0
    signed: bool = False  # the payload ends with a signature trailer


@dataclass
class _Partial:
    first: Frame
    started: float
    chunks: dict[int, Frame] = field(default_factory=dict)
    size: int = 0


#: A completed message's key as :class:`RecentMessages` keeps it: sender, message id.
_KEY = struct.Struct("<IQ")


class RecentMessages:
    """The (sender, message id) of the messages completed in the last ``ttl_s``, at most
    ``limit`` of them: packed 12 bytes each in one byte array, with their times (8 bytes
    each) in another, oldest first. A lookup is a search of the bytes (``bytearray.find``,
    at C speed: ~1 µs for a thousand keys) that accepts only a match at a record's start.
    Keys past the bounds are forgotten as keys are added (so one older than ``ttl_s`` may
    still answer until the next add). Empty, it holds no arrays at all."""

    __slots__ = ("_keys", "_times", "limit", "ttl_s")

    def __init__(self, limit: int, ttl_s: float) -> None:
        self.limit = limit
        self.ttl_s = ttl_s
        self._keys: bytearray | None = None
        self._times: array[float] | None = None

    def __len__(self) -> int:
        return 0 if self._times is None else len(self._times)

    def __contains__(self, key: tuple[int, int]) -> bool:
        keys = self._keys
        if not keys:
            return False
        packed = _KEY.pack(*key)
        at = keys.find(packed)
        while at > 0 and at % _KEY.size:  # (a match across two records: look further)
            at = keys.find(packed, at + 1)
        return at >= 0

    def add(self, key: tuple[int, int], now: float) -> None:
        """Remember ``key`` as completed at ``now`` (and forget what is past the bounds)."""
        keys, times = self._keys, self._times
        if keys is None or times is None:
            self._keys, self._times = bytearray(_KEY.pack(*key)), array("d", (now,))
            return
        keys += _KEY.pack(*key)
        times.append(now)
        if len(times) > self.limit or times[0] < now - self.ttl_s:
            self.expire(now)

    def expire(self, now: float) -> None:
        """Forget the keys older than ``ttl_s`` and the oldest beyond ``limit``."""
        times, keys = self._times, self._keys
        if times is None or keys is None:
            return
        drop = max(0, len(times) - self.limit)
        floor = now - self.ttl_s
        while drop < len(times) and times[drop] < floor:
            drop += 1
        if drop == len(times):
            self._keys = self._times = None  # (nothing left: no arrays held)
        elif drop:
            del times[:drop]
            del keys[: drop * _KEY.size]


class Reassembler:
    """Collects frames into messages, in any order, with bounded memory.

    :meth:`feed` returns the :class:`Message` once its last chunk arrives, ``None`` while
    waiting (or for a duplicate), and raises :class:`FrameError` for a malformed frame.
    Partial messages older than ``ttl_s``, and the oldest ones beyond ``max_messages`` or
    ``max_bytes``, are evicted; a message larger than ``max_bytes`` is rejected outright.
    A completed unsigned message is remembered for ``remember_s`` and at most ``remember``
    of them (:class:`RecentMessages`), so a copy of it (a QoS 1 redelivery) is dropped as a
    duplicate; one seen again later is handed back again, which a CRDT update survives
    unchanged (applying it again changes nothing).
    """

    __slots__ = (
        "_done",
        "_partials",
        "buffered_bytes",
        "clock",
        "max_bytes",
        "max_messages",
        "stats",
        "ttl_s",
    )

    def __init__(
        self,
        max_messages: int = 64,
        max_bytes: int = 16 << 20,
        ttl_s: float = 30.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        remember: int = 1024,
        remember_s: float = 600.0,
    ) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        #: partial messages, oldest first (None while there are none: most peers' messages
        #: are one frame each, and an empty ordered dict is ~130 bytes a peer)
        self._partials: OrderedDict[tuple[int, int], _Partial] | None = None
        self._done = RecentMessages(remember, remember_s)
        self.buffered_bytes = 0
        self.stats = dict.fromkeys(("completed", "duplicates", "evicted", "rejected"), 0)

    def __len__(self) -> int:
        return 0 if self._partials is None else len(self._partials)

    def _drop(self, key: tuple[int, int]) -> None:
        partials = self._partials
        assert partials is not None
        partial = partials.pop(key)
        self.buffered_bytes -= partial.size
        if not partials:
            self._partials = None

    def _evict(self, now: float) -> None:
        assert self._partials is not None
        for key in [k for k, p in self._partials.items() if now - p.started > self.ttl_s]:
            self._drop(key)
            self.stats["evicted"] += 1

    def feed(self, data: bytes, now: float | None = None) -> Message | None:
        now = self.clock() if now is None else now
        if self._partials:
            self._evict(now)
        try:
            fields = _parse_frame(data)
        except FrameError:
            self.stats["rejected"] += 1
            raise
        kind, sender, epoch, msg_id, _, count, _, total, total_crc, chunk, signed = fields
        if total > self.max_bytes:
            self.stats["rejected"] += 1
            raise FrameError(f"message of {total} bytes exceeds {self.max_bytes}")
        key = (sender, msg_id)
        if key in self._done:
            self.stats["duplicates"] += 1
            return None
        if count == 1:  # the whole message in one frame: no Frame object needed
            message = Message(kind, sender, msg_id, chunk, epoch, signed)
            return self._complete(key, message, total_crc, now)
        frame = Frame(*fields)
        partials = self._partials
        if partials is None:
            partials = self._partials = OrderedDict()
        partial = partials.get(key)
        if partial is None:
            partial = partials[key] = _Partial(frame, now)
        else:
            f0 = partial.first
            if (f0.kind, f0.epoch, f0.count, f0.total, f0.total_crc, f0.signed) != (
                frame.kind,
                frame.epoch,
                frame.count,
                frame.total,
                frame.total_crc,
                frame.signed,
            ):
                self.stats["rejected"] += 1
                raise FrameError("frame disagrees with earlier chunks of its message")
        if frame.index in partial.chunks:
            self.stats["duplicates"] += 1
            return None
        partial.chunks[frame.index] = frame
        partial.size += len(frame.chunk)
        self.buffered_bytes += len(frame.chunk)
        # Bounds: keep the newest message, evict the oldest others.
        while len(partials) > self.max_messages or self.buffered_bytes > self.max_bytes:
            oldest = next(iter(partials))
            self._drop(oldest)
            self.stats["evicted"] += 1
            if oldest == key:
                return None
            if self._partials is None:  # (all dropped: cannot happen while key is kept)
                break
        if len(partial.chunks) < frame.count:
            return None
        self._drop(key)
        parts = sorted(partial.chunks.values(), key=lambda f: f.offset)
        end = 0
        for part in parts:
            if part.offset != end:
                self.stats["rejected"] += 1
                raise FrameError("chunks of the message overlap or leave a gap")
            end += len(part.chunk)
        if end != frame.total:
            self.stats["rejected"] += 1
            raise FrameError("chunks do not add up to the payload length")
        payload = b"".join(p.chunk for p in parts)
        message = Message(
            frame.kind, frame.sender, frame.msg_id, payload, frame.epoch, frame.signed
        )
        return self._complete(key, message, frame.total_crc, now)

    def _complete(
        self, key: tuple[int, int], message: Message, total_crc: int, now: float
    ) -> Message:
        if zlib.crc32(message.payload) != total_crc:
            self.stats["rejected"] += 1
            raise FrameError("payload CRC mismatch")
        if message.signed:
            # Not remembered: a signed message seen again goes on to its signature check,
            # whose replay window refuses it and counts it (a replay, or a QoS 1 redelivery:
            # the two look the same), rather than vanishing here uncounted.
            self.stats["completed"] += 1
            return message
        self._done.add(key, now)
        self.stats["completed"] += 1
        return message


# --- epochs ---------------------------------------------------------------------------------

EpochAction = Literal["apply", "adopt", "drop", "announce", "rotate_past"]


def epoch_action(
    local_epoch: int, remote_epoch: int, *, from_writer: bool, is_writer: bool = False
) -> EpochAction:
    """What a peer does with a message of ``remote_epoch`` while its document is at
    ``local_epoch``.

    ``is_writer``: this peer is the document's writer. ``from_writer``: the message comes from
    the writer (the topic's sender is the writer's peer id; the broker ACL lets only the writer
    publish as itself). Multi-writer documents have no writer and never start an epoch: pass
    False for ``is_writer``, and for ``from_writer`` unless the sender is a fellow writer whose
    newer epoch the document may adopt (it holds no operations of its own: see
    :meth:`edgesched.sync.peer.DocPeer._follow_epoch`).

    - ``"apply"``: same epoch; handle the message as usual.
    - ``"announce"``: the sender is behind (an older epoch). Drop the message, count it, and
      send our step 1: it carries our epoch, so the sender learns of it (a replica resets, a
      writer rotates past it) and then resyncs. Never merge it: client clocks restart at
      each epoch, so its operations would collide with ours.
    - ``"adopt"``: the writer is at a newer epoch. Reset the replica to it
      (``doc.reset_to_epoch(remote_epoch)``), forget what was queued for the old epoch (step-1
      answers, updates), then apply the message; the usual state-vector check asks for the rest.
    - ``"drop"``: a newer epoch from a peer that is not the writer; count it. Only the writer
      starts epochs. A replica at that epoch may well be relaying the writer's content, but a
      bogus epoch (a bug, a compromised peer) would make every replica adopt it and then drop
      all of the writer's real data as old; and the writer announces its epoch itself (on
      rotation, and in answer to our step 1) whenever it is reachable. Until then the replica
      keeps its older, consistent content.
    - ``"rotate_past"``: we are the writer and a peer holds a newer epoch than ours: an epoch
      we handed out was lost from our store (restored from an old backup, salvaged). Never
      reuse it, since other replicas hold different operations under the same clocks: rotate
      to the epoch after it (``doc.rotate(min_epoch=epochs.after(remote_epoch))``), which
      republishes our content at an epoch nobody has seen; the message itself is dropped.

    "Newer" and "older" are serial-number comparisons (:func:`.epochs.newer`): the epoch after
    2**32 - 1 is 0, so no epoch announced, by a bug or by a gateway's stolen credentials, is
    one its writer cannot get past.
    """
    for what, value in (("local", local_epoch), ("remote", remote_epoch)):
        if not 0 <= value <= MAX_EPOCH:
            raise ValueError(f"{what} epoch {value} is not a u32")
    if remote_epoch == local_epoch:
        return "apply"
    if epochs.newer(local_epoch, remote_epoch):
        return "announce"
    if is_writer:
        return "rotate_past"
    return "adopt" if from_writer else "drop"


# --- y-sync payloads ------------------------------------------------------------------------


def _read_var_uint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise FrameError("truncated varuint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise FrameError("varuint too long")


def _read_bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _read_var_uint(data, pos)
    if pos + n > len(data):
        raise FrameError("length-prefixed field overruns the payload")
    return data[pos : pos + n], pos + n


def update_payload(update: bytes, state_vector: bytes) -> bytes:
    """The payload of a :attr:`Kind.UPDATE` message."""
    return create_update_message(update) + write_message(state_vector)


class SyncPayload(NamedTuple):
    step: YSyncMessageType
    data: bytes  # the state vector (step 1) or the update (step 2, update)
    state_vector: bytes | None  # the sender's state after it (Kind.UPDATE only)


def decode_sync(kind: Kind, payload: bytes) -> SyncPayload:
    """Parse a reassembled payload strictly: no missing and no trailing bytes."""
    if len(payload) < 2 or payload[0] != YMessageType.SYNC:
        raise FrameError("not a y-sync message")
    step = _STEPS.get(payload[1])
    if step is None:
        raise FrameError(f"unknown y-sync message type {payload[1]}")
    data, pos = _read_bytes(payload, 2)
    sv: bytes | None = None
    if kind == Kind.UPDATE:
        if step != YSyncMessageType.SYNC_UPDATE:
            raise FrameError("an UPDATE frame must carry a y-sync update")
        sv, pos = _read_bytes(payload, pos)
    elif step == YSyncMessageType.SYNC_UPDATE:
        raise FrameError("a y-sync update must come as an UPDATE frame")
    if pos != len(payload):
        raise FrameError(f"{len(payload) - pos} trailing bytes")
    return SyncPayload(step, data, sv)


def step1_payload(state_vector: bytes, *, replies: bool = False) -> bytes:
    """A y-sync step 1 (``pycrdt.create_sync_message`` builds the same from a doc).

    ``replies=True``: the asker listens on its reply topics (:func:`reply_topic`) and asks to
    be answered there; the state vector carries :data:`REPLY_MARK` (:func:`mark_replies`)."""
    if replies:
        state_vector = mark_replies(state_vector)
    return bytes([YMessageType.SYNC, YSyncMessageType.SYNC_STEP1]) + write_message(state_vector)


def step2_payload(update: bytes) -> bytes:
    """A y-sync step 2: the diff answering a step 1."""
    return bytes([YMessageType.SYNC, YSyncMessageType.SYNC_STEP2]) + write_message(update)


# --- answers only the asker hears -------------------------------------------------------------

#: The client id of the state-vector entry that marks a step 1 "answer me on my reply topic":
#: ``(REPLY_MARK, clock 0)``, first after the entry count. Clock 0 says the client wrote
#: nothing, so every y-sync reader, an older edgesched peer included, reads the vector as the
#: one without the entry (the same diff, nothing missing) and answers as it always did, on its
#: sender topic. No peer has this client id: frame headers carry client ids as u32.
REPLY_MARK = 1 << 32
_MARK_ENTRY = b"\x80\x80\x80\x80\x10\x00"  # varuint(REPLY_MARK), varuint(0)


def var_uint(value: int) -> bytes:
    """``value`` as a lib0 varuint (the encoding of state vectors and Yjs updates), shortest
    form."""
    out = bytearray()
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def mark_replies(state_vector: bytes) -> bytes:
    """``state_vector`` with the :data:`REPLY_MARK` entry first (FrameError if it is no lib0
    state vector head)."""
    count, pos = _read_var_uint(state_vector, 0)
    return var_uint(count + 1) + _MARK_ENTRY + state_vector[pos:]


def split_reply_mark(state_vector: bytes) -> tuple[bytes, bool]:
    """``(state vector without the mark, whether it was marked)``; an unmarked vector comes
    back as it is (the mark counts only as the first entry, as :func:`mark_replies` puts it)."""
    try:
        count, pos = _read_var_uint(state_vector, 0)
    except FrameError:
        return state_vector, False
    if count < 1 or state_vector[pos : pos + len(_MARK_ENTRY)] != _MARK_ENTRY:
        return state_vector, False
    return var_uint(count - 1) + state_vector[pos + len(_MARK_ENTRY) :], True
