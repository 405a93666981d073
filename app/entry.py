"""The ``edgesched`` console script: ``edgesched edge run`` goes to the lean service entry
point (:mod:`edgesched.edgemain`: argparse, no typer or rich, no central modules), every other
command to the full CLI (:mod:`edgesched.cli`).

The systemd unit, ``upgrade`` and ``rollback`` all start a gateway's engine as
``<release>/bin/edgesched edge run --config FILE``; routing that one command here keeps the
service process lean (~13 MB less RSS, held for months) without changing the unit, so a
rollback to a release that predates the lean entry point still finds the command it runs.
``edgesched edge run --help`` stays the CLI's."""

from __future__ import annotations

import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv[:2] == ["edge", "run"] and not {"--help", "-h"} & set(argv[2:]):
        from edgesched.edgemain import main as run_edge

        run_edge(argv[2:], prog="edgesched edge run")
        return
    from edgesched.cli import main as cli

    cli()


if __name__ == "__main__":  # pragma: no cover
    main()
