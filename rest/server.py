"""Server-side HTTP plumbing shared by the edge and central APIs (aiohttp).

Errors are RFC 9457 problem details (``application/problem+json``) naming the offending field;
a bad body is a 4xx, never a 500. Bodies are read with a size cap and a nesting-depth cap
before they are decoded. Tokens live in a 0600 file in the state directory. Each tier keeps
its own routes; this module only holds what both need.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import secrets
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from edgesched.sync.store import StoreError

#: Largest request body either API reads (bytes).
MAX_BODY_BYTES = 64 * 1024
#: Deepest nesting of arrays and objects a body may have; deeper is a clear 400, never a 500.
MAX_JSON_DEPTH = 32
TOKEN_KEY = web.AppKey("token", str)
#: Paths served without a token (liveness and the API's own description).
PUBLIC_PATHS: frozenset[str] = frozenset({"/v1/health", "/v1/openapi.json"})

#: The Prometheus scrape path, and the scrape-only token that reads it and nothing else
#: (``<state_dir>/metrics-token``, created 0600 at first start; docs/metrics.md).
METRICS_PATH = "/metrics"
METRICS_TOKEN_FILE = "metrics-token"
METRICS_TOKEN_KEY = web.AppKey("metrics_token", str)
UNAUTHORIZED = "send Authorization: Bearer <token> (api-token; for /metrics also metrics-token)"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
E = TypeVar("E")
#: How an engine starts its API: called with the engine once it is up; the runner is cleaned up
#: when the engine stops. The wiring (``edgesched.serve``) passes each tier's ``api.serve``.
ApiStarter = Callable[[E], Awaitable[web.AppRunner]]


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
    """An RFC 9457 problem-details response."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status, content_type="application/problem+json")


def authorized(request: web.Request, token: str) -> bool:
    """Whether the request carries ``Authorization: Bearer <token>`` (constant-time compare)."""
    sent = request.headers.get("Authorization", "")
    return hmac.compare_digest(sent.encode(), f"Bearer {token}".encode())


def bearer_of(request: web.Request) -> str:
    """The token of the request's ``Authorization: Bearer`` header, or ``""``."""
    sent = request.headers.get("Authorization", "")
    return sent[len("Bearer ") :] if sent.startswith("Bearer ") else ""


def metrics_token_refusal(request: web.Request, sent: str) -> web.Response | None:
    """For a request that sent the app's metrics token (``METRICS_TOKEN_KEY``): None if it
    reads ``GET``/``HEAD /metrics`` (let it through), a 403 problem for anything else. A
    request that did not send it gets a 401 problem."""
    token = request.app.get(METRICS_TOKEN_KEY, "")
    if not (sent and token and hmac.compare_digest(sent.encode(), token.encode())):
        return problem(401, "Unauthorized", UNAUTHORIZED)
    if request.path == METRICS_PATH and request.method in ("GET", "HEAD"):
        return None
    return problem(403, "Forbidden", "the metrics token reads GET /metrics only")


def token_guard(public: Collection[str] = PUBLIC_PATHS) -> Any:
    """Middleware: every path but ``public`` needs the app's bearer token (``TOKEN_KEY``);
    ``GET /metrics`` also takes the metrics token (``METRICS_TOKEN_KEY``)."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in public and not authorized(request, request.app[TOKEN_KEY]):
            refusal = metrics_token_refusal(request, bearer_of(request))
            if refusal is not None:
                return refusal
        return await answer(request, handler)

    return guard


async def answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The handler's response, with HTTP errors and store failures as problem details."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return problem(exc.status, exc.reason, exc.text or exc.reason)
        raise
    except StoreError as exc:
        return problem(503, "Store unavailable", str(exc))


class BodyError(Exception):
    """A request body that is too large, too deep or not JSON; :meth:`response` is the problem."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail

    def response(self) -> web.Response:
        return problem(self.status, self.title, self.detail, "body")


def json_depth(raw: bytes | str) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text, ignoring brackets inside strings.

    A linear scan, run before :func:`json.loads` so that a hostile body nested thousands of
    levels deep never reaches the recursive decoder (or the code that walks its result).
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode a JSON body; BodyError (400) when it is malformed or nested past ``max_depth``."""
    if json_depth(raw) > max_depth:
        raise BodyError(400, "Body too deep", f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BodyError(400, "Malformed JSON", str(exc)) from None
    except RecursionError:  # pragma: no cover - the depth check refuses such bodies first
        raise BodyError(400, "Body too deep", "JSON nested too deep") from None


async def json_body(request: web.Request, limit: int = MAX_BODY_BYTES) -> Any:
    """The request's JSON body, read with a size cap; BodyError (413 or 400) otherwise."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyError(413, "Body too large", f"at most {limit} bytes")
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        raise BodyError(413, "Body too large", f"at most {limit} bytes")
    return parse_json(raw)


class ListenError(OSError):
    """The API could not listen on ``host:port`` (in use, not an address of this machine, a
    privileged port): ``str()`` is one line naming the address and why; ``errno`` is kept."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        why = os.strerror(cause.errno) if cause.errno else str(cause)
        if cause.errno == errno.EADDRINUSE:
            why = "the port is already in use (by another process: see `ss -ltnp`)"
        super().__init__(cause.errno, f"cannot listen on {host}:{port}: {why}")
        self.host, self.port = host, port

    def __str__(self) -> str:
        return str(self.strerror)


async def start_app(
    app: web.Application, state_dir: Path, host: str, port: int
) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host:port``; the bound port (useful with port 0) is returned and
    written to ``<state_dir>/api-port`` for the CLI."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(host, port, exc) from None
    addresses = runner.addresses
    bound = int(addresses[0][1]) if addresses else port
    (state_dir / "api-port").write_text(f"{bound}\n")
    return runner, bound
