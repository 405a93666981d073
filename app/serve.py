"""Wiring: build an engine with its HTTP API, and run it until a signal.

The engines know nothing of their APIs (an API module imports its engine, never the other way
round); this module hands each engine its tier's ``api.serve`` and owns the process's signal
handling. The CLI, the demo and the tests build engines here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from edgesched import sdnotify
from edgesched.config import EdgeschedConfig
from edgesched.edge import api as edge_api
from edgesched.edge.engine import EdgeEngine
from edgesched.sdnotify import Service

if TYPE_CHECKING:
    from edgesched.central.engine import CentralEngine


def edge_engine(
    config: EdgeschedConfig,
    *,
    hal_root: Path | None = None,
    clock: Callable[[], float] = time.time,
    max_page_count: int | None = None,
) -> EdgeEngine:
    """An edge engine that serves its local API once it is up."""
    return EdgeEngine(
        config,
        hal_root=Path(config.edge.hal_root) if hal_root is None else hal_root,
        clock=clock,
        max_page_count=max_page_count,
        api=edge_api.serve,
    )


def central_engine(
    config: EdgeschedConfig, *, clock: Callable[[], float] = time.time
) -> CentralEngine:
    """A central engine that serves its API (and dashboard) once it is up. (Central's modules
    are imported here, not with this module: an edge node's service process, which builds its
    engine here too, never loads them: grpc, protobuf and aetcd are ~13 MB of RSS.)"""
    from edgesched.central import api as central_api
    from edgesched.central.engine import CentralEngine

    return CentralEngine(config, clock=clock, api=central_api.serve)


async def run_until_signalled(engine: Service) -> None:
    """Run ``engine`` until SIGTERM or SIGINT asks it to stop, with systemd told when it is
    ready, stopping, and (the watchdog) still turning: :mod:`edgesched.sdnotify`."""
    await sdnotify.run_until_signalled(engine)
