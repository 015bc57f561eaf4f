"""Settings: declared ranges, where each value came from, unknown PERFTRACKER_* names, and the
collectors' lenient reading (warn, keep the default, never raise)."""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.settings import CollectorSettings, Settings
from perftracker_ml.schemas.settings_loader import (
    NOT_SETTINGS,
    allowed_range,
    check_env_names,
    load_section,
    load_settings,
    load_settings_with_sources,
    setting_rows,
    unknown_env_problems,
)


def _numeric_fields(cls: type = Settings, section: str = "") -> list[tuple[str, object]]:
    out = []
    for f in fields(cls):  # type: ignore[arg-type]
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            out += _numeric_fields(type(default), f.name)
        elif f.type in ("int", "float", int, float):
            out.append((f"{section}.{f.name}" if section else f.name, f))
    return out


def test_every_numeric_setting_declares_a_range_its_default_satisfies():
    numeric = _numeric_fields()
    assert len(numeric) > 40
    for where, f in numeric:
        assert allowed_range(f.metadata), f"{where} declares no range"  # type: ignore[attr-defined]
    load_settings(env={})  # every default inside its own range


@pytest.mark.parametrize(("var", "value", "said"), [
    ("PERFTRACKER_STREAMS_WORKERS", "-3", "streams.workers = -3 (from PERFTRACKER_STREAMS_WORKERS) "
                                          "is out of range; allowed: >= 1"),
    ("PERFTRACKER_STREAMS_WINDOW_S", "-1", "streams.window_s = -1.0 (from PERFTRACKER_STREAMS_WINDOW_S) "
                                           "is out of range; allowed: > 0"),
    ("PERFTRACKER_KAFKA_PARTITIONS", "0", "kafka.partitions = 0 (from PERFTRACKER_KAFKA_PARTITIONS) "
                                          "is out of range; allowed: >= 1"),
    ("PERFTRACKER_STORE_QUERY_PORT", "65536", "allowed: 0..65535"),
    ("PERFTRACKER_DETECTION_HANG_FLOOR_S", "nan", "detection.hang_floor_s = nan"),
    ("PERFTRACKER_COLLECTOR_FLUSH_INTERVAL_S", "0", "collector.flush_interval_s = 0.0"),
])
def test_out_of_range_values_name_setting_value_source_and_range(var, value, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_settings(env={var: value})


def test_out_of_range_file_value_names_the_file(tmp_path: Path):
    path = tmp_path / "pt.toml"
    path.write_text("[streams]\nworkers = 0\n")
    with pytest.raises(ConfigError, match=re.escape(f"streams.workers = 0 (from file {path} (streams.workers))")):
        load_settings(path, env={})


def test_bounds_themselves_are_accepted():
    s = load_settings(env={"PERFTRACKER_STREAMS_WORKERS": "1", "PERFTRACKER_STORE_QUERY_PORT": "65535",
                           "PERFTRACKER_STREAMS_WINDOW_GRACE_S": "0"})
    assert (s.streams.workers, s.store.query_port, s.streams.window_grace_s) == (1, 65535, 0.0)


def test_sources_say_default_file_or_environment(tmp_path: Path):
    path = tmp_path / "pt.yaml"
    path.write_text("streams:\n  window_s: 2.5\n")
    secret = tmp_path / "pw"
    secret.write_text("pw-7\n")
    settings, sources = load_settings_with_sources(path, env={
        "PERFTRACKER_STREAMS_WORKERS": "3", "PERFTRACKER_STORE_PASSWORD_FILE": str(secret)})
    assert sources["streams.window_s"] == f"file {path} (streams.window_s)"
    assert sources["streams.workers"] == "PERFTRACKER_STREAMS_WORKERS"
    assert sources["store.password"] == "PERFTRACKER_STORE_PASSWORD_FILE"
    assert sources["kafka.partitions"] == "default"
    rows = {r["setting"]: r for r in setting_rows(settings, sources)}
    assert rows["streams.workers"]["value"] == "3" and rows["streams.window_s"]["value"] == "2.5"
    assert rows["store.password"]["value"] == "********" and "pw-7" not in repr(rows)
    assert rows["store.verify"]["value"] == "true" and rows["data_dir"]["value"] == ".perftracker"
    assert rows["streams.workers"]["range"] == ">= 1" and rows["streams.web_port"]["range"] == "0..65535"


def test_misspelt_variable_names_the_closest_setting():
    assert unknown_env_problems({"PERFTRACKER_STREAMS_WORKRS": "2", "HOME": "/"}) == [
        "unknown environment variable PERFTRACKER_STREAMS_WORKRS; did you mean PERFTRACKER_STREAMS_WORKERS?"]
    with pytest.raises(ConfigError, match="did you mean PERFTRACKER_STREAMS_WORKERS"):
        check_env_names({"PERFTRACKER_STREAMS_WORKRS": "2"})


def test_settings_secret_files_and_known_non_settings_are_not_unknown():
    env = dict.fromkeys(NOT_SETTINGS, "x") | {
        "PERFTRACKER_STREAMS_WORKERS": "2", "PERFTRACKER_STORE_PASSWORD_FILE": "/run/secrets/pw",
        "PERFTRACKER_DEMO_FAULT": "none", "PERFTRACKER_COLLECTOR_ATTACH": "1"}
    assert unknown_env_problems(env) == []
    check_env_names(env)


def test_lenient_reading_warns_once_per_problem_and_keeps_the_default():
    said: list[str] = []
    collector = load_section(CollectorSettings, "collector", {
        "PERFTRACKER_COLLECTOR_FLUSH_INTERVAL_S": "-1", "PERFTRACKER_COLLECTOR_GC": "maybe",
        "PERFTRACKER_COLLECTOR_STACK_HZ": "10"}, warn=said.append)
    assert collector.flush_interval_s == 1.0 and collector.gc is True and collector.stack_hz == 10.0
    assert said == [
        "collector.flush_interval_s = -1.0 (from PERFTRACKER_COLLECTOR_FLUSH_INTERVAL_S) is out of range; "
        "allowed: > 0; using the default, 1.0",
        "collector.gc: expected true/false, got 'maybe' (from PERFTRACKER_COLLECTOR_GC); using the default, true"]


def test_a_training_rank_warns_once_and_keeps_defaults(caplog):
    from perftracker_ml.collectors.config import load_attach_settings

    env = {"PERFTRACKER_COLLECTOR_BUFFER_MB": "-5", "PERFTRACKER_COLLECTOR_FLUSH_INTERVALS": "2",
           "PERFTRACKER_KAFKA_PARTITIONS": "0", "PERFTRACKER_COLLECTOR_GC": "false"}
    with caplog.at_level("WARNING", logger="perftracker_ml.collectors"):
        first = load_attach_settings(env)
        again = load_attach_settings(env)
    assert first == again
    assert first.collector.buffer_mb == 32.0 and first.kafka.partitions == 8 and first.collector.gc is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines  # one line per problem, however often the settings are read
    assert any("collector.buffer_mb = -5.0" in line and "using the default, 32.0" in line for line in lines)
    assert any("did you mean PERFTRACKER_COLLECTOR_FLUSH_INTERVAL_S" in line for line in lines)


def test_the_collectors_settings_pull_in_neither_pydantic_nor_rich():
    import subprocess
    import sys

    code = ("import sys; import perftracker_ml.collectors.config as c; c.load_attach_settings({}); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_settings', 'rich')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
