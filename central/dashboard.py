"""The fleet dashboard served by central: a static page and a Server-Sent Events stream.

    GET /                   redirect to /dashboard/
    GET /dashboard/         the page (public: it holds no data; the token is in its URL
                            fragment, ``#token=...``, which browsers never send)
    GET /dashboard/{file}   its assets, only the files shipped in ``edgesched.central/static``
    GET /v1/stream          text/event-stream, behind the API's token guard (``?token=``, as an
                            ``EventSource`` cannot set headers): ``event: snapshot`` at once,
                            then every second, with keep-alive comments, until the client goes
                            or the server shuts down

A snapshot is one JSON object: ``status``, ``policy``, ``nodes`` (as ``GET /v1/nodes``),
``tasks_total`` (how many tasks central knows), ``fleet`` (the latest fleet sample, as
``GET /v1/fleet``'s ``now``) and ``events`` (the last 100, and the last 50 notable ones that a
burst of placements may have pushed out of those). It is built at most once per interval for
all clients, and holds no task: at 100,000 tasks building every view took seconds of central's
loop each second. The page reads the tasks a page at a time (``GET /v1/tasks``), the day's
series from ``GET /v1/fleet``, a task's detail from ``GET /v1/tasks/{id}``, and the services
from ``GET /v1/services`` (every 2 s only while their panel is on screen, and when a service
event comes in the snapshot; the open service from ``GET /v1/services/{name}``): the snapshot
grows with no service.

    GET /favicon.ico        the page's icon (public, as the page)

The stream handler creates no task: it sleeps on the app's shutdown event with a timeout, so
``runner.cleanup()`` ends every stream at once instead of waiting out aiohttp's shutdown
timeout, and a client that goes away ends its handler at the next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from aiohttp import web

from edgesched.central.engine import CentralEngine
from edgesched.rest.server import problem

log = logging.getLogger("edgesched.central.dashboard")

#: Served content types by suffix; a file of any other kind in static/ is not served.
CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
#: Everything the page loads comes from central itself.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STREAM_INTERVAL_S = 1.0
KEEPALIVE_S = 15.0
#: A client that has not taken a frame in this long (its TCP window full) is dropped, so a
#: stalled reader cannot hold a handler in ``write()`` past shutdown.
WRITE_TIMEOUT_S = 10.0
EVENTS_IN_SNAPSHOT = 100
#: Notable events (not routine placements) sent besides the last 100 of every kind.
NOTABLE_IN_SNAPSHOT = 50


@dataclass
class DashboardState:
    """Per-app: the shipped assets, the shutdown signal for streams, the shared snapshot."""

    engine: CentralEngine
    assets: dict[str, tuple[bytes, str]]
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    streams: int = 0
    cached_at: float = -1.0
    cached: bytes = b""


DASHBOARD_KEY = web.AppKey("dashboard", DashboardState)


def static_dir() -> Traversable:
    """Where the page's files are, in the installed package."""
    return files("edgesched.central") / "static"


def load_assets() -> dict[str, tuple[bytes, str]]:
    """name → (bytes, content type) for every servable file shipped in static/."""
    out: dict[str, tuple[bytes, str]] = {}
    root = static_dir()
    if not root.is_dir():
        log.warning("dashboard: no static files at %s; the page is not served", root)
        return out
    for entry in root.iterdir():
        suffix = "." + entry.name.rpartition(".")[2] if "." in entry.name else ""
        ctype = CONTENT_TYPES.get(suffix)
        if entry.is_file() and ctype is not None and not entry.name.startswith("."):
            out[entry.name] = (entry.read_bytes(), ctype)
    return out


def _engine(request: web.Request) -> CentralEngine:
    return request.app[DASHBOARD_KEY].engine


def snapshot(engine: CentralEngine) -> dict[str, Any]:
    """What the page shows live, in one object (see the module docstring). Its cost grows
    with the nodes, not with the tasks: the task table pages ``GET /v1/tasks`` itself."""
    if engine.fleet is not None:
        engine.sync_index()
    recent = engine.recent_events(EVENTS_IN_SNAPSHOT)
    notable = engine.recent_events(NOTABLE_IN_SNAPSHOT, notable=True)
    events = {id(e): e for e in (*notable, *recent)}
    return {
        "status": engine.status(),
        "policy": engine.policy_view(),
        "nodes": engine.node_summaries(),
        "tasks_total": len(engine.task_ids()),
        "fleet": engine.fleet_series.now(),
        "events": [e.to_json() for e in sorted(events.values(), key=lambda e: e.at)],
        "at": engine.clock(),
    }


def _snapshot_frame(request: web.Request) -> bytes:
    """The current snapshot as an SSE frame, shared by every client for part of a second."""
    state = request.app[DASHBOARD_KEY]
    now = time.monotonic()
    if not state.cached or now - state.cached_at >= STREAM_INTERVAL_S / 2:
        data = json.dumps(snapshot(_engine(request)), separators=(",", ":"), default=str)
        state.cached = f"event: snapshot\ndata: {data}\n\n".encode()
        state.cached_at = now
    return state.cached


async def stream(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: a snapshot now and every second until the client or server goes."""
    state = request.app[DASHBOARD_KEY]
    if state.closing.is_set():
        return problem(503, "Shutting down", "central is stopping")
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",  # no proxy buffering (nginx)
        }
    )
    state.streams += 1
    try:
        await response.prepare(request)
        await _send(response, b"retry: 2000\n\n")
        last_keepalive = time.monotonic()
        while not state.closing.is_set():
            await _send(response, _snapshot_frame(request))
            if time.monotonic() - last_keepalive >= KEEPALIVE_S:
                await _send(response, b": keep-alive\n\n")
                last_keepalive = time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STREAM_INTERVAL_S):
                    await state.closing.wait()
    except ConnectionResetError:  # the client went away (aiohttp's reset errors subclass it)
        log.debug("dashboard stream: client gone")
    except _Stalled:
        log.info("dashboard stream: client took nothing for %.0f s; dropped", WRITE_TIMEOUT_S)
        if request.transport is not None:
            request.transport.abort()
    finally:
        state.streams -= 1
    return response


class _Stalled(Exception):
    """A stream write that did not complete within ``WRITE_TIMEOUT_S``."""


async def _send(response: web.StreamResponse, data: bytes) -> None:
    try:
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await response.write(data)
    except TimeoutError:
        raise _Stalled from None


async def _close_streams(app: web.Application) -> None:
    app[DASHBOARD_KEY].closing.set()


async def redirect_root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/dashboard/")


async def favicon(request: web.Request) -> web.Response:
    """Browsers ask for /favicon.ico whatever the page says: the shipped SVG icon."""
    found = request.app[DASHBOARD_KEY].assets.get("favicon.svg")
    if found is None:
        return problem(404, "Not Found", "no icon shipped")
    return web.Response(
        body=found[0],
        content_type="image/svg+xml",
        headers={"Cache-Control": "max-age=86400", "X-Content-Type-Options": "nosniff"},
    )


async def asset(request: web.Request) -> web.Response:
    """One of the shipped files, by exact name: nothing outside static/ can be named."""
    name = request.match_info.get("file") or "index.html"
    found = request.app[DASHBOARD_KEY].assets.get(name)
    if found is None:
        return problem(404, "Not Found", f"no dashboard file {name!r}", "file")
    body, ctype = found
    headers = {
        "Cache-Control": "no-cache",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    if ctype == "text/html":
        headers["Content-Security-Policy"] = CSP
        headers["X-Frame-Options"] = "DENY"
    charset = "utf-8" if ctype.startswith("text/") or ctype.endswith("+xml") else None
    return web.Response(body=body, content_type=ctype, charset=charset, headers=headers)


def add_routes(app: web.Application, engine: CentralEngine) -> None:
    """Mount the dashboard and its stream of ``engine`` on central's API ``app``."""
    app[DASHBOARD_KEY] = DashboardState(engine, load_assets())
    app.on_shutdown.append(_close_streams)
    app.router.add_get("/", redirect_root)
    app.router.add_get("/dashboard", redirect_root)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_get("/dashboard/", asset)
    app.router.add_get("/dashboard/{file}", asset)
    app.router.add_get("/v1/stream", stream)
