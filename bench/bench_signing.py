"""What signing document messages costs (issue 13): per message sent and received, and bytes.

A peer with signing configured seals every message (``Signer.seal``: an Ed25519 signature
over the message and its context) and checks every one it receives (``FrameSigning.open``:
the signature, then the replay window) before decoding it. Measured for two message sizes,
each against the unsigned path in the same run (the ratio is the figure to keep):

- one entry: a node's update after one task changed (what the fan-in is made of);
- 100 entries: a 100-task node document's whole state (a y-sync step 2 after a heal).

Printed per size: seal + frame per second against frame alone; reassemble + open per second
against reassemble alone; bytes per message signed against unsigned. Central's whole receive
path with signed frames is ``bench_central_fanin.py`` (its signed run).

Run: ``.venv/bin/python bench/bench_signing.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from bench_yupdate import _per_call_us
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgesched.core.task import TaskState
from edgesched.sync import wire
from edgesched.sync.doc import NodeDoc, client_id_for
from edgesched.sync.schema import TaskReport
from edgesched.sync.signing import FrameSigning, KeyRing, Signer

DOC = "node-gw-00001"


def _per_second(fn: Callable[[], object]) -> float:
    """Calls per second: the median over rounds, as ``bench_yupdate`` times a call."""
    return 1e6 / _per_call_us(fn, budget_s=0.4)


def payload_of(entries: int) -> bytes:
    """A node document of ``entries`` tasks, as an update payload (its whole state)."""
    doc = NodeDoc(DOC, client_id_for("gw-00001"))
    for i in range(entries):
        doc.put_task(f"task-{i:04d}", TaskReport(TaskState.RUNNING, 1.0 + i, priority=i % 900))
    return wire.update_payload(doc.diff(), doc.state_vector())


def main() -> None:
    key = Ed25519PrivateKey.generate()
    signer = Signer("gw-00001", key)
    ring = KeyRing(Path("/nonexistent"))
    ring.add("gw-00001", key.public_key())
    cid = client_id_for("gw-00001")
    kind = wire.Kind.UPDATE
    rows = []
    for label, entries in (("one entry", 1), ("100 entries", 100)):
        payload = payload_of(entries)

        def plain(payload: bytes = payload) -> list[bytes]:
            return wire.encode(kind, DOC, cid, payload)

        def sealed(payload: bytes = payload) -> list[bytes]:
            msg_id = wire.new_msg_id()
            body = signer.seal(DOC, int(kind), cid, 0, msg_id, payload)
            return wire.encode(kind, DOC, cid, body, msg_id=msg_id, signed=True)

        plain_frames, signed_frames = plain(), sealed()

        def receive_plain(frames: list[bytes] = plain_frames) -> object:
            r = wire.Reassembler()
            for frame in frames:
                message = r.feed(frame)
            return message

        checker = FrameSigning(None, ring)
        batch = [sealed() for _ in range(2000)]  # fresh seqs: each opens once
        send_plain, send_signed = _per_second(plain), _per_second(sealed)
        recv_plain = _per_second(receive_plain)
        start = time.perf_counter()
        for frames in batch:
            r = wire.Reassembler()
            message = None
            for frame in frames:
                message = r.feed(frame) or message
            assert message is not None
            checker.open(DOC, "gw-00001", message)
        recv_signed = len(batch) / (time.perf_counter() - start)
        bytes_plain = sum(len(f) for f in plain_frames)
        bytes_signed = sum(len(f) for f in signed_frames)
        rows.append((label, send_plain, send_signed, recv_plain, recv_signed))
        print(
            f"{label:>12}: send {send_signed:,.0f}/s signed against {send_plain:,.0f}/s "
            f"unsigned (x{send_plain / send_signed:.1f} the time); receive {recv_signed:,.0f}/s "
            f"signed against {recv_plain:,.0f}/s (x{recv_plain / recv_signed:.1f}); "
            f"{bytes_signed:,} bytes a message against {bytes_plain:,} "
            f"(+{bytes_signed - bytes_plain} B, x{bytes_signed / bytes_plain:.2f})",
            flush=True,
        )
    small, large = rows
    print(
        f"\n100 entries vs one: signed send x{small[2] / large[2]:.1f} the time "
        f"(unsigned x{small[1] / large[1]:.1f}), signed receive x{small[4] / large[4]:.1f} "
        f"(unsigned x{small[3] / large[3]:.1f})"
    )


if __name__ == "__main__":
    main()
