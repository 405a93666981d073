"""OpenAPI 3.1 documents of central's REST API and of the edge node's local API.

Built as plain dicts from the same enums the handlers validate with (restart policies,
architectures, server classes, reconcile rules, policy modes, tidal profiles, task states), and
served as JSON at ``GET /v1/openapi.json`` by both tiers (public: it holds no data).

    central_document()   every route of ``edgesched.central.api.build_app``: the fleet API, the
                         dashboard and its event stream, ``/metrics``, and the kube-scheduler
                         extender under ``/v1/k8s`` (marked ``x-edgesched-extender``: mounted
                         only when ``k8s_extender`` is on)
    edge_document()      every route of ``edgesched.edge.api.build_app``

``tests/test_openapi.py`` keeps them honest: the documents validate as OpenAPI, their
method+path sets equal the routes the apps register, and schemathesis fuzzes a live central and
a live edge node against them (no 5xx; status codes, content types and bodies as documented).

Request schemas are the validators' rules, so a request the document allows is one the server
accepts, up to what JSON Schema cannot say (a pinned node that does not exist, a demand larger
than the node, a task id already taken: the 4xx listed on each operation). Response schemas are
what the handlers build; ``null`` where they can return it.
"""

from __future__ import annotations

import copy
from typing import Any

from aiohttp import web

from edgesched.core.model import MAX_PRIORITY, Arch, DecisionKind, ServerClass
from edgesched.core.policy import PolicyMode
from edgesched.edge.spec import (
    IMAGE_REF,
    MAX_IMAGE_REF,
    MAX_SPEC_INT,
    MAX_THREADS,
    RestartPolicy,
    TaskState,
)
from edgesched.sync.reconcile import ReconcilePolicy
from edgesched.version import __version__

OPENAPI_VERSION = "3.1.0"
#: Marks the kube-scheduler extender's operations (served only when ``k8s_extender`` is on).
EXTENDER_FLAG = "x-edgesched-extender"

Schema = dict[str, Any]

# --- small builders ---------------------------------------------------------------------------


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    """``schema`` or null (OpenAPI 3.1: a type list; other keywords do not apply to null)."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def _obj(
    properties: dict[str, Schema],
    *,
    required: list[str] | None = None,
    closed: bool = True,
    description: str | None = None,
) -> Schema:
    """An object; ``required`` defaults to every property (what the handlers always send)."""
    out: Schema = {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
    }
    if closed:
        out["additionalProperties"] = False
    if description:
        out["description"] = description
    return out


def _map(values: Schema, description: str | None = None) -> Schema:
    out: Schema = {"type": "object", "additionalProperties": values}
    if description:
        out["description"] = description
    return out


def _json(schema: Schema, description: str, media: str = "application/json") -> Schema:
    return {"description": description, "content": {media: {"schema": schema}}}


def _body(schema: Schema, description: str) -> Schema:
    return {"required": True, "description": description, **_json(schema, description)}


_PROBLEMS = {
    400: ("BadRequest", "Malformed: not JSON, a wrong type, an unknown field or a bad value"),
    401: ("Unauthorized", "No token, or not a valid one"),
    403: ("Forbidden", "The read-only token on a route that changes something"),
    404: ("NotFound", "No such resource"),
    409: ("Conflict", "A task with this id already exists"),
    413: ("PayloadTooLarge", "The body is larger than the route accepts"),
    422: ("Unprocessable", "Well-formed, but refers to something that does not exist or fit"),
    503: ("Unavailable", "The store cannot be read or written, or the server is starting"),
    507: ("InsufficientStorage", "The store is full: nothing new is accepted"),
}


def _problems(*codes: int) -> dict[str, Schema]:
    return {str(c): {"$ref": f"#/components/responses/{_PROBLEMS[c][0]}"} for c in codes}


def _problem_responses(codes: list[int]) -> dict[str, Schema]:
    return {
        _PROBLEMS[c][0]: _json(_ref("Problem"), _PROBLEMS[c][1], "application/problem+json")
        for c in codes
    }


def _op(
    op_id: str,
    summary: str,
    tag: str,
    responses: dict[str, Schema],
    *,
    description: str | None = None,
    public: bool = False,
    params: list[Schema] | None = None,
    body: Schema | None = None,
    security: list[dict[str, list[str]]] | None = None,
) -> Schema:
    out: Schema = {"operationId": op_id, "summary": summary, "tags": [tag]}
    if description:
        out["description"] = description
    if public:
        out["security"] = []
    elif security is not None:
        out["security"] = security
    if params:
        out["parameters"] = params
    if body is not None:
        out["requestBody"] = body
    out["responses"] = responses
    return out


def _public_paths(tag: str) -> dict[str, Schema]:
    """The two routes both tiers serve without a token: liveness and this document."""
    return {
        "/v1/health": {
            "get": _op(
                "health",
                "Liveness (no token)",
                tag,
                {"200": _json(_ref("Health"), "up")},
                public=True,
            )
        },
        "/v1/openapi.json": {
            "get": _op(
                "openapi",
                "This document (no token)",
                tag,
                {"200": _json({"type": "object"}, "the OpenAPI document")},
                public=True,
            )
        },
    }


def _path_id(what: str) -> Schema:
    return {
        "name": "id",
        "in": "path",
        "required": True,
        "description": what,
        "schema": {"type": "string", "minLength": 1},
    }


def _query(name: str, schema: Schema, description: str) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_NUMBER: Schema = {"type": "number"}
_INT: Schema = {"type": "integer"}
_STR: Schema = {"type": "string"}
_BOOL: Schema = {"type": "boolean"}
_TEXT: Schema = _json(_STR, "Prometheus text exposition format", "text/plain")

# --- shared schemas: the task spec, problems --------------------------------------------------


def _model_info() -> Schema:
    """One ONNX model an engine runs (``edgesched.policies.models.ModelInfo``)."""
    return _obj(
        {
            "source": {"type": "string", "enum": ["shipped", "config", "central", "none"]},
            "path": _STR,
            "sha256": _STR,
            "refused": {"type": "string", "description": "the last refusal, if any"},
            "refused_sha256": _STR,
        }
    )


#: ``TaskSpec`` ids: Python's ``str.isalnum`` letters and digits, '-', '_' and '.'. ``\\w`` is
#: exactly that plus '_' under Python's ``re`` (and ASCII-only under ECMA-262, a stricter rule a
#: client can follow safely).
TASK_ID_PATTERN = r"^[\w.-]{1,128}$"
RECONCILE_CHOICES = ["", *(p.value for p in ReconcilePolicy)]


def task_spec_schema() -> Schema:
    """What :meth:`edgesched.edge.spec.TaskSpec.from_json` accepts, field by field."""
    positive_int = _nullable({"type": "integer", "minimum": 1, "maximum": MAX_SPEC_INT})
    count = {"type": "integer", "minimum": 0, "maximum": MAX_SPEC_INT}
    return {
        "type": "object",
        "description": "A task to run: the scheduler's demand plus how to run its process. "
        "Unknown fields are refused (400 naming the field), and so are integers written as "
        "floats (1.0), integers beyond int64 and strings holding lone surrogates.",
        "properties": {
            "id": {
                "type": "string",
                "pattern": TASK_ID_PATTERN,
                "minLength": 1,
                "maxLength": 128,
                "description": "1-128 letters, digits, '-', '_' or '.'",
            },
            "command": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "minLength": 1},
                "description": "argv, run without a shell",
            },
            "workload": {"type": "string", "default": "default"},
            "priority": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_PRIORITY,
                "default": 50,
            },
            "cpu": {
                "type": "number",
                "exclusiveMinimum": 0,
                "default": 1.0,
                "description": "cores (finite, > 0)",
            },
            "mem_gib": {"type": "number", "minimum": 0, "default": 0.5},
            "accel": {**count, "default": 0},
            "threads": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_THREADS,
                "default": 0,
                "description": "threads for the affinity planner (0: its cores)",
            },
            "env": _map(_STR, "environment added to the process's"),
            "cwd": _nullable({"type": "string"}),
            "restart": {
                "type": "string",
                "enum": [p.value for p in RestartPolicy],
                "default": RestartPolicy.ON_FAILURE.value,
            },
            "max_restarts": {**count, "default": 5},
            "limits": _obj(
                {"memory_mb": positive_int, "nofile": positive_int, "cpu_seconds": positive_int},
                required=[],
                description="per-process limits: cgroup v2 where writable, rlimits otherwise",
            ),
            "archs": {
                "type": "array",
                "items": {"type": "string", "enum": [a.value for a in Arch]},
                "description": "architectures it can run on (empty: any)",
            },
            "images": _obj(
                {
                    a.value: {
                        "type": "string",
                        "pattern": f"^{IMAGE_REF}$",
                        "maxLength": MAX_IMAGE_REF,
                    }
                    for a in Arch
                },
                required=[],
                description="the image to run on each architecture (an OCI reference); a task "
                "with images is placed only where one fits the node's architecture",
            ),
            "server_classes": {
                "type": "array",
                "items": {"type": "string", "enum": [c.value for c in ServerClass]},
                "description": "server classes allowed (empty: any)",
            },
            "preemptible": {"type": "boolean", "default": True},
            "duration_s": _nullable({"type": "number", "minimum": 0}),
            "reconcile": {
                "type": "string",
                "enum": RECONCILE_CHOICES,
                "default": "",
                "description": "which copy survives if the task ends up placed "
                "twice across a partition; empty: central's default",
            },
        },
        "required": ["id", "command"],
        "additionalProperties": False,
    }


def task_submission_schema() -> Schema:
    """Central's ``POST /v1/tasks``: a TaskSpec plus an optional ``node`` to pin it to."""
    spec = task_spec_schema()
    spec["properties"]["node"] = {
        "type": ["string", "null"],
        "description": "pin the task to this node (422 if central does not know it)",
    }
    spec["description"] = "A TaskSpec, with an optional node to pin it to."
    return spec


def _problem_schema() -> Schema:
    return _obj(
        {
            "type": {"type": "string", "description": "always about:blank"},
            "title": _STR,
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": _STR,
            "field": {
                "type": "string",
                "description": "the field, parameter or JSON path at fault, when there is one",
            },
        },
        required=["type", "title", "status", "detail"],
        description="RFC 9457 problem details",
    )


_SECURITY_SCHEMES: Schema = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "Central: `api-token` (admin, every route) or `api-token-read` "
        "(read-only: GET routes; anything else answers 403), both created 0600 in "
        "`state_dir` at first start. Edge: `<state_dir>/api-token`.",
    },
}
_TOKEN_QUERY: Schema = {
    "type": "apiKey",
    "in": "query",
    "name": "token",
    "description": "Either central token as `?token=`, for a browser's EventSource, which "
    "cannot set headers (accepted on every guarded route; meant for /v1/stream).",
}

# --- central -----------------------------------------------------------------------------------

_CENTRAL_PROBLEMS = [400, 401, 403, 404, 409, 413, 422, 503]


def _central_schemas() -> dict[str, Schema]:
    from edgesched.config import builtin_profiles

    telemetry = _obj(
        {
            "at": {"type": "number", "description": "unix seconds"},
            "cpu_util": {"type": "number", "minimum": 0, "maximum": 1},
            "mem_util": {"type": "number", "minimum": 0, "maximum": 1},
            "power_w": _NUMBER,
            "tasks_running": _INT,
        }
    )
    summary = {
        "id": _STR,
        "status": {
            "type": "string",
            "enum": ["online", "offline", "unknown"],
            "description": "its retained status message (unknown: none heard)",
        },
        "state": {
            "type": "string",
            "enum": ["connected", "suspect", "partitioned", "dead", "unknown"],
        },
        "status_since": _nullable(_NUMBER),
        "registration": _nullable(
            {
                "type": "object",
                "description": "what the node registered (hardware, capacity) in its document",
            }
        ),
        "document": _obj({"epoch": _INT, "content_hash": _STR, "changed_at": _nullable(_NUMBER)}),
        "tasks": _map(_INT, "its tasks counted by state"),
        "telemetry": _nullable(_ref("TelemetrySample")),
        "sync": _obj({"last_update_s_ago": _nullable(_NUMBER), "fresh": _BOOL}),
    }
    detail = {**summary, "content": {"type": "object", "description": "the node's document"}}
    copy_ = _obj(
        {"state": _nullable(_STR), "epoch": _nullable(_INT), "updated_at": _nullable(_NUMBER)}
    )
    rejected = [
        "rejected_frames",
        "rejected_payloads",
        "rejected_updates",
        "rejected_senders",
        "unknown_documents",
        "status_messages",
        "telemetry",
    ]
    return {
        "Problem": _problem_schema(),
        "TaskSpec": task_spec_schema(),
        "TaskSubmission": task_submission_schema(),
        "Health": _obj({"ok": {"const": True}}),
        "Status": _obj(
            {
                "central": _STR,
                "uptime_s": _NUMBER,
                "broker_connected": _BOOL,
                "nodes": _INT,
                "online": _INT,
                "heartbeats_sent": _INT,
                "leader": {
                    "type": "string",
                    "description": "the central replica that places "
                    "tasks (the lowest id of those alive)",
                },
                "centrals_alive": {
                    "type": "array",
                    "items": _STR,
                    "description": "peer central replicas heard within their lease",
                },
                "policy_hash": _nullable(_STR),
                "updates_in": _INT,
                "rejected": _obj(
                    {k: _INT for k in rejected}, description="input refused, by reason"
                ),
            },
        ),
        "TelemetrySample": telemetry,
        "Telemetry": _obj(
            {"node": _STR, "samples": {"type": "array", "items": _ref("TelemetrySample")}}
        ),
        "NodeSummary": _obj(summary),
        "NodeDetail": _obj(detail),
        "NodeList": _obj({"nodes": {"type": "array", "items": _ref("NodeSummary")}}),
        "TaskView": _obj(
            {
                "id": _STR,
                "state": {
                    "type": "string",
                    "enum": ["pending", "active", "cancelled"],
                    "description": "pending: no node can take it yet",
                },
                "node": _nullable(_STR),
                "epoch": _nullable(_INT),
                "replacement": _nullable(_BOOL),
                "score": _nullable(_NUMBER),
                "reason": _nullable(_STR),
                "at": _nullable(_NUMBER),
                "spec": {"anyOf": [_ref("TaskSpec"), {"type": "null"}]},
                "copies": _map(copy_, "what each node reports of it, by node id"),
                "running_on": {"type": "array", "items": _STR},
            },
            description="A task submitted at central: its assignment and the copies nodes report",
        ),
        "TaskList": _obj({"tasks": {"type": "array", "items": _ref("TaskView")}}),
        "Event": _obj(
            {
                "at": _NUMBER,
                "kind": {
                    "type": "string",
                    "description": "node-online, node-offline, placed, "
                    "failover, reconciled, cancelled, policy, ...",
                },
                "detail": _STR,
                "node": _nullable(_STR),
                "task": _nullable(_STR),
            }
        ),
        "EventList": _obj({"events": {"type": "array", "items": _ref("Event")}}),
        "Policy": _obj(
            {
                "mode": {"type": "string", "enum": [m.value for m in PolicyMode]},
                "tidal_profile": {
                    "type": "string",
                    "description": "a built-in profile's name, or `config` (the config file's)",
                },
                "tidal_windows": {"type": "array", "items": _STR},
                "reconcile": {"type": "string", "enum": [p.value for p in ReconcilePolicy]},
                "failover_after_s": _NUMBER,
            }
        ),
        "Migration": _obj({"node": {"type": "string", "description": "the target node id"}}),
        "ModelInfo": _model_info(),
        "Models": _obj(
            {
                "central": _map(_ref("ModelInfo"), "kind -> what central runs"),
                "published": _map(
                    _obj(
                        {
                            "sha256": _STR,
                            "size": _INT,
                            "name": _STR,
                            "set_at": _NUMBER,
                        }
                    ),
                    "kind -> the model in the policy document, which every node follows",
                ),
                "nodes": _map(
                    _nullable({"type": "object"}),
                    "node -> kind -> {sha256, source, refused} as the node reports it",
                ),
                "forecast": _obj(
                    {
                        "peak_cpu_next_15min": _nullable(_NUMBER),
                        "classes": {"type": "array", "items": _STR},
                    }
                ),
            }
        ),
        "PolicyUpdate": {
            **_obj(
                {
                    "mode": {"type": "string", "enum": [m.value for m in PolicyMode]},
                    "tidal_profile": {"type": "string", "enum": sorted(builtin_profiles())},
                },
                required=[],
            ),
            "minProperties": 1,
        },
        **_k8s_schemas(),
    }


#: ``resource.Quantity`` as JSON: a string (``"500m"``, ``"2Gi"``, ``"1e3"``) or a number. The
#: pattern is a bounded subset (no sign, at most 9+9 digits, a one-digit exponent: at most
#: about 1e27) the extender always accepts; it refuses negatives, more than 64 digits and
#: magnitudes beyond 1e±30 (schemathesis found ``15606992.31408704E85`` allowed by an earlier,
#: two-digit pattern).
_QUANTITY: Schema = {
    "anyOf": [
        {
            "type": "string",
            "pattern": r"^([0-9]{1,9}(\.[0-9]{0,9})?|\.[0-9]{1,9})"
            r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][0-9])?$",
        },
        {"type": "integer", "minimum": 0, "maximum": 10**18},
        {"type": "null"},
    ]
}
_WHOLE_QUANTITY: Schema = {
    "anyOf": [
        {"type": "string", "pattern": r"^[0-9]{1,9}(k|M|G)?$"},
        {"type": "integer", "minimum": 0, "maximum": 10**18},
        {"type": "null"},
    ],
    "description": "extended resources are whole numbers",
}


def _k8s_schemas() -> Schema:
    resources = {
        "type": ["object", "null"],
        "properties": {
            "cpu": _QUANTITY,
            "memory": _QUANTITY,
            "nvidia.com/gpu": _WHOLE_QUANTITY,
            "amd.com/gpu": _WHOLE_QUANTITY,
            "edgesched.io/iops-k": _WHOLE_QUANTITY,
        },
        "propertyNames": {"minLength": 1},
        "additionalProperties": _QUANTITY,
    }
    requirements = {
        "type": ["object", "null"],
        "properties": {"requests": resources, "limits": resources},
    }
    container: Schema = {"type": "object", "properties": {"resources": requirements}}
    init_container = {
        "type": "object",
        "properties": {**container["properties"], "restartPolicy": _nullable(_STR)},
    }
    string_map = {"type": ["object", "null"], "additionalProperties": _STR}
    name = {"type": "string", "minLength": 1}
    return {
        "K8sPod": {
            "type": "object",
            "description": "A v1.Pod as kube-scheduler sends it (camelCase). The extender reads "
            "metadata (name, namespace, uid, the edgesched.io/workload label) and spec "
            "(containers' and init containers' requests and limits, pod-level resources, "
            "overhead, priority, the kubernetes.io/arch and edgesched.io/server-class node "
            "selector and required node affinity); other fields are ignored.",
            "properties": {
                "metadata": {
                    "type": "object",
                    "properties": {
                        "name": name,
                        "namespace": _nullable(_STR),
                        "uid": _nullable(_STR),
                        "labels": string_map,
                    },
                    "required": ["name"],
                },
                "spec": {
                    "type": "object",
                    "properties": {
                        "containers": {"type": "array", "minItems": 1, "items": container},
                        "initContainers": {"type": ["array", "null"], "items": init_container},
                        "resources": requirements,
                        "overhead": resources,
                        "priority": _nullable(_INT),
                        "nodeSelector": {
                            **string_map,
                            "properties": {
                                "edgesched.io/server-class": {
                                    "type": "string",
                                    "enum": [c.value for c in ServerClass],
                                }
                            },
                        },
                    },
                    "required": ["containers"],
                },
            },
            "required": ["metadata", "spec"],
        },
        "K8sNodeList": {
            "type": "object",
            "description": "A v1.NodeList; item names must be unique (400 otherwise)",
            "properties": {
                "items": {
                    "type": ["array", "null"],
                    "items": {
                        "type": "object",
                        "properties": {
                            "metadata": {
                                "type": "object",
                                "properties": {"name": name},
                                "required": ["name"],
                            }
                        },
                        "required": ["metadata"],
                    },
                }
            },
        },
        "K8sExtenderArgs": {
            "type": "object",
            "description": "extenderv1.ExtenderArgs (Go field names, matched case-insensitively "
            "as Go's decoder does): the pod and exactly one of NodeNames (nodeCacheCapable) "
            "and Nodes",
            "properties": {
                "Pod": _ref("K8sPod"),
                "Nodes": {"anyOf": [_ref("K8sNodeList"), {"type": "null"}]},
                "NodeNames": {"type": ["array", "null"], "uniqueItems": True, "items": name},
            },
            "required": ["Pod"],
            "oneOf": [
                {
                    "properties": {"NodeNames": {"type": "array"}, "Nodes": {"type": "null"}},
                    "required": ["NodeNames"],
                },
                {
                    "properties": {"Nodes": {"type": "object"}, "NodeNames": {"type": "null"}},
                    "required": ["Nodes"],
                },
            ],
        },
        "K8sFilterResult": _obj(
            {
                "Nodes": {
                    "anyOf": [{"type": "object"}, {"type": "null"}],
                    "description": "the passing items (when Nodes was sent)",
                },
                "NodeNames": {
                    "type": ["array", "null"],
                    "items": _STR,
                    "description": "the passing names (when NodeNames was sent)",
                },
                "FailedNodes": _map(_STR, "node -> why (preemption may help)"),
                "FailedAndUnresolvableNodes": _map(_STR, "node -> why (nothing will help)"),
                "Error": _STR,
            },
            description="extenderv1.ExtenderFilterResult",
        ),
        "K8sHostPriorityList": {
            "type": "array",
            "description": "extenderv1.HostPriorityList, in the candidates' order",
            "items": _obj(
                {"Host": _STR, "Score": {"type": "integer", "minimum": 0, "maximum": 10}}
            ),
        },
        "K8sBindingArgs": {
            "type": "object",
            "description": "extenderv1.ExtenderBindingArgs",
            "properties": {"PodName": name, "PodNamespace": name, "PodUID": _STR, "Node": name},
            "required": ["PodName", "PodNamespace", "PodUID", "Node"],
        },
        "K8sBindingResult": _obj(
            {"Error": {"type": "string", "description": "empty: bound"}},
            description="extenderv1.ExtenderBindingResult",
        ),
    }


def _central_paths() -> dict[str, Schema]:
    read = "Any token (admin or read-only)."
    admin = "Admin token only (the read-only token gets 403)."
    tasks_tag, nodes_tag, fleet, ui, k8s = "tasks", "nodes", "fleet", "dashboard", "k8s"
    k8s_note = (
        "kube-scheduler extender v1 (mounted only when `k8s_extender` is on; no token: keep it "
        "on a trusted network or behind TLS client certificates). A malformed body is 400 "
        "naming the JSON path; kube-scheduler treats any non-200 as the extender failing."
    )

    def extender(op_id: str, summary: str, args: str, result: str) -> Schema:
        op = _op(
            op_id,
            summary,
            k8s,
            {"200": _json(_ref(result), result), **_problems(400, 413)},
            description=k8s_note,
            public=True,
            body=_body(_ref(args), args),
        )
        op[EXTENDER_FLAG] = True
        return op

    return {
        **_public_paths(fleet),
        "/v1/status": {
            "get": _op(
                "status",
                "Central: broker link, counts, refused input by reason",
                fleet,
                {"200": _json(_ref("Status"), "central's status"), **_problems(401)},
                description=read,
            )
        },
        "/v1/nodes": {
            "get": _op(
                "listNodes",
                "Every node central holds a replica of",
                nodes_tag,
                {"200": _json(_ref("NodeList"), "nodes by id"), **_problems(401)},
                description=read,
            )
        },
        "/v1/nodes/{id}": {
            "get": _op(
                "getNode",
                "One node, with its document's content",
                nodes_tag,
                {"200": _json(_ref("NodeDetail"), "the node"), **_problems(401, 404)},
                description=read,
                params=[_path_id("node id")],
            )
        },
        "/v1/nodes/{id}/telemetry": {
            "get": _op(
                "nodeTelemetry",
                "A node's last hour of samples (cpu, memory, power)",
                nodes_tag,
                {
                    "200": _json(_ref("Telemetry"), "samples, oldest first"),
                    **_problems(400, 401, 404),
                },
                description=read + " 404 unless central holds the node's document or telemetry.",
                params=[
                    _path_id("node id"),
                    _query("since", _NUMBER, "only samples at or after (unix seconds)"),
                ],
            )
        },
        "/v1/tasks": {
            "get": _op(
                "listTasks",
                "Tasks submitted at central",
                tasks_tag,
                {"200": _json(_ref("TaskList"), "by id"), **_problems(401)},
                description=read,
            ),
            "post": _op(
                "submitTask",
                "Submit a task (placed now, or pending until a node can take it)",
                tasks_tag,
                {
                    "201": _json(_ref("TaskView"), "accepted, journaled to SQLite"),
                    **_problems(400, 401, 403, 409, 413, 422, 503),
                },
                description=admin + " Bodies up to 64 KiB. 409: the id is taken; 422: the "
                "pinned node is not known to central.",
                body=_body(_ref("TaskSubmission"), "the task"),
            ),
        },
        "/v1/tasks/{id}": {
            "get": _op(
                "getTask",
                "One task submitted at central",
                tasks_tag,
                {"200": _json(_ref("TaskView"), "the task"), **_problems(401, 404)},
                description=read,
                params=[_path_id("task id")],
            ),
            "delete": _op(
                "cancelTask",
                "Cancel a task (its node stops it when it hears)",
                tasks_tag,
                {
                    "200": _json(_ref("TaskView"), "cancelled (idempotent)"),
                    **_problems(401, 403, 404, 503),
                },
                description=admin,
                params=[_path_id("task id")],
            ),
        },
        "/v1/tasks/{id}/migrate": {
            "post": _op(
                "migrateTask",
                "Move an active task: placed on the target with a new epoch, a stop "
                "order for the copy it leaves",
                tasks_tag,
                {
                    "200": _json(_ref("TaskView"), "placed on the target"),
                    **_problems(400, 401, 403, 404, 409, 413, 422, 503),
                },
                description=admin + " 409: the task is not active, or already on the target; "
                "422: the target cannot take it (unknown, offline, too small).",
                params=[_path_id("task id")],
                body=_body(_ref("Migration"), "the target node"),
            )
        },
        "/v1/events": {
            "get": _op(
                "listEvents",
                "The fleet's timeline (the last 1000 events)",
                fleet,
                {"200": _json(_ref("EventList"), "oldest first"), **_problems(401)},
                description=read,
            )
        },
        "/v1/policy": {
            "get": _op(
                "getPolicy",
                "The fleet policy: mode and tidal profile",
                fleet,
                {"200": _json(_ref("Policy"), "the policy"), **_problems(401)},
                description=read,
            ),
            "post": _op(
                "setPolicy",
                "Switch the mode and/or the tidal profile; every node follows",
                fleet,
                {
                    "200": _json(_ref("Policy"), "the policy now"),
                    **_problems(400, 401, 403, 413, 422, 503),
                },
                description=admin + " Kept in the policy document: it survives a restart.",
                body=_body(_ref("PolicyUpdate"), "what to switch"),
            ),
        },
        "/v1/models": {
            "get": _op(
                "getModels",
                "The ONNX models: what central runs, what it published, what nodes run",
                fleet,
                {"200": _json(_ref("Models"), "the models"), **_problems(401)},
                description=read,
            )
        },
        "/v1/models/{kind}": {
            "put": _op(
                "putModel",
                "Publish an ONNX model for the whole fleet (forecast or placement)",
                fleet,
                {
                    "200": _json(_ref("Models"), "the models now"),
                    **_problems(400, 401, 403, 404, 413, 422, 503),
                },
                description=admin
                + " The body is the `.onnx` file (at most 1 MiB). Central loads it to check it"
                " against the kind's contract (422 naming the mismatch otherwise), swaps it in"
                " and writes it into the policy document: every node verifies its sha256 and"
                " swaps it in when it hears, a cut-off node on heal.",
                params=[
                    {
                        "name": "kind",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": ["forecast", "placement"]},
                    },
                    _query("name", {"type": "string", "maxLength": 128}, "a display name"),
                ],
                body={
                    "required": True,
                    "description": "the ONNX file",
                    "content": {
                        "application/octet-stream": {
                            "schema": {
                                "type": "string",
                                "contentMediaType": "application/octet-stream",
                            }
                        }
                    },
                },
            )
        },
        "/metrics": {
            "get": _op(
                "metrics",
                "Prometheus metrics",
                fleet,
                {"200": _TEXT, **_problems(401)},
                description=read,
            )
        },
        "/": {
            "get": _op(
                "root",
                "Redirect to the dashboard",
                ui,
                {"302": {"description": "to /dashboard/"}},
                public=True,
            )
        },
        "/dashboard": {
            "get": _op(
                "dashboardRedirect",
                "Redirect to the dashboard",
                ui,
                {"302": {"description": "to /dashboard/"}},
                public=True,
            )
        },
        "/dashboard/": {
            "get": _op(
                "dashboard",
                "The dashboard page (holds no data; the token goes in its URL "
                "fragment, #token=...)",
                ui,
                {"200": _json(_STR, "the page", "text/html")},
                public=True,
            )
        },
        "/dashboard/{file}": {
            "get": _op(
                "dashboardAsset",
                "One of the dashboard's shipped files, by exact name",
                ui,
                {
                    "200": {
                        "description": "the file",
                        "content": {
                            t: {"schema": _STR}
                            for t in (
                                "text/html",
                                "text/javascript",
                                "text/css",
                                "image/svg+xml",
                                "image/png",
                                "image/x-icon",
                            )
                        },
                    },
                    **_problems(404),
                },
                public=True,
                params=[
                    {
                        "name": "file",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1},
                    }
                ],
            )
        },
        "/v1/stream": {
            "get": _op(
                "stream",
                "Server-Sent Events: a fleet snapshot now and every second",
                ui,
                {
                    "200": _json(
                        _STR,
                        "`event: snapshot` frames (data: one JSON object: status, "
                        "policy, nodes, tasks, node_tasks, events, at), keep-alive comments",
                        "text/event-stream",
                    ),
                    **_problems(401, 503),
                },
                description=read + " Never ends by itself: the client or the server's shutdown "
                "ends it.",
                security=[{"bearer": []}, {"tokenQuery": []}],
            )
        },
        "/v1/k8s/filter": {
            "post": extender(
                "k8sFilter", "kube-scheduler filterVerb", "K8sExtenderArgs", "K8sFilterResult"
            )
        },
        "/v1/k8s/prioritize": {
            "post": extender(
                "k8sPrioritize",
                "kube-scheduler prioritizeVerb (scores 0..10)",
                "K8sExtenderArgs",
                "K8sHostPriorityList",
            )
        },
        "/v1/k8s/bind": {
            "post": extender(
                "k8sBind",
                "kube-scheduler bindVerb (central has no Kubernetes API client: every "
                "bind answers an Error; leave bindVerb unset)",
                "K8sBindingArgs",
                "K8sBindingResult",
            )
        },
    }


def central_document() -> Schema:
    """The OpenAPI document of central's API (a fresh dict: callers may change it)."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "edgesched central",
            "version": __version__,
            "description": "The fleet as central sees it, and how to steer it. Two bearer "
            "tokens: admin (every route) and read-only (GET routes). Public: /v1/health, this "
            "document, the dashboard's page and assets, and the kube-scheduler extender under "
            "/v1/k8s. Errors are RFC 9457 problem details (application/problem+json) naming "
            "the field. Any route answers 405 (problem) to a method it does not serve.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "tags": [
            {"name": "fleet"},
            {"name": "nodes"},
            {"name": "tasks"},
            {"name": "dashboard"},
            {"name": "k8s", "description": "kube-scheduler extender v1 (when enabled)"},
        ],
        "paths": _central_paths(),
        "components": {
            "schemas": _central_schemas(),
            "responses": _problem_responses(_CENTRAL_PROBLEMS),
            "securitySchemes": {**_SECURITY_SCHEMES, "tokenQuery": _TOKEN_QUERY},
        },
    }


# --- edge ---------------------------------------------------------------------------------------

_EDGE_PROBLEMS = [400, 401, 404, 409, 413, 422, 503, 507]
_STATE_LIST = "|".join(s.value for s in TaskState)


def _edge_schemas() -> dict[str, Schema]:
    hardware = _obj(
        {
            "arch": {"type": "string", "enum": [a.value for a in Arch]},
            "cpu_model": _STR,
            "cores": _INT,
            "mem_gib": _NUMBER,
            "server_class": {"type": "string", "enum": [c.value for c in ServerClass]},
            "class_reason": _STR,
            "perf": _nullable(_NUMBER),
            "iops_k": _nullable(_NUMBER),
        }
    )
    return {
        "Problem": _problem_schema(),
        "TaskSpec": task_spec_schema(),
        "Health": _obj({"ok": {"const": True}}),
        "EdgeStatus": _obj(
            {
                "node": _STR,
                "site": _STR,
                "mode": {"type": "string", "enum": ["connected", "autonomous"]},
                "broker_connected": _BOOL,
                "central_heard_s_ago": _nullable(_NUMBER),
                "lease_s": _NUMBER,
                "policy": {"type": "string", "enum": [m.value for m in PolicyMode]},
                "tidal_profile": _STR,
                "uptime_s": _NUMBER,
                "document": {
                    "anyOf": [
                        _obj(
                            {"name": _STR, "client_id": _INT, "content_hash": _STR, "tasks": _INT}
                        ),
                        {"type": "null"},
                    ]
                },
                "models": _map(_model_info(), "kind -> the model in use, or why none"),
                "power": _obj(
                    {
                        "state": {"type": "string", "enum": ["active", "parked"]},
                        "since": _NUMBER,
                        "idle_since": _nullable(_NUMBER),
                        "last_error": _STR,
                    }
                ),
                "forecast": _obj(
                    {
                        "model": _STR,
                        "peak_cpu_next_15min": _nullable(_NUMBER),
                        "history_bins": _INT,
                        "classes": {"type": "array", "items": _STR},
                    }
                ),
                "hardware": {
                    "anyOf": [hardware, {"type": "null"}],
                    "description": "null until the node is profiled",
                },
            }
        ),
        "TaskRecord": _obj(
            {
                "id": _STR,
                "state": {"type": "string", "enum": [s.value for s in TaskState]},
                "spec": _ref("TaskSpec"),
                "submitted_at": _NUMBER,
                "updated_at": _NUMBER,
                "decided_by": {
                    "type": "string",
                    "description": "central, edge-autonomous, "
                    "edge-connected, or empty before a decision",
                },
                "node": _nullable(_STR),
                "pid": _nullable(_INT),
                "cores": {"type": "array", "items": _INT},
                "restarts": _INT,
                "exit_code": _nullable(_INT),
                "reason": _STR,
            }
        ),
        "Decision": {
            **_obj(
                {
                    "kind": {"type": "string", "enum": [k.value for k in DecisionKind]},
                    "node": _STR,
                    "reason": _STR,
                    "at": _NUMBER,
                    "task": _STR,
                    "from": _STR,
                    "image": _STR,
                    "cores": {"type": "array", "items": _INT},
                    "scores": _map(_NUMBER),
                    "seq": _INT,
                    "source": _STR,
                },
                required=["kind", "node", "reason", "at", "seq", "source"],
                closed=False,
            ),
            "description": "A scheduling decision with its reason and scores",
        },
    }


def _edge_paths() -> dict[str, Schema]:
    tag = "edge"
    task_id = _path_id("task id")
    return {
        **_public_paths(tag),
        "/v1/status": {
            "get": _op(
                "status",
                "Node, mode, link, forecast, hardware",
                tag,
                {"200": _json(_ref("EdgeStatus"), "the node's status"), **_problems(401)},
            )
        },
        "/v1/tasks": {
            "get": _op(
                "listTasks",
                "Task records",
                tag,
                {
                    "200": _json({"type": "array", "items": _ref("TaskRecord")}, "records"),
                    **_problems(400, 401, 503),
                },
                params=[
                    _query(
                        "state",
                        {"type": "string", "pattern": f"^({_STATE_LIST})(,({_STATE_LIST}))*$"},
                        "only these states (comma-separated)",
                    )
                ],
            ),
            "post": _op(
                "submitTask",
                "Submit a task; 201 once committed to SQLite",
                tag,
                {
                    "201": _json(_ref("TaskRecord"), "accepted"),
                    **_problems(400, 401, 409, 413, 422, 503, 507),
                },
                description="Bodies up to 64 KiB. 409: the id is taken; 422: the node's "
                "architecture, class or whole capacity cannot take it; 503: the engine is "
                "starting; 507: the store is full.",
                body=_body(_ref("TaskSpec"), "the task"),
            ),
        },
        "/v1/tasks/{id}": {
            "get": _op(
                "getTask",
                "One task record",
                tag,
                {"200": _json(_ref("TaskRecord"), "the record"), **_problems(401, 404, 503)},
                params=[task_id],
            ),
            "delete": _op(
                "cancelTask",
                "Cancel a task (idempotent)",
                tag,
                {"200": _json(_ref("TaskRecord"), "the record"), **_problems(401, 404, 503)},
                params=[task_id],
            ),
        },
        "/v1/decisions": {
            "get": _op(
                "listDecisions",
                "Recent decisions with their reasons, newest first",
                tag,
                {
                    "200": _json({"type": "array", "items": _ref("Decision")}, "decisions"),
                    **_problems(400, 401, 503),
                },
                params=[
                    _query("limit", _INT, "how many (clamped to 1..1000; default 100)"),
                    _query("task", _STR, "only this task's"),
                ],
            )
        },
        "/metrics": {
            "get": _op("metrics", "Prometheus metrics", tag, {"200": _TEXT, **_problems(401)})
        },
    }


def edge_document() -> Schema:
    """The OpenAPI document of an edge node's local API (a fresh dict)."""
    return {
        "openapi": OPENAPI_VERSION,
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
            "responses": _problem_responses(_EDGE_PROBLEMS),
            "securitySchemes": copy.deepcopy(_SECURITY_SCHEMES),
        },
    }


# --- handlers -----------------------------------------------------------------------------------

_CACHE: dict[str, Schema] = {}


async def serve_central(request: web.Request) -> web.Response:
    """``GET /v1/openapi.json`` on central."""
    doc = _CACHE.get("central") or _CACHE.setdefault("central", central_document())
    return web.json_response(doc)


async def serve_edge(request: web.Request) -> web.Response:
    """``GET /v1/openapi.json`` on an edge node."""
    doc = _CACHE.get("edge") or _CACHE.setdefault("edge", edge_document())
    return web.json_response(doc)
