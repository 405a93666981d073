"""The gateway's half of a join by URL: from ``https://HOST:PORT`` and a token to the node's
CA, certificate and key, the key made here.

Role: what ``edgesched join URL TOKEN`` (:mod:`edgesched.join`) does before the steps it
shares with the join file. One step at a time, each failure a :class:`JoinClientError`
naming it:

1. ``DNS``, ``TCP``: the join server's name resolves, its port answers;
2. ``TLS``: a handshake *without* verifying the server (we have no CA yet), ``GET /join/ca``;
3. ``CA pin``: the SHA-256 of the CA it sent must start with the token's pin, else we stop
   with nothing written (another server, or someone in between);
4. ``TLS``: a new connection verifying the server against that CA and its host name;
5. a private key (EC P-256) made here, and a CSR (no name: the server puts the node id the
   token is for), ``POST /join`` with the token; ``token``: 403 (unknown, expired or used);
6. the answer checked: the certificate is for our key, issued by the pinned CA.

The result is a :class:`edgesched.joinfile.JoinFile` in memory, the key included: the join
continues as from a file. Nothing is written here.
"""

from __future__ import annotations

import hmac
import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from edgesched.joinfile import JoinFile
from edgesched.jointoken import Token, TokenError, ca_pin, parse

DEFAULT_PORT: Final = 8884
#: The largest answer read (the CA and a certificate: a few KiB).
MAX_ANSWER: Final = 64 * 1024


class JoinClientError(Exception):
    """The join by URL stopped; the message is ``STEP: reason``."""


@dataclass(frozen=True)
class Server:
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_url(url: str) -> Server:
    """``https://HOST[:PORT][/]`` → Server; JoinClientError for anything else."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme != "https" or not parts.hostname or port == -1:
        raise JoinClientError(
            f"URL: {url!r} is not https://HOST[:PORT] (the line `central add-node` printed)"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise JoinClientError(f"URL: {url!r}: give the server only, https://HOST[:PORT]")
    return Server(parts.hostname, port or DEFAULT_PORT)


def _connect(server: Server, timeout: float) -> socket.socket:
    try:
        infos = socket.getaddrinfo(server.host, server.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise JoinClientError(f"DNS: cannot resolve {server.host!r}: {exc.strerror}") from None
    ip = str(infos[0][4][0])
    try:
        return socket.create_connection((ip, server.port), timeout=timeout)
    except TimeoutError:
        raise JoinClientError(
            f"TCP: {server.address}: no answer in {timeout:g} s (firewall? is `edgesched "
            "central join-server` running?)"
        ) from None
    except OSError as exc:
        raise JoinClientError(
            f"TCP: {server.address}: {exc.strerror or exc} (is `edgesched central join-server` "
            "running there?)"
        ) from None


def _https(
    server: Server, context: ssl.SSLContext, timeout: float, what: str
) -> http.client.HTTPSConnection:
    sock = _connect(server, timeout)
    try:
        tls = context.wrap_socket(sock, server_hostname=server.host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise JoinClientError(
            f"TLS: the join server's certificate does not verify against the pinned fleet CA "
            f"({exc.verify_message}): {what}"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        sock.close()
        raise JoinClientError(
            f"TLS: handshake with {server.address} failed: {exc} (is this the join server's port?)"
        ) from None
    conn = http.client.HTTPSConnection(server.host, server.port, timeout=timeout)
    conn.sock = tls  # ours, connected and verified as above: http.client uses it as is
    return conn


def _request(
    conn: http.client.HTTPSConnection, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read(MAX_ANSWER + 1)
    except ssl.SSLError as exc:  # TLS 1.3: a server refusing us says so after the handshake
        raise JoinClientError(
            f"TLS: {conn.host}:{conn.port} ended the TLS session before answering {method} "
            f"{path}: {exc.reason or exc} (is this the join server's port, not the broker's?)"
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise JoinClientError(f"HTTP: {method} {path}: {exc or type(exc).__name__}") from None
    finally:
        conn.close()
    if len(data) > MAX_ANSWER:
        raise JoinClientError(f"HTTP: {method} {path}: answer over {MAX_ANSWER} bytes")
    return resp.status, data


def _message(data: bytes) -> str:
    try:
        body = json.loads(data)
        return str(body["error"]) if isinstance(body, dict) else data[:200].decode()
    except (ValueError, KeyError, UnicodeDecodeError, RecursionError):
        return repr(data[:200])


def fetch_ca(server: Server, pin: str, timeout: float = 5.0) -> str:
    """The fleet CA from ``server``, trusted only because its SHA-256 starts with ``pin``."""
    blind = ssl.create_default_context()
    blind.check_hostname = False
    blind.verify_mode = ssl.CERT_NONE  # nothing to verify against yet: the pin does it
    blind.minimum_version = ssl.TLSVersion.TLSv1_2
    status, data = _request(_https(server, blind, timeout, ""), "GET", "/join/ca")
    if status != 200:
        raise JoinClientError(f"HTTP: GET /join/ca: {status}: {_message(data)}")
    try:
        pem = data.decode()
        got = ca_pin(pem)
    except (UnicodeDecodeError, ValueError):
        raise JoinClientError(
            f"CA pin: {server.address} did not send a CA certificate (nothing was written)"
        ) from None
    if not hmac.compare_digest(got, pin):
        raise JoinClientError(
            f"CA pin: the CA {server.address} sent (sha256 {got}...) is not the one the token "
            f"names ({pin}...): another server, or someone in between; nothing was written"
        )
    return pem


def _verified(
    url: str, token_text: str, timeout: float
) -> tuple[http.client.HTTPSConnection, str, Token]:
    server = parse_url(url)
    try:
        token = parse(token_text)
    except TokenError as exc:
        raise JoinClientError(f"token: {exc}") from None
    ca_pem = fetch_ca(server, token.pin, timeout)
    verified = ssl.create_default_context(cadata=ca_pem)
    verified.minimum_version = ssl.TLSVersion.TLSv1_2
    conn = _https(
        server, verified, timeout, f"is {server.host} among the names of the broker's certificate?"
    )
    return conn, ca_pem, token


def probe(url: str, token_text: str, timeout: float = 5.0) -> str:
    """Steps 1-4 only (``join --dry-run``): the token is not spent; one line of what held."""
    conn, _, token = _verified(url, token_text, timeout)
    conn.close()
    return (
        f"the join server {url} holds the fleet CA the token pins ({token.pin}...) and its "
        "certificate verifies; the token was not spent"
    )


def join_by_url(url: str, token_text: str, timeout: float = 5.0) -> JoinFile:
    """Spend ``token_text`` at the join server ``url``; the node's files (the key made here)."""
    conn, ca_pem, token = _verified(url, token_text, timeout)
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .sign(key, hashes.SHA256())
    )
    body = json.dumps(
        {"token": str(token), "csr_pem": csr.public_bytes(serialization.Encoding.PEM).decode()}
    ).encode()
    status, data = _request(conn, "POST", "/join", body)
    if status == 403:
        reason = _message(data).removeprefix("token refused: ")
        raise JoinClientError(f"token: refused by the join server: {reason}")
    if status != 200:
        raise JoinClientError(f"join server: POST /join: {status}: {_message(data)}")
    answer = _answer(data)
    try:
        cert = x509.load_pem_x509_certificate(answer["cert_pem"].encode())
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise JoinClientError(
            f"join server: the certificate it sent is not issued by the fleet CA: {exc}"
        ) from None
    if cert.public_key() != key.public_key():
        raise JoinClientError("join server: the certificate it sent is not for our key")
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return JoinFile(
        node_id=answer["node_id"],
        broker=answer["broker"],
        ca=ca_pem,
        cert=answer["cert_pem"],
        key=key_pem,
        site=answer.get("site") if isinstance(answer.get("site"), str) else None,
        site_peers=tuple(answer.get("site_peers") or ()),
        centrals=tuple(answer.get("centrals") or ()) or ("central",),
    )


def _answer(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        body = None
    if not isinstance(body, dict) or not all(
        isinstance(body.get(k), str) for k in ("node_id", "broker", "cert_pem")
    ):
        raise JoinClientError("join server: its answer is not a join answer (JSON, node_id...)")
    for k in ("site_peers", "centrals"):
        v = body.get(k) or []
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise JoinClientError(f"join server: its answer's {k} is not a list of names")
    return body
