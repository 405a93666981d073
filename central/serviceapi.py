"""Central's REST routes for services (issue 15): ``/v1/services``.

- ``GET /v1/services``: every service, with its replicas' counts by phase;
- ``POST /v1/services``: create a service, or change it (same name): a body of
  :meth:`ServiceSpec.from_json` (a changed template rolls out, a changed count scales);
- ``GET /v1/services/{name}``: one service, each replica with its slot, revision, phase, node;
- ``POST /v1/services/{name}/scale``: ``{"replicas": n}``;
- ``POST /v1/services/{name}/load``: ``{"cores": x}``, the load the service serves now (its
  autoscaler's signal, from whatever measures it: a metrics adapter, the app itself); with
  ``[central] autoscale_time_scale`` > 1 (a demo), ``"at"``: its simulated time;
- ``DELETE /v1/services/{name}``: stop every replica; the service goes once none runs.

Writes need the admin token (the API's guard); every answer is the service's view, after its
change is in central's journal.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from aiohttp import web

from edgesched.central.services import ServiceRefused
from edgesched.core.service import ServiceSpec
from edgesched.core.task import SpecError
from edgesched.rest.server import BodyError, json_body, problem

if TYPE_CHECKING:
    from edgesched.central.engine import CentralEngine

_ENGINE: web.AppKey[CentralEngine] = web.AppKey("services-engine")


def _engine(request: web.Request) -> CentralEngine:
    return request.app[_ENGINE]


async def list_services(request: web.Request) -> web.Response:
    engine = _engine(request)
    if engine.fleet is not None:
        engine.sync_index()
    views = []
    for name in sorted(engine.services.entries()):
        view = engine.services.view(name)
        if view is not None:
            del view["tasks"]  # (a summary: GET /v1/services/{name} lists them)
            views.append(view)
    return web.json_response({"services": views})


async def get_service(request: web.Request) -> web.Response:
    engine = _engine(request)
    if engine.fleet is not None:
        engine.sync_index()
    name = request.match_info["name"]
    view = engine.services.view(name)
    if view is None:
        return problem(404, "Not Found", f"no service {name!r}", "name")
    return web.json_response(view)


async def apply_service(request: web.Request) -> web.Response:
    try:
        body = await json_body(request)
    except BodyError as exc:
        return exc.response()
    try:
        spec = ServiceSpec.from_json(body)
    except SpecError as exc:
        field, _, message = str(exc).partition(": ")
        # well-formed fields that do not fit together (replicas outside [min, max]): 422
        together = field == "min, max" or (field == "replicas" and "within" in message)
        status = 422 if together else 400
        return problem(status, "Service refused", message or str(exc), field)
    engine = _engine(request)
    created = spec.name not in engine.services.entries()
    try:
        view = await engine.apply_service(spec)
    except ServiceRefused as exc:
        return problem(exc.status, "Service refused", exc.message, exc.field)
    return web.json_response(view, status=201 if created else 200)


async def scale_service(request: web.Request) -> web.Response:
    try:
        body = await json_body(request)
    except BodyError as exc:
        return exc.response()
    replicas = body.get("replicas") if isinstance(body, dict) else None
    if (
        not isinstance(body, dict)
        or set(body) != {"replicas"}
        or isinstance(replicas, bool)
        or not isinstance(replicas, int)
    ):
        return problem(400, "Cannot scale", 'expected {"replicas": <an integer>}', "replicas")
    try:
        view = await _engine(request).scale_service(request.match_info["name"], replicas)
    except ServiceRefused as exc:
        return problem(exc.status, "Cannot scale", exc.message, exc.field)
    return web.json_response(view)


async def report_load(request: web.Request) -> web.Response:
    try:
        body = await json_body(request)
    except BodyError as exc:
        return exc.response()
    cores = body.get("cores") if isinstance(body, dict) else None
    if (
        not isinstance(body, dict)
        or "cores" not in body
        or not set(body) <= {"cores", "at"}
        or isinstance(cores, bool)
        or not isinstance(cores, int | float)
        or not math.isfinite(cores)
        or not 0 <= cores <= 1e9
    ):
        return problem(400, "Load refused", 'expected {"cores": <a number in [0, 1e9]>}', "cores")
    at = body.get("at")
    if at is not None and (
        isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at <= 2**40
    ):
        return problem(400, "Load refused", "unix seconds of a simulated clock", "at")
    try:
        answer = await _engine(request).report_service_load(
            request.match_info["name"], cores, None if at is None else float(at)
        )
    except ServiceRefused as exc:
        return problem(exc.status, "Load refused", exc.message, exc.field)
    return web.json_response(answer)


async def delete_service(request: web.Request) -> web.Response:
    try:
        view = await _engine(request).delete_service(request.match_info["name"])
    except ServiceRefused as exc:
        return problem(exc.status, "Cannot delete", exc.message, exc.field)
    return web.json_response(view)


def add_routes(app: web.Application, engine: CentralEngine) -> None:
    app[_ENGINE] = engine
    app.router.add_get("/v1/services", list_services)
    app.router.add_post("/v1/services", apply_service)
    app.router.add_get("/v1/services/{name}", get_service)
    app.router.add_delete("/v1/services/{name}", delete_service)
    app.router.add_post("/v1/services/{name}/scale", scale_service)
    app.router.add_post("/v1/services/{name}/load", report_load)
