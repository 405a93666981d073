"""The ``edgesched`` command line (typer).

Every command has ``--help``; user mistakes (bad config, bad option values, unknown names)
end as one ``error:`` line on stderr and exit code 2, never a traceback; an engine that cannot
run (its API port in use, a store or hardware problem) is one ``error:`` line and exit code 1,
and one that stops because another process runs under its identity exits 3
(:data:`EXIT_IDENTITY_IN_USE`, which a systemd unit lists in ``RestartPreventExitStatus``:
restarting it would only take the session from the other one again; see
docs/troubleshooting.md). Help text and paths are printed verbatim: no Rich markup
(``rich_markup_mode=None``, and messages escaped), so ``[edge]`` or ``/tmp/[bold]x`` stay as
they are.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from edgesched import runengine
from edgesched.brokercli import register as register_join_commands
from edgesched.config import ConfigError, EdgeschedConfig, default_config_toml, load_config
from edgesched.fleetcli import register as register_fleet_commands
from edgesched.servicecli import register as register_service_commands
from edgesched.version import __version__

if TYPE_CHECKING:
    from edgesched.rest.client import ApiClient

app = typer.Typer(
    name="edgesched",
    help="Edge-autonomous heterogeneous compute scheduler.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish)
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help printed verbatim: "[edge]" is text, not markup
)
config_app = typer.Typer(help="Inspect and check configuration files.", no_args_is_help=True)
app.add_typer(config_app, name="config")

err = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """One ``warning:`` line on stderr, ``message`` verbatim."""
    err.print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"edgesched {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Edge-autonomous heterogeneous compute scheduler."""


def _load(path: Path | None) -> EdgeschedConfig:
    try:
        if path is None:
            from edgesched.config import parse_config

            return parse_config({})
        return load_config(path)
    except ConfigError as exc:
        fail(str(exc))


@config_app.command("check")
def config_check(path: Annotated[Path, typer.Argument(help="TOML file to validate.")]) -> None:
    """Validate a config file and the files it names (as this user reads them); print the
    effective policy, or the first error in the file, or one line per missing or unreadable
    file (exit 2)."""
    import tomllib

    from edgesched.config import file_problems

    cfg = _load(path)
    with path.open("rb") as f:
        sections = [k for k in tomllib.load(f) if k in ("edge", "central")]
    problems = file_problems(cfg, sections)
    for problem in problems:
        err.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    if problems:
        raise typer.Exit(2)
    windows = ", ".join(w.name for w in cfg.policy.tidal.windows) or "none"
    typer.echo(
        f"{path}: ok (mode {cfg.policy.mode.value}, tidal profile {cfg.policy.tidal.name}: "
        f"{windows})"
    )


@config_app.command("example")
def config_example() -> None:
    """Print a commented example config with every key at its default."""
    typer.echo(default_config_toml(), nl=False)


@app.command()
def sim(
    scenario: Annotated[str, typer.Option(help="Scenario to simulate.")] = "campus",
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML config (policy, sim).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (overrides sim.seed).")] = None,
    days: Annotated[float | None, typer.Option(help="Simulated days (overrides sim.days).")] = None,
    scale: Annotated[
        float | None, typer.Option(help="Fleet and demand scale (overrides sim.scale).")
    ] = None,
    strategy: Annotated[
        list[str] | None,
        typer.Option("--strategy", "-s", help="Run only these strategies (repeatable)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG of utilization and power over the day.")
    ] = None,
    output: Annotated[Path | None, typer.Option(help="Also write the JSON report here.")] = None,
    markdown: Annotated[
        Path | None, typer.Option(help="Also write the results as Markdown tables here.")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Strategies simulated in parallel (default: one per CPU)."),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(help="Replay this trace file instead of the campus (docs/traces.md)."),
    ] = None,
    trace_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="Trace format: edgesched, alibaba2018 or google2019 (default: guessed from "
            "the file's extension or header when it can be told safely).",
        ),
    ] = None,
    fleet: Annotated[
        str | None,
        typer.Option(
            help="Fleet of a replay, e.g. 36xgeneral-x86 or 20:general:x86:32c:128g,"
            "4:accel:x86:64c:512g:4a (default: x86 general servers, trace peak CPU at 70%)."
        ),
    ] = None,
    slo_wait: Annotated[
        list[str] | None,
        typer.Option(
            "--slo-wait",
            help="SLO wait objective of a replay, seconds (all classes), or CLASS=SECONDS "
            "(repeatable; default 60).",
        ),
    ] = None,
    machine: Annotated[
        str | None,
        typer.Option(
            help="Reference machine of normalized trace resources, CORESc:MEMg (default 64c:256g)."
        ),
    ] = None,
    write_sample_trace: Annotated[
        Path | None,
        typer.Option(
            help="Write a synthetic Alibaba-like hour in --format here (seeded by --seed) and exit."
        ),
    ] = None,
    sample_instances: Annotated[
        int, typer.Option(min=1, max=1_000_000, help="Instances of --write-sample-trace.")
    ] = 30_000,
) -> None:
    """Simulate a day of the campus with every strategy and compare them to the targets, or
    replay a trace (--trace) with every strategy on the same arrivals."""
    from edgesched.core.campus import campus_scenario
    from edgesched.core.experiment import strategy_names, top_class
    from edgesched.report import plot_day, print_tables, to_json
    from edgesched.simrun import default_workers, run_campus

    cfg = _load(config)
    trace_only = {
        "--format": trace_format,
        "--fleet": fleet,
        "--slo-wait": slo_wait,
        "--machine": machine,
    }
    if write_sample_trace is not None:
        _write_sample(write_sample_trace, trace_format, seed or 0, sample_instances)
        return
    if trace is not None:
        for name, value in (("--days", days), ("--scale", scale)):
            if value is not None:
                fail(f"{name} applies to the campus, not to a --trace replay")
        if scenario != "campus":
            fail("--scenario and --trace: give one")
        _sim_trace(
            cfg, trace, trace_format, fleet, slo_wait or [], machine, strategy, as_json, plot,
            output, markdown, workers,
        )  # fmt: skip
        return
    for option, given in trace_only.items():
        if given:
            fail(f"{option} applies to a --trace replay; give --trace FILE")
    if scenario != "campus":
        fail(f"--scenario: unknown scenario {scenario!r}; available: campus")
    seed_ = cfg.sim.seed if seed is None else seed
    days_ = cfg.sim.days if days is None else days
    scale_ = cfg.sim.scale if scale is None else scale
    if strategy:
        unknown = [s for s in strategy if s not in strategy_names()]
        if unknown:
            fail(f"--strategy: unknown {unknown[0]!r}; choose from {', '.join(strategy_names())}")
    try:
        world = campus_scenario(seed=seed_, days=days_, scale=scale_)
    except ValueError as exc:
        fail(f"sim: {exc}")
    tidal = cfg.policy.tidal if cfg.policy.tidal.windows else _campus_tidal()
    console = Console(stderr=as_json, width=None if sys.stdout.isatty() else 150)
    horizon = days_ * 86_400
    names = strategy or list(strategy_names())

    def day_clock(t: float) -> str:
        day, rest = divmod(int(t), 86_400)
        return f"day {day + 1} {rest // 3600:02d}:{rest % 3600 // 60:02d}"

    with _sim_progress(console, names, horizon, day_clock) as progress:
        result = run_campus(
            seed=seed_,
            days=days_,
            scale=scale_,
            policy=cfg.policy,
            tidal=tidal,
            strategies=names,
            affinity_load=cfg.sim.affinity_load,
            batch_s=cfg.sim.step_s,
            workers=workers or default_workers(),
            progress=progress,
        )
    meta: dict[str, Any] = {
        "scenario": scenario,
        "seed": seed_,
        "days": days_,
        "scale": scale_,
        "nodes": len(world.nodes),
        "tasks": len(world.tasks),
        "tidal_profile": tidal.name,
    }
    meta["top_class"] = top_class(world)
    doc = to_json(result, meta)
    _write_reports(doc, markdown, output, as_json)
    if not as_json:
        console.print(
            f"campus: {len(world.nodes)} nodes, {len(world.tasks):,} tasks, seed {seed_}, "
            f"{days_:g} day(s), scale {scale_:g}, tidal profile {tidal.name}"
        )
        print_tables(result, console, top_class(world))
    if plot is not None:
        try:
            shown = tuple(
                n for n in ("static-partition", "k8s-spread", "tidal+energy") if n in names
            )
            written = plot_day(result, plot, shown or tuple(names))
        except RuntimeError as exc:
            fail(str(exc))
        err.print(f"plot written to {written}", markup=False, highlight=False)


@contextmanager
def _sim_progress(
    console: Console, names: list[str], horizon: float, clock: Callable[[float], str]
) -> Iterator[Callable[[str, float], None]]:
    """A progress bar per strategy over the simulated ``horizon``; yields the callback that
    moves strategy ``name``'s bar to simulated time ``t`` (shown by ``clock``)."""
    with Progress(
        TextColumn("[bold]{task.description:<18}"),
        BarColumn(),
        TextColumn("{task.fields[clock]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    ) as bar:
        jobs = {n: bar.add_task(n, total=horizon, clock=clock(0.0)) for n in names}

        def progress(name: str, t: float) -> None:
            bar.update(jobs[name], completed=t, clock=clock(t))

        yield progress


def _write_reports(
    doc: dict[str, Any], markdown: Path | None, output: Path | None, as_json: bool
) -> None:
    """A simulation's report as Markdown and JSON files, and as JSON on stdout."""
    from edgesched.report import to_markdown

    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(to_markdown(doc))
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(doc, indent=2) + "\n")
    if as_json:
        typer.echo(json.dumps(doc, indent=2))


def _write_sample(path: Path, fmt: str | None, seed: int, instances: int) -> None:
    from edgesched.core.traceformats import FORMATS
    from edgesched.core.tracegen import write_sample

    if fmt is None:
        fail(f"--write-sample-trace needs --format ({', '.join(FORMATS)})")
    if fmt not in FORMATS:
        fail(f"--format: unknown {fmt!r}; choose from {', '.join(FORMATS)}")
    try:
        written = write_sample(path, fmt, seed=seed, instances=instances)
    except OSError as exc:
        fail(f"--write-sample-trace: {path}: {exc.strerror or exc}")
    err.print(
        f"{fmt} trace of {instances:,} instances written to {written}", markup=False,
        highlight=False,
    )  # fmt: skip


def _slo_waits(items: list[str]) -> tuple[float, list[tuple[str, float]]]:
    """``--slo-wait`` values: the default wait and per-class ones."""
    import math

    default = 60.0
    by_class: list[tuple[str, float]] = []
    for item in items:
        name, sep, text = item.rpartition("=")
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0) or (sep and not name.strip()):
            fail(f"--slo-wait: expected SECONDS or CLASS=SECONDS (seconds >= 0), got {item!r}")
        if sep:
            by_class.append((name.strip(), value))
        else:
            default = value
    return default, by_class


def _machine(text: str | None) -> Any:
    import re

    from edgesched.core.traceformats import Machine

    if text is None:
        return Machine()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)c:(\d+(?:\.\d+)?)g", text.strip().lower())
    if not m or float(m.group(1)) <= 0 or float(m.group(2)) <= 0:
        fail(f"--machine: expected CORESc:MEMg such as 64c:256g, got {text!r}")
    return Machine(float(m.group(1)), float(m.group(2)))


def _sim_trace(
    cfg: EdgeschedConfig,
    path: Path,
    fmt: str | None,
    fleet: str | None,
    slo_wait: list[str],
    machine_text: str | None,
    strategy: list[str] | None,
    as_json: bool,
    plot: Path | None,
    output: Path | None,
    markdown: Path | None,
    workers: int | None,
) -> None:
    """``sim --trace``: every strategy over one trace file (docs/traces.md)."""
    from edgesched.core.experiment import strategy_names, top_class
    from edgesched.core.fleetspec import FleetSpecError
    from edgesched.core.tidal import TidalProfile
    from edgesched.core.trace import TraceError
    from edgesched.core.traceformats import FORMATS, guess_format
    from edgesched.report import plot_day, print_tables, to_json
    from edgesched.simrun import default_workers, load_trace_scenario, run_trace

    if not path.is_file():
        fail(
            f"--trace: {path}: no such file"
            if not path.exists()
            else f"--trace: {path}: not a file"
        )
    if fmt is not None and fmt not in FORMATS:
        fail(f"--format: unknown {fmt!r}; choose from {', '.join(FORMATS)}")
    fmt_ = fmt or guess_format(path)
    if fmt_ is None:
        fail(f"--format: cannot tell the format of {path}; give --format {'|'.join(FORMATS)}")
    default_wait, by_class = _slo_waits(slo_wait)
    machine = _machine(machine_text)
    if strategy:
        unknown = [s for s in strategy if s not in strategy_names()]
        if unknown:
            fail(f"--strategy: unknown {unknown[0]!r}; choose from {', '.join(strategy_names())}")
    try:
        world, stats = load_trace_scenario(path, fmt_, fleet, default_wait, by_class, machine)
    except FleetSpecError as exc:
        fail(f"--fleet: {exc}")
    except TraceError as exc:
        fail(f"--trace ({fmt_}): {exc}")
    except ValueError as exc:
        fail(f"--trace: {exc}")
    unknown_classes = [c for c, _ in by_class if c not in world.classes]
    if unknown_classes:
        fail(
            f"--slo-wait: the trace has no class {unknown_classes[0]!r}; its classes: "
            f"{', '.join(world.classes)}"
        )
    if world.unplaceable:
        warn(
            f"{world.unplaceable:,} task(s) fit on no node of the fleet: they can only miss"
            + ("" if fleet else " (the default fleet has no accelerators: see --fleet)")
        )
    tidal = cfg.policy.tidal if cfg.policy.tidal.windows else TidalProfile()
    console = Console(stderr=as_json, width=None if sys.stdout.isatty() else 150)
    names = strategy or list(strategy_names())
    horizon = world.horizon_s

    def hour_clock(t: float) -> str:
        return f"{int(t) // 3600}:{int(t) % 3600 // 60:02d}"

    with _sim_progress(console, names, horizon, hour_clock) as progress:
        result = run_trace(
            world,
            path=path,
            fmt=fmt_,
            fleet=fleet,
            slo_wait_s=default_wait,
            slo_by_class=by_class,
            machine=machine,
            policy=cfg.policy,
            tidal=tidal,
            strategies=names,
            workers=workers or default_workers(),
            batch_s=cfg.sim.step_s,
            progress=progress,
        )
    top = top_class(world)
    meta: dict[str, Any] = {
        "scenario": "trace",
        "trace": str(path),
        "format": fmt_,
        "fleet": fleet or "default (x86-gen, peak CPU at 70%)",
        "nodes": len(world.nodes),
        "fleet_cpu": world.fleet_cpu,
        "tasks": len(world.tasks),
        "horizon_h": round(horizon / 3600, 4),
        "import": stats.summary(),
        "classes": {
            c.name: {"priority": c.priority, "slo_wait_s": c.slo_wait_s}
            for c in world.classes.values()
        },
        "tidal_profile": tidal.name,
        "top_class": top,
    }
    doc = to_json(result, meta)
    _write_reports(doc, markdown, output, as_json)
    if not as_json:
        console.print(
            f"trace {path} ({fmt_}): {stats.summary()}; {len(world.nodes)} nodes "
            f"({world.fleet_cpu:,.0f} cores), {len(world.tasks):,} tasks over "
            f"{horizon / 3600:.2f} h, classes "
            + ", ".join(f"{c.name} (SLO wait {c.slo_wait_s:g} s)" for c in world.classes.values()),
            markup=False,
            highlight=False,
        )
        print_tables(
            result, console, top, title=f"Trace {path.name}: strategies compared (same arrivals)",
            wait_p99=True,
        )  # fmt: skip
    if plot is not None:
        try:
            written = plot_day(
                result, plot, tuple(names), title=f"edgesched trace replay: {path.name}",
                xlabel="hours since the first arrival",
            )  # fmt: skip
        except RuntimeError as exc:
            fail(str(exc))
        err.print(f"plot written to {written}", markup=False, highlight=False)


def _logging(log_level: str) -> None:
    runengine.setup_logging(log_level, fail)


edge_app = typer.Typer(help="Run and talk to an edge node's sub-engine.", no_args_is_help=True)
app.add_typer(edge_app, name="edge")
node_app = typer.Typer(help="Node bring-up checks.", no_args_is_help=True)
app.add_typer(node_app, name="node")

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="The node's TOML config.")]


@edge_app.command("run")
def edge_run(
    config: ConfigOption,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the edge sub-engine in the foreground until SIGTERM or Ctrl-C (tasks keep running)."""
    import asyncio

    from edgesched.edge.engine import IdentityError
    from edgesched.edge.hal import UnsupportedHardware
    from edgesched.serve import edge_engine, run_until_signalled
    from edgesched.sync.store import StoreError

    cfg = _load(config)
    runengine.check_edge(cfg, fail)
    _logging(log_level)

    runengine.run_engine(
        "edge",
        config,
        lambda: asyncio.run(run_until_signalled(edge_engine(cfg, clock=_clock()))),
        (StoreError, IdentityError, UnsupportedHardware, OSError),
        fail,
    )


def _api_client(config: Path, tier: str) -> ApiClient:
    """A client of the API of the ``tier`` ("edge" or "central") running from ``config``."""
    from edgesched.rest.client import ApiClient, ApiTarget

    cfg = _load(config)
    section = cfg.edge if tier == "edge" else cfg.central
    state = Path(section.state_dir)
    try:
        target = ApiTarget.from_state_dir(state, section.api_host)
    except (OSError, ValueError):
        fail(f"no running {tier} found in {state} (start it with: edgesched {tier} run)")
    return ApiClient(target)


def _call(
    config: Path, method: str, path: str, body: object | None = None, tier: str = "edge"
) -> Any:
    from edgesched.rest.client import ApiError, Unreachable

    client = _api_client(config, tier)
    try:
        return client.call(method, path, body)
    except Unreachable as exc:
        fail(f"cannot reach the {tier}: {exc}")
    except ApiError as exc:
        fail(str(exc))


def _warn_broker(status: dict[str, Any]) -> None:
    """A ``warning:`` line on stderr for a broker link that is down or shared with another
    process (the JSON on stdout holds the details: ``broker``)."""
    import time

    broker = status.get("broker")
    if not isinstance(broker, dict):
        return
    if not broker.get("connected"):
        since = broker.get("since")
        ago = "" if since is None else f" for {max(0.0, time.time() - since):.0f} s"
        why = broker.get("last_error") or "no attempt has finished yet"
        warn(f"not connected to broker {broker.get('address')}{ago}: {why}")
    if broker.get("duplicate"):
        warn(str(broker["duplicate"]))


@edge_app.command("status")
def edge_status(config: ConfigOption) -> None:
    """Mode, link and hardware of the running node, and its tasks by state."""
    status = _call(config, "GET", "/v1/status")
    tasks = _call(config, "GET", "/v1/tasks")
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    typer.echo(json.dumps({**status, "tasks": counts}, indent=2))
    _warn_broker(status)


@edge_app.command("submit")
def edge_submit(
    config: ConfigOption,
    task_id: Annotated[str, typer.Option("--id", help="Task id (unique on this node).")],
    command: Annotated[list[str], typer.Argument(help="Command and arguments (after --).")],
    cpu: Annotated[float, typer.Option(help="CPU cores.")] = 1.0,
    mem_gib: Annotated[float, typer.Option(help="Memory, GiB.")] = 0.5,
    priority: Annotated[int, typer.Option(help="0-999, higher wins.")] = 50,
    workload: Annotated[str, typer.Option(help="Workload class (tidal shares).")] = "default",
    restart: Annotated[str, typer.Option(help="never, on-failure or always.")] = "on-failure",
) -> None:
    """Submit a task to the node; printed once it is committed on the node."""
    body = {
        "id": task_id,
        "command": command,
        "cpu": cpu,
        "mem_gib": mem_gib,
        "priority": priority,
        "workload": workload,
        "restart": restart,
    }
    record = _call(config, "POST", "/v1/tasks", body)
    typer.echo(f"{record['id']}: {record['state']}")


@edge_app.command("tasks")
def edge_tasks(config: ConfigOption) -> None:
    """List the node's tasks."""
    for t in _call(config, "GET", "/v1/tasks"):
        typer.echo(
            f"{t['id']:<24} {t['state']:<10} pid={t['pid'] or '-':<8} "
            f"restarts={t['restarts']} {t['decided_by'] or '-':<18} {t['reason']}"
        )


@edge_app.command("cancel")
def edge_cancel(
    config: ConfigOption, task_id: Annotated[str, typer.Argument(help="Task id.")]
) -> None:
    """Cancel a task (SIGTERM, then SIGKILL after the grace period)."""
    record = _call(config, "DELETE", f"/v1/tasks/{task_id}")
    typer.echo(f"{record['id']}: {record['state']}")


@edge_app.command("logs")
def edge_logs(
    config: ConfigOption,
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    tail: Annotated[int, typer.Option(min=0, max=10_000, help="The last this many lines.")] = 100,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Then what it writes, until it finishes.")
    ] = False,
) -> None:
    """A task's output (stdout and stderr, as the node keeps them, rotated)."""
    import urllib.error
    import urllib.request

    from edgesched.rest.client import ApiError

    client = _api_client(config, "edge")
    path = f"/v1/tasks/{task_id}/logs?tail={tail}" + ("&follow=1" if follow else "")
    request = urllib.request.Request(client.target.base_url + path, headers=client.target.headers())
    try:
        with urllib.request.urlopen(request, timeout=None if follow else 30) as answer:
            while chunk := answer.read1(65536) if follow else answer.read():
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                if not follow:
                    break
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            detail: object = json.loads(body)
        except ValueError:
            detail = body.decode("utf-8", "replace")
        fail(str(ApiError(exc.code, detail, client.target.base_url + path)))
    except (urllib.error.URLError, OSError) as exc:
        fail(f"cannot reach the edge: {exc}")


@node_app.command("qualify")
def node_qualify(
    workdir: Annotated[Path, typer.Option(help="Directory for the storage probe.")] = Path("."),
    duration: Annotated[float, typer.Option(min=0.2, help="Seconds per check.")] = 3.0,
    no_tools: Annotated[
        bool, typer.Option("--no-tools", help="Built-in probes only (no sysbench/fio).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="A node config: save the report as <state_dir>/qualification.json there; the "
            "edge engine then uses its perf factor and IOPS in scoring.",
        ),
    ] = None,
) -> None:
    """The article's bring-up checks: CPU, memory bandwidth, LLC, storage IOPS."""
    from edgesched.edge.engine import QUALIFICATION_FILE
    from edgesched.edge.qualify import qualify

    target = None
    if config is not None:
        target = Path(_load(config).edge.state_dir) / QUALIFICATION_FILE

    report = qualify(
        workdir,
        duration_s=duration,
        use_tools=not no_tools,
        progress=None if as_json else (lambda msg: err.print(msg, markup=False)),
    )
    doc = report.to_json()
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(doc, indent=2) + "\n")
        err.print(f"saved to {target}", markup=False, highlight=False)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        for m in report.measurements:
            typer.echo(f"{m.name:<28} {m.value:>12,.2f} {m.unit:<10} [{m.tool}] {m.detail}")
        typer.echo(
            f"perf factor {report.perf_factor:.2f}; {'PASSED' if report.passed else 'FAILED'}"
        )
        for p in report.problems:
            typer.echo(f"problem: {p}")
    if not report.passed:
        raise typer.Exit(1)


central_app = typer.Typer(help="Run and talk to the central engine.", no_args_is_help=True)
app.add_typer(central_app, name="central")
CentralConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="Central's TOML config ([central] section).")
]


@central_app.command("run")
def central_run(
    config: CentralConfigOption,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the central engine until SIGTERM/SIGINT: fan-in of node documents, heartbeat, API."""
    import asyncio

    from edgesched.serve import central_engine, run_until_signalled
    from edgesched.sync.store import StoreError

    cfg = _load(config)
    try:
        cfg.central.mqtt.endpoint(cfg.central.central_id)  # key and password files, read now
    except ValueError as exc:
        fail(f"central.mqtt: {exc}")
    _logging(log_level)
    runengine.run_engine(
        "central",
        config,
        lambda: asyncio.run(run_until_signalled(central_engine(cfg, clock=_clock()))),
        (StoreError, OSError),
        fail,
    )


@central_app.command("status")
def central_status(config: CentralConfigOption) -> None:
    """Central's broker link, node counts and refused input, as JSON."""
    status = _call(config, "GET", "/v1/status", tier="central")
    typer.echo(json.dumps(status, indent=2))
    _warn_broker(status)


@central_app.command("nodes")
def central_nodes(config: CentralConfigOption) -> None:
    """Every node central holds: status, document epoch and hash, tasks by state."""
    nodes = _call(config, "GET", "/v1/nodes", tier="central")["nodes"]
    for n in nodes:
        tasks = ", ".join(f"{k} {v}" for k, v in sorted(n["tasks"].items())) or "no tasks"
        doc = n["document"]
        typer.echo(
            f"{n['id']:<24} {n['status']:<8} epoch {doc['epoch']:<3} "
            f"{doc['content_hash'][:12]}  {tasks}"
        )


register_fleet_commands(app)  # run, tasks, task, cancel, nodes: against central's API
register_service_commands(app)  # service apply/list/show/scale/delete/load
register_join_commands(app, central_app)  # broker init/check, central add/remove-node, join


certs_app = typer.Typer(
    help="Certificates for the MQTT links (CA, nodes, broker).", no_args_is_help=True
)
app.add_typer(certs_app, name="certs")

CertDir = Annotated[Path, typer.Option("--dir", help="Directory holding the CA and certs.")]


@certs_app.command("init")
def certs_init(directory: CertDir, force: bool = typer.Option(False, help="Overwrite.")) -> None:
    """Create the fleet's CA (ca.crt, ca.key 0600)."""
    from edgesched.sync.security import make_ca

    try:
        ca = make_ca(directory, force=force)
    except (FileExistsError, ValueError, OSError) as exc:
        fail(str(exc).replace("force=True", "--force"))
    typer.echo(f"CA: {ca.cert}")


@certs_app.command("issue")
def certs_issue(
    identity: Annotated[str, typer.Argument(help="Node id (= MQTT username = client id).")],
    directory: CertDir,
    server_name: Annotated[
        list[str] | None,
        typer.Option("--server-name", help="Issue a broker cert for these names/IPs instead."),
    ] = None,
    force: bool = typer.Option(False, help="Overwrite."),
) -> None:
    """Issue a client certificate for a node (or a broker certificate with --server-name)."""
    from edgesched.sync.security import issue, load_ca

    try:
        files = issue(load_ca(directory), identity, directory, server_names=server_name or (),
                      force=force)  # fmt: skip
    except (FileExistsError, ValueError, OSError) as exc:
        fail(str(exc).replace("force=True", "--force"))
    typer.echo(f"{files.identity}: {files.cert} {files.key}")


@certs_app.command("signing-key")
def certs_signing_key(
    identity: Annotated[str, typer.Argument(help="Node or central id.")],
    directory: CertDir,
    force: bool = typer.Option(False, help="Overwrite."),
) -> None:
    """Make an identity's Ed25519 key for signed document messages: DIR/ID.signing.key (0600,
    its [edge.mqtt] or [central.mqtt] signing_key) and DIR/keys/ID.pub (for peer_keys)."""
    from edgesched.sync.signing import write_signing_key

    try:
        key, pub = write_signing_key(directory, identity, force=force)
    except (FileExistsError, ValueError, OSError) as exc:
        fail(str(exc).replace("force=True", "--force"))
    typer.echo(f"{identity}: {key} {pub}")


# --- install on a gateway ------------------------------------------------------------------

RoleOption = Annotated[str, typer.Option("--role", help="edge (a node) or central.")]
PrefixOption = Annotated[
    Path, typer.Option("--prefix", help="Releases and the `current` link live here.")
]
EtcOption = Annotated[Path, typer.Option("--etc-dir", help="Config and certificates.")]
UnitDirOption = Annotated[Path, typer.Option("--unit-dir", help="Where the systemd unit goes.")]
RootOption = Annotated[
    Path,
    typer.Option("--root", help="Stage every path under this directory (like DESTDIR)."),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Print every file and command; write nothing.")
]


@app.command()
def install(
    node_id: Annotated[
        str | None, typer.Option("--node-id", help="The node's fixed identity (central_id).")
    ] = None,
    role: RoleOption = "edge",
    site: Annotated[str | None, typer.Option(help="The node's site.")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="A config to start from.")
    ] = None,
    broker: Annotated[str | None, typer.Option(help="MQTT broker, HOST or HOST:PORT.")] = None,
    ca: Annotated[Path | None, typer.Option(help="The fleet CA certificate.")] = None,
    cert: Annotated[Path | None, typer.Option(help="The node's client certificate.")] = None,
    key: Annotated[Path | None, typer.Option(help="Its private key.")] = None,
    ca_dir: Annotated[
        Path | None,
        typer.Option(help="Issue the node's certificate from the CA here (certs init)."),
    ] = None,
    password_file: Annotated[
        Path | None, typer.Option(help="MQTT password (without TLS client certificates).")
    ] = None,
    user: Annotated[
        str | None, typer.Option(help="Run as this existing user (default: edgesched, made).")
    ] = None,
    release: Annotated[
        Path | None, typer.Option(help="The release `current` points at (a venv).")
    ] = None,
    read_write_path: Annotated[
        list[Path] | None,
        typer.Option("--read-write-path", help="Also writable for the service and its tasks."),
    ] = None,
    container_runtime: Annotated[
        str | None, typer.Option(help="docker, podman or a path: run tasks with images.")
    ] = None,
    start: Annotated[bool, typer.Option(help="Enable and (re)start the service.")] = True,
    prefix: PrefixOption = Path("/opt/edgesched"),
    etc_dir: EtcOption = Path("/etc/edgesched"),
    unit_dir: UnitDirOption = Path("/etc/systemd/system"),
    root: RootOption = Path("/"),
    dry_run: DryRunOption = False,
) -> None:
    """Install this machine as a gateway service: config, identity, systemd unit, user."""
    from edgesched.install import InstallError, InstallOptions, Layout, StepFailed
    from edgesched.install import install as do_install

    try:
        layout = Layout(role, prefix, etc_dir, unit_dir, root)  # type: ignore[arg-type]
        opts = InstallOptions(
            layout, node_id, site, config, broker, ca, cert, key, ca_dir, password_file, user,
            release, tuple(read_write_path or ()), container_runtime, start,
        )  # fmt: skip
        do_install(opts, dry_run=dry_run, say=typer.echo)
    except InstallError as exc:
        fail(str(exc), 1 if isinstance(exc, StepFailed) else 2)


@app.command()
def uninstall(
    role: RoleOption = "edge",
    purge: Annotated[
        bool, typer.Option(help="Also remove the config, certificates and state.")
    ] = False,
    keep_tasks: Annotated[
        bool, typer.Option(help="Leave the node's task processes running.")
    ] = False,
    prefix: PrefixOption = Path("/opt/edgesched"),
    etc_dir: EtcOption = Path("/etc/edgesched"),
    unit_dir: UnitDirOption = Path("/etc/systemd/system"),
    root: RootOption = Path("/"),
    dry_run: DryRunOption = False,
) -> None:
    """Stop and remove the gateway service (the unit, `current`; --purge: config and state)."""
    from edgesched.install import InstallError, Layout, StepFailed, UninstallOptions
    from edgesched.install import uninstall as do_uninstall

    try:
        layout = Layout(role, prefix, etc_dir, unit_dir, root)  # type: ignore[arg-type]
        opts = UninstallOptions(layout, purge, keep_tasks)
        do_uninstall(opts, dry_run=dry_run, say=typer.echo)
    except InstallError as exc:
        fail(str(exc), 1 if isinstance(exc, StepFailed) else 2)


@app.command()
def demo(
    speed: Annotated[
        float, typer.Option(help="Simulated seconds per real second (720: a day in 2 minutes).")
    ] = 720.0,
    minutes: Annotated[
        float | None, typer.Option(help="Simulated minutes to run (default: the whole day).")
    ] = None,
    hours: Annotated[float | None, typer.Option(help="Simulated hours to run.")] = None,
    start: Annotated[
        str | None,
        typer.Option(help="Time of day to start, HH:MM (default: 00:00, or so the cut is in)."),
    ] = None,
    nodes: Annotated[int, typer.Option(help="Edge nodes (2-12), each a simulated server.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the workload.")] = 0,
    workdir: Annotated[
        Path | None, typer.Option(help="Work directory (kept); default: a temporary one.")
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the temporary work dir.")] = False,
    no_partition: Annotated[
        bool, typer.Option("--no-partition", help="Do not cut a site (or a node) off.")
    ] = False,
    broker: Annotated[
        str, typer.Option(help="auto (Mosquitto if installed), mosquitto or embedded.")
    ] = "auto",
    api_port: Annotated[int, typer.Option(help="Central's API port (0: any free one).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the JSON report.")] = False,
) -> None:
    """Start a broker, central and edge nodes here; run a campus day at accelerated time,
    cut one node off and heal it, then print what happened (Ctrl-C stops everything)."""
    from edgesched.core.tidal import parse_clock
    from edgesched.demo import (
        DemoError,
        DemoOptions,
        Interrupted,
        QuietUi,
        RichUi,
        print_summary,
        run,
        timeline,
    )

    if minutes is not None and hours is not None:
        fail("--minutes and --hours: give one of them")
    duration = 86_400.0
    if minutes is not None:
        duration = minutes * 60.0
    elif hours is not None:
        duration = hours * 3600.0
    start_s = None
    if start is not None:
        try:
            start_s = parse_clock(start)
        except ValueError as exc:
            fail(f"--start: {exc}")
    try:
        opts = DemoOptions(
            speed=speed, duration_s=duration, start_s=start_s, nodes=nodes, seed=seed,
            workdir=workdir, keep=keep, partition=not no_partition, broker=broker,
            api_port=api_port,
        )  # fmt: skip
    except DemoError as exc:
        fail(str(exc))
    console = Console(width=None if sys.stdout.isatty() else 120)
    try:
        if as_json:
            result = run(opts, QuietUi())
        else:
            with RichUi(console, timeline(opts)) as ui:
                result = run(opts, ui)
    except DemoError as exc:
        fail(str(exc), 1)
    except Interrupted as exc:
        err.print(f"demo {exc}; every process it started is stopped", markup=False)
        raise typer.Exit(130) from None
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        print_summary(result, console)
    if not result["ok"]:
        failed = ", ".join(k for k, v in result["checks"].items() if not v)
        fail(f"demo checks failed: {failed}", 1)


def _campus_tidal() -> Any:
    from edgesched.core.tidal import campus_profile

    return campus_profile()


# --- learned policies (issue 6) -------------------------------------------------------------

policies_app = typer.Typer(
    help="Train and evaluate the ONNX forecaster and learned placement policy.",
    no_args_is_help=True,
)
app.add_typer(policies_app, name="policies")
PoliciesDir = Annotated[
    Path | None,
    typer.Option("--out", help="Folder of the .onnx files and cards (default: the package's)."),
]


@policies_app.command("train")
def policies_train(
    seed: Annotated[int, typer.Option(help="Seed of the policy search.")] = 0,
    out: PoliciesDir = None,
    quick: Annotated[bool, typer.Option(help="Tiny configs (seconds), for tests.")] = False,
    only: Annotated[str, typer.Option(help="all, forecast or placement.")] = "all",
) -> None:
    """Fit both models (numpy), write the .onnx files and their model cards, print figures."""
    import edgesched.policies.train as policies

    if only not in ("all", "forecast", "placement"):
        fail(f"--only: must be all, forecast or placement, got {only!r}")
    folder = out or policies.shipped_dir()
    config = policies.config_for(quick)
    if only in ("all", "forecast"):
        policies.train_forecaster(folder, config, seed, print)
    if only in ("all", "placement"):
        policies.train_policy(folder, config, seed, print)


@policies_app.command("eval")
def policies_eval(
    out: PoliciesDir = None,
    quick: Annotated[bool, typer.Option(help="Tiny configs (seconds), for tests.")] = False,
) -> None:
    """Evaluate the models on held-out seeds against the baselines and heuristic modes."""
    import edgesched.policies.train as policies
    from edgesched.policies.ortsession import ModelLoadError

    try:
        policies.evaluate_shipped(out or policies.shipped_dir(), quick, print)
    except ModelLoadError as exc:
        fail(str(exc))


def _clock() -> Callable[[], float]:
    """The wall clock, skewed by ``EDGESCHED_CLOCK_SKEW_S`` if set (a test hook):
    :func:`edgesched.runengine.clock`."""
    return runengine.clock(fail)


fieldtest_app = typer.Typer(
    help="Partition-injection field tests against real processes.", no_args_is_help=True
)
app.add_typer(fieldtest_app, name="fieldtest")


@fieldtest_app.command("attack")
def fieldtest_attack(
    config: Annotated[
        Path, typer.Option("--config", help="The edge config of a gateway you may sacrifice.")
    ],
    central: Annotated[str, typer.Option(help="Central's API, http://HOST:PORT.")],
    token_file: Annotated[Path, typer.Option(help="A file holding central's API token.")],
    other_node: Annotated[
        str, typer.Option(help="Another node of the fleet, whose client id a forgery borrows.")
    ],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each refusal.")] = 10.0,
) -> None:
    """Try, with one gateway's own MQTT credentials, the forgeries a stolen gateway could
    send (central's policy under central's id, a new root, an assignment of its choosing, a
    pure delete of central's assignment, another node's operations in its own document) and
    report whether central refused each for its authorship. Stop that gateway's engine first:
    the broker lets one connection per identity. Exit 1 if any was not refused."""
    import asyncio

    import aiomqtt

    from edgesched.fieldtest.attacks import Attacker, run_suite
    from edgesched.rest.client import ApiClient, ApiTarget, Unreachable

    cfg = _load(config)
    try:
        endpoint = cfg.edge.mqtt.endpoint(cfg.edge.node_id)
        token = token_file.read_text().strip()
    except (ValueError, OSError) as exc:
        fail(str(exc))
    api = ApiClient(ApiTarget(central.rstrip("/"), token))

    async def refused() -> dict[str, dict[str, int]]:
        resp = await asyncio.to_thread(api.request, "GET", "/v1/status")
        if resp.status != 200 or not isinstance(resp.body, dict):
            raise RuntimeError(f"central's /v1/status answered {resp.status}: {resp.body}")
        counts: dict[str, dict[str, int]] = resp.body.get("refused", {})
        return counts

    async def attack() -> list[Any]:
        async with aiomqtt.Client(
            endpoint.host,
            endpoint.port,
            identifier=endpoint.identifier,
            username=endpoint.username,
            password=endpoint.password,
            tls_context=endpoint.tls,
        ) as client:
            attacker = Attacker(client, cfg.edge.node_id, cfg.edge.centrals[0])
            return await run_suite(attacker, refused, other_node=other_node, timeout_s=timeout)

    try:
        outcomes = asyncio.run(attack())
    except (aiomqtt.MqttError, RuntimeError, TimeoutError, Unreachable) as exc:
        fail(f"attack: {exc}")
    for outcome in outcomes:
        verdict = "refused    " if outcome.refused else "NOT REFUSED"
        rose = ", ".join(f"{k} +{n}" for k, n in sorted(outcome.counts.items())) or "nothing"
        typer.echo(f"{verdict} {outcome.name:<28} on {outcome.channel:<8} (counted: {rose})")
    if not all(o.refused for o in outcomes):
        raise typer.Exit(1)


@fieldtest_app.command("list")
def fieldtest_list() -> None:
    """The scenarios, what each does, and which run in the quick matrix."""
    from edgesched.fieldtest.scenarios import QUICK, SCENARIOS

    for s in SCENARIOS.values():
        tag = "quick" if s.name in QUICK else ("soak" if s.soak else "")
        typer.echo(f"{s.name:<26} {tag:<6} {s.description}")


_BROKER_HELP = (
    "mosquitto, or nats: a 3-member NATS cluster (MQTT 3.1.1), a member per namespace as root."
)


def _fieldtest_runs(
    scenarios: list[str],
    seeds: list[int],
    workdir: Path,
    backend: str,
    nodes: int,
    sites: int | None = None,
    duration: float | None = None,
    broker: str = "mosquitto",
) -> list[dict[str, Any]]:
    import asyncio

    from edgesched.fieldtest.report import write as write_report
    from edgesched.fieldtest.runner import run_scenario
    from edgesched.fieldtest.scenarios import SCENARIOS

    for name in scenarios:
        if name not in SCENARIOS:
            fail(f"--scenario: unknown {name!r} (see: edgesched fieldtest list)")
    reports = []
    for name in scenarios:
        for seed in seeds:
            where = workdir / f"{name}-{seed}"
            try:
                result = asyncio.run(
                    run_scenario(name, seed, where, nodes=nodes, sites=sites, backend=backend,
                                 broker=broker,
                                 duration_s=duration if SCENARIOS[name].soak else None,
                                 progress=lambda m: err.print(f"[dim]{escape(m)}[/dim]"))
                )  # fmt: skip
            except ValueError as exc:
                fail(f"{name}: {exc}")
            except RuntimeError as exc:
                fail(f"{name} seed {seed}: {exc}", 1)
            page = write_report(result, where)
            verdict = "PASS" if result["ok"] else "FAIL"
            heal = result.get("max_heal_convergence_s")
            err.print(
                f"{verdict} {name} seed {seed} ({result['backend']}): "
                f"{result['verdict']['acknowledged']} acknowledged, "
                f"{result['verdict']['offline_decisions']} offline decisions, slowest heal "
                f"{'-' if heal is None else f'{heal:.2f}s'}; {page}",
                markup=False,
            )
            reports.append(result)
    return reports


@fieldtest_app.command("run")
def fieldtest_run(
    scenario: Annotated[str, typer.Option(help="A scenario name (see: fieldtest list).")],
    seed: Annotated[int, typer.Option(help="The seed: the same seed, the same faults.")] = 1,
    workdir: Annotated[Path, typer.Option(help="Where logs and reports go.")] = Path(
        "out/fieldtest"
    ),
    backend: Annotated[str, typer.Option(help="auto, netns (root) or proxy.")] = "auto",
    broker: Annotated[str, typer.Option(help=_BROKER_HELP)] = "mosquitto",
    nodes: Annotated[int, typer.Option(help="Edge nodes.", min=1, max=20)] = 3,
    sites: Annotated[
        int | None,
        typer.Option(
            help="Sites with brokers bridged to central's (default: as the scenario "
            "needs; 0: every node on central's broker).",
            min=0,
            max=8,
        ),
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="The soak's length in seconds (default 3600).", min=60)
    ] = None,
) -> None:
    """Run one scenario; write report.json, report.md and timeline.png; exit 1 on FAIL."""
    reports = _fieldtest_runs([scenario], [seed], workdir, backend, nodes, sites, duration,
                              broker)  # fmt: skip
    raise typer.Exit(0 if all(r["ok"] for r in reports) else 1)


@fieldtest_app.command("matrix")
def fieldtest_matrix(
    seeds: Annotated[int, typer.Option(help="Seeds per scenario (1..N).", min=1)] = 1,
    all_: Annotated[
        bool, typer.Option("--all", help="Every scenario but the soak, not only the quick ones.")
    ] = False,
    soak: Annotated[bool, typer.Option(help="Add the soak (an hour unless --duration).")] = False,
    duration: Annotated[
        float | None, typer.Option(help="The soak's length in seconds.", min=60)
    ] = None,
    workdir: Annotated[Path, typer.Option(help="Where logs and reports go.")] = Path(
        "out/fieldtest"
    ),
    backend: Annotated[str, typer.Option(help="auto, netns (root) or proxy.")] = "auto",
    broker: Annotated[str, typer.Option(help=_BROKER_HELP + " NATS skips the site scenarios.")] = (
        "mosquitto"
    ),
) -> None:
    """The quick matrix (what CI runs), or every scenario, optionally with the soak; a summary
    in matrix.json and a table in matrix.md."""
    from edgesched.fieldtest.report import matrix_markdown
    from edgesched.fieldtest.scenarios import QUICK, SCENARIOS

    names = [s.name for s in SCENARIOS.values() if not s.soak] if all_ else list(QUICK)
    names += ["soak"] if soak else []
    if broker == "nats":  # sites are Mosquitto bridges
        names = [n for n in names if not SCENARIOS[n].sites]
    reports = _fieldtest_runs(names, list(range(1, seeds + 1)), workdir, backend, 3,
                              duration=duration, broker=broker)  # fmt: skip
    summary = [
        {k: r[k] for k in ("scenario", "seed", "backend", "ok", "max_heal_convergence_s")}
        | {"lost": len(r["verdict"]["lost"]), "duplicates": len(r["verdict"]["duplicates"]),
           "heals": [h["seconds"] for h in r["heals"]], "sites": len(r["topology"]["sites"])}
        for r in reports
    ]  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "matrix.json").write_text(json.dumps(summary, indent=2) + "\n")
    (workdir / "matrix.md").write_text(matrix_markdown(reports))
    typer.echo(json.dumps(summary, indent=2))
    raise typer.Exit(0 if all(r["ok"] for r in reports) else 1)


@app.command()
def bundle(
    arch: Annotated[str, typer.Option(help="Target architecture: x86_64 or aarch64.")],
    python: Annotated[str, typer.Option(help="Target CPython version, e.g. 3.11.")] = "3.11",
    out: Annotated[Path, typer.Option(help="Folder the bundle is written to.")] = Path("dist"),
    tar: Annotated[bool, typer.Option("--tar", help="Write a .tar.gz (and .sha256).")] = False,
    glibc: Annotated[str, typer.Option(help="Oldest glibc of the targets.")] = "2.28",
    source: Annotated[
        Path | None, typer.Option(help="edgesched source tree (default: the one installed).")
    ] = None,
    wheel: Annotated[
        Path | None, typer.Option(help="Bundle this edgesched wheel instead of building one.")
    ] = None,
    set_version: Annotated[
        str | None, typer.Option(help="Build the release with this version (e.g. 1.2.3+site1).")
    ] = None,
    find_links: Annotated[
        list[Path] | None, typer.Option(help="Extra folder of wheels or sources (repeatable).")
    ] = None,
) -> None:
    """Build an offline install bundle: wheels for the target, manifest.json, install.sh."""
    from edgesched.bundle import BundleError, build_bundle

    def step(message: str) -> None:
        err.print(f"[bold cyan]bundle:[/] {escape(message)}", highlight=False, soft_wrap=True)

    try:
        with err.status("building the bundle", spinner="dots"):
            result = build_bundle(
                arch=arch,
                python=python,
                out=out,
                source=source,
                wheel=wheel,
                version=set_version,
                glibc=glibc,
                tar=tar,
                find_links=find_links or [],
                progress=step,
            )
    except BundleError as exc:
        fail(str(exc), 1)
    err.print(
        f"[bold green]bundle:[/] edgesched {result.version} for {result.arch}, CPython "
        f"{result.python}: {result.wheels} wheels, {result.size_bytes / 2**20:.1f} MiB; "
        f"manifest.json sha256 {result.manifest_sha256}",
        highlight=False,
        soft_wrap=True,
    )
    typer.echo(result.path)


_UPGRADE_PREFIX = typer.Option(help="Install prefix (releases/ and current).")
_UPGRADE_CONFIG = typer.Option(help="The edge node's config (state_dir, API).")
_UPGRADE_PIDFILE = typer.Option(
    help="Without systemd: the engine's pidfile (it is restarted detached, output in .log)."
)
_UPGRADE_TIMEOUT = typer.Option(help="Seconds the new engine has to answer /v1/health.")


def _engine_control(pidfile: Path | None, service: str, prefix: Path, config: Path) -> Any:
    from edgesched.upgrade import PidfileEngine, SystemdEngine

    if pidfile is not None:
        return PidfileEngine(pidfile, config, prefix)
    if not Path("/run/systemd/system").is_dir():
        fail("systemd is not running here: pass --pidfile with the engine's pidfile")
    return SystemdEngine(service)


@app.command()
def upgrade(
    bundle_path: Annotated[
        Path, typer.Option("--bundle", help="Bundle folder or tarball (edgesched bundle).")
    ],
    prefix: Annotated[Path, _UPGRADE_PREFIX] = Path("/opt/edgesched"),
    config: Annotated[Path, _UPGRADE_CONFIG] = Path("/etc/edgesched/edge.toml"),
    pidfile: Annotated[Path | None, _UPGRADE_PIDFILE] = None,
    service: Annotated[str, typer.Option(help="systemd unit.")] = "edgesched-edge.service",
    timeout: Annotated[float, _UPGRADE_TIMEOUT] = 60.0,
    keep: Annotated[int, typer.Option(help="Older releases to keep.")] = 2,
) -> None:
    """Install a bundle beside the running release and switch to it; tasks keep running,
    the database is backed up, and a new engine that does not come up is rolled back."""
    from edgesched.upgrade import upgrade as run_upgrade

    engine = _engine_control(pidfile, service, prefix, config)
    _transition(
        "upgrade",
        lambda progress: run_upgrade(
            bundle_path, engine=engine, config=config, prefix=prefix, timeout=timeout,
            keep=keep, progress=progress,
        ),
    )  # fmt: skip


def _transition(verb: str, run: Callable[[Callable[[str], None]], dict[str, Any]]) -> None:
    """Run an upgrade or rollback with progress on stderr; print its record, or fail with
    exit 1 (it failed and was undone) or 2 (refused, nothing changed)."""
    from edgesched.upgrade import UpgradeError, UpgradeFailed

    try:
        entry = run(
            lambda m: err.print(
                f"[bold cyan]{verb}:[/] {escape(m)}", highlight=False, soft_wrap=True
            )
        )
    except UpgradeFailed as exc:
        fail(str(exc), 1)
    except UpgradeError as exc:
        fail(str(exc), 2)
    typer.echo(json.dumps(entry, indent=2))


@app.command()
def rollback(
    prefix: Annotated[Path, _UPGRADE_PREFIX] = Path("/opt/edgesched"),
    config: Annotated[Path, _UPGRADE_CONFIG] = Path("/etc/edgesched/edge.toml"),
    pidfile: Annotated[Path | None, _UPGRADE_PIDFILE] = None,
    service: Annotated[str, typer.Option(help="systemd unit.")] = "edgesched-edge.service",
    timeout: Annotated[float, _UPGRADE_TIMEOUT] = 60.0,
    restore_db: Annotated[
        bool,
        typer.Option(
            "--restore-db",
            help="Past a schema migration: restore the pre-upgrade database backup (changes "
            "since the upgrade are forgotten).",
        ),
    ] = False,
) -> None:
    """Switch back to the release the current one replaced; tasks keep running."""
    from edgesched.upgrade import rollback as run_rollback

    engine = _engine_control(pidfile, service, prefix, config)
    _transition(
        "rollback",
        lambda progress: run_rollback(
            engine=engine, config=config, prefix=prefix, timeout=timeout,
            restore_db=restore_db, progress=progress,
        ),
    )  # fmt: skip


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
