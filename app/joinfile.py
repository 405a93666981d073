"""The join file: everything a gateway needs to join the fleet, in one file (mode 0600).

Role: the "token" of ``edgesched join``, as K3s' URL+token or ``keadm gettoken``, made for
offline bundles: ``central add-node`` writes it, the operator carries it to the gateway (scp,
a USB stick, the bundle), ``join`` reads it. JSON with the broker's address, the fleet CA,
the node's certificate and private key, its id, site, site peers and the centrals. The
token printed beside it is the start of the file's SHA-256: ``join`` refuses a file that does
not match it (a truncated copy, another node's file). The file holds a private key: it is
written 0600 and should be deleted once the node has joined.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

FORMAT: Final = "edgesched-join/1"
TOKEN_CHARS: Final = 16


class JoinFileError(ValueError):
    """A join file that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class JoinFile:
    node_id: str
    broker: str  # HOST:PORT
    ca: str  # PEM
    cert: str  # PEM
    key: str  # PEM
    site: str | None = None
    site_peers: tuple[str, ...] = ()
    centrals: tuple[str, ...] = ("central",)

    def to_bytes(self) -> bytes:
        body = {"format": FORMAT, **asdict(self)}
        body["site_peers"], body["centrals"] = list(self.site_peers), list(self.centrals)
        return (json.dumps(body, indent=2) + "\n").encode()


def token_of(data: bytes) -> str:
    """The token of a join file's bytes: the start of their SHA-256, hex."""
    return hashlib.sha256(data).hexdigest()[:TOKEN_CHARS]


def write(path: Path, join: JoinFile) -> str:
    """Write ``join`` at ``path`` (0600, replacing it); its token."""
    data = join.to_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)
    return token_of(data)


def read(path: Path, token: str | None = None) -> JoinFile:
    """The join file at ``path``, checked against ``token`` when given; JoinFileError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise JoinFileError(f"join file {path}: no such file") from None
    except OSError as exc:
        raise JoinFileError(f"join file {path}: cannot read: {exc.strerror or exc}") from None
    if token is not None and token_of(data) != token.strip().lower():
        raise JoinFileError(
            f"join file {path}: does not match the token {token!r} (a damaged copy, or another "
            "node's file: take the file and the line `central add-node` printed together)"
        )
    try:
        body: Any = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise JoinFileError(f"join file {path}: not a join file (not JSON)") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise JoinFileError(f"join file {path}: not a join file (no format {FORMAT!r})")
    try:
        join = JoinFile(
            node_id=_str(body, "node_id"),
            broker=_str(body, "broker"),
            ca=_str(body, "ca"),
            cert=_str(body, "cert"),
            key=_str(body, "key"),
            site=body.get("site") if isinstance(body.get("site"), str) else None,
            site_peers=tuple(_strs(body, "site_peers")),
            centrals=tuple(_strs(body, "centrals")) or ("central",),
        )
    except KeyError as exc:
        raise JoinFileError(f"join file {path}: {exc.args[0]}") from None
    return join


def _str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise KeyError(f"{key} missing or not a string")
    return value


def _strs(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise KeyError(f"{key} must be a list of strings")
    return value
