"""SQL identifiers: the one way a name (table, column, view, cluster) enters a statement's text.

Values never do: every value is bound by the driver as a parameter (``{name:Type}``
placeholders, or the insert API's column data). Names cannot be bound, so every
name that is pasted into SQL passes :func:`ident`, which accepts plain identifiers
only (ASCII letters, digits and underscores, not starting with a digit) and raises
otherwise; ``tests/unit/sinks/test_sql_safety.py`` checks that no SQL text is built
from anything else.
"""

from __future__ import annotations

import re

from .errors import SinkError

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class BadIdentifier(SinkError, ValueError):
    """A name that is not a plain SQL identifier (never pasted into SQL)."""


def ident(name: str) -> str:
    """``name`` unchanged when it is a plain identifier; :class:`BadIdentifier` otherwise."""
    if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
        raise BadIdentifier(f"not a plain SQL identifier: {str(name)[:60]!r}")
    return name
