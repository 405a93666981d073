"""Where a PUBACK's wait goes: central's MQTT connection as the kernel saw it (issue 19).

``bench_central_scale.py --capture`` records central's one connection to the broker with
tcpdump (loopback, the two ports). This module reads that capture (classic pcap, Ethernet or
Linux "cooked" framing, IPv4), puts each direction's TCP bytes back in order, decodes the MQTT
packets (3.1.1 and 5) and, for each submission, splits the time from central handing the
desired-state frame that carries it to the publish call returning (the broker's PUBACK, as
the harness times "published") into:

- **to the wire**: handed to the session until its PUBLISH left central's socket (central's
  publish gate, paho's queue, central's loop);
- **broker**: that PUBLISH on the wire until the broker's PUBACK of the same packet id (and,
  of it, the **spread**: the PUBLISH's first byte to its last, when its tail left later);
- **back to central**: that PUBACK on the wire until the publish call returned (central's
  loop reading its socket and paho's callback).

Plain Python, no capture library: the formats are small and fixed.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

_PCAP_MAGIC = {b"\xd4\xc3\xb2\xa1": ("<", 1e-6), b"\xa1\xb2\xc3\xd4": (">", 1e-6),
               b"\x4d\x3c\xb2\xa1": ("<", 1e-9), b"\xa1\xb2\x3c\x4d": (">", 1e-9)}  # fmt: skip
_LINK_OFFSET = {1: 14, 113: 16, 276: 20}  # Ethernet, Linux cooked (SLL), SLL2


@dataclass(frozen=True, slots=True)
class Segment:
    at: float
    src: int
    dst: int
    seq: int
    data: bytes


@dataclass(frozen=True, slots=True)
class MqttPacket:
    """One MQTT packet, at the time the segment holding its first byte was captured."""

    at: float
    #: when the segment holding its last byte was captured (Nagle may hold a tail back)
    last_at: float
    kind: int  # 3 PUBLISH, 4 PUBACK, ...
    packet_id: int | None
    topic: str
    payload: bytes


def tcpdump_command(tcpdump: str, out: Path) -> list[str]:
    """tcpdump writing every byte of loopback packets to ``out`` (add a filter).
    ``--immediate-mode``: each packet as it comes (else libpcap hands them over in batches
    and a stop loses the last); ``-B``: a 64 MiB kernel buffer (at 10,000 nodes the default
    dropped a segment in ~80 of central's connection). As root it keeps root (``-Z
    root``): it drops to its own user by default, which cannot write into a root-only
    directory (pytest's, the harness's)."""
    keep = ["-Z", "root"] if os.geteuid() == 0 else []
    return [
        tcpdump, "-i", "lo", "--immediate-mode", "-U", "-s", "0", "-B", "65536", *keep,
        "-w", str(out),
    ]  # fmt: skip


def segments(path: Path) -> Iterator[Segment]:
    """The TCP segments with data in a pcap file (IPv4 only)."""
    raw = path.read_bytes()
    if len(raw) < 24 or raw[:4] not in _PCAP_MAGIC:
        raise ValueError(f"{path}: not a classic pcap file")
    order, unit = _PCAP_MAGIC[raw[:4]]
    linktype = struct.unpack(order + "I", raw[20:24])[0]
    if linktype not in _LINK_OFFSET:
        raise ValueError(f"{path}: link type {linktype} not read here")
    link = _LINK_OFFSET[linktype]
    pos = 24
    while pos + 16 <= len(raw):
        sec, frac, caplen, _ = struct.unpack(order + "IIII", raw[pos : pos + 16])
        frame = raw[pos + 16 : pos + 16 + caplen]
        pos += 16 + caplen
        ip = frame[link:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        tcp = ip[ihl:total]
        if len(tcp) < 20:
            continue
        src, dst, seq = struct.unpack("!HHI", tcp[:8])
        data = tcp[(tcp[12] >> 4) * 4 :]
        if data:
            yield Segment(sec + frac * unit, src, dst, seq, bytes(data))


Chunk = tuple[bytes, list[tuple[int, float]]]


def ordered(segs: list[Segment]) -> list[Chunk]:
    """One direction's bytes in order (retransmitted and overlapping bytes dropped), as the
    contiguous runs between the capture's gaps (a segment the kernel dropped before tcpdump
    read it): each run's bytes, and where each captured segment's new bytes start in it with
    its capture time. Sequence numbers are taken relative to the first segment's."""
    if not segs:
        return []
    base = segs[0].seq
    rel = sorted(
        (((s.seq - base) % 2**32, s.at, s.data) for s in segs),
        key=lambda r: (r[0], r[1]),
    )
    chunks: list[Chunk] = []
    out = bytearray()
    marks: list[tuple[int, float]] = []
    start = rel[0][0]  # the stream offset where the current run begins
    for offset, at, data in rel:
        held = start + len(out)
        if offset + len(data) <= held:
            continue  # all of it already held
        if offset > held:  # a gap: the run ends; the next starts at this segment
            chunks.append((bytes(out), marks))
            out, marks, start, held = bytearray(), [], offset, offset
        marks.append((len(out), at))
        out += data[held - offset :]
    chunks.append((bytes(out), marks))
    return chunks


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    for _ in range(4):
        if pos >= len(buf):
            raise IndexError
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("varint longer than 4 bytes")


def _run_packets(data: bytes, marks: list[tuple[int, float]], v5: bool) -> Iterator[MqttPacket]:
    """The MQTT packets of one contiguous run, from its start; it stops at the first packet
    that does not parse (a run after a gap may start inside one)."""
    starts = [m[0] for m in marks]
    pos = 0
    k = 0
    while pos + 2 <= len(data):
        while k + 1 < len(starts) and starts[k + 1] <= pos:
            k += 1
        at = marks[k][1]
        try:
            length, body = _varint(data, pos + 1)
        except (IndexError, ValueError):
            return
        end = body + length
        if end > len(data):
            return
        kind = data[pos] >> 4
        flags = data[pos] & 0x0F
        if kind in (0, 15) or (kind in (3, 4) and length < 2):
            return  # not a packet start: the rest of this run cannot be framed
        packet_id: int | None = None
        topic, payload = "", b""
        if kind == 3:
            tlen = struct.unpack("!H", data[body : body + 2])[0]
            topic = data[body + 2 : body + 2 + tlen].decode("utf-8", "replace")
            p = body + 2 + tlen
            if (flags >> 1) & 0x03:
                packet_id = struct.unpack("!H", data[p : p + 2])[0]
                p += 2
            if v5:
                plen, p = _varint(data, p)
                p += plen
            payload = data[p:end]
        elif kind == 4 and length >= 2:
            packet_id = struct.unpack("!H", data[body : body + 2])[0]
        j = bisect.bisect_right(starts, end - 1) - 1
        yield MqttPacket(at, marks[j][1], kind, packet_id, topic, payload)
        pos = end


def packets(chunks: list[Chunk], v5: bool) -> Iterator[MqttPacket]:
    """The MQTT packets of one direction (:func:`ordered`), each with the capture time of the
    segment its first byte came in. After a gap a run is read from its first segment on,
    which starts a packet when the sender wrote one packet a segment (small ones mostly);
    a run that does not parse from there is skipped at its first bad packet."""
    for data, marks in chunks:
        try:
            yield from _run_packets(data, marks, v5)
        except (struct.error, IndexError, ValueError):
            continue


@dataclass(frozen=True, slots=True)
class Split:
    task_id: str
    to_wire_ms: float
    broker_ms: float
    back_ms: float
    #: of ``to_wire_ms``+``broker_ms``: from the PUBLISH's first byte on the wire to its
    #: last (a frame that spans segments, its tail held back by Nagle's algorithm)
    spread_ms: float = 0.0


def puback_split(
    path: Path,
    central_port: int,
    handed: Mapping[str, float],
    published: Mapping[str, float],
    *,
    topic_part: str = "/doc/desired-",
    v5: bool = True,
) -> list[Split]:
    """For each task of ``published`` (with its ``handed`` time): the first PUBLISH from
    ``central_port`` on a topic holding ``topic_part`` whose payload carries the task id's
    bytes, at or after it was handed, and the broker's PUBACK of that packet id after it."""
    segs = list(segments(path))
    out_segs = [s for s in segs if s.src == central_port]
    in_segs = [s for s in segs if s.dst == central_port]
    sent = [p for p in packets(ordered(out_segs), v5) if p.kind == 3 and topic_part in p.topic]
    acks = [p for p in packets(ordered(in_segs), v5) if p.kind == 4]
    splits = []
    for task_id, done in sorted(published.items()):
        start = handed.get(task_id)
        if start is None:
            continue
        key = task_id.encode()
        pub = next((p for p in sent if p.at >= start - 0.005 and key in p.payload), None)
        if pub is None or pub.packet_id is None:
            continue
        ack = next((a for a in acks if a.at >= pub.at and a.packet_id == pub.packet_id), None)
        if ack is None:
            continue
        splits.append(
            Split(
                task_id,
                (pub.at - start) * 1e3,
                (ack.at - pub.at) * 1e3,
                (done - ack.at) * 1e3,
                (pub.last_at - pub.at) * 1e3,
            )
        )
    return splits
