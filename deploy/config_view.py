"""`perftracker config`: every setting's effective value, where it came from, its allowed range.

A rich table where rich is installed (the server extra); plain aligned columns otherwise (the
slim collector install has no rich), or JSON with ``--json``. Secrets are masked in all three
(:func:`perftracker_ml.schemas.settings_loader.show_value`).
"""

from __future__ import annotations

import json
from typing import Any

from .output import printable

COLUMNS = (("env", "Setting (environment variable)"), ("value", "Value"), ("source", "Source"),
           ("range", "Allowed"), ("doc", "Description"))


def config_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, indent=2)


def config_text(rows: list[dict[str, Any]]) -> list[str]:
    """Plain aligned columns, one line per setting (no wrapping: the description comes last)."""
    shown = [[printable(_cell(row, key)) for key, _ in COLUMNS] for row in rows]
    header = [title for _, title in COLUMNS]
    widths = [max(len(line[i]) for line in [header, *shown]) for i in range(len(COLUMNS) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(line, widths, strict=False)), line[-1]]).rstrip()
            for line in [header, *shown]]


def print_config_table(rows: list[dict[str, Any]], width: int | None = None) -> bool:
    """Print the rich table; False (nothing printed) when rich is not installed."""
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        return False
    console = Console(width=width) if width else Console()
    if not console.is_terminal and width is None:
        console = Console(width=200)  # piped: wide rows rather than names folded over lines
    table = Table(show_lines=False, header_style="bold")
    for key, title in COLUMNS:
        table.add_column(title, no_wrap=key in ("env", "source", "range"),
                         overflow="fold", style="dim" if key == "doc" else None)
    for row in rows:
        table.add_row(*(Text(printable(_cell(row, key))) for key, _ in COLUMNS),
                      style="bold" if row["source"] != "default" else None)
    console.print(table)
    return True


def _cell(row: dict[str, Any], key: str) -> str:
    value = str(row[key])
    if key == "value" and value == "":
        return "(empty)"
    return value
