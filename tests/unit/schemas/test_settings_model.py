"""The servers' settings through pydantic-settings (schemas/settings_model.py): models generated
from the one dataclass declaration, the same values, sources and one-line errors as the
standard-library reader the collectors and the slim install keep."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.redact import redact_configured
from perftracker_ml.schemas.settings import Secret, Settings
from perftracker_ml.schemas.settings_loader import leaves, load_settings_with_sources, read_settings
from perftracker_ml.schemas.settings_model import load_with_sources, settings_model
from pydantic_settings import BaseSettings


def test_the_model_is_generated_from_every_declared_setting_with_its_range():
    model = settings_model()
    assert issubclass(model, BaseSettings)
    for section, where, f, _ in leaves():
        fields = model.model_fields[section].annotation.model_fields if section else model.model_fields  # type: ignore[union-attr]
        bounds = {key: value for m in fields[f.name].metadata for key in ("ge", "gt", "le", "lt")
                  if (value := getattr(m, key, None)) is not None}
        assert bounds == {k: f.metadata[k] for k in ("ge", "gt", "le", "lt") if k in f.metadata}, where


def test_the_server_loads_through_pydantic_settings():
    assert "pydantic_settings" in sys.modules  # imported by this module; the server path imports it too
    settings, sources = load_settings_with_sources(env={"PERFTRACKER_STREAMS_WORKERS": "3"})
    assert type(settings) is Settings and settings.streams.workers == 3
    assert sources["streams.workers"] == "PERFTRACKER_STREAMS_WORKERS"


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# (environment, config file name, its text): each read by both readers
CASES = [
    ({}, None, ""),
    ({"PERFTRACKER_STREAMS_WORKERS": "3", "PERFTRACKER_STREAMS_WINDOW_S": "2", "PERFTRACKER_DATA_DIR": "~/pt",
      "PERFTRACKER_STORE_VERIFY": "no", "PERFTRACKER_COLLECTOR_GC": "", "PERFTRACKER_KAFKA_PROFILE": "",
      "PERFTRACKER_HTTP_TOKEN": "tok-1", "PERFTRACKER_LOG_FILE": "-", "PERFTRACKER_STORE_CA_FILE": "/ca.pem"},
     None, ""),
    ({"PERFTRACKER_STREAMS_WINDOW_S": "7"}, "pt.toml",
     '[kafka]\nbootstrap_servers = "k1:9092"\npartitions = 3\nlibrdkafka = { "socket.keepalive.enable" = true, '
     '"client.id" = "pt" }\n[streams]\nwindow_s = 2.5\nworkers = 2\napp_id = 42\n[alerts]\nwebhook_secret_file = "SECRET"\n'),
    ({}, "pt.yaml", "detection:\n  mad_threshold: 4\n  peer_groups: ~\nlog_level: DEBUG\nstore:\n  verify: false\n"),
    ({"PERFTRACKER_STREAMS_WORKERS": "-3"}, None, ""),
    ({"PERFTRACKER_DETECTION_HANG_FLOOR_S": "nan"}, None, ""),
    ({"PERFTRACKER_STORE_QUERY_PORT": "65536"}, None, ""),
    ({"PERFTRACKER_KAFKA_PARTITIONS": "many"}, None, ""),
    ({"PERFTRACKER_COLLECTOR_GC": "maybe"}, None, ""),
    ({"PERFTRACKER_STORE_PASSWORD_FILE": "/nonexistent/pw"}, None, ""),
    ({}, "pt.toml", "[streams]\nworkers = 0\n"),
    ({}, "pt.toml", "[streams]\nwindow_s = 'fast'\n"),
    ({}, "pt.toml", "[kafka]\nbootstrap = 'x'\n"),
    ({}, "pt.toml", "[kafka]\nsasl_password = 'plain'\n"),
    ({}, "pt.toml", "kafka = 3\n"),
    ({}, "pt.toml", "[collector]\ngc = false\n"),
    ({}, "pt.toml", "[kafka\n"),
]


@pytest.mark.parametrize(("env", "name", "text"), CASES)
def test_the_server_and_the_standard_library_reader_agree(tmp_path, env, name, text):
    secret = _file(tmp_path, "secret", "s3cr3t-1\n")
    path = _file(tmp_path, name, text.replace("SECRET", str(secret))) if name else None
    results = []
    for load in (load_with_sources, read_settings):
        try:
            results.append(load(path, env))
        except ConfigError as exc:
            results.append(str(exc))
    assert results[0] == results[1]


def test_out_of_range_and_type_errors_are_one_line_naming_setting_source_and_range(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_with_sources(env={"PERFTRACKER_STREAMS_WORKERS": "-3"})
    assert str(err.value) == ("streams.workers = -3 (from PERFTRACKER_STREAMS_WORKERS) is out of range; "
                              "allowed: >= 1")
    path = _file(tmp_path, "pt.toml", "[streams]\nworkers = 2.5\n")
    with pytest.raises(ConfigError) as err:
        load_with_sources(path, env={"PERFTRACKER_KAFKA_PARTITIONS": "0"})
    assert str(err.value) == ("kafka.partitions = 0 (from PERFTRACKER_KAFKA_PARTITIONS) is out of range; "
                              "allowed: >= 1 (and 1 more)")
    with pytest.raises(ConfigError, match=f"streams.workers: expected int, got 2.5 \\(from file {path}\\)$"):
        load_with_sources(path, env={})


def test_secrets_are_secret_objects_remembered_for_masking(tmp_path):
    secret = _file(tmp_path, "pw", "pw-from-file-9\n")
    settings, sources = load_with_sources(env={"PERFTRACKER_STORE_PASSWORD_FILE": str(secret),
                                               "PERFTRACKER_KAFKA_SASL_PASSWORD": "pw-from-env-9",
                                               "PERFTRACKER_KAFKA_SASL_PASSWORD_FILE": str(secret)})
    assert settings.store.password == Secret("pw-from-file-9")
    assert settings.kafka.sasl_password == Secret("pw-from-env-9")  # the variable wins over its *_FILE
    assert sources["store.password"] == "PERFTRACKER_STORE_PASSWORD_FILE"
    assert sources["kafka.sasl_password"] == "PERFTRACKER_KAFKA_SASL_PASSWORD"
    assert "pw-" not in repr(settings)
    assert redact_configured("pw-from-file-9 and pw-from-env-9") == "*** and ***"


@pytest.mark.parametrize("installed", ["no pydantic-settings", "pydantic 1"])
def test_the_slim_install_reads_the_settings_without_pydantic(monkeypatch, installed):
    monkeypatch.delitem(sys.modules, "perftracker_ml.schemas.settings_model")
    if installed == "pydantic 1":  # a training image's own pydantic, without pydantic 2's validators
        monkeypatch.setitem(sys.modules, "pydantic", types.ModuleType("pydantic"))
    monkeypatch.setitem(sys.modules, "pydantic_settings", None)  # as if not installed
    settings, sources = load_settings_with_sources(env={"PERFTRACKER_STREAMS_WORKERS": "4"})
    assert settings.streams.workers == 4 and sources["streams.workers"] == "PERFTRACKER_STREAMS_WORKERS"
    with pytest.raises(ConfigError, match=r"streams.workers = 0 \(from PERFTRACKER_STREAMS_WORKERS\)"):
        load_settings_with_sources(env={"PERFTRACKER_STREAMS_WORKERS": "0"})
