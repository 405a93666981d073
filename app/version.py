"""The edgesched version, single source for the package metadata and ``--version``."""

__version__ = "0.1.0"
