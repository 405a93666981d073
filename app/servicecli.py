"""``edgesched service ...``: the operator's commands for services (issue 15), against
central's ``/v1/services`` (as ``kubectl apply`` / ``kubectl scale`` / ``nomad job run``).

- ``service apply FILE``: create or change a service from a job file (TOML or JSON: the
  service's fields, or a ``[service]`` table with them; ``[service.template]`` the task);
- ``service list``, ``service show NAME``: the services, one with each replica;
- ``service scale NAME N``, ``service delete NAME``, ``service load NAME CORES``.

Where central is and its token: as every fleet command (:mod:`edgesched.fleetcli`).
"""

from __future__ import annotations

import json
import tomllib
import urllib.parse
from pathlib import Path
from typing import Annotated, Any

import typer

from edgesched.fleetcli import (
    AddrOption,
    JsonOption,
    TokenFileOption,
    TokenOption,
    _fail,
    _s,
    _table,
    call,
    client,
)


def service_path(name: str, tail: str = "") -> str:
    return "/v1/services/" + urllib.parse.quote(name, safe="") + tail


def read_job_file(path: Path) -> dict[str, Any]:
    """A service's body from a TOML or JSON job file: its fields at the top, or in a
    ``service`` table."""
    try:
        text = path.read_text()
        body = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        _fail(f"{path}: {exc}")
    if not isinstance(body, dict):
        _fail(f"{path}: not an object")
    inner = body.get("service")
    if isinstance(inner, dict) and set(body) == {"service"}:
        body = inner
    return body


def _summary(view: dict[str, Any]) -> str:
    rollout = view["rollout"]
    state = f"{view['running']}/{view['replicas']} running"
    if rollout["outdated"]:
        state += f", rolling out ({rollout['outdated']} slots to go"
        state += ", stalled)" if rollout["stalled"] else ")"
    if view["deleted"]:
        state += ", being deleted"
    return f"{view['name']}: {state}; {view['reason']}"


def _echo(view: dict[str, Any], as_json: bool) -> None:
    """A service's answer: the API's JSON, or its one-line summary."""
    typer.echo(json.dumps(view, indent=2) if as_json else _summary(view))


def register(app: typer.Typer) -> None:
    service_app = typer.Typer(
        help="Services: replicas of a task template kept at their count.", no_args_is_help=True
    )
    app.add_typer(service_app, name="service")

    @service_app.command("apply")
    def apply(
        file: Annotated[Path, typer.Argument(help="A TOML or JSON job file.")],
        replicas: Annotated[
            int | None, typer.Option(help="Override the file's replica count.")
        ] = None,
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Create a service, or change it: a new template rolls out, a new count scales."""
        body = read_job_file(file)
        if replicas is not None:
            body["replicas"] = replicas
        view = call(client(addr, token, token_file), "POST", "/v1/services", body)
        _echo(view, as_json)

    @service_app.command("list")
    def list_services(
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Every service: wanted and running replicas, revision, the last scaling reason."""
        views = call(client(addr, token, token_file), "GET", "/v1/services")["services"]
        if as_json:
            typer.echo(json.dumps(views, indent=2))
            return
        rows = [
            [v["name"], str(v["replicas"]), str(v["running"]), v["revision"],
             str(v["rollout"]["outdated"]), v["reason"]]
            for v in views
        ]  # fmt: skip
        _table(rows, ["NAME", "WANTED", "RUNNING", "REVISION", "OUTDATED", "REASON"])

    @service_app.command("show")
    def show(
        name: Annotated[str, typer.Argument(help="Service name.")],
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """One service and each of its replicas (slot, revision, phase, node)."""
        view = call(client(addr, token, token_file), "GET", service_path(name))
        if as_json:
            typer.echo(json.dumps(view, indent=2))
            return
        typer.echo(_summary(view))
        load = view.get("load")
        if load is not None:
            peak = view.get("forecast_peak")
            typer.echo(f"load {load['cores']:.2f} cores; forecast peak {_s(peak)}")
        rows = [
            [t["id"], str(t["slot"]), t["revision"],
             t["phase"] + (" (stopping)" if t["stopping"] else ""), _s(t["node"])]
            for t in view["tasks"]
        ]  # fmt: skip
        _table(rows, ["TASK", "SLOT", "REVISION", "PHASE", "NODE"])

    @service_app.command("scale")
    def scale(
        name: Annotated[str, typer.Argument(help="Service name.")],
        replicas: Annotated[int, typer.Argument(help="The replica count.")],
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Set a service's replica count (within its min and max)."""
        view = call(
            client(addr, token, token_file), "POST", service_path(name, "/scale"),
            {"replicas": replicas},
        )  # fmt: skip
        _echo(view, as_json)

    @service_app.command("delete")
    def delete(
        name: Annotated[str, typer.Argument(help="Service name.")],
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Stop every replica; the service goes once none runs."""
        view = call(client(addr, token, token_file), "DELETE", service_path(name))
        _echo(view, as_json)

    @service_app.command("load")
    def load(
        name: Annotated[str, typer.Argument(help="Service name.")],
        cores: Annotated[float, typer.Argument(help="The load it serves now, in cores.")],
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
    ) -> None:
        """Report the load a service serves (its autoscaler's signal)."""
        answer = call(
            client(addr, token, token_file), "POST", service_path(name, "/load"),
            {"cores": cores},
        )  # fmt: skip
        typer.echo(f"{answer['name']}: load {answer['load']:g} cores")
