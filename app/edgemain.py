"""The edge sub-engine's lean service entry point: ``edgesched edge run`` without typer or rich.

``python -m edgesched.edgemain --config FILE`` (or the ``edgesched-edge`` console script) runs
the edge engine exactly as ``edgesched edge run -c FILE`` does (the same config checks, the
same ``error:`` lines and exit codes, the same engine and API), with argparse only, so a
gateway's service process does not carry the CLI's libraries (typer, rich, click: about 7 MB
of RSS) for months. The ``edgesched`` console script sends ``edgesched edge run`` (what the
systemd unit, ``upgrade`` and ``rollback`` start) here (:mod:`edgesched.entry`); the full
CLI stays for people.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from edgesched import runengine
from edgesched.version import __version__


def fail(message: str, code: int = 2, /) -> NoReturn:
    """One ``error:`` line on stderr and exit ``code`` (the CLI's convention: 2 for a user
    mistake, 1 for a failure at run time)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def parser(prog: str = "edgesched-edge") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,  # as the CLI's options: no prefixes
        description="Run the edge sub-engine in the foreground until SIGTERM or Ctrl-C "
        "(tasks keep running). The same as `edgesched edge run`, without the CLI's libraries.",
    )
    p.add_argument("--config", "-c", type=Path, required=True, help="The node's TOML config.")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error.")
    p.add_argument("--version", action="version", version=f"edgesched {__version__}")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "edgesched-edge") -> None:
    args = parser(prog).parse_args(argv)
    import asyncio

    from edgesched.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        fail(str(exc))
    runengine.check_edge(cfg, fail)
    runengine.setup_logging(args.log_level, fail)

    from edgesched.edge.engine import IdentityError
    from edgesched.edge.hal import UnsupportedHardware
    from edgesched.serve import edge_engine, run_until_signalled
    from edgesched.sync.store import StoreError

    try:
        runengine.run_engine(
            "edge",
            args.config,
            lambda: asyncio.run(run_until_signalled(edge_engine(cfg, clock=runengine.clock(fail)))),
            (StoreError, IdentityError, UnsupportedHardware, OSError),
            fail,
        )
    except KeyboardInterrupt:  # pragma: no cover - interactive
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
