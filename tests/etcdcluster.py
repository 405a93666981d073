"""A real etcd cluster for the tests: Debian's ``etcd`` members as processes, on loopback
ports or one per network-namespace host (a command prefix such as ``ip netns exec ns``)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from edgesched.ports import free_port


def etcd_missing() -> str | None:
    """None if etcd and etcdctl are installed, else why not."""
    for tool in ("etcd", "etcdctl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install etcd-server etcd-client)"
    return None


@dataclass
class Member:
    name: str
    ip: str
    client_port: int
    peer_port: int
    data_dir: Path
    prefix: Sequence[str] = ()  # run its commands through this (ip netns exec ns)
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"{self.ip}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.ip}:{self.peer_port}"


class EtcdCluster:
    """``size`` members; a context manager that starts them, waits until every member is
    healthy, and stops (and wipes) them after."""

    def __init__(
        self,
        root: Path,
        size: int = 3,
        *,
        ips: Sequence[str] | None = None,
        prefixes: Sequence[Sequence[str]] | None = None,
        ports: tuple[int, int] | None = None,
    ) -> None:
        ips = ips or ["127.0.0.1"] * size
        prefixes = prefixes or [()] * size
        self.root = root
        self.token = f"es-{secrets.token_hex(4)}"
        self.members = [
            Member(
                f"m{i}",
                ips[i],
                ports[0] if ports else free_port(),
                ports[1] if ports else free_port(),
                root / f"m{i}",
                prefixes[i],
            )
            for i in range(size)
        ]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def __enter__(self) -> EtcdCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for m in self.members:
            self.launch(m)
        self.wait_healthy()

    def kill(self, m: Member) -> None:
        """SIGKILL one member (its data stays: :meth:`launch` brings it back)."""
        if m.proc is not None and m.proc.poll() is None:
            os.killpg(m.proc.pid, signal.SIGKILL)
            m.proc.wait()

    def launch(self, m: Member) -> None:
        initial = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        m.data_dir.mkdir(parents=True, exist_ok=True)
        if m.log is not None:
            m.log.close()
        m.log = (self.root / f"{m.name}.log").open("ab")
        argv = [
            "etcd",
            "--name", m.name,
            "--data-dir", str(m.data_dir),
            "--listen-client-urls", f"http://{m.ip}:{m.client_port}",
            "--advertise-client-urls", f"http://{m.ip}:{m.client_port}",
            "--listen-peer-urls", m.peer_url,
            "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", initial,
            "--initial-cluster-token", self.token,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            # a member back from a partition must not depose the leader (3.5's default)
            "--pre-vote",
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
        ]  # fmt: skip
        m.proc = subprocess.Popen(
            [*m.prefix, *argv], stdout=m.log, stderr=m.log, start_new_session=True
        )

    def etcdctl(self, member: Member, *args: str, timeout: float = 5.0) -> str:
        done = subprocess.run(
            [*member.prefix, "etcdctl", f"--endpoints={member.endpoint}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "ETCDCTL_API": "3"},
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip() or done.stdout.strip())
        return done.stdout

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        for m in self.members:
            while True:
                assert m.proc is not None
                if m.proc.poll() is not None:
                    raise RuntimeError(f"etcd {m.name} exited: {self.log_tail(m)}")
                try:
                    self.etcdctl(m, "endpoint", "health", "--command-timeout=1s")
                    break
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    last = str(e)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd {m.name} not healthy: {last}")
                time.sleep(0.1)

    def log_tail(self, m: Member) -> str:
        with contextlib.suppress(OSError):
            return (self.root / f"{m.name}.log").read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(m.proc.pid, signal.SIGKILL)  # a test cluster: nothing to keep
        for m in self.members:
            if m.proc is not None:
                try:
                    m.proc.wait(10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(m.proc.pid, signal.SIGKILL)
                    m.proc.wait()
            if m.log is not None:
                m.log.close()
        for m in self.members:
            shutil.rmtree(m.data_dir, ignore_errors=True)
