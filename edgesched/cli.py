"""The ``edgesched`` command line (typer).

Every command has ``--help``; user mistakes (bad config, bad option values, unknown names)
end as one ``error:`` line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from edgesched.config import ConfigError, EdgeschedConfig, default_config_toml, load_config
from edgesched.version import __version__

app = typer.Typer(
    name="edgesched",
    help="Edge-autonomous heterogeneous compute scheduler.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect and check configuration files.", no_args_is_help=True)
app.add_typer(config_app, name="config")

err = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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
    """Validate a config file; print the effective policy or the first error."""
    cfg = _load(path)
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
) -> None:
    """Simulate a day of the campus with every strategy and compare them to the targets."""
    from edgesched.core.campus import campus_scenario
    from edgesched.core.experiment import strategy_names, top_class
    from edgesched.report import plot_day, print_tables, to_json, to_markdown
    from edgesched.simrun import default_workers, run_campus

    cfg = _load(config)
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
    with Progress(
        TextColumn("[bold]{task.description:<18}"),
        BarColumn(),
        TextColumn("{task.fields[clock]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    ) as bar:
        jobs = {n: bar.add_task(n, total=horizon, clock="day 1 00:00") for n in names}

        def progress(name: str, t: float) -> None:
            day, rest = divmod(int(t), 86_400)
            clock = f"day {day + 1} {rest // 3600:02d}:{rest % 3600 // 60:02d}"
            bar.update(jobs[name], completed=t, clock=clock)

        result = run_campus(
            seed=seed_,
            days=days_,
            scale=scale_,
            policy=cfg.policy,
            tidal=tidal,
            strategies=names,
            affinity_load=cfg.sim.affinity_load,
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
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(to_markdown(doc))
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(doc, indent=2) + "\n")
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
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
        err.print(f"plot written to {written}")


def _campus_tidal() -> Any:
    from edgesched.core.tidal import campus_profile

    return campus_profile()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
