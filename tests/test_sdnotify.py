"""systemd's notification protocol (edgesched.sdnotify) against real datagram sockets.

No systemd runs on this machine (PID 1 is the VM's init; see docs/systemd.md), so the tests
play systemd's part: they bind the ``AF_UNIX`` datagram socket systemd would bind, hand its
name to a real ``edgesched edge run`` / ``central run`` process in ``$NOTIFY_SOCKET`` (with
``$WATCHDOG_USEC`` as ``WatchdogSec=`` sets it), and read what arrives: ``READY=1`` once the
engine is up, ``WATCHDOG=1`` pings while its control loop turns, ``STOPPING=1`` on SIGTERM.
The watchdog's progress rule is shown on a real edge engine whose schedule loop is held.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import edgesched_binary, free_port, write_central_config, write_edge_config

from edgesched import sdnotify
from edgesched.config import parse_config
from edgesched.sdnotify import Notifier, message, socket_address, watchdog_interval
from edgesched.serve import edge_engine

Datagram = dict[str, str]


def parse(data: bytes) -> Datagram:
    fields = {}
    for line in data.decode().splitlines():
        key, _, value = line.partition("=")
        fields[key] = value
    return fields


class FakeSystemd:
    """The receiving end systemd would bind: one AF_UNIX datagram socket."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.received: list[tuple[float, Datagram]] = []

    def close(self) -> None:
        self.sock.close()

    def wait_for(self, pred: Callable[[Datagram], bool], timeout: float) -> Datagram:
        """The first datagram (received from now on, all kept) for which ``pred`` holds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                break
            fields = parse(data)
            self.received.append((time.monotonic(), fields))
            if pred(fields):
                return fields
        got = [f for _, f in self.received]
        raise AssertionError(f"no matching datagram within {timeout} s; got {got}")

    async def next_async(self, timeout: float) -> Datagram | None:
        """The next datagram, or None after ``timeout`` (without blocking the event loop)."""
        self.sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            data = await asyncio.wait_for(loop.sock_recv(self.sock, 4096), timeout)
        except TimeoutError:
            return None
        fields = parse(data)
        self.received.append((time.monotonic(), fields))
        return fields


@pytest.fixture
def abstract_systemd() -> Iterator[tuple[str, FakeSystemd]]:
    name = f"edgesched-test-{uuid.uuid4().hex}"
    fake = FakeSystemd(b"\0" + name.encode())
    try:
        yield "@" + name, fake
    finally:
        fake.close()


# --- the protocol's pure parts ------------------------------------------------------------------


def test_socket_address_paths_and_abstract_names() -> None:
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@/org/freedesktop/systemd1/notify/42") == (
        b"\0/org/freedesktop/systemd1/notify/42"
    )
    for bad in ("", "@", "relative/path", "vsock:2:1234"):
        with pytest.raises(ValueError):
            socket_address(bad)


def test_watchdog_interval_as_sd_watchdog_enabled_reads_it() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}, 7) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, 7) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "8"}, 7) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, 7) is None
    for usec in ("", "0", "-5", "30s"):
        assert watchdog_interval({"WATCHDOG_USEC": usec}, 7) is None
    assert watchdog_interval({}, 7) is None


def test_message_is_one_assignment_per_line() -> None:
    assert message(READY=1, STATUS="up") == b"READY=1\nSTATUS=up\n"
    assert message(STATUS="two\nlines") == b"STATUS=two lines\n"


def test_from_env_unsets_the_variables_so_tasks_do_not_inherit_them() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    env["PATH"] = "/bin"
    n = Notifier.from_env(env)
    assert n.address == b"\0x" and n.watchdog_s == 2.0 and env == {"PATH": "/bin"}
    kept = {"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": "5"}
    assert Notifier.from_env(kept, unset=False).enabled and "NOTIFY_SOCKET" in kept
    # not under systemd, or a value we cannot use: nothing is sent, nothing raises
    assert not Notifier.from_env({}).send(READY=1)
    assert not Notifier.from_env({"NOTIFY_SOCKET": "vsock:2:5"}).enabled
    assert Notifier.from_env({"WATCHDOG_USEC": "5"}).watchdog_s is None


def test_notifier_sends_one_datagram_to_a_path_and_an_abstract_socket(
    tmp_path: Path, abstract_systemd: tuple[str, FakeSystemd]
) -> None:
    path = tmp_path / "notify"
    fake = FakeSystemd(str(path))
    try:
        n = Notifier.from_env({"NOTIFY_SOCKET": str(path)})
        assert n.ready("edge node gw up")
        assert fake.wait_for(bool, 2) == {"READY": "1", "STATUS": "edge node gw up"}
    finally:
        fake.close()
    name, abstract = abstract_systemd
    n = Notifier.from_env({"NOTIFY_SOCKET": name})
    assert n.stopping("bye")
    assert abstract.wait_for(bool, 2) == {"STOPPING": "1", "STATUS": "bye"}
    # systemd gone (socket closed): a failed send is False, not an exception
    gone = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert not gone.status("x") and not gone.status("y") and gone.sent == 0


# --- the watchdog's rule: pings only while the loop turns ----------------------------------------


async def first_not_a_ping(fake: FakeSystemd, within_s: float) -> Datagram | None:
    """The first datagram within ``within_s`` that is not a WATCHDOG=1 ping, or None."""
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        f = await fake.next_async(left)
        if f is None or "WATCHDOG" not in f:
            return f
    return None


class _Loop:
    """A control loop the test turns by hand."""

    def __init__(self) -> None:
        self.loop_turns = 0


async def test_watchdog_pings_only_while_progress_advances(
    abstract_systemd: tuple[str, FakeSystemd], caplog: pytest.LogCaptureFixture
) -> None:
    name, fake = abstract_systemd
    n = Notifier.from_env({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "400000"})  # 0.4 s
    loop = _Loop()

    async def turning(stop_after_s: float) -> None:
        end = time.monotonic() + stop_after_s
        while time.monotonic() < end:
            loop.loop_turns += 1
            await asyncio.sleep(0.05)

    dog = asyncio.create_task(
        n.watchdog(lambda: loop.loop_turns, period_s=0.05, status=lambda: f"{loop.loop_turns}")
    )
    try:
        await turning(0.7)  # turning: a ping each 0.2 s
        pings = [f for _, f in fake.received]
        while (f := await fake.next_async(0.01)) is not None:
            pings.append(f)
        assert len(pings) >= 2 and all(p["WATCHDOG"] == "1" for p in pings)
        assert int(pings[-1]["STATUS"]) > int(pings[0]["STATUS"])  # the status line is fresh
        # stalled: within one check beyond 0.05 + 0.2 s of quiet, the pings stop
        f = await first_not_a_ping(fake, 1.0)
        assert f is not None and f["STATUS"].startswith("the control loop stalled")
        assert await fake.next_async(0.8) is None  # no ping for two whole intervals
        assert "has not turned" in caplog.text
        # turning again: fed again
        turns = asyncio.create_task(turning(0.6))
        f = await fake.next_async(0.6)
        assert f is not None and f.get("WATCHDOG") == "1"
        await turns
    finally:
        dog.cancel()


async def test_watchdog_without_watchdog_usec_returns_at_once() -> None:
    n = Notifier.from_env({"NOTIFY_SOCKET": "@nobody-listens"})
    await asyncio.wait_for(n.watchdog(lambda: 0, period_s=1), 1)


async def test_held_schedule_loop_of_a_real_edge_engine_stops_the_pings(
    tmp_path: Path, abstract_systemd: tuple[str, FakeSystemd]
) -> None:
    name, fake = abstract_systemd
    config = parse_config(
        {
            "edge": {
                "node_id": "gw-dog",
                "state_dir": str(tmp_path / "state"),
                "api_port": 0,
                "cycle_s": 0.1,
                "sample_s": 0.5,
                "mqtt": {"port": free_port()},
            }
        }
    )
    engine = edge_engine(config)
    n = Notifier.from_env({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "600000"})  # 0.6 s
    runner = asyncio.create_task(sdnotify.run_until_signalled(engine, n))
    try:
        ready = await fake.next_async(20)
        assert ready is not None and ready["READY"] == "1"
        assert ready["STATUS"].startswith("edge node gw-dog autonomous: broker not connected")
        ping = await fake.next_async(2)
        assert ping is not None and ping["WATCHDOG"] == "1"
        # a cycle that never ends (a deadlock, a store that hangs): the loop stops turning
        async with engine._lock:
            f = await first_not_a_ping(fake, 2.0)
            assert f is not None and "stalled" in f["STATUS"]
            assert await fake.next_async(1.3) is None  # past WatchdogSec: systemd would act
        ping = await fake.next_async(2)
        assert ping is not None and ping["WATCHDOG"] == "1"
    finally:
        engine.stop()
        await asyncio.wait_for(runner, 20)


# --- real processes ---------------------------------------------------------------------------


def _run(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


# central's READY=1 and watchdog under a real systemd: tests/test_unit_systemd.py
@pytest.mark.parametrize(
    "tier", ["edge", *(["central"] if os.environ.get("EDGESCHED_SLOW") else [])]
)
def test_real_process_says_ready_feeds_the_watchdog_and_says_stopping(
    tier: str, tmp_path: Path, abstract_systemd: tuple[str, FakeSystemd]
) -> None:
    name, fake = abstract_systemd
    if tier == "edge":
        config, _ = write_edge_config(tmp_path, free_port())
    else:
        config, _ = write_central_config(tmp_path, free_port(), cycle_s=0.2)
    env = {**os.environ, "NOTIFY_SOCKET": name, "WATCHDOG_USEC": "1000000"}  # WatchdogSec=1
    log = tmp_path / f"{tier}.log"
    proc = _run([edgesched_binary(), tier, "run", "--config", str(config)], env, log)
    try:
        ready = fake.wait_for(lambda f: "READY" in f, 30)
        assert ready["READY"] == "1", log.read_text()
        expect = "edge node gw-test" if tier == "edge" else "central central: broker"
        assert ready["STATUS"].startswith(expect), ready
        if tier == "central":
            assert "API on port" in ready["STATUS"] and "None" not in ready["STATUS"]
        t0 = time.monotonic()
        for _ in range(3):  # one ping each half second
            fake.wait_for(lambda f: f.get("WATCHDOG") == "1", 2)
        assert 0.6 < time.monotonic() - t0 < 3.0
        proc.send_signal(signal.SIGTERM)
        stopping = fake.wait_for(lambda f: "STOPPING" in f, 10)
        assert stopping["STATUS"].startswith("stopping; was ")
        assert proc.wait(20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_watchdog_for_another_pid_is_not_fed(
    tmp_path: Path, abstract_systemd: tuple[str, FakeSystemd]
) -> None:
    name, fake = abstract_systemd
    config, _ = write_edge_config(tmp_path, free_port())
    env = {**os.environ, "NOTIFY_SOCKET": name, "WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"}
    proc = _run([edgesched_binary(), "edge", "run", "-c", str(config)], env, tmp_path / "log")
    try:
        assert fake.wait_for(lambda f: "READY" in f, 30)["READY"] == "1"
        with pytest.raises(AssertionError, match="no matching datagram"):
            fake.wait_for(lambda f: "WATCHDOG" in f, 1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
