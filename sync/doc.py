"""One shared CRDT document (pycrdt / Yrs) with the guards the fleet needs around it.

:class:`SyncedDoc` wraps a :class:`pycrdt.Doc` with a fixed, validated ``client_id`` and gives
the sync layer (``wire`` / ``peer``) what it needs and pycrdt does not: a size cap and a typed
error for remote updates (:class:`UpdateRejected`), no echo of remote updates to the local
update callbacks, a lib0 state-vector decoder (:meth:`SyncedDoc.missing_from`), a canonical
content hash (replicas that share a client id by mistake diverge with *equal* state vectors,
so convergence is checked by hash), and persistence over the edge store's update log with
compaction into a snapshot.

Only small, durable state belongs in a document (registrations, task placements, policy);
telemetry never does: every overwrite of a key grows the document.

Three document kinds get thin typed accessors: :class:`NodeDoc` (``node`` and ``tasks`` maps),
:class:`PolicyDoc` (``policy`` map) and :class:`SiteDoc` (``site`` map). Values are JSON-able;
pycrdt returns numbers as floats, the accessors give integral numbers back as ints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self

from pycrdt import Doc, Map, TransactionEvent

if TYPE_CHECKING:
    from edgesched.edge.store import Store

log = logging.getLogger("edgesched.sync.doc")

#: Largest client id pycrdt peers share safely (Yjs client ids are uint32 on the wire).
CLIENT_ID_LIMIT = 2**32
#: Default cap on one remote update (bytes); pycrdt itself has none.
DEFAULT_MAX_UPDATE_BYTES = 4 << 20
#: Compact the store's update log into a snapshot once it holds more than this many updates.
DEFAULT_COMPACT_AFTER = 256
#: The update pycrdt emits for a transaction that changed nothing.
_EMPTY_UPDATE = b"\x00\x00"
_MAX_VARUINT_BYTES = 10  # 64-bit values at most
_NO_CAP = 1 << 40  # stored updates and snapshots were checked when they arrived


class UpdateRejected(ValueError):
    """A remote update or state vector was refused; the reason is in the message.

    The document is unchanged when this is raised.
    """


def client_id_for(node_id: str) -> int:
    """A deterministic candidate client id in ``[1, 2**32)`` derived from ``node_id``.

    It is only a candidate: two node ids can hash to the same value, and two peers with the same
    client id diverge *silently* (equal state vectors, different content). Central must check
    the id is unique across the fleet when it issues an identity, and store the issued id.
    """
    if not node_id:
        raise ValueError("node_id must not be empty")
    digest = hashlib.blake2b(node_id.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big") or 1


def _check_client_id(client_id: int) -> int:
    if isinstance(client_id, bool) or not isinstance(client_id, int):
        raise TypeError(f"client_id must be an int, got {type(client_id).__name__}")
    if not 0 < client_id < CLIENT_ID_LIMIT:
        raise ValueError(f"client_id must be in [1, 2**32), got {client_id}")
    return client_id


def normalise(value: Any) -> Any:
    """``value`` (pycrdt's ``to_py`` output) with integral floats as ints, recursively.

    ``5`` written by one peer reads back as ``5.0``: after this both are ``5``.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        return {str(k): normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return {"$bytes": bytes(value).hex()}
    return value


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _json_value(value: object, what: str) -> object:
    """Reject what is not plain JSON before it enters a document."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-able: {exc}") from None
    return value


def decode_state_vector(state_vector: bytes) -> dict[int, int]:
    """Decode a lib0 v1 state vector (varuint n, then n (client, clock) pairs).

    Raises :class:`UpdateRejected` on a truncated, overlong or trailing-garbage vector.
    """
    data = bytes(state_vector)
    pos = 0

    def varuint() -> int:
        nonlocal pos
        value = shift = 0
        for _ in range(_MAX_VARUINT_BYTES):
            if pos >= len(data):
                raise UpdateRejected("malformed state vector: truncated")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
        raise UpdateRejected("malformed state vector: varuint longer than 64 bits")

    count = varuint()
    if count > len(data) // 2:
        raise UpdateRejected(f"malformed state vector: {count} entries in {len(data)} bytes")
    out: dict[int, int] = {}
    for _ in range(count):
        client = varuint()
        clock = varuint()
        if client in out:
            raise UpdateRejected(f"malformed state vector: client {client} twice")
        out[client] = clock
    if pos != len(data):
        raise UpdateRejected(f"malformed state vector: {len(data) - pos} trailing byte(s)")
    return out


class SyncedDoc:
    """A pycrdt document with a fixed identity, guarded remote input and a content hash."""

    def __init__(
        self, name: str, client_id: int, *, max_update_bytes: int = DEFAULT_MAX_UPDATE_BYTES
    ) -> None:
        if not name:
            raise ValueError("document name must not be empty")
        if max_update_bytes < 1:
            raise ValueError("max_update_bytes must be >= 1")
        self.name = name
        self.client_id = _check_client_id(client_id)
        self.max_update_bytes = max_update_bytes
        self.doc: Doc[Any] = Doc(client_id=client_id)
        self._callbacks: list[Callable[[bytes], None]] = []
        self._applying_remote = False
        self._remote_changed = False
        self._logged = 0  # updates in the store's log since its last compaction
        # One subscription for the document's lifetime: unobserve() leaks in pycrdt 0.14.
        self.doc.observe(self._on_transaction)

    # ------------------------------------------------------------------ sync primitives

    def state_vector(self) -> bytes:
        """Our state vector (lib0 v1 encoding)."""
        return self.doc.get_state()

    def diff(self, state_vector: bytes | None = None) -> bytes:
        """The update the holder of ``state_vector`` lacks (everything if None)."""
        if state_vector is None:
            return self.doc.get_update()
        decode_state_vector(state_vector)  # refuse garbage with our error, not pycrdt's
        try:
            return self.doc.get_update(state_vector)
        except ValueError as exc:
            raise UpdateRejected(f"state vector refused by pycrdt: {exc}") from None

    def apply_remote(self, update: bytes, *, sender: str) -> bool:
        """Apply a peer's update; returns whether this document changed.

        "Changed" means new operations (the state vector moved) or new deletions (a delete-only
        update leaves the state vector as it was). Applying an update twice changes nothing.
        The update is applied with the origin ``("remote", sender)`` and is never reported to
        :meth:`on_local_update` callbacks. Raises :class:`UpdateRejected` for an oversized or
        undecodable update; the document is then unchanged and still usable. Note the decoder
        is no integrity check: some corrupted updates apply silently (checksum on the wire).
        An update whose dependencies are missing is held pending by pycrdt (no change yet);
        :meth:`missing_from` on the sender's state vector tells that a resync is due.
        """
        if not isinstance(update, bytes | bytearray | memoryview):
            raise UpdateRejected(f"update from {sender} is not bytes")
        data = bytes(update)
        if len(data) > self.max_update_bytes:
            raise UpdateRejected(
                f"update from {sender} is {len(data)} bytes, over the cap of "
                f"{self.max_update_bytes}"
            )
        if not data:
            raise UpdateRejected(f"update from {sender} is empty")
        before = self.doc.get_state()
        self._applying_remote, self._remote_changed = True, False
        try:
            with self.doc.transaction(origin=("remote", sender)):
                self.doc.apply_update(data)
        except ValueError as exc:
            raise UpdateRejected(f"update from {sender} refused: {exc}") from None
        finally:
            self._applying_remote = False
        return self._remote_changed or self.doc.get_state() != before

    def on_local_update(self, callback: Callable[[bytes], None]) -> None:
        """Call ``callback(update)`` after each local transaction that changed the document.

        The callback runs inside pycrdt's commit: it must not read or write the document
        (queue the bytes and handle them later). Remote applies are not reported (no echo).
        """
        self._callbacks.append(callback)

    def _on_transaction(self, event: TransactionEvent) -> None:
        update = bytes(event.update)
        if update == _EMPTY_UPDATE:
            return
        if self._applying_remote:
            self._remote_changed = True
            return
        for callback in self._callbacks:
            try:
                callback(update)
            except Exception:  # one bad subscriber must not break the commit
                log.exception("local update callback of document %s failed", self.name)

    def missing_from(self, remote_state_vector: bytes) -> bool:
        """Whether the holder of ``remote_state_vector`` has operations we lack.

        Raises :class:`UpdateRejected` on a malformed vector.
        """
        ours = decode_state_vector(self.doc.get_state())
        theirs = decode_state_vector(remote_state_vector)
        return any(clock > ours.get(client, 0) for client, clock in theirs.items())

    # ------------------------------------------------------------------ content

    def to_json(self) -> dict[str, object]:
        """Every non-empty root map's contents, numbers normalised (``5.0`` -> ``5``).

        An empty root counts as absent: a root that was only looked up locally never reaches
        the other replicas.
        """
        out: dict[str, object] = {}
        for key in sorted(self.doc.keys()):
            content = self.doc.get(key, type=Map).to_py()
            if content:
                out[key] = normalise(content)
        return out

    def content_hash(self) -> str:
        """sha256 hex of the canonical JSON of :meth:`to_json` (sorted keys, compact)."""
        return hashlib.sha256(_canonical(self.to_json()).encode("utf-8")).hexdigest()

    def root(self, key: str) -> Map[Any]:
        """The root map ``key`` (created locally if absent)."""
        root: Map[Any] = self.doc.get(key, type=Map)
        return root

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        """The full state as one update (what :meth:`restore` takes)."""
        return self.doc.get_update()

    @classmethod
    def restore(
        cls, name: str, client_id: int, snapshot: bytes | None, updates: Iterable[bytes]
    ) -> Self:
        """A document rebuilt from ``snapshot`` (if any) then ``updates``, in order.

        The restored document keeps ``client_id`` and continues its clock. An update that no
        longer decodes is logged and skipped (a state-vector exchange refills what it held).
        """
        out = cls(name, client_id, max_update_bytes=_NO_CAP)
        parts = ([snapshot] if snapshot is not None else []) + list(updates)
        for i, part in enumerate(parts):
            try:
                out.apply_remote(part, sender="restore")
            except UpdateRejected as exc:
                log.error("document %s: skipping stored update #%d: %s", name, i, exc)
        out.max_update_bytes = DEFAULT_MAX_UPDATE_BYTES
        return out

    # ------------------------------------------------------------------ persistence

    async def log_update(
        self, store: Store, update: bytes, *, compact_after: int = DEFAULT_COMPACT_AFTER
    ) -> int:
        """Append ``update`` to this document's log in ``store``; returns its seq.

        The engine calls this from its queue of :meth:`on_local_update` bytes and publishes an
        update only after this returns (so nothing published is lost on a crash). Once the
        log holds more than ``compact_after`` updates, they are folded into a snapshot.
        """
        seq = await store.append_update(self.name, update)
        self._logged += 1
        if self._logged > compact_after:
            # No await between the snapshot and seq: every update with a seq <= ours was
            # transacted before it was appended, hence is in this snapshot.
            await store.compact(self.name, self.snapshot(), seq)
            self._logged = 0
        return seq

    async def persist_to(self, store: Store) -> None:
        """Write the whole current state to ``store`` as the snapshot, folding the log into it."""
        last = await _last_logged_seq(store, self.name)
        # Read the last seq first, then snapshot: updates logged up to it are all included.
        await store.compact(self.name, self.snapshot(), last)
        self._logged = len(await store.updates(self.name, last))

    @classmethod
    async def load_from(cls, store: Store, name: str, client_id: int) -> Self:
        """Rebuild document ``name`` from ``store`` (its snapshot, then the later updates)."""
        snap = await store.snapshot(name)
        after = snap[0] if snap is not None else 0
        logged = await store.updates(name, after)
        out = cls.restore(name, client_id, snap[1] if snap else None, (u for _, u in logged))
        out._logged = len(logged)
        return out


async def _last_logged_seq(store: Store, name: str) -> int:
    snap = await store.snapshot(name)
    after = snap[0] if snap is not None else 0
    logged = await store.updates(name, after)
    return logged[-1][0] if logged else after


# ---------------------------------------------------------------------- document kinds


class NodeDoc(SyncedDoc):
    """An edge node's own document: ``node`` (registration, capabilities), ``tasks``."""

    def set_node(self, key: str, value: object) -> None:
        """Set ``node[key]`` (e.g. ``"registration"``, ``"capabilities"``) to a JSON value."""
        self.root("node")[key] = _json_value(value, f"node[{key!r}]")

    def node(self) -> dict[str, Any]:
        out: dict[str, Any] = normalise(self.root("node").to_py() or {})
        return out

    def put_task(self, task_id: str, record: Mapping[str, object]) -> None:
        """Set the task's state/placement record (a JSON-able dict)."""
        if not task_id:
            raise ValueError("task_id must not be empty")
        self.root("tasks")[task_id] = _json_value(dict(record), f"task {task_id}")

    def remove_task(self, task_id: str) -> None:
        tasks = self.root("tasks")
        if task_id in tasks:
            del tasks[task_id]

    def task(self, task_id: str) -> dict[str, Any] | None:
        value = self.root("tasks").get(task_id)
        return None if value is None else dict(normalise(value))

    def tasks(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = normalise(self.root("tasks").to_py() or {})
        return out


class PolicyDoc(SyncedDoc):
    """The fleet policy document written by central: ``policy`` (mode, tidal profile)."""

    def set_mode(self, mode: str) -> None:
        self.root("policy")["mode"] = str(mode)

    def mode(self) -> str | None:
        value = self.root("policy").get("mode")
        return None if value is None else str(value)

    def set_tidal(self, profile: Mapping[str, object]) -> None:
        self.root("policy")["tidal"] = _json_value(dict(profile), "tidal profile")

    def tidal(self) -> dict[str, Any] | None:
        value = self.root("policy").get("tidal")
        return None if value is None else dict(normalise(value))


class SiteDoc(SyncedDoc):
    """A document shared by the nodes of one site: the ``site`` map of JSON values."""

    def set(self, key: str, value: object) -> None:
        self.root("site")[key] = _json_value(value, f"site[{key!r}]")

    def get(self, key: str) -> Any:
        return normalise(self.root("site").get(key))

    def delete(self, key: str) -> None:
        site = self.root("site")
        if key in site:
            del site[key]
