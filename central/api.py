"""Central's HTTP API (aiohttp): the fleet as central sees it.

Every route except ``/v1/health`` needs ``Authorization: Bearer <token>`` with the token
from ``<state_dir>/api-token`` (created 0600 at first start). Errors are RFC 9457 problem
details naming what is wrong.

    GET /v1/health          liveness, no token
    GET /v1/status          central: broker link, counts, refused input by reason
    GET /v1/nodes           every node: status, registration, document epoch and hash, tasks
    GET /v1/nodes/{id}      one node, with its document's content
    GET /metrics            Prometheus text format
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from edgesched.edge.api import TOKEN_KEY, guard, load_or_create_token, problem, start_app

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
    app.router.add_get("/metrics", metrics)
    return app


async def serve(engine: CentralEngine, host: str, port: int) -> web.AppRunner:
    """Start the API; the bound port (useful with port 0) lands in ``engine.api_port``."""
    token = load_or_create_token(engine.state_dir)
    runner, engine.api_port = await start_app(
        build_app(engine, token), engine.state_dir, host, port
    )
    return runner
