"""What the Grafana Foundation SDK (``grafana-foundation-sdk``) lacks for perftracker's dashboards.

:mod:`.build` writes every dashboard with the SDK's builders. Three things these dashboards
need have no builder in the SDK, and are filled in here, each the smallest way the SDK allows:

* a ClickHouse query (``grafana-clickhouse-datasource``): the SDK ships query types for
  Prometheus, Loki and others, not ClickHouse. :class:`ClickHouseQuery` is a
  ``cog.variants.Dataquery``, the SDK's own extension point for a datasource it does not
  know: any object with ``to_json`` goes in a panel's ``targets``;
* an annotation whose target is such a query: the SDK types ``AnnotationQuery.target`` as the
  built-in Grafana annotation target (``limit``, ``matchAny``, ``tags``, ``type``), so
  :class:`ClickHouseAnnotationTarget` subclasses it and serialises the ClickHouse query instead;
* the import envelope (``__inputs``, ``__requires``) that Grafana's *Import dashboard* reads:
  the SDK models the dashboard, not the envelope, so :func:`with_import_envelope` adds it to
  the SDK's JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

QueryFormat = Literal["table", "timeseries"]
# the ClickHouse plugin's `format`: 0 time series (long rows pivoted on their string columns), 1 table
_FORMATS = {"timeseries": 0, "table": 1}


class ClickHouseQuery(cogvariants.Dataquery):
    """A raw-SQL query of the ClickHouse plugin (its ``editorType`` ``sql``)."""

    def __init__(self, ref_id: str, sql: str, fmt: QueryFormat, datasource: model.DataSourceRef) -> None:
        self.ref_id = ref_id
        self.sql = " ".join(sql.split())
        self.fmt = fmt
        self.datasource = datasource

    def to_json(self) -> dict[str, object]:
        return {"refId": self.ref_id, "datasource": self.datasource, "editorType": "sql",
                "queryType": self.fmt, "format": _FORMATS[self.fmt], "rawSql": self.sql}


class ClickHouse(cogbuilder.Builder[ClickHouseQuery]):
    """Builds a :class:`ClickHouseQuery` (what ``with_target`` and ``targets`` take)."""

    def __init__(self, sql: str, datasource: model.DataSourceRef, fmt: QueryFormat = "table",
                 ref_id: str = "A") -> None:
        self._internal = ClickHouseQuery(ref_id, sql, fmt, datasource)

    def build(self) -> ClickHouseQuery:
        return self._internal


class ClickHouseAnnotationTarget(model.AnnotationTarget):
    """An annotation target that is a ClickHouse query, in place of the SDK's built-in one."""

    def __init__(self, query: ClickHouseQuery) -> None:
        super().__init__()
        self.query = query

    def to_json(self) -> dict[str, object]:
        return self.query.to_json()


class ClickHouseAnnotation(cogbuilder.Builder[model.AnnotationTarget]):
    """Builds a :class:`ClickHouseAnnotationTarget` (what ``AnnotationQuery.target`` takes)."""

    def __init__(self, query: ClickHouse) -> None:
        self._query = query

    def build(self) -> model.AnnotationTarget:
        return ClickHouseAnnotationTarget(self._query.build())


def to_json(built: model.Dashboard) -> dict[str, Any]:
    """The SDK's dashboard as plain JSON data (its encoder, then parsed back)."""
    return json.loads(json.dumps(built, cls=JSONEncoder))


def with_import_envelope(dashboard: dict[str, Any], inputs: Sequence[tuple[str, str, str]],
                         grafana_version: str) -> dict[str, Any]:
    """``dashboard`` with ``__inputs`` and ``__requires`` added (no SDK model for them).

    ``inputs``: (input name, plugin id, plugin name) of each datasource an import asks for;
    ``__requires`` names Grafana, those plugins and every panel type the dashboard uses."""
    panel_types = sorted({p["type"] for p in dashboard.get("panels", [])})
    return {
        **dashboard,
        "__inputs": [{"name": name, "label": plugin_name, "description": f"the {plugin_name} datasource",
                      "type": "datasource", "pluginId": plugin, "pluginName": plugin_name}
                     for name, plugin, plugin_name in inputs],
        "__requires": [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": grafana_version}]
        + [{"type": "datasource", "id": plugin, "name": plugin_name, "version": ""}
           for _, plugin, plugin_name in inputs]
        + [{"type": "panel", "id": kind, "name": kind, "version": ""} for kind in panel_types],
    }
