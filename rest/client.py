"""One small client for both tiers' REST APIs: the CLI, the demo and the field tests use it.

An API is found by its base URL and bearer token, or by the state directory of a running
engine (``api-port`` and ``api-token`` are written there at start). :meth:`ApiClient.request`
returns the status and decoded body whatever the status; :meth:`ApiClient.call` raises
:class:`ApiError` for a problem-details answer (with its detail and field) and
:class:`Unreachable` when nothing answers, naming the address. :class:`AsyncApiClient` is the
same over aiohttp, for code already on an event loop.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp


class ApiError(Exception):
    """An API answered with an error status; ``str()`` is one line naming field and detail."""

    def __init__(self, status: int, body: Any, url: str) -> None:
        self.status = status
        self.body = body
        self.url = url
        detail = body.get("detail") if isinstance(body, dict) else None
        self.field = body.get("field") if isinstance(body, dict) else None
        where = f"{self.field}: " if self.field else ""
        super().__init__(f"{where}{detail or body or 'error'} (HTTP {status})")


class Unreachable(ApiError, ConnectionError):
    """Nothing answered at the address (refused, timed out, no such host); an OSError too."""

    def __init__(self, url: str, reason: object) -> None:
        Exception.__init__(self, f"cannot reach {url}: {reason}")
        self.status, self.body, self.url, self.field = 0, None, url, None


@dataclass(frozen=True)
class Response:
    status: int
    body: Any  # decoded JSON, or the text of a non-JSON answer
    content_type: str


def _decode(payload: bytes, content_type: str) -> Any:
    if "json" in content_type or not content_type:
        try:
            return json.loads(payload) if payload else None
        except ValueError:
            pass
    return payload.decode("utf-8", "replace")


@dataclass(frozen=True)
class ApiTarget:
    """Where an API is: base URL (no trailing slash) and bearer token ('' for none)."""

    base_url: str
    token: str = ""

    @classmethod
    def from_state_dir(cls, state_dir: Path, host: str = "127.0.0.1") -> ApiTarget:
        """The API of the engine running from ``state_dir``; OSError/ValueError if none."""
        token = (state_dir / "api-token").read_text().strip()
        port = int((state_dir / "api-port").read_text().strip())
        host = f"[{host}]" if ":" in host else host
        return cls(f"http://{host}:{port}", token)

    def headers(self, auth: bool = True) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if auth and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


class ApiClient:
    """Blocking client (urllib: nothing to import at CLI start beyond the standard library)."""

    def __init__(self, target: ApiTarget, timeout: float = 10.0) -> None:
        self.target = target
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        auth: bool = True,
        raw: bytes | None = None,
        timeout: float | None = None,
    ) -> Response:
        """Status and body, whatever the status; :class:`Unreachable` if nothing answers."""
        url = self.target.base_url + path
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(
            url, data=data, method=method, headers=self.target.headers(auth)
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                ctype = resp.headers.get("Content-Type", "")
                return Response(resp.status, _decode(resp.read(), ctype), ctype)
        except urllib.error.HTTPError as exc:
            ctype = exc.headers.get("Content-Type", "") if exc.headers else ""
            return Response(exc.code, _decode(exc.read() or b"", ctype), ctype)
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise Unreachable(self.target.base_url, reason) from None

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """The decoded body of a 2xx answer; :class:`ApiError` otherwise."""
        resp = self.request(method, path, body)
        if resp.status >= 400:
            raise ApiError(resp.status, resp.body, self.target.base_url + path)
        return resp.body


class AsyncApiClient:
    """The same client over an aiohttp session the caller owns."""

    def __init__(self, session: aiohttp.ClientSession, target: ApiTarget) -> None:
        self.session = session
        self.target = target

    async def request(self, method: str, path: str, body: Any = None) -> Response:
        url = self.target.base_url + path
        try:
            async with self.session.request(
                method, url, json=body, headers=self.target.headers()
            ) as resp:
                ctype = resp.headers.get("Content-Type", "")
                return Response(resp.status, _decode(await resp.read(), ctype), ctype)
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise Unreachable(self.target.base_url, exc or type(exc).__name__) from None

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        resp = await self.request(method, path, body)
        if resp.status >= 400:
            raise ApiError(resp.status, resp.body, self.target.base_url + path)
        return resp.body
