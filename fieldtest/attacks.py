"""What a holder of one gateway's credentials can send at the document sync (issue 13).

An attacker who opened a gateway holds its MQTT credentials, so the broker's ACL lets it
publish on that node's own topics and nothing else: its node document's sender topic, its
sender topic of the policy and of its desired-state document. What it can put there is any
bytes; this module makes the ones that are hardest to refuse: well-formed frames carrying
well-formed Yjs updates, authored under somebody else's client id or deleting somebody else's
items.

- :func:`policy_continuation`: central's policy, continued under central's client id (the
  next clocks after central's own), switching the fleet's mode. The state vector of such an
  update names nobody, so a writer check on it passes (it did, before issue 13).
- :func:`policy_new_root`: a new root map under central's client id.
- :func:`desired_pure_delete`: a delete set only, removing central's assignment from the
  node's own desired-state document.
- :func:`desired_forged_assignment`: an assignment of the attacker's command, under
  central's client id, in the node's own desired-state document.
- :func:`node_doc_other_author`: a task entry in the attacker's own node document authored
  under another node's client id.
- :func:`epoch_jump`: the attacker's own node document at another epoch, holding a decoy
  only (a node may do what it likes with its own document; the fleet must recover when the
  real node comes back). Epochs compare as serial numbers (:mod:`edgesched.sync.epochs`), so
  a replica takes at most 2**31 - 1 ahead in one step: two jumps reach the last epoch,
  2**32 - 1, which before issue 13 left central's copy empty for good.

Each is a :class:`Forgery`: where it goes, the frames, and the channel that must refuse it.
:class:`Attacker` fetches the documents it needs the way a node does (a marked y-sync step 1,
answered on its reply topic) and publishes the frames; :func:`run_suite` sends them one by one
and reads, from central's status, whether each was refused. Used by ``tests/test_attacks.py``
against a real fleet over Mosquitto with the generated ACL, and by ``edgesched fieldtest
attack`` against a fleet of yours (with the credentials of a gateway you may sacrifice).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiomqtt
from pycrdt import Doc, Map, YSyncMessageType

from edgesched.sync import wire
from edgesched.sync.doc import client_id_for, desired_doc_name

#: The policy document's name (central/engine.py ``POLICY_DOC``).
POLICY = "policy"


@dataclass(frozen=True)
class Forgery:
    """Frames an attacker publishes on ``topic`` (one it may write), and what must refuse
    them: ``channel`` (``policy``, ``desired`` or ``node``) at the receiving central."""

    name: str
    doc: str
    topic: str
    frames: tuple[bytes, ...]
    channel: str


def _frames(
    doc: str, node_id: str, update: bytes, state: bytes, epoch: int = 0
) -> tuple[bytes, ...]:
    """``update`` framed honestly as ``node_id``'s (its own client id in the header, so the
    sender check passes and only the authorship check can refuse it)."""
    payload = wire.update_payload(update, state)
    return tuple(wire.encode(wire.Kind.UPDATE, doc, client_id_for(node_id), payload, epoch=epoch))


def _forgery(
    name: str,
    doc_name: str,
    node_id: str,
    doc: Doc[Any],
    before: bytes | None,
    channel: str,
    epoch: int = 0,
) -> Forgery:
    """What ``doc`` changed since ``before`` (None: all of it), as ``node_id`` publishes it
    on its own topic of ``doc_name`` (at ``epoch``)."""
    update = doc.get_update() if before is None else doc.get_update(before)
    frames = _frames(doc_name, node_id, update, doc.get_state(), epoch=epoch)
    return Forgery(name, doc_name, wire.sync_topic(doc_name, node_id), frames, channel)


def _continued(state: bytes, client_id: int) -> tuple[Doc[Any], bytes]:
    """A pycrdt document holding ``state`` whose own client id is ``client_id``: its next
    local change continues that client's clocks. Returns it and its state vector before."""
    doc: Doc[Any] = Doc(client_id=client_id)
    doc.apply_update(state)
    return doc, doc.get_state()


def policy_continuation(state: bytes, central_id: str, node_id: str, mode: str) -> Forgery:
    """``mode`` written into the policy under ``central_id``'s client id, after its clocks."""
    doc, before = _continued(state, client_id_for(central_id))
    doc.get("policy", type=Map)["mode"] = mode
    return _forgery("policy-continuation", POLICY, node_id, doc, before, "policy")


def policy_new_root(state: bytes, central_id: str, node_id: str) -> Forgery:
    """A root no schema reads, added under ``central_id``'s client id."""
    doc, before = _continued(state, client_id_for(central_id))
    doc.get("hidden", type=Map)["payload"] = "x" * 64
    return _forgery("policy-new-root", POLICY, node_id, doc, before, "policy")


def desired_pure_delete(state: bytes, node_id: str, task_id: str) -> Forgery:
    """Central's assignment of ``task_id`` deleted from ``node_id``'s desired document: an
    update of a delete set only (its state vector is empty)."""
    name = desired_doc_name(node_id)
    doc, before = _continued(state, client_id_for(node_id))
    assignments = doc.get("assignments", type=Map)
    if task_id not in assignments:
        raise ValueError(f"{name} holds no assignment of {task_id!r}")
    del assignments[task_id]
    return _forgery("desired-pure-delete", name, node_id, doc, before, "desired")


def desired_forged_assignment(
    state: bytes, central_id: str, node_id: str, task_id: str, command: Sequence[str]
) -> Forgery:
    """An assignment of ``command`` to ``node_id``, under ``central_id``'s client id."""
    name = desired_doc_name(node_id)
    doc, before = _continued(state, client_id_for(central_id))
    entry = {
        "node": node_id,
        "epoch": 1,
        "spec": {"id": task_id, "command": list(command), "cpu": 0.05, "mem_gib": 0.05},
    }
    doc.get("assignments", type=Map)[task_id] = json.dumps(entry)
    return _forgery("desired-forged-assignment", name, node_id, doc, before, "desired")


def node_doc_other_author(node_id: str, other_id: str, task_id: str) -> Forgery:
    """A task entry in ``node_id``'s own document, authored under ``other_id``'s client id."""
    name = f"node-{node_id}"
    doc: Doc[Any] = Doc(client_id=client_id_for(other_id))
    doc.get("tasks", type=Map)[task_id] = json.dumps({"state": "running", "node": other_id})
    return _forgery("node-doc-other-author", name, node_id, doc, None, "node")


def epoch_jump(node_id: str, epoch: int = wire.MAX_EPOCH) -> Forgery:
    """``node_id``'s own document announced at ``epoch``, holding a decoy entry only."""
    name = f"node-{node_id}"
    doc: Doc[Any] = Doc(client_id=client_id_for(node_id))
    doc.get("tasks", type=Map)["decoy"] = json.dumps({"state": "running"})
    return _forgery("epoch-jump", name, node_id, doc, None, "node", epoch=epoch)


def desired_epoch_jump(node_id: str, epoch: int) -> Forgery:
    """``node_id``'s desired-state document claimed at ``epoch`` (newer than central's): the
    writer takes a newer epoch held elsewhere for one its store lost and rotates past it,
    at most once a minute (``ROTATE_PAST_EVERY_S``). The decoy entry is never merged."""
    name = desired_doc_name(node_id)
    doc: Doc[Any] = Doc(client_id=client_id_for(node_id))
    doc.get("assignments", type=Map)["decoy"] = json.dumps({"node": node_id})
    return _forgery("desired-epoch-jump", name, node_id, doc, None, "desired", epoch=epoch)


class Attacker:
    """An MQTT client logged in with ``node_id``'s credentials (an ``aiomqtt.Client`` the
    caller opened), fetching documents as that node may and publishing forgeries."""

    def __init__(self, client: aiomqtt.Client, node_id: str, central_id: str) -> None:
        self.client = client
        self.node_id = node_id
        self.central_id = central_id

    async def fetch(self, doc: str, timeout: float = 10.0) -> bytes:
        """``doc``'s whole state as central holds it: a marked step 1 with an empty state
        vector on our sender topic, central's step 2 on our reply topic."""
        reply = wire.reply_topic(doc, self.node_id, self.central_id)
        await self.client.subscribe(reply, qos=1)
        payload = wire.step1_payload(b"\x00", replies=True)
        for frame in wire.encode(wire.Kind.SYNC, doc, client_id_for(self.node_id), payload):
            await self.client.publish(wire.sync_topic(doc, self.node_id), frame, qos=1)
        reassembler = wire.Reassembler()
        async with asyncio.timeout(timeout):
            async for message in self.client.messages:
                if str(message.topic) != reply or not isinstance(message.payload, bytes):
                    continue
                whole = reassembler.feed(message.payload)
                if whole is None:
                    continue
                sync = wire.decode_sync(whole.kind, whole.payload)
                if sync.step == YSyncMessageType.SYNC_STEP2:
                    await self.client.unsubscribe(reply)
                    return sync.data
        raise TimeoutError(f"no answer from {self.central_id} on {reply}")  # pragma: no cover

    async def send(self, forgery: Forgery) -> None:
        for frame in forgery.frames:
            await self.client.publish(forgery.topic, frame, qos=1)


@dataclass(frozen=True)
class Outcome:
    """One forgery's fate at central: ``refused`` if its channel's ``authorship`` count rose
    (``counts``: every reason of that channel that rose, and by how much)."""

    name: str
    channel: str
    refused: bool
    counts: dict[str, int]


async def run_suite(
    attacker: Attacker,
    refused: Callable[[], Awaitable[dict[str, dict[str, int]]]],
    *,
    other_node: str,
    timeout_s: float = 10.0,
) -> list[Outcome]:
    """Every forgery of this module that needs no epoch change, sent as ``attacker``'s node,
    one at a time; after each, ``refused()`` (central's ``GET /v1/status`` ``refused``) is
    polled until the forgery's channel counts it for its authorship, or ``timeout_s``.
    ``other_node``: a node of the fleet whose client id the forgery in our own document
    borrows. The pure delete is sent only if our desired document holds an assignment."""
    node, central = attacker.node_id, attacker.central_id
    policy = await attacker.fetch(POLICY)
    desired = await attacker.fetch(desired_doc_name(node))
    probe: Doc[Any] = Doc()
    probe.apply_update(desired)
    assigned = sorted(probe.get("assignments", type=Map).keys())
    forgeries = [
        policy_continuation(policy, central, node, "energy"),
        policy_new_root(policy, central, node),
        desired_forged_assignment(desired, central, node, "forged-task", ["true"]),
        node_doc_other_author(node, other_node, "forged-task"),
    ]
    if assigned:
        forgeries.append(desired_pure_delete(desired, node, assigned[0]))
    outcomes = []
    for forgery in forgeries:
        before = (await refused()).get(forgery.channel, {})
        await attacker.send(forgery)
        rose: dict[str, int] = {}
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            after = (await refused()).get(forgery.channel, {})
            rose = {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}
            if "authorship" in rose:
                break
            await asyncio.sleep(0.1)
        outcomes.append(Outcome(forgery.name, forgery.channel, "authorship" in rose, rose))
    return outcomes
