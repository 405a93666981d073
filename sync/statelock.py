"""One engine per state directory: an exclusive lock taken before the store opens.

Two engines started on one config (a second ``edgesched edge run`` by hand beside the
service, say) would share the SQLite store and the task files: the second would recover and
adopt the first one's live tasks, then fail on the API port, having written the store. So an
engine takes ``<state_dir>/engine.lock`` (``flock``, held while the process lives: the kernel
drops it when the process ends, however it ends) before anything else, and a second one stops
at once with :class:`StateDirInUse`, naming the first one's pid. A lock on another machine's
filesystem (NFS) is not relied upon: a state directory is local by design."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from edgesched.sync.session import IdentityInUse

LOCK_FILE = "engine.lock"


class StateDirInUse(IdentityInUse):
    """Another live process holds the state directory's lock: ``str()`` is one line. An
    :class:`IdentityInUse`, so the CLIs exit with its code (the unit does not restart it)."""


class StateLock:
    """The held lock on a state directory (:meth:`acquire`); :meth:`release` lets it go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, state_dir: Path, what: str) -> StateLock:
        """Lock ``state_dir`` for this process (``what``: "edge engine gw-01", for the
        message); :class:`StateDirInUse` if another process holds it, OSError if the
        directory cannot hold a lock file."""
        path = state_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StateDirInUse(
                f"state directory {state_dir} is in use by another engine (pid {holder}): "
                f"this {what} stops before touching its store; stop the other one first, or "
                "give this one a state_dir of its own"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Let the lock go (idempotent). The file stays: removing it would race a new holder."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
