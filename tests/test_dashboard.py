"""The fleet dashboard served by central.

In-process (broker unreachable, so no nodes): the page and its assets with their content
types, no path traversal, the redirect, the token guard on the stream, a snapshot at once, and
open streams ending as soon as central stops.

In headless Chromium (Playwright driving the system's /usr/bin/chromium; no browser is ever
downloaded): central and two edge nodes as real processes through a real Mosquitto, one of
them behind a fault proxy. The page lists both nodes connected, switches the fleet to energy
mode, shows services (created and scaled through the REST API: their counts, the reason of
the last change, a service's replicas and replica-count chart, the timeline's scaling events
reason first), shows the cut-off node suspect then partitioned, renders on a phone without
horizontal scrolling, tells a missing or rejected token, and shows the node connected again
after the heal. ``EDGESCHED_UPDATE_SCREENSHOT=1`` writes the laptop screenshot to docs/dashboard.png
(otherwise it goes to the test's tmp dir, so a test run leaves the tree clean).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import aiomqtt
import pytest
from aiohttp import web
from conftest import (
    Broker,
    EdgeNode,
    free_port,
    kill_task_processes,
    until,
    write_central_config,
    write_edge_config,
)
from playwright.async_api import Browser, Page, async_playwright, expect

from edgesched.central import dashboard
from edgesched.central.api import build_app
from edgesched.central.engine import CentralEngine
from edgesched.config import CentralConfig, EdgeschedConfig, MqttConfig
from edgesched.fieldtest.faultproxy import FaultProxy
from edgesched.serve import central_engine

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parent.parent
WAIT_MS = 20_000


# --- in-process: routes, assets, the stream --------------------------------------------------


@pytest.fixture
async def central(tmp_path: Path) -> AsyncIterator[tuple[CentralEngine, asyncio.Task[None]]]:
    cfg = EdgeschedConfig(
        central=CentralConfig(
            state_dir=str(tmp_path / "central"),
            api_port=0,
            mqtt=MqttConfig(port=free_port(), reconnect_max_s=1.0),
        )
    )
    engine = central_engine(cfg)
    task = asyncio.create_task(engine.run())
    try:
        async with asyncio.timeout(10):
            await engine.wait_ready()
        yield engine, task
    finally:
        engine.stop()
        async with asyncio.timeout(15):
            await task


async def read_event(resp: aiohttp.ClientResponse) -> tuple[str, str]:
    """The next SSE event (name, data) on ``resp``, skipping comments and retry lines."""
    name, data = "message", ""
    async with asyncio.timeout(5):
        while True:
            line = (await resp.content.readline()).decode().rstrip("\n")
            if not line:
                if data:
                    return name, data
                continue
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()


async def test_page_assets_and_no_traversal(
    central: tuple[CentralEngine, asyncio.Task[None]],
) -> None:
    engine, _ = central
    base = f"http://127.0.0.1:{engine.api_port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/", allow_redirects=False) as resp:
            assert resp.status == 302 and resp.headers["Location"] == "/dashboard/"
        async with http.get(base + "/favicon.ico") as resp:  # public, as the page
            assert resp.status == 200 and resp.content_type == "image/svg+xml"
            assert (await resp.read()).startswith(b"<svg")
        async with http.get(base + "/dashboard/") as resp:  # public: no token
            assert resp.status == 200 and resp.content_type == "text/html"
            assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
            page = await resp.text()
            assert 'src="dashboard.js"' in page and "http" not in page.split("<body>")[0]
        for name, ctype in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
            async with http.get(f"{base}/dashboard/{name}") as resp:
                assert resp.status == 200 and resp.content_type == ctype
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
        for path in (
            "/dashboard/..%2fapi.py",
            "/dashboard/%2e%2e%2fengine.py",
            "/dashboard/../api.py",
            "/dashboard/dashboard.py",
            "/dashboard/nope.js",
            "/dashboard/static%2findex.html",
        ):
            async with http.get(base + path, allow_redirects=False) as resp:
                assert resp.status in (401, 404), (path, resp.status)
                assert "CentralEngine" not in await resp.text()


async def test_stream_needs_a_token_sends_snapshots_and_ends_on_stop(
    central: tuple[CentralEngine, asyncio.Task[None]],
) -> None:
    engine, run = central
    base = f"http://127.0.0.1:{engine.api_port}/v1/stream"
    read_token = (engine.state_dir / "api-token-read").read_text().strip()
    async with aiohttp.ClientSession() as http:
        async with http.get(base) as resp:
            assert resp.status == 401
        async with http.get(base, params={"token": "wrong"}) as resp:
            assert resp.status == 401
        # A client that goes away ends its handler (no error, no leak).
        async with http.get(base, params={"token": read_token}) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            await read_event(resp)
        async with http.get(base, params={"token": read_token}) as resp:
            name, data = await read_event(resp)
            assert name == "snapshot"
            snap = json.loads(data)
            assert set(snap) >= {"status", "policy", "nodes", "tasks_total", "fleet", "events"}
            assert "tasks" not in snap  # (paged by the page itself: GET /v1/tasks)
            assert snap["status"]["central"] == engine.central.central_id
            assert snap["policy"]["mode"] == "priority" and snap["nodes"] == []
            assert (await read_event(resp))[0] == "snapshot"  # and again a second later
            # Central stops with this stream open: it ends at once, not after aiohttp's 60 s
            # shutdown timeout (the bound here is that hang guard, not a speed figure).
            engine.stop()
            async with asyncio.timeout(30):
                await run
                assert await resp.content.read() is not None  # the stream is closed


async def test_fleet_and_events_routes_and_their_bad_queries(
    central: tuple[CentralEngine, asyncio.Task[None]],
) -> None:
    """What the page's fleet panel and event filter read, and clear refusals of bad queries."""
    engine, _ = central
    base = f"http://127.0.0.1:{engine.api_port}"
    token = (engine.state_dir / "api-token-read").read_text().strip()
    headers = {"Authorization": "Bearer " + token}
    engine._event("failover", "svc: gw-a -> gw-b", task="svc")
    engine._event("placed", "t1 on gw-b", task="t1")
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.get(base + "/v1/fleet") as resp:
            body = await resp.json()
            assert resp.status == 200 and body["series"] == [] and body["now"] is None
            assert body["policy"]["mode"] == "priority"
        async with http.get(base + "/v1/events", params={"notable": "1"}) as resp:
            kinds = [e["kind"] for e in (await resp.json())["events"]]
            assert resp.status == 200 and "failover" in kinds and "placed" not in kinds
        async with http.get(base + "/v1/events", params={"kind": "placed", "limit": "1"}) as resp:
            assert [e["detail"] for e in (await resp.json())["events"]] == ["t1 on gw-b"]
        for path, params, field in (
            ("/v1/fleet", {"since": "nan"}, "since"),
            ("/v1/events", {"limit": "0"}, "limit"),
            ("/v1/events", {"notable": "maybe"}, "notable"),
            ("/v1/tasks", {"limit": "x"}, "limit"),
        ):
            async with http.get(base + path, params=params) as resp:
                problem = await resp.json()
                assert resp.status == 400 and problem["field"] == field, (path, problem)
        async with http.get(base + "/v1/tasks", params={"prefix": "nope"}) as resp:
            body = await resp.json()
            assert body == {"tasks": [], "next": None, "scanned": 0, "total": 0}


async def test_a_client_that_stops_reading_is_dropped(
    central: tuple[CentralEngine, asyncio.Task[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that takes nothing (its TCP window full) does not hold a handler forever."""
    engine, _ = central
    monkeypatch.setattr(dashboard, "WRITE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(dashboard, "_snapshot_frame", lambda _request: b": " + b"x" * (8 << 20))
    app = build_app(engine, "admin-token", "read-token")  # a second app, to see its state
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    state = app[dashboard.DASHBOARD_KEY]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /v1/stream?token=read-token HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(10):
            while state.streams == 0:
                await asyncio.sleep(0.05)
            while state.streams:  # never read from: dropped after WRITE_TIMEOUT_S
                await asyncio.sleep(0.1)
    finally:
        writer.close()
        async with asyncio.timeout(10):
            await runner.cleanup()


# --- in a browser, against real processes ----------------------------------------------------


async def services_scenario(page: Page, central: EdgeNode, tmp: Path) -> None:
    """Services through central's REST API, as the panel, its detail and the timeline show
    them."""
    await expect(page.locator("#services")).to_contain_text("No services")
    await expect(page.locator("#services")).to_contain_text("edgesched service apply <file>")
    web_service = {"name": "web", "replicas": 2, "max": 6, "template": {
        "command": ["sleep", "300"], "cpu": 0.05, "mem_gib": 0.05}}  # fmt: skip
    status, reply = await asyncio.to_thread(central.request, "POST", "/v1/services", web_service)
    assert status == 201, reply
    row = page.locator('#services tr[data-service="web"]')
    await expect(row.locator(".svc-wanted")).to_have_text("2")
    await expect(row.locator(".svc-running")).to_have_text("2")
    await expect(row.locator(".svc-live")).to_have_text("2")
    await expect(row.locator(".last-change")).to_contain_text("manual created with 2 replicas")
    await expect(row).to_contain_text(reply["revision"])
    await expect(row).to_contain_text("up to date")
    await expect(row).to_have_attribute("data-state", "ok")

    # Scaled: the count and the reason change, on the panel and on the timeline.
    status, reply = await asyncio.to_thread(
        central.request, "POST", "/v1/services/web/scale", {"replicas": 3}
    )
    assert status == 200 and reply["replicas"] == 3, reply
    await expect(row.locator(".svc-wanted")).to_have_text("3")
    await expect(row.locator(".last-change .why")).to_have_text("manual")
    await expect(row.locator(".last-change")).to_contain_text("2 → 3 replicas")
    await expect(row.locator(".svc-running")).to_have_text("3")
    scaled = page.locator('#events li[data-kind="scaled"]').first
    await expect(scaled.locator(".kind")).to_have_text("scaled")
    await expect(scaled.locator(".detail")).to_have_text("manual web: 2 → 3 replicas")
    await expect(page.locator('#events li[data-kind="service"] .kind').first).to_have_text(
        "service created"
    )
    await expect(page.locator("#services-info")).to_contain_text("3 of 3 replicas running")

    # The detail: each replica's slot, revision, phase and node; the count over time.
    await row.click()
    detail = page.locator("#service-detail")
    await expect(detail).to_be_visible()
    await expect(page.locator("#service-detail-title")).to_have_text("web · 3 of 3 running")
    replicas = page.locator("#service-replicas tr[data-replica]")
    await expect(replicas).to_have_count(3)
    for slot in range(3):
        replica = page.locator(f'#service-replicas tr[data-slot="{slot}"]')
        await expect(replica).to_have_attribute("data-phase", "running")
        await expect(replica).to_contain_text(reply["revision"])
    await expect(page.locator("#service-chart")).to_have_attribute("data-wanted", "2,3")
    await page.locator("#services-section").screenshot(path=str(tmp / "dashboard-services.png"))
    # A replica's node opens that node's detail.
    link = page.locator("#service-replicas .replica-node button").first
    node_id = (await link.text_content() or "").strip()
    assert node_id in ("gw-a", "gw-b"), node_id
    await link.click()
    await expect(page.locator("#node-detail-title")).to_contain_text(f"{node_id} · connected")
    await page.locator("#service-detail-close").click()
    await expect(detail).to_be_hidden()

    # An autoscaled service shows its load (its scale-out is checked later in the scenario).
    api_service = {"name": "api", "replicas": 0, "max": 4, "template": {
        "command": ["sleep", "300"], "cpu": 0.05, "mem_gib": 0.05},
        "autoscale": {"metric": "forecast", "target_per_replica": 0.5}}  # fmt: skip
    status, reply = await asyncio.to_thread(central.request, "POST", "/v1/services", api_service)
    assert status == 201, reply
    status, reply = await asyncio.to_thread(
        central.request, "POST", "/v1/services/api/load", {"cores": 1.0}
    )
    assert status == 200, reply
    api_row = page.locator('#services tr[data-service="api"]')
    await expect(api_row.locator("td[data-label=autoscale]")).to_contain_text(
        "by forecast: load 1.0 cores · no forecast yet · 0.5 cores a replica"
    )


def chromium_or_fail() -> str:
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"{CHROMIUM} is missing: run `make setup` (as root it apt-installs chromium); "
            "the dashboard test never downloads a browser"
        )
    return CHROMIUM


async def node_state(page: Page, node_id: str, state: str) -> None:
    row = page.locator(f'#nodes tr.node[data-node="{node_id}"]')
    await expect(row.locator(".badge")).to_have_text(state, timeout=WAIT_MS)
    await expect(row).to_have_attribute("data-state", state, timeout=WAIT_MS)


async def page_for(browser: Browser, url: str, width: int, height: int) -> Page:
    context = await browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(WAIT_MS)
    page = await context.new_page()
    await page.goto(url, timeout=WAIT_MS)
    return page


@pytest.mark.timeout(150)
async def test_dashboard_in_chromium(broker: Broker, tmp_path: Path) -> None:
    executable = chromium_or_fail()
    procs: list[EdgeNode] = []
    async with FaultProxy("127.0.0.1", 0, "127.0.0.1", broker.port) as proxy:
        try:
            config, state = write_central_config(
                tmp_path, broker.port, failover_after_s=2.0, cycle_s=0.3
            )
            central = EdgeNode(config, state, tmp_path / "central.log", tier="central")
            procs.append(central)
            await asyncio.to_thread(central.start)
            for node_id, port in (("gw-a", broker.port), ("gw-b", proxy.port)):
                d = tmp_path / node_id
                d.mkdir()
                config, state = write_edge_config(
                    d, port, node_id=node_id, lease_s=2.0, mqtt={"reconnect_max_s": 1.0}
                )
                node = EdgeNode(config, state, d / "edge.log")
                procs.append(node)
                await asyncio.to_thread(node.start)

            def online() -> bool:
                status, body = central.get("/v1/nodes")
                states = {n["id"]: n["state"] for n in body.get("nodes", [])}
                return status == 200 and states == {"gw-a": "connected", "gw-b": "connected"}

            await until(online, 30, "central seeing both nodes connected")
            # A service on gw-b (fails over when gw-b is cut) and a batch task on gw-a.
            for task_id, pin, restart in (("svc", "gw-b", "always"), ("batch", "gw-a", "never")):
                body = {"id": task_id, "command": ["sleep", "300"], "cpu": 0.05,
                        "mem_gib": 0.05, "restart": restart, "node": pin}  # fmt: skip
                status, reply = await asyncio.to_thread(central.request, "POST", "/v1/tasks", body)
                assert status == 201, reply

            token = (central.state / "api-token").read_text().strip()
            base = central.url("/dashboard/")
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(
                    executable_path=executable, args=CHROMIUM_ARGS, timeout=30_000
                )
                try:
                    await browser_scenario(browser, central, proxy, base, token, tmp_path)
                finally:
                    await browser.close()
        finally:
            for proc in procs:
                if proc.proc is not None and proc.proc.poll() is None:
                    await asyncio.to_thread(proc.kill, signal.SIGTERM)
            for proc in procs[1:]:
                kill_task_processes(proc.state)


async def browser_scenario(
    browser: Browser, central: EdgeNode, proxy: FaultProxy, base: str, token: str, tmp: Path
) -> None:
    errors: list[str] = []
    page = await page_for(browser, f"{base}#token={token}", 1280, 860)
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    # The page loads with the token (then drops it from the address bar) and goes live.
    await expect(page.locator("#link")).to_have_text("live")
    assert "token" not in page.url
    await expect(page.locator("#central-id")).to_have_text("central")
    await expect(page.locator("#broker")).to_have_text("broker connected")
    for node_id in ("gw-a", "gw-b"):
        await node_state(page, node_id, "connected")
    await expect(page.locator("#count-connected")).to_have_text("2")
    await expect(page.locator('tr[data-task="svc"]')).to_contain_text("gw-b")
    # the task's own state (its lifecycle), not central's "active"
    await expect(page.locator('tr[data-task="svc"]')).to_have_attribute(
        "data-state", "running", timeout=WAIT_MS
    )
    await expect(page.locator("#events")).to_contain_text("placed")

    # The task table is central's pages, filtered there: by phase, then by id prefix.
    await page.locator("#task-phase").select_option("running")
    await expect(page.locator('#tasks tr[data-task="batch"]')).to_have_count(1)
    await page.locator("#task-prefix").fill("sv")
    await expect(page.locator('#tasks tr[data-task="batch"]')).to_have_count(0)
    await expect(page.locator('#tasks tr[data-task="svc"]')).to_have_count(1)
    await expect(page.locator("#tasks-info")).to_contain_text("(filtered)")
    await page.locator("#task-prefix").fill("")
    await page.locator("#task-phase").select_option("")
    await expect(page.locator('#tasks tr[data-task="batch"]')).to_have_count(1)
    # A task's detail: its lifecycle and its copies.
    await page.locator('#tasks tr[data-task="svc"]').click()
    await expect(page.locator("#task-detail")).to_be_visible()
    await expect(page.locator("#task-detail-kv")).to_contain_text("running")
    await expect(page.locator('#task-copies tr[data-node="gw-b"]')).to_contain_text("running")
    # A node's detail, and the fleet panel once central has sampled the nodes' telemetry.
    await page.locator('#nodes tr.node[data-node="gw-a"]').click()
    await expect(page.locator("#node-detail-title")).to_contain_text("gw-a · connected")
    await expect(page.locator("#fleet-measured")).to_have_text("2 nodes measured", timeout=WAIT_MS)
    await expect(page.locator("#fleet-util")).to_contain_text("%")
    await expect(page.locator("#fleet-demand")).not_to_have_text("—")

    # The mode switch: the header and the API both say energy.
    await page.locator("#mode-select").select_option("energy")
    await expect(page.locator("#policy-result")).to_contain_text("mode energy")
    await expect(page.locator("#policy-mode")).to_have_text("energy")
    status, policy = await asyncio.to_thread(central.get, "/v1/policy")
    assert status == 200 and policy["mode"] == "energy"
    await expect(page.locator("#events")).to_contain_text("mode energy")

    # Refused input shows on the header: a status message that is not JSON, on gw-a's topic.
    await expect(page.locator("#refused")).to_have_text("refused 0")
    async with aiomqtt.Client("127.0.0.1", proxy.target_port, identifier="prankster") as mqtt:
        await mqtt.publish("edgesched/v1/node/gw-a/status", b"{not json", qos=1)
    await expect(page.locator("#refused")).to_have_text("refused 1")
    await expect(page.locator("#refused")).to_have_attribute("data-bad", "true")
    await expect(page.locator("#refused")).to_have_attribute(
        "title", "input central refused since start\nstatus · malformed: 1"
    )

    await services_scenario(page, central, tmp)

    # Cut gw-b silently: suspect first (offline < failover_after_s), then partitioned.
    proxy.blackhole()
    await node_state(page, "gw-b", "suspect")
    await node_state(page, "gw-b", "partitioned")
    await expect(page.locator("#count-partitioned")).to_have_text("1")
    await node_state(page, "gw-a", "connected")
    await expect(page.locator("#events")).to_contain_text("gw-b is offline")
    await expect(page.locator('tr[data-task="svc"]')).to_contain_text("central (failover)")
    await expect(page.locator("#events")).to_contain_text("failover")
    # Events filtered to the notable ones: no placement among them, the failover kept.
    await page.locator("#event-filter").select_option("notable")
    await expect(page.locator('#events li[data-kind="failover"]').first).to_be_visible()
    await expect(page.locator('#events li[data-kind="placed"]')).to_have_count(0)
    await page.locator("#event-filter").select_option("")

    shot = (
        REPO / "docs" / "dashboard.png"
        if os.environ.get("EDGESCHED_UPDATE_SCREENSHOT")
        else tmp / "dashboard.png"
    )
    await page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 10_000

    # A phone: the same live page, no horizontal scrolling at 390 px.
    phone = await page_for(browser, f"{base}#token={token}", 390, 844)
    await node_state(phone, "gw-b", "partitioned")
    await phone.screenshot(path=str(tmp / "dashboard-phone.png"), full_page=True)
    width = await phone.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"horizontal overflow on a phone: scrollWidth {width}"
    await phone.context.close()

    # No token, then a rejected one: the page says so (in fresh tabs: sessionStorage is per tab).
    missing = await page_for(browser, base, 1024, 700)
    await expect(missing.locator("#auth")).to_be_visible()
    await expect(missing.locator("#auth-message")).to_contain_text("No API token")
    await missing.context.close()
    bad = await page_for(browser, f"{base}#token=not-the-token", 1024, 700)
    await expect(bad.locator("#auth-message")).to_contain_text("rejected this token")
    await expect(bad.locator("#link")).to_have_text("token rejected")
    # Pasting the right token recovers without a reload.
    await bad.locator("#token-input").fill(token)
    await bad.locator("#token-form button").click()
    await expect(bad.locator("#auth")).to_be_hidden()
    await node_state(bad, "gw-a", "connected")
    await bad.context.close()

    # A read-only token may look but not switch: the server's refusal is shown.
    read = (central.state / "api-token-read").read_text().strip()
    viewer = await page_for(browser, f"{base}#token={read}", 1024, 700)
    await expect(viewer.locator("#link")).to_have_text("live")
    await viewer.locator("#mode-select").select_option("balance")
    await expect(viewer.locator("#policy-result")).to_contain_text("read-only token")
    await expect(viewer.locator("#policy-mode")).to_have_text("energy")
    await expect(viewer.locator('#services tr[data-service="web"] .svc-wanted')).to_have_text("3")
    await viewer.context.close()

    # Heal: gw-b is connected again.
    proxy.heal()
    await node_state(page, "gw-b", "connected")
    await expect(page.locator("#count-connected")).to_have_text("2")
    await expect(page.locator("#events")).to_contain_text("gw-b is online")
    await expect(page.locator("#stale")).to_be_hidden()

    # The autoscaled service's load (reported in services_scenario) scaled it out, with its
    # reason on the panel (the first decision after the report comes within 15 s).
    api_row = page.locator('#services tr[data-service="api"]')
    await expect(api_row.locator(".last-change .why")).to_have_text("load", timeout=WAIT_MS)
    await expect(api_row.locator(".last-change")).to_contain_text("0 → 2 replicas")
    await expect(api_row.locator(".svc-wanted")).to_have_text("2")
    # Deleted: its replicas stop, then it leaves the panel; the timeline says so.
    status, reply = await asyncio.to_thread(central.request, "DELETE", "/v1/services/web")
    assert status == 200 and reply["deleted"], reply
    deleted = page.locator('#events li[data-kind="service-deleted"]').first
    await expect(deleted.locator(".kind")).to_have_text("service deleted")
    await expect(page.locator('#services tr[data-service="web"]')).to_have_count(0)
    await expect(page.locator("#services-info")).to_contain_text("1 service ·")

    # Central goes away: the view says it is stale, unmistakably, instead of showing green.
    await asyncio.to_thread(central.kill, signal.SIGTERM)
    await expect(page.locator("#stale")).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#stale-message")).to_contain_text("as it was at")
    await expect(page.locator("body")).to_have_attribute("data-stale", "true")
    assert not errors, errors
    await page.context.close()
