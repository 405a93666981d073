"""Carry out (or only print) a plan of directories, files, one symlink and commands.

Role: the part of ``edgesched install`` that touches the machine, kept apart from deciding
*what* to install (:mod:`edgesched.install`). Every path in a :class:`Plan` is the gateway's
(``/etc/edgesched/edge.toml``); ``root`` stages them elsewhere, as ``DESTDIR`` does.

* Files are written atomically (temporary file in the same directory, fsync, rename, fsync of
  the directory); a file whose content differs is first renamed to ``<name>.bak-<time>``
  (which keeps its mode and owner: a key stays 0600); an identical one is left alone, only
  its mode and owner are corrected. The symlink is replaced atomically too.
* Commands run only when something changed (``after``) or only when nothing did
  (``after_unchanged``); a command with ``skip`` set is reported, never run.
* ``dry_run`` prints every directory, every file with its full content (secrets excepted),
  the link and every command, and touches nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import grp
import os
import pwd
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

Say = Callable[[str], None]


class PlanError(Exception):
    """A step failed on the way (a command, a path in the way); the message says which."""


@dataclass(frozen=True, slots=True)
class Owner:
    """A file's owner and group, by name."""

    user: str = "root"
    group: str = "root"

    def __str__(self) -> str:
        return f"{self.user}:{self.group}"


@dataclass(frozen=True, slots=True)
class WriteFile:
    path: Path
    content: bytes
    mode: int
    owner: Owner = Owner()
    secret: bool = False  # a private key or password: never printed
    origin: str = ""  # where it came from, for the report ("copied from ...")


@dataclass(frozen=True, slots=True)
class MakeDir:
    path: Path
    mode: int
    owner: Owner = Owner()


@dataclass(frozen=True, slots=True)
class Link:
    path: Path
    target: Path
    why: str


@dataclass(frozen=True, slots=True)
class Command:
    argv: tuple[str, ...]
    why: str
    skip: str = ""  # non-empty: not run, and this says why

    def __str__(self) -> str:
        return shlex.join(self.argv)


@dataclass(slots=True)
class Plan:
    """Everything to do, in order: ``before`` (making the service user: files are chowned to
    it), ``dirs``, ``files``, ``link``, then ``after`` or ``after_unchanged``."""

    title: str
    root: Path = Path("/")
    before: list[Command] = field(default_factory=list)
    dirs: list[MakeDir] = field(default_factory=list)
    files: list[WriteFile] = field(default_factory=list)
    link: Link | None = None
    after: list[Command] = field(default_factory=list)
    after_unchanged: list[Command] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def host(self, path: Path) -> Path:
        return on_host(self.root, path)


def on_host(root: Path, path: Path) -> Path:
    """Where the gateway path ``path`` is on this machine when staged under ``root``."""
    return root / path.relative_to("/")


@dataclass(slots=True)
class Outcome:
    """What :func:`apply` did: paths by kind of change, and the commands run."""

    created: list[Path] = field(default_factory=list)
    changed: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    @property
    def anything(self) -> bool:
        return bool(self.created or self.changed or self.removed)


def describe_file(f: WriteFile, root: Path = Path("/")) -> list[str]:
    """A file's header line and, unless secret, its full content, each line prefixed ``|``."""
    where = f" (staged under {root})" if root != Path("/") else ""
    origin = f", {f.origin}" if f.origin else ""
    head = f"{f.path}{where}: mode {f.mode:04o}, owner {f.owner}, {len(f.content)} bytes{origin}"
    if f.secret:
        return [head + "; a secret: content not shown"]
    try:
        body = f.content.decode()
    except UnicodeDecodeError:
        return [head + "; binary: content not shown"]
    return [head + ":"] + [f"  | {line}" for line in body.splitlines()]


def file_state(path: Path, content: bytes) -> str:
    """``new``, ``unchanged`` or ``changed``: ``path`` against ``content``."""
    try:
        return "unchanged" if path.read_bytes() == content else "changed"
    except FileNotFoundError:
        return "new"
    except OSError:
        return "changed"


def command_line(c: Command, verb: str) -> str:
    if c.skip:
        return f"{verb.replace('run', 'skip')}: {c}  ({c.why}; {c.skip})"
    return f"{verb}: {c}  ({c.why})"


def print_plan(plan: Plan, say: Say, *, heading: str) -> None:
    """The dry run: every step, every file in full (secrets excepted)."""
    say(heading)
    for c in plan.before:
        say(command_line(c, "would run"))
    for d in plan.dirs:
        if not plan.host(d.path).is_dir():
            say(f"would create directory {d.path} (mode {d.mode:04o}, owner {d.owner})")
    for f in plan.files:
        lines = describe_file(f, plan.root)
        say(f"would write ({file_state(plan.host(f.path), f.content)}) " + lines[0])
        for line in lines[1:]:
            say(line)
    if plan.link:
        say(f"would link {plan.link.path} -> {plan.link.target} ({plan.link.why})")
    for c in plan.after if would_change(plan) else plan.after_unchanged:
        say(command_line(c, "would run"))
    for note in plan.notes:
        say(f"note: {note}")


def would_change(plan: Plan) -> bool:
    """Whether carrying ``plan`` out would create or change anything (modes aside)."""
    return (
        any(not plan.host(d.path).is_dir() for d in plan.dirs)
        or any(file_state(plan.host(f.path), f.content) != "unchanged" for f in plan.files)
        or (plan.link is not None and link_target(plan.host(plan.link.path)) != plan.link.target)
    )


def apply(plan: Plan, say: Say) -> Outcome:
    """Carry ``plan`` out, one line per step on ``say``; PlanError if a step fails."""
    out = Outcome()
    for c in plan.before:
        run(c, say, out)
    for d in plan.dirs:
        target = plan.host(d.path)
        if not target.is_dir():
            target.mkdir(parents=True, mode=d.mode)
            target.chmod(d.mode)
            _chown(target, d.owner, say)
            out.created.append(d.path)
            say(f"created {d.path}")
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    for f in plan.files:
        _write(plan.host(f.path), f, stamp, say, out)
    if plan.link:
        _link(plan.host(plan.link.path), plan.link, say, out)
    for c in plan.after if out.anything else plan.after_unchanged:
        run(c, say, out)
    for note in plan.notes:
        say(f"note: {note}")
    return out


def run(c: Command, say: Say, out: Outcome) -> None:
    """Run ``c`` (or report why it is skipped); PlanError naming it if it fails."""
    if c.skip:
        say(f"skipped: {c}  ({c.skip})")
        return
    try:
        done = subprocess.run(c.argv, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PlanError(f"{c}: {exc}") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise PlanError(
            f"{c} failed (exit {done.returncode}): {detail[-1] if detail else 'no output'}"
        )
    out.ran.append(str(c))
    say(f"ran: {c}")


def link_target(path: Path) -> Path | None:
    """Where the symlink ``path`` points (None if it is not one)."""
    try:
        return Path(os.readlink(path))
    except OSError:
        return None


def _write(target: Path, f: WriteFile, stamp: str, say: Say, out: Outcome) -> None:
    state = file_state(target, f.content)
    if state == "unchanged":
        if _fix_mode(target, f, say):
            out.changed.append(f.path)
        else:
            out.unchanged.append(f.path)
            say(f"unchanged {f.path}")
        return
    backup = None
    if state == "changed":
        backup = target.with_name(f"{target.name}.bak-{stamp}")
        os.replace(target, backup)
    write_atomic(target, f.content, f.mode)
    _chown(target, f.owner, say)
    if backup is not None:
        out.changed.append(f.path)
        say(f"changed {f.path} (the previous one is kept as {backup.name})")
    else:
        out.created.append(f.path)
        say(f"wrote {f.path}")


def _fix_mode(target: Path, f: WriteFile, say: Say) -> bool:
    st = target.stat()
    fixed = False
    if st.st_mode & 0o7777 != f.mode:
        target.chmod(f.mode)
        fixed = True
    want = _ids(f.owner)
    if want is not None and os.geteuid() == 0 and (st.st_uid, st.st_gid) != want:
        os.chown(target, *want)
        fixed = True
    if fixed:
        say(f"fixed the mode and owner of {f.path} ({f.mode:04o} {f.owner})")
    return fixed


def write_atomic(target: Path, content: bytes, mode: int) -> None:
    """Write ``target`` so that a reader sees the old content or the new, never a mix, and
    the new one survives a power cut once this returns."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ids(owner: Owner) -> tuple[int, int] | None:
    """(uid, gid) of ``owner`` here, or None when it does not exist (a staged install)."""
    try:
        return pwd.getpwnam(owner.user).pw_uid, grp.getgrnam(owner.group).gr_gid
    except KeyError:
        return None


def _chown(path: Path, owner: Owner, say: Say) -> None:
    ids = _ids(owner)
    if ids is None:
        say(f"note: no user or group {owner} here: {path} is left owned by root")
    elif os.geteuid() == 0:
        os.chown(path, *ids)


def _link(target: Path, link: Link, say: Say, out: Outcome) -> None:
    if link_target(target) == link.target:
        out.unchanged.append(link.path)
        say(f"unchanged {link.path} -> {link.target}")
        return
    if target.exists() and not target.is_symlink():
        raise PlanError(f"{link.path} exists and is not a symlink: move it away first")
    tmp = target.with_name(f".{target.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(link.target, tmp)
    existed = target.is_symlink()
    os.replace(tmp, target)  # atomic: the unit never finds `current` missing
    fsync_dir(target.parent)
    (out.changed if existed else out.created).append(link.path)
    say(f"linked {link.path} -> {link.target} ({link.why})")
