"""Joining by URL and one-time token (issue 18): `central add-node` prints `edgesched join
https://HOST:PORT TOKEN`, `central join-server` (a real process, HTTPS with the broker's
certificate) spends the token, and the gateway's `join` gets its certificate for a key it
made itself, then checks the broker and installs as from a join file. Against a real
Mosquitto started from what `broker init` wrote, on 127.0.0.1.

The refusals: a reused token, an expired one and an unknown one get the same 403; a token
pinning another CA stops the gateway before anything is written or spent; a CSR naming
another node, a malformed body and an oversized one are refused (400, 400, 413) without
spending the token; a node joined by URL is revoked by `remove-node` as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import ssl
import subprocess
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Broker, edgesched_binary, free_port, wait_for_port
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from typer.testing import CliRunner

from edgesched.brokercheck import Target, check
from edgesched.brokerinit import BrokerDir
from edgesched.cli import app
from edgesched.joinserver import RefusalLimit, serve
from edgesched.jointoken import TOKENS, ca_pin, load
from edgesched.sync.security import make_ca

runner = CliRunner()


def cli(*args: object) -> tuple[int, str, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@dataclass
class Fleet:
    bd: BrokerDir
    broker: Broker
    url: str
    log: Path

    def add(self, node: str, *more: object) -> str:
        """`central add-node NODE`: the token of the line it printed (checked)."""
        code, out, err = cli("central", "add-node", node, "--dir", self.bd.root,
                             "--url", self.url, *more)  # fmt: skip
        assert code == 0, out + err
        line = out.strip().split()
        assert line[:3] == ["edgesched", "join", self.url] and len(line) == 4, out
        return line[3]

    def post(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """POST /join as anyone would, verifying the server against the fleet CA."""
        context = ssl.create_default_context(cafile=str(self.bd.ca_cert))
        port = int(self.url.rsplit(":", 1)[1])
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
        conn.request("POST", "/join", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
        conn.close()
        return resp.status, data


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """`broker init`, its Mosquitto, and `central join-server` on free ports."""
    tmp = tmp_path_factory.mktemp("fleet")
    port, jport = free_port(), free_port()
    d = tmp / "broker"
    code, out, err = cli("broker", "init", "--dir", d, "--address", f"127.0.0.1:{port}",
                         "--bind", "127.0.0.1", "--user", "root")  # fmt: skip
    assert code == 0, out + err
    broker = Broker(port, None, d / "mosquitto.conf", tmp / "mosquitto.log")  # type: ignore[arg-type]
    broker.start()
    log = tmp / "join-server.log"
    with log.open("ab") as out_f:
        server = subprocess.Popen(
            [edgesched_binary(), "central", "join-server", "--dir", str(d),
             "--listen", f"127.0.0.1:{jport}", "--refusals-per-minute", "1000"],
            stdout=out_f, stderr=out_f,
        )  # fmt: skip
    try:
        wait_for_port(jport)
        yield Fleet(BrokerDir(d), broker, f"https://127.0.0.1:{jport}", log)
    finally:
        server.terminate()
        server.wait(10)
        broker.stop()


def join(fleet: Fleet, token: str, root: Path, *more: object) -> tuple[int, str, str]:
    return cli("join", fleet.url, token, "--root", root, "--wait", "0", *more)


def installed(root: Path, node: str, port: int) -> Target:
    certs = root / "etc/edgesched/certs"
    return Target("127.0.0.1", port, node, str(certs / "ca.crt"), str(certs / f"{node}.crt"),
                  str(certs / f"{node}.key"))  # fmt: skip


def lines_of(t: Target) -> list[str]:
    said: list[str] = []
    check(t, timeout=3.0, say=said.append)
    return said


def one_error(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def csr_pem(*names: x509.NameAttribute[Any], san: str | None = None) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(list(names)))
    if san is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False
        )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def test_a_gateway_joins_by_url_with_a_key_made_on_it_and_remove_node_revokes_it(
    fleet: Fleet, tmp_path: Path
) -> None:
    token = fleet.add("gw-url")
    tokens = fleet.bd.root / TOKENS
    assert oct(tokens.stat().st_mode & 0o777) == "0o600"
    assert token.split(".")[1] not in tokens.read_text()  # only the secret's hash is kept
    assert token.split(".")[0] == ca_pin(fleet.bd.ca_cert.read_bytes())
    # Not admitted before the token is spent: the ACL does not name it.
    assert "gw-url" not in fleet.bd.acl.read_text()

    root = tmp_path / "gw"
    started = time.monotonic()
    code, out, err = cli("join", fleet.url, token, "--root", root)  # (the default wait)
    assert code == 0, out + err
    # Staged under --root: nothing runs here, so it does not wait for the node.
    assert out.strip().splitlines()[-1] == (
        f"staged under --root {root}: nothing runs here, so no wait; on the gateway the unit "
        "starts gw-url"
    ), out
    assert time.monotonic() - started < 30
    for step in ("DNS:  ok", "TCP:  ok", "TLS:  ok", "auth: ok", "ACL:  ok"):
        assert step in out, out
    assert "the join server admitted gw-url" in out, out
    # The broker takes the certificate the join server issued, as the node uses it.
    t = installed(root, "gw-url", fleet.broker.port)
    said = lines_of(t)
    assert said[-1].startswith("ACL:  ok"), said
    # The key was made on the gateway: nothing on central's side holds it.
    key_pem = Path(t.key).read_bytes()
    assert oct(Path(t.key).stat().st_mode & 0o777) == "0o600"
    cert = x509.load_pem_x509_certificate(Path(t.cert).read_bytes())
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert cert.public_key() == key.public_key()
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gw-url"
    body = key_pem.split(b"-----")[2]
    for path in fleet.bd.root.rglob("*"):
        if path.is_file():
            assert body not in path.read_bytes(), path
    assert not fleet.bd.join_file("gw-url").exists()
    record = [r for r in load(fleet.bd.root).values() if r["node_id"] == "gw-url"]
    assert len(record) == 1 and record[0]["used"], record

    # Revoked: out of the ACL, its certificate in the CRL; its next connection refused.
    code, out, err = cli("central", "remove-node", "gw-url", "--dir", fleet.bd.root)
    assert code == 0 and "reloaded the broker (SIGHUP" in out, out + err
    time.sleep(0.5)  # the SIGHUP is asynchronous
    said = lines_of(t)
    assert said[-1].startswith("TLS:  FAILED: the broker refused our certificate"), said


def test_a_token_is_spent_once_and_an_expired_or_unknown_one_is_refused_alike(
    fleet: Fleet, tmp_path: Path
) -> None:
    token = fleet.add("gw-once")
    code, out, err = join(fleet, token, tmp_path / "first")
    assert code == 0, out + err
    # Reused: the same line as for an expired token, and nothing installed.
    code, out, err = join(fleet, token, tmp_path / "again")
    reused = one_error(err)
    assert reused == (
        "error: token: refused by the join server: unknown, expired or already used (ask "
        "central's operator for a new one: edgesched central add-node NODE)"
    ), err
    assert not (tmp_path / "again").exists()

    expiring = fleet.add("gw-late", "--ttl", "1s")
    time.sleep(1.2)
    code, out, err = join(fleet, expiring, tmp_path / "late")
    assert code == 1 and one_error(err) == reused, err
    assert not (tmp_path / "late").exists()
    assert "gw-late" not in fleet.bd.acl.read_text()

    unknown = token.split(".")[0] + "." + "0" * 32
    code, out, err = join(fleet, unknown, tmp_path / "unknown")
    assert code == 1 and one_error(err) == reused, err
    # The server says the same to a direct request with each of them.
    for t in (token, expiring, unknown):
        status, answer = fleet.post(json.dumps({"token": t, "csr_pem": csr_pem()}).encode())
        assert status == 403 and answer["error"].startswith("token refused: "), answer


def test_a_token_pinning_another_ca_stops_the_gateway_with_nothing_written(
    fleet: Fleet, tmp_path: Path
) -> None:
    token = fleet.add("gw-pin")
    other = make_ca(tmp_path / "other-ca")
    forged = ca_pin(other.cert.read_bytes()) + "." + token.split(".")[1]
    root = tmp_path / "gw"
    code, out, err = join(fleet, forged, root)
    line = one_error(err)
    assert code == 1 and line.startswith("error: CA pin: the CA 127.0.0.1:"), err
    assert "nothing was written" in line
    assert not root.exists()
    # The token was not sent, so not spent: the right one still joins.
    code, out, err = join(fleet, token, root)
    assert code == 0, out + err


def test_bad_requests_are_refused_without_spending_the_token(fleet: Fleet, tmp_path: Path) -> None:
    token = fleet.add("gw-csr")
    # A CSR naming another node (its CN, or a SAN).
    for csr in (
        csr_pem(x509.NameAttribute(NameOID.COMMON_NAME, "gw-99")),
        csr_pem(san="gw-99"),
        csr_pem(
            x509.NameAttribute(NameOID.COMMON_NAME, "gw-csr"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "x"),
        ),
    ):
        status, answer = fleet.post(json.dumps({"token": token, "csr_pem": csr}).encode())
        assert status == 400, answer
        assert answer["error"].startswith("csr_pem: the CSR names "), answer
        assert answer["error"].endswith("this token is for gw-csr only"), answer
    status, answer = fleet.post(json.dumps({"token": token, "csr_pem": "junk"}).encode())
    assert (status, answer["error"]) == (
        400, "csr_pem: csr_pem is not a PEM certificate signing request"
    )  # fmt: skip
    # Malformed bodies.
    for body, words in (
        (b"{not json", "the body must be JSON"),
        (b"[1, 2]", "the body must be a JSON object"),
        (b"[" * 8000 + b"]" * 8000, "the body must be JSON"),  # past the parser's depth
        (json.dumps({"token": token}).encode(), "token and csr_pem must both be strings"),
        (json.dumps({"token": "abc", "csr_pem": "x"}).encode(), "is not a join token"),
    ):
        status, answer = fleet.post(body)
        assert status == 400 and words in answer["error"], (body, answer)
    # Oversized.
    big = json.dumps({"token": token, "csr_pem": "x" * 20_000}).encode()
    status, answer = fleet.post(big)
    assert status == 413 and answer["error"] == "request body over 16384 bytes", answer
    assert "gw-csr" not in fleet.bd.acl.read_text()
    # None of those spent it.
    code, out, err = join(fleet, token, tmp_path / "gw")
    assert code == 0, out + err
    assert "user gw-csr" in fleet.bd.acl.read_text()


def test_each_gateway_side_failure_is_one_line(fleet: Fleet, tmp_path: Path) -> None:
    token = fleet.add("gw-fail")
    root = tmp_path / "gw"
    cases = [
        ("https://no-such-central.invalid:8884", "error: DNS: cannot resolve "
         "'no-such-central.invalid'"),
        (f"https://127.0.0.1:{free_port()}", "error: TCP: 127.0.0.1:"),
        # the broker's port: TLS, but it wants a client certificate and says so after
        (f"https://127.0.0.1:{fleet.broker.port}", "error: TLS: 127.0.0.1:"),
        ("http://127.0.0.1:8884", "error: URL: 'http://127.0.0.1:8884' is not https://"),
    ]  # fmt: skip
    for url, start in cases:
        code, out, err = cli("join", url, token, "--root", root, "--wait", "0")
        assert code == 1 and one_error(err).startswith(start), (url, err)
    code, out, err = cli("join", fleet.url, "nope", "--root", root)
    assert code == 1 and one_error(err).startswith("error: token: token 'nope' is not a join"), err
    code, out, err = cli("join", fleet.url, "--root", root)
    assert code == 1 and "a join URL needs its token" in one_error(err), err
    # A dry run checks the server and the pin but spends nothing.
    code, out, err = cli("join", fleet.url, token, "--root", root, "--dry-run")
    assert code == 0 and "the token was not spent" in out, out + err
    assert not root.exists()
    code, out, err = join(fleet, token, root)
    assert code == 0, out + err


def test_a_failure_after_the_token_is_spent_keeps_the_key_for_a_retry(
    fleet: Fleet, tmp_path: Path
) -> None:
    token = fleet.add("gw-keep")
    root = tmp_path / "gw"
    fleet.broker.stop()  # the join server admits the node; its broker check then fails
    try:
        code, out, err = join(fleet, token, root)
    finally:
        fleet.broker.start()
    kept = root / "etc/edgesched/gw-keep.join"
    assert code == 1 and one_error(err) == (
        f"error: TCP: 127.0.0.1:{fleet.broker.port}: Connection refused (nothing was "
        f"installed); the token is spent: the node's certificate and key are kept in {kept} "
        f"(0600), retry with `edgesched join {kept}`"
    ), err
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert not (root / "etc/edgesched/edge.toml").exists()
    code, out, err = cli("join", kept, "--root", root, "--wait", "0")
    assert code == 0 and "ACL:  ok" in out, out + err
    assert lines_of(installed(root, "gw-keep", fleet.broker.port))[-1].startswith("ACL:  ok")


def test_remove_node_revokes_every_certificate_a_node_was_issued(
    fleet: Fleet, tmp_path: Path
) -> None:
    code, out, err = join(fleet, fleet.add("gw-twice"), tmp_path / "one")
    assert code == 0, out + err
    # Admitted already: a new token needs --force; its certificate joins the first.
    code, out, err = cli("central", "add-node", "gw-twice", "--dir", fleet.bd.root)
    assert code == 2 and "gw-twice is admitted already" in one_error(err), err
    code, out, err = join(fleet, fleet.add("gw-twice", "--force"), tmp_path / "two")
    assert code == 0, out + err
    first, second = (installed(tmp_path / r, "gw-twice", fleet.broker.port) for r in ("one", "two"))
    assert lines_of(first)[-1].startswith("ACL:  ok")
    code, out, err = cli("central", "remove-node", "gw-twice", "--dir", fleet.bd.root)
    assert code == 0, out + err
    time.sleep(0.5)  # the SIGHUP is asynchronous
    for t in (first, second):
        said = lines_of(t)
        assert said[-1].startswith("TLS:  FAILED: the broker refused our certificate"), said


@contextlib.contextmanager
def join_server(broker_dir: Path, host: str, port: int) -> Iterator[None]:
    """The join server in a thread of this process (:func:`edgesched.joinserver.serve`)."""
    ready, done = threading.Event(), threading.Event()

    def run() -> None:
        async def main() -> None:
            up, stop = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(serve(broker_dir, host, port, ready=up, stop=stop))
            await up.wait()
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.05)
            stop.set()
            await task

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        yield
    finally:
        done.set()
        thread.join(10)


def test_a_join_server_reached_by_a_name_its_certificate_lacks_is_not_trusted(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The pin holds (same CA), but the certificate does not name 127.0.0.2: the verified
    connection fails, before the token is sent."""
    port = free_port()
    with join_server(fleet.bd.root, "127.0.0.2", port):
        token = fleet.add("gw-name")
        code, _, err = cli("join", f"https://127.0.0.2:{port}", token, "--root", tmp_path)
        assert code == 1 and one_error(err).startswith(
            "error: TLS: the join server's certificate does not verify against the pinned "
            "fleet CA (IP address mismatch"
        ), err
    records = [r for r in load(fleet.bd.root).values() if r["node_id"] == "gw-name"]
    assert [r["used"] for r in records] == [False]


def test_a_site_node_joined_by_url_goes_to_its_site_broker(tmp_path: Path) -> None:
    cdir, sdir = tmp_path / "central", tmp_path / "site-north"
    cport, sport, jport = free_port(), free_port(), free_port()
    code, out, err = cli("broker", "init", "--dir", cdir, "--address", f"127.0.0.1:{cport}",
                         "--user", "root")  # fmt: skip
    assert code == 0, out + err
    code, out, err = cli(
        "broker", "init", "--dir", sdir, "--address", f"127.0.0.1:{sport}", "--user", "root",
        "--site", "north", "--central-broker", f"127.0.0.1:{cport}", "--central-dir", cdir,
        "--ca-dir", cdir / "ca",
    )  # fmt: skip
    assert code == 0, out + err
    url = f"https://127.0.0.1:{jport}"
    code, out, err = cli("central", "add-node", "gw-n1", "--site", "north", "--dir", cdir,
                         "--url", url)  # fmt: skip
    assert code == 0, out + err
    token = out.split()[3]
    root = tmp_path / "gw"
    with join_server(cdir, "127.0.0.1", jport):  # no broker runs: --no-check
        code, out, err = cli("join", url, token, "--root", root, "--no-check", "--wait", "0")
    assert code == 0, out + err
    edge = tomllib.loads((root / "etc/edgesched/edge.toml").read_text())["edge"]
    assert (edge["site"], edge["mqtt"]["port"]) == ("north", sport), edge
    assert "user gw-n1" in (sdir / "acl").read_text()
    assert "user gw-n1" in (cdir / "acl").read_text()


def test_join_server_refusals_are_one_line(fleet: Fleet, tmp_path: Path) -> None:
    port = fleet.url.rsplit(":", 1)[1]
    code, _, err = cli("central", "join-server", "--dir", fleet.bd.root,
                       "--listen", f"127.0.0.1:{port}")  # fmt: skip
    assert code == 1 and "address already in use" in one_error(err), err
    code, _, err = cli("central", "join-server", "--dir", tmp_path / "none")
    assert code == 2 and one_error(err).startswith(f"error: {tmp_path / 'none'}: no broker"), err
    code, _, err = cli("central", "add-node", "gw-x", "--dir", fleet.bd.root, "--ttl", "soon")
    assert code == 2 and one_error(err).startswith("error: --ttl: 'soon' is not a duration"), err


def test_an_address_refused_too_often_waits_and_spends_nothing(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A join server of its own, at 3 refusals a minute: three unknown tokens are 403, then
    even a good token from that address is 429 (with Retry-After) and stays unspent."""
    jport = free_port()
    log = (tmp_path / "limited.log").open("ab")
    server = subprocess.Popen(
        [edgesched_binary(), "central", "join-server", "--dir", str(fleet.bd.root),
         "--listen", f"127.0.0.1:{jport}", "--refusals-per-minute", "3"],
        stdout=log, stderr=log,
    )  # fmt: skip
    try:
        wait_for_port(jport)
        limited = Fleet(fleet.bd, fleet.broker, f"https://127.0.0.1:{jport}", fleet.log)
        good = fleet.add("gw-patient")
        unknown = good.split(".")[0] + "." + "0" * 32
        body = json.dumps({"token": unknown, "csr_pem": csr_pem()}).encode()
        assert [limited.post(body)[0] for _ in range(3)] == [403, 403, 403]
        status, data = limited.post(json.dumps({"token": good, "csr_pem": csr_pem()}).encode())
        assert status == 429, data
        assert data["error"].startswith("too many refused tokens from 127.0.0.1: try again in ")
        record = [r for r in load(fleet.bd.root).values() if r["node_id"] == "gw-patient"]
        assert len(record) == 1 and not record[0]["used"], record
        # The module's server (another limit) still takes it.
        code, out, err = join(fleet, good, tmp_path / "gw")
        assert code == 0, out + err
    finally:
        server.terminate()
        server.wait(10)


def test_the_refusal_limit_slides_over_a_minute_and_forgets_the_oldest_address() -> None:
    now = [1000.0]
    limit = RefusalLimit(2, clock=lambda: now[0], max_addresses=2)
    assert limit.wait_s("a") == 0
    limit.refused("a")
    now[0] += 10
    limit.refused("a")
    assert limit.wait_s("a") == pytest.approx(50.0)  # until the first refusal is a minute old
    assert limit.wait_s("b") == 0  # per address
    now[0] += 50
    assert limit.wait_s("a") == 0  # the first one slid out
    limit.refused("a")
    assert limit.wait_s("a") == pytest.approx(10.0)
    limit.refused("b")
    limit.refused("c")  # a third address: the least recently refused ("a") is forgotten
    assert limit.wait_s("a") == 0
    with pytest.raises(ValueError):
        RefusalLimit(0)
