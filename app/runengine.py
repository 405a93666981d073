"""Running an engine in the foreground, shared by ``edgesched edge/central run`` and the lean
``edgesched-edge`` service entry point: the log setup, the test hook that skews the wall clock,
and what an engine's failure becomes (one ``error:`` line and an exit code, never a traceback
for what an operator can act on).

No typer or rich here: the service path imports this module. Each caller passes its own
``fail`` (the CLI prints through rich, the service entry point plainly)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol

if TYPE_CHECKING:
    from edgesched.config import EdgeschedConfig

#: The exit code of an engine that found another process running under its identity
#: (:class:`edgesched.sync.session.IdentityInUse`): a systemd unit lists it in
#: ``RestartPreventExitStatus`` so that the second process stays stopped. The same value as
#: :data:`edgesched.sync.session.EXIT_IDENTITY_IN_USE` (not imported: it pulls in aiomqtt).
EXIT_IDENTITY_IN_USE = 3


class Fail(Protocol):
    def __call__(self, message: str, code: int = 2, /) -> NoReturn: ...


def check_edge(cfg: EdgeschedConfig, fail: Fail) -> None:
    """What an edge node needs before it runs: a node id, and its MQTT key and password files
    readable (read now, so a mistake is one line before the engine starts)."""
    if not cfg.edge.node_id:
        fail("edge.node_id: missing (required to run an edge node)")
    try:
        cfg.edge.mqtt.endpoint(cfg.edge.node_id)
    except ValueError as exc:
        fail(f"edge.mqtt: {exc}")


def setup_logging(log_level: str, fail: Fail) -> None:
    """Log to stderr at ``log_level`` (debug, info, warning or error)."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        fail(f"--log-level: unknown level {log_level!r}")
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def clock(fail: Fail) -> Callable[[], float]:
    """The wall clock, offset by ``EDGESCHED_CLOCK_SKEW_S`` seconds if set. A test hook: the
    field tests skew one node's clock on a machine whose clock all processes share. It moves
    the engine's wall clock (records, tidal windows), not the monotonic one of leases."""
    raw = os.environ.get("EDGESCHED_CLOCK_SKEW_S")
    if not raw:
        return time.time
    try:
        skew = float(raw)
    except ValueError:
        fail(f"EDGESCHED_CLOCK_SKEW_S: not a number of seconds: {raw!r}")
    print(f"clock skewed by {skew:+g} s (EDGESCHED_CLOCK_SKEW_S, a test hook)", file=sys.stderr)
    return lambda: time.time() + skew


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``'s (nested) exception groups, or ``[exc]``."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def run_engine(
    tier: str, config: Path, run: Callable[[], None], known: tuple[type, ...], fail: Fail
) -> None:
    """Run an engine (``run``); what stops it that an operator can act on is one ``error:``
    line (the first such error inside a task group's exception group) and exit code 1 (its
    API's port taken, a store or hardware problem) or :data:`EXIT_IDENTITY_IN_USE`.
    Anything else is a bug and keeps its traceback."""
    from edgesched.rest.server import ListenError
    from edgesched.sync.session import IdentityInUse

    try:
        run()
    except Exception as exc:
        for leaf in leaves(exc):
            if isinstance(leaf, ListenError):
                fail(f"{tier} API ([{tier}] api_host, api_port in {config}): {leaf}", 1)
            if isinstance(leaf, IdentityInUse):
                fail(f"{tier}: {leaf}", EXIT_IDENTITY_IN_USE)
            if isinstance(leaf, known):
                fail(str(leaf), 1)
        raise
