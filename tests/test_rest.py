"""The shared HTTP plumbing (``edgesched.rest``): body depth and size caps at both tiers, and
the REST client's answers (status and body, problem details as one line, unreachable named)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EdgeNode
from test_central_api import start, stop

from edgesched.ports import free_port
from edgesched.rest.client import ApiClient, ApiError, ApiTarget, Unreachable
from edgesched.rest.server import MAX_JSON_DEPTH, BodyError, json_depth, parse_json


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('{"a": "[[[[{{{{"}', 1),  # brackets inside a string do not count
        ('{"a": "\\"[[[["}', 1),  # nor after an escaped quote
        ('["\\\\", [[]]]', 3),  # an escaped backslash ends the escape
        (_nested(5000), 5000),
    ],
)
def test_json_depth(text: str, depth: int) -> None:
    assert json_depth(text) == depth
    assert json_depth(text.encode()) == depth


def test_parse_json_refuses_deep_and_malformed_bodies() -> None:
    assert parse_json(_nested(MAX_JSON_DEPTH).encode()) is not None
    with pytest.raises(BodyError) as deep:
        parse_json(_nested(MAX_JSON_DEPTH + 1).encode())
    assert (deep.value.status, deep.value.title) == (400, "Body too deep")
    with pytest.raises(BodyError) as bad:
        parse_json(b'{"id": ')
    assert (bad.value.status, bad.value.title) == (400, "Malformed JSON")


def _deep_task(depth: int) -> bytes:
    return json.dumps({"id": "deep", "command": ["true"]})[:-1].encode() + (
        b', "labels": ' + _nested(depth).encode() + b"}"
    )


def test_an_edge_node_answers_400_to_a_body_5000_levels_deep(edge_node: EdgeNode) -> None:
    status, body = edge_node.request("POST", "/v1/tasks", raw=_deep_task(5000))
    assert status == 400, body
    assert body["title"] == "Body too deep" and body["field"] == "body"
    assert edge_node.get("/v1/health", auth=False)[0] == 200


async def test_central_answers_400_to_a_body_5000_levels_deep(tmp_path: Path) -> None:
    engine, task = await start(tmp_path)
    try:
        client = ApiClient(ApiTarget.from_state_dir(engine.state_dir))  # blocking: off the loop
        resp = await asyncio.to_thread(client.request, "POST", "/v1/tasks", raw=_deep_task(5000))
        assert resp.status == 400, resp.body
        assert resp.body["title"] == "Body too deep"
        bad = {"id": "x", "command": ["true"], "cpu": -1}
        with pytest.raises(ApiError) as err:
            await asyncio.to_thread(client.call, "POST", "/v1/tasks", bad)
        assert err.value.status == 400 and err.value.field == "cpu"
        assert str(err.value).startswith("cpu: ") and "(HTTP 400)" in str(err.value)
        good = {"id": "fine", "command": ["true"]}
        ok: Any = await asyncio.to_thread(client.call, "POST", "/v1/tasks", good)
        assert ok["id"] == "fine"
    finally:
        await stop(engine, task)


def test_the_client_names_an_unreachable_address() -> None:
    port = free_port()
    client = ApiClient(ApiTarget(f"http://127.0.0.1:{port}", "t"), timeout=2)
    with pytest.raises(Unreachable) as err:
        client.call("GET", "/v1/health")
    assert f"127.0.0.1:{port}" in str(err.value)
    assert isinstance(err.value, OSError)  # callers that catch OSError still do
