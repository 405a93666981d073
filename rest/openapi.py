"""OpenAPI 3.1 building blocks both tiers' documents share.

Small builders (objects, references, operations, parameters, problem responses) and the schemas
both APIs serve: the task spec (built from the same limits and enums its validator uses), RFC
9457 problems, the bearer security scheme, the public routes. Each tier builds its own document
from these: ``edgesched.central.openapi`` and ``edgesched.edge.openapi``.
"""

from __future__ import annotations

from typing import Any

from edgesched.core.model import MAX_PRIORITY, Arch, ServerClass
from edgesched.core.task import (
    IMAGE_REF,
    MAX_IMAGE_REF,
    MAX_SPEC_INT,
    MAX_THREADS,
    RestartPolicy,
)
from edgesched.sync.reconcile import ReconcilePolicy

OPENAPI_VERSION = "3.1.0"

Schema = dict[str, Any]

# --- small builders ---------------------------------------------------------------------------


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """``schema`` or null (OpenAPI 3.1: a type list; other keywords do not apply to null)."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def obj(
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


def map_of(values: Schema, description: str | None = None) -> Schema:
    out: Schema = {"type": "object", "additionalProperties": values}
    if description:
        out["description"] = description
    return out


def content(schema: Schema, description: str, media: str = "application/json") -> Schema:
    return {"description": description, "content": {media: {"schema": schema}}}


def request_body(schema: Schema, description: str) -> Schema:
    return {"required": True, "description": description, **content(schema, description)}


PROBLEMS = {
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


def problems(*codes: int) -> dict[str, Schema]:
    return {str(c): {"$ref": f"#/components/responses/{PROBLEMS[c][0]}"} for c in codes}


def problem_responses(codes: list[int]) -> dict[str, Schema]:
    return {
        PROBLEMS[c][0]: content(ref("Problem"), PROBLEMS[c][1], "application/problem+json")
        for c in codes
    }


def op(
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


def public_paths(tag: str) -> dict[str, Schema]:
    """The two routes both tiers serve without a token: liveness and this document."""
    return {
        "/v1/health": {
            "get": op(
                "health",
                "Liveness (no token)",
                tag,
                {"200": content(ref("Health"), "up")},
                public=True,
            )
        },
        "/v1/openapi.json": {
            "get": op(
                "openapi",
                "This document (no token)",
                tag,
                {"200": content({"type": "object"}, "the OpenAPI document")},
                public=True,
            )
        },
    }


def path_id(what: str) -> Schema:
    return {
        "name": "id",
        "in": "path",
        "required": True,
        "description": what,
        "schema": {"type": "string", "minLength": 1},
    }


def query(name: str, schema: Schema, description: str) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


NUMBER: Schema = {"type": "number"}
INT: Schema = {"type": "integer"}
STR: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}


def broker_link_schema() -> Schema:
    """``broker`` in both tiers' ``/v1/status``: the MQTT link's state
    (:meth:`edgesched.sync.session.BrokerLink.report`)."""
    return obj(
        {
            "address": {"type": "string", "description": "host:port connected to, or tried next"},
            "connected": BOOL,
            "since": {
                **nullable(NUMBER),
                "description": "Unix time the link last went up or down (null: no attempt yet)",
            },
            "last_error": {
                **nullable(STR),
                "description": "why the last connect failed or the last connection ended",
            },
            "last_error_at": nullable(NUMBER),
            "failed_attempts": {
                "type": "integer",
                "description": "connects that failed since the last one that worked",
            },
            "connects": INT,
            "duplicate": {
                **nullable(STR),
                "description": "another process seen connecting under the same identity",
            },
            "duplicate_at": {
                **nullable(NUMBER),
                "description": "Unix time it was last seen (it may have gone since)",
            },
        },
        description="the MQTT broker link (docs/troubleshooting.md)",
    )


TEXT: Schema = content(STR, "Prometheus text exposition format", "text/plain")

# --- shared schemas: the task spec, problems --------------------------------------------------


def model_info() -> Schema:
    """One ONNX model an engine runs (``edgesched.policies.models.ModelInfo``)."""
    return obj(
        {
            "source": {"type": "string", "enum": ["shipped", "config", "central", "none"]},
            "path": STR,
            "sha256": STR,
            "refused": {"type": "string", "description": "the last refusal, if any"},
            "refused_sha256": STR,
        }
    )


#: ``TaskSpec`` ids: Python's ``str.isalnum`` letters and digits, '-', '_' and '.'. ``\\w`` is
#: exactly that plus '_' under Python's ``re`` (and ASCII-only under ECMA-262, a stricter rule a
#: client can follow safely).
TASK_ID_PATTERN = r"^\w[\w.-]{0,127}$"
RECONCILE_CHOICES = ["", *(p.value for p in ReconcilePolicy)]


def task_spec_schema() -> Schema:
    """What :meth:`edgesched.core.task.TaskSpec.from_json` accepts, field by field."""
    positive_int = nullable({"type": "integer", "minimum": 1, "maximum": MAX_SPEC_INT})
    count = {"type": "integer", "minimum": 0, "maximum": MAX_SPEC_INT}
    return {
        "type": "object",
        "description": "A task to run: the scheduler's demand plus how to run its process. "
        "Unknown fields are refused (400 naming the field), and so are integers written as "
        "floats (1.0), integers beyond ±2**53 (what the documents carry exactly) and strings "
        "holding lone surrogates.",
        "properties": {
            "id": {
                "type": "string",
                "pattern": TASK_ID_PATTERN,
                "minLength": 1,
                "maxLength": 128,
                "description": "1-128 letters, digits, '-', '_' or '.' (at most 128 bytes in "
                "UTF-8), not starting with '.' or '-'",
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
            "accel_slices": {
                **count,
                "default": 0,
                "description": "slices of one accelerator (MIG instances, SR-IOV virtual "
                "functions or time-slicing shares) instead of whole devices: not with accel",
            },
            "threads": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_THREADS,
                "default": 0,
                "description": "threads for the affinity planner (0: its cores)",
            },
            "env": map_of(STR, "environment added to the process's"),
            "cwd": nullable({"type": "string"}),
            "restart": {
                "type": "string",
                "enum": [p.value for p in RestartPolicy],
                "default": RestartPolicy.ON_FAILURE.value,
            },
            "max_restarts": {**count, "default": 5},
            "limits": obj(
                {"memory_mb": positive_int, "nofile": positive_int, "cpu_seconds": positive_int},
                required=[],
                description="per-process limits: cgroup v2 where writable, rlimits otherwise",
            ),
            "archs": {
                "type": "array",
                "items": {"type": "string", "enum": [a.value for a in Arch]},
                "description": "architectures it can run on (empty: any)",
            },
            "images": obj(
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
            "duration_s": nullable({"type": "number", "minimum": 0}),
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
        "not": {  # whole devices or slices of one, not both
            "required": ["accel", "accel_slices"],
            "properties": {
                "accel": {"type": "integer", "minimum": 1},
                "accel_slices": {"type": "integer", "minimum": 1},
            },
        },
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


def problem_schema() -> Schema:
    return obj(
        {
            "type": {"type": "string", "description": "always about:blank"},
            "title": STR,
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": STR,
            "field": {
                "type": "string",
                "description": "the field, parameter or JSON path at fault, when there is one",
            },
        },
        required=["type", "title", "status", "detail"],
        description="RFC 9457 problem details",
    )


SECURITY_SCHEMES: Schema = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "Central: `api-token` (admin, every route) or `api-token-read` "
        "(read-only: GET routes; anything else answers 403), both created 0600 in "
        "`state_dir` at first start. Edge: `<state_dir>/api-token`.",
    },
}
TOKEN_QUERY: Schema = {
    "type": "apiKey",
    "in": "query",
    "name": "token",
    "description": "Either central token as `?token=`, for a browser's EventSource, which "
    "cannot set headers (accepted on every guarded route; meant for /v1/stream).",
}


def logs_query(follow: list[str]) -> list[Schema]:
    """The query of both tiers' ``GET /v1/tasks/{id}/logs``: ``tail`` and ``follow`` (the
    values ``follow`` takes, as each tier reads it)."""
    return [
        query(
            "tail",
            {"type": "integer", "minimum": 0, "maximum": 10_000},
            "how many of the last lines (default 100)",
        ),
        query(
            "follow",
            {"type": "string", "enum": follow},
            "1: go on with what it writes until it has finished (chunked)",
        ),
    ]
