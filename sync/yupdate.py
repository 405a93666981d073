"""A decoder of Yjs v1 updates and the per-operation authorship check built on it (issue 13).

pycrdt applies updates but cannot show what is inside one: :func:`pycrdt.get_state` of an update
names only the clients whose *structs* it carries, and nothing of its *delete set*. A writer
check on that state vector passes a pure delete (delete set only) of anybody's items. This
module reads the whole update, as Yjs writes it (v1, lib0 encoding):

- structs: ``varuint numClients``, then per client ``varuint numStructs, varuint client,
  varuint startClock`` and that many structs, each an ``info`` byte (low 5 bits: 0 GC, 10 Skip,
  1–9 an Item's content ref; 0x80 has origin, 0x40 has right origin, 0x20 has parentSub) then:
  GC/Skip ``varuint len``; an Item ``[origin ID] [rightOrigin ID]``, and when it has neither,
  ``varuint parentInfo`` (1: ``varstring`` root type name, else a parent ``ID``) and
  ``[varstring parentSub]``, then its content (Deleted ``len``; JSON ``len`` × varstring;
  Binary varbuf; String varstring, its length in UTF-16 code units; Embed varstring; Format
  key + varstring; Type ``typeRef`` (+ name for XmlElement / XmlHook); Any ``len`` × lib0
  ``any``; Doc guid + ``any``). An ID is ``varuint client, varuint clock``.
- the delete set: ``varuint numClients``, per client ``varuint client, varuint numRanges`` and
  that many ``varuint clock, varuint len``.

:func:`decode_update` returns it as :class:`Struct` and :class:`DeleteRange` values;
:func:`authorship_violation` is the rule (docs/sync-protocol.md, "Authorship of every
operation"). Pure functions, no I/O.

It is *stricter* than both Yjs and Yrs (pycrdt's engine), never looser, so that whatever it
accepts those two read the same way: every varuint at most 10 bytes and 2^53 - 1 (Yjs's
limit), client ids below 2^53, clocks, lengths and counts below 2^32 (Yrs reads them as u32,
*wrapping* wider values, so 2^32 + 5 would be 5 to Yrs), a GC/Skip info byte with no flag bits
(Yjs masks them, Yrs does not), parent info 0 or 1, type refs 0–6 (Yjs's; Yrs knows more),
valid UTF-8, ``any`` values nested at most :data:`MAX_ANY_DEPTH` deep, no bytes after the
delete set. Every malformed input raises :class:`UpdateDecodeError`; every count is checked
against the bytes left before it is looped over, and nothing is allocated ahead of the bytes
that fill it, so decoding is linear in the input.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "AMBIGUOUS_CONTENT",
    "MAX_ANY_DEPTH",
    "DecodedUpdate",
    "DeleteRange",
    "Id",
    "Struct",
    "StructKind",
    "UpdateDecodeError",
    "authorship_violation",
    "decode_update",
    "decoded_violation",
]

#: Deepest nesting of lib0 ``any`` arrays/maps accepted (Yjs has no limit; a hostile update
#: could otherwise nest until the stack runs out).
MAX_ANY_DEPTH: Final = 64
_MAX_SAFE: Final = (1 << 53) - 1  # Number.MAX_SAFE_INTEGER: lib0's varuint limit
_U32: Final = 1 << 32  # Yrs reads clocks, lengths and counts as u32
_MAX_VARUINT_BYTES: Final = 10

StructKind = Literal[
    "gc", "skip", "deleted", "json", "binary", "string", "embed", "format", "type", "any", "doc"
]
_CONTENT_KINDS: Final[tuple[StructKind, ...]] = (
    "gc",
    "deleted",
    "json",
    "binary",
    "string",
    "embed",
    "format",
    "type",
    "any",
    "doc",
    "skip",
)
_TYPE_NAMES: Final = (
    "array",
    "map",
    "text",
    "xml_element",
    "xml_fragment",
    "xml_hook",
    "xml_text",
)

#: Content that Yjs and Yrs (pycrdt) read differently, byte for byte, so an update holding it
#: could mean one thing to this decoder and another to the document that applies it:
#: legacy JSON content (Yrs reads one string more than its count says) and an XmlHook type
#: (Yjs reads a hook name after it, Yrs does not). pycrdt never writes either;
#: :func:`authorship_violation` refuses both.
AMBIGUOUS_CONTENT: Final = frozenset({"json", "type:xml_hook"})


class UpdateDecodeError(ValueError):
    """The bytes are not a well-formed Yjs v1 update (or are beyond this decoder's limits)."""


@dataclass(frozen=True, slots=True)
class Id:
    """A Yjs ID: the ``clock``-th operation of ``client``."""

    client: int
    clock: int


@dataclass(frozen=True, slots=True)
class Struct:
    """One struct of an update: ``length`` operations of ``client`` from ``clock`` on.

    ``parent`` is a root type's name (str), a parent item's :class:`Id`, or None when it is
    not written (an item with an origin or right origin takes its neighbour's parent).
    ``content`` is a summary: the type for ``type`` (``map``, ``xml_element:<name>``...), the
    key for ``format``, the guid for ``doc``, empty otherwise."""

    client: int
    clock: int
    length: int
    kind: StructKind
    origin: Id | None = None
    right_origin: Id | None = None
    parent: str | Id | None = None
    parent_sub: str | None = None
    content: str = ""


@dataclass(frozen=True, slots=True)
class DeleteRange:
    """``length`` operations of ``client`` from ``clock`` on are deleted."""

    client: int
    clock: int
    length: int


@dataclass(frozen=True, slots=True)
class DecodedUpdate:
    """A decoded update. ``clients``: every client section header of the struct part, in
    order (a header may carry no struct)."""

    clients: tuple[int, ...]
    structs: tuple[Struct, ...]
    delete_set: tuple[DeleteRange, ...]


class _Reader:
    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.end = len(data)

    def fail(self, what: str) -> UpdateDecodeError:
        return UpdateDecodeError(f"malformed Yjs update at byte {self.pos}: {what}")

    def byte(self) -> int:
        if self.pos >= self.end:
            raise self.fail("truncated")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varuint(self, limit: int = _MAX_SAFE, what: str = "value") -> int:
        """A lib0 varuint below ``limit`` + 1."""
        data, pos = self.data, self.pos
        if pos < self.end and data[pos] < 0x80:  # the common one-byte case
            self.pos = pos + 1
            value = data[pos]
        else:
            value = shift = 0
            for _ in range(_MAX_VARUINT_BYTES):
                if pos >= self.end:
                    self.pos = pos
                    raise self.fail(f"truncated {what}")
                byte = data[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
            else:
                self.pos = pos
                raise self.fail(f"{what} longer than {_MAX_VARUINT_BYTES} bytes")
            self.pos = pos
        if value > limit:
            raise self.fail(f"{what} {value} above {limit}")
        return value

    def count(self, what: str, per_item: int = 1) -> int:
        """A count of things that take at least ``per_item`` bytes each: no more than fit."""
        n = self.varuint(_U32 - 1, what)
        if n * per_item > self.end - self.pos:
            raise self.fail(f"{n} {what} in {self.end - self.pos} bytes left")
        return n

    def varint(self) -> None:
        """Skip a lib0 signed varint (sign in bit 6 of the first byte)."""
        first = self.byte()
        if first < 0x80:
            return
        value = first & 0x3F
        shift = 6
        for _ in range(_MAX_VARUINT_BYTES - 1):
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if value > _MAX_SAFE:
                    raise self.fail(f"integer {value} above {_MAX_SAFE}")
                return
            shift += 7
        raise self.fail(f"integer longer than {_MAX_VARUINT_BYTES} bytes")

    def buf(self, what: str = "buffer") -> bytes:
        n = self.varuint(_U32 - 1, what)  # (a length: ``what`` names the thing measured)
        if n > self.end - self.pos:
            raise self.fail(f"{what} of {n} bytes, {self.end - self.pos} left")
        start = self.pos
        self.pos = start + n
        return self.data[start : self.pos]

    def string(self, what: str = "string") -> str:
        raw = self.buf(what)
        if raw.isascii():
            return raw.decode("ascii")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.pos -= len(raw)
            raise self.fail(f"{what} is not UTF-8 ({exc.reason})") from None

    def fixed(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise self.fail(f"truncated {what}")
        self.pos += n

    def any(self, depth: int = 0) -> None:
        """Skip one lib0 ``any`` value (tags 127 undefined ... 116 Uint8Array)."""
        tag = self.byte()
        if tag in (127, 126, 121, 120):  # undefined, null, false, true
            return
        if tag == 125:
            self.varint()
        elif tag == 124:
            self.fixed(4, "float32")
        elif tag in (123, 122):
            self.fixed(8, "float64" if tag == 123 else "bigint64")
        elif tag == 119:
            self.string()
        elif tag in (118, 117):
            if depth >= MAX_ANY_DEPTH:
                raise self.fail(f"any values nested deeper than {MAX_ANY_DEPTH}")
            if tag == 118:
                for _ in range(self.count("object entries", 2)):
                    self.string("object key")
                    self.any(depth + 1)
            else:
                for _ in range(self.count("array elements")):
                    self.any(depth + 1)
        elif tag == 116:
            self.buf()
        else:
            self.pos -= 1
            raise self.fail(f"unknown any tag {tag}")

    def id(self, what: str) -> Id:
        return Id(self.varuint(_MAX_SAFE, what), self.varuint(_U32 - 1, what))


def _utf16_length(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def _item(r: _Reader, client: int, clock: int, info: int) -> Struct:
    ref = info & 0x1F
    if ref > 9:
        r.pos -= 1
        raise r.fail(f"unknown struct info {info:#04x}")
    origin = r.id("origin") if info & 0x80 else None
    right_origin = r.id("right origin") if info & 0x40 else None
    parent: str | Id | None = None
    parent_sub: str | None = None
    if not info & 0xC0:
        parent_info = r.varuint(1, "parent info")
        parent = r.string("parent name") if parent_info == 1 else r.id("parent")
        if info & 0x20:
            parent_sub = r.string("parent sub")
    content = ""
    if ref == 4:  # String
        length = _utf16_length(r.string())
    elif ref == 8:  # Any
        length = r.count("any values")
        for _ in range(length):
            r.any()
    elif ref == 1:  # Deleted
        length = r.varuint(_U32 - 1, "deleted length")
    elif ref == 7:  # Type
        type_ref = r.byte()
        if type_ref >= len(_TYPE_NAMES):
            r.pos -= 1
            raise r.fail(f"unknown type ref {type_ref}")
        content = _TYPE_NAMES[type_ref]
        if type_ref in (3, 5):  # XmlElement's node name, XmlHook's hook name (as Yjs reads)
            content += ":" + r.string("type name")
        else:
            content = _TYPE_NAMES[type_ref]
        length = 1
    elif ref == 2:  # JSON (legacy)
        length = r.count("json values")
        for _ in range(length):
            r.string("json value")
    elif ref == 3:  # Binary
        r.buf()
        length = 1
    elif ref == 5:  # Embed
        r.string("embed")
        length = 1
    elif ref == 6:  # Format
        content = r.string("format key")
        r.string("format value")
        length = 1
    else:  # 9, Doc
        content = r.string("doc guid")
        r.any()
        length = 1
    if clock + length >= _U32:
        raise r.fail(f"client {client} clock {clock} + {length} above 2^32")
    return Struct(
        client,
        clock,
        length,
        _CONTENT_KINDS[ref],
        origin,
        right_origin,
        parent,
        parent_sub,
        content,
    )


def decode_update(update: bytes) -> DecodedUpdate:
    """Decode a Yjs v1 update. :class:`UpdateDecodeError` if it is not one."""
    r = _Reader(bytes(update))
    clients: list[int] = []
    structs: list[Struct] = []
    for _ in range(r.count("clients", 3)):
        n_structs = r.count("structs", 2)
        client = r.varuint(_MAX_SAFE, "client id")
        clock = r.varuint(_U32 - 1, "start clock")
        clients.append(client)
        for _ in range(n_structs):
            info = r.byte()
            ref = info & 0x1F
            if ref == 0 or ref == 10:
                if info != ref:
                    r.pos -= 1
                    raise r.fail(f"GC/Skip info byte {info:#04x} with flag bits")
                length = r.varuint(_U32 - 1, "gc length" if ref == 0 else "skip length")
                if clock + length >= _U32:
                    raise r.fail(f"client {client} clock {clock} + {length} above 2^32")
                struct = Struct(client, clock, length, "gc" if ref == 0 else "skip")
            else:
                struct = _item(r, client, clock, info)
            structs.append(struct)
            clock += struct.length
    deletes: list[DeleteRange] = []
    for _ in range(r.count("delete set clients", 2)):
        client = r.varuint(_MAX_SAFE, "delete set client id")
        for _ in range(r.count("delete ranges", 2)):
            clock = r.varuint(_U32 - 1, "delete clock")
            length = r.varuint(_U32 - 1, "delete length")
            deletes.append(DeleteRange(client, clock, length))
    if r.pos != r.end:
        raise r.fail(f"{r.end - r.pos} bytes after the delete set")
    return DecodedUpdate(tuple(clients), tuple(structs), tuple(deletes))


def authorship_violation(update: bytes, writers: frozenset[int]) -> str | None:
    """None if every operation in ``update`` is one that ``writers`` may send; else one line
    saying why not, naming the offending client id.

    ``writers``: the client ids whose operations the sender may deliver in this document.
    Every client section of the struct part must be one of them: Items, and GC structs too
    (a GC stands for deleted items *of that client*; accepting one from anybody would let it
    claim that client's clocks, so the real operations there would later be ignored as
    known), and Skip structs (they carry nothing, but only ever sit inside their own
    client's section, so a foreign one is no writer's). A delete set names no author, only
    the items it deletes, so a deletion is attributed to the owner of the deleted items:
    every delete range's client must be in ``writers``. With ``writers`` narrowed to the
    sender's own id(s), that refuses deletions of another writer's items. Content that Yjs
    and Yrs read differently (:data:`AMBIGUOUS_CONTENT`) and undecodable bytes are refused
    too."""
    try:
        decoded = decode_update(update)
    except UpdateDecodeError as exc:
        return f"not a decodable update: {exc}"
    return decoded_violation(decoded, writers)


def brings_nothing(
    decoded: DecodedUpdate, state_vector: Mapping[int, int], deleted: Iterable[DeleteRange]
) -> bool:
    """Whether ``decoded`` holds nothing a document with ``state_vector`` (client → next
    clock) and the delete set ``deleted`` lacks: every struct below that client's clock and
    every delete range inside a deleted one. Applying such an update changes nothing; a
    peer may drop it whoever sent it (an echo of operations it already holds)."""
    for struct in decoded.structs:
        if struct.kind != "skip" and struct.clock + struct.length > state_vector.get(
            struct.client, 0
        ):
            return False
    if not decoded.delete_set:
        return True
    held: dict[int, list[tuple[int, int]]] = {}
    for r in deleted:
        held.setdefault(r.client, []).append((r.clock, r.clock + r.length))
    merged = {client: _merged(spans) for client, spans in held.items()}
    for r in decoded.delete_set:
        if r.length and not _covered(merged.get(r.client, []), r.clock, r.clock + r.length):
            return False
    return True


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` (start, end) sorted and joined where they touch or overlap."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _covered(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether [start, end) lies inside one of the sorted, joined ``spans``."""
    i = bisect.bisect_right(spans, (start, _U32)) - 1
    return i >= 0 and spans[i][0] <= start and end <= spans[i][1]


def decoded_violation(decoded: DecodedUpdate, writers: frozenset[int]) -> str | None:
    """:func:`authorship_violation` of an update already decoded."""
    for client in decoded.clients:
        if client not in writers:
            return f"inserts operations of client {client}, not a writer"
    for struct in decoded.structs:
        kind = struct.kind if struct.kind != "type" else "type:" + struct.content.split(":")[0]
        if kind in AMBIGUOUS_CONTENT:
            return (
                f"client {struct.client} clock {struct.clock}: {kind} content, "
                "which Yjs and Yrs read differently"
            )
    for deleted in decoded.delete_set:
        if deleted.client not in writers:
            return (
                f"deletes operations of client {deleted.client} "
                f"(clock {deleted.clock}, {deleted.length}), not a writer"
            )
    return None
