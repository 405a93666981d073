"""Central's HTTP API (aiohttp): the fleet as central sees it.

Every route except ``/v1/health`` needs ``Authorization: Bearer <token>`` with the token
from ``<state_dir>/api-token`` (created 0600 at first start). Errors are RFC 9457 problem
details naming what is wrong.

    GET /v1/health          liveness, no token
    GET /v1/status          central: broker link, counts, refused input by reason
    GET /v1/nodes           every node: status, registration, document epoch and hash, tasks
    GET /v1/nodes/{id}      one node, with its document's content
    GET    /v1/tasks        tasks submitted at central: assignment and the copies nodes report
    GET    /v1/tasks/{id}
    POST   /v1/tasks        submit (TaskSpec JSON, optional "node" to pin it); 201 once journaled
    DELETE /v1/tasks/{id}   cancel (the node stops it when it hears)
    GET    /v1/events       the fleet's timeline: nodes on/offline, placements, failovers, merges
    GET /metrics            Prometheus text format
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from edgesched.edge.api import (
    TOKEN_KEY,
    BodyError,
    guard,
    json_body,
    load_or_create_token,
    problem,
    start_app,
)
from edgesched.edge.spec import SpecError, TaskSpec

if TYPE_CHECKING:
    from edgesched.central.engine import CentralEngine

MAX_BODY_BYTES = 64 * 1024
CENTRAL_KEY = web.AppKey("central", object)


def _central(request: web.Request) -> CentralEngine:
    engine: CentralEngine = request.app[CENTRAL_KEY]  # type: ignore[assignment]
    return engine


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def status(request: web.Request) -> web.Response:
    return web.json_response(_central(request).status())


async def nodes(request: web.Request) -> web.Response:
    engine = _central(request)
    return web.json_response(
        {"nodes": [engine.node_summary(n) for n in sorted(engine.replicas.replicas)]}
    )


async def node(request: web.Request) -> web.Response:
    engine = _central(request)
    node_id = request.match_info["id"]
    replica = engine.replicas.replicas.get(node_id)
    if replica is None:
        return problem(404, "Not Found", f"no node {node_id!r} is known to central", "id")
    body = engine.node_summary(node_id)
    body["content"] = replica.doc.to_json()
    return web.json_response(body)


async def list_tasks(request: web.Request) -> web.Response:
    engine = _central(request)
    policy = engine.policy
    assignments = {} if policy is None else policy.assignments()
    return web.json_response(
        {"tasks": [engine.task_view(t, e) for t, e in sorted(assignments.items())]}
    )


async def get_task(request: web.Request) -> web.Response:
    engine = _central(request)
    task_id = request.match_info["id"]
    entry = None if engine.policy is None else engine.policy.assignment(task_id)
    if entry is None:
        return problem(404, "Not Found", f"no task {task_id!r}", "id")
    return web.json_response(engine.task_view(task_id, entry))


async def submit(request: web.Request) -> web.Response:
    from edgesched.central.engine import TaskRefused

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


async def cancel(request: web.Request) -> web.Response:
    from edgesched.central.engine import TaskRefused

    try:
        view = await _central(request).cancel(request.match_info["id"])
    except TaskRefused as exc:
        return problem(exc.status, "Cannot cancel", exc.message, exc.field)
    return web.json_response(view)


async def events(request: web.Request) -> web.Response:
    engine = _central(request)
    return web.json_response({"events": [e.to_json() for e in engine.events]})


async def metrics(request: web.Request) -> web.Response:
    engine = _central(request)
    engine.refresh_metrics()
    return web.Response(body=engine.metrics.render(), content_type="text/plain", charset="utf-8")


def build_app(engine: CentralEngine, token: str) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=MAX_BODY_BYTES)
    app[CENTRAL_KEY] = engine
    app[TOKEN_KEY] = token
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/nodes", nodes)
    app.router.add_get("/v1/nodes/{id}", node)
    app.router.add_get("/v1/tasks", list_tasks)
    app.router.add_post("/v1/tasks", submit)
    app.router.add_get("/v1/tasks/{id}", get_task)
    app.router.add_delete("/v1/tasks/{id}", cancel)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(engine: CentralEngine, host: str, port: int) -> web.AppRunner:
    """Start the API; the bound port (useful with port 0) lands in ``engine.api_port``."""
    token = load_or_create_token(engine.state_dir)
    runner, engine.api_port = await start_app(
        build_app(engine, token), engine.state_dir, host, port
    )
    return runner
