"""Loopback ports for the processes edgesched starts itself: a free one, and waiting for a
listener on one (the demo, the field tests, the benchmarks and the tests share these)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time


def free_port() -> int:
    """A TCP port nothing listens on at this moment, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_port(
    port: int,
    timeout: float = 10.0,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    interval: float = 0.05,
) -> None:
    """Return once 127.0.0.1:``port`` accepts a connection. TimeoutError after ``timeout``;
    ChildProcessError at once if ``proc`` (the process meant to listen) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ChildProcessError(f"exited {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(interval)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")
