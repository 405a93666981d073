"""One shared CRDT document (pycrdt / Yrs) with the guards the fleet needs around it.

:class:`SyncedDoc` wraps a :class:`pycrdt.Doc` with a fixed, validated ``client_id`` and gives
the sync layer (``wire`` / ``peer``) what it needs and pycrdt does not: a size cap and a typed
error for remote updates (:class:`UpdateRejected`), no echo of remote updates to the local
update callbacks, a lib0 state-vector decoder (:meth:`SyncedDoc.missing_from`), a canonical
content hash (replicas that share a client id by mistake diverge with *equal* state vectors,
so convergence is checked by hash), and persistence over the edge store's update log with
compaction into a snapshot, and *document epochs* (below).

Only small, durable state belongs in a document (registrations, task placements, policy);
telemetry never does: every overwrite of a key grows the document.

Three document kinds get thin typed accessors: :class:`NodeDoc` (``node`` and ``tasks`` maps),
:class:`PolicyDoc` (``policy`` map) and :class:`SiteDoc` (``site`` map). Values are JSON-able;
pycrdt returns numbers as floats, the accessors give integral numbers back as ints.

**Epochs.** pycrdt never forgets a deleted key: its tombstone stays in every snapshot, so a
node document that keeps adding and removing tasks grows without bound. A *single-writer*
document (:class:`NodeDoc`: only the node writes it, everyone else holds a read-only replica)
can start over: :meth:`SyncedDoc.rotate` replaces the pycrdt document by a fresh one (same
client id) holding the same JSON content, and bumps :attr:`SyncedDoc.epoch`. Client clocks
restart in the fresh document, so updates of two epochs must never meet: frames carry the
epoch (:mod:`.wire`, :func:`.wire.epoch_action` is the receive rule) and a replica that hears a
newer epoch from the writer discards its replica (:meth:`SyncedDoc.reset_to_epoch`).

A rotation reaches the owner the same way every local change does: the local-update callbacks
get one :class:`LocalUpdate` with ``rotation=True`` holding the new epoch's whole state. Logging
it (:meth:`SyncedDoc.log_update`) writes that state as the snapshot, with the new epoch, and
drops the old epoch's log in one SQLite transaction, so a node restarted from its store is at
the epoch it last persisted, with that epoch's content. Every local update is a
:class:`LocalUpdate` tagged with its epoch; one of an epoch older than the store's is skipped.
Nothing of a new epoch may be published before its rotation is logged (the peer's
``before_publish`` waits for the log): otherwise a crash could hand out one epoch twice, with
different histories under the same client clocks. :meth:`SyncedDoc.log_update` also decides
when to rotate (:meth:`SyncedDoc.should_rotate`, at each compaction), so the owner needs to do
nothing more than log every local update in order.

**Cold documents.** A live pycrdt document costs about fifteen times its encoded state in memory
(each entry is a block with its decoded value). :meth:`SyncedDoc.freeze` keeps only the
encoded state of a document nobody has touched for a while (central freezes the replicas and
desired documents of quiet nodes, see :class:`edgesched.sync.freezer.Freezer`); the state
vector, a diff for a peer's state vector and a snapshot are answered from those bytes, and
anything else (a remote update, a write, a read of the content) thaws it first, transparently:
the content, the epoch and the client id are the same after a thaw, only the decoded caches
are rebuilt.

Multi-writer documents (:class:`PolicyDoc`, :class:`SiteDoc`) never rotate: a rotation cuts
history at one point of one replica, and another writer's concurrent updates at the old epoch
would then be dropped (lost writes); only agreement among the writers could pick the cut. One
of them may hold an epoch a sole writer left, and adopts a fellow writer's newer epoch while it
holds no operations of its own. Central's ``fleet`` document has one writer when central runs
alone (:class:`SoleFleetDoc`), and rotates then. A large document rotates in slices
(:meth:`SyncedDoc.rotate_in_slices`): the copy of its live content gives the event loop a turn
every :data:`ROTATION_SLICE` entries, and what was written meanwhile is caught up at the end.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import math
import sys
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

import pycrdt
import pycrdt._base as pycrdt_base
from pycrdt import Doc, Map, Subscription, TransactionEvent

from edgesched.core.policy import PolicyMode
from edgesched.sync import epochs
from edgesched.sync.schema import (
    AssignmentEntry,
    Entry,
    LoadReport,
    ModelEntry,
    ModelReport,
    NodeView,
    PowerOrder,
    PowerReport,
    Refusals,
    Registration,
    SchemaError,
    ServiceEntry,
    SiteLease,
    SiteOrderEntry,
    SiteSeen,
    SiteSpec,
    SiteStop,
    SiteVote,
    StopOrder,
    TaskReport,
    TidalEntry,
    compact_entry,
    decode_map,
    decode_one,
)

if TYPE_CHECKING:
    from edgesched.sync.store import Store

log = logging.getLogger("edgesched.sync.doc")
_V = TypeVar("_V")
_E = TypeVar("_E", bound=Entry)

#: Largest client id pycrdt peers share safely (Yjs client ids are uint32 on the wire).
CLIENT_ID_LIMIT = 2**32
#: Default cap on one remote update (bytes); pycrdt itself has none.
DEFAULT_MAX_UPDATE_BYTES = 4 << 20
#: Compact the store's update log into a snapshot once it holds more than this many updates
#: and at least half the snapshot's bytes (a large document is compacted in proportion to its
#: size: central's fleet document at 10,000 nodes, 144 MB, was encoded whole on the event
#: loop and rewritten every 256 control steps, and every submission waited behind it).
DEFAULT_COMPACT_AFTER = 256
#: The update pycrdt emits for a transaction that changed nothing.
_EMPTY_UPDATE = b"\x00\x00"
_MAX_VARUINT_BYTES = 10  # 64-bit values at most
_NO_CAP = 1 << 40  # stored updates and snapshots were checked when they arrived
#: Epochs travel as a u32 in every frame (:mod:`.wire`).
EPOCH_LIMIT = epochs.EPOCH_LIMIT


@dataclass(frozen=True)
class RotationPolicy:
    """When a single-writer document starts a new epoch (see :meth:`SyncedDoc.should_rotate`).

    Rotate once the encoded document exceeds both ``min_bytes`` and ``ratio`` times the size
    of a fresh document of its live content. With ``ratio`` 2 the document never holds more
    garbage (tombstones, overwritten values) than live content, and each rotation, which costs
    O(live size) to build, persist and send to every replica, is paid for by at least as many
    bytes of garbage: rotation traffic stays below the update traffic that made the garbage.
    Below ``min_bytes`` (64 KiB: one MQTT packet at the default broker limit) size does not
    matter, and small documents never churn epochs.
    """

    min_bytes: int = 64 * 1024
    ratio: float = 2.0

    def __post_init__(self) -> None:
        if self.min_bytes < 0 or not self.ratio > 1.0:
            raise ValueError("RotationPolicy needs min_bytes >= 0 and ratio > 1")


#: The policy of a single-writer document given none (one shared object: central holds a
#: replica of every node's document, each single-writer, and its own desired documents).
DEFAULT_ROTATION = RotationPolicy()

#: A document whose encoded state is larger rotates in slices (:meth:`SyncedDoc.rotate_in_slices`,
#: from :meth:`SyncedDoc.compact_if_due`): a rotation copies the live content, ~9 us an
#: entry, which at central's fleet document of 700,000 assignments (10,000 nodes) held the
#: loop ~6 s in one piece (``bench/bench_document_garbage.py``).
ROTATE_IN_SLICES_BYTES = 1 << 20
#: Entries copied per slice of a rotation between two turns of the event loop (~10-20 ms).
ROTATION_SLICE = 2000
_ABSENT = object()


class EpochError(ValueError):
    """An epoch change that is not allowed (a multi-writer document, an epoch going back)."""


class LocalUpdate(bytes):
    """A local update as the :meth:`SyncedDoc.on_local_update` callbacks get it: plain bytes,
    tagged with the ``epoch`` it belongs to. ``rotation`` marks the one update a rotation
    emits: the whole state of the new epoch (log it like any other; a peer replaces whatever
    it still queues by it, since older queued updates belong to the previous epoch)."""

    epoch: int
    rotation: bool

    def __new__(cls, data: bytes, epoch: int, rotation: bool = False) -> Self:
        out = super().__new__(cls, data)
        out.epoch = epoch
        out.rotation = rotation
        return out


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
    """``value`` (pycrdt's ``to_py`` output) with integral floats up to 2**53 as ints,
    recursively.

    ``5`` written by one peer reads back as ``5.0``: after this both are ``5``.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        # only where the float is exactly the integer a peer wrote (|n| <= 2**53): a larger
        # integral float (1.4e308 CPUs) is a float, and reading it as a 309-digit int would
        # turn a value the writer accepted into one every reader refuses
        if math.isfinite(value) and value.is_integer() and abs(value) <= 2**53:
            return int(value)
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        # Keys interned: a decoded entry keeps its nested values (an assignment's spec), and
        # every copy of "command", "cpu", ... would otherwise be a string of its own (about
        # 1 KB per assignment at central, which holds every one of the fleet).
        return {_intern(str(k)): normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return {"$bytes": bytes(value).hex()}
    return value


class _Observation:
    """One SyncedDoc's subscriptions to its live pycrdt document (the document itself, and
    the root maps watched by key or by revision)."""

    __slots__ = ("doc", "roots", "subscription")

    def __init__(self) -> None:
        self.doc: Doc[Any] | None = None
        self.subscription: Subscription | None = None
        self.roots: list[tuple[Map[Any], Subscription]] = []

    def release(self) -> None:
        if self.subscription is not None and self.doc is not None:
            self.doc.unobserve(self.subscription)
        self.doc = self.subscription = None
        for root, subscription in self.roots:
            root.unobserve(subscription)
        self.roots = []


#: The signature of an observer taking the event (pycrdt inspects each callback it is given,
#: a third of a thaw's cost, unless the callback states it: ``__signature__``).
_ONE_EVENT = inspect.Signature([inspect.Parameter("event", inspect.Parameter.POSITIONAL_ONLY)])


def _observer(callback: Callable[[Any], None]) -> Callable[[Any], None]:
    callback.__signature__ = _ONE_EVENT  # type: ignore[attr-defined]
    return callback


def _observe_root(root: Map[Any], callback: Callable[[Any], None]) -> Subscription:
    """``root.observe(callback)`` for a callback taking the event, less pycrdt's inspection
    of the callback's signature on every call (``inspect.signature``, ~20 us even when the
    callback states it: a thaw observes three roots). The same subscription, made the way
    pycrdt 0.14's ``BaseType.observe`` makes it; ``root.unobserve`` releases it."""
    subscription: Subscription = root.integrated.observe(
        partial(pycrdt_base.observe_callback, callback, root.doc, 1)
    )
    root._subscriptions.append(subscription)
    return subscription


def _on_transaction(me: weakref.ref[SyncedDoc], epoch: int) -> Callable[[Any], None]:
    def changed(event: Any) -> None:
        doc = me()
        if doc is not None:
            doc._on_transaction(event, epoch)

    return _observer(changed)


def _root_changed(me: weakref.ref[SyncedDoc], name: str) -> Callable[[Any], None]:
    def changed(_event: Any) -> None:
        doc = me()
        if doc is not None:
            doc._root_revs[name] += 1

    return _observer(changed)


def _keys_changed(me: weakref.ref[SyncedDoc], name: str) -> Callable[[Any], None]:
    """The observer of root map ``name``: notes the keys each transaction changed (read
    only: inside pycrdt's callback the document must not be touched)."""

    def changed(event: Any) -> None:
        doc = me()
        if doc is None:
            return
        keys = [_key(k) for k in event.keys]
        dirty = doc._dirty.get(name)
        if dirty is not None:
            dirty.update(keys)
        tracked = doc._tracked.get(name)
        if tracked is not None:
            tracked.update(keys)
        rotating = doc._rotation_keys
        if rotating is not None:
            rotating.setdefault(name, set()).update(keys)

    return _observer(changed)


_NOTHING_WRITTEN: dict[str, tuple[str, Entry]] = {}
#: id(entry) -> (entry, its packed text), the latest written (:meth:`SyncedDoc.packed_form`);
#: the entry is held, so its id is not reused while it is here.
_PACKED: dict[int, tuple[Entry, str]] = {}
_PACKED_UP_TO = 4096
#: Own writes a tracked root remembers between two drains (:meth:`SyncedDoc._put`): a step's
#: worth; past it (a bulk write, a restore) the reads decode.
_WRITTEN_UP_TO = 8192


def _plain(value: Any) -> Any:
    """A value read from a pycrdt map, as a fresh document takes it: nested shared types as
    their plain content (what ``Map.to_py`` gives for them)."""
    return value.to_py() if isinstance(value, pycrdt_base.BaseType) else value


def _key(key: object) -> str:
    """A root map's key as read: interned, so the one task id central's index, the decoded
    views and the parsed specs all hold is a single string, not one per place it is read."""
    return sys.intern(str(key))


def _intern(key: str) -> str:
    return sys.intern(key) if len(key) <= _INTERN_UP_TO else key


_INTERN_UP_TO = 32  # field names, not ids


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def unpacked(value: Any) -> Any:
    """``value``, or the JSON object a packed entry's text holds (:attr:`PolicyDoc.packed`).

    Text that is not a JSON object (not JSON, NaN, nested past the parser's depth) stays
    text, which the schema then refuses as the entry it is not."""
    if type(value) is not str:
        return value
    try:
        out = json.loads(value, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return value
    return out if type(out) is dict else value


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

    # Slotted: central holds 20,000 documents at 10,000 nodes, and with more attributes than
    # an instance's shared keys hold, each had a dict of its own (~1.6 kB). ``__dict__``
    # stays for what is set rarely (``packed``) and by tests.
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_applying_remote",
        "_callbacks",
        "_compacted_bytes",
        "_decoded",
        "_dirty",
        "_doc",
        "_drained",
        "_epoch_callbacks",
        "_fresh_size",
        "_frozen",
        "_frozen_sv",
        "_hash",
        "_logged",
        "_logged_bytes",
        "_maybe_pending",
        "_memos",
        "_observation",
        "_remote_callbacks",
        "_remote_changed",
        "_remote_log",
        "_root_maps",
        "_root_revs",
        "_rotation_keys",
        "_stored_epoch",
        "_thaw_callbacks",
        "_tracked",
        "_views",
        "_written",
        "client_id",
        "epoch",
        "max_update_bytes",
        "name",
        "refusals",
        "revision",
        "rotation_policy",
        "rotation_wanted",
        "touched",
    )

    #: Whether only one peer ever writes this kind of document: only those may rotate.
    single_writer: ClassVar[bool] = False
    #: Root maps whose decoded views follow the changed keys of each transaction (pycrdt's
    #: map events) instead of decoding the whole map again: the large, hot ones.
    incremental_roots: ClassVar[tuple[str, ...]] = ()
    #: The entry kind of each incremental root's entries (their packed form leaves out the
    #: fields that hold their default: :meth:`readable` shows them whole).
    entry_kinds: ClassVar[Mapping[str, type[Entry]]] = MappingProxyType({})
    #: Small root maps whose views are cached until that root changes, not until any change
    #: (a node's registration is not decoded again for each task update).
    watched_roots: ClassVar[tuple[str, ...]] = ()
    #: Logged updates past which :meth:`log_update` (and a journal) folds the log into a
    #: snapshot, once they also hold half its bytes.
    compact_after: int = DEFAULT_COMPACT_AFTER

    def __init__(
        self,
        name: str,
        client_id: int,
        *,
        max_update_bytes: int = DEFAULT_MAX_UPDATE_BYTES,
        epoch: int = 0,
        rotation_policy: RotationPolicy | None = None,
    ) -> None:
        if not name:
            raise ValueError("document name must not be empty")
        if max_update_bytes < 1:
            raise ValueError("max_update_bytes must be >= 1")
        self.name = name
        self.client_id = _check_client_id(client_id)
        self.max_update_bytes = max_update_bytes
        #: Which epoch :attr:`doc` belongs to (0 at creation; see the module docstring).
        self.epoch = self._check_epoch(epoch)
        #: When :meth:`log_update` rotates (single-writer documents only; None: never).
        self.rotation_policy = (rotation_policy or DEFAULT_ROTATION) if self.single_writer else None
        #: The live pycrdt document's root maps, as :meth:`root` gave them (emptied with it).
        self._root_maps: dict[str, tuple[Doc[Any], Map[Any]]] = {}
        #: The live pycrdt document's subscriptions, released when this object goes.
        self._observation = _Observation()
        weakref.finalize(self, self._observation.release)
        #: While :meth:`rotate_in_slices` copies the document: root -> the keys changed since
        #: it began (its catch-up), None otherwise.
        self._rotation_keys: dict[str, set[str]] | None = None
        #: Set by :meth:`compact_if_due` for a large document the policy says may rotate: the
        #: encoded size a copy must come under to be kept (its journal runs
        #: :meth:`rotate_in_slices` with it); None otherwise.
        self.rotation_wanted: float | None = None
        #: Bumped by every transaction that changes the live document (local or remote) and
        #: by every replacement of it: decoded views can be cached by it.
        self.revision = 0
        #: Entries refused by the schema when read (:mod:`edgesched.sync.schema`).
        self.refusals = Refusals(name)
        self._views: dict[str, tuple[object, Any]] = {}
        self._root_revs: dict[str, int] = {}  # watched root -> bumped by each change of it
        self._memos: dict[str, dict[str, Any]] = {}
        #: root -> keys changed since its view was last decoded (None: decode it all)
        self._dirty: dict[str, set[str] | None] = {}
        self._decoded: dict[str, dict[str, Any]] = {}
        #: root -> keys changed since :meth:`drain_changes` last ran (None: all of them);
        #: only for the roots a consumer asked :meth:`track_changes` for.
        self._tracked: dict[str, set[str] | None] = {}
        #: tracked root -> key -> (the packed text this document wrote there, its entry),
        #: since the last drain, and what the last drain took: the consumer's read of a key
        #: it wrote itself is not decoded again (:meth:`_one`).
        self._written: dict[str, dict[str, tuple[str, Entry]]] = {}
        self._drained: dict[str, dict[str, tuple[str, Entry]]] = {}
        #: The encoded state while the document is frozen (:meth:`freeze`), else None.
        self._frozen: bytes | None = None
        self._frozen_sv = b"\x00"
        self._maybe_pending = False  # see settle()
        #: Set by every use of :attr:`doc`; a :class:`~edgesched.sync.freezer.Freezer` clears
        #: it at each sweep and freezes the documents it finds still clear at the next.
        self.touched = True
        self._thaw_callbacks: list[Callable[[SyncedDoc], None]] = []
        self._hash: tuple[int, str] | None = None  # (revision, content hash)
        self._doc: Doc[Any] | None = None
        self._doc = self._observed(Doc(client_id=self.client_id))
        self._callbacks: list[Callable[[bytes], None]] = []
        self._epoch_callbacks: list[Callable[[int], None]] = []
        self._applying_remote = False
        self._remote_changed = False
        self._remote_callbacks: list[Callable[[str], None]] = []
        #: :meth:`log_remote_updates`' callback (None: nobody logs them)
        self._remote_log: Callable[[bytes], None] | None = None
        self._logged = 0  # updates in the store's log since its last compaction
        self._logged_bytes = 0  # their bytes
        self._compacted_bytes = 0  # the store's snapshot's bytes (0: none, or not known)
        self._stored_epoch = self.epoch  # the epoch of the store's snapshot and log
        self._fresh_size = 0  # bytes of a fresh doc of the live content, when last measured

    @property
    def doc(self) -> Doc[Any]:
        """The live pycrdt document (thawed first if frozen: see :meth:`freeze`)."""
        self.touched = True
        if self._doc is None:
            self._thaw()
        assert self._doc is not None
        return self._doc

    @doc.setter
    def doc(self, doc: Doc[Any]) -> None:
        was_frozen = self._frozen is not None
        self._frozen = None
        self._doc = doc
        self.touched = True
        if was_frozen:  # replaced while frozen (a new epoch): live again, as a thaw is
            self._thawed()

    @property
    def frozen(self) -> bool:
        """Whether only the encoded state is held (see :meth:`freeze`)."""
        return self._frozen is not None

    def freeze(self) -> int:
        """Keep only the encoded state of the document (compressed), drop the live one and
        the decoded caches of its large maps; returns the bytes kept (0 if it could not
        freeze: inside a transaction, or holding updates pending for a missing dependency).

        What the document holds does not change: its content, epoch, client id, tracked
        changes and :attr:`revision` are the same after the next use thaws it (any use of
        :attr:`doc`). :meth:`state_vector`, :meth:`diff`, :meth:`missing_from`,
        :meth:`snapshot` and :meth:`content_hash` (while the content has not changed) answer
        from the bytes without thawing, and do not count as uses of a live document (a peer's
        periodic state-vector exchange does not keep a quiet document live).
        """
        if self._frozen is not None:
            return len(self._frozen)
        doc = self._doc
        assert doc is not None
        if doc._txn is not None:  # inside a transaction: not now
            return 0
        if self._maybe_pending:
            # pycrdt may hold updates pending for a missing dependency; it encodes them,
            # but a document rebuilt from those bytes integrates them wrongly once the
            # dependency arrives (the replica diverges for good: tests/test_sync_freezer.py
            # found it). Until a full answer from the writer (:meth:`settle`), it stays live.
            return 0
        state = doc.get_update()
        # kept: a frozen document answers them without a thaw (pycrdt.get_state of the bytes
        # would leave out clients at clock 0, which the live document lists)
        self._frozen_sv = doc.get_state()
        # (no content hash here: it cost more than the rest of a freeze, and central freezes
        # a replica after nearly every change; a frozen document hashes its bytes if asked)
        self._unobserve()
        # compressed (zlib's fastest level): the encoded state repeats every entry's field
        # names and most values, and shrinks 6-25x; unpacking it costs a fifth of a thaw
        self._frozen = zlib.compress(state, 1)
        # The views of watched roots are kept (a registration, a power report: small, and
        # valid until their root changes, which a thaw does not do); the rest are dropped.
        self._views = {k: v for k, v in self._views.items() if type(v[0]) is tuple}
        self._decoded.clear()
        for name in self.incremental_roots:
            self._dirty[name] = None  # decode it all once, after a thaw
        self._doc = None
        self._root_maps = {}
        return len(self._frozen)

    @property
    def unsettled(self) -> bool:
        """Whether pycrdt may hold updates pending for a missing dependency (see
        :meth:`settle`): such a document does not freeze."""
        return self._maybe_pending

    def settle(self, *, complete: bool = True) -> None:
        """A full answer from the document's writer was applied (y-sync step 2 for our state
        vector); ``complete``: it left us behind the writer in nothing.

        The decoded views and the tracked changes are read again in full, once: what
        pycrdt had applied out of order before the answer can change in it without its map
        events naming the key (a task deleted by the writer stayed in the decoded view for
        good: tests/test_sync_freezer.py). pycrdt has no way to say whether it holds updates
        pending for a missing dependency either, so a document is taken to hold some from the
        first remote update that changed nothing (a duplicate, or one that waits) until a
        ``complete`` answer; it does not freeze meanwhile.

        Only a document that may hold such updates is read again: one that took every
        update whole, in order, had every change named by its map events. (Read again on
        every answer, central decoded each node's whole task map on every resync: a third
        of its CPU with 10,000 nodes, bench/bench_central_scale.py.)"""
        if self._maybe_pending:
            for name in self.incremental_roots:
                self._dirty[name] = None
            for name in self._tracked:
                self._tracked[name] = None
            self._views.clear()
            for name in self.watched_roots:
                self._root_revs[name] += 1
        if complete:
            self._maybe_pending = False

    def may_hold_pending(self) -> None:
        """Something of the writer's is missing here (its state vector is ahead of ours after
        an update of it was applied): what arrives next may complete updates pycrdt holds,
        without map events, so the next :meth:`settle` reads everything again."""
        self._maybe_pending = True

    def on_thaw(self, callback: Callable[[SyncedDoc], None]) -> None:
        """Call ``callback(doc)`` each time the document is thawed (a freezer's bookkeeping)."""
        self._thaw_callbacks.append(callback)

    def _frozen_state(self) -> bytes:
        """The encoded state a frozen document keeps (compressed by :meth:`freeze`)."""
        assert self._frozen is not None
        return zlib.decompress(self._frozen)

    def _thaw(self) -> None:
        state = self._frozen_state()
        live: Doc[Any] = Doc(client_id=self.client_id)
        live.apply_update(state)  # before it is observed: no change to report
        self._frozen = None
        self._doc = self._observed(live, same_content=True)
        self._thawed()

    def _thawed(self) -> None:
        for callback in self._thaw_callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("thaw callback of document %s failed", self.name)

    def view(self, key: str, build: Callable[[], _V], *, root: str | None = None) -> _V:
        """A decoded view of the content, built once per :attr:`revision` (``root``, one of
        :attr:`watched_roots`: once per change of that root): the one cache of a document's
        decoded content (central's control loop reads every replica each step). Treat what
        it returns as read-only."""
        token: object = self.revision if root is None else ("root", self._root_revs[root])
        hit = self._views.get(key)
        if hit is None or hit[0] != token:
            hit = (token, build())
            self._views[key] = hit
        value: _V = hit[1]
        return value

    def root_version(self, root: str) -> int:
        """A number bumped by every change of ``root``, one of :attr:`watched_roots` (and by a
        new pycrdt document): a consumer that keeps what it last read of the root compares it
        with this, O(1) and without a thaw, and reads the root again only when it moved."""
        return self._root_revs[root]

    def memo(self, key: str) -> dict[str, Any]:
        """The per-entry memo of a map view (see :func:`~edgesched.sync.schema.decode_map`)."""
        return self._memos.setdefault(key, {})

    def _one(self, cls: type[_E], root: Map[Any], key: str, where: str) -> _E | None:
        """The entry ``key`` of a map, decoded on its own (reusing the memo's decode, or the
        entry this document wrote there if the text is still what it wrote)."""
        value = root.get(key)
        if type(value) is str:
            mine = self._drained.get(where, _NOTHING_WRITTEN).get(key) or self._written.get(
                where, _NOTHING_WRITTEN
            ).get(key)
            if mine is not None and mine[0] == value:
                return mine[1]  # type: ignore[return-value]
        raw = self._entry_value(value)
        if raw is None:
            return None
        hit = self._memos.get(where, {}).get(key)
        if hit is not None and hit[0] == raw:
            entry: _E = hit[1]
            return entry
        return decode_one(cls, raw, self.refusals, where=f"{where}[{key}]")

    #: Write the entries of the large maps (a node's ``tasks``; ``assignments``, ``stops``
    #: and ``power``) as compact JSON text rather than as nested values: a live pycrdt entry
    #: costs about a third of the memory then, and a document is rebuilt from its bytes
    #: (a thaw, a restart) about four times as fast, since one item stands for the entry's
    #: twenty. Readers of this version take either form; a writer packs only what its
    #: readers are known to read (:meth:`PolicyDoc.packed_entries`,
    #: :attr:`~edgesched.sync.schema.Registration.reads_packed`).
    packed = False

    def _entry_value(self, value: Any) -> Any:
        """A typed entry's raw value as read from a root map: nested, or packed text. (JSON
        text keeps integers and floats apart as they were written, so a packed entry is not
        normalised: only pycrdt's own values read every number back as a float.)"""
        if type(value) is str:
            return unpacked(value)
        return normalise(value)

    def _put(self, name: str, key: str, entry: Entry, *, if_changed: bool = False) -> None:
        """``root(name)[key] = entry``, in this document's form (:meth:`packed_form`);
        ``if_changed``: not if it holds that entry already, in either form (nested, or packed
        without its default fields), so no empty update. Compared with the map itself, not a
        cached view: inside one transaction a second write to the key must see the first."""
        written = self.packed_form(entry)
        root = self.root(name)
        if if_changed and self._holds(root.get(key), entry, written):
            return
        root[key] = written
        if type(written) is str and name in self._tracked:
            mine = self._written.setdefault(name, {})
            if len(mine) < _WRITTEN_UP_TO or key in mine:
                mine[key] = (written, entry)

    def _holds(self, current: object, entry: Entry, written: dict[str, Any] | str) -> bool:
        if current == written:
            return True  # (packed text is canonical: the same entry, the same text)
        if current is None:
            return False
        try:
            return type(entry).from_entry(self._entry_value(current)) == entry
        except SchemaError:
            return False  # (what it holds does not decode: the entry replaces it)

    def packed_form(self, entry: Entry) -> dict[str, Any] | str:
        """``entry`` as this document writes it: :meth:`pack_entry` of its
        :meth:`~Entry.to_entry`, the text shared by every packed document written the same
        entry lately (central writes each assignment into the fleet document, then the same
        object into its node's desired document)."""
        if not self.packed:
            return entry.to_entry()
        hit = _PACKED.get(id(entry))
        if hit is not None and hit[0] is entry:
            return hit[1]
        text = self.pack_entry(entry.to_entry(), type(entry))
        assert type(text) is str
        if len(_PACKED) >= _PACKED_UP_TO:
            del _PACKED[next(iter(_PACKED))]  # the oldest
        _PACKED[id(entry)] = (entry, text)
        return text

    def pack_entry(self, entry: dict[str, Any], kind: type[Entry]) -> dict[str, Any] | str:
        """``entry`` (a ``kind`` entry's :meth:`~Entry.to_entry`) as this document writes it
        (:attr:`packed`): packed, as compact JSON text without the fields that hold their
        default (:func:`~edgesched.sync.schema.compact_entry`)."""
        if not self.packed:
            return entry
        compact = compact_entry(kind, entry)
        return json.dumps(compact, sort_keys=True, separators=(",", ":"), allow_nan=False)

    def _check_epoch(self, epoch: int) -> int:
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise TypeError(f"epoch must be an int, got {type(epoch).__name__}")
        if not 0 <= epoch < EPOCH_LIMIT:
            raise EpochError(f"epoch {epoch} is not in [0, 2**32)")
        return epoch

    def _unobserve(self) -> None:
        self._observation.release()

    def _observed(self, doc: Doc[Any], *, same_content: bool = False) -> Doc[Any]:
        """``doc``, observed for the current epoch, replacing :attr:`doc`'s subscription.

        One subscription per pycrdt document. pycrdt's subscription refers back to its
        document from the Rust side, where the garbage collector cannot see it, so a document
        rotated away is only freed once unobserved. The callbacks hold this object weakly and
        a finalizer unobserves, so a SyncedDoc nobody holds goes with its pycrdt document
        (held strongly, both stayed for good: the cycle runs through Rust). A write to it
        through a stale reference is logged and not reported to the callbacks (the observer
        knows its epoch).
        ``same_content``: a thaw (the consumers of :meth:`drain_changes` have seen it all and
        cached views are still right).
        """
        self._unobserve()
        if not same_content:
            self.revision += 1
        epoch = self.epoch
        self._root_maps = {}  # (those of the document this one replaces)
        me = weakref.ref(self)
        observation = self._observation
        observation.doc = doc
        observation.subscription = doc.observe(_on_transaction(me, epoch))
        for name in self.incremental_roots:
            root: Map[Any] = doc.get(name, type=Map)
            self._root_maps[name] = (doc, root)  # (what :meth:`root` would get again)
            observation.roots.append((root, _observe_root(root, _keys_changed(me, name))))
            self._dirty[name] = None  # a new pycrdt document: decode it all once
        for name in self.watched_roots:
            watched: Map[Any] = doc.get(name, type=Map)
            self._root_maps[name] = (doc, watched)
            observation.roots.append((watched, _observe_root(watched, _root_changed(me, name))))
            if not same_content:  # a new pycrdt document: its views are built again
                self._root_revs[name] = self._root_revs.get(name, 0) + 1
        if not same_content:
            for name in self._tracked:
                self._tracked[name] = None  # ... and its consumer reads it all once
        return doc

    def track_changes(self, *roots: str) -> None:
        """Keep, for :meth:`drain_changes`, the keys of each root map in ``roots`` that local
        and remote transactions change (one consumer per document: central's fleet index).
        Only :attr:`incremental_roots` can be tracked; the first drain returns None (read
        it all)."""
        for name in roots:
            if name not in self.incremental_roots:
                raise ValueError(f"{type(self).__name__}: root {name!r} is not tracked by key")
            self._tracked.setdefault(name, None)

    def drain_changes(self, root: str) -> set[str] | None:
        """The keys of ``root`` changed since the last drain (None: the whole map may have
        changed, as after a new epoch or a restore); empties the record."""
        if root not in self._tracked:
            raise ValueError(f"{self.name}: changes of {root!r} are not tracked")
        keys = self._tracked[root]
        self._tracked[root] = set()
        self._drained[root] = self._written.pop(root, {})
        return keys

    def each(self, name: str, cls: type[_E]) -> Iterator[tuple[str, _E]]:
        """Every valid entry of root map ``name``, decoded one at a time and kept nowhere
        (a consumer that holds its own index of them, as central's fleet index does, would
        otherwise pay for a second decoded copy of a large map)."""
        root = self.root(name)
        for key in sorted(map(_key, root.keys())):
            raw = self._entry_value(root.get(key))
            entry = decode_one(cls, raw, self.refusals, where=f"{name}[{key}]")
            if entry is not None:
                yield key, entry

    def _map_view(self, name: str, cls: type[_E]) -> Mapping[str, _E]:
        """The decoded view of root map ``name``, maintained from the changed keys."""
        return self.view(name, lambda: self._decode_changes(name, cls))

    def _decode_whole(self, name: str, cls: type[_E]) -> dict[str, _E]:
        """Every valid entry of root map ``name``, decoded."""
        raw = {_key(k): self._entry_value(v) for k, v in (self.root(name).to_py() or {}).items()}
        return decode_map(cls, raw, self.refusals, where=name)

    def _decode_changes(self, name: str, cls: type[_E]) -> Mapping[str, _E]:
        dirty = self._dirty.get(name)
        decoded: dict[str, _E] | None = self._decoded.get(name)
        root = self.root(name)
        if dirty is None or decoded is None:
            # No per-entry memo for these maps: it would hold a raw copy of every entry (half
            # of central's memory for its replicas' tasks), and after the first decode only the
            # changed keys are decoded anyway (a whole-map decode again comes only with a new
            # epoch, at a few microseconds per entry).
            decoded = self._decode_whole(name, cls)
            self._decoded[name] = decoded
        else:
            for key in dirty:
                raw = self._entry_value(root.get(key))
                entry = (
                    None
                    if raw is None
                    else decode_one(cls, raw, self.refusals, where=f"{name}[{key}]")
                )
                if entry is None:
                    decoded.pop(key, None)
                else:
                    decoded[key] = entry
        self._dirty[name] = set()
        return MappingProxyType(dict(decoded))  # a snapshot: callers write while they read

    # ------------------------------------------------------------------ sync primitives

    def state_vector(self) -> bytes:
        """Our state vector (lib0 v1 encoding)."""
        if self._doc is None:
            return self._frozen_sv  # the live document's, as it was frozen
        return self._doc.get_state()  # (not a use that keeps it live: see freeze)

    def diff(self, state_vector: bytes | None = None) -> bytes:
        """The update the holder of ``state_vector`` lacks (everything if None)."""
        if state_vector is None:
            return self.snapshot()
        decode_state_vector(state_vector)  # refuse garbage with our error, not pycrdt's
        try:
            if self._doc is None:
                return pycrdt.get_update(self._frozen_state(), state_vector)
            return self._doc.get_update(state_vector)
        except ValueError as exc:
            raise UpdateRejected(f"state vector refused by pycrdt: {exc}") from None

    def apply_remote(
        self,
        update: bytes,
        *,
        sender: str,
        writer_whole: bool = False,
        writer_state: bytes | None = None,
    ) -> bool:
        """Apply a peer's update; returns whether this document changed.

        "Changed" means new operations (the state vector moved) or new deletions (a delete-only
        update leaves the state vector as it was). Applying an update twice changes nothing.
        The update is applied with the origin ``("remote", sender)`` and is never reported to
        :meth:`on_local_update` callbacks. Raises :class:`UpdateRejected` for an oversized or
        undecodable update; the document is then unchanged and still usable. Note the decoder
        is no integrity check: some corrupted updates apply silently (checksum on the wire).
        An update whose dependencies are missing is held pending by pycrdt (no change yet);
        :meth:`missing_from` on the sender's state vector tells that a resync is due.

        An update that changed nothing is taken to be (perhaps) held pending, until a
        complete answer (:meth:`settle`), unless it comes from the document's sole writer
        (the caller checked) and cannot wait for anything: ``writer_whole``, a y-sync step 2
        answering a step 1 of ours (a diff against a state vector of ours, so every operation
        it builds on is ours already or in it; a step 2 answering another peer's state vector
        is not one), or ``writer_state``, the writer's state vector sent with the
        update, which we now hold all of (nothing of the writer's, who alone writes here, is
        missing). Such an update is a duplicate: a healed node's queued updates arrive again
        in its answer to our step 1, and counted as pending, each made central decode the
        node's whole task map once more (a fifth of its CPU while a thousand nodes healed).
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
        changed = self._remote_changed or self.doc.get_state() != before
        known_duplicate = False
        if not changed:
            if writer_whole or (writer_state is not None and not self.missing_from(writer_state)):
                known_duplicate = True
            else:
                # a duplicate, or an update pycrdt holds pending (one that is pending in part
                # changes something: the peer tells it from the sender's state vector, which
                # every update carries; may_hold_pending)
                self._maybe_pending = True
        if self._remote_log is not None and not known_duplicate:
            try:  # (as received: one held pending is needed once its dependency comes)
                self._remote_log(data)
            except Exception:  # the log's owner must not undo an applied update
                log.exception("remote update log of document %s failed", self.name)
        # Whatever it did: pycrdt may report an empty update for a transaction that changed
        # the state, and a delete-only update leaves the state vector as it was.
        self.revision += 1
        if changed:
            for callback in self._remote_callbacks:
                try:
                    callback(sender)
                except Exception:  # one bad subscriber must not undo an applied update
                    log.exception("remote change callback of document %s failed", self.name)
        return changed

    def on_remote_change(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(sender)`` after a remote update changed this document (outside the
        transaction: it may read the document). Replicas use it to react to what arrived."""
        self._remote_callbacks.append(callback)

    def log_remote_updates(self, callback: Callable[[bytes], None] | None) -> None:
        """Call ``callback(update)`` with each remote update :meth:`apply_remote` applied, as
        received, unless it was known to be a duplicate (None: stop). Appended to the store's
        log after the last snapshot, in order, they rebuild what this replica holds (an
        update pycrdt held pending among them integrates once its dependency is applied): a
        replica whose writer is elsewhere can be persisted by its changes, not by a whole
        snapshot each time (``central/replicas.py``). Only the updates of the current epoch
        and document: after :meth:`reset_to_epoch` or :meth:`drop_replica` the owner writes a
        snapshot first (its :meth:`on_epoch_change` callbacks run)."""
        self._remote_log = callback

    def on_local_update(self, callback: Callable[[bytes], None]) -> None:
        """Call ``callback(update)`` after each local transaction that changed the document.

        The callback runs inside pycrdt's commit: it must not read or write the document
        (queue the bytes and handle them later). Remote applies are not reported (no echo).
        """
        self._callbacks.append(callback)

    def _on_transaction(self, event: TransactionEvent, epoch: int) -> None:
        update = LocalUpdate(event.update, epoch)
        if update == _EMPTY_UPDATE:
            return
        if epoch != self.epoch:
            log.error(
                "document %s: a write to epoch %d after the rotation to %d is lost",
                self.name,
                epoch,
                self.epoch,
            )
            return
        self.revision += 1
        if self._applying_remote:
            self._remote_changed = True
            return
        self._emit(update)

    def _emit(self, update: LocalUpdate) -> None:
        for callback in self._callbacks:
            try:
                callback(update)
            except Exception:  # one bad subscriber must not break the commit
                log.exception("local update callback of document %s failed", self.name)

    def missing_from(self, remote_state_vector: bytes) -> bool:
        """Whether the holder of ``remote_state_vector`` has operations we lack.

        Raises :class:`UpdateRejected` on a malformed vector.
        """
        ours = decode_state_vector(self.state_vector())
        theirs = decode_state_vector(remote_state_vector)
        return any(clock > ours.get(client, 0) for client, clock in theirs.items())

    # ------------------------------------------------------------------ epochs

    def on_epoch_change(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(new_epoch)`` after :meth:`rotate` or :meth:`reset_to_epoch`.

        It runs outside any transaction (it may read the document). A peer uses it to forget
        what it queued for the old epoch; the writer's persistence needs nothing more than
        logging the rotation's :class:`LocalUpdate` like every other.
        """
        self._epoch_callbacks.append(callback)

    def _epoch_changed(self) -> None:
        for callback in self._epoch_callbacks:
            try:
                callback(self.epoch)
            except Exception:
                log.exception("epoch callback of document %s failed", self.name)

    def _live_content(self) -> dict[str, dict[str, Any]]:
        """Every non-empty root map as pycrdt gives it (not normalised: values are copied as
        they are, so the fresh document holds the same floats, bytes and nested values)."""
        out: dict[str, dict[str, Any]] = {}
        for key in sorted(self.doc.keys()):
            content = self.doc.get(key, type=Map).to_py()
            if content:
                out[key] = dict(content)
        return out

    def _fresh(self) -> Doc[Any]:
        """A new pycrdt document (unobserved) holding the live content, in one transaction."""
        fresh: Doc[Any] = Doc(client_id=self.client_id)
        content = self._live_content()
        with fresh.transaction(origin=("rotate", self.name)):
            for key, entries in content.items():
                root: Map[Any] = fresh.get(key, type=Map)
                for k, v in entries.items():
                    root[k] = v
        return fresh

    def rotate(self, *, min_epoch: int | None = None) -> LocalUpdate:
        """Start a new epoch holding the same content; the writer's side. Returns its state.

        The pycrdt document is replaced by a fresh one (same client id) built from the live
        content only, so the tombstones of removed keys and overwritten values are gone, and
        :attr:`epoch` becomes the one after it, or ``min_epoch`` if that is newer still
        (``min_epoch``: to jump past an epoch another peer announced, see
        :func:`.wire.epoch_action`); epochs compare as serial numbers (:mod:`.epochs`), so
        the epoch after 2**32 - 1 is 0. The content hash is
        unchanged. The local-update callbacks get the new epoch's whole state as one
        :class:`LocalUpdate` with ``rotation=True`` (the owner logs it: that persists the
        rotation), then the :meth:`on_epoch_change` callbacks run. Callbacks stay registered.

        Must not run inside a transaction. Raises :class:`EpochError` for a multi-writer
        document (see the module docstring), or a ``min_epoch`` outside the u32 range.
        """
        self._check_rotatable()
        if min_epoch is not None and not 0 <= min_epoch < EPOCH_LIMIT:
            raise EpochError(f"document {self.name} cannot rotate to epoch {min_epoch}")
        return self._start_epoch(self._fresh(), min_epoch)  # (built unobserved: no local change)

    def _check_rotatable(self) -> None:
        """EpochError for a multi-writer document (see the module docstring)."""
        if not self.single_writer:
            raise EpochError(
                f"{type(self).__name__} {self.name} has several writers and never rotates"
            )

    def _start_epoch(
        self, fresh: Doc[Any], min_epoch: int | None, state: bytes | None = None
    ) -> LocalUpdate:
        """The end of a rotation: ``fresh`` (the live content, unobserved; ``state``: its
        encoded state, if the caller has it) becomes the document at the next epoch (or
        ``min_epoch``, if newer), and its whole state is reported."""
        new_epoch = epochs.after(self.epoch)
        if min_epoch is not None and epochs.newer(min_epoch, new_epoch):
            new_epoch = min_epoch
        if state is None:
            state = fresh.get_update()
        self.epoch = new_epoch
        # (the same content: what consumers of the changed keys and views saw stays true, and
        # central's fleet index need not read a fleet's worth of entries again)
        self.doc = self._observed(fresh, same_content=True)
        self._fresh_size = len(state)
        update = LocalUpdate(state, new_epoch, rotation=True)
        log.info(
            "document %s: rotated to epoch %d (%d bytes of live state)",
            self.name,
            new_epoch,
            len(state),
        )
        self._emit(update)
        self._epoch_changed()
        return update

    async def rotate_in_slices(
        self, *, slice_entries: int | None = None, below: float | None = None
    ) -> LocalUpdate | None:
        """:meth:`rotate`, with the live content copied a slice at a time between turns of the
        event loop (the writer keeps writing meanwhile). The incremental roots are copied
        in slices of ``slice_entries`` keys (:data:`ROTATION_SLICE`); then, in one piece,
        every key those roots changed since the copy began (its value now, or its absence:
        the map events name them) and the other roots whole (small: mode, models). None,
        with nothing changed, if the document was replaced meanwhile (another rotation, a
        restore), or if the copy's encoded state is not smaller than ``below`` (then it is
        only measured: :meth:`should_rotate` counts from it)."""
        self._check_rotatable()
        live, epoch = self.doc, self.epoch
        fresh: Doc[Any] = Doc(client_id=self.client_id)
        changed: dict[str, set[str]] = {}
        self._rotation_keys = changed
        try:
            step = ROTATION_SLICE if slice_entries is None else slice_entries
            return await self._copy_in_slices(live, epoch, fresh, changed, step, below)
        finally:
            self._rotation_keys = None
            self.rotation_wanted = None  # (asked again meanwhile from what this one measured)

    async def _copy_in_slices(
        self,
        live: Doc[Any],
        epoch: int,
        fresh: Doc[Any],
        changed: dict[str, set[str]],
        slice_entries: int,
        below: float | None,
    ) -> LocalUpdate | None:
        """:meth:`rotate_in_slices`' body (``changed`` fills as the document is written)."""
        present = set(live.keys())
        for name in sorted(self.incremental_roots):
            if name not in present:
                continue
            keys = list(live.get(name, type=Map).keys())
            for start in range(0, len(keys), slice_entries):
                await asyncio.sleep(0)  # (what the loop has to do, in between)
                if self.doc is not live or self.epoch != epoch:
                    return None
                source: Map[Any] = live.get(name, type=Map)
                with fresh.transaction(origin=("rotate", self.name)):
                    target: Map[Any] = fresh.get(name, type=Map)
                    for key in keys[start : start + slice_entries]:
                        value = source.get(key, _ABSENT)
                        if value is not _ABSENT:
                            target[key] = _plain(value)
        with fresh.transaction(origin=("rotate", self.name)):
            for name, written in changed.items():  # (written since the copy began)
                source = live.get(name, type=Map)
                target = fresh.get(name, type=Map)
                for key in written:
                    value = source.get(key, _ABSENT)
                    if value is not _ABSENT:
                        target[key] = _plain(value)
                    elif key in target:
                        del target[key]
            for name in sorted(live.keys()):  # the small roots, whole
                if name in self.incremental_roots:
                    continue
                content = live.get(name, type=Map).to_py()
                if content:
                    root: Map[Any] = fresh.get(name, type=Map)
                    for key, value in content.items():
                        root[key] = value
        state = fresh.get_update()
        if below is not None and len(state) >= below:
            self._fresh_size = len(state)
            return None
        return self._start_epoch(fresh, None, state)

    def reset_to_epoch(self, epoch: int) -> None:
        """Replica side: discard everything and start, empty, at the newer ``epoch``.

        Called when data of a newer epoch arrives from the document's writer (the rule is
        :func:`.wire.epoch_action`); apply that data next, then resync by state vector as
        usual. The :meth:`on_epoch_change` callbacks run; nothing is reported as a local
        update. Raises :class:`EpochError` unless ``epoch`` is newer than :attr:`epoch`, or
        for a multi-writer document that holds operations of its own (:meth:`authored_here`:
        a fellow writer's epoch would drop them; one that authored nothing, a central replica
        joining one that rotated its fleet document while alone, adopts it).
        """
        self._check_epoch(epoch)
        if not epochs.newer(epoch, self.epoch):
            raise EpochError(
                f"document {self.name} is at epoch {self.epoch}: cannot reset to {epoch}"
            )
        if not self.single_writer and self.authored_here():
            raise EpochError(
                f"{type(self).__name__} {self.name} has several writers and holds operations "
                f"of its own at epoch {self.epoch}: cannot reset to {epoch}"
            )
        self.epoch = epoch
        self.doc = self._observed(Doc(client_id=self.client_id))
        self._fresh_size = 0
        log.info("document %s: replica reset to epoch %d", self.name, epoch)
        self._epoch_changed()

    def authored_here(self) -> bool:
        """Whether this replica holds operations of its own client id (then it cannot be
        dropped and rebuilt from its peers: they may not have everything it wrote)."""
        return self.client_id in decode_state_vector(self.state_vector())

    def drop_replica(self) -> None:
        """Replica side: discard everything, same epoch, to be refilled by a resync.

        The way out when updates whose dependencies never arrive pile up inside pycrdt
        (which holds them, unbounded, and has no way to drop them). Only for a replica that
        authored nothing (:meth:`authored_here`): ValueError otherwise. The
        :meth:`on_epoch_change` callbacks run (the epoch is unchanged) so owners re-read it.
        """
        if self.authored_here():
            raise ValueError(f"document {self.name}: holds our own operations, cannot drop")
        self.doc = self._observed(Doc(client_id=self.client_id))
        self._fresh_size = 0
        log.warning("document %s: replica dropped, to be refilled by a resync", self.name)
        self._epoch_changed()

    def should_rotate(self, size: int | None = None) -> bool:
        """Whether the :attr:`rotation_policy` says to rotate now (False if there is none).

        ``size`` is the encoded document's size if the caller has it (a snapshot it just took).
        Building a fresh document to measure the live content costs about as much as a
        rotation, so it is done only when ``size`` exceeds ``ratio`` times the last
        measurement; each measurement that does not lead to a rotation raises that mark.
        """
        policy = self.rotation_policy
        size = len(self.snapshot()) if size is None and policy is not None else size
        if policy is None or size is None or not self._worth_measuring(size):
            return False
        self._fresh_size = len(self._fresh().get_update())
        return size > policy.ratio * self._fresh_size

    def _worth_measuring(self, size: int) -> bool:
        """Whether a document of encoded ``size`` may hold enough garbage that measuring its
        live content (a copy: a rotation's cost) is worth it: past the policy's ``min_bytes``
        and ``ratio`` times the last measurement."""
        policy = self.rotation_policy
        return (
            policy is not None
            and size > policy.min_bytes
            and size > policy.ratio * self._fresh_size
        )

    # ------------------------------------------------------------------ content

    def to_json(self) -> dict[str, object]:
        """Every non-empty root map's contents, numbers normalised (``5.0`` -> ``5``).

        An empty root counts as absent: a root that was only looked up locally never reaches
        the other replicas.
        """
        return _json_of(self.doc)

    def readable(self) -> dict[str, object]:
        """:meth:`to_json` with every packed entry of the large maps read as the JSON object
        it holds (:attr:`packed`): the content as an API shows it, whichever form each entry
        was written in. :meth:`to_json` stays the bytes' content (what the hash covers)."""
        out = self.to_json()
        for name in self.incremental_roots:
            entries = out.get(name)
            if isinstance(entries, dict):
                kind = self.entry_kinds[name]
                out[name] = {k: self._readable_entry(kind, v) for k, v in entries.items()}
        return out

    def _readable_entry(self, kind: type[Entry], value: object) -> object:
        """A packed entry whole, as its kind writes it nested (the fields it left out hold
        their default); one that does not decode, or a nested one, as it is."""
        raw = self._entry_value(value)
        if type(value) is str and type(raw) is dict:
            try:
                return kind.from_entry(raw).to_entry()
            except SchemaError:
                pass
        return raw

    def content_hash(self) -> str:
        """sha256 hex of the canonical JSON of :meth:`to_json` (sorted keys, compact); kept
        until the content changes (a frozen document answers without a thaw)."""
        if self._hash is not None and self._hash[0] == self.revision:
            return self._hash[1]
        if self._doc is None:  # frozen: read a copy of its bytes, not a thaw (not a use)
            digest = content_hash_of(self._frozen_state())
        else:
            digest = _digest(self.to_json())
        self._hash = (self.revision, digest)
        return digest

    def root(self, key: str) -> Map[Any]:
        """The root map ``key`` (created locally if absent); kept per live document (pycrdt's
        ``get`` integrates a new map each call, 15 us, on every read of an entry)."""
        doc = self.doc
        hit = self._root_maps.get(key)
        if hit is not None and hit[0] is doc:
            return hit[1]
        root: Map[Any] = doc.get(key, type=Map)
        self._root_maps[key] = (doc, root)
        return root

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        """The full state as one update (what :meth:`restore` takes)."""
        if self._doc is None:
            return self._frozen_state()
        return self._doc.get_update()

    @classmethod
    def restore(
        cls,
        name: str,
        client_id: int,
        snapshot: bytes | None,
        updates: Iterable[bytes],
        *,
        epoch: int = 0,
    ) -> Self:
        """A document rebuilt from ``snapshot`` (if any) then ``updates``, in order, at
        ``epoch`` (every part must belong to it).

        The restored document keeps ``client_id`` and continues its clock. An update that no
        longer decodes is logged and skipped (a state-vector exchange refills what it held).
        """
        out = cls(name, client_id, max_update_bytes=_NO_CAP, epoch=epoch)
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
        self, store: Store, update: bytes, *, compact_after: int | None = None
    ) -> int:
        """Persist one local update in ``store``; returns its seq (0 if nothing was written).

        The engine calls this, in order, for every :meth:`on_local_update` bytes and publishes
        an update only after this returns (so nothing published is lost on a crash).

        - An update of the store's epoch is appended to the log. Once the log holds more than
          ``compact_after`` updates (default :attr:`compact_after`), it is folded into a
          snapshot; that is also when the :attr:`rotation_policy` is consulted, and a
          rotation started (its update reaches the callbacks, hence this method, next).
        - A rotation update (:class:`LocalUpdate` ``rotation=True``) of a newer epoch becomes
          the snapshot, with its epoch, and the old epoch's log is dropped: one transaction,
          so a crash leaves the store at the old epoch or the new one, whole.
        - An update of an epoch older than the store's is already in the store's snapshot (it
          was made before the rotation that wrote it): skipped.

        Plain bytes count as being of the current epoch.
        """
        epoch = update.epoch if isinstance(update, LocalUpdate) else self.epoch
        rotation = isinstance(update, LocalUpdate) and update.rotation
        if epochs.newer(self._stored_epoch, epoch) or (rotation and epoch == self._stored_epoch):
            return 0
        if epochs.newer(epoch, self._stored_epoch):
            # A rotation (or, if the owner missed it, anything after one: then our whole
            # state, which was transacted after it and so holds it).
            snapshot = bytes(update) if rotation else self.snapshot()
            epoch = epoch if rotation else self.epoch
            seq = await store.rotate_doc(self.name, snapshot, epoch)
            self._stored_epoch = epoch
            self._store_holds(snapshot)
            return seq
        seq = await store.append_update(self.name, update)
        self.appended((update,))
        await self.compact_if_due(store, seq, compact_after=compact_after)
        return seq

    def appendable(self, update: bytes) -> bool:
        """Whether :meth:`log_update` would only append ``update`` to the log (an update of
        the store's epoch, not a rotation): such updates, in a row, may be appended in one
        store call (:meth:`Store.append_updates`), each then counted by :meth:`appended`."""
        if isinstance(update, LocalUpdate):
            return update.epoch == self._stored_epoch and not update.rotation
        return self.epoch == self._stored_epoch

    def appended(self, updates: Sequence[bytes]) -> None:
        """``updates`` (each :meth:`appendable`) are now in the store's log."""
        self._logged += len(updates)
        self._logged_bytes += sum(map(len, updates))

    async def compact_if_due(
        self, store: Store, seq: int, *, compact_after: int | None = None
    ) -> None:
        """After appending up to ``seq``: fold the log into a snapshot once it holds more
        than ``compact_after`` updates and half the last snapshot's bytes (or rotate, if the
        :attr:`rotation_policy` says so). Any time after the append returned: every update
        with a seq up to ``seq`` was transacted before it was appended, hence is in the
        snapshot taken here (a later one in it too is harmless: it is appended after ``seq``,
        and applying it again on a restore changes nothing)."""
        if (
            self._logged > (self.compact_after if compact_after is None else compact_after)
            and 2 * self._logged_bytes >= self._compacted_bytes
            and self.epoch == self._stored_epoch
        ):
            snapshot = self.snapshot()
            policy = self.rotation_policy
            # (a rotation's update comes back to the journal and is persisted then)
            if len(snapshot) > ROTATE_IN_SLICES_BYTES and policy is not None:
                # Large: measuring the live content is a rotation's copy, made in slices by
                # the journal's own task (not under its lock: the writes go on being logged
                # meanwhile) and kept as the new epoch if the policy says so.
                if self._worth_measuring(len(snapshot)):
                    self.rotation_wanted = len(snapshot) / policy.ratio
            elif self.should_rotate(len(snapshot)):
                self.rotate()
                return
            await store.compact(self.name, snapshot, seq)
            self._store_holds(snapshot)

    def _store_holds(self, snapshot: bytes | None, logged: Sequence[bytes] = ()) -> None:
        """The store now holds ``snapshot`` and the updates ``logged`` after it: what the
        next compaction counts from (:data:`DEFAULT_COMPACT_AFTER`)."""
        self._logged = len(logged)
        self._logged_bytes = sum(map(len, logged))
        self._compacted_bytes = 0 if snapshot is None else len(snapshot)

    def stored_as(self, snapshot: bytes, epoch: int) -> None:
        """The store now holds ``snapshot`` at ``epoch`` as this document's whole state,
        written by the caller (:meth:`Store.replace_docs`, many documents a transaction)."""
        self._stored_epoch = epoch
        self._store_holds(snapshot)

    async def persist_to(self, store: Store) -> None:
        """Write the whole current state to ``store`` as the snapshot, folding the log into it.

        At a newer epoch than the store's, this is a rotation (one transaction: the snapshot
        with its epoch, the old log dropped). Raises :class:`EpochError` if the store already
        holds a newer epoch than this document.
        """
        stored = await store.snapshot_with_epoch(self.name)
        stored_epoch = stored[2] if stored is not None else 0
        if stored is not None and epochs.newer(stored_epoch, self.epoch):
            raise EpochError(
                f"store holds document {self.name} at epoch {stored_epoch}, "
                f"newer than this copy's {self.epoch}"
            )
        if stored_epoch != self.epoch:  # (no snapshot stands for epoch 0)
            snapshot = self.snapshot()
            await store.rotate_doc(self.name, snapshot, self.epoch)
            self._stored_epoch = self.epoch
            self._store_holds(snapshot)
            return
        last = await _last_logged_seq(store, self.name)
        # Read the last seq first, then snapshot: updates logged up to it are all included.
        snapshot = self.snapshot()
        await store.compact(self.name, snapshot, last)
        self._stored_epoch = self.epoch
        self._store_holds(snapshot, [u for _, u in await store.updates(self.name, last)])

    @classmethod
    async def load_from(cls, store: Store, name: str, client_id: int) -> Self:
        """Rebuild document ``name`` from ``store`` (its snapshot, then the later updates), at
        the epoch of that snapshot (0 without one)."""
        snap = await store.snapshot_with_epoch(name)
        after, data, epoch = snap if snap is not None else (0, None, 0)
        logged = await store.updates(name, after)
        out = cls.restore(name, client_id, data, (u for _, u in logged), epoch=epoch)
        out._store_holds(data, [u for _, u in logged])
        return out


def content_hash_of(state: bytes) -> str:
    """:meth:`SyncedDoc.content_hash` of the document whose encoded state is ``state`` (its
    :meth:`SyncedDoc.snapshot`): the same digest, computed wherever the bytes are (the scale
    harness compares central's documents with its nodes' in its simulators' processes, not
    on central's loop)."""
    copy: Doc[Any] = Doc()
    copy.apply_update(state)
    return _digest(_json_of(copy))


def _digest(content: dict[str, object]) -> str:
    """The content hash of a document's JSON content (its canonical form's SHA-256)."""
    return hashlib.sha256(_canonical(content).encode("utf-8")).hexdigest()


def _json_of(doc: Doc[Any]) -> dict[str, object]:
    """:meth:`SyncedDoc.to_json` of a pycrdt document."""
    out: dict[str, object] = {}
    for key in sorted(doc.keys()):
        content = doc.get(key, type=Map).to_py()
        if content:
            out[key] = normalise(content)
    return out


async def _last_logged_seq(store: Store, name: str) -> int:
    snap = await store.snapshot(name)
    after = snap[0] if snap is not None else 0
    logged = await store.updates(name, after)
    return logged[-1][0] if logged else after


# ---------------------------------------------------------------------- document kinds


def _set_changed(root: Map[Any], key: str, value: dict[str, Any]) -> None:
    """``root[key] = value`` unless it holds that value already (no empty update). Compared
    with the map itself, not a cached view: inside one transaction the views are those of its
    start, and a second write to the same key must see the first."""
    if normalise(unpacked(root.get(key))) != normalise(value):
        root[key] = value


class NodeDoc(SyncedDoc):
    """An edge node's own document: ``node`` (registration, models, power), ``tasks``.

    Single writer (the node), so it has epochs: see the module docstring. Every entry is
    written from and read as a typed entry of :mod:`edgesched.sync.schema`; an entry that does
    not decode is refused (counted in :attr:`refusals`) and reads as absent.
    """

    single_writer = True
    incremental_roots: ClassVar[tuple[str, ...]] = ("tasks",)
    entry_kinds = MappingProxyType({"tasks": TaskReport})
    watched_roots = ("node", "site")

    @property
    def writer(self) -> str | None:
        """The writer's peer id by the naming convention ``node-<id>`` (None otherwise)."""
        prefix = "node-"
        return self.name[len(prefix) :] if self.name.startswith(prefix) else None

    def _node_raw(self, key: str) -> object:
        return normalise(self.root("node").get(key))

    def set_registration(self, registration: Registration) -> None:
        _set_changed(self.root("node"), "registration", registration.to_entry())

    def registration(self) -> Registration | None:
        return self.view(
            "registration",
            lambda: decode_one(
                Registration, self._node_raw("registration"), self.refusals, where="registration"
            ),
            root="node",
        )

    def set_model_reports(self, reports: Mapping[str, ModelReport]) -> None:
        _set_changed(self.root("node"), "models", {k: r.to_entry() for k, r in reports.items()})

    def model_reports(self) -> Mapping[str, ModelReport]:
        """kind -> the model this node runs (as it reports it)."""
        return self.view(
            "models",
            lambda: MappingProxyType(
                decode_map(
                    ModelReport,
                    self._node_raw("models"),
                    self.refusals,
                    where="node.models",
                    memo=self.memo("node.models"),
                )
            ),
            root="node",
        )

    def set_power_report(self, report: PowerReport) -> None:
        _set_changed(self.root("node"), "power", report.to_entry())

    def power_report(self) -> PowerReport | None:
        return self.view(
            "power",
            lambda: decode_one(PowerReport, self._node_raw("power"), self.refusals, where="power"),
            root="node",
        )

    def put_task(self, task_id: str, report: TaskReport) -> None:
        """Set the node's report of one task (only when it changed)."""
        if not task_id:
            raise ValueError("task_id must not be empty")
        self._put("tasks", task_id, report, if_changed=True)

    def remove_task(self, task_id: str) -> None:
        tasks = self.root("tasks")
        if task_id in tasks:
            del tasks[task_id]

    def task(self, task_id: str) -> TaskReport | None:
        """One task's report, decoded alone (the whole map is decoded only by :meth:`tasks`)."""
        return self._one(TaskReport, self.root("tasks"), task_id, "tasks")

    def typed(self) -> NodeView:
        """The whole content, typed (one decode per change)."""
        return self.view(
            "typed",
            lambda: NodeView(
                self.registration(), self.tasks(), self.power_report(), self.model_reports()
            ),
        )

    def tasks(self) -> Mapping[str, TaskReport]:
        """task id -> the node's report of it (valid entries only)."""
        return self._map_view("tasks", TaskReport)

    # --- site coordination (edgesched.edge.site): written only by a node with site peers

    def _site_entry(self, key: str, cls: type[_E]) -> _E | None:
        return self.view(
            f"site.{key}",
            lambda: decode_one(cls, normalise(self.root("site").get(key)), self.refusals,
                               where=f"site.{key}"),
            root="site",
        )  # fmt: skip

    def _site_map(self, name: str, cls: type[_E]) -> Mapping[str, _E]:
        """A site map's decoded view: kept from its changed keys where the map is tracked
        (:class:`SiteNodeDoc`: the site's members read them every cycle), else decoded whole
        once per change of the document (central's replicas, which never read them: tracking
        them there cost every thaw of every replica)."""
        if name in self.incremental_roots:
            return self._map_view(name, cls)
        return self.view(name, lambda: MappingProxyType(self._decode_whole(name, cls)))

    def set_site_entry(self, key: str, entry: SiteVote | SiteLease | SiteSeen | None) -> None:
        """``site[key]`` (``vote``, ``lease``, ``seen``) set, or deleted for None."""
        if key not in ("vote", "lease", "seen"):
            raise ValueError(f"unknown site key {key!r}")
        site = self.root("site")
        if entry is None:
            if key in site:
                del site[key]
        else:
            _set_changed(site, key, entry.to_entry())

    def site_vote(self) -> SiteVote | None:
        return self._site_entry("vote", SiteVote)

    def site_lease(self) -> SiteLease | None:
        return self._site_entry("lease", SiteLease)

    def site_seen(self) -> SiteSeen | None:
        return self._site_entry("seen", SiteSeen)

    def put_site_order(self, task_id: str, order: SiteOrderEntry) -> None:
        self._put("site_orders", task_id, order, if_changed=True)

    def site_orders(self) -> Mapping[str, SiteOrderEntry]:
        """task id -> this node's order as its site's coordinator."""
        return self._site_map("site_orders", SiteOrderEntry)

    def put_site_stop(self, task_id: str, node_id: str, stop: SiteStop) -> None:
        self._put("site_stops", f"{task_id}@{node_id}", stop, if_changed=True)

    def site_stops(self) -> Mapping[str, SiteStop]:
        """``task@node`` -> this node's stop order as its site's coordinator."""
        return self._site_map("site_stops", SiteStop)

    def put_site_spec(self, task_id: str, spec: SiteSpec) -> None:
        self._put("site_specs", task_id, spec, if_changed=True)

    def site_specs(self) -> Mapping[str, SiteSpec]:
        """task id -> the spec of a task of ours a site peer may need."""
        return self._site_map("site_specs", SiteSpec)

    def drop_site_keys(self, root: str, keys: Iterable[str]) -> None:
        """Remove ``keys`` from one of the site maps (``site_orders``, ``site_stops``,
        ``site_specs``)."""
        if root not in ("site_orders", "site_stops", "site_specs"):
            raise ValueError(f"not a site map: {root!r}")
        m = self.root(root)
        for key in keys:
            if key in m:
                del m[key]


class SiteNodeDoc(NodeDoc):
    """A node document at a member of a site (its own, and its replicas of its peers'): the
    site maps are tracked by key too, so the coordinator's and the members' reads each cycle
    (:mod:`edgesched.edge.site`) decode only what changed."""

    incremental_roots = ("tasks", "site_orders", "site_stops", "site_specs")
    entry_kinds = MappingProxyType(
        {
            "tasks": TaskReport,
            "site_orders": SiteOrderEntry,
            "site_stops": SiteStop,
            "site_specs": SiteSpec,
        }
    )


#: A node's desired-state document is ``desired-<node id>``: its shard of the fleet's
#: assignments, stop orders and power order (see :mod:`edgesched.central.desired`).
DESIRED_PREFIX = "desired-"


def desired_doc_name(node_id: str) -> str:
    """The name of node ``node_id``'s desired-state document."""
    if not node_id:
        raise ValueError("node id must not be empty")
    return f"{DESIRED_PREFIX}{node_id}"


class PolicyDoc(SyncedDoc):
    """The fleet policy document written by central (several central replicas may co-write
    it; nodes only read it): ``policy`` (mode, tidal profile), ``models`` (kind → an ONNX
    model file to swap in, see :mod:`edgesched.policies.models`), ``power`` (node id → park
    or wake order, see :mod:`edgesched.central.power`), ``assignments`` (task id →
    central's placement: the spec, the node, the placement epoch) and ``stops`` (``<task>@<node>``
    → an order to stop that node's copy of a task placed twice, from the reconcile rule).
    Entries are typed (:mod:`edgesched.sync.schema`); one that does not decode is refused."""

    incremental_roots = ("assignments", "stops", "power", "services", "loads")
    entry_kinds = MappingProxyType(
        {
            "assignments": AssignmentEntry,
            "stops": StopOrder,
            "power": PowerOrder,
            "services": ServiceEntry,
            "loads": LoadReport,
        }
    )

    def _map(self, root: str) -> object:
        return normalise(self.root(root).to_py())

    def assign(self, task_id: str, entry: AssignmentEntry) -> None:
        if not task_id:
            raise ValueError("task_id must not be empty")
        self._put("assignments", task_id, entry)

    def assignment(self, task_id: str) -> AssignmentEntry | None:
        """One assignment, decoded alone."""
        return self._one(AssignmentEntry, self.root("assignments"), task_id, "assignments")

    def assignments(self) -> Mapping[str, AssignmentEntry]:
        """task id -> central's assignment, decoded once per change of the document."""
        return self._map_view("assignments", AssignmentEntry)

    def drop_assignment(self, task_id: str) -> None:
        assignments = self.root("assignments")
        if task_id in assignments:
            del assignments[task_id]

    def order_stop(self, task_id: str, node_id: str, order: StopOrder) -> None:
        """Tell ``node_id`` to stop its copy of ``task_id`` (it lost the reconcile)."""
        if not task_id or not node_id or "@" in node_id:
            raise ValueError(f"bad stop order for {task_id!r} on {node_id!r}")
        self._put("stops", f"{task_id}@{node_id}", order)

    def stops(self) -> Mapping[str, StopOrder]:
        """``task@node`` -> the stop order."""
        return self._map_view("stops", StopOrder)

    def stop(self, key: str) -> StopOrder | None:
        """One stop order (``task@node``), decoded alone."""
        return self._one(StopOrder, self.root("stops"), key, "stops")

    def drop_stop(self, task_id: str, node_id: str) -> None:
        stops = self.root("stops")
        key = f"{task_id}@{node_id}"
        if key in stops:
            del stops[key]

    def put_service(self, name: str, entry: ServiceEntry) -> None:
        """Create or change service ``name`` (:mod:`edgesched.central.services`)."""
        if not name:
            raise ValueError("service name must not be empty")
        self._put("services", name, entry)

    def services(self) -> Mapping[str, ServiceEntry]:
        """name -> the service (valid entries only)."""
        return self._map_view("services", ServiceEntry)

    def drop_service(self, name: str) -> None:
        services = self.root("services")
        if name in services:
            del services[name]

    def set_load(self, name: str, report: LoadReport) -> None:
        """The load service ``name`` serves, as reported (its autoscaler's signal)."""
        self._put("loads", name, report)

    def loads(self) -> Mapping[str, LoadReport]:
        return self._map_view("loads", LoadReport)

    def drop_load(self, name: str) -> None:
        loads = self.root("loads")
        if name in loads:
            del loads[name]

    def set_mode(self, mode: PolicyMode) -> None:
        self.root("policy")["mode"] = PolicyMode(mode).value

    def announce_packed(self) -> None:
        """Say, in the fleet-wide ``policy``, that central reads packed entries in node
        documents (:attr:`SyncedDoc.packed`): nodes of this version then write theirs so.
        An older central never says it, so its nodes keep writing nested values it reads."""
        policy = self.root("policy")
        if policy.get("packed_entries") is not True:
            policy["packed_entries"] = True

    def packed_entries(self) -> bool:
        """Whether central said it reads packed entries (:meth:`announce_packed`)."""
        return self.view(
            "packed_entries", lambda: self.root("policy").get("packed_entries") is True
        )

    def mode(self) -> PolicyMode | None:
        def build() -> PolicyMode | None:
            raw = normalise(self.root("policy").get("mode"))
            if raw is None:
                return None
            try:
                return PolicyMode(raw)
            except ValueError:
                self.refusals.refuse("policy.mode", SchemaError("mode", "", f"unknown {raw!r}"))
                return None

        return self.view("mode", build)

    def set_tidal(self, tidal: TidalEntry) -> None:
        self.root("policy")["tidal"] = tidal.to_entry()

    def tidal(self) -> TidalEntry | None:
        return self.view(
            "tidal",
            lambda: decode_one(
                TidalEntry,
                normalise(self.root("policy").get("tidal")),
                self.refusals,
                where="tidal",
            ),
        )

    def set_power(self, node_id: str, order: PowerOrder) -> None:
        """Central's power order to ``node_id``."""
        if not node_id:
            raise ValueError("node id must not be empty")
        self._put("power", node_id, order)

    def power(self) -> Mapping[str, PowerOrder]:
        """node id -> central's standing power order."""
        return self._map_view("power", PowerOrder)

    def power_order(self, node_id: str) -> PowerOrder | None:
        """One node's standing power order, decoded alone."""
        return self._one(PowerOrder, self.root("power"), node_id, "power")

    def set_model(self, kind: str, entry: ModelEntry) -> None:
        """Publish a model file for every node to swap in (each verifies it first)."""
        if not kind:
            raise ValueError("model kind must not be empty")
        self.root("models")[kind] = entry.to_entry()

    def models(self) -> Mapping[str, ModelEntry]:
        """kind -> the model entry central published."""
        return self.view(
            "models",
            lambda: MappingProxyType(
                decode_map(
                    ModelEntry,
                    self._map("models"),
                    self.refusals,
                    where="models",
                    memo=self.memo("models"),
                )
            ),
        )


#: When a sole central's fleet document rotates: once its tombstones' encoded bytes reach 5% of
#: the live content's. A tombstone is ~26 B encoded but ~300 B of pycrdt's memory, a live
#: assignment ~220 B and ~630 B, so the default ratio (2) would let the tombstones' memory grow
#: to ~4 times the live document's (1.8 GB at 10,000 nodes) before a rotation; at 1.05 it
#: stays under ~20% of it, for a rotation every ~1.7 days at 2 tasks a second (~6 s of
#: central's CPU in slices at 10,000 nodes, ``bench/bench_document_garbage.py``).
FLEET_ROTATION = RotationPolicy(ratio=1.05)


class SolePolicyDoc(PolicyDoc):
    """A policy-shaped document central writes when it runs alone (no fellow replicas): its
    one writer, so the document has epochs and rotates like a node's own
    (:class:`RotationPolicy`), dropping the tombstones of the entries it removed.
    :attr:`sole_writer` is that central's peer id, set by its owner before the document's
    peer is made. Its readers adopt a newer epoch from a central while they hold nothing of
    their own (:meth:`SyncedDoc.reset_to_epoch`): a node its ``desired-<node>`` document, a
    central replica added later the fleet document."""

    single_writer = True
    sole_writer: str | None = None

    @property
    def writer(self) -> str | None:
        return self.sole_writer


class SoleFleetDoc(SolePolicyDoc):
    """Central's ``fleet`` document when central runs alone. Every task central places and
    later forgets leaves a tombstone in it otherwise, ~300 B of pycrdt's memory each, for as
    long as central runs (``bench/bench_document_garbage.py``); it rotates at
    :data:`FLEET_ROTATION`. Only central replicas replicate the fleet document."""

    def __init__(self, name: str, client_id: int, **kwargs: Any) -> None:
        kwargs.setdefault("rotation_policy", FLEET_ROTATION)
        super().__init__(name, client_id, **kwargs)


class SoleDesiredDoc(SolePolicyDoc):
    """A node's ``desired-<node>`` document when central runs alone (see
    :mod:`edgesched.central.desired`). Each task of the node that central forgets leaves a
    tombstone otherwise: ~29 B encoded (its node's snapshot and SQLite grow by that, and its
    node's live replica by ~300 B of memory), ~3 B compressed in central's frozen copy. It
    rotates at the default :class:`RotationPolicy`: never below 64 KiB encoded, then once
    the garbage passes the live content (a rotation sends the node the live state, ~15 KiB
    for 70 assignments, and costs central ~1.2 ms)."""


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
