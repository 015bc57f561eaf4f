"""The shipped dashboards and provisioning files, and Grafana macro rendering for checks.

:func:`render_sql` substitutes the ClickHouse plugin's macros and Grafana's
template variables the way Grafana would, so every panel's SQL can be run
against chDB in tests (and by anyone debugging a panel).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from importlib import resources
from typing import Any

import yaml


def _files(folder: str, suffix: str) -> Iterator[tuple[str, str]]:
    root = resources.files(__package__)
    for part in folder.split("/"):
        root = root / part
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.is_file() and entry.name.endswith(suffix):
            yield entry.name, entry.read_text()
        elif entry.is_dir():
            yield from ((f"{entry.name}/{n}", t) for n, t in _files(f"{folder}/{entry.name}", suffix))


def load_dashboards() -> dict[str, dict]:
    """``{file name: dashboard model}`` for ``dashboards/*.json``."""
    return {name: json.loads(text) for name, text in _files("dashboards", ".json")}


def load_provisioning() -> dict[str, Any]:
    """``{relative path: parsed YAML}`` for ``provisioning/**.yaml``."""
    return {name: yaml.safe_load(text) for name, text in _files("provisioning", ".yaml")}


def panel_queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[dict, dict]]:
    """(panel, target) for every query of every panel, rows included."""
    for p in dashboard.get("panels", []):
        for inner in [p, *p.get("panels", [])]:
            for t in inner.get("targets", []):
                yield inner, t


def _literal(value: Any) -> str:
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "''") + "'"


def _format(values: Sequence[Any], fmt: str) -> str:
    if fmt == "sqlstring":
        return ",".join(_literal(str(v)) for v in values)
    if fmt == "csv" or fmt == "":
        return ",".join(str(v) for v in values)
    if fmt == "singlequote":
        return ",".join("'" + str(v).replace("'", "\\'") + "'" for v in values)
    raise ValueError(f"variable format {fmt!r} not supported by render_sql")


_VAR = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)")


def render_sql(sql: str, variables: Mapping[str, Sequence[Any]], start: datetime, end: datetime,
               interval_s: int = 60, all_selected: Mapping[str, str] | None = None) -> str:
    """Grafana ClickHouse macros and ``${var[:format]}`` variables -> plain SQL (values as given).

    ``all_selected``: variables set to "All" -> their custom all value, which Grafana inserts
    as it is, whatever the format."""
    f, t = int(start.timestamp()), int(end.timestamp())
    fn_macros = {
        "timeFilter": lambda c: f"{c} >= toDateTime({f}) AND {c} <= toDateTime({t})",
        "timeFilter_ms": lambda c: f"{c} >= fromUnixTimestamp64Milli({f * 1000}) AND "
                                   f"{c} <= fromUnixTimestamp64Milli({t * 1000})",
        "timeInterval": lambda c: f"toStartOfInterval(toDateTime({c}), INTERVAL {interval_s} second)",
    }
    sql = re.sub(r"\$__(\w+)\(([^)]*)\)", lambda m: fn_macros[m.group(1)](m.group(2).strip()), sql)
    plain = {"fromTime": f"toDateTime({f})", "toTime": f"toDateTime({t})",
             "fromTime_ms": f"fromUnixTimestamp64Milli({f * 1000})",
             "toTime_ms": f"fromUnixTimestamp64Milli({t * 1000})", "interval_s": str(interval_s)}
    sql = re.sub(r"\$__(\w+)", lambda m: plain[m.group(1)], sql)

    def var(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if all_selected and name in all_selected:
            return all_selected[name]
        return _format(variables[name], m.group(2) or "")

    return _VAR.sub(var, sql)
