"""``edgesched install`` / ``uninstall``: put an edge node (or central) on a gateway as a service.

Role: lay out the agreed install tree, write the node's config, identity and systemd unit,
and undo it. The layout (shared with the offline bundle and upgrade/rollback):

* ``<prefix>`` (``/opt/edgesched``): ``releases/<version>/`` is one virtual environment with
  edgesched installed; ``current`` is a symlink to the active release. The unit runs
  ``<prefix>/current/bin/edgesched``.
* ``<etc>`` (``/etc/edgesched``): ``edge.toml`` or ``central.toml``, ``certs/``.
* state: systemd's ``StateDirectory=`` (``/var/lib/edgesched``, central
  ``/var/lib/edgesched-central``); logs go to the journal.
* the unit ``<unit_dir>/edgesched-<role>.service``, run as the system user ``edgesched``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

Role = Literal["edge", "central"]
ROLES: Final[tuple[Role, ...]] = ("edge", "central")

DEFAULT_PREFIX: Final = Path("/opt/edgesched")
DEFAULT_ETC_DIR: Final = Path("/etc/edgesched")
DEFAULT_UNIT_DIR: Final = Path("/etc/systemd/system")
#: Where systemd's ``StateDirectory=`` lives for system services.
STATE_ROOT: Final = Path("/var/lib")
SERVICE_USER: Final = "edgesched"
RELEASES: Final = "releases"
CURRENT: Final = "current"
CERTS: Final = "certs"


def unit_name(role: Role) -> str:
    """``edgesched-edge.service`` or ``edgesched-central.service``."""
    return f"edgesched-{role}.service"


def config_name(role: Role) -> str:
    """``edge.toml`` or ``central.toml`` (in the config directory)."""
    return f"{role}.toml"


def state_dir_name(role: Role) -> str:
    """The unit's ``StateDirectory=``: ``edgesched`` for an edge node (the edge config's
    default state_dir), ``edgesched-central`` for central (central's default)."""
    return "edgesched" if role == "edge" else "edgesched-central"


def releases_dir(prefix: Path = DEFAULT_PREFIX) -> Path:
    return prefix / RELEASES


def release_dir(version: str, prefix: Path = DEFAULT_PREFIX) -> Path:
    """One release: a virtual environment with edgesched ``version`` installed."""
    return prefix / RELEASES / version


def current_link(prefix: Path = DEFAULT_PREFIX) -> Path:
    """The symlink to the active release; the unit runs ``current/bin/edgesched``."""
    return prefix / CURRENT


def executable(prefix: Path = DEFAULT_PREFIX) -> Path:
    """What the unit's ``ExecStart=`` runs."""
    return current_link(prefix) / "bin" / "edgesched"
