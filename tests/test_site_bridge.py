"""A site behind its own Mosquitto bridged to central's: when the site's broker (and so its
bridge) goes away, central marks the site's nodes offline from the bridge's notification (the
nodes' own last wills never reach it), and back online, resynced, when the bridge returns."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from conftest import Broker, central_and_nodes, free_port, until, wait_for_port

from edgesched.fieldtest.brokers import broker_config
from edgesched.localbroker import mosquitto_path


def _start_site(conf: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [str(mosquitto_path()), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(port)
    return proc


async def test_central_sees_a_site_go_dark_through_its_bridge(
    tmp_path: Path, broker: Broker
) -> None:
    site_port = free_port()
    conf = tmp_path / "site.conf"
    conf.write_text(
        broker_config([("127.0.0.1", site_port)], bridge=("north", "127.0.0.1", broker.port))
    )
    site = _start_site(conf, site_port)
    ports = {"gw-n": site_port, "gw-c": broker.port}
    try:
        async with central_and_nodes(
            tmp_path,
            broker.port,
            ports,
            edge=lambda n, _d: {"site": "north" if n == "gw-n" else "hq"},
        ) as (central, _nodes):

            def states() -> dict[str, str]:
                body = central.get("/v1/nodes")[1]
                return {n["id"]: n["state"] for n in body["nodes"]}

            await until(lambda: states() == {"gw-n": "connected", "gw-c": "connected"}, 30,
                        "both nodes connected")  # fmt: skip
            site.kill()  # the site's broker dies: nothing of the site reaches central now
            site.wait()
            await until(lambda: states().get("gw-n") == "suspect", 20, "gw-n offline at central")
            assert states()["gw-c"] == "connected"
            _, events = await asyncio.to_thread(central.get, "/v1/events")
            assert any(
                e["kind"] == "node-offline" and e["node"] == "gw-n" for e in events["events"]
            )
            site = _start_site(conf, site_port)
            await until(lambda: states().get("gw-n") == "connected", 30, "gw-n back at central")
    finally:
        site.kill()
        site.wait()
