"""edgesched: an edge-autonomous heterogeneous compute scheduler."""

from edgesched.version import __version__

__all__ = ["__version__"]
