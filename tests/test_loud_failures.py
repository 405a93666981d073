"""Loud, honest failure (issue 18, docs/troubleshooting.md): each bad case an operator meets
ends in one clear line, and the state shows where the operator looks.

- an unreachable broker: a WARNING per backoff step naming the address and the reason, and the
  link's state in ``/v1/status`` and the status commands (edge and central);
- an API port in use: one ``error:`` line naming the port and who asked for it, exit 1;
- two processes under one identity: noticed through a real Mosquitto, reported by both, and
  the one started last exits with one line (two sessions, and two real ``edge run``);
- ``config check`` names each missing or unreadable file; ``config example`` has every key
  of every section (compared with the config dataclasses);
- help text and paths are printed verbatim (no Rich markup).
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import re
import socket
import subprocess
import time
import tomllib
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    Broker,
    EdgeNode,
    edgesched_binary,
    free_port,
    kill_task_processes,
    write_central_config,
    write_edge_config,
)
from test_sync_session import _dynsec_broker
from typer.testing import CliRunner

from edgesched import config as config_mod
from edgesched.cli import app
from edgesched.config import (
    NOT_CONFIG_KEYS,
    ConfigError,
    default_config_toml,
    example_sections,
    parse_config,
)
from edgesched.runengine import EXIT_IDENTITY_IN_USE
from edgesched.sync import session as session_mod
from edgesched.sync.session import Endpoint, IdentityInUse, MqttSession, presence_topic

runner = CliRunner()


def _run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [edgesched_binary(), *args], capture_output=True, text=True, timeout=timeout
    )


def _one_error_line(stderr: str) -> str:
    """The stderr's single ``error:`` line (logging may precede it; no traceback may)."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


# --- an unreachable broker -----------------------------------------------------------------------


async def test_an_unreachable_broker_is_a_warning_per_backoff_step_then_connected(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.stop()
    where = f"127.0.0.1:{broker.port}"
    session = MqttSession(
        Endpoint("127.0.0.1", broker.port, "loud-1"), backoff_initial_s=0.05, backoff_max_s=0.1
    )
    caplog.set_level(logging.WARNING, logger="edgesched.sync.session")
    task = asyncio.create_task(session.run())
    try:
        deadline = time.monotonic() + 5
        while session.link.failed_attempts < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        report = session.link.report()
        assert report["connected"] is False and report["address"] == where
        assert "Connection refused" in report["last_error"], report
        assert report["since"] is not None and report["failed_attempts"] >= 3
        steps = [r for r in caplog.records if "broker unreachable" in r.getMessage()]
        # one line per backoff step (each attempt here: a single address), at WARNING
        assert len(steps) >= 3 and all(r.levelno == logging.WARNING for r in steps)
        assert len(steps) in (report["failed_attempts"], report["failed_attempts"] - 1)
        assert f"{where} ([Errno 111] Connection refused); retrying in" in steps[0].getMessage()
        broker.start()
        while not session.link.connected and time.monotonic() < deadline + 5:
            await asyncio.sleep(0.02)
        report = session.link.report()
        assert report["connected"] and report["failed_attempts"] == 0 and report["connects"] == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
def lonely_edge(tmp_path: Path) -> Iterator[tuple[EdgeNode, int]]:
    """A real `edgesched edge run` whose broker port nobody listens on."""
    port = free_port()
    config, state = write_edge_config(tmp_path, port)
    node = EdgeNode(config, state, tmp_path / "edge.log")
    node.start()
    try:
        yield node, port
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.kill(15)
        kill_task_processes(state)


def test_edge_status_shows_an_unreachable_broker(lonely_edge: tuple[EdgeNode, int]) -> None:
    node, port = lonely_edge

    def failing() -> Any:
        status, body = node.get("/v1/status")
        assert status == 200
        return body if body["broker"]["failed_attempts"] >= 1 else None

    body = node.wait(failing, 15, "a failed connect in /v1/status")
    broker = body["broker"]
    assert broker["address"] == f"127.0.0.1:{port}" and broker["connected"] is False
    assert "Connection refused" in broker["last_error"] and broker["since"] > 0
    shown = _run_cli("edge", "status", "-c", str(node.config))
    assert shown.returncode == 0, shown.stderr
    assert f'"address": "127.0.0.1:{port}"' in shown.stdout
    warning = [line for line in shown.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and f"not connected to broker 127.0.0.1:{port}" in warning[0]
    assert "Connection refused" in warning[0]
    log = node.log.read_text()
    line = (
        f"WARNING edgesched.sync.session: gw-test: broker unreachable: 127.0.0.1:{port} "
        "([Errno 111] Connection refused); retrying in"
    )
    assert line in log, log


def test_central_status_shows_an_unreachable_broker(tmp_path: Path) -> None:
    port = free_port()
    config, state = write_central_config(tmp_path, port)
    central = EdgeNode(config, state, tmp_path / "central.log", tier="central")
    central.start()
    try:

        def failing() -> Any:
            body = central.get("/v1/status")[1]
            return body if body["broker"]["failed_attempts"] >= 1 else None

        body = central.wait(failing, 15, "a failed connect in /v1/status")
        assert body["broker"]["address"] == f"127.0.0.1:{port}"
        assert body["broker_connected"] is False and body["broker"]["connected"] is False
        shown = _run_cli("central", "status", "-c", str(config))
        assert shown.returncode == 0 and '"last_error": "[Errno 111] Connection refused"' in (
            shown.stdout
        ), shown
        assert f"warning: not connected to broker 127.0.0.1:{port}" in shown.stderr
    finally:
        central.kill(15)


# --- a port in use ----------------------------------------------------------------------------


@pytest.mark.parametrize("tier", ["edge", "central"])
def test_an_api_port_in_use_is_one_line_and_exit_1(tmp_path: Path, tier: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        write = write_edge_config if tier == "edge" else write_central_config
        config, _ = write(tmp_path, free_port(), api_port=port)
        done = _run_cli(tier, "run", "-c", str(config))
    assert done.returncode == 1, done.stderr
    line = _one_error_line(done.stderr)
    assert line == (
        f"error: {tier} API ([{tier}] api_host, api_port in {config}): cannot listen on "
        f"127.0.0.1:{port}: the port is already in use (by another process: see `ss -ltnp`)"
    )


# --- one identity, two processes ---------------------------------------------------------------


async def test_two_sessions_under_one_identity_the_later_one_stops(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Through a real Mosquitto (2.0.11 closes the old connection without MQTT v5's 0x8E):
    the presence markers prove the other process live; the one started last stops with
    IdentityInUse naming the other (pid, host, address); the first keeps its session and
    logs the duplicate at ERROR."""
    monkeypatch.setattr(session_mod, "STABLE_S", 0.5)  # (10 s in production)
    caplog.set_level(logging.WARNING, logger="edgesched.sync.session")

    def make() -> MqttSession:
        endpoint = Endpoint("127.0.0.1", broker.port, "gw-dup")
        return MqttSession(
            endpoint, backoff_initial_s=0.2, backoff_max_s=0.5, presence=presence_topic("gw-dup")
        )

    first = make()
    one = asyncio.create_task(first.run())
    try:
        while not first.link.connected:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.7)  # first held its session past STABLE_S
        second = make()
        started = time.monotonic()
        with pytest.raises(IdentityInUse) as stopped:
            async with asyncio.timeout(10):
                await second.run()
        took = time.monotonic() - started
        message = str(stopped.value)
        assert message.startswith(f"another process connected to broker 127.0.0.1:{broker.port}"
                                  f" as gw-dup: pid {os.getpid()} on host {socket.gethostname()}"
                                  " from 127.0.0.1:"), message  # fmt: skip
        assert "started after it, so it stops" in message and "\n" not in message
        assert took < 6, took
        # the first one keeps (or takes back) its session and said so
        deadline = time.monotonic() + 5
        while not first.link.report()["connected"] and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not one.done() and first.link.report()["connected"]
        assert first.link.duplicate is not None and "as gw-dup: pid" in first.link.duplicate
        assert first.link.duplicate_at is not None and first.link.report()["duplicate_at"]
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("was first and keeps the session" in e for e in errors), errors
        connects = first.link.connects
        await asyncio.sleep(1.0)
        assert first.link.connects == connects and first.link.connected  # no more flapping
    finally:
        one.cancel()
        await asyncio.gather(one, return_exceptions=True)


async def test_without_markers_repeated_takeovers_are_a_warning_and_nobody_exits(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """No proof (MQTT 3.1.1, no presence markers): three connections in a row closed right
    after connect are a WARNING that says what is probable and that the broker does not say
    which process; neither session stops on a guess (a flapping link looks the same)."""
    caplog.set_level(logging.WARNING, logger="edgesched.sync.session")
    endpoint = Endpoint("127.0.0.1", broker.port, "gw-old", protocol="3.1.1")
    sessions = [MqttSession(endpoint, backoff_initial_s=0.05, backoff_max_s=0.1) for _ in "ab"]
    tasks = [asyncio.create_task(s.run()) for s in sessions]
    try:
        async with asyncio.timeout(10):
            while not any(s.link.duplicate for s in sessions):
                await asyncio.sleep(0.02)
        said = next(s.link.duplicate for s in sessions if s.link.duplicate)
        assert said == (
            f"broker 127.0.0.1:{broker.port} closed our connection right after connect 3 times "
            "in a row: probably another process connects as gw-old (the broker does not say "
            "which; its log shows 'New client connected from ADDRESS as gw-old'), or it "
            "refuses what we send"
        )
        assert any(r.levelno == logging.WARNING and said in r.getMessage() for r in caplog.records)
        assert not any(t.done() for t in tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_restart_is_not_taken_for_a_duplicate(broker: Broker) -> None:
    """The previous life's retained marker is heard first: no proof, no alarm."""
    endpoint = Endpoint("127.0.0.1", broker.port, "gw-again")
    for _ in range(2):
        session = MqttSession(endpoint, backoff_initial_s=0.1, presence=presence_topic("gw-again"))
        task = asyncio.create_task(session.run())
        async with asyncio.timeout(5):
            while session.presence is None or not session.presence.echoed:
                await asyncio.sleep(0.02)
        assert session.presence.proven is False and session.link.duplicate is None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert session.presence is not None and session.presence.other is not None  # (heard)


@pytest.mark.parametrize("refused_at", ["suback", "delivery"])
async def test_a_broker_that_refuses_the_presence_topic_costs_the_detection_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, refused_at: str
) -> None:
    """An ACL without the presence topic: the connection stays up (a refused subscription of
    any other channel renews the connection). Refused at SUBACK (Mosquitto's dynamic-security
    plugin), a WARNING says the detection is lost; refused at delivery (its plain ACL file:
    the PUBLISH denied with PUBACK 0x87, the SUBSCRIBE granted), no marker comes back."""
    if refused_at == "suback":
        broker = _dynsec_broker(tmp_path)  # (anonymous may subscribe to open/# only)
    else:
        port = free_port()
        acl = tmp_path / "acl"
        acl.write_text("topic readwrite edgesched/v1/node/gw-acl/status\n")  # (anonymous)
        conf = tmp_path / "mosquitto.conf"
        conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"log_dest none\nacl_file {acl}\nuser {getpass.getuser()}\n"
        )
        broker = Broker(port, None, conf)  # type: ignore[arg-type]
        broker.start()
    caplog.set_level(logging.WARNING, logger="edgesched.sync.session")
    endpoint = Endpoint("127.0.0.1", broker.port, "gw-acl")
    session = MqttSession(endpoint, backoff_initial_s=0.1, presence=presence_topic("gw-acl"))
    task = asyncio.create_task(session.run())
    try:
        async with asyncio.timeout(5):
            while not session.link.report()["connected"]:
                await asyncio.sleep(0.02)
        await asyncio.sleep(1.0)
        assert session.link.report()["connected"] and session.link.connects == 1
        assert session.presence is not None and session.presence.echoed is False
        lost = [r for r in caplog.records if "will not be detected" in r.getMessage()]
        assert len(lost) == (1 if refused_at == "suback" else 0), caplog.text
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        broker.stop()


def test_two_edge_processes_under_one_node_id_the_second_exits(
    broker: Broker, tmp_path: Path
) -> None:
    """Two real `edgesched edge run` with the same node_id on one broker: the second exits 3
    with one line naming the first's pid; the first keeps running and shows the duplicate."""
    nodes = []
    for name in ("a", "b"):
        where = tmp_path / name
        where.mkdir()
        config, state = write_edge_config(where, broker.port, node_id="gw-dup")
        nodes.append(EdgeNode(config, state, where / "edge.log"))
    first, second = nodes
    first.start()
    try:
        first.wait(lambda: first.get("/v1/status")[1]["broker"]["connected"], 15, "connected")
        assert first.proc is not None
        with second.log.open("ab") as out:  # (not EdgeNode.start: it may exit before it)
            second.proc = subprocess.Popen(
                [edgesched_binary(), "edge", "run", "-c", str(second.config)],
                stdout=out,
                stderr=out,
            )
        second.proc.wait(30)
        assert second.proc.returncode == EXIT_IDENTITY_IN_USE == session_mod.EXIT_IDENTITY_IN_USE
        line = _one_error_line(second.log.read_text())
        assert line.startswith(
            f"error: edge: another process connected to broker 127.0.0.1:{broker.port} as "
            f"gw-dup: pid {first.proc.pid} on host {socket.gethostname()} from 127.0.0.1:"
        ), line
        assert first.proc.poll() is None
        status = first.wait(
            lambda: (s := first.get("/v1/status")[1])["broker"]["connected"] and s, 10, "back"
        )
        assert f"pid {second.proc.pid}" in status["broker"]["duplicate"]
    finally:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.kill(15)
            kill_task_processes(node.state)


# --- config check and config example ------------------------------------------------------------


def test_config_check_names_each_missing_or_unreadable_file(tmp_path: Path) -> None:
    secret = tmp_path / "key.pem"
    secret.write_text("x")
    secret.chmod(0)
    unreadable = os.geteuid() != 0  # (root reads any file)
    config = tmp_path / "edge.toml"
    config.write_text(
        "[edge]\n"
        f'node_id = "gw-01"\nstate_dir = "{tmp_path / "state"}"\n'
        f'forecast_model = "{tmp_path / "nope.onnx"}"\n'
        "[edge.mqtt]\ntls = true\n"
        f'ca_file = "{tmp_path / "ca.crt"}"\n'
        f'cert_file = "{tmp_path}"\nkey_file = "{secret}"\n'
    )
    result = runner.invoke(app, ["config", "check", str(config)])
    assert result.exit_code == 2
    lines = result.output.splitlines()
    expected = [
        f"error: edge.mqtt.ca_file: {tmp_path / 'ca.crt'}: no such file or directory",
        f"error: edge.mqtt.cert_file: {tmp_path}: a directory, not a file",
        *([f"error: edge.mqtt.key_file: {secret}: not readable by this user"] if unreadable
          else []),
        f"error: edge.forecast_model: {tmp_path / 'nope.onnx'}: no such file or directory",
    ]  # fmt: skip
    assert lines == expected, result.output
    # the [central] section is not in the file: its default paths are not checked
    secret.chmod(0o600)
    for name in ("ca.crt", "nope.onnx"):
        (tmp_path / name).write_text("x")
    config.write_text(
        config.read_text().replace(f'cert_file = "{tmp_path}"', f'cert_file = "{secret}"')
    )
    fine = runner.invoke(app, ["config", "check", str(config)])
    assert fine.exit_code == 0 and fine.output.startswith(f"{config}: ok"), fine.output


def _example_keys() -> dict[str, set[str]]:
    """Each section of the example and its keys, set or commented out."""
    keys: dict[str, set[str]] = {}
    section = ""
    for line in default_config_toml().splitlines():
        if m := re.fullmatch(r"\[([a-z.]+)\]", line):
            section = m[1]
            keys[section] = set()
        elif section and (m := re.match(r"(?:# )?([a-z0-9_]+) = ", line)):
            keys[section].add(m[1])
    return keys


def test_config_example_has_every_key_of_every_section() -> None:
    keys = _example_keys()
    sections = example_sections()
    assert {"policy", "sim", "edge", "edge.mqtt", "central", "central.mqtt"} <= set(keys)
    for section, cls in sections.items():
        wanted = {f.name for f in fields(cls) if (section, f.name) not in NOT_CONFIG_KEYS}
        wanted -= {"mqtt", "tidal", "weights"}  # (tables of their own)
        assert keys[section] == wanted, section
    # ... and every key in it is one the parser takes
    for section, names in keys.items():
        if section in ("policy.weights", "policy.tidal"):
            continue
        for name in names:
            table: dict[str, Any] = {name: object()}
            for part in reversed(section.split(".")):
                table = {part: table}
            with pytest.raises(ConfigError) as refused:
                parse_config(table)
            assert "unknown key" not in str(refused.value), (section, name)
    assert tomllib.loads(default_config_toml())["central"]["central_id"] == "central"
    assert config_mod.parse_config(tomllib.loads(default_config_toml())).edge.node_id == ""


# --- verbatim help and paths -------------------------------------------------------------------


def test_help_text_and_paths_are_printed_verbatim(tmp_path: Path) -> None:
    shown = runner.invoke(app, ["central", "run", "--help"], terminal_width=200)
    assert shown.exit_code == 0
    assert "Central's TOML config ([central] section)." in shown.output, shown.output
    odd = tmp_path / "[bold]x"
    missing = runner.invoke(app, ["config", "check", str(odd)])
    assert missing.exit_code == 2
    assert missing.output == f"error: {odd}: no such file\n", missing.output
