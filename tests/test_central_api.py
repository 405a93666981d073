"""Central's REST API in-process (its broker unreachable, so no nodes): tokens, bad bodies,
tasks waiting for a node, the policy switch surviving a restart, the extender mount."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import free_port

from edgesched.central.engine import CentralEngine
from edgesched.config import CentralConfig, EdgeschedConfig, MqttConfig
from edgesched.serve import central_engine


class Api:
    def __init__(self, engine: CentralEngine, session: aiohttp.ClientSession) -> None:
        self.engine = engine
        self.session = session
        state = engine.state_dir
        self.admin = (state / "api-token").read_text().strip()
        self.read = (state / "api-token-read").read_text().strip()

    async def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = "admin",
        raw: bytes | None = None,
    ) -> tuple[int, Any]:  # fmt: skip
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.admin if token == 'admin' else self.read}"
        url = f"http://127.0.0.1:{self.engine.api_port}{path}"
        kw: dict[str, Any] = {"data": raw} if raw is not None else {"json": body}
        async with self.session.request(method, url, headers=headers, **kw) as resp:
            return resp.status, await resp.json(content_type=None)


async def start(tmp_path: Path, **central: Any) -> tuple[CentralEngine, asyncio.Task[None]]:
    cfg = EdgeschedConfig(
        central=CentralConfig(
            state_dir=str(tmp_path / "central"),
            api_port=0,
            mqtt=MqttConfig(port=free_port(), reconnect_max_s=1.0),
            **central,
        )
    )
    engine = central_engine(cfg)
    task = asyncio.create_task(engine.run())
    async with asyncio.timeout(10):
        await engine.wait_ready()
    return engine, task


async def stop(engine: CentralEngine, task: asyncio.Task[None]) -> None:
    engine.stop()
    async with asyncio.timeout(15):
        await task


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    engine, task = await start(tmp_path, k8s_extender=True)
    try:
        async with aiohttp.ClientSession() as session:
            yield Api(engine, session)
    finally:
        await stop(engine, task)


async def test_tokens_read_only_and_admin(api: Api) -> None:
    assert (await api.call("GET", "/v1/health", token=None))[0] == 200
    status, body = await api.call("GET", "/v1/nodes", token=None)
    assert status == 401 and body["status"] == 401
    assert (await api.call("GET", "/v1/nodes", token="read"))[0] == 200
    status, body = await api.call("POST", "/v1/policy", {"mode": "energy"}, token="read")
    assert status == 403 and "read-only" in body["detail"]
    assert (await api.call("POST", "/v1/policy", {"mode": "energy"}))[0] == 200


@pytest.mark.parametrize(
    ("path", "body", "raw", "status", "field"),
    [
        ("/v1/tasks", None, b"{not json", 400, "body"),
        ("/v1/tasks", [1, 2], None, 400, "body"),
        ("/v1/tasks", {"id": "t"}, None, 400, "command"),
        ("/v1/tasks", {"id": "t", "command": ["x"], "cpu": "lots"}, None, 400, "cpu"),
        ("/v1/tasks", {"id": "t", "command": ["x"], "colour": "red"}, None, 400, "colour"),
        ("/v1/tasks", {"id": "t", "command": ["x"], "node": 7}, None, 400, "node"),
        ("/v1/tasks", {"id": "t", "command": ["x"], "node": "gw-nope"}, None, 422, "node"),
        ("/v1/tasks", {"id": "t", "command": ["x"], "reconcile": "coin"}, None, 400, "reconcile"),
        ("/v1/tasks", None, b"x" * 70_000, 413, "body"),
        ("/v1/policy", {"mode": "turbo"}, None, 422, "mode"),
        ("/v1/policy", {"tidal_profile": "moon"}, None, 422, "tidal_profile"),
        ("/v1/policy", {"mode": 3}, None, 400, "mode"),
        ("/v1/policy", {"speed": "max"}, None, 400, "speed"),
    ],
)
async def test_bad_bodies_are_4xx_naming_the_field(
    api: Api, path: str, body: Any, raw: bytes | None, status: int, field: str
) -> None:
    got, problem = await api.call("POST", path, body, raw=raw)
    assert got == status, problem
    assert problem["field"] == field and problem["status"] == status and problem["detail"]


async def test_a_task_waits_for_a_node_and_can_be_cancelled(api: Api) -> None:
    spec = {"id": "svc", "command": ["sleep", "5"], "restart": "always"}
    status, view = await api.call("POST", "/v1/tasks", spec)
    assert status == 201 and view["state"] == "pending" and "no node" in view["reason"]
    assert (await api.call("POST", "/v1/tasks", spec))[0] == 409
    status, listed = await api.call("GET", "/v1/tasks", token="read")
    assert [t["id"] for t in listed["tasks"]] == ["svc"]
    status, view = await api.call("DELETE", "/v1/tasks/svc")
    assert status == 200 and view["state"] == "cancelled"
    assert (await api.call("DELETE", "/v1/tasks/other"))[0] == 404
    assert (await api.call("GET", "/v1/tasks/other"))[0] == 404
    status, events = await api.call("GET", "/v1/events")
    assert "cancelled" in [e["kind"] for e in events["events"]]


async def test_the_policy_switch_survives_a_restart(tmp_path: Path) -> None:
    engine, task = await start(tmp_path)
    async with aiohttp.ClientSession() as session:
        api = Api(engine, session)
        status, view = await api.call(
            "POST", "/v1/policy", {"mode": "energy", "tidal_profile": "campus"}
        )
        assert status == 200 and view["mode"] == "energy" and view["tidal_profile"] == "campus"
        await stop(engine, task)
        engine, task = await start(tmp_path)
        api = Api(engine, session)
        status, view = await api.call("GET", "/v1/policy", token="read")
        assert view["mode"] == "energy" and view["tidal_profile"] == "campus"
        assert view["tidal_windows"]  # the campus profile's windows
    await stop(engine, task)


async def test_the_kubernetes_extender_is_mounted_without_a_token(api: Api) -> None:
    pod = {"metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    args = {"Pod": pod, "NodeNames": ["gw-a"]}
    status, body = await api.call("POST", "/v1/k8s/filter", args, token=None)
    assert status == 200, body
    assert "gw-a" in body["FailedAndUnresolvableNodes"]  # not a node central knows (yet)
    status, body = await api.call("POST", "/v1/k8s/filter", token=None, raw=b"[")
    assert status == 400
