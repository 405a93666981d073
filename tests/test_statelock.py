"""One engine per state directory (sync/statelock.py): the lock, its message, its release."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgesched.sync.session import IdentityInUse
from edgesched.sync.statelock import LOCK_FILE, StateDirInUse, StateLock


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    first = StateLock.acquire(tmp_path, "edge engine gw-01")
    with pytest.raises(StateDirInUse) as refused:
        StateLock.acquire(tmp_path, "edge engine gw-01")
    assert isinstance(refused.value, IdentityInUse)  # (the CLIs' exit code 3)
    assert str(refused.value) == (
        f"state directory {tmp_path} is in use by another engine (pid {os.getpid()}): this "
        "edge engine gw-01 stops before touching its store; stop the other one first, or "
        "give this one a state_dir of its own"
    )
    first.release()
    first.release()  # (idempotent)
    again = StateLock.acquire(tmp_path, "edge engine gw-01")
    assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    again.release()


def test_the_lock_goes_with_its_process_however_it_ends(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from edgesched.sync.statelock import StateLock; "
            f"StateLock.acquire(Path({str(tmp_path)!r}), 'central c1'); "
            "print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(StateDirInUse, match=f"pid {holder.pid}"):
            StateLock.acquire(tmp_path, "central c1")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    StateLock.acquire(tmp_path, "central c1").release()  # SIGKILL released it
