"""A broker on this machine for ``edgesched demo``: Mosquitto when installed, else amqtt.

:func:`start_local_broker` starts it as a child process on 127.0.0.1 (anonymous access, which
is safe on loopback only) and waits until it accepts connections; :meth:`LocalBroker.stop`
ends it. Mosquitto speaks MQTT 5 and persists its sessions under the work directory; the
embedded amqtt broker (:mod:`edgesched.embedded_broker`) speaks MQTT 3.1.1, so the peers that
use it are configured with ``protocol = "3.1.1"``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from edgesched.ports import free_port, wait_for_port
from edgesched.sync.security import queue_settings

__all__ = ["LocalBroker", "free_port", "mosquitto_path", "start_local_broker"]


def mosquitto_path() -> str | None:
    found = shutil.which("mosquitto")
    if found is None and os.access("/usr/sbin/mosquitto", os.X_OK):
        found = "/usr/sbin/mosquitto"
    return found


@dataclass
class LocalBroker:
    port: int
    kind: str  # "mosquitto" or "embedded"
    protocol: str  # "5" or "3.1.1"
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    try:
        wait_for_port(port, timeout, proc=proc)
    except ChildProcessError:
        raise RuntimeError(
            f"the broker exited {proc.returncode}: {log.read_text()[-2000:]}"
        ) from None
    except TimeoutError:
        proc.kill()
        raise RuntimeError(
            f"the broker did not listen on 127.0.0.1:{port} within {timeout}s"
        ) from None


def start_local_broker(
    workdir: Path, *, port: int = 0, prefer: str = "auto", timeout: float = 15.0
) -> LocalBroker:
    """``prefer``: "auto" (Mosquitto if installed), "mosquitto" or "embedded"."""
    if prefer not in ("auto", "mosquitto", "embedded"):
        raise ValueError(f"prefer must be auto, mosquitto or embedded, got {prefer!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = workdir / "broker.log"
    exe = mosquitto_path() if prefer != "embedded" else None
    if prefer == "mosquitto" and exe is None:
        raise RuntimeError("mosquitto is not installed (apt-get install mosquitto)")
    with log.open("ab") as out:
        if exe is not None:
            store = workdir / "mosquitto"
            store.mkdir(exist_ok=True)
            conf = workdir / "mosquitto.conf"
            lines = [
                f"listener {port} 127.0.0.1",
                "allow_anonymous true",
                "persistence true",
                f"persistence_location {store}/",
                "log_dest stderr",
                *queue_settings(),
            ]
            if os.geteuid() == 0:
                lines.append("user root")  # as root it would switch to `mosquitto`
            conf.write_text("\n".join(lines) + "\n")
            proc = subprocess.Popen([exe, "-c", str(conf)], stdout=out, stderr=out)
            kind, protocol = "mosquitto", "5"
        else:
            argv = [sys.executable, "-m", "edgesched.embedded_broker", "--port", str(port)]
            proc = subprocess.Popen(argv, stdout=out, stderr=out)
            kind, protocol = "embedded", "3.1.1"
    _wait_listening(port, proc, log, timeout)
    return LocalBroker(port, kind, protocol, proc, log)
