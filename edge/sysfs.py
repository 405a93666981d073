"""Tolerant readers for sysfs and procfs files: a missing or odd file is None, never a crash.

Shared by the hardware abstraction (discovery) and the agent (sampling); both read trees
under a configurable root so tests can point them at a small fake tree.
"""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """The stripped text of ``path``, or None when it is missing or unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except (OSError, ValueError):
        return None


def read_int(path: Path) -> int | None:
    """An integer file (decimal, or 0x-prefixed hex as PCI ids are), or None."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def listdir(path: Path) -> list[Path]:
    """The sorted entries of a directory, or [] when it cannot be listed."""
    try:
        return sorted(path.iterdir())
    except OSError:
        return []
