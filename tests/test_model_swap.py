"""Swapping a model for the whole fleet at run time, with real processes: Mosquitto, central
and two edge nodes. An admin uploads a placement model to central; the connected node swaps it
in, the node that was down when it was published swaps it in when it comes back, a bad upload
is refused with the model in use kept, and ``learned`` mode places with the swapped model,
also on a node restarted with central gone."""

from __future__ import annotations

import asyncio
import hashlib
import signal
from pathlib import Path
from typing import Any

from conftest import Broker, EdgeNode, central_and_nodes, until

from edgesched.core.learned import N_LEARNED_FEATURES
from edgesched.policies import placement
from edgesched.policies.models import shipped


def _put(central: EdgeNode, kind: str, data: bytes, token: str = "api-token") -> tuple[int, Any]:
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        central.url(f"/v1/models/{kind}?name=uniform"),
        data=data,
        method="PUT",
        headers={
            "Content-Type": "application/octet-stream",
            "Authorization": "Bearer " + (central.state / token).read_text().strip(),
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _runs(node: EdgeNode, kind: str) -> str:
    status, body = node.get("/v1/status")
    assert status == 200, body
    return str(body["models"][kind]["sha256"])


async def test_a_model_published_at_central_reaches_every_node(
    tmp_path: Path, broker: Broker
) -> None:
    new = placement.write_onnx([0.05] * N_LEARNED_FEATURES, tmp_path / "uniform.onnx").read_bytes()
    new_sha = hashlib.sha256(new).hexdigest()
    old_sha = hashlib.sha256(shipped("placement").read_bytes()).hexdigest()
    ports = dict.fromkeys(("gw-a", "gw-b"), broker.port)
    async with central_and_nodes(tmp_path, broker.port, ports) as (central, nodes):
        a, b = nodes["gw-a"], nodes["gw-b"]

        def central_sees(sha: str, *names: str) -> bool:
            status, body = central.get("/v1/models")
            assert status == 200, body
            reported = body["nodes"]
            return all(
                (reported.get(n) or {}).get("placement", {}).get("sha256") == sha for n in names
            )

        await until(lambda: central_sees(old_sha, "gw-a", "gw-b"), 30, "nodes report their models")
        await asyncio.to_thread(b.kill, signal.SIGTERM)  # gw-b is down when the model is published

        assert (await asyncio.to_thread(_put, central, "placement", new, "api-token-read"))[
            0
        ] == 403
        status, body = await asyncio.to_thread(_put, central, "placement", new)
        assert status == 200, body
        assert body["central"]["placement"]["sha256"] == new_sha
        assert body["published"]["placement"]["sha256"] == new_sha
        await until(lambda: _runs(a, "placement") == new_sha, 20, "gw-a swaps the model in")

        # A bad upload: refused with the reason, and nobody's model changes.
        status, body = await asyncio.to_thread(_put, central, "placement", b"\x08\x01garbage")
        assert status == 422 and "cannot load" in body["detail"], body
        forecaster = shipped("forecast").read_bytes()  # well-formed, the wrong contract
        status, body = await asyncio.to_thread(_put, central, "placement", forecaster)
        assert status == 422 and "contract" in body["detail"], body
        status, body = await asyncio.to_thread(_put, central, "weather", new)
        assert status == 404, body
        assert (await asyncio.to_thread(central.get, "/v1/models"))[1]["published"]["placement"][
            "sha256"
        ] == new_sha

        # gw-b comes back and follows the document it missed.
        await asyncio.to_thread(b.start)
        await until(lambda: _runs(b, "placement") == new_sha, 30, "gw-b swaps it in on return")
        await until(lambda: central_sees(new_sha, "gw-a", "gw-b"), 30, "central sees the rollout")

        # learned mode: gw-a places with the swapped model (no fallback).
        status, body = await asyncio.to_thread(
            central.request, "POST", "/v1/policy", {"mode": "learned"}
        )
        assert status == 200 and body["mode"] == "learned", body
        await until(
            lambda: a.get("/v1/status")[1]["policy"] == "learned", 20, "gw-a in learned mode"
        )
        body = {"id": "scored", "command": ["sleep", "60"], "cpu": 0.05, "mem_gib": 0.05}
        assert (await asyncio.to_thread(a.request, "POST", "/v1/tasks", body))[0] == 201

        def placed_by_model() -> dict[str, Any] | None:
            rows = a.get("/v1/decisions?task=scored")[1]
            return next((r for r in rows if r["kind"] == "place"), None)

        decision = await until(placed_by_model, 20, "the task placed")
        assert "learned" in decision["scores"] and "learned_fallback" not in decision["scores"]

        # With central gone, a restarted node still runs the swapped model (its replica of
        # the policy document is in SQLite).
        await asyncio.to_thread(central.kill, signal.SIGTERM)
        await asyncio.to_thread(a.kill, signal.SIGTERM)
        await asyncio.to_thread(a.start)
        assert await asyncio.to_thread(_runs, a, "placement") == new_sha
        _, metrics = await asyncio.to_thread(a.get, "/metrics")
        assert 'edgesched_edge_model_fallbacks_total{kind="placement",stage="swap"}' not in metrics
