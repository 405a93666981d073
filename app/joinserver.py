"""``edgesched central join-server``: where a gateway spends its join token (HTTPS).

Role: central's side of ``edgesched join https://HOST:PORT TOKEN``. A small aiohttp server,
separate from ``central run`` (it needs the fleet CA's key and the broker directory, which
central's engine neither has nor should: it runs sandboxed as its own user), serving TLS
with the broker's server certificate (issued by the fleet CA in ``broker init``; the gateway
verifies it against the CA it pinned):

* ``GET /join/ca``: the fleet CA certificate (PEM). Public: the gateway fetches it before it
  trusts anything, and keeps it only if its SHA-256 matches the pin in its token.
* ``POST /join`` with ``{"token": "PIN.SECRET", "csr_pem": "..."}`` (JSON, at most
  :data:`MAX_BODY` bytes): spends the token (:func:`edgesched.nodeaccess.join_by_token`:
  hash match in constant time, not expired, not used), signs the request for the token's
  node only, admits the node (ACL, Mosquitto reloaded) and answers ``{node_id, site,
  broker, ca_pem, cert_pem, site_peers, centrals}``.

A malformed body is 400 with what is wrong; a token that is unknown, expired or used is 403
``token refused``, the same words for each; a body too large is 413. An address refused
:data:`DEFAULT_REFUSALS_PER_MINUTE` tokens within a minute gets 429 for every ``POST /join``
until the oldest of them is a minute old (:class:`RefusalLimit`: guessing a 128-bit secret is
hopeless anyway; this keeps a flood of guesses from costing the directory lock and the log).
Each request is one log line (never the token).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from edgesched.brokerinit import BrokerDir, BrokerDirError
from edgesched.jointoken import PIN_CHARS, TokenError, parse
from edgesched.nodeaccess import join_by_token

#: The largest request body taken: a CSR is about 500 bytes (EC) or 1 KiB (RSA 4096 is 1.7).
MAX_BODY: Final = 16 * 1024
REFUSED: Final = (
    "token refused: unknown, expired or already used (ask central's operator for a new one: "
    "edgesched central add-node NODE)"
)

#: Refused tokens an address may send in a minute before it is answered 429.
DEFAULT_REFUSALS_PER_MINUTE: Final = 10
#: Addresses whose refusals are remembered (the least recently refused forgotten first).
MAX_ADDRESSES: Final = 10_000

log = logging.getLogger("edgesched.joinserver")


class RefusalLimit:
    """Refused tokens per client address over a sliding minute; bounded memory."""

    def __init__(
        self,
        per_minute: int = DEFAULT_REFUSALS_PER_MINUTE,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        if per_minute < 1:
            raise ValueError(f"refusals per minute must be at least 1, got {per_minute}")
        self.per_minute, self.clock, self.max_addresses = per_minute, clock, max_addresses
        self._refused: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str) -> deque[float]:
        times = self._refused.get(address, deque())
        while times and times[0] <= self.clock() - 60.0:
            times.popleft()
        return times

    def wait_s(self, address: str) -> float:
        """0 if ``address`` may try a token now, else the seconds until it may."""
        times = self._recent(address)
        if len(times) < self.per_minute:
            return 0.0
        return max(0.0, times[0] + 60.0 - self.clock())

    def refused(self, address: str) -> None:
        times = self._recent(address)
        times.append(self.clock())
        self._refused[address] = times
        self._refused.move_to_end(address)
        while len(self._refused) > self.max_addresses:
            self._refused.popitem(last=False)


def server_context(bd: BrokerDir) -> ssl.SSLContext:
    """TLS 1.2+ with the broker's server certificate (BrokerDirError if it is not there)."""
    files = bd.server
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as exc:
        raise BrokerDirError(
            f"the join server's certificate {files.cert}: {exc} (made by `edgesched broker init`)"
        ) from None
    return context


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def make_app(broker_dir: Path, limit: RefusalLimit | None = None) -> web.Application:
    """The join server's routes for the broker directory ``broker_dir``."""
    bd = BrokerDir(broker_dir)
    limit = limit or RefusalLimit()
    one_at_a_time = threading.Lock()  # the directory lock is per process; this per thread

    async def get_ca(request: web.Request) -> web.Response:
        try:
            pem = bd.ca_cert.read_text()
        except (OSError, BrokerDirError) as exc:
            log.error("GET /join/ca from %s: %s", request.remote, exc)
            return _error(500, "the fleet CA is not readable here")
        return web.Response(text=pem, content_type="application/x-pem-file")

    async def post_join(request: web.Request) -> web.Response:
        peer = request.remote
        wait = limit.wait_s(peer or "")
        if wait > 0:
            log.warning("POST /join from %s: too many refused tokens, told to wait", peer)
            return web.json_response(
                {"error": f"too many refused tokens from {peer}: try again in {wait:.0f} s"},
                status=429,
                headers={"Retry-After": str(int(wait) + 1)},
            )
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            log.warning("POST /join from %s: body over %d bytes", peer, MAX_BODY)
            return _error(413, f"request body over {MAX_BODY} bytes")
        try:
            body: Any = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            # (RecursionError: nested past the parser's depth, which aiohttp made a 500)
            return _error(400, 'the body must be JSON: {"token": "...", "csr_pem": "..."}')
        if not isinstance(body, dict):
            return _error(400, 'the body must be a JSON object: {"token": ..., "csr_pem": ...}')
        token, csr = body.get("token"), body.get("csr_pem")
        if not isinstance(token, str) or not isinstance(csr, str) or not csr:
            return _error(400, "token and csr_pem must both be strings")
        try:
            secret = parse(token).secret
        except TokenError as exc:
            return _error(400, str(exc))

        def admit() -> Any:
            with one_at_a_time:
                return join_by_token(bd.root, secret, csr.encode())

        try:
            joined = await asyncio.to_thread(admit)
        except TokenError:
            limit.refused(peer or "")
            log.warning("POST /join from %s: token refused", peer)
            return _error(403, REFUSED)
        except BrokerDirError as exc:
            log.error("POST /join from %s: %s", peer, exc)
            return _error(500, f"central could not admit the node: {exc}")
        except ValueError as exc:  # the CSR (the token is not spent)
            log.warning("POST /join from %s: CSR refused: %s", peer, exc)
            return _error(400, f"csr_pem: {exc}")
        for line in joined.done:
            log.info("%s", line)
        log.info("POST /join from %s: %s joined", peer, joined.node_id)
        return web.json_response(
            {
                "node_id": joined.node_id,
                "site": joined.site,
                "broker": joined.broker,
                "ca_pem": joined.ca_pem,
                "cert_pem": joined.cert_pem,
                "site_peers": list(joined.site_peers),
                "centrals": list(joined.centrals),
            }
        )

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_get("/join/ca", get_ca)
    app.router.add_post("/join", post_join)
    return app


async def serve(
    broker_dir: Path,
    host: str,
    port: int,
    *,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    refusals_per_minute: int = DEFAULT_REFUSALS_PER_MINUTE,
) -> None:
    """Serve until ``stop`` is set (or forever); BrokerDirError before listening if the
    directory or its certificate is not usable, OSError if the address is taken."""
    bd = BrokerDir(broker_dir)
    state = bd.load()
    if state.role != "central":
        raise BrokerDirError(f"{broker_dir} is a site broker: run the join server at central's")
    context = server_context(bd)
    runner = web.AppRunner(make_app(bd.root, RefusalLimit(refusals_per_minute)), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=context)
        await site.start()
        log.info(
            "join server on https://%s:%d for %s (CA pin %s)",
            host,
            port,
            bd.root,
            _pin(bd)[:PIN_CHARS],
        )
        if ready is not None:
            ready.set()
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()


def _pin(bd: BrokerDir) -> str:
    from edgesched.jointoken import ca_pin

    return ca_pin(bd.ca_cert.read_bytes())
