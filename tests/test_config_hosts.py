"""``[edge.mqtt]``/``[central.mqtt]`` ``hosts`` (a clustered broker's other members, fed to
``Endpoint.alternates``) and ``[central] silent_after_s``: parsing, errors that name the key,
and a central engine that reaches its broker through the second address when the first one
refuses (a real Mosquitto)."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import aiomqtt
import pytest
from conftest import Broker, free_port

from edgesched.central.engine import CentralEngine
from edgesched.config import (
    CentralConfig,
    ConfigError,
    EdgeschedConfig,
    MqttConfig,
    parse_config,
    parse_host_port,
)
from edgesched.sync.topics import HEARTBEAT_TOPIC


def parse(text: str) -> EdgeschedConfig:
    return parse_config(tomllib.loads(text))


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value


# --- hosts ---------------------------------------------------------------------------------


def test_hosts_default_to_none() -> None:
    cfg = parse("[edge]\nnode_id = 'gw1'\n")
    for mqtt in (cfg.edge.mqtt, cfg.central.mqtt):
        assert mqtt.hosts == ()
        assert mqtt.endpoint("gw1").alternates == ()


@pytest.mark.parametrize("section", ["edge.mqtt", "central.mqtt"])
def test_hosts_feed_the_endpoints_alternates(section: str) -> None:
    cfg = parse(
        f"[{section}]\nhost = 'localhost'\nport = 1883\n"
        "hosts = ['127.0.0.1:1884', '[::1]:1885', 'localhost:1886']\n"
    )
    mqtt = cfg.edge.mqtt if section == "edge.mqtt" else cfg.central.mqtt
    assert mqtt.hosts == ("127.0.0.1:1884", "[::1]:1885", "localhost:1886")
    endpoint = mqtt.endpoint("gw1")
    assert (endpoint.host, endpoint.port) == ("localhost", 1883)
    assert endpoint.alternates == (("127.0.0.1", 1884), ("::1", 1885), ("localhost", 1886))


def test_hosts_off_loopback_with_tls_or_allowed() -> None:
    tls = parse(
        "[edge.mqtt]\nhost = 'nats1.example.net'\ntls = true\nca_file = 'ca.pem'\n"
        "hosts = ['nats2.example.net:1883', '10.0.0.3:8883']\n"
    ).edge.mqtt
    assert tls.alternates == (("nats2.example.net", 1883), ("10.0.0.3", 8883))
    plain = parse(
        "[edge.mqtt]\nhost = '10.0.0.1'\nallow_plain_remote = true\nhosts = ['10.0.0.2:1883']\n"
    ).edge.mqtt
    assert plain.alternates == (("10.0.0.2", 1883),)


@pytest.mark.parametrize(
    ("value", "key", "needle"),
    [
        ("['nats2']", "edge.mqtt.hosts[0]", "no port"),
        ("['127.0.0.1:1884', ':1883']", "edge.mqtt.hosts[1]", "empty host"),
        ("['h:0']", "edge.mqtt.hosts[0]", "port must be in 1..65535, got 0"),
        ("['h:65536']", "edge.mqtt.hosts[0]", "port must be in 1..65535, got 65536"),
        ("['h:']", "edge.mqtt.hosts[0]", "is not a number"),
        ("['h:x1']", "edge.mqtt.hosts[0]", "is not a number"),
        ("['::1:1883']", "edge.mqtt.hosts[0]", "in brackets"),
        ("['[nope]:1883']", "edge.mqtt.hosts[0]", "IPv6 address in brackets"),
        ("['a b:1883']", "edge.mqtt.hosts[0]", "host name or address"),
        ("['']", "edge.mqtt.hosts[0]", "non-empty string"),
        ("[1883]", "edge.mqtt.hosts[0]", "non-empty string"),
        ("'127.0.0.1:1884'", "edge.mqtt.hosts", "an array of strings"),
        ("['127.0.0.1:1883']", "edge.mqtt", "hosts[0]: '127.0.0.1:1883' is already listed"),
        ("['localhost:2', 'localhost:2']", "edge.mqtt", "hosts[1]"),
        ("['broker.example:1883']", "edge.mqtt", "refusing plain MQTT"),
    ],
)
def test_bad_hosts_are_named(value: str, key: str, needle: str) -> None:
    err = error_of(f"[edge.mqtt]\nhosts = {value}\n")
    assert err.key == key, str(err)
    assert needle in str(err), str(err)


def test_bad_hosts_are_named_in_central_too() -> None:
    err = error_of("[central.mqtt]\nhosts = ['127.0.0.1:1884', 'h:99999']\n")
    assert err.key == "central.mqtt.hosts[1]" and "99999" in str(err)
    err = error_of("[central.mqtt]\nhots = []\n")
    assert "did you mean 'hosts'" in str(err)


def test_hosts_are_checked_in_code_too() -> None:
    with pytest.raises(ValueError, match=r"hosts\[0\].*no port"):
        MqttConfig(hosts=("nats2",))
    with pytest.raises(ValueError, match=r"hosts\[0\].*already listed"):
        MqttConfig(port=1884, hosts=("127.0.0.1:1884",))
    with pytest.raises(ValueError, match=r"non-loopback host 'far' \(hosts\[1\]\)"):
        MqttConfig(hosts=("localhost:1", "far:1883"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h:1", ("h", 1)),
        ("nats-2.example.net:65535", ("nats-2.example.net", 65535)),
        ("10.1.2.3:1883", ("10.1.2.3", 1883)),
        ("[fe80::1]:8883", ("fe80::1", 8883)),
    ],
)
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


# --- silent_after_s ------------------------------------------------------------------------


def test_silent_after_s_default_set_and_disabled() -> None:
    assert parse("").central.silent_after_s == CentralConfig().silent_after_s == 20.0
    assert parse("[central]\nsilent_after_s = 7.5\n").central.silent_after_s == 7.5
    assert parse("[central]\nsilent_after_s = 0\n").central.silent_after_s == 0.0


@pytest.mark.parametrize(
    ("value", "needle"), [("-1", ">= 0"), ("'10'", "a number"), ("inf", "finite")]
)
def test_bad_silent_after_s_is_named(value: str, needle: str) -> None:
    err = error_of(f"[central]\nsilent_after_s = {value}\n")
    assert err.key == "central.silent_after_s" and needle in str(err), str(err)
    with pytest.raises(ValueError, match="silent_after_s"):
        CentralConfig(silent_after_s=float("nan"))


# --- end to end: the second address, the first refused ------------------------------------


async def test_engine_reaches_the_broker_through_its_second_address(
    broker: Broker, tmp_path: Path
) -> None:
    """Central's config names a closed port first and the real Mosquitto in ``hosts``: the
    engine's session is refused by the first, connects to the second at once, and its
    heartbeat reaches a subscriber of that broker."""
    closed = free_port()  # nobody listens: connect is refused
    cfg = parse(
        f"""
[central]
state_dir = "{tmp_path / "central"}"
api_port = 0
heartbeat_s = 0.2
[central.mqtt]
port = {closed}
hosts = ["127.0.0.1:{broker.port}"]
keepalive_s = 2
reconnect_max_s = 1.0
"""
    )
    engine = CentralEngine(cfg)
    assert engine.session.endpoint.alternates == (("127.0.0.1", broker.port),)
    assert engine.session.address == ("127.0.0.1", closed)
    async with aiomqtt.Client("127.0.0.1", broker.port, identifier="watcher") as watcher:
        await watcher.subscribe(HEARTBEAT_TOPIC, qos=0)
        task = asyncio.create_task(engine.run())
        try:
            async with asyncio.timeout(10):
                await engine.wait_ready()
                async for message in watcher.messages:
                    if message.topic.matches(HEARTBEAT_TOPIC):
                        break
            assert engine.session.connected
            assert engine.session.address == ("127.0.0.1", broker.port)
            assert engine.session.stats["connects"] == 1
        finally:
            engine.stop()
            async with asyncio.timeout(15):
                await task
