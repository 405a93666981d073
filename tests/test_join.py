"""The join flow end to end (issue 18), on this machine as an operator runs it: `broker init`,
Mosquitto from the config it wrote, `central run` over TLS, `central add-node gw-02`, and the
`edgesched join ...` line it printed run on the gateway, a network namespace of its own with
the broker reached over a veth: the node ends connected at central. Then `central
remove-node gw-02`: the node's next connection is refused (TLS: its certificate revoked).
Twice: joining by URL (`central join-server` on central's machine, the gateway spending its
one-time token there for a certificate on a key it made) and by join file (`--file`).

Root only (network namespaces); CI runs as root. There is no systemd here, so the test
starts the node's engine as the unit would (`edgesched edge run` with the installed config,
its state in a scratch directory instead of /var/lib/edgesched), while `join` waits.
"""

from __future__ import annotations

import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import edgesched_binary, mosquitto_binary, write_central_config

from edgesched.fieldtest.netns import Fabric, Host, available
from edgesched.rest.client import ApiClient, ApiTarget
from edgesched.tomlwrite import toml_dumps

pytestmark = pytest.mark.skipif(
    available() is not None, reason=f"the gateway's own network needs root: {available()}"
)


@pytest.fixture
def fabric() -> Iterator[Fabric]:
    with Fabric() as f:
        yield f


def run(host: Host | None, *args: object, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    argv = [edgesched_binary(), *(str(a) for a in args)]
    if host is not None:
        argv = ["ip", "netns", "exec", host.ns, *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def api(host: Host, state: Path, path: str) -> Any:
    def get() -> Any:
        resp = ApiClient(ApiTarget.from_state_dir(state), timeout=2).request("GET", path)
        assert resp.status == 200, resp.body
        return resp.body

    return host.call(get)


def wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except (OSError, ValueError, AssertionError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.2)
    raise TimeoutError(f"{what} not reached in {timeout}s; last={last!r}")


@pytest.mark.parametrize("how", ["url", "file"])
def test_a_gateway_joins_with_the_printed_line_and_a_removed_one_is_refused(
    fabric: Fabric, tmp_path: Path, how: str
) -> None:
    central_host, gateway = fabric.add_host("central"), fabric.add_host("gw")
    bdir = tmp_path / "broker"
    # 1. central's machine: the broker, from `broker init`, reached by nodes at the host's IP
    done = run(None, "broker", "init", "--dir", bdir, "--address", f"{central_host.ip}:8883",
               "--user", "root")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    broker_log = (tmp_path / "mosquitto.log").open("ab")
    central_host.popen([mosquitto_binary(), "-c", str(bdir / "mosquitto.conf")], log=broker_log)
    mqtt = tomllib.loads((bdir / "central-mqtt.toml").read_text())["central"]["mqtt"]
    port = mqtt.pop("port")  # write_central_config writes it
    config, central_state = write_central_config(tmp_path, port, mqtt=mqtt, heartbeat_s=0.5)
    central_log = (tmp_path / "central.log").open("ab")
    central = central_host.popen(
        [edgesched_binary(), "central", "run", "-c", str(config)], log=central_log
    )
    wait(lambda: (bdir / "mosquitto.pid").exists(), 10, "Mosquitto running")
    wait(lambda: api(central_host, central_state, "/v1/status"), 20, "central up")
    assert central.poll() is None, (tmp_path / "central.log").read_text()

    # 2. central add-node prints the line to run on the gateway: the join server's URL and
    # a one-time token (the server runs on central's machine), or a join file and its token
    if how == "url":
        join_log = (tmp_path / "join-server.log").open("ab")
        central_host.popen([edgesched_binary(), "central", "join-server", "--dir", str(bdir),
                            "--listen", f"{central_host.ip}:8884"], log=join_log)  # fmt: skip
        added = run(None, "central", "add-node", "gw-02", "--dir", bdir)
    else:
        added = run(None, "central", "add-node", "--file", "gw-02", "--dir", bdir)
        assert "reloaded the broker (SIGHUP" in added.stderr, added.stderr
    assert added.returncode == 0, added.stdout + added.stderr
    line = added.stdout.strip().splitlines()[-1].split()
    assert line[:2] == ["edgesched", "join"] and len(line) == 4, added.stdout
    if how == "url":
        assert line[2] == f"https://{central_host.ip}:8884", line
        wait(lambda: b"join server on" in (tmp_path / "join-server.log").read_bytes(), 10,
             "the join server listening")  # fmt: skip

    # 3. the gateway runs it (layout in scratch directories, as root: no user is made)
    gw = tmp_path / "gw"
    state = gw / "state"
    joining = subprocess.Popen(
        ["ip", "netns", "exec", gateway.ns, edgesched_binary(), *line[1:], "--user", "root",
         "--prefix", gw / "opt", "--etc-dir", gw / "etc", "--unit-dir", gw / "units",
         "--state-dir", state, "--wait", "25"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        installed = gw / "etc" / "edge.toml"
        wait(lambda: installed.exists() or joining.poll() is not None, 15, "join installing")
        assert joining.poll() is None, joining.communicate()
        # What the unit would run: the installed config, with a scratch state dir.
        cfg = tomllib.loads(installed.read_text())
        assert cfg["edge"]["mqtt"]["host"] == central_host.ip and cfg["edge"]["mqtt"]["tls"]
        cfg["edge"] |= {"state_dir": str(state), "api_port": 0, "lease_s": 2.0}
        cfg["edge"]["mqtt"]["reconnect_max_s"] = 1.0
        run_config = gw / "run.toml"
        run_config.write_text(toml_dumps(cfg))
        node_log = (gw / "edge.log").open("ab")
        node = gateway.popen([edgesched_binary(), "edge", "run", "-c", str(run_config)],
                             log=node_log)  # fmt: skip
        out, err = joining.communicate(timeout=40)
    finally:
        if joining.poll() is None:
            joining.kill()
    assert joining.returncode == 0, out + err
    for step in ("DNS:  ok", "TCP:  ok", "TLS:  ok", "auth: ok", "ACL:  ok"):
        assert step in out, out
    if how == "url":  # the key was made on the gateway: central's directory never held it
        key_body = (gw / "etc/certs/gw-02.key").read_bytes().split(b"-----")[2]
        assert not any(key_body in p.read_bytes() for p in bdir.rglob("*") if p.is_file())
    assert f"`edgesched edge run --config {installed}` with its state_dir set to {state}" in out
    assert "gw-02 is connected: broker link up, central's heartbeat heard" in out, out

    # 4. central shows it connected
    def online() -> bool:
        nodes = api(central_host, central_state, "/v1/nodes")["nodes"]
        return any(n["id"] == "gw-02" and n["status"] == "online" for n in nodes)

    wait(online, 15, "central seeing gw-02 online")

    # 5. revoked: stop the node, remove it; its connection is refused at the TLS handshake
    node.terminate()
    node.wait(15)
    removed = run(None, "central", "remove-node", "gw-02", "--dir", bdir)
    assert removed.returncode == 0 and "reloaded the broker" in removed.stdout, removed.stderr
    certs = gw / "etc" / "certs"
    time.sleep(0.5)  # the SIGHUP is asynchronous
    refused = run(gateway, "broker", "check", "--broker", f"{central_host.ip}:8883",
                  "--node-id", "gw-02", "--ca", certs / "ca.crt", "--cert",
                  certs / "gw-02.crt", "--key", certs / "gw-02.key")  # fmt: skip
    assert refused.returncode == 1, refused.stdout
    last = refused.stdout.strip().splitlines()[-1]
    assert last.startswith("TLS:  FAILED: the broker refused our certificate"), refused.stdout
