"""systemd's service notification protocol (``sd_notify``), written directly, and the watchdog.

Role: what a ``Type=notify`` unit expects of its main process. The protocol is one datagram
of ``KEY=value`` lines sent to the ``AF_UNIX`` socket named by ``$NOTIFY_SOCKET`` (a path, or
an abstract name written with a leading ``@``); see sd_notify(3). The engines send:

* ``READY=1`` once they are up (systemd then counts the unit as started; ``systemctl start``
  returns, units ordered after it start);
* ``STATUS=...``: one human line that ``systemctl status`` shows;
* ``STOPPING=1`` when they begin to shut down;
* ``WATCHDOG=1`` from :meth:`Notifier.watchdog`, an asyncio task in the engine's task group,
  every half ``$WATCHDOG_USEC`` (``WatchdogSec=`` of the unit) *only while the engine's
  control loop makes progress*: a hung loop stops the pings, and systemd kills the process
  (SIGABRT, whose Python traceback lands in the journal with ``PYTHONFAULTHANDLER=1``) and
  restarts it.

Without ``$NOTIFY_SOCKET`` (not under systemd, or a unit of another ``Type=``) every call is a
no-op. :meth:`Notifier.from_env` removes the three variables from the environment, as
``sd_notify(unset_environment=1)`` does, so that the tasks an edge node starts do not inherit
them. A failed send is logged once and never raised: systemd's bookkeeping must not stop the
engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Protocol

log = logging.getLogger(__name__)

ENV_SOCKET = "NOTIFY_SOCKET"
ENV_WATCHDOG_USEC = "WATCHDOG_USEC"
ENV_WATCHDOG_PID = "WATCHDOG_PID"
#: The longest one send may block (systemd's socket queue full): the event loop runs it.
SEND_TIMEOUT_S = 1.0


def socket_address(value: str) -> str | bytes:
    """The address to send to for a ``$NOTIFY_SOCKET`` value: a path as it is, ``@name`` as
    the abstract name ``\\0name``. ValueError for anything else (systemd also offers
    ``vsock:`` addresses to virtual machines; not supported here)."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    raise ValueError(f"{ENV_SOCKET}={value!r}: neither a path nor an @abstract name")


def watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """The watchdog timeout in seconds for process ``pid``, or None when there is none (unset,
    zero, malformed, or ``$WATCHDOG_PID`` names another process), as sd_watchdog_enabled(3)."""
    raw = env.get(ENV_WATCHDOG_USEC, "")
    try:
        usec = int(raw)
    except ValueError:
        return None
    if usec <= 0:
        return None
    owner = env.get(ENV_WATCHDOG_PID)
    if owner is not None:
        try:
            if int(owner) != pid:
                return None
        except ValueError:
            return None
    return usec / 1_000_000


def message(**fields: str | int) -> bytes:
    """One datagram: ``KEY=value`` lines (a value's own line breaks become spaces: the
    protocol is one assignment per line)."""
    lines = [f"{key}={' '.join(str(value).splitlines())}" for key, value in fields.items()]
    return ("\n".join(lines) + "\n").encode()


class Notifier:
    """The main process's side of the protocol; every method is a no-op without a socket."""

    def __init__(self, address: str | bytes | None, watchdog_s: float | None = None) -> None:
        self.address = address
        #: ``WatchdogSec=`` in seconds, or None: no watchdog asked for
        self.watchdog_s = watchdog_s if address is not None else None
        self.sent = 0  # datagrams sent, for tests and status
        self._warned = False

    @classmethod
    def from_env(
        cls, env: MutableMapping[str, str] | None = None, *, unset: bool = True
    ) -> Notifier:
        """From ``$NOTIFY_SOCKET``, ``$WATCHDOG_USEC`` and ``$WATCHDOG_PID`` (of ``os.environ``
        by default), removed from it when ``unset``. A malformed socket value is logged and
        ignored."""
        env = os.environ if env is None else env
        raw = env.get(ENV_SOCKET)
        watchdog_s = watchdog_interval(env, os.getpid())
        if unset:
            for key in (ENV_SOCKET, ENV_WATCHDOG_USEC, ENV_WATCHDOG_PID):
                env.pop(key, None)
        if not raw:
            return cls(None)
        try:
            address = socket_address(raw)
        except ValueError as exc:
            log.warning("systemd notification disabled: %s", exc)
            return cls(None)
        return cls(address, watchdog_s)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: str | int) -> bool:
        """Send one datagram; False when there is no socket or the send failed (logged once)."""
        if self.address is None:
            return False
        data = message(**fields)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(SEND_TIMEOUT_S)  # a busy manager never holds the loop for long
                sock.connect(self.address)
                sock.sendall(data)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot notify systemd at %s: %s", self._shown(), exc)
            return False
        self.sent += 1
        return True

    def _shown(self) -> str:
        address = self.address
        if isinstance(address, bytes):
            return "@" + address[1:].decode(errors="replace")
        return str(address)

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status)

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def stopping(self, status: str = "stopping") -> bool:
        return self.send(STOPPING=1, STATUS=status)

    async def watchdog(
        self,
        progress: Callable[[], int],
        *,
        period_s: float,
        status: Callable[[], str] | None = None,
        what: str = "the control loop",
    ) -> None:
        """Ping ``WATCHDOG=1`` (with ``STATUS=`` from ``status``) every half watchdog interval
        while ``progress()`` (a counter the control loop advances at every turn, normally
        every ``period_s``) has advanced within the last ``period_s`` plus half the
        interval; stop pinging, with an error in the log, while it does not. Returns at once
        when no watchdog is asked for. Runs until cancelled."""
        if self.watchdog_s is None:
            return
        half = self.watchdog_s / 2
        quiet_limit = period_s + half
        if quiet_limit >= self.watchdog_s:
            log.warning(
                "%s turns every %g s: too slow for WatchdogSec=%g s (a stall is only seen "
                "after %g s); raise WatchdogSec above %g s",
                what,
                period_s,
                self.watchdog_s,
                quiet_limit,
                2 * quiet_limit,
            )
        last = progress()
        advanced_at = time.monotonic()
        stalled = False
        while True:
            await asyncio.sleep(half)
            now = time.monotonic()
            count = progress()
            if count != last:
                last, advanced_at = count, now
            quiet = now - advanced_at
            if quiet <= quiet_limit:
                if stalled:
                    log.warning("%s turns again after %.0f s: watchdog fed again", what, quiet)
                    stalled = False
                line = _status_line(status)
                if line is None:
                    self.send(WATCHDOG=1)
                else:
                    self.send(WATCHDOG=1, STATUS=line)
            elif not stalled:
                stalled = True
                log.error(
                    "%s has not turned for %.0f s: the watchdog is no longer fed; systemd "
                    "restarts this process within %g s unless it turns again",
                    what,
                    quiet,
                    self.watchdog_s,
                )
                self.send(STATUS=f"{what} stalled for {quiet:.0f} s")


class Service(Protocol):
    """What :func:`run_until_signalled` needs of an engine (edge or central)."""

    @property
    def loop_turns(self) -> int:
        """Turns the control loop has completed: the watchdog's measure of progress."""
        ...

    @property
    def loop_period_s(self) -> float:
        """How often the control loop turns when nothing wakes it (``cycle_s``)."""
        ...

    def service_status(self) -> str:
        """One line for ``systemctl status``."""
        ...

    async def wait_ready(self) -> None: ...

    async def run(self) -> None: ...

    def stop(self) -> None: ...


async def run_until_signalled(engine: Service, notifier: Notifier | None = None) -> None:
    """Run ``engine`` until SIGTERM or SIGINT asks it to stop, telling systemd about it.

    ``engine.run()`` runs in the calling task, so what it raises reaches the caller unchanged.
    Beside it, one task owned here (created before and cancelled after ``run()``) waits for
    the engine to be ready, sends ``READY=1`` and then feeds the watchdog from
    ``engine.loop_turns``. A signal sends ``STOPPING=1`` and stops the engine."""
    notifier = Notifier.from_env() if notifier is None else notifier
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        notifier.stopping(f"stopping; was {_status_line(engine.service_status) or 'up'}")
        engine.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal)

    async def announce() -> None:
        await engine.wait_ready()
        notifier.ready(_status_line(engine.service_status) or "up")
        await notifier.watchdog(
            lambda: engine.loop_turns,
            period_s=engine.loop_period_s,
            status=engine.service_status,
            what="the control loop",
        )

    side = asyncio.create_task(announce(), name="systemd-notify")
    try:
        await engine.run()
    finally:
        side.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await side
            except Exception:  # never hide the engine's own outcome behind ours
                log.exception("systemd notification task failed")


def _status_line(status: Callable[[], str] | None) -> str | None:
    """``status()``, or None (and the error logged) when it fails: the pings go on."""
    if status is None:
        return None
    try:
        return status()
    except Exception:
        log.exception("status line for systemd failed")
        return None
