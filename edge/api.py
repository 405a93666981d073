"""The edge node's local HTTP API (aiohttp), for people and tools on the gateway itself.

Loopback by default. Every route except ``/v1/health`` needs ``Authorization: Bearer <token>``
with the token from ``<state_dir>/api-token`` (created 0600 at first start). Errors are RFC 9457
problem details (``application/problem+json``) naming the field; a bad body is a 4xx, never a
500.

    GET    /v1/health              liveness, no token
    GET    /v1/status              node, mode, link, hardware
    GET    /v1/tasks[?state=...]   task records
    GET    /v1/tasks/{id}
    POST   /v1/tasks               submit (TaskSpec JSON); 201 once committed to SQLite
    DELETE /v1/tasks/{id}          cancel
    GET    /v1/decisions[?task=..] recent decisions with their reasons
    GET    /metrics                Prometheus text format
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from edgesched.central.openapi import serve_edge
from edgesched.edge.spec import TaskRecord, TaskState
from edgesched.edge.store import StoreError

if TYPE_CHECKING:
    from edgesched.edge.engine import EdgeEngine

MAX_BODY_BYTES = 64 * 1024
ENGINE_KEY = web.AppKey("engine", object)
TOKEN_KEY = web.AppKey("token", str)


def load_or_create_token(state_dir: Path, name: str = "api-token") -> str:
    """The API token in ``state_dir/name``, created with mode 0600 the first time."""
    path = state_dir / name
    try:
        token = path.read_text().strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def problem(status: int, title: str, detail: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status, content_type="application/problem+json")


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
    engine: EdgeEngine = request.app[ENGINE_KEY]  # type: ignore[assignment]
    return engine


@web.middleware
async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path not in ("/v1/health", "/v1/openapi.json"):
        sent = request.headers.get("Authorization", "")
        expected = f"Bearer {request.app[TOKEN_KEY]}"
        if not hmac.compare_digest(sent.encode(), expected.encode()):
            return problem(401, "Unauthorized", "send Authorization: Bearer <token> (api-token)")
    return await answer(request, handler)


async def answer(request: web.Request, handler: Any) -> web.StreamResponse:
    """The handler's response, with HTTP errors and store failures as problem details."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as exc:
        if exc.status >= 400:
            return problem(exc.status, exc.reason, exc.text or exc.reason)
        raise
    except StoreError as exc:
        return problem(503, "Store unavailable", str(exc))


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def status(request: web.Request) -> web.Response:
    return web.json_response(_engine(request).status())


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


class BodyError(Exception):
    """A request body that is too large or not JSON; :meth:`response` is the problem."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail

    def response(self) -> web.Response:
        return problem(self.status, self.title, self.detail, "body")


async def json_body(request: web.Request, limit: int = MAX_BODY_BYTES) -> Any:
    """The request's JSON body, read with a size cap; BodyError (413 or 400) otherwise."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyError(413, "Body too large", f"at most {limit} bytes")
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        raise BodyError(413, "Body too large", f"at most {limit} bytes")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BodyError(400, "Malformed JSON", str(exc)) from None


async def submit(request: web.Request) -> web.Response:
    from edgesched.edge.engine import SubmitError, parse_submission

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
    from edgesched.edge.engine import SubmitError

    try:
        record = await _engine(request).cancel(request.match_info["id"])
    except SubmitError as exc:
        return problem(exc.status, "Cannot cancel", exc.message, exc.field)
    return web.json_response(record_json(record))


async def decisions(request: web.Request) -> web.Response:
    try:
        limit = min(max(int(request.query.get("limit", "100")), 1), 1000)
    except ValueError:
        return problem(400, "Bad limit", "limit must be an integer", "limit")
    rows = await _engine(request).store.recent_decisions(limit, request.query.get("task"))
    return web.json_response(rows)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=_engine(request).metrics.render(),
        content_type="text/plain",
        charset="utf-8",
    )


def build_app(engine: EdgeEngine, token: str) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=MAX_BODY_BYTES)
    app[ENGINE_KEY] = engine
    app[TOKEN_KEY] = token
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/openapi.json", serve_edge)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/tasks", list_tasks)
    app.router.add_post("/v1/tasks", submit)
    app.router.add_get("/v1/tasks/{id}", get_task)
    app.router.add_delete("/v1/tasks/{id}", cancel)
    app.router.add_get("/v1/decisions", decisions)
    app.router.add_get("/metrics", metrics)
    return app


async def start_app(
    app: web.Application, state_dir: Path, host: str, port: int
) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host:port``; the bound port (useful with port 0) is returned and
    written to ``<state_dir>/api-port`` for the CLI."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    addresses = runner.addresses
    bound = int(addresses[0][1]) if addresses else port
    (state_dir / "api-port").write_text(f"{bound}\n")
    return runner, bound


async def serve(engine: EdgeEngine, host: str, port: int) -> web.AppRunner:
    """Start the API; the bound port (useful with port 0) lands in ``engine.api_port``."""
    token = load_or_create_token(engine.state_dir)
    runner, engine.api_port = await start_app(
        build_app(engine, token), engine.state_dir, host, port
    )
    return runner
