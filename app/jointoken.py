"""One-time join tokens: what ``central add-node`` hands out and the join server spends.

Role: the token of ``edgesched join https://HOST:PORT TOKEN`` (in the manner of kubeadm's
bootstrap token with ``--discovery-token-ca-cert-hash``). A token is

    <pin>.<secret>

* ``pin``: the first 32 hex digits (128 bits) of the SHA-256 of the fleet CA certificate
  (DER). The gateway fetches the CA from the join server without trusting it, and accepts
  it only if its hash starts with the pin: the token authenticates the server.
* ``secret``: 32 random hex digits (128 bits, :func:`secrets.token_hex`): it authenticates
  the gateway. Central keeps only its SHA-256.

The broker directory's ``joins.json`` (0600, replaced atomically, changed under the
directory's lock :func:`locked`) maps each secret's SHA-256 to the node id, its site, the
expiry (Unix seconds) and whether it was used. :func:`spend` finds a secret by comparing
its hash with every record's in constant time (:func:`hmac.compare_digest`) and marks it
used in the same locked step: a token admits one gateway, once, before it expires.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization

TOKENS: Final = "joins.json"
LOCK: Final = ".lock"
PIN_CHARS: Final = 32
SECRET_CHARS: Final = 32
#: How long a token is good for unless ``--ttl`` says otherwise.
DEFAULT_TTL_S: Final = 3600.0
TOKEN_RE: Final = re.compile(rf"([0-9a-f]{{{PIN_CHARS}}})\.([0-9a-f]{{{SECRET_CHARS}}})")
#: Spent or expired records are dropped from joins.json after this long (kept a while so
#: that `central joins`-style inspection and the tests can see them).
KEEP_S: Final = 7 * 86400.0


class TokenError(ValueError):
    """A token that is malformed (said to the user) or refused (never said which way)."""


@dataclass(frozen=True)
class Token:
    pin: str
    secret: str

    def __str__(self) -> str:
        return f"{self.pin}.{self.secret}"


@dataclass(frozen=True)
class Grant:
    """What a spent token admits: one node of one site."""

    node_id: str
    site: str | None


def ca_pin(ca_pem: bytes | str) -> str:
    """The pin of a CA certificate: the start of the SHA-256 of its DER, hex."""
    data = ca_pem.encode() if isinstance(ca_pem, str) else ca_pem
    cert = x509.load_pem_x509_certificate(data)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()[:PIN_CHARS]


def parse(text: str) -> Token:
    """``PIN.SECRET`` → Token; TokenError saying what a token looks like."""
    m = TOKEN_RE.fullmatch(text.strip().lower())
    if m is None:
        raise TokenError(
            f"token {text!r} is not a join token (expected {PIN_CHARS} hex digits, a dot, "
            f"{SECRET_CHARS} hex digits: the line `central add-node` printed)"
        )
    return Token(m.group(1), m.group(2))


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the broker directory's lock (``.lock``, flock): one change of its files at a
    time, between ``central add-node`` and a running join server."""
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load(root: Path) -> dict[str, dict[str, Any]]:
    """The records of ``root/joins.json`` (empty if there is none)."""
    try:
        data = json.loads((root / TOKENS).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        raise OSError(f"{root / TOKENS}: unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise OSError(f"{root / TOKENS}: not a join token table")
    return data


def _save(root: Path, records: dict[str, dict[str, Any]]) -> None:
    path = root / TOKENS
    tmp = path.with_name(TOKENS + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(records, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def create(
    root: Path,
    ca_pem: bytes | str,
    node_id: str,
    site: str | None,
    ttl_s: float = DEFAULT_TTL_S,
    *,
    now: float | None = None,
) -> Token:
    """Record a new token for ``node_id`` in ``root/joins.json``; the token (its secret is
    not kept). Call under :func:`locked`. Earlier unused tokens of the node are withdrawn."""
    if not ttl_s > 0:
        raise TokenError(f"--ttl: must be more than 0 s, got {ttl_s:g}")
    t = time.time() if now is None else now
    token = Token(ca_pin(ca_pem), secrets.token_hex(SECRET_CHARS // 2))
    records = {
        h: r
        for h, r in load(root).items()
        if r.get("node_id") != node_id and t < r.get("expires", 0) + KEEP_S
    }
    records[_digest(token.secret)] = {
        "node_id": node_id,
        "site": site,
        "created": round(t, 3),
        "expires": round(t + ttl_s, 3),
        "used": False,
    }
    _save(root, records)
    return token


def withdraw(root: Path, node_id: str) -> int:
    """Drop ``node_id``'s tokens (``remove-node``); how many. Call under :func:`locked`."""
    records = load(root)
    kept = {h: r for h, r in records.items() if r.get("node_id") != node_id}
    if len(kept) != len(records):
        _save(root, kept)
    return len(records) - len(kept)


def find(root: Path, secret: str, *, now: float | None = None) -> tuple[str, Grant]:
    """The record of a usable ``secret`` (its hash, what it grants); TokenError("refused")
    when it is unknown, expired or used, without saying which. Call under :func:`locked`."""
    t = time.time() if now is None else now
    want = _digest(secret)
    found: tuple[str, dict[str, Any]] | None = None
    for h, record in load(root).items():
        if hmac.compare_digest(h.encode(), want.encode()):  # every record, constant time
            found = (h, record)
    if found is None or found[1].get("used") or not t < float(found[1].get("expires", 0)):
        raise TokenError("refused")
    record = found[1]
    return found[0], Grant(str(record["node_id"]), record.get("site"))


def mark_used(root: Path, digest: str, *, now: float | None = None) -> None:
    """Mark the record ``digest`` used. Call under :func:`locked`, after :func:`find`."""
    records = load(root)
    records[digest] |= {"used": True, "used_at": round(time.time() if now is None else now, 3)}
    _save(root, records)


def parse_ttl(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``1h``, ``2d`` → seconds; TokenError if not one of those."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None or not 0 < float(m.group(1)) < 1e9:  # (400 digits would be an inf)
        raise TokenError(f"--ttl: {text!r} is not a duration (e.g. 90s, 30m, 1h, 2d)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
