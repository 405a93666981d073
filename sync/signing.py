"""End-to-end signed document messages: each signed by its sender's Ed25519 key (issue 13).

The broker authenticates connections and its ACL binds each topic to one identity, but the
broker itself (or whoever runs it, or sits on a plain link) can publish anything on any topic.
With signing configured, every document message (a y-sync step, an update) carries its
sender's signature, and a peer checks it before it decodes anything: a broker or a relay that
does not hold the sender's key cannot forge one, and a replayed message is refused.

The signed message's payload is the y-sync payload followed by a trailer::

    seq (u64, big-endian) | signature (64 bytes)

and the frame header's kind byte carries :data:`edgesched.sync.wire.SIGNED_FLAG`. The
signature covers :data:`CONTEXT`, the document's name, the sender's peer id (the topic's last
level), the kind, the sender's client id, the document epoch, the message id, ``seq`` and the
payload: a message moved to another document or another sender's topic, or changed in any
byte, fails.

``seq`` is the sender's clock in microseconds, made strictly increasing (:class:`SeqClock`):
it grows across restarts without a store, as long as the clock does not step back. A receiver
keeps, per document and sender, the highest ``seq`` it took and those of the last
:data:`REPLAY_WINDOW_US` (:class:`ReplayWindow`): a message at or below a ``seq`` it took, or
older than the window behind the highest, is a replay. The windows live in memory: after a
receiver restarts, a message it took before could be taken once more, which a CRDT update
survives unchanged (applying it again changes nothing); the epoch rules still apply.

Keys are per identity (a node, a central): ``edgesched certs signing-key ID --dir DIR`` writes
``DIR/ID.signing.key`` (PKCS#8 PEM, 0600) and ``DIR/keys/ID.pub``. A peer verifies with the
public keys in a directory (:class:`KeyRing`, ``<identity>.pub``, read when first needed):
central holds every node's and the other centrals', a node the centrals'. Configured in
``[edge.mqtt]`` / ``[central.mqtt]`` as ``signing_key`` and ``peer_keys``
(:meth:`edgesched.config.MqttConfig.frame_signing`).
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edgesched.sync import wire

if TYPE_CHECKING:  # cryptography is imported where a key is used: a node that signs nothing
    # does not load it (6.5 MB of RSS; bench/bench_edge_footprint.py)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "CONTEXT",
    "REPLAY_WINDOW_US",
    "TRAILER",
    "FrameSigning",
    "KeyRing",
    "ReplayWindow",
    "Sealed",
    "SeqClock",
    "SignatureRefused",
    "Signer",
    "VerifyThread",
    "load_signing_key",
    "write_signing_key",
]

#: Domain separation: what the signed bytes start with.
CONTEXT: Final = b"edgesched/v1 signed message\x00"
_SEQ = struct.Struct(">Q")
_SIG_BYTES: Final = 64
#: The trailer a signed payload carries: seq and the signature.
TRAILER: Final = _SEQ.size + _SIG_BYTES
#: How far behind the highest seq taken a message may still come (reordered), in µs.
REPLAY_WINDOW_US: Final = 120_000_000
#: How long a missing public key is not looked for again (seconds).
_MISS_TTL_S: Final = 10.0


class SignatureRefused(ValueError):
    """A message refused for its signature. ``reason``: ``signature`` (no key for its sender,
    a bad or missing trailer, a signature that does not verify), ``replay`` (a seq already
    taken, or too old) or ``unsigned`` (signing is required and the message carries none)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _signed_bytes(
    doc: str, sender: str, kind: int, client_id: int, epoch: int, msg_id: int, seq: bytes
) -> bytes:
    name, peer = doc.encode(), sender.encode()
    return b"".join(
        (
            CONTEXT,
            struct.pack(">H", len(name)),
            name,
            struct.pack(">H", len(peer)),
            peer,
            struct.pack(">BIIQ", kind, client_id, epoch, msg_id),
            seq,
        )
    )


class SeqClock:
    """Strictly increasing sequence numbers from a clock in microseconds."""

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.clock_ns = clock_ns
        self.last = 0

    def next(self) -> int:
        self.last = max(self.last + 1, self.clock_ns() // 1000)
        return self.last


@dataclass
class ReplayWindow:
    """The seqs taken from one sender on one document (see the module docstring)."""

    highest: int = -1
    #: seqs taken within the window behind ``highest``, in the order taken
    recent: deque[int] = field(default_factory=deque)
    seen: set[int] = field(default_factory=set)

    def take(self, seq: int) -> bool:
        """Whether ``seq`` is new (then it is remembered); False for a replay."""
        if seq in self.seen or seq <= self.highest - REPLAY_WINDOW_US:
            return False
        self.highest = max(self.highest, seq)
        self.recent.append(seq)
        self.seen.add(seq)
        floor = self.highest - REPLAY_WINDOW_US
        while self.recent and (self.recent[0] <= floor or len(self.recent) > 4096):
            self.seen.discard(self.recent.popleft())
        return True


class Signer:
    """Signs the messages of one identity (its peer id) with its Ed25519 key."""

    def __init__(self, identity: str, key: Ed25519PrivateKey, clock: SeqClock | None = None):
        self.identity = identity
        self.key = key
        self.clock = clock or SeqClock()

    def seal(
        self, doc: str, kind: int, client_id: int, epoch: int, msg_id: int, payload: bytes
    ) -> bytes:
        """``payload`` followed by its trailer (seq and signature)."""
        seq = _SEQ.pack(self.clock.next())
        signed = _signed_bytes(doc, self.identity, kind, client_id, epoch, msg_id, seq)
        return payload + seq + self.key.sign(signed + payload)


class KeyRing:
    """The peers' public keys: ``<directory>/<identity>.pub`` (PEM), each read when first
    needed and kept; a missing one is looked for again after 10 s (a node enrolled since)."""

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = Path(directory)
        self.clock = clock
        self._keys: dict[str, Ed25519PublicKey] = {}
        self._missing: dict[str, float] = {}

    def add(self, identity: str, key: Ed25519PublicKey) -> None:
        self._keys[identity] = key

    def get(self, identity: str) -> Ed25519PublicKey | None:
        key = self._keys.get(identity)
        if key is not None:
            return key
        if self.clock() < self._missing.get(identity, -1.0):
            return None
        key = _read_public_key(self.directory, identity)
        if key is None:
            self._missing[identity] = self.clock() + _MISS_TTL_S
        else:
            self._keys[identity] = key
            self._missing.pop(identity, None)
        return key


def _read_public_key(directory: Path, identity: str) -> Ed25519PublicKey | None:
    if not identity or "/" in identity or identity.startswith(".") or "\0" in identity:
        return None
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        data = (directory / f"{identity}.pub").read_bytes()
        key = serialization.load_pem_public_key(data)
    except (OSError, ValueError):
        return None
    return key if isinstance(key, Ed25519PublicKey) else None


@dataclass(frozen=True, slots=True)
class Sealed:
    """A signed message's parts, its sender's key found: what :meth:`FrameSigning.verify`
    checks (on any thread) and :meth:`FrameSigning.admit` then takes (on the loop's)."""

    body: bytes
    seq: int
    signed: bytes  # what the signature covers, ahead of the body
    signature: bytes
    key: Ed25519PublicKey


@dataclass
class FrameSigning:
    """A peer's signing: its :class:`Signer` (None: it sends unsigned), the keys it verifies
    with, and whether an unsigned message is refused. Shared by the peers of one process;
    holds the replay windows, per (document, sender). ``verifier``: where signatures are
    checked off the event loop (:class:`VerifyThread`; None: inline)."""

    signer: Signer | None
    keys: KeyRing | None
    required: bool = True
    windows: dict[tuple[str, str], ReplayWindow] = field(default_factory=dict)
    verifier: VerifyThread | None = None

    def seal(
        self, doc: str, kind: int, client_id: int, epoch: int, msg_id: int, payload: bytes
    ) -> bytes | None:
        """The signed payload, or None if we sign nothing."""
        if self.signer is None:
            return None
        return self.signer.seal(doc, kind, client_id, epoch, msg_id, payload)

    def open(self, doc: str, sender: str, message: wire.Message) -> bytes:
        """The payload of ``message`` from ``sender`` (the topic's last level) on ``doc``,
        its signature checked and its trailer removed; :class:`SignatureRefused` if not."""
        sealed = self.prepare(doc, sender, message)
        if isinstance(sealed, bytes):
            return sealed
        self.verify(sealed, sender)
        return self.admit(doc, sender, sealed)

    def prepare(self, doc: str, sender: str, message: wire.Message) -> bytes | Sealed:
        """The first step of :meth:`open`, on the loop: the payload itself when there is no
        signature to check (an unsigned message we may take; a signed one and no keys to
        check it with, unless required), else its :class:`Sealed` parts."""
        if not message.signed:
            if self.required:
                raise SignatureRefused("unsigned", f"unsigned message from {sender}")
            return message.payload
        payload = message.payload
        if len(payload) < TRAILER:
            raise SignatureRefused("signature", f"signed message from {sender} has no trailer")
        body, seq, signature = payload[:-TRAILER], payload[-TRAILER:-_SIG_BYTES], payload[-64:]
        key = None if self.keys is None else self.keys.get(sender)
        if key is None:
            if self.keys is None and not self.required:
                return body  # (we verify nothing: a peer of a fleet not yet keyed)
            raise SignatureRefused("signature", f"no public key for {sender}")
        signed = _signed_bytes(
            doc, sender, int(message.kind), message.sender, message.epoch, message.msg_id, seq
        )
        return Sealed(body, _SEQ.unpack(seq)[0], signed, signature, key)

    @staticmethod
    def verify(sealed: Sealed, sender: str) -> None:
        """The signature check (the costly step; thread-safe, and the GIL is released)."""
        from cryptography.exceptions import InvalidSignature

        try:
            sealed.key.verify(sealed.signature, sealed.signed + sealed.body)
        except InvalidSignature:
            raise SignatureRefused(
                "signature", f"message from {sender} does not verify with its key"
            ) from None

    def admit(self, doc: str, sender: str, sealed: Sealed) -> bytes:
        """The last step, on the loop, in the order the messages came: the replay window."""
        window = self.windows.get((doc, sender))
        if window is None:
            window = self.windows[doc, sender] = ReplayWindow()
        if not window.take(sealed.seq):
            raise SignatureRefused("replay", f"message from {sender} replayed (seq taken)")
        return sealed.body


class VerifyThread:
    """Signature checks on a thread of their own, so that they use another core than the
    event loop's (``Ed25519PublicKey.verify`` releases the GIL). Checks submitted in one loop
    turn go as one batch; a single worker runs the batches in order, and each check's
    continuation runs on the loop in the order the checks were submitted, so a peer's
    messages are still handled in the order they came."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="edgesched-verify")
        self._batch: list[tuple[Sealed, str, Callable[[SignatureRefused | None], None]]] = []
        self._in_flight = 0
        self._idle: asyncio.Event | None = None

    def submit(
        self, sealed: Sealed, sender: str, then: Callable[[SignatureRefused | None], None]
    ) -> None:
        """Check ``sealed`` off the loop; ``then(None)`` or ``then(refusal)`` on it after."""
        if not self._batch:
            asyncio.get_running_loop().call_soon(self._flush)
        self._batch.append((sealed, sender, then))

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        self._in_flight += 1
        if self._idle is not None:
            self._idle.clear()
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._executor, _verify_all, [(s, n) for s, n, _ in batch])
        done.add_done_callback(lambda f: self._deliver(batch, f))

    def _deliver(
        self,
        batch: list[tuple[Sealed, str, Callable[[SignatureRefused | None], None]]],
        done: asyncio.Future[list[SignatureRefused | None]],
    ) -> None:
        try:
            outcomes = (
                [SignatureRefused("signature", "the check failed")] * len(batch)
                if done.cancelled() or done.exception() is not None
                else done.result()
            )
            for (_, _, then), outcome in zip(batch, outcomes, strict=True):
                then(outcome)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and not self._batch and self._idle is not None:
                self._idle.set()

    async def drain(self) -> None:
        """Until every check submitted so far has run its continuation."""
        while self._batch or self._in_flight:
            if self._idle is None:
                self._idle = asyncio.Event()
            self._idle.clear()
            await self._idle.wait()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _verify_all(items: list[tuple[Sealed, str]]) -> list[SignatureRefused | None]:
    out: list[SignatureRefused | None] = []
    for sealed, sender in items:
        try:
            FrameSigning.verify(sealed, sender)
        except SignatureRefused as exc:
            out.append(exc)
        else:
            out.append(None)
    return out


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file; ValueError naming the file otherwise."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise ValueError(f"signing key {path}: {exc.strerror}") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"signing key {path}: not a PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"signing key {path}: not an Ed25519 key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file; ValueError naming the file otherwise."""
    key = _read_public_key(Path(path).parent, Path(path).name.removesuffix(".pub"))
    if key is None:
        raise ValueError(f"public key {path}: missing, unreadable or not Ed25519 PEM")
    return key


def write_signing_key(directory: Path, identity: str, *, force: bool = False) -> tuple[Path, Path]:
    """A new Ed25519 key for ``identity``: ``directory/<identity>.signing.key`` (0600) and
    ``directory/keys/<identity>.pub``. FileExistsError unless ``force``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from edgesched.sync.security import check_identity

    identity = check_identity(identity)
    directory = Path(directory)
    key_path = directory / f"{identity}.signing.key"
    pub_path = directory / "keys" / f"{identity}.pub"
    if not force and (key_path.exists() or pub_path.exists()):
        raise FileExistsError(f"{key_path} or {pub_path} exists (force=True to overwrite)")
    pub_path.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(private)
    os.chmod(key_path, 0o600)
    pub_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key_path, pub_path
