"""``edgesched broker check``: connect to the broker as a node would and say what works.

Role: the bring-up diagnosis of ``join`` and of an operator, one step at a time, each a line:
DNS (the name resolves), TCP (the port answers), TLS (the broker's certificate verifies
against the fleet CA and names the host; ours is taken), auth (the broker's CONNACK), ACL (a
QoS 1 message on the node's own ``node/<id>/check`` topic comes back: Mosquitto grants every
SUBSCRIBE and drops a denied PUBLISH silently, so only a delivery proves both rights). The
first step that fails ends the check with the exact reason. MQTT 3.1.1 is spoken directly on
the socket (a few packets), so each failure is seen where it happens.

The broker lets one connection per identity: a check as node X takes over X's session
(clean session: its queued messages are dropped, the node resyncs). Run it before the node
starts, or while it is down.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edgesched.sync.wire import TOPIC_ROOT

#: MQTT 3.1.1 CONNACK return codes.
CONNACK_CODES = {
    1: "unacceptable protocol version",
    2: "client id rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized (the broker took no identity from the certificate: is "
    "use_identity_as_username on, and the certificate for this node?)",
}


@dataclass
class Step:
    name: str  # DNS, TCP, TLS, auth, ACL
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{self.name + ':':<5} {'ok' if self.ok else 'FAILED'}: {self.detail}"


@dataclass
class CheckResult:
    steps: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps) and self.steps[-1].name == "ACL"

    @property
    def failure(self) -> Step | None:
        return next((s for s in self.steps if not s.ok), None)


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    node_id: str
    ca: str
    cert: str = ""
    key: str = ""
    username: str | None = None
    password: str | None = None
    tls: bool = True


class _Failed(Exception):
    pass


def check(t: Target, timeout: float = 5.0, say: Callable[[str], None] | None = None) -> CheckResult:
    """Run the steps against ``t``; each step's line goes to ``say`` as it completes."""
    out = CheckResult()

    def step(name: str, ok: bool, detail: str) -> None:
        s = Step(name, ok, detail)
        out.steps.append(s)
        if say is not None:
            say(s.line())
        if not ok:
            raise _Failed

    sock: socket.socket | None = None
    try:
        try:
            infos = socket.getaddrinfo(t.host, t.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            step("DNS", False, f"cannot resolve {t.host!r}: {exc.strerror}")
        ip = str(infos[0][4][0])
        step("DNS", True, f"{t.host} is {ip}")
        try:
            sock = socket.create_connection((ip, t.port), timeout=timeout)
        except TimeoutError:
            step("TCP", False, f"{ip}:{t.port}: no answer in {timeout:g} s (firewall?)")
        except OSError as exc:
            step("TCP", False, f"{ip}:{t.port}: {exc.strerror or exc}")
        assert sock is not None
        step("TCP", True, f"{ip}:{t.port} accepts connections")
        if t.tls:
            sock = _tls(sock, t, timeout, step)
        _mqtt(sock, t, timeout, step)
    except _Failed:
        pass
    finally:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
    return out


def _tls(
    sock: socket.socket, t: Target, timeout: float, step: Callable[[str, bool, str], None]
) -> socket.socket:
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=t.ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if t.cert:
            context.load_cert_chain(t.cert, t.key or None)
    except (OSError, ssl.SSLError) as exc:
        step("TLS", False, f"cannot load our files (ca {t.ca}, cert {t.cert}): {exc}")
    try:
        wrapped = context.wrap_socket(sock, server_hostname=t.host)
    except ssl.SSLCertVerificationError as exc:
        step("TLS", False, f"the broker's certificate does not verify: {exc.verify_message}")
    except (ssl.SSLError, OSError) as exc:
        step("TLS", False, f"handshake failed: {_ssl_reason(exc)}")
    wrapped.settimeout(timeout)
    return wrapped


def _ssl_reason(exc: BaseException) -> str:
    text = getattr(exc, "reason", None) or str(exc)
    low = str(exc).lower()
    if "revoked" in low:
        return "our certificate is revoked (the node was removed: central remove-node)"
    if "unknown ca" in low or "certificate verify failed" in low or "bad certificate" in low:
        return f"the broker refused our certificate ({text}: not signed by its CA?)"
    if "certificate required" in low:
        return f"the broker wants a client certificate ({text})"
    if "wrong version number" in low or "unexpected eof" in low:
        return f"{text} (is this port plain MQTT, not TLS?)"
    return str(text)


def _refused(exc: BaseException) -> str:
    """Why the broker ended the TLS session before answering CONNECT."""
    if isinstance(exc, ssl.SSLError) and "revoked" in str(exc).lower():
        return f"the broker refused our certificate: {_ssl_reason(exc)}"
    return (
        "the broker refused our certificate (it closed the connection in the TLS handshake): "
        "revoked (the node was removed: central remove-node), or signed by a CA the broker "
        f"does not trust ({exc})"
    )


def _remaining(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(s: str) -> bytes:
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def _packet(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + _remaining(len(body)) + body


def _read_packet(sock: socket.socket) -> tuple[int, bytes]:
    head = _recv(sock, 1)[0]
    mult, length = 1, 0
    while True:
        b = _recv(sock, 1)[0]
        length += (b & 0x7F) * mult
        mult *= 128
        if not b & 0x80:
            break
    return head, _recv(sock, length)


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def _mqtt(
    sock: socket.socket, t: Target, timeout: float, step: Callable[[str, bool, str], None]
) -> None:
    flags = 0x02  # clean session
    payload = _utf8(t.node_id)
    if t.username is not None:
        flags |= 0x80
        payload += _utf8(t.username)
        if t.password is not None:
            flags |= 0x40
            payload += _utf8(t.password)
    body = _utf8("MQTT") + bytes([4, flags]) + struct.pack("!H", 30) + payload
    tls = isinstance(sock, ssl.SSLSocket)
    try:
        sock.sendall(_packet(0x10, body))
        kind, data = _read_packet(sock)
    except (ssl.SSLError, OSError, ConnectionError) as exc:
        if tls:  # TLS 1.3: the broker's verdict on our certificate comes after the handshake
            step("TLS", False, _refused(exc))
        step("auth", False, f"no CONNACK: {exc} (the broker's log says why)")
    if isinstance(sock, ssl.SSLSocket):
        step("TLS", True, f"{sock.version()}, the broker's certificate verifies for {t.host}")
    if kind >> 4 != 2 or len(data) < 2:
        step("auth", False, f"unexpected answer to CONNECT (packet type {kind >> 4})")
    if data[1] != 0:
        step("auth", False, f"CONNACK {data[1]}: {CONNACK_CODES.get(data[1], 'refused')}")
    who = f"as {t.username}" if t.username else "with the certificate's name as identity"
    step("auth", True, f"CONNACK accepted, {who}")
    topic = f"{TOPIC_ROOT}/node/{t.node_id}/check"
    try:
        sock.sendall(_packet(0x82, struct.pack("!H", 1) + _utf8(topic) + b"\x01"))
        sent = f"check {time.time():.3f}".encode()
        sock.sendall(_packet(0x32, _utf8(topic) + struct.pack("!H", 2) + sent))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kind, data = _read_packet(sock)
            if kind >> 4 == 3:  # PUBLISH
                qos = (kind >> 1) & 3
                tlen = struct.unpack("!H", data[:2])[0]
                start = 2 + tlen + (2 if qos else 0)
                if qos:
                    sock.sendall(_packet(0x40, data[2 + tlen : 4 + tlen]))
                if data[2 : 2 + tlen].decode() == topic and data[start:] == sent:
                    with contextlib.suppress(OSError):
                        sock.sendall(b"\xe0\x00")  # DISCONNECT
                    step("ACL", True, f"published and received on {topic}")
                    return
    except TimeoutError:
        pass
    except (OSError, ConnectionError) as exc:
        step("ACL", False, f"{topic}: {exc}")
    step(
        "ACL",
        False,
        f"a message to {topic} did not come back: the broker's ACL gives {t.node_id} no "
        "rights (not admitted, or removed: central add-node)",
    )
