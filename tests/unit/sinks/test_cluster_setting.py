"""store.cluster reaches the migrations (the DDL it makes is tested in tests/unit/deploy)."""

from __future__ import annotations

from perftracker_ml.schemas.settings_loader import load_settings


def test_cluster_setting_is_read_from_env_and_defaults_to_one_server() -> None:
    assert load_settings(env={}).store.cluster == ""
    assert load_settings(env={"PERFTRACKER_STORE_CLUSTER": "perftracker"}).store.cluster == "perftracker"
