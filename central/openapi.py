"""OpenAPI 3.1 document of central's REST API, served at ``GET /v1/openapi.json`` (public).

Every route of :func:`edgesched.central.api.build_app`: the fleet API, the dashboard and its
event stream, ``/metrics``, and the kube-scheduler extender under ``/v1/k8s`` (marked
``x-edgesched-extender``: mounted only when ``k8s_extender`` is on). Built from the shared blocks
in :mod:`edgesched.rest.openapi` and the same enums the handlers validate with.

``tests/test_openapi.py`` keeps it honest: the document validates as OpenAPI, its method+path
set equals the routes the app registers, and schemathesis fuzzes a live central against it.
Request schemas are the validators' rules, up to what JSON Schema cannot say (a pinned node that
does not exist, a task id already taken: the 4xx listed on each operation).
"""

from __future__ import annotations

from aiohttp import web

from edgesched.central.sites import DECISIONS_SHOWN, HEALTHS, MAX_DECISIONS_SHOWN
from edgesched.config import builtin_profiles
from edgesched.core.lifecycle import Phase
from edgesched.core.model import ServerClass
from edgesched.core.policy import PolicyMode
from edgesched.rest import openapi as oa
from edgesched.rest.openapi import Schema
from edgesched.sync.reconcile import ReconcilePolicy
from edgesched.version import __version__

#: Marks the kube-scheduler extender's operations (served only when ``k8s_extender`` is on).
EXTENDER_FLAG = "x-edgesched-extender"


# --- central -----------------------------------------------------------------------------------

_CENTRAL_PROBLEMS = [400, 401, 403, 404, 409, 413, 422, 503]


def _central_schemas() -> dict[str, Schema]:
    telemetry = oa.obj(
        {
            "at": {"type": "number", "description": "unix seconds"},
            "cpu_util": {"type": "number", "minimum": 0, "maximum": 1},
            "mem_util": {"type": "number", "minimum": 0, "maximum": 1},
            "power_w": oa.NUMBER,
            "tasks_running": oa.INT,
        }
    )
    summary = {
        "id": oa.STR,
        "status": {
            "type": "string",
            "enum": ["online", "offline", "unknown"],
            "description": "its retained status message (unknown: none heard)",
        },
        "state": {
            "type": "string",
            "enum": ["connected", "suspect", "partitioned", "dead", "unknown"],
        },
        "status_since": oa.nullable(oa.NUMBER),
        "status_cause": oa.nullable(
            {"type": "string", "enum": ["status", "heard", "will", "site", "silent"]}
        ),
        "registration": oa.nullable(
            {
                "type": "object",
                "description": "what the node registered (hardware, capacity) in its document",
            }
        ),
        "document": oa.obj(
            {"epoch": oa.INT, "content_hash": oa.STR, "changed_at": oa.nullable(oa.NUMBER)}
        ),
        "tasks": oa.map_of(oa.INT, "its tasks counted by state"),
        "telemetry": oa.nullable(oa.ref("TelemetrySample")),
        "sync": oa.obj({"last_update_s_ago": oa.nullable(oa.NUMBER), "fresh": oa.BOOL}),
    }
    detail = {**summary, "content": {"type": "object", "description": "the node's document"}}
    copy_ = oa.obj(
        {
            "state": oa.nullable(oa.STR),
            "epoch": oa.nullable(oa.INT),
            "updated_at": oa.nullable(oa.NUMBER),
        }
    )
    rejected = [
        "rejected_frames",
        "rejected_payloads",
        "rejected_updates",
        "rejected_senders",
        "rejected_authorship",
        "unknown_documents",
        "status_messages",
        "telemetry",
        "schema_entries",
    ]
    return {
        "Problem": oa.problem_schema(),
        "TaskSpec": oa.task_spec_schema(),
        "TaskSubmission": oa.task_submission_schema(),
        "Health": oa.obj({"ok": {"const": True}}),
        "Status": oa.obj(
            {
                "central": oa.STR,
                "uptime_s": oa.NUMBER,
                "broker_connected": oa.BOOL,
                "broker": oa.broker_link_schema(),
                "nodes": oa.INT,
                "online": oa.INT,
                "heartbeats_sent": oa.INT,
                "leader": {
                    "type": "string",
                    "description": "the central replica that places "
                    "tasks (the lowest id of those alive)",
                },
                "centrals_alive": {
                    "type": "array",
                    "items": oa.STR,
                    "description": "peer central replicas heard within their lease",
                },
                "shards": oa.nullable(
                    oa.obj(
                        {
                            "count": oa.INT,
                            "owned": {"type": "array", "items": oa.INT},
                            "handing_over": {
                                "type": "array",
                                "items": oa.INT,
                                "description": "held, not acted on until the other "
                                "replicas answered a sync of the fleet document",
                            },
                            "tokens": oa.map_of(oa.INT, "owned shard -> its fencing token"),
                            "members": {"type": "array", "items": oa.STR},
                            "lease_valid_for_s": oa.NUMBER,
                            "etcd_connected": oa.BOOL,
                        },
                        description="shard leases from etcd ([central] etcd_endpoints)",
                    )
                ),
                "policy_hash": oa.nullable(oa.STR),
                "fleet_hash": {
                    **oa.nullable(oa.STR),
                    "description": "sha256 of the fleet document's content; null past 20,000 "
                    "entries (hashing it whole would hold central's loop for seconds)",
                },
                "desired_documents": {
                    "type": "integer",
                    "description": "per-node desired-state documents central writes",
                },
                "index": oa.map_of(
                    oa.INT, "the fleet index's sizes (nodes, usable, assignments, pending, ...)"
                ),
                "updates_in": oa.INT,
                "rejected": oa.obj(
                    {k: oa.INT for k in rejected}, description="input refused, by reason"
                ),
                "refused": oa.map_of(
                    oa.map_of(oa.INT, "reason -> count"),
                    "channel (node, policy, fleet, desired, status, telemetry) -> input "
                    "refused since start, by reason (frame, payload, update, sender, "
                    "authorship, epoch, schema; malformed; unknown_document)",
                ),
                "refused_entries": oa.map_of(
                    oa.INT, "document entry kind -> entries the schema refused (every replica)"
                ),
            },
        ),
        "TelemetrySample": telemetry,
        "Telemetry": oa.obj(
            {"node": oa.STR, "samples": {"type": "array", "items": oa.ref("TelemetrySample")}}
        ),
        "NodeSummary": oa.obj(summary),
        "NodeDetail": oa.obj(detail),
        "NodeList": oa.obj({"nodes": {"type": "array", "items": oa.ref("NodeSummary")}}),
        "TaskView": oa.obj(
            {
                "id": oa.STR,
                "state": {
                    "type": ["string", "null"],
                    "enum": ["pending", "active", "cancelled", None],
                    "description": "central's assignment: pending (no node can take it yet), "
                    "active (placed), cancelled; null for a task a node decided. The task's "
                    "own state is phase",
                },
                "phase": {
                    "type": "string",
                    "enum": [p.value for p in Phase],
                    "description": "the task's state, fleet-wide: pending, placed, running, "
                    "exited, failed, cancelled, lost (its node is dead)",
                },
                "exit_code": oa.nullable(oa.INT),
                "restarts": oa.INT,
                "submitted_at": oa.nullable(oa.NUMBER),
                "started_at": oa.nullable(oa.NUMBER),
                "finished_at": oa.nullable(oa.NUMBER),
                "origin": {
                    "type": "string",
                    "enum": ["central", "node"],
                    "description": "central: central placed it; node: submitted at a node's "
                    "API or decided by a node while cut off",
                },
                "unknown_since": oa.nullable(
                    {
                        "type": "number",
                        "description": "its node is cut off: the state is as of before this",
                    }
                ),
                "node": oa.nullable(oa.STR),
                "epoch": oa.nullable(oa.INT),
                "replacement": oa.nullable(oa.BOOL),
                "score": oa.nullable(oa.NUMBER),
                "reason": oa.nullable(oa.STR),
                "decided_by": oa.nullable(
                    {
                        "type": "string",
                        "description": "the central replica that decided it, or for a task a "
                        "node decided edge-connected or edge-autonomous",
                    }
                ),
                "lease": oa.nullable(
                    {
                        "type": "integer",
                        "description": "the fencing token of the shard lease it was decided "
                        "under (0 without etcd)",
                    }
                ),
                "at": oa.nullable(oa.NUMBER),
                "spec": {"anyOf": [oa.ref("TaskSpec"), {"type": "null"}]},
                "copies": oa.map_of(copy_, "what each node reports of it, by node id"),
                "running_on": {"type": "array", "items": oa.STR},
            },
            description="A task: central's assignment (if central placed it), its lifecycle "
            "fleet-wide, and the copies nodes report",
        ),
        "ServiceSpec": oa.obj(
            {
                "name": {"type": "string", "pattern": "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"},
                "template": _service_template(),
                "replicas": {"type": "integer", "minimum": 0, "maximum": 10_000},
                "min": {"type": "integer", "minimum": 0, "maximum": 10_000},
                "max": {"type": "integer", "minimum": 0, "maximum": 10_000},
                "autoscale": oa.nullable(
                    oa.obj(
                        {
                            "metric": {"type": "string", "enum": ["load", "forecast"]},
                            "target_per_replica": {"type": "number", "exclusiveMinimum": 0},
                            "scale_in_delay_s": {"type": "number", "minimum": 0},
                            "max_step_out": {"type": "integer", "minimum": 1, "maximum": 10_000},
                            "max_step_in": {"type": "integer", "minimum": 1, "maximum": 10_000},
                        },
                        required=[],
                    )
                ),
                "spread": oa.obj(
                    {
                        "max_per_node": {"type": "integer", "minimum": 0, "maximum": 10_000},
                        "across": {
                            "type": "array",
                            "uniqueItems": True,
                            "items": {"type": "string", "enum": ["node", "site", "arch"]},
                        },
                    },
                    required=[],
                ),
                "rollout": oa.obj(
                    {
                        "max_surge": {"type": "integer", "minimum": 1, "maximum": 10_000},
                        "healthy_after_s": {"type": "number", "minimum": 0},
                        "max_failures": {"type": "integer", "minimum": 1, "maximum": 10_000},
                    },
                    required=[],
                ),
            },
            required=["name", "template"],
            description="A service: replicas of a task template kept at their count",
        ),
        "ServiceView": oa.obj(
            {
                "name": oa.STR,
                "spec": oa.ref("ServiceSpec"),
                "revision": {"type": "string", "description": "the template's hash"},
                "replicas": oa.INT,
                "running": oa.INT,
                "live": {"type": "integer", "description": "replicas holding a slot"},
                "phases": oa.map_of(oa.INT, "live replicas by phase"),
                "reason": {"type": "string", "description": "why it has this count now"},
                "at": oa.NUMBER,
                "deleted": oa.BOOL,
                "rollout": oa.obj({"outdated": oa.INT, "stalled": oa.BOOL}),
                "load": oa.nullable(
                    oa.obj(
                        {
                            "cores": oa.NUMBER,
                            "at": {"type": "number", "description": "on the autoscaler's clock"},
                            "fresh": {
                                "type": "boolean",
                                "description": "recent enough for the autoscaler to act on",
                            },
                        }
                    )
                ),
                "forecast_peak": oa.nullable(oa.NUMBER),
                "tasks": {
                    "type": "array",
                    "items": oa.obj(
                        {
                            "id": oa.STR,
                            "slot": oa.INT,
                            "revision": oa.STR,
                            "phase": {"type": "string", "enum": [p.value for p in Phase]},
                            "node": oa.nullable(oa.STR),
                            "stopping": oa.BOOL,
                        }
                    ),
                },
            },
            required=[
                "name",
                "spec",
                "revision",
                "replicas",
                "running",
                "live",
                "phases",
                "reason",
                "at",
                "deleted",
                "rollout",
                "load",
                "forecast_peak",
            ],
            description="A service, its replicas (tasks of their own) and why it has its count",
        ),
        "ServiceList": oa.obj(
            {"services": {"type": "array", "items": oa.ref("ServiceView")}},
        ),
        **_site_schemas(summary["status"], summary["state"]),
        "Scale": oa.obj({"replicas": {"type": "integer", "minimum": 0, "maximum": 10_000}}),
        "Load": oa.obj(
            {
                "cores": {"type": "number", "minimum": 0, "maximum": 1e9},
                "at": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 2**40,
                    "description": "when it was measured on a simulated clock (read only "
                    "with [central] autoscale_time_scale > 1)",
                },
            },
            required=["cores"],
        ),
        "LoadReport": oa.obj({"name": oa.STR, "load": oa.NUMBER, "at": oa.NUMBER}),
        "TaskList": oa.obj(
            {
                "tasks": {"type": "array", "items": oa.ref("TaskView")},
                "next": oa.nullable(
                    {
                        "type": "string",
                        "description": "the next page's after, if any: a filtered page may "
                        "hold fewer than limit tasks while next is set (the request's scan "
                        "budget ran out); follow it until null",
                    }
                ),
                "scanned": {**oa.INT, "description": "ids this request looked at"},
                "total": {**oa.INT, "description": "every task central knows"},
            }
        ),
        "History": oa.obj(
            {
                "tasks": {
                    "type": "array",
                    "items": oa.obj(
                        {
                            "id": oa.STR,
                            "phase": {"type": "string", "enum": ["exited", "failed", "cancelled"]},
                            "finished_at": oa.NUMBER,
                            "workload": oa.STR,
                        },
                        closed=False,
                        description="a task view (TaskView) as it was when it finished, and "
                        "its workload class",
                    ),
                },
                "next": oa.nullable(
                    oa.obj(
                        {"before_at": oa.NUMBER, "before_id": oa.STR},
                        description="the next page's before_at and before_id",
                    )
                ),
            }
        ),
        "Event": oa.obj(
            {
                "at": oa.NUMBER,
                "kind": {
                    "type": "string",
                    "description": "node-online, node-offline, placed, "
                    "failover, reconciled, cancelled, policy, ...",
                },
                "detail": oa.STR,
                "node": oa.nullable(oa.STR),
                "task": oa.nullable(oa.STR),
            }
        ),
        "EventList": oa.obj({"events": {"type": "array", "items": oa.ref("Event")}}),
        "FleetPoint": oa.obj(
            {
                "at": {**oa.NUMBER, "description": "the minute's start (unix seconds)"},
                "util": oa.nullable(
                    {**oa.NUMBER, "description": "measured CPU utilization, by cores"}
                ),
                "power_w": {**oa.NUMBER, "description": "power the nodes report, summed"},
                "demand_cpu": {**oa.NUMBER, "description": "cores the tasks ask for"},
                "capacity_cpu": {**oa.NUMBER, "description": "cores central may place on"},
                "forecast_cpu": oa.nullable(
                    {**oa.NUMBER, "description": "the 15-minute peak forecast then"}
                ),
                "energy_wh": {**oa.NUMBER, "description": "drawn since midnight UTC"},
            },
            description="A minute of the fleet (the means of its 5-second samples)",
        ),
        "FleetNow": oa.obj(
            {
                "at": oa.NUMBER,
                "util": oa.nullable(oa.NUMBER),
                "power_w": oa.NUMBER,
                "demand_cpu": oa.NUMBER,
                "capacity_cpu": oa.NUMBER,
                "forecast_cpu": oa.nullable(oa.NUMBER),
                "window": oa.nullable({**oa.STR, "description": "the tidal window now"}),
                "shares": oa.map_of(oa.NUMBER, "guaranteed CPU share per workload class"),
                "used": oa.map_of(oa.NUMBER, "share of capacity each class uses now"),
                "nodes_measured": oa.INT,
                "energy_today_wh": oa.NUMBER,
            },
            description="The latest 5-second sample",
        ),
        "Fleet": oa.obj(
            {
                "now": oa.nullable(oa.ref("FleetNow")),
                "series": {"type": "array", "items": oa.ref("FleetPoint")},
                "point_s": oa.NUMBER,
                "policy": oa.ref("Policy"),
            }
        ),
        "Policy": oa.obj(
            {
                "mode": {"type": "string", "enum": [m.value for m in PolicyMode]},
                "tidal_profile": {
                    "type": "string",
                    "description": "a built-in profile's name, or `config` (the config file's)",
                },
                "tidal_windows": {"type": "array", "items": oa.STR},
                "reconcile": {"type": "string", "enum": [p.value for p in ReconcilePolicy]},
                "failover_after_s": oa.NUMBER,
            }
        ),
        "Migration": oa.obj({"node": {"type": "string", "description": "the target node id"}}),
        "ModelInfo": oa.model_info(),
        "Models": oa.obj(
            {
                "central": oa.map_of(oa.ref("ModelInfo"), "kind -> what central runs"),
                "published": oa.map_of(
                    oa.obj(
                        {
                            "sha256": oa.STR,
                            "size": oa.INT,
                            "name": oa.STR,
                            "set_at": oa.NUMBER,
                        }
                    ),
                    "kind -> the model in the policy document, which every node follows",
                ),
                "nodes": oa.map_of(
                    oa.nullable({"type": "object"}),
                    "node -> kind -> {sha256, source, refused} as the node reports it",
                ),
                "forecast": oa.obj(
                    {
                        "peak_cpu_next_15min": oa.nullable(oa.NUMBER),
                        "classes": {"type": "array", "items": oa.STR},
                    }
                ),
            }
        ),
        "PolicyUpdate": {
            **oa.obj(
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


def _site_schemas(status: Schema, state: Schema) -> dict[str, Schema]:
    """``GET /v1/sites``: :meth:`edgesched.central.sites.SiteIndex.view`."""
    names = {"type": "array", "items": oa.STR}
    lease: dict[str, Schema] = {
        "epoch": {"type": "integer", "minimum": 1},
        "since": {"type": "number", "description": "unix seconds"},
        "members": {**names, "description": "the live members it coordinates"},
    }
    member = oa.obj(
        {
            "id": oa.STR,
            "known": {
                "type": "boolean",
                "description": "central holds a document of it that says something of this "
                "site (false: only named by another member)",
            },
            "status": status,
            "state": state,
            "status_since": oa.nullable(oa.NUMBER),
            "health": {
                "type": "string",
                "enum": list(HEALTHS),
                "description": "connected: online at central; alive-in-site: offline at "
                "central, reported live on the site broker by a member central sees online "
                "(cut off from central, not dead); unconfirmed: offline, and no online member "
                "reports it live",
            },
            "seen_live_by": {
                **names,
                "description": "the members central sees online that report it live",
            },
            "vote": oa.nullable(
                oa.obj(
                    {"epoch": {"type": "integer", "minimum": 1}, "holder": oa.STR, "at": oa.NUMBER}
                )
            ),
            "lease": oa.nullable(
                oa.obj(lease, description="it coordinates the site cut off from central")
            ),
            "seen": oa.nullable(
                oa.obj(
                    {
                        "peers": {**names, "description": "the site peers it sees live"},
                        "coordinator": oa.nullable(oa.STR),
                        "epoch": {"type": "integer", "minimum": 0},
                        "since": oa.NUMBER,
                    },
                    description="what it sees on the site broker, and whose orders it follows",
                )
            ),
            "decisions": {
                "type": "integer",
                "minimum": 0,
                "description": "site decisions it runs",
            },
        }
    )
    decision = oa.obj(
        {
            "task": oa.STR,
            "node": {"type": "string", "description": "the node running it"},
            "decided_by": {"type": "string", "pattern": "^site:"},
            "coordinator": oa.STR,
            "state": oa.STR,
            "epoch": {"type": "integer", "minimum": 0},
            "replacement": oa.BOOL,
            "at": {"type": "number", "description": "when the node accepted it"},
        }
    )
    return {
        "SiteMember": member,
        "SiteDecision": decision,
        "Site": oa.obj(
            {
                "site": oa.STR,
                "bridge": oa.obj(
                    {"up": oa.BOOL, "down_since": oa.nullable(oa.NUMBER)},
                    description="the site broker's bridge to central's, as central hears it",
                ),
                "coordinator": oa.nullable(
                    oa.obj(
                        {"node": oa.STR, **lease},
                        description="the member with a lease at the highest epoch",
                    )
                ),
                "members": {"type": "array", "items": oa.ref("SiteMember")},
                "cut_off_alive": {
                    **names,
                    "description": "the members whose health is alive-in-site",
                },
                "decisions": oa.obj(
                    {
                        "total": {"type": "integer", "minimum": 0},
                        "recent": {"type": "array", "items": oa.ref("SiteDecision")},
                    },
                    description="the tasks its coordinator placed while cut off, as the nodes "
                    "running them report them: how many, and the newest first",
                ),
            },
            description="A site whose members say something of it (site_peers)",
        ),
        "SiteList": oa.obj(
            {
                "sites": {"type": "array", "items": oa.ref("Site")},
                "at": {"type": "number", "description": "central's clock"},
            }
        ),
    }


def _service_template() -> Schema:
    """A service's template: a task spec whose id is optional (each replica gets its own)
    and whose restart policy is always."""
    template = oa.task_spec_schema()
    template["required"] = ["command"]
    template["properties"] = {
        **template["properties"],
        "restart": {"type": "string", "enum": ["always"], "default": "always"},
    }
    template["description"] = (
        "The task every replica runs (a TaskSpec; its id is replaced per replica, its "
        "restart is always)"
    )
    return template


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
        "properties": {**container["properties"], "restartPolicy": oa.nullable(oa.STR)},
    }
    string_map = {"type": ["object", "null"], "additionalProperties": oa.STR}
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
                        "namespace": oa.nullable(oa.STR),
                        "uid": oa.nullable(oa.STR),
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
                        "priority": oa.nullable(oa.INT),
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
                "Pod": oa.ref("K8sPod"),
                "Nodes": {"anyOf": [oa.ref("K8sNodeList"), {"type": "null"}]},
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
        "K8sFilterResult": oa.obj(
            {
                "Nodes": {
                    "anyOf": [{"type": "object"}, {"type": "null"}],
                    "description": "the passing items (when Nodes was sent)",
                },
                "NodeNames": {
                    "type": ["array", "null"],
                    "items": oa.STR,
                    "description": "the passing names (when NodeNames was sent)",
                },
                "FailedNodes": oa.map_of(oa.STR, "node -> why (preemption may help)"),
                "FailedAndUnresolvableNodes": oa.map_of(oa.STR, "node -> why (nothing will help)"),
                "Error": oa.STR,
            },
            description="extenderv1.ExtenderFilterResult",
        ),
        "K8sHostPriorityList": {
            "type": "array",
            "description": "extenderv1.HostPriorityList, in the candidates' order",
            "items": oa.obj(
                {"Host": oa.STR, "Score": {"type": "integer", "minimum": 0, "maximum": 10}}
            ),
        },
        "K8sBindingArgs": {
            "type": "object",
            "description": "extenderv1.ExtenderBindingArgs",
            "properties": {"PodName": name, "PodNamespace": name, "PodUID": oa.STR, "Node": name},
            "required": ["PodName", "PodNamespace", "PodUID", "Node"],
        },
        "K8sBindingResult": oa.obj(
            {"Error": {"type": "string", "description": "empty: bound"}},
            description="extenderv1.ExtenderBindingResult",
        ),
    }


def _central_paths() -> dict[str, Schema]:
    read = "Any token (admin or read-only)."
    admin = "Admin token only (the read-only token gets 403)."
    tasks_tag, nodes_tag, fleet, ui, k8s = "tasks", "nodes", "fleet", "dashboard", "k8s"
    services_tag = "services"
    service_name: Schema = {
        "name": "name",
        "in": "path",
        "required": True,
        "description": "the service's name",
        "schema": {"type": "string", "minLength": 1},
    }
    k8s_note = (
        "kube-scheduler extender v1 (mounted only when `k8s_extender` is on; no token: keep it "
        "on a trusted network or behind TLS client certificates). A malformed body is 400 "
        "naming the JSON path; kube-scheduler treats any non-200 as the extender failing."
    )

    def extender(op_id: str, summary: str, args: str, result: str) -> Schema:
        op = oa.op(
            op_id,
            summary,
            k8s,
            {"200": oa.content(oa.ref(result), result), **oa.problems(400, 413)},
            description=k8s_note,
            public=True,
            body=oa.request_body(oa.ref(args), args),
        )
        op[EXTENDER_FLAG] = True
        return op

    return {
        **oa.public_paths(fleet),
        "/v1/status": {
            "get": oa.op(
                "status",
                "Central: broker link, counts, refused input by reason",
                fleet,
                {"200": oa.content(oa.ref("Status"), "central's status"), **oa.problems(401)},
                description=read,
            )
        },
        "/v1/nodes": {
            "get": oa.op(
                "listNodes",
                "Every node central holds a replica of",
                nodes_tag,
                {"200": oa.content(oa.ref("NodeList"), "nodes by id"), **oa.problems(401)},
                description=read,
            )
        },
        "/v1/nodes/{id}": {
            "get": oa.op(
                "getNode",
                "One node, with its document's content",
                nodes_tag,
                {"200": oa.content(oa.ref("NodeDetail"), "the node"), **oa.problems(401, 404)},
                description=read,
                params=[oa.path_id("node id")],
            )
        },
        "/v1/nodes/{id}/telemetry": {
            "get": oa.op(
                "nodeTelemetry",
                "A node's last hour of samples (cpu, memory, power)",
                nodes_tag,
                {
                    "200": oa.content(oa.ref("Telemetry"), "samples, oldest first"),
                    **oa.problems(400, 401, 404),
                },
                description=read + " 404 unless central holds the node's document or telemetry.",
                params=[
                    oa.path_id("node id"),
                    oa.query("since", oa.NUMBER, "only samples at or after (unix seconds)"),
                ],
            )
        },
        "/v1/tasks": {
            "get": oa.op(
                "listTasks",
                "Every task: placed by central or decided by a node, a page at a time",
                tasks_tag,
                {"200": oa.content(oa.ref("TaskList"), "by id"), **oa.problems(400, 401)},
                description=read,
                params=[
                    oa.query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": 10_000},
                        "tasks per page (default 1000)",
                    ),
                    oa.query("after", oa.STR, "the id the page starts after (next)"),
                    oa.query("phase", {"type": "string", "enum": [p.value for p in Phase]}, "only"),
                    oa.query("node", oa.STR, "only those on (or with a copy on) this node"),
                    oa.query("origin", {"type": "string", "enum": ["central", "node"]}, "only"),
                    oa.query("prefix", oa.STR, "only ids starting with this"),
                ],
            ),
            "post": oa.op(
                "submitTask",
                "Submit a task (placed now, or pending until a node can take it)",
                tasks_tag,
                {
                    "201": oa.content(oa.ref("TaskView"), "accepted, journaled to SQLite"),
                    **oa.problems(400, 401, 403, 409, 413, 422, 503),
                },
                description=admin + " Bodies up to 64 KiB. 409: the id is taken; 422: the "
                "pinned node is not known to central.",
                body=oa.request_body(oa.ref("TaskSubmission"), "the task"),
            ),
        },
        "/v1/tasks/{id}": {
            "get": oa.op(
                "getTask",
                "One task (placed by central or decided by a node)",
                tasks_tag,
                {"200": oa.content(oa.ref("TaskView"), "the task"), **oa.problems(401, 404)},
                description=read,
                params=[oa.path_id("task id")],
            ),
            "delete": oa.op(
                "cancelTask",
                "Cancel a task (its node stops it when it hears)",
                tasks_tag,
                {
                    "200": oa.content(oa.ref("TaskView"), "cancelled (idempotent)"),
                    **oa.problems(401, 403, 404, 409, 503),
                },
                description=admin + " 409: the task has already finished, or a node "
                "decided it (cancel it at that node).",
                params=[oa.path_id("task id")],
            ),
        },
        "/v1/history": {
            "get": oa.op(
                "listHistory",
                "Finished tasks from central's history (SQLite), newest first",
                tasks_tag,
                {"200": oa.content(oa.ref("History"), "a page"), **oa.problems(400, 401)},
                description=read + " Every task central placed or a node decided, once it "
                "exited, failed or was cancelled; kept past the documents' retention.",
                params=[
                    oa.query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": 1000},
                        "rows per page (default 100)",
                    ),
                    oa.query("before_at", oa.NUMBER, "the page starts after (next.before_at)"),
                    oa.query("before_id", oa.STR, "with before_at (next.before_id)"),
                    oa.query(
                        "phase",
                        {"type": "string", "enum": ["exited", "failed", "cancelled"]},
                        "only",
                    ),
                    oa.query("node", oa.STR, "only those that ran on this node"),
                    oa.query("origin", {"type": "string", "enum": ["central", "node"]}, "only"),
                    oa.query("workload", oa.STR, "only this workload class"),
                    oa.query("since", oa.NUMBER, "finished at or after (unix seconds)"),
                    oa.query("until", oa.NUMBER, "finished before (unix seconds)"),
                ],
            )
        },
        "/v1/tasks/{id}/logs": {
            "get": oa.op(
                "getTaskLogs",
                "A task's output (stdout and stderr), read from its node over MQTT",
                tasks_tag,
                {
                    "200": {
                        **oa.content(oa.STR, "the lines (chunked with follow)", "text/plain"),
                        "headers": {
                            "X-Edgesched-Node": {
                                "description": "the node the lines come from",
                                "schema": oa.STR,
                            }
                        },
                    },
                    **oa.problems(400, 401, 404, 409),
                    "429": oa.content(
                        oa.ref("Problem"),
                        "Central has 4 log streams open to the node, or the node serves 4",
                        "application/problem+json",
                    ),
                    "502": oa.content(
                        oa.ref("Problem"),
                        "The node refused the request",
                        "application/problem+json",
                    ),
                    "503": oa.content(
                        oa.obj(
                            {**oa.problem_schema()["properties"], "node": oa.STR},
                            required=["type", "title", "status", "detail"],
                        ),
                        "The node is unreachable (the detail names it and says why: not "
                        "connected as central's liveness has it, or no answer within 5 s), or "
                        "the store cannot be read",
                        "application/problem+json",
                    ),
                },
                description=read + " The node holding the task (the one running a copy, "
                "else the task's node) is asked over MQTT. 404: no such task at central, or "
                "the node holds none, or no log; 409: on no node yet. Without follow the "
                "answer is read whole (at most 8 MiB) before it is sent; with follow it is "
                "streamed until the task has finished (or 30 min), and a node lost meanwhile "
                "cuts the connection (an incomplete chunked body).",
                params=[
                    oa.path_id("task id"),
                    *oa.logs_query(["0", "1", "true", "false"]),
                ],
            ),
        },
        "/v1/tasks/{id}/migrate": {
            "post": oa.op(
                "migrateTask",
                "Move an active task: placed on the target with a new epoch, a stop "
                "order for the copy it leaves",
                tasks_tag,
                {
                    "200": oa.content(oa.ref("TaskView"), "placed on the target"),
                    **oa.problems(400, 401, 403, 404, 409, 413, 422, 503),
                },
                description=admin + " 409: the task is not active, or already on the target; "
                "422: the target cannot take it (unknown, offline, too small).",
                params=[oa.path_id("task id")],
                body=oa.request_body(oa.ref("Migration"), "the target node"),
            )
        },
        "/v1/services": {
            "get": oa.op(
                "listServices",
                "Every service, with its replicas' counts by phase",
                services_tag,
                {"200": oa.content(oa.ref("ServiceList"), "by name"), **oa.problems(401)},
                description=read,
            ),
            "post": oa.op(
                "applyService",
                "Create a service, or change it (a new template rolls out; a new count scales)",
                services_tag,
                {
                    "200": oa.content(oa.ref("ServiceView"), "changed, journaled"),
                    "201": oa.content(oa.ref("ServiceView"), "created, journaled"),
                    **oa.problems(400, 401, 403, 409, 413, 422, 503),
                },
                description=admin + " 409: the service is being deleted; 422: central holds "
                "its most services.",
                body=oa.request_body(oa.ref("ServiceSpec"), "the service"),
            ),
        },
        "/v1/services/{name}": {
            "get": oa.op(
                "getService",
                "One service: each replica's slot, revision, phase and node",
                services_tag,
                {"200": oa.content(oa.ref("ServiceView"), "the service"), **oa.problems(401, 404)},
                description=read,
                params=[service_name],
            ),
            "delete": oa.op(
                "deleteService",
                "Stop every replica; the service goes once none runs",
                services_tag,
                {
                    "200": oa.content(oa.ref("ServiceView"), "being deleted"),
                    **oa.problems(401, 403, 404, 503),
                },
                description=admin,
                params=[service_name],
            ),
        },
        "/v1/services/{name}/scale": {
            "post": oa.op(
                "scaleService",
                "Set a service's replica count (within its min and max)",
                services_tag,
                {
                    "200": oa.content(oa.ref("ServiceView"), "scaled, journaled"),
                    **oa.problems(400, 401, 403, 404, 413, 422, 503),
                },
                description=admin + " 422: outside [min, max].",
                params=[service_name],
                body=oa.request_body(oa.ref("Scale"), "the count"),
            )
        },
        "/v1/services/{name}/load": {
            "post": oa.op(
                "reportServiceLoad",
                "Report the load a service serves now (cores): its autoscaler's signal",
                services_tag,
                {
                    "200": oa.content(oa.ref("LoadReport"), "recorded"),
                    **oa.problems(400, 401, 403, 404, 413, 503),
                },
                description=admin + " From whatever measures the service (a metrics "
                "adapter, the service itself); a report older than 5 minutes is not acted on.",
                params=[service_name],
                body=oa.request_body(oa.ref("Load"), "the load"),
            )
        },
        "/v1/events": {
            "get": oa.op(
                "listEvents",
                "The fleet's timeline: the last events, of some kinds, or only the notable",
                fleet,
                {"200": oa.content(oa.ref("EventList"), "oldest first"), **oa.problems(400, 401)},
                description=read + " Notable events (all but placed and pruned) are kept in "
                "a ring of their own, so a burst of placements never pushes them out.",
                params=[
                    oa.query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": 2000},
                        "events (default 1000)",
                    ),
                    oa.query("kind", oa.STR, "comma-separated kinds (node-offline,failover)"),
                    oa.query("notable", {"type": "string", "enum": ["0", "1"]}, "only notable"),
                ],
            )
        },
        "/v1/fleet": {
            "get": oa.op(
                "getFleet",
                "The fleet over the day: utilization, power, energy, demand and forecast",
                fleet,
                {"200": oa.content(oa.ref("Fleet"), "a point a minute"), **oa.problems(400, 401)},
                description=read + " The last 24 hours, a point a minute, from central's "
                "5-second samples (kept in memory: a restart starts the day's series over).",
                params=[oa.query("since", oa.NUMBER, "only points from (unix seconds)")],
            )
        },
        "/v1/policy": {
            "get": oa.op(
                "getPolicy",
                "The fleet policy: mode and tidal profile",
                fleet,
                {"200": oa.content(oa.ref("Policy"), "the policy"), **oa.problems(401)},
                description=read,
            ),
            "post": oa.op(
                "setPolicy",
                "Switch the mode and/or the tidal profile; every node follows",
                fleet,
                {
                    "200": oa.content(oa.ref("Policy"), "the policy now"),
                    **oa.problems(400, 401, 403, 413, 422, 503),
                },
                description=admin + " Kept in the policy document: it survives a restart.",
                body=oa.request_body(oa.ref("PolicyUpdate"), "what to switch"),
            ),
        },
        "/v1/models": {
            "get": oa.op(
                "getModels",
                "The ONNX models: what central runs, what it published, what nodes run",
                fleet,
                {"200": oa.content(oa.ref("Models"), "the models"), **oa.problems(401)},
                description=read,
            )
        },
        "/v1/sites": {
            "get": oa.op(
                "listSites",
                "Each site: members, coordinator, decisions made while cut off",
                nodes_tag,
                {"200": oa.content(oa.ref("SiteList"), "by name"), **oa.problems(400, 401)},
                description=read + " From central's site index (each member's own document: "
                "its vote, its lease while it coordinates, the peers it sees live on the site "
                "broker). Reporting only: central's failover does not read it.",
                params=[
                    oa.query(
                        "decisions",
                        {"type": "integer", "minimum": 0, "maximum": MAX_DECISIONS_SHOWN},
                        f"site decisions shown per site, newest first (default {DECISIONS_SHOWN})",
                    )
                ],
            )
        },
        "/v1/models/{kind}": {
            "put": oa.op(
                "putModel",
                "Publish an ONNX model for the whole fleet (forecast or placement)",
                fleet,
                {
                    "200": oa.content(oa.ref("Models"), "the models now"),
                    **oa.problems(400, 401, 403, 404, 413, 422, 503),
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
                    oa.query("name", {"type": "string", "maxLength": 128}, "a display name"),
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
            "get": oa.op(
                "metrics",
                "Prometheus metrics",
                fleet,
                {"200": oa.TEXT, **oa.problems(401)},
                description=read[:-1] + ", or the scrape-only metrics-token (<state_dir>/"
                "metrics-token), which every other route refuses (403). Series and units: "
                "docs/metrics.md.",
            )
        },
        "/": {
            "get": oa.op(
                "root",
                "Redirect to the dashboard",
                ui,
                {"302": {"description": "to /dashboard/"}},
                public=True,
            )
        },
        "/dashboard": {
            "get": oa.op(
                "dashboardRedirect",
                "Redirect to the dashboard",
                ui,
                {"302": {"description": "to /dashboard/"}},
                public=True,
            )
        },
        "/favicon.ico": {
            "get": oa.op(
                "favicon",
                "The dashboard's icon (an SVG, whatever the name says)",
                ui,
                {"200": oa.content(oa.STR, "the icon", "image/svg+xml"), **oa.problems(404)},
                public=True,
            )
        },
        "/dashboard/": {
            "get": oa.op(
                "dashboard",
                "The dashboard page (holds no data; the token goes in its URL "
                "fragment, #token=...)",
                ui,
                {"200": oa.content(oa.STR, "the page", "text/html")},
                public=True,
            )
        },
        "/dashboard/{file}": {
            "get": oa.op(
                "dashboardAsset",
                "One of the dashboard's shipped files, by exact name",
                ui,
                {
                    "200": {
                        "description": "the file",
                        "content": {
                            t: {"schema": oa.STR}
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
                    **oa.problems(404),
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
            "get": oa.op(
                "stream",
                "Server-Sent Events: a fleet snapshot now and every second",
                ui,
                {
                    "200": oa.content(
                        oa.STR,
                        "`event: snapshot` frames (data: one JSON object: status, "
                        "policy, nodes, tasks, node_tasks, events, at), keep-alive comments",
                        "text/event-stream",
                    ),
                    **oa.problems(401, 503),
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
        "openapi": oa.OPENAPI_VERSION,
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
            {"name": "services", "description": "replicas of a template kept at their count"},
            {"name": "dashboard"},
            {"name": "k8s", "description": "kube-scheduler extender v1 (when enabled)"},
        ],
        "paths": _central_paths(),
        "components": {
            "schemas": _central_schemas(),
            "responses": oa.problem_responses(_CENTRAL_PROBLEMS),
            "securitySchemes": {**oa.SECURITY_SCHEMES, "tokenQuery": oa.TOKEN_QUERY},
        },
    }


# --- handlers -----------------------------------------------------------------------------------

_CACHE: dict[str, Schema] = {}


async def serve_central(request: web.Request) -> web.Response:
    """``GET /v1/openapi.json`` on central."""
    doc = _CACHE.get("central") or _CACHE.setdefault("central", central_document())
    return web.json_response(doc)
