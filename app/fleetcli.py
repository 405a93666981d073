"""The operator's commands against central's API (issue 14): ``edgesched run``, ``tasks``,
``task``, ``history``, ``logs``, ``cancel``, ``nodes``, in the style of ``nomad job run`` /
``kubectl``.

Where central is and its token come from ``--addr`` / ``EDGESCHED_ADDR`` and ``--token`` /
``EDGESCHED_TOKEN``, or a file holding it (``--token-file`` / ``EDGESCHED_TOKEN_FILE``); what
those leave unset, from the context file (``edgesched context set``: ``addr`` and
``token_file``, in ``~/.config/edgesched/context.toml`` or ``EDGESCHED_CONTEXT``, as a
kubeconfig); then ``http://127.0.0.1:7300`` and central's own
``/var/lib/edgesched-central/api-token`` when readable. Every command prints a table, or the
API's JSON with ``--json``; an unreachable central is one line naming the address, an API
refusal one line naming the field.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from edgesched.rest.client import ApiClient, ApiError, ApiTarget, Unreachable

DEFAULT_ADDR = "http://127.0.0.1:7300"
DEFAULT_TOKEN_FILE = Path("/var/lib/edgesched-central/api-token")

AddrOption = Annotated[
    str | None,
    typer.Option(
        "--addr", envvar="EDGESCHED_ADDR", help=f"Central's API (default {DEFAULT_ADDR})."
    ),
]
TokenOption = Annotated[
    str | None, typer.Option("--token", envvar="EDGESCHED_TOKEN", help="Central's API token.")
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        envvar="EDGESCHED_TOKEN_FILE",
        help=f"A file holding the token (default {DEFAULT_TOKEN_FILE} if readable).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON.")]


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", err=True, fg="red")
    raise typer.Exit(2)


def context_path() -> Path:
    """Where the context file is: ``EDGESCHED_CONTEXT``, else under ``XDG_CONFIG_HOME``
    (``~/.config``)."""
    named = os.environ.get("EDGESCHED_CONTEXT")
    if named:
        return Path(named)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "edgesched" / "context.toml"


def read_context(path: Path | None = None) -> dict[str, str]:
    """The context file's ``addr`` and ``token_file`` (strings), {} if there is none; a
    malformed file is a one-line error naming it."""
    path = path or context_path()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        _fail(f"context file {path}: {exc}")
    unknown = sorted(set(data) - {"addr", "token_file"})
    if unknown:
        _fail(f"context file {path}: unknown key {unknown[0]!r} (addr, token_file)")
    for key, value in data.items():
        if not isinstance(value, str) or not value:
            _fail(f"context file {path}: {key} must be a non-empty string")
    return dict(data)


def client(addr: str | None, token: str | None, token_file: Path | None) -> ApiClient:
    """The API client of central at ``addr`` with the token from the options, the context
    file, or central's own token file."""
    context = read_context() if addr is None or (token is None and token_file is None) else {}
    addr = addr or context.get("addr")
    if token_file is None and "token_file" in context:
        token_file = Path(context["token_file"]).expanduser()
    if token is None:
        path = token_file or (DEFAULT_TOKEN_FILE if DEFAULT_TOKEN_FILE.exists() else None)
        if path is not None:
            try:
                token = path.read_text().strip()
            except OSError as exc:
                _fail(f"token file {path}: {exc.strerror}")
    return ApiClient(ApiTarget((addr or DEFAULT_ADDR).rstrip("/"), token or ""))


def task_path(task_id: str) -> str:
    """``/v1/tasks/{id}`` with the id quoted (an id may hold any character but ``/``)."""
    return "/v1/tasks/" + urllib.parse.quote(task_id, safe="")


def call(api: ApiClient, method: str, path: str, body: Any = None) -> Any:
    try:
        return api.call(method, path, body)
    except Unreachable as exc:
        _fail(f"cannot reach central at {api.target.base_url}: {exc}")
    except ApiError as exc:
        _fail(str(exc))


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _s(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def pages(api: ApiClient, query: dict[str, str], limit: int) -> Iterator[dict[str, Any]]:
    """Up to ``limit`` tasks of ``GET /v1/tasks``, following its pages."""
    after: str | None = None
    left = limit
    while left > 0:
        params = {**query, "limit": str(min(left, 1000))} | ({"after": after} if after else {})
        page = call(api, "GET", "/v1/tasks?" + urllib.parse.urlencode(params))
        yield from page["tasks"]
        left -= len(page["tasks"])
        after = page.get("next")
        if after is None:
            return


def stream_logs(api: ApiClient, task_id: str, tail: int, follow: bool, as_json: bool) -> None:
    """``GET /v1/tasks/{id}/logs`` to stdout as it comes (``follow``: until the task has
    finished); a refusal, an unreachable node or central, or a stream cut short: one line."""
    import http.client
    import sys
    import urllib.error
    import urllib.parse
    import urllib.request

    path = f"{task_path(task_id)}/logs?tail={tail}"
    path += "&follow=1" if follow else ""
    url = api.target.base_url + path
    request = urllib.request.Request(url, headers=api.target.headers())
    out = sys.stdout.buffer
    try:
        with urllib.request.urlopen(request, timeout=None if follow else 60) as answer:
            node = answer.headers.get("X-Edgesched-Node", "")
            if as_json:
                text = answer.read().decode("utf-8", "replace")
                typer.echo(json.dumps({"id": task_id, "node": node, "text": text}, indent=2))
                return
            while chunk := answer.read1(65536):
                out.write(chunk)
                out.flush()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        _fail(str(ApiError(exc.code, body, url)))
    except http.client.IncompleteRead:
        _fail(f"the output of {task_id} broke off: its node stopped answering central")
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        _fail(f"cannot reach central at {api.target.base_url}: {reason}")


def register(app: typer.Typer) -> None:
    """Add the operator's commands to ``app``."""

    @app.command("tasks")
    def tasks(
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        phase: Annotated[str | None, typer.Option(help="pending, placed, running, ...")] = None,
        node: Annotated[str | None, typer.Option(help="Only those on this node.")] = None,
        origin: Annotated[str | None, typer.Option(help="central or node.")] = None,
        limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 200,
        as_json: JsonOption = False,
    ) -> None:
        """Every task central knows (placed by it or decided by a node), by id."""
        api = client(addr, token, token_file)
        query = {k: v for k, v in (("phase", phase), ("node", node), ("origin", origin)) if v}
        found = list(pages(api, query, limit))
        if as_json:
            typer.echo(json.dumps(found, indent=2))
            return
        rows = [
            [t["id"], t["phase"], _s(t["node"]), _s(t["exit_code"]), t["origin"],
             _s(t["decided_by"]), "cut off" if t["unknown_since"] else ""]
            for t in found
        ]  # fmt: skip
        _table(rows, ["ID", "PHASE", "NODE", "EXIT", "ORIGIN", "DECIDED BY", ""])

    @app.command("history")
    def history(
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        phase: Annotated[str | None, typer.Option(help="exited, failed or cancelled.")] = None,
        node: Annotated[str | None, typer.Option(help="Only those that ran on this node.")] = None,
        workload: Annotated[str | None, typer.Option(help="Only this workload class.")] = None,
        limit: Annotated[int, typer.Option(min=1, max=1000, help="The newest this many.")] = 50,
        as_json: JsonOption = False,
    ) -> None:
        """Finished tasks from central's history, newest first."""
        query = {k: v for k, v in (("phase", phase), ("node", node), ("workload", workload)) if v}
        query["limit"] = str(limit)
        page = call(
            client(addr, token, token_file),
            "GET",
            "/v1/history?" + urllib.parse.urlencode(query),
        )
        if as_json:
            typer.echo(json.dumps(page["tasks"], indent=2))
            return
        rows = [
            [t["id"], t["phase"], _s(t.get("node")), _s(t.get("exit_code")), t["origin"],
             t["workload"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t["finished_at"]))]
            for t in page["tasks"]
        ]  # fmt: skip
        _table(rows, ["ID", "PHASE", "NODE", "EXIT", "ORIGIN", "WORKLOAD", "FINISHED"])

    @app.command("task")
    def task(
        task_id: Annotated[str, typer.Argument(help="Task id.")],
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """One task: its lifecycle, central's assignment and every node's copy."""
        view = call(client(addr, token, token_file), "GET", task_path(task_id))
        if as_json:
            typer.echo(json.dumps(view, indent=2))
            return
        for key in ("id", "phase", "node", "exit_code", "restarts", "origin", "decided_by",
                    "reason", "submitted_at", "started_at", "finished_at", "unknown_since",
                    "state", "epoch"):  # fmt: skip
            typer.echo(f"{key:<14} {_s(view.get(key))}")
        for node_id, held in sorted(view["copies"].items()):
            typer.echo(f"copy on {node_id}: {held['state']} (epoch {_s(held['epoch'])})")

    @app.command("logs")
    def logs(
        task_id: Annotated[str, typer.Argument(help="Task id.")],
        tail: Annotated[
            int, typer.Option(min=0, max=10_000, help="The last this many lines.")
        ] = 100,
        follow: Annotated[
            bool, typer.Option("--follow", "-f", help="Then what it writes, until it finishes.")
        ] = False,
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: Annotated[
            bool, typer.Option("--json", help='Print {"id", "node", "text"} (not with -f).')
        ] = False,
    ) -> None:
        """A task's output (stdout and stderr), read through central from its node."""
        if as_json and follow:
            _fail("--json prints a finished read: not with --follow")
        stream_logs(client(addr, token, token_file), task_id, tail, follow, as_json)

    @app.command("run")
    def run(
        task_id: Annotated[str, typer.Argument(help="Task id (unique in the fleet).")],
        command: Annotated[
            list[str] | None, typer.Argument(help="Command and arguments (after --).")
        ] = None,
        file: Annotated[
            Path | None, typer.Option("--file", "-f", help="A TOML or JSON task spec.")
        ] = None,
        cpu: Annotated[float | None, typer.Option(help="CPU cores.")] = None,
        mem_gib: Annotated[float | None, typer.Option(help="Memory, GiB.")] = None,
        priority: Annotated[int | None, typer.Option(help="0-999, higher wins.")] = None,
        workload: Annotated[str | None, typer.Option(help="Workload class.")] = None,
        restart: Annotated[
            str | None, typer.Option(help="never, on-failure or always (a service).")
        ] = None,
        node: Annotated[str | None, typer.Option(help="Pin it to this node.")] = None,
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Submit a task (or a service: --restart always) to central, from flags or a file."""
        body: dict[str, Any] = {}
        if file is not None:
            try:
                text = file.read_text()
                body = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
            except (OSError, ValueError) as exc:
                _fail(f"{file}: {exc}")
            if not isinstance(body, dict):
                _fail(f"{file}: not an object")
        body["id"] = task_id
        if command:
            body["command"] = command
        flags = {"cpu": cpu, "mem_gib": mem_gib, "priority": priority, "workload": workload,
                 "restart": restart, "node": node}  # fmt: skip
        for key, value in flags.items():
            if value is not None:
                body[key] = value
        if "command" not in body:
            _fail("no command: give it after -- or in --file")
        view = call(client(addr, token, token_file), "POST", "/v1/tasks", body)
        if as_json:
            typer.echo(json.dumps(view, indent=2))
            return
        where = view["node"] or "no node yet"
        typer.echo(f"{view['id']}: {view['phase']} on {where} ({_s(view.get('reason'))})")

    @app.command("cancel")
    def cancel(
        task_id: Annotated[str, typer.Argument(help="Task id.")],
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Cancel a task central placed (its node stops it when it hears)."""
        view = call(client(addr, token, token_file), "DELETE", task_path(task_id))
        if as_json:
            typer.echo(json.dumps(view, indent=2))
            return
        typer.echo(f"{view['id']}: {view['phase']}")

    context_app = typer.Typer(
        help="Where central is, kept for the commands above (as a kubeconfig context).",
        no_args_is_help=True,
    )
    app.add_typer(context_app, name="context")

    @context_app.command("set")
    def context_set(
        addr: Annotated[str, typer.Option("--addr", help="Central's API, http(s)://host:port.")],
        token_file: Annotated[
            Path | None, typer.Option("--token-file", help="A file holding the API token.")
        ] = None,
    ) -> None:
        """Write the context file (0600): the address, and where the token is (not the token
        itself: it stays in its own 0600 file)."""
        if not addr.startswith(("http://", "https://")):
            _fail(f"--addr must start with http:// or https://, got {addr!r}")
        path = context_path()
        lines = [f"addr = {json.dumps(addr.rstrip('/'))}"]
        if token_file is not None:
            lines.append(f"token_file = {json.dumps(str(token_file.expanduser().resolve()))}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write("\n".join(lines) + "\n")
        except OSError as exc:
            _fail(f"context file {path}: {exc.strerror}")
        typer.echo(f"wrote {path}")

    @context_app.command("show")
    def context_show(as_json: JsonOption = False) -> None:
        """The context file's path and what it says."""
        path = context_path()
        found = read_context(path)
        if as_json:
            typer.echo(json.dumps({"path": str(path), **found}, indent=2))
            return
        typer.echo(f"{path}: " + (", ".join(f"{k} {v}" for k, v in found.items()) or "none"))

    @app.command("nodes")
    def nodes(
        addr: AddrOption = None,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Every node, as central names its state (connected, suspect, partitioned, dead)."""
        found = call(client(addr, token, token_file), "GET", "/v1/nodes")["nodes"]
        if as_json:
            typer.echo(json.dumps(found, indent=2))
            return
        rows = []
        for n in found:
            reg = n.get("registration") or {}
            counts = ", ".join(f"{k} {v}" for k, v in sorted(n["tasks"].items())) or "-"
            rows.append([n["id"], n["state"], _s(reg.get("arch")), _s(reg.get("server_class")),
                         counts])  # fmt: skip
        _table(rows, ["ID", "STATE", "ARCH", "CLASS", "TASKS"])
