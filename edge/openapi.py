"""OpenAPI 3.1 document of the edge node's local API, served at ``GET /v1/openapi.json``.

Every route of :func:`edgesched.edge.api.build_app`, built from the shared blocks in
:mod:`edgesched.rest.openapi`; ``tests/test_openapi.py`` checks it against the routes the app
registers and fuzzes a live node against it.
"""

from __future__ import annotations

import copy

from aiohttp import web

from edgesched.core.model import Arch, DecisionKind, ServerClass
from edgesched.core.policy import PolicyMode
from edgesched.core.task import TaskState
from edgesched.rest import openapi as oa
from edgesched.rest.openapi import Schema
from edgesched.version import __version__

# --- edge ---------------------------------------------------------------------------------------

_EDGE_PROBLEMS = [400, 401, 404, 409, 413, 422, 503, 507]
_STATE_LIST = "|".join(s.value for s in TaskState)


def _edge_schemas() -> dict[str, Schema]:
    hardware = oa.obj(
        {
            "arch": {"type": "string", "enum": [a.value for a in Arch]},
            "cpu_model": oa.STR,
            "cores": oa.INT,
            "mem_gib": oa.NUMBER,
            "server_class": {"type": "string", "enum": [c.value for c in ServerClass]},
            "class_reason": oa.STR,
            "perf": oa.nullable(oa.NUMBER),
            "iops_k": oa.nullable(oa.NUMBER),
        }
    )
    return {
        "Problem": oa.problem_schema(),
        "TaskSpec": oa.task_spec_schema(),
        "Health": oa.obj({"ok": {"const": True}}),
        "EdgeStatus": oa.obj(
            {
                "node": oa.STR,
                "site": oa.STR,
                "mode": {"type": "string", "enum": ["connected", "autonomous"]},
                "broker_connected": oa.BOOL,
                "broker": oa.broker_link_schema(),
                "central_heard_s_ago": oa.nullable(oa.NUMBER),
                "lease_s": oa.NUMBER,
                "policy": {"type": "string", "enum": [m.value for m in PolicyMode]},
                "tidal_profile": oa.STR,
                "uptime_s": oa.NUMBER,
                "document": {
                    "anyOf": [
                        oa.obj(
                            {
                                "name": oa.STR,
                                "client_id": oa.INT,
                                "content_hash": oa.STR,
                                "tasks": oa.INT,
                                "packed": oa.BOOL,
                                "refused_entries": oa.map_of(
                                    oa.INT, "entry kind -> entries the schema refused"
                                ),
                            }
                        ),
                        {"type": "null"},
                    ]
                },
                "policy_document": oa.nullable(
                    oa.obj(
                        {
                            "content_hash": oa.STR,
                            "refused_entries": oa.map_of(
                                oa.INT, "entry kind -> entries the schema refused"
                            ),
                        }
                    )
                ),
                "desired_document": oa.nullable(
                    oa.obj(
                        {
                            "name": oa.STR,
                            "content_hash": oa.STR,
                            "assignments": oa.INT,
                            "refused_entries": oa.map_of(
                                oa.INT, "entry kind -> entries the schema refused"
                            ),
                        }
                    )
                ),
                "refused": oa.map_of(
                    oa.map_of(oa.INT, "reason -> count"),
                    "channel (node: our document, policy, desired) -> messages refused since "
                    "start, by reason (frame, payload, update, sender, authorship, epoch, "
                    "schema)",
                ),
                "site_autonomy": oa.nullable(
                    oa.obj(
                        {
                            "members": {"type": "array", "items": oa.STR},
                            "live": {"type": "array", "items": oa.STR},
                            "vote": oa.nullable(oa.obj({"epoch": oa.INT, "holder": oa.STR})),
                            "coordinating": oa.nullable(
                                oa.obj(
                                    {
                                        "epoch": oa.INT,
                                        "since": oa.NUMBER,
                                        "members": {"type": "array", "items": oa.STR},
                                    }
                                )
                            ),
                            "following": oa.nullable(oa.obj({"epoch": oa.INT, "holder": oa.STR})),
                            "orders": oa.INT,
                            "offered": {"type": "array", "items": oa.STR},
                        }
                    )
                ),
                "models": oa.map_of(oa.model_info(), "kind -> the model in use, or why none"),
                "power": oa.obj(
                    {
                        "state": {"type": "string", "enum": ["active", "parked"]},
                        "since": oa.NUMBER,
                        "idle_since": oa.nullable(oa.NUMBER),
                        "last_error": oa.STR,
                    }
                ),
                "forecast": oa.obj(
                    {
                        "model": oa.STR,
                        "peak_cpu_next_15min": oa.nullable(oa.NUMBER),
                        "history_bins": oa.INT,
                        "classes": {"type": "array", "items": oa.STR},
                    }
                ),
                "hardware": {
                    "anyOf": [hardware, {"type": "null"}],
                    "description": "null until the node is profiled",
                },
            }
        ),
        "TaskRecord": oa.obj(
            {
                "id": oa.STR,
                "state": {"type": "string", "enum": [s.value for s in TaskState]},
                "spec": oa.ref("TaskSpec"),
                "submitted_at": oa.NUMBER,
                "updated_at": oa.NUMBER,
                "decided_by": {
                    "type": "string",
                    "description": "central, edge-autonomous, "
                    "edge-connected, or empty before a decision",
                },
                "node": oa.nullable(oa.STR),
                "pid": oa.nullable(oa.INT),
                "cores": {"type": "array", "items": oa.INT},
                "restarts": oa.INT,
                "exit_code": oa.nullable(oa.INT),
                "reason": oa.STR,
            }
        ),
        "Decision": {
            **oa.obj(
                {
                    "kind": {"type": "string", "enum": [k.value for k in DecisionKind]},
                    "node": oa.STR,
                    "reason": oa.STR,
                    "at": oa.NUMBER,
                    "task": oa.STR,
                    "from": oa.STR,
                    "image": oa.STR,
                    "cores": {"type": "array", "items": oa.INT},
                    "scores": oa.map_of(oa.NUMBER),
                    "seq": oa.INT,
                    "source": oa.STR,
                },
                required=["kind", "node", "reason", "at", "seq", "source"],
                closed=False,
            ),
            "description": "A scheduling decision with its reason and scores",
        },
    }


def _edge_paths() -> dict[str, Schema]:
    tag = "edge"
    task_id = oa.path_id("task id")
    return {
        **oa.public_paths(tag),
        "/v1/status": {
            "get": oa.op(
                "status",
                "Node, mode, link, forecast, hardware",
                tag,
                {"200": oa.content(oa.ref("EdgeStatus"), "the node's status"), **oa.problems(401)},
            )
        },
        "/v1/tasks": {
            "get": oa.op(
                "listTasks",
                "Task records",
                tag,
                {
                    "200": oa.content({"type": "array", "items": oa.ref("TaskRecord")}, "records"),
                    **oa.problems(400, 401, 503),
                },
                params=[
                    oa.query(
                        "state",
                        {"type": "string", "pattern": f"^({_STATE_LIST})(,({_STATE_LIST}))*$"},
                        "only these states (comma-separated)",
                    )
                ],
            ),
            "post": oa.op(
                "submitTask",
                "Submit a task; 201 once committed to SQLite",
                tag,
                {
                    "201": oa.content(oa.ref("TaskRecord"), "accepted"),
                    **oa.problems(400, 401, 409, 413, 422, 503, 507),
                },
                description="Bodies up to 64 KiB. 409: the id is taken; 422: the node's "
                "architecture, class or whole capacity cannot take it; 503: the engine is "
                "starting; 507: the store is full.",
                body=oa.request_body(oa.ref("TaskSpec"), "the task"),
            ),
        },
        "/v1/tasks/{id}": {
            "get": oa.op(
                "getTask",
                "One task record",
                tag,
                {
                    "200": oa.content(oa.ref("TaskRecord"), "the record"),
                    **oa.problems(401, 404, 503),
                },
                params=[task_id],
            ),
            "delete": oa.op(
                "cancelTask",
                "Cancel a task (idempotent)",
                tag,
                {
                    "200": oa.content(oa.ref("TaskRecord"), "the record"),
                    **oa.problems(401, 404, 503),
                },
                params=[task_id],
            ),
        },
        "/v1/tasks/{id}/logs": {
            "get": oa.op(
                "getTaskLogs",
                "A task's output (stdout and stderr), its last lines; then more with follow",
                tag,
                {
                    "200": oa.content({"type": "string"}, "the lines", media="text/plain"),
                    **oa.problems(400, 401, 404, 503),
                },
                params=[
                    task_id,
                    *oa.logs_query(["0", "1", "true"]),
                ],
            ),
        },
        "/v1/decisions": {
            "get": oa.op(
                "listDecisions",
                "Recent decisions with their reasons, newest first",
                tag,
                {
                    "200": oa.content({"type": "array", "items": oa.ref("Decision")}, "decisions"),
                    **oa.problems(400, 401, 503),
                },
                params=[
                    oa.query("limit", oa.INT, "how many (clamped to 1..1000; default 100)"),
                    oa.query("task", oa.STR, "only this task's"),
                ],
            )
        },
        "/metrics": {
            "get": oa.op(
                "metrics",
                "Prometheus metrics",
                tag,
                {"200": oa.TEXT, **oa.problems(401)},
                description="The api-token, or the scrape-only metrics-token (<state_dir>/"
                "metrics-token), which every other route refuses (403). Series and units: "
                "docs/metrics.md.",
            )
        },
    }


def edge_document() -> Schema:
    """The OpenAPI document of an edge node's local API (a fresh dict)."""
    return {
        "openapi": oa.OPENAPI_VERSION,
        "info": {
            "title": "edgesched edge node",
            "version": __version__,
            "description": "The edge node's local API, for people and tools on the gateway "
            "(loopback by default). Every route but /v1/health and this document needs the "
            "bearer token from <state_dir>/api-token. Errors are RFC 9457 problem details "
            "naming the field; a bad body is a 4xx, never a 500.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "tags": [{"name": "edge"}],
        "paths": _edge_paths(),
        "components": {
            "schemas": _edge_schemas(),
            "responses": oa.problem_responses(_EDGE_PROBLEMS),
            "securitySchemes": copy.deepcopy(oa.SECURITY_SCHEMES),
        },
    }


_CACHE: dict[str, Schema] = {}


async def serve_edge(request: web.Request) -> web.Response:
    """``GET /v1/openapi.json`` on an edge node."""
    doc = _CACHE.get("edge") or _CACHE.setdefault("edge", edge_document())
    return web.json_response(doc)
