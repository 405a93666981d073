"""The MQTT topics of edgesched, versioned under ``edgesched/v1``, in one place.

Documents travel on ``doc/<doc>/sync/<sender>``, and answers meant for one asker on
``doc/<doc>/reply/<asker>/<sender>`` (see :mod:`edgesched.sync.wire`); liveness on
the retained ``node/<id>/status``; central's heartbeat on ``central/heartbeat``; telemetry,
which is not CRDT state, on ``node/<id>/telemetry``; a site broker's bridge state on
``site/<site>/bridge``.
"""

from __future__ import annotations

import json
from typing import Any

from edgesched.sync.wire import TOPIC_ROOT

HEARTBEAT_TOPIC = f"{TOPIC_ROOT}/central/heartbeat"
STATUS_FILTER = f"{TOPIC_ROOT}/node/+/status"
DOC_SYNC_FILTER = f"{TOPIC_ROOT}/doc/+/sync/+"
#: A site broker's Mosquitto bridge notification (``notifications true``): a retained ``1``
#: while the bridge to central's broker is up, its last will ``0`` when it drops.
SITE_BRIDGE_FILTER = f"{TOPIC_ROOT}/site/+/bridge"


def site_bridge_topic(site: str) -> str:
    return f"{TOPIC_ROOT}/site/{site}/bridge"


def site_of_bridge_topic(topic: str) -> str | None:
    """``edgesched/v1/site/<site>/bridge`` → ``<site>``; anything else → None."""
    parts = topic.split("/")
    if len(parts) == 5 and "/".join(parts[:3]) == f"{TOPIC_ROOT}/site" and parts[4] == "bridge":
        return parts[3] or None
    return None


def status_topic(node_id: str) -> str:
    return f"{TOPIC_ROOT}/node/{node_id}/status"


def node_of_topic(topic: str, leaf: str) -> str | None:
    """``edgesched/v1/node/<id>/<leaf>`` → ``<id>``; anything else → None."""
    parts = topic.split("/")
    if len(parts) == 5 and "/".join(parts[:3]) == f"{TOPIC_ROOT}/node" and parts[4] == leaf:
        return parts[3] or None
    return None


def node_of_status_topic(topic: str) -> str | None:
    """``edgesched/v1/node/<id>/status`` → ``<id>``; anything else → None."""
    return node_of_topic(topic, "status")


def json_object(payload: bytes, what: str, max_bytes: int) -> dict[str, Any]:
    """A small JSON object from an MQTT payload; ValueError naming ``what`` is wrong."""
    if len(payload) > max_bytes:
        raise ValueError(f"{what} of {len(payload)} bytes exceeds {max_bytes}")
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    except RecursionError:  # ~1,000 levels: a 4 KiB payload nests 2,000 deep
        raise ValueError(f"{what} is JSON nested too deep") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a JSON object")
    return data


#: Largest heartbeat payload accepted (bytes).
MAX_HEARTBEAT_BYTES = 4096


def parse_heartbeat(payload: bytes) -> dict[str, object]:
    """A heartbeat is a small JSON object naming the central that sent it; else ValueError."""
    data = json_object(payload, "heartbeat", MAX_HEARTBEAT_BYTES)
    if not isinstance(data.get("central"), str):
        raise ValueError("heartbeat must be a JSON object with a string 'central'")
    return data
