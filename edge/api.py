"""The edge node's local HTTP API (aiohttp), for people and tools on the gateway itself.

Loopback by default. Every route except ``/v1/health`` needs ``Authorization: Bearer <token>``
with the token from ``<state_dir>/api-token`` (created 0600 at first start). ``GET /metrics``
also takes the scrape-only token of ``<state_dir>/metrics-token`` (created alike), which every
other route refuses (403): give Prometheus that one (docs/metrics.md). Errors are RFC 9457
problem details (``application/problem+json``) naming the field; a bad body is a 4xx, never a
500.

    GET    /v1/health              liveness, no token
    GET    /v1/status              node, mode, link, hardware
    GET    /v1/tasks[?state=...]   task records
    GET    /v1/tasks/{id}
    POST   /v1/tasks               submit (TaskSpec JSON); 201 once committed to SQLite
    DELETE /v1/tasks/{id}          cancel
    GET    /v1/tasks/{id}/logs     its output: the last ?tail=N lines, ?follow=1 then more
    GET    /v1/decisions[?task=..] recent decisions with their reasons
    GET    /metrics                Prometheus text format (api-token or metrics-token)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from edgesched.core.task import TaskRecord, TaskState
from edgesched.edge.engine import EdgeEngine, SubmitError, parse_submission
from edgesched.edge.logserve import read_from, tail_lines
from edgesched.edge.openapi import serve_edge
from edgesched.rest.server import (
    MAX_BODY_BYTES,
    METRICS_TOKEN_FILE,
    METRICS_TOKEN_KEY,
    TOKEN_KEY,
    BodyError,
    json_body,
    load_or_create_token,
    problem,
    start_app,
    token_guard,
)
from edgesched.sync.session import BrokerLink

ENGINE_KEY = web.AppKey("engine", EdgeEngine)


def record_json(r: TaskRecord) -> dict[str, Any]:
    return {
        "id": r.spec.id,
        "state": r.state.value,
        "spec": r.spec.to_json(),
        "submitted_at": r.submitted_at,
        "updated_at": r.updated_at,
        "decided_by": r.decided_by,
        "node": r.node_id,
        "pid": r.pid,
        "cores": list(r.cores),
        "restarts": r.restarts,
        "exit_code": r.exit_code,
        "reason": r.reason,
    }


def _engine(request: web.Request) -> EdgeEngine:
    return request.app[ENGINE_KEY]


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def status(request: web.Request) -> web.Response:
    engine = _engine(request)
    return web.json_response({**engine.status(), "broker": broker_link(engine)})


def broker_link(engine: EdgeEngine) -> dict[str, Any]:
    """The MQTT link's state (``broker`` in /v1/status; docs/troubleshooting.md); before the
    session starts, not connected to the configured broker."""
    if engine.session is not None:
        return engine.session.link.report()
    mqtt = engine.edge.mqtt
    return BrokerLink(f"{mqtt.host}:{mqtt.port}").report()


async def list_tasks(request: web.Request) -> web.Response:
    states = None
    if "state" in request.query:
        try:
            states = [TaskState(s) for s in request.query["state"].split(",")]
        except ValueError:
            allowed = ", ".join(s.value for s in TaskState)
            return problem(400, "Bad state", f"state must be among {allowed}", "state")
    records = await _engine(request).store.list_tasks(states)
    return web.json_response([record_json(r) for r in records])


async def get_task(request: web.Request) -> web.Response:
    record = await _engine(request).store.get_task(request.match_info["id"])
    if record is None:
        return problem(404, "Not found", f"no task {request.match_info['id']!r}", "id")
    return web.json_response(record_json(record))


async def submit(request: web.Request) -> web.Response:
    try:
        body = await json_body(request)
    except BodyError as exc:
        return exc.response()
    try:
        spec = parse_submission(body)
        record = await _engine(request).submit(spec)
    except SubmitError as exc:
        return problem(exc.status, "Task refused", exc.message, exc.field)
    return web.json_response(record_json(record), status=201)


async def cancel(request: web.Request) -> web.Response:
    try:
        record = await _engine(request).cancel(request.match_info["id"])
    except SubmitError as exc:
        return problem(exc.status, "Cannot cancel", exc.message, exc.field)
    return web.json_response(record_json(record))


#: The most lines ``GET /v1/tasks/{id}/logs`` answers (the bytes it reads for them: the
#: readers of :mod:`edgesched.edge.logserve`, which answers central's requests for them).
MAX_LOG_LINES = 10_000
#: How long a followed log stays open at most, and how often it looks for more.
FOLLOW_MAX_S = 3600.0
FOLLOW_POLL_S = 0.25


async def task_logs(request: web.Request) -> web.StreamResponse:
    """A task's output (stdout and stderr), the last ``tail`` lines (100 by default, at most
    10,000); ``follow=1``: then what it writes, as it writes it (chunked), until it has
    finished and written nothing more, or an hour."""
    engine = _engine(request)
    task_id = request.match_info["id"]
    record = await engine.store.get_task(task_id)
    if record is None:
        return problem(404, "Not found", f"no task {task_id!r}", "id")
    try:
        lines = int(request.query.get("tail", "100"))
    except ValueError:
        lines = -1
    if not 0 <= lines <= MAX_LOG_LINES:
        return problem(400, "Bad query", f"must be an integer in 0..{MAX_LOG_LINES}", "tail")
    follow = request.query.get("follow", "0") in ("1", "true")
    path = engine.executor.log_path(task_id)
    head, offset = await asyncio.to_thread(tail_lines, path, lines)
    if not follow:
        return web.Response(body=head, content_type="text/plain", charset="utf-8")
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    await response.prepare(request)
    await response.write(head)
    deadline = time.monotonic() + FOLLOW_MAX_S
    while time.monotonic() < deadline:
        more, offset = await asyncio.to_thread(read_from, path, offset)
        if more:
            await response.write(more)
            continue
        record = await engine.store.get_task(task_id)
        if record is None or record.state.terminal:
            break
        await asyncio.sleep(FOLLOW_POLL_S)
    await response.write_eof()
    return response


async def decisions(request: web.Request) -> web.Response:
    try:
        limit = min(max(int(request.query.get("limit", "100")), 1), 1000)
    except ValueError:
        return problem(400, "Bad limit", "limit must be an integer", "limit")
    rows = await _engine(request).store.recent_decisions(limit, request.query.get("task"))
    return web.json_response(rows)


async def metrics(request: web.Request) -> web.Response:
    engine = _engine(request)
    engine.metrics.scrape(
        broker_connected=engine.link.broker_connected, refused=engine.refused_by_channel()
    )
    return web.Response(
        body=engine.metrics.render(),
        content_type="text/plain",
        charset="utf-8",
    )


def build_app(engine: EdgeEngine, token: str, metrics_token: str = "") -> web.Application:
    """The API: ``token`` for every route, ``metrics_token`` (none if empty) for /metrics."""
    app = web.Application(middlewares=[token_guard()], client_max_size=MAX_BODY_BYTES)
    app[ENGINE_KEY] = engine
    app[TOKEN_KEY] = token
    app[METRICS_TOKEN_KEY] = metrics_token
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/openapi.json", serve_edge)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/tasks", list_tasks)
    app.router.add_post("/v1/tasks", submit)
    app.router.add_get("/v1/tasks/{id}", get_task)
    app.router.add_delete("/v1/tasks/{id}", cancel)
    app.router.add_get("/v1/tasks/{id}/logs", task_logs)
    app.router.add_get("/v1/decisions", decisions)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(engine: EdgeEngine) -> web.AppRunner:
    """Start the API on ``[edge] api_host:api_port``; the bound port (useful with port 0)
    lands in ``engine.api_port``."""
    host, port = engine.edge.api_host, engine.edge.api_port
    token = load_or_create_token(engine.state_dir)
    metrics_token = load_or_create_token(engine.state_dir, METRICS_TOKEN_FILE)
    runner, engine.api_port = await start_app(
        build_app(engine, token, metrics_token), engine.state_dir, host, port
    )
    return runner
