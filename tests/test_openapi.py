"""The OpenAPI documents of central and the edge node: valid, in step with the routes the apps
register, and true of live servers (schemathesis fuzzes an in-process central, its broker
unreachable, and a real `edgesched edge run` process: no 5xx, and every status code, content
type and body as documented)."""

from __future__ import annotations

import asyncio
import copy
import json
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import pytest
import requests
import schemathesis
from conftest import EdgeNode, free_port
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from openapi_spec_validator import validate

from edgesched.central.api import build_app as build_central_app
from edgesched.central.engine import CentralEngine
from edgesched.central.openapi import EXTENDER_FLAG, central_document
from edgesched.config import CentralConfig, EdgeschedConfig, MqttConfig
from edgesched.edge.api import build_app as build_edge_app
from edgesched.edge.openapi import edge_document
from edgesched.serve import central_engine

METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
#: Never fuzzed: an event stream that only ends when the client goes.
ENDLESS = {("GET", "/v1/stream")}
#: schemathesis' own strategies draw from `random` (its warning, not ours).
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
#: A schema-valid request may still be refused for what JSON Schema cannot know: a pinned node
#: central does not have, a demand larger than the edge node (422).
POSITIVE_OK = ["2xx", "3xx", "401", "403", "404", "409", "422"]


def _central_engine(tmp_path: Path, **central: Any) -> CentralEngine:
    return central_engine(
        EdgeschedConfig(
            central=CentralConfig(
                state_dir=str(tmp_path / "central"),
                api_port=0,
                mqtt=MqttConfig(port=free_port(), reconnect_max_s=1.0),
                **central,
            )
        )
    )


def _documented(doc: dict[str, Any], *, extender: bool = True) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS and (extender or not op.get(EXTENDER_FLAG))
    }


def _registered(routes: Iterable[Any]) -> set[tuple[str, str]]:
    # aiohttp registers HEAD next to every GET: not separate operations.
    return {(r.method, r.resource.canonical) for r in routes if r.method != "HEAD"}


# --- the documents ------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [central_document, edge_document])
def test_the_documents_are_valid_openapi_3_1(make: Any) -> None:
    doc = make()
    validate(doc)
    assert doc["openapi"].startswith("3.1")
    loaded = schemathesis.openapi.from_dict(doc)
    ops = [result.ok() for result in loaded.get_all_operations()]  # type: ignore[union-attr]
    assert len(ops) == len(_documented(doc))
    assert json.loads(json.dumps(doc)) == doc  # plain JSON


def test_central_routes_and_the_document_match(tmp_path: Path) -> None:
    doc = central_document()
    with_k8s = build_central_app(_central_engine(tmp_path, k8s_extender=True), "a", "r")
    assert _registered(with_k8s.router.routes()) == _documented(doc)
    without = build_central_app(_central_engine(tmp_path / "b"), "a", "r")
    assert _registered(without.router.routes()) == _documented(doc, extender=False)
    flagged = {
        path for path, item in doc["paths"].items() if item.get("post", {}).get(EXTENDER_FLAG)
    }
    assert flagged == {"/v1/k8s/filter", "/v1/k8s/prioritize", "/v1/k8s/bind"}


def test_edge_routes_and_the_document_match() -> None:
    app = build_edge_app(cast(Any, object()), "token")
    assert _registered(app.router.routes()) == _documented(edge_document())


def test_the_task_spec_schema_is_the_parser_s() -> None:
    """Enums and required fields of the TaskSpec schema, against TaskSpec.from_json."""
    from edgesched.core.task import SpecError, TaskSpec

    spec = central_document()["components"]["schemas"]["TaskSpec"]
    props = spec["properties"]
    assert spec["required"] == ["id", "command"] and spec["additionalProperties"] is False
    # images and accel_slices are written only when set (readable by an older release during
    # an upgrade)
    full = TaskSpec.from_json({"id": "t", "command": ["x"], "images": {"arm64": "a"}}).to_json()
    sliced = TaskSpec.from_json({"id": "t", "command": ["x"], "accel_slices": 2}).to_json()
    assert set(props) == set(full) | set(sliced)
    # the schema's "not": whole devices or slices, as the parser says
    assert spec["not"]["required"] == ["accel", "accel_slices"]
    with pytest.raises(SpecError):
        TaskSpec.from_json({"id": "t", "command": ["x"], "accel": 1, "accel_slices": 1})
    for field, values in (
        ("restart", props["restart"]["enum"]),
        ("reconcile", props["reconcile"]["enum"]),
        ("archs", [[v] for v in props["archs"]["items"]["enum"]]),
        ("server_classes", [[v] for v in props["server_classes"]["items"]["enum"]]),
    ):
        for value in values:
            TaskSpec.from_json({"id": "t", "command": ["x"], field: value})
        with pytest.raises(SpecError):
            TaskSpec.from_json({"id": "t", "command": ["x"], field: "nope"})


# --- schemathesis against live servers ----------------------------------------------------------


def fuzz(
    doc: dict[str, Any],
    base_url: str,
    token: str,
    *,
    max_examples: int,
    positive_only: set[tuple[str, str]] = frozenset(),  # type: ignore[assignment]
) -> list[str]:
    """Every documented operation but the endless ones, positive and negative data; the
    failures found, one line each (empty: none)."""
    config = schemathesis.Config.from_dict(
        {
            # Auth as the document's scheme, so that a negative case without it stays without.
            "auth": {"openapi": {"bearer": {"bearer": token}}},
            "checks": {"positive_data_acceptance": {"expected-statuses": POSITIVE_OK}},
        }
    )
    schema = schemathesis.openapi.from_dict(doc, config=config)

    @schema.hook
    def map_body(context: schemathesis.HookContext, body: Any) -> Any:
        return _integral_floats_as_ints(body)

    failures: list[str] = []
    with requests.Session() as session:
        for result in schema.get_all_operations():
            op = result.ok()  # type: ignore[union-attr]
            key = (op.method.upper(), op.path)
            if key in ENDLESS:
                continue
            modes = [schemathesis.GenerationMode.POSITIVE]
            if key not in positive_only:
                modes.append(schemathesis.GenerationMode.NEGATIVE)
            for mode in modes:

                @given(case=op.as_strategy(generation_mode=mode))
                @settings(
                    max_examples=max_examples,
                    deadline=None,
                    derandomize=True,
                    database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck),
                    print_blob=False,
                )
                def run(case: schemathesis.Case[Any]) -> None:
                    case.call_and_validate(
                        base_url=base_url,
                        session=session,
                        allow_redirects=False,
                        timeout=10,
                    )

                try:
                    run()
                except Unsatisfiable:  # nothing to negate: no parameters, no body
                    assert mode is schemathesis.GenerationMode.NEGATIVE, op.label
                except (Exception, BaseExceptionGroup) as exc:  # report it, go on with the others
                    failures.append(f"{op.label} ({mode.value}): {_explain(exc)}"[:4000])
    return failures


async def test_schemathesis_finds_nothing_against_central(tmp_path: Path) -> None:
    engine = _central_engine(tmp_path, k8s_extender=True)
    task = asyncio.create_task(engine.run())
    try:
        async with asyncio.timeout(10):
            await engine.wait_ready()
        base = f"http://127.0.0.1:{engine.api_port}"
        admin = (engine.state_dir / "api-token").read_text().strip()
        served = await asyncio.to_thread(_get_json, f"{base}/v1/openapi.json")
        assert served == central_document()
        # Fuzzing Nodes.items would need names unique across items, which JSON Schema cannot
        # say (the extender answers 400 to a duplicate): one item at most here.
        doc = central_document()
        node_list = doc["components"]["schemas"]["K8sNodeList"]
        node_list["properties"]["items"]["maxItems"] = 1
        # The extender's Pod and NodeList are Kubernetes objects it reads only in part (as
        # kube-scheduler does): a violation in a field it does not use is not refused, so
        # negative fuzzing would demand a strictness Kubernetes itself does not have. Its
        # answers to valid payloads are still checked against the document.
        extender = {("POST", f"/v1/k8s/{verb}") for verb in ("filter", "prioritize", "bind")}
        failures = await asyncio.to_thread(
            fuzz, doc, base, admin, max_examples=30, positive_only=extender
        )
        assert not failures, "\n\n".join(failures)
    finally:
        engine.stop()
        async with asyncio.timeout(15):
            await task


def test_schemathesis_finds_nothing_against_an_edge_node(edge_node: EdgeNode) -> None:
    base = edge_node.url("")
    token = (edge_node.state / "api-token").read_text().strip()
    assert _get_json(f"{base}/v1/openapi.json") == edge_document()
    # Submissions run for real here: only `true`, with the environment and cwd untouched, and
    # only schema-valid bodies (a negative case could be any other command).
    doc = edge_document()
    spec = doc["components"]["schemas"]["TaskSpec"]["properties"]
    spec["command"] = {"type": "array", "items": {"const": "true"}, "minItems": 1, "maxItems": 1}
    spec["env"] = {"type": "object", "maxProperties": 0}
    spec["cwd"] = {"type": "null"}
    # The affinity planner runs on the engine's event loop and grows faster than linearly with
    # the threads per core: 1024 threads on 2 cores take ~1 s a cycle, a few such tasks stall
    # the API past any timeout (reported; threads up to MAX_THREADS are accepted).
    spec["threads"] = {"type": "integer", "minimum": 0, "maximum": 64}
    failures = fuzz(doc, base, token, max_examples=25, positive_only={("POST", "/v1/tasks")})
    assert not failures, "\n\n".join(failures)


# --- what the fuzzing found, pinned down -------------------------------------------------------

BIG = str(2**64).encode()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"id": "t", "command": null}', "command"),  # was a 500 (TypeError)
        (b'{"id": "t", "command": ["x"], "accel": ' + BIG + b"}", "accel"),  # was a pycrdt panic
        (b'{"id": "t", "command": ["x"], "limits": {"nofile": ' + BIG + b"}}", "limits.nofile"),
        (b'{"id": "t", "command": ["x"], "cpu": 1' + b"0" * 400 + b"}", "cpu"),  # was a 500
        (b'{"id": "t", "command": ["x"], "env": {"k": "\\udc80"}}', "env.k"),  # a pycrdt panic
        (b'{"id": "t", "command": ["\\ud800"]}', "command"),
        (b'{"id": "t", "command": ["x"], "threads": 1000000000000}', "threads"),  # edge: OOM
        # beyond what the documents carry exactly: replicas would read 2**53 (issue 13)
        (
            b'{"id": "t", "command": ["x"], "limits": {"memory_mb": 9007199254740993}}',
            "limits.memory_mb",
        ),
        (b'{"id": "t", "command": ["x"], "max_restarts": 9223372036854775807}', "max_restarts"),
        # 128 characters, 384 bytes: a file name too long for the node (issue 13)
        (('{"id": "' + "日" * 128 + '", "command": ["x"]}').encode(), "id"),
        (b'{"id": "..", "command": ["x"]}', "id"),
    ],
)
async def test_bodies_the_fuzzing_found_are_refused_naming_the_field(
    tmp_path: Path, raw: bytes, field: str
) -> None:
    engine = _central_engine(tmp_path)
    task = asyncio.create_task(engine.run())
    try:
        async with asyncio.timeout(10):
            await engine.wait_ready()
        admin = (engine.state_dir / "api-token").read_text().strip()
        url = f"http://127.0.0.1:{engine.api_port}/v1/tasks"
        status, body = await asyncio.to_thread(_post, url, raw, admin)
        assert status == 400 and body["field"] == field, body
    finally:
        engine.stop()
        async with asyncio.timeout(15):
            await task


def test_a_task_whose_shell_cannot_start_fails_and_the_node_stays_up(edge_node: EdgeNode) -> None:
    """nofile=1: /bin/sh dies loading libc, and when that is before the executor's go, the
    write used to raise BrokenPipeError out of the scheduling loop, ending the engine (and
    again at each restart). A race: a few tasks make it likely."""
    ids = [f"nofile-{i}" for i in range(12)]
    for task_id in ids:
        spec = {"id": task_id, "command": ["true"], "restart": "never", "limits": {"nofile": 1}}
        status, body = edge_node.request("POST", "/v1/tasks", spec)
        assert status == 201, body

    def all_failed() -> bool:
        tasks = edge_node.tasks()
        return all(tasks[t]["state"] == "failed" for t in ids)

    edge_node.wait(all_failed, what="every task failed")
    assert edge_node.proc is not None and edge_node.proc.poll() is None
    assert edge_node.get("/v1/health", auth=False)[0] == 200


def _post(url: str, raw: bytes, token: str) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=raw, method="POST")
    req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _explain(exc: BaseException) -> str:
    """The failure with what it wraps (Hypothesis' Flaky hides the first error inside)."""
    text = str(exc)
    if isinstance(exc, BaseExceptionGroup):
        text += "".join(f"\n  -> {_explain(inner)}" for inner in exc.exceptions)
    return text


def _integral_floats_as_ints(value: Any) -> Any:
    """JSON Schema counts 1.0 as an integer; the API's parsers (Python's json) do not, and
    refuse it where an integer is due (400 naming the field). A JavaScript or Go client never
    sends one, so neither do we: every integral float goes out as an int (JavaScript writes
    9007199254740992.0, the documents' bound 2**53 that CI run 51 drew, as an integer too)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, list):
        return [_integral_floats_as_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    return value


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_the_fuzzed_copy_does_not_change_the_served_document() -> None:
    doc = central_document()
    before = copy.deepcopy(doc)
    doc["components"]["schemas"]["K8sNodeList"]["properties"]["items"]["maxItems"] = 1
    assert central_document() == before
