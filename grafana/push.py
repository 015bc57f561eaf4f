"""``perftracker grafana push``: upload folder, datasources, dashboards, contact point and alert rules.

Idempotent: everything has a fixed uid and is created when missing, updated
(overwritten) when present, so pushing twice changes nothing. The same
provisioning files Grafana reads from disk are the source: ``${NAME}``
placeholders are filled from ``values`` (the environment by default) and
``$$`` becomes ``$``. The notification policy tree is left alone (it is
org-wide; see docs/operations.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..schemas.errors import PerftrackerError
from .dashboards import load_dashboards, load_provisioning

FOLDER_UID = "perftracker"
FOLDER_TITLE = "perftracker"
TOKEN_ENV = "PERFTRACKER_GRAFANA_TOKEN"


class GrafanaPushError(PerftrackerError):
    """Grafana refused or could not be reached."""


def read_token(env: Mapping[str, str], token_file: Path | None = None) -> str:
    """The API token from ``token_file`` or ``$PERFTRACKER_GRAFANA_TOKEN``; never printed."""
    if token_file is not None:
        try:
            return token_file.read_text().strip()
        except OSError as exc:
            raise GrafanaPushError(f"cannot read token file {token_file}: {exc.strerror}") from None
    token = env.get(TOKEN_ENV, "")
    if not token:
        raise GrafanaPushError(f"no Grafana token: set {TOKEN_ENV} or pass --token-file")
    return token


def interpolate(obj: Any, values: Mapping[str, str]) -> Any:
    """Grafana provisioning interpolation: ``$NAME``/``${NAME}`` from values, ``$$`` -> ``$``."""
    if isinstance(obj, str):
        return re.sub(r"\$\$|\$\{(\w+)\}|\$(\w+)",
                      lambda m: "$" if m.group(0) == "$$" else values.get(m.group(1) or m.group(2), ""), obj)
    if isinstance(obj, list):
        return [interpolate(v, values) for v in obj]
    if isinstance(obj, dict):
        return {k: interpolate(v, values) for k, v in obj.items()}
    return obj


def _exists(call: Any, *args: Any) -> Any | None:
    from grafana_client.client import GrafanaClientError

    try:
        return call(*args)
    except GrafanaClientError as exc:
        if exc.status_code == 404:
            return None
        raise


def _datasources(api: Any, prov: dict, values: Mapping[str, str]) -> list[str]:
    """Every datasource of ``provisioning/datasources/`` (ClickHouse, Prometheus)."""
    done = []
    for name in sorted(n for n in prov if n.startswith("datasources/")):
        for ds in interpolate(prov[name]["datasources"], values):
            if ds["type"] == "grafana-clickhouse-datasource":
                ds["jsonData"]["port"] = int(ds["jsonData"].get("port") or 8123)
            ds.pop("editable", None)
            if _exists(api.datasource.get_datasource_by_uid, ds["uid"]):
                api.datasource.update_datasource_by_uid(ds["uid"], ds)
                done.append(f"datasource {ds['uid']} updated")
            else:
                api.datasource.create_datasource(ds)
                done.append(f"datasource {ds['uid']} created")
    return done


def _contact_point(api: Any, prov: dict, values: Mapping[str, str]) -> list[str]:
    done = []
    for cp in prov["alerting/contact-points.yaml"]["contactPoints"]:
        for recv in cp["receivers"]:
            body = interpolate({"uid": recv["uid"], "name": cp["name"], "type": recv["type"],
                                "settings": recv["settings"],
                                "disableResolveMessage": recv.get("disableResolveMessage", False)}, values)
            existing = {c.get("uid") for c in api.alertingprovisioning.get_contactpoints(name=cp["name"])}
            if body["uid"] in existing:
                api.alertingprovisioning.update_contactpoint(body["uid"], body, disable_provenance=True)
                done.append(f"contact point {body['uid']} updated")
            else:
                api.alertingprovisioning.create_contactpoint(body, disable_provenance=True)
                done.append(f"contact point {body['uid']} created")
    return done


def _rules(api: Any, prov: dict, values: Mapping[str, str]) -> list[str]:
    done = []
    for group in prov["alerting/rules.yaml"]["groups"]:
        for rule in group["rules"]:
            body = interpolate({**rule, "folderUID": FOLDER_UID, "ruleGroup": group["name"],
                                "orgID": group.get("orgId", 1)}, values)
            if _exists(api.alertingprovisioning.get_alertrule, rule["uid"]):
                api.alertingprovisioning.update_alertrule(rule["uid"], body, disable_provenance=True)
                done.append(f"alert rule {rule['uid']} updated")
            else:
                api.alertingprovisioning.create_alertrule(body, disable_provenance=True)
                done.append(f"alert rule {rule['uid']} created")
    return done


def push(url: str, token: str, values: Mapping[str, str] | None = None, timeout_s: float = 10.0,
         api: Any = None) -> list[str]:
    """Push everything to the Grafana at ``url``; return what was done, one line per object."""
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaException

    values = dict(os.environ) if values is None else values
    api = api or GrafanaApi.from_url(url, credential=token, timeout=timeout_s)
    prov = load_provisioning()
    done: list[str] = []
    try:
        if not _exists(api.folder.get_folder, FOLDER_UID):
            api.folder.create_folder(FOLDER_TITLE, uid=FOLDER_UID)
            done.append(f"folder {FOLDER_UID} created")
        done += _datasources(api, prov, values)
        for name, dash in load_dashboards().items():
            # the import envelope (__inputs, __requires) is for Grafana's import form, not the model
            model = {k: v for k, v in dash.items() if not k.startswith("__")}
            api.dashboard.update_dashboard({"dashboard": {**model, "id": None}, "folderUid": FOLDER_UID,
                                            "overwrite": True, "message": "perftracker grafana push"})
            done.append(f"dashboard {dash['uid']} ({name}) pushed")
        done += _contact_point(api, prov, values)
        done += _rules(api, prov, values)
    except GrafanaException as exc:
        raise GrafanaPushError(f"Grafana at {_safe(url)} answered {exc.status_code}: {exc.message}") from None
    except Exception as exc:  # connection refused, DNS, TLS
        if isinstance(exc, PerftrackerError):
            raise
        raise GrafanaPushError(f"cannot push to Grafana at {_safe(url)}: {_unreachable(exc, timeout_s)}") from None
    return done


def _unreachable(exc: Exception, timeout_s: float) -> str:
    """Why a request failed, in a few words instead of the HTTP library's internals (classes are
    matched by name: grafana-client sits on requests or niquests, whose errors share names)."""
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    text = str(exc)
    if "SSLError" in kinds:
        return "the TLS handshake failed (certificate or protocol); check the URL's scheme and CA"
    if "Timeout" in kinds:
        return f"no answer within {timeout_s:g} s"
    if "ConnectionError" in kinds:
        if "NameResolution" in text or "Name or service not known" in text or "nodename nor servname" in text:
            return "its host name does not resolve"
        if "refused" in text:
            return "connection refused (is Grafana listening on that host and port?)"
        return "it cannot be reached"
    if kinds & {"InvalidURL", "MissingSchema", "InvalidSchema"}:
        return "not a valid http(s) URL, e.g. https://grafana.example.com"
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _safe(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)
