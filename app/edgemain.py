"""The edge sub-engine's lean service entry point: ``edgesched edge run`` without typer or rich.

``python -m edgesched.edgemain --config FILE`` (or the ``edgesched-edge`` console script) runs
the edge engine exactly as ``edgesched edge run -c FILE`` does (the same config checks, the
same ``error:`` lines and exit codes, the same engine and API), with argparse only, so a
gateway's service process does not carry the CLI's libraries (typer, rich, click: about 7 MB
of RSS) for months. The systemd unit runs this; the full CLI stays for people.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from edgesched.version import __version__


def fail(message: str, code: int = 2) -> NoReturn:
    """One ``error:`` line on stderr and exit ``code`` (the CLI's convention: 2 for a user
    mistake, 1 for a failure at run time)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _clock() -> Callable[[], float]:
    """The wall clock, offset by ``EDGESCHED_CLOCK_SKEW_S`` seconds if set (the field tests'
    hook, as in ``edgesched edge run``)."""
    raw = os.environ.get("EDGESCHED_CLOCK_SKEW_S")
    if not raw:
        return time.time
    try:
        skew = float(raw)
    except ValueError:
        fail(f"EDGESCHED_CLOCK_SKEW_S: not a number of seconds: {raw!r}")
    print(f"clock skewed by {skew:+g} s (EDGESCHED_CLOCK_SKEW_S, a test hook)", file=sys.stderr)
    return lambda: time.time() + skew


def _logging(log_level: str) -> None:
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        fail(f"--log-level: unknown level {log_level!r}")
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edgesched-edge",
        description="Run the edge sub-engine in the foreground until SIGTERM or Ctrl-C "
        "(tasks keep running). The same as `edgesched edge run`, without the CLI's libraries.",
    )
    p.add_argument("--config", "-c", type=Path, required=True, help="The node's TOML config.")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error.")
    p.add_argument("--version", action="version", version=f"edgesched {__version__}")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    import asyncio

    from edgesched.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        fail(str(exc))
    if not cfg.edge.node_id:
        fail("edge.node_id: missing (required to run an edge node)")
    try:
        cfg.edge.mqtt.endpoint(cfg.edge.node_id)  # key and password files, read now
    except ValueError as exc:
        fail(f"edge.mqtt: {exc}")
    _logging(args.log_level)

    from edgesched.edge import api as edge_api
    from edgesched.edge.engine import EdgeEngine, IdentityError
    from edgesched.edge.hal import UnsupportedHardware
    from edgesched.rest.server import ListenError
    from edgesched.sdnotify import run_until_signalled
    from edgesched.sync.session import EXIT_IDENTITY_IN_USE, IdentityInUse
    from edgesched.sync.store import StoreError

    # What edgesched.serve.edge_engine does, without importing that module: it wires central
    # too (grpc, protobuf, aetcd: about 13 MB of RSS that an edge node never uses).
    engine = EdgeEngine(cfg, hal_root=Path(cfg.edge.hal_root), clock=_clock(), api=edge_api.serve)
    try:
        asyncio.run(run_until_signalled(engine))
    except KeyboardInterrupt:  # pragma: no cover - interactive
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        # As `edgesched edge run`: what an operator can act on is one line, exit 1, or 3 for
        # another process under the node's identity (the unit's RestartPreventExitStatus), the
        # first such error inside a task group's exception group; anything else keeps its
        # traceback.
        for leaf in _leaves(exc):
            if isinstance(leaf, ListenError):
                fail(f"edge API ([edge] api_host, api_port in {args.config}): {leaf}", 1)
            if isinstance(leaf, IdentityInUse):
                fail(f"edge: {leaf}", EXIT_IDENTITY_IN_USE)
            if isinstance(leaf, StoreError | IdentityError | UnsupportedHardware | OSError):
                fail(str(leaf), 1)
        raise


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``'s (nested) exception groups, or ``[exc]``."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


if __name__ == "__main__":
    main()
