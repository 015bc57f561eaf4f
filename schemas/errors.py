"""Error hierarchy shared by every perftracker package.

Each package raises a subclass of :class:`PerftrackerError`, so a caller can
catch the whole family, and the CLI can print one line instead of a traceback.
"""

from __future__ import annotations


class PerftrackerError(Exception):
    """Base of every error perftracker raises on purpose."""


class SchemaError(PerftrackerError):
    """Bytes or records that do not match a known schema."""


class ConfigError(PerftrackerError):
    """A configuration file or environment variable that cannot be used."""
