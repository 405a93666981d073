"""Central's HTTP API (aiohttp): the fleet as central sees it, and how to steer it.

Three tokens, created 0600 in ``<state_dir>`` at first start: ``api-token`` (admin: every
route), ``api-token-read`` (read-only: GET routes) and ``metrics-token`` (``GET /metrics`` only,
for Prometheus: docs/metrics.md). Send ``Authorization: Bearer <token>``; a
browser's ``EventSource``, which cannot set headers, may pass ``?token=`` instead. Public:
``/v1/health``, the dashboard's page and assets, and (when ``k8s_extender`` is on) the
kube-scheduler extender under ``/v1/k8s``, which kube-scheduler calls without a token (keep it
on a trusted network or behind TLS client certificates). Errors are RFC 9457 problem details
naming what is wrong.

    GET /v1/health          liveness, no token
    GET /v1/status          central: broker link, counts, refused input by reason
    GET /v1/nodes           every node: status, registration, document epoch and hash, tasks
    GET /v1/nodes/{id}      one node, with its document's content
    GET /v1/nodes/{id}/telemetry[?since=unix]   its last hour of samples (cpu, mem, power)
    GET    /v1/tasks        tasks submitted at central: assignment and the copies nodes report
    GET    /v1/tasks/{id}
    GET    /v1/tasks/{id}/logs[?tail=N&follow=1]   its output, read from its node over MQTT
    POST   /v1/tasks        submit (TaskSpec JSON, optional "node" to pin it); 201 once journaled
    DELETE /v1/tasks/{id}   cancel (the node stops it when it hears)
    POST   /v1/tasks/{id}/migrate   move it ({"node": target}): placed there, stopped here
    GET    /v1/events       the fleet's timeline: nodes on/offline, placements, failovers, merges
    GET    /v1/fleet        the day, a point a minute: utilization, power, energy, demand,
                            the forecast, the tidal window and each class's share
    GET    /v1/policy       the fleet policy: mode and tidal profile
    POST   /v1/policy       switch them ({"mode": ..., "tidal_profile": ...}); nodes follow
    GET    /v1/models       the ONNX models: central's, the published ones, each node's
    PUT    /v1/models/{kind}[?name=]   publish a .onnx file (body) for the fleet: checked first
    GET    /v1/sites[?decisions=N]   each site: its members (central's liveness of each, their
                            vote, lease, what they see), its coordinator, the decisions it
                            made while cut off, and which offline members it sees alive
    POST   /v1/k8s/filter | prioritize | bind   kube-scheduler extender v1 (if enabled)
    GET /metrics            Prometheus text format (any of the three tokens)
"""

from __future__ import annotations

import hmac
import math
from typing import Any

from aiohttp import web

from edgesched.central import dashboard, extender, tasklist
from edgesched.central.engine import CentralEngine, TaskRefused
from edgesched.central.logsproxy import add_routes as add_logs_routes
from edgesched.central.openapi import serve_central
from edgesched.central.serviceapi import add_routes as add_service_routes
from edgesched.central.sites import DECISIONS_SHOWN, MAX_DECISIONS_SHOWN, MemberLiveness
from edgesched.core.lifecycle import Phase
from edgesched.core.task import SpecError, TaskSpec
from edgesched.policies.models import KINDS, MAX_MODEL_BYTES
from edgesched.rest.server import (
    METRICS_TOKEN_FILE,
    METRICS_TOKEN_KEY,
    BodyError,
    answer,
    json_body,
    load_or_create_token,
    metrics_token_refusal,
    problem,
    start_app,
)

#: The extender's NodeLists and pods with managedFields exceed our own bodies' 64 KiB cap.
MAX_REQUEST_BYTES = 4 << 20
CENTRAL_KEY = web.AppKey("central", CentralEngine)
TOKENS_KEY = web.AppKey("tokens", tuple[str, str])  # (admin, read-only)
PUBLIC_PREFIXES = ("/dashboard", "/v1/k8s/")
PUBLIC_PATHS = frozenset({"/", "/favicon.ico", "/v1/health", "/v1/openapi.json"})


def _token_of(request: web.Request) -> str:
    sent = request.headers.get("Authorization", "")
    if sent.startswith("Bearer "):
        return sent[len("Bearer ") :]
    return request.query.get("token", "")


def _matches(sent: str, token: str) -> bool:
    return bool(sent) and hmac.compare_digest(sent.encode(), token.encode())


@web.middleware
async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """Token check (read-only or admin), then problem details for every error."""
    public = request.path in PUBLIC_PATHS or request.path.startswith(PUBLIC_PREFIXES)
    if not public:
        admin, read = request.app[TOKENS_KEY]
        sent = _token_of(request)
        if _matches(sent, admin):
            pass
        elif _matches(sent, read):
            if request.method not in ("GET", "HEAD"):
                return problem(403, "Forbidden", "the read-only token cannot change anything")
        else:  # the metrics token on GET /metrics, or a 403 (that token elsewhere) or a 401
            refusal = metrics_token_refusal(request, sent)
            if refusal is not None:
                return refusal
    return await answer(request, handler)


def _central(request: web.Request) -> CentralEngine:
    return request.app[CENTRAL_KEY]


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def status(request: web.Request) -> web.Response:
    engine = _central(request)
    # (the broker link's state: docs/troubleshooting.md)
    return web.json_response({**engine.status(), "broker": engine.session.link.report()})


async def nodes(request: web.Request) -> web.Response:
    engine = _central(request)
    return web.json_response({"nodes": engine.node_summaries()})


async def node(request: web.Request) -> web.Response:
    engine = _central(request)
    node_id = request.match_info["id"]
    replica = engine.replicas.replicas.get(node_id)
    if replica is None:
        return problem(404, "Not Found", f"no node {node_id!r} is known to central", "id")
    body = engine.node_summary(node_id)
    body["content"] = replica.doc.readable()
    return web.json_response(body)


async def node_telemetry(request: web.Request) -> web.Response:
    engine = _central(request)
    node_id = request.match_info["id"]
    try:
        since = float(request.query.get("since", "0"))
    except ValueError:
        return problem(400, "Bad query", "since must be a number (unix seconds)", "since")
    if node_id not in engine.replicas.replicas and node_id not in engine.telemetry.series:
        return problem(404, "Not Found", f"no node {node_id!r} is known to central", "id")
    samples = engine.telemetry.samples(node_id, since)
    return web.json_response({"node": node_id, "samples": [s.to_json() for s in samples]})


#: The most tasks one page of ``GET /v1/tasks`` holds (``limit``; 1,000 by default).
MAX_TASKS_PAGE = 10_000
_ORIGINS = ("central", "node")


async def list_tasks(request: web.Request) -> web.Response:
    """Every task central knows, placed by it or decided by a node, in id order, a page at a
    time: ``limit`` (1-10,000, default 1,000), ``after`` (the last id of the page before: the
    answer's ``next``), filtered by ``phase``, ``node``, ``origin`` and id ``prefix``; a
    filtered page may hold fewer than ``limit`` while ``next`` is set (:mod:`tasklist`)."""
    engine = _central(request)
    if engine.fleet is not None:
        engine.sync_index()
    query = request.query
    try:
        limit = int(query.get("limit", "1000"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_TASKS_PAGE:
        return problem(400, "Bad query", f"must be an integer in 1..{MAX_TASKS_PAGE}", "limit")
    phase = query.get("phase")
    if phase is not None and phase not in {p.value for p in Phase}:
        return problem(400, "Bad query", "one of " + ", ".join(p.value for p in Phase), "phase")
    origin = query.get("origin")
    if origin is not None and origin not in _ORIGINS:
        return problem(400, "Bad query", "central or node", "origin")
    ids = engine.task_ids()
    found = tasklist.page(
        ids,
        tasklist.TaskQuery(
            limit=limit,
            after=query.get("after") or None,
            phase=phase,
            origin=origin,
            node=query.get("node") or None,
            prefix=query.get("prefix") or None,
        ),
        engine.any_task_view,
        engine.node_task_ids,
    )
    return web.json_response(
        {"tasks": found.tasks, "next": found.next, "scanned": found.scanned, "total": len(ids)}
    )


async def history(request: web.Request) -> web.Response:
    """Finished tasks from central's SQLite history, newest first, a page at a time
    (``limit`` 1-1,000, default 100; ``before_at`` and ``before_id``: the answer's ``next``),
    filtered by ``phase``, ``node``, ``origin``, ``workload`` and ``since``/``until`` (unix
    seconds, on when they finished)."""
    query = request.query
    numbers: dict[str, float | None] = {}
    for name in ("since", "until", "before_at"):
        raw = query.get(name)
        try:
            value = None if raw is None else float(raw)
        except ValueError:
            value = math.nan
        if value is not None and not math.isfinite(value):
            return problem(400, "Bad query", "must be a number (unix seconds)", name)
        numbers[name] = value
    try:
        limit = int(query.get("limit", "100"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 1000:
        return problem(400, "Bad query", "must be an integer in 1..1000", "limit")
    phase = query.get("phase")
    if phase is not None and phase not in ("exited", "failed", "cancelled"):
        return problem(400, "Bad query", "exited, failed or cancelled", "phase")
    origin = query.get("origin")
    if origin is not None and origin not in _ORIGINS:
        return problem(400, "Bad query", "central or node", "origin")
    before_at = numbers["before_at"]  # (before_id only orders the rows finished at it)
    engine = _central(request)
    await engine.record_history()  # what finished since the last pass, first
    rows = await engine.store.finished_tasks(
        phase=phase,
        node=query.get("node"),
        origin=origin,
        workload=query.get("workload"),
        since=numbers["since"],
        until=numbers["until"],
        before=None if before_at is None else (before_at, query.get("before_id", "")),
        limit=limit,
    )
    last = rows[-1] if len(rows) == limit else None
    next_page = (
        None if last is None else {"before_at": last["finished_at"], "before_id": last["id"]}
    )
    return web.json_response({"tasks": rows, "next": next_page})


async def get_task(request: web.Request) -> web.Response:
    engine = _central(request)
    task_id = request.match_info["id"]
    entry = None if engine.fleet is None else engine.fleet.assignment(task_id)
    if entry is not None:
        return web.json_response(engine.task_view(task_id, entry))
    engine.sync_index()
    view = engine.any_task_view(task_id)
    if view is None:
        return problem(404, "Not Found", f"no task {task_id!r}", "id")
    return web.json_response(view)


async def submit(request: web.Request) -> web.Response:
    try:
        body = await json_body(request)
    except BodyError as exc:
        return exc.response()
    if not isinstance(body, dict):
        return problem(400, "Task refused", "expected a JSON object", "body")
    pin = body.pop("node", None)
    if pin is not None and not isinstance(pin, str):
        return problem(400, "Task refused", "must be a node id (a string)", "node")
    try:
        spec = TaskSpec.from_json(body)
    except SpecError as exc:
        field, _, message = str(exc).partition(": ")
        return problem(400, "Task refused", message or str(exc), field)
    try:
        view = await _central(request).submit(spec, pin)
    except TaskRefused as exc:
        return problem(exc.status, "Task refused", exc.message, exc.field)
    return web.json_response(view, status=201)


async def migrate(request: web.Request) -> web.Response:
    try:
        body = await json_body(request)
    except BodyError as exc:
        return exc.response()
    if not isinstance(body, dict) or set(body) != {"node"} or not isinstance(body["node"], str):
        return problem(400, "Cannot migrate", 'expected {"node": "<target node id>"}', "node")
    try:
        view = await _central(request).migrate(request.match_info["id"], body["node"])
    except TaskRefused as exc:
        return problem(exc.status, "Cannot migrate", exc.message, exc.field)
    return web.json_response(view)


async def cancel(request: web.Request) -> web.Response:
    try:
        view = await _central(request).cancel(request.match_info["id"])
    except TaskRefused as exc:
        return problem(exc.status, "Cannot cancel", exc.message, exc.field)
    return web.json_response(view)


async def fleet(request: web.Request) -> web.Response:
    """The fleet over the day: a point a minute (``since``: unix seconds) and now."""
    engine = _central(request)
    try:
        since = float(request.query.get("since", "0"))
    except ValueError:
        since = math.nan
    if not math.isfinite(since):
        return problem(400, "Bad query", "must be a number (unix seconds)", "since")
    series = engine.fleet_series
    return web.json_response(
        {
            "now": series.now(),
            "series": series.series(since),
            "point_s": series.point_s,
            "policy": engine.policy_view(),
        }
    )


#: The most events one ``GET /v1/events`` returns (``limit``).
MAX_EVENTS_PAGE = 2_000


async def events(request: web.Request) -> web.Response:
    """The fleet's timeline, oldest first: the last ``limit`` (default 1,000) events, of the
    comma-separated ``kind`` if given; ``notable=1``: only those kept apart from the
    routine placements (:data:`~edgesched.central.engine.ROUTINE_EVENTS`)."""
    engine = _central(request)
    query = request.query
    try:
        limit = int(query.get("limit", "1000"))
    except ValueError:
        limit = -1
    if not 1 <= limit <= MAX_EVENTS_PAGE:
        return problem(400, "Bad query", f"must be an integer in 1..{MAX_EVENTS_PAGE}", "limit")
    raw = query.get("kind")
    kinds = None if not raw else frozenset(k for k in raw.split(",") if k)
    notable = query.get("notable", "0")
    if notable not in ("0", "1", "true", "false"):
        return problem(400, "Bad query", "0 or 1", "notable")
    found = engine.recent_events(limit, kinds, notable=notable in ("1", "true"))
    return web.json_response({"events": [e.to_json() for e in found]})


async def get_policy(request: web.Request) -> web.Response:
    return web.json_response(_central(request).policy_view())


async def set_policy(request: web.Request) -> web.Response:
    try:
        body = await json_body(request)
    except BodyError as exc:
        return exc.response()
    if not isinstance(body, dict) or not body:
        return problem(400, "Policy refused", "expected an object with mode and/or tidal_profile")
    unknown = sorted(set(body) - {"mode", "tidal_profile"})
    if unknown:
        return problem(400, "Policy refused", "unknown field", unknown[0])
    for key in ("mode", "tidal_profile"):
        if key in body and not isinstance(body[key], str):
            return problem(400, "Policy refused", "must be a string", key)
    try:
        view = await _central(request).set_policy(body.get("mode"), body.get("tidal_profile"))
    except TaskRefused as exc:
        return problem(exc.status, "Policy refused", exc.message, exc.field)
    return web.json_response(view)


async def get_models(request: web.Request) -> web.Response:
    return web.json_response(_central(request).models_view())


async def put_model(request: web.Request) -> web.Response:
    kind = request.match_info["kind"]
    if kind not in KINDS:
        return problem(404, "No such model kind", f"one of {', '.join(KINDS)}", "kind")
    name = request.query.get("name", "")
    if len(name) > 128:
        return problem(400, "Model refused", "at most 128 characters", "name")
    if request.content_length is not None and request.content_length > MAX_MODEL_BYTES:
        return problem(413, "Model refused", f"at most {MAX_MODEL_BYTES} bytes", "body")
    data = await request.read()
    if len(data) > MAX_MODEL_BYTES:
        return problem(413, "Model refused", f"at most {MAX_MODEL_BYTES} bytes", "body")
    try:
        view = await _central(request).set_model(kind, data, name)
    except TaskRefused as exc:
        return problem(exc.status, "Model refused", exc.message, exc.field)
    return web.json_response(view)


def _member_liveness(engine: CentralEngine, node_id: str) -> MemberLiveness:
    status = engine.liveness.nodes.get(node_id)
    return MemberLiveness(
        engine.liveness.state(node_id),
        engine.node_state(node_id),
        None if status is None else status.since,
    )


async def sites(request: web.Request) -> web.Response:
    """Each autonomous site, from central's site index (:mod:`edgesched.central.sites`): its
    members, its coordinator, the newest ``decisions`` (0-1,000, default 20) of the tasks its
    coordinator placed while cut off, and the members central sees offline that an online
    member reports live in the site. O(the sites' members + the decisions shown)."""
    engine = _central(request)
    try:
        limit = int(request.query.get("decisions", str(DECISIONS_SHOWN)))
    except ValueError:
        limit = -1
    if not 0 <= limit <= MAX_DECISIONS_SHOWN:
        return problem(
            400, "Bad query", f"must be an integer in 0..{MAX_DECISIONS_SHOWN}", "decisions"
        )
    if engine.fleet is not None:
        engine.sync_index()
    found = engine.sites.view(
        lambda node_id: _member_liveness(engine, node_id), engine.liveness.sites_down, limit
    )
    return web.json_response({"sites": found, "at": engine.clock()})


async def metrics(request: web.Request) -> web.Response:
    engine = _central(request)
    engine.refresh_metrics()
    return web.Response(body=engine.metrics.render(), content_type="text/plain", charset="utf-8")


def build_app(
    engine: CentralEngine, admin_token: str, read_token: str, metrics_token: str = ""
) -> web.Application:
    """The API: ``metrics_token`` (none if empty) reads /metrics only."""
    app = web.Application(middlewares=[guard], client_max_size=MAX_REQUEST_BYTES)
    app[CENTRAL_KEY] = engine
    app[TOKENS_KEY] = (admin_token, read_token)
    app[METRICS_TOKEN_KEY] = metrics_token
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/openapi.json", serve_central)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/nodes", nodes)
    app.router.add_get("/v1/nodes/{id}", node)
    app.router.add_get("/v1/nodes/{id}/telemetry", node_telemetry)
    app.router.add_get("/v1/tasks", list_tasks)
    app.router.add_post("/v1/tasks", submit)
    app.router.add_get("/v1/tasks/{id}", get_task)
    app.router.add_get("/v1/history", history)
    app.router.add_delete("/v1/tasks/{id}", cancel)
    app.router.add_post("/v1/tasks/{id}/migrate", migrate)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/fleet", fleet)
    app.router.add_get("/v1/policy", get_policy)
    app.router.add_post("/v1/policy", set_policy)
    app.router.add_get("/v1/models", get_models)
    app.router.add_put("/v1/models/{kind}", put_model)
    app.router.add_get("/v1/sites", sites)
    app.router.add_get("/metrics", metrics)
    dashboard.add_routes(app, engine)
    add_logs_routes(app, engine)  # GET /v1/tasks/{id}/logs, from the node over MQTT
    add_service_routes(app, engine)  # /v1/services
    if engine.central.k8s_extender:
        for method, path, handler in extender.routes(
            get_fleet=engine.fleet_nodes,
            get_policy=lambda: engine.config.policy,
            get_placements=engine.fleet_placements,
        ):
            app.router.add_route(method, path, handler)
    return app


async def serve(engine: CentralEngine) -> web.AppRunner:
    """Start the API on ``[central] api_host:api_port``; the bound port (useful with port 0)
    lands in ``engine.api_port``."""
    host, port = engine.central.api_host, engine.central.api_port
    admin = load_or_create_token(engine.state_dir)
    read = load_or_create_token(engine.state_dir, "api-token-read")
    scrape = load_or_create_token(engine.state_dir, METRICS_TOKEN_FILE)
    runner, engine.api_port = await start_app(
        build_app(engine, admin, read, scrape), engine.state_dir, host, port
    )
    return runner
