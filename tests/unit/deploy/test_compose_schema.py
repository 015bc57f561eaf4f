"""deploy/compose passes the Compose specification's JSON schema, and its variables
resolve as `docker compose config` resolves them: required ones stop it when empty.

The schema is the one check-jsonschema (dev extra) vendors (``vendor.compose-spec``),
so this runs offline.
"""

from __future__ import annotations

import pytest

from .manifests import (
    MissingVariable,
    compose,
    env_example,
    filled_env,
    interpolate,
    required_compose_variables,
)

jsonschema = pytest.importorskip("jsonschema")
builtin_schemas = pytest.importorskip(
    "check_jsonschema.builtin_schemas", reason="check-jsonschema missing: pip install -e '.[dev]'")


def _errors(doc: dict) -> list[str]:
    schema = builtin_schemas.get_builtin_schema("vendor.compose-spec")
    validator = jsonschema.Draft7Validator(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_file_passes_the_compose_schema():
    assert _errors(compose()) == []


def test_compose_file_passes_the_compose_schema_once_interpolated():
    assert _errors(interpolate(compose(), filled_env())) == []


def test_schema_check_catches_a_misspelt_key():
    doc = compose()
    doc["services"]["sink"]["helthcheck"] = doc["services"]["sink"].pop("healthcheck")
    assert any("helthcheck" in e for e in _errors(doc))


def test_every_required_variable_is_in_env_example():
    assert {"KAFKA_EXTERNAL_HOST", "CLICKHOUSE_PASSWORD", "GRAFANA_ADMIN_PASSWORD",
            "PERFTRACKER_GRAFANA_WEBHOOK_URL"} <= required_compose_variables()
    assert required_compose_variables() <= set(env_example())


def test_compose_refuses_to_start_without_the_external_kafka_address():
    env = filled_env()
    env["KAFKA_EXTERNAL_HOST"] = ""
    with pytest.raises(MissingVariable, match="KAFKA_EXTERNAL_HOST"):
        interpolate(compose(), env)


def test_env_example_as_shipped_is_refused_until_filled_in():
    with pytest.raises(MissingVariable):
        interpolate(compose(), env_example())
