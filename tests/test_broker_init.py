"""`edgesched broker init/check`, `central add-node/remove-node` and the join file, against a
real Mosquitto started from the configuration `broker init` wrote (on 127.0.0.1, a free port).

Each bad case a node meets at bring-up ends as one line naming the step and the reason: no
such host (DNS), nobody listening (TCP), the wrong CA (TLS), a certificate from another CA
(TLS, refused by the broker), a certificate the CA issued to a node never admitted (ACL), a
removed node (TLS: revoked), a join file that does not match its token.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from conftest import Broker, edgesched_binary, free_port
from paho.mqtt.enums import CallbackAPIVersion
from typer.testing import CliRunner

from edgesched.brokercheck import Target, check
from edgesched.brokerinit import BrokerDir
from edgesched.cli import app
from edgesched.joinfile import read
from edgesched.sync.security import acl, issue, load_ca, make_ca

runner = CliRunner()


def cli(*args: object) -> tuple[int, str, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[BrokerDir, Broker]]:
    """`broker init` on a free port, and Mosquitto running from what it wrote."""
    port = free_port()
    d = tmp_path / "broker"
    code, out, err = cli(
        "broker", "init", "--dir", d, "--address", f"127.0.0.1:{port}", "--bind", "127.0.0.1",
        "--user", "root",
    )  # fmt: skip
    assert code == 0, out + err
    assert "then admit a node: edgesched central add-node NODE" in out
    b = Broker(port, None, d / "mosquitto.conf", tmp_path / "mosquitto.log")  # type: ignore[arg-type]
    b.start()
    try:
        yield BrokerDir(d), b
    finally:
        b.stop()


def node_files(bd: BrokerDir, node: str, tmp_path: Path, *site: str) -> Target:
    """Admit ``node`` with the CLI and unpack its join file as join does."""
    code, out, err = cli("central", "add-node", "--file", node, "--dir", bd.root, *site)
    assert code == 0, out + err
    line = out.strip().splitlines()[-1].split()
    assert line[:2] == ["edgesched", "join"] and len(line) == 4, out
    j = read(Path(line[2]), line[3])
    d = tmp_path / node
    d.mkdir()
    for name, text in (("ca.crt", j.ca), ("node.crt", j.cert), ("node.key", j.key)):
        (d / name).write_text(text)
    host, port = j.broker.split(":")
    return Target(
        host, int(port), node, str(d / "ca.crt"), str(d / "node.crt"), str(d / "node.key")
    )


def lines_of(t: Target) -> list[str]:
    said: list[str] = []
    check(t, timeout=3.0, say=said.append)
    return said


def test_the_written_config_starts_and_listens_with_tls_only(
    fleet: tuple[BrokerDir, Broker], tmp_path: Path
) -> None:
    bd, broker = fleet
    conf = bd.conf.read_text()
    for directive in (
        "require_certificate true", "use_identity_as_username true", "tls_version tlsv1.2",
        f"crlfile {bd.crl}", f"acl_file {bd.acl}", "max_packet_size ", "persistence true",
        "allow_anonymous false", f"listener {broker.port} 127.0.0.1",
    ):  # fmt: skip
        assert directive in conf, directive
    assert stat.S_IMODE((bd.root / "ca" / "ca.key").stat().st_mode) == 0o600
    assert f"ExecStart={shutil.which('mosquitto')} -c {bd.conf}" in bd.unit.read_text()
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:  # installed here, though systemd is not PID 1
        verified = subprocess.run([analyze, "verify", "--man=no", str(bd.unit)],
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
        assert verified.returncode == 0 and not verified.stderr, verified.stderr
    # Plain MQTT on the TLS port gets no CONNACK: nothing answers in clear.
    plain = Target("127.0.0.1", broker.port, "gw-x", "", tls=False)
    said = lines_of(plain)
    assert said[-1].startswith("auth: FAILED: no CONNACK"), said


def test_an_admitted_node_passes_every_step(
    fleet: tuple[BrokerDir, Broker], tmp_path: Path
) -> None:
    bd, broker = fleet
    t = node_files(bd, "gw-02", tmp_path)
    join_file = bd.join_file("gw-02")
    assert stat.S_IMODE(join_file.stat().st_mode) == 0o600
    said = lines_of(t)
    assert [s.split(":")[0] for s in said] == ["DNS", "TCP", "TLS", "auth", "ACL"], said
    assert all(" ok: " in s for s in said), said
    # The same through the command line, as an operator runs it.
    done = subprocess.run(
        [edgesched_binary(), "broker", "check", "--broker", f"127.0.0.1:{broker.port}",
         "--node-id", "gw-02", "--ca", t.ca, "--cert", t.cert, "--key", t.key],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.count(" ok: ") == 5, done.stdout + done.stderr


def test_each_bad_case_is_one_line_naming_the_step(
    fleet: tuple[BrokerDir, Broker], tmp_path: Path
) -> None:
    bd, broker = fleet
    good = node_files(bd, "gw-02", tmp_path)

    def fails(t: Target) -> str:
        said = lines_of(t)
        assert sum("FAILED" in s for s in said) == 1 and "FAILED" in said[-1], said
        return said[-1]

    # DNS: a name that does not resolve.
    assert fails(Target("no-such-broker.invalid", broker.port, "gw-02", good.ca)).startswith(
        "DNS:  FAILED: cannot resolve 'no-such-broker.invalid'"
    )
    # TCP: nobody listens there.
    port = free_port()
    assert fails(Target("127.0.0.1", port, "gw-02", good.ca)) == (
        f"TCP:  FAILED: 127.0.0.1:{port}: Connection refused"
    )
    # TLS: we trust another CA than the broker's.
    other = make_ca(tmp_path / "other-ca")
    bad_ca = Target(good.host, good.port, "gw-02", str(other.cert), good.cert, good.key)
    assert fails(bad_ca).startswith("TLS:  FAILED: the broker's certificate does not verify: ")
    # TLS: our certificate is from another CA (the broker refuses it).
    stranger = issue(other, "gw-02", tmp_path / "stranger")
    wrong = Target(good.host, good.port, "gw-02", good.ca, str(stranger.cert), str(stranger.key))
    assert fails(wrong).startswith("TLS:  FAILED: the broker refused our certificate")
    # ACL: the fleet CA issued it, but the node was never admitted.
    outsider = issue(load_ca(bd.root / "ca"), "gw-99", tmp_path / "outsider")
    never = Target(good.host, good.port, "gw-99", good.ca, str(outsider.cert), str(outsider.key))
    line = fails(never)
    assert line.startswith("ACL:  FAILED: a message to edgesched/v1/node/gw-99/check did not")
    # The good one still passes (none of the above disturbed it).
    assert lines_of(good)[-1].startswith("ACL:  ok")


def test_a_removed_node_is_refused_and_its_open_connection_loses_its_rights(
    fleet: tuple[BrokerDir, Broker], tmp_path: Path
) -> None:
    bd, broker = fleet
    t = node_files(bd, "gw-02", tmp_path)
    # The node is connected (a paho client as its engine would be) and hears itself.
    got: list[bytes | bytearray] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="gw-02")
    client.tls_set(ca_certs=t.ca, certfile=t.cert, keyfile=t.key)
    client.on_message = lambda c, u, m: got.append(m.payload)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        client.subscribe("edgesched/v1/node/gw-02/x", qos=1)
        time.sleep(0.3)
        client.publish("edgesched/v1/node/gw-02/x", b"before", qos=1).wait_for_publish(5)
        deadline = time.monotonic() + 5
        while b"before" not in got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == [b"before"]

        code, out, err = cli("central", "remove-node", "gw-02", "--dir", bd.root)
        assert code == 0, out + err
        assert "reloaded the broker (SIGHUP to Mosquitto pid" in out
        assert not bd.join_file("gw-02").exists()
        time.sleep(0.5)  # the SIGHUP is asynchronous
        client.publish("edgesched/v1/node/gw-02/x", b"after", qos=1).wait_for_publish(5)
        time.sleep(1.0)
        assert got == [b"before"], "a removed node's message was still delivered"
    finally:
        client.loop_stop()
        client.disconnect()
    said = lines_of(t)
    assert said[-1].startswith("TLS:  FAILED: the broker refused our certificate"), said
    code, out, err = cli("central", "remove-node", "gw-02", "--dir", bd.root)
    assert code == 2 and err.strip() == "error: gw-02 was removed already"


def test_add_node_refusals_and_the_join_token(tmp_path: Path) -> None:
    d = tmp_path / "broker"
    code, out, err = cli("central", "add-node", "--file", "gw-02", "--dir", d)
    assert code == 2 and err.strip().startswith(f"error: {d}: no broker here"), err
    code, out, err = cli("broker", "init", "--dir", d, "--address", "127.0.0.1", "--user", "root")
    assert code == 0, out + err
    code, out, err = cli("broker", "init", "--dir", d)
    assert code == 2 and "exists: this directory has a broker already" in err
    code, out, err = cli("central", "add-node", "--file", "gw-02", "--dir", d)
    assert code == 0 and "the broker is not running" in err, err
    join_file, token = out.split()[2:4]
    code, out, err = cli("central", "add-node", "--file", "gw-02", "--dir", d)
    assert code == 2 and "gw-02 is admitted already" in err
    code, out, err = cli("central", "add-node", "--file", "gw-03", "--site", "north", "--dir", d)
    assert code == 2 and "--site north: no site broker registered" in err
    code, out, err = cli("central", "add-node", "--file", "central", "--dir", d)
    assert code == 2 and "taken by a central" in err
    # join refuses a file that does not match its token, or is not there: one line each.
    code, out, err = cli("join", join_file, "0" * 16, "--root", tmp_path / "gw")
    assert code == 1 and err.count("\n") == 1 and "does not match the token" in err, err
    code, out, err = cli("join", tmp_path / "nope.join", "--root", tmp_path / "gw")
    assert code == 1 and err.strip() == f"error: join file {tmp_path / 'nope.join'}: no such file"
    # The broker is not running: join stops at the check, with nothing installed.
    code, out, err = cli("join", join_file, token, "--root", tmp_path / "gw", "--wait", "0")
    assert code == 1 and "TCP: " in err and "(nothing was installed)" in err, out + err
    assert not (tmp_path / "gw").exists()


def test_a_site_broker_bridges_its_nodes_to_central(tmp_path: Path) -> None:
    cport, sport = free_port(), free_port()
    cdir, sdir = tmp_path / "central", tmp_path / "site-north"
    code, out, err = cli(
        "broker", "init", "--dir", cdir, "--address", f"127.0.0.1:{cport}", "--bind",
        "127.0.0.1", "--user", "root",
    )  # fmt: skip
    assert code == 0, out + err
    code, out, err = cli(
        "broker", "init", "--dir", sdir, "--address", f"127.0.0.1:{sport}", "--bind",
        "127.0.0.1", "--user", "root", "--site", "north", "--central-broker",
        f"127.0.0.1:{cport}", "--central-dir", cdir, "--ca-dir", cdir / "ca",
    )  # fmt: skip
    assert code == 0, out + err
    conf = (sdir / "mosquitto.conf").read_text()
    assert f"address 127.0.0.1:{cport}" in conf and "bridge_certfile" in conf
    assert "user bridge-north" in (cdir / "acl").read_text()
    central = Broker(cport, None, cdir / "mosquitto.conf", tmp_path / "c.log")  # type: ignore[arg-type]
    site = Broker(sport, None, sdir / "mosquitto.conf", tmp_path / "s.log")  # type: ignore[arg-type]
    central.start()
    site.start()
    try:
        t = node_files(BrokerDir(cdir), "gw-n1", tmp_path, "--site", "north")
        assert t.port == sport  # the join file sends the node to its site's broker
        said = lines_of(t)
        assert said[-1].startswith("ACL:  ok"), said
        # What the node publishes on its site broker reaches central over the bridge.
        got: list[str] = []
        files = BrokerDir(cdir).client("central")
        sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="central")
        sub.tls_set(ca_certs=t.ca, certfile=str(files.cert), keyfile=str(files.key))
        sub.on_message = lambda c, u, m: got.append(m.topic)
        sub.connect("127.0.0.1", cport)
        sub.loop_start()
        pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="gw-n1")
        pub.tls_set(ca_certs=t.ca, certfile=t.cert, keyfile=t.key)
        pub.connect("127.0.0.1", sport)
        pub.loop_start()
        try:
            sub.subscribe("edgesched/v1/node/+/status", qos=1)
            topic = "edgesched/v1/node/gw-n1/status"
            deadline = time.monotonic() + 10
            while topic not in got and time.monotonic() < deadline:
                pub.publish(topic, b"online", qos=1)
                time.sleep(0.3)
            assert topic in got, (tmp_path / "s.log").read_text()[-2000:]
        finally:
            for c in (sub, pub):
                c.loop_stop()
                c.disconnect()
    finally:
        site.stop()
        central.stop()
    # The site broker's ACL admits the node too (add-node --site updated it).
    assert "user gw-n1" in (sdir / "acl").read_text()


def test_the_per_node_acl_is_the_pattern_acl_for_listed_nodes_only() -> None:
    patterns = [
        line.split(" ", 2)[1:]
        for line in acl(["central"]).splitlines()
        if line.startswith("pattern")
    ]
    text = acl(["central"], nodes=["gw-01"], bridges={"bridge-s1": ["gw-01", "gw-09"]})
    assert "pattern " not in text and "gw-09" not in text
    for access, pattern in patterns:
        assert f"topic {access} {pattern.replace('%u', 'gw-01')}" in text
    assert text.count("topic write edgesched/v1/node/gw-01/#") == 2  # the node, its bridge
    with pytest.raises(ValueError, match="cannot also be a node"):
        acl(["central"], nodes=["central"])


def test_join_checks_then_installs_everything_from_the_file(
    fleet: tuple[BrokerDir, Broker], tmp_path: Path
) -> None:
    bd, broker = fleet
    code, out, err = cli("central", "add-node", "--file", "gw-02", "--dir", bd.root)
    assert code == 0, out + err
    join_file, token = out.split()[2:4]
    root = tmp_path / "gw"
    code, out, err = cli("join", join_file, token, "--root", root, "--dry-run")
    assert code == 0 and "ACL:  ok" in out and "nothing is written" in out, out + err
    assert not root.exists()
    code, out, err = cli("join", join_file, token, "--root", root, "--wait", "0")
    assert code == 0, out + err
    edge = tomllib.loads((root / "etc/edgesched/edge.toml").read_text())["edge"]
    assert edge["node_id"] == "gw-02" and edge["centrals"] == ["central"]
    assert edge["mqtt"] == {
        "host": "127.0.0.1", "port": broker.port, "tls": True,
        "ca_file": "/etc/edgesched/certs/ca.crt",
        "cert_file": "/etc/edgesched/certs/gw-02.crt",
        "key_file": "/etc/edgesched/certs/gw-02.key",
    }  # fmt: skip
    key = root / "etc/edgesched/certs/gw-02.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text() == read(Path(join_file)).key
