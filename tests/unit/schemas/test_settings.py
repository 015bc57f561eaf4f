"""Settings: file + environment, precedence, secrets, and clear errors."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.settings import CollectorSettings, Secret
from perftracker_ml.schemas.settings_loader import describe_settings, load_settings


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_without_file_or_env():
    s = load_settings(env={})
    assert s.streams.window_s == 5.0 and s.kafka.partitions == 8 and s.detection.persist_windows == 2


def test_toml_file_then_env_wins(tmp_path):
    path = write(tmp_path, "pt.toml", '[kafka]\nbootstrap_servers = "k1:9092"\n[streams]\nwindow_s = 2.5\n')
    s = load_settings(path, env={"PERFTRACKER_STREAMS_WINDOW_S": "7"})
    assert s.kafka.bootstrap_servers == "k1:9092" and s.streams.window_s == 7.0


def test_yaml_file(tmp_path):
    path = write(tmp_path, "pt.yaml", "detection:\n  mad_threshold: 4\nlog_level: DEBUG\n")
    s = load_settings(path, env={})
    assert s.detection.mad_threshold == 4.0 and s.log_level == "DEBUG"


def test_config_path_from_env(tmp_path):
    path = write(tmp_path, "x.toml", "[kafka]\npartitions = 3\n")
    assert load_settings(env={"PERFTRACKER_CONFIG": str(path)}).kafka.partitions == 3


def test_secret_from_env_and_file_never_printed(tmp_path):
    secret_file = write(tmp_path, "pw", "s3cr3t\n")
    path = write(tmp_path, "pt.toml", f'[kafka]\nsasl_password_file = "{secret_file}"\nsasl_mechanism = "PLAIN"\n'
                                    'security_protocol = "SASL_SSL"\nsasl_username = "u"\n')
    s = load_settings(path, env={})
    assert s.kafka.sasl_password.reveal() == "s3cr3t"
    assert "s3cr3t" not in repr(s) and "s3cr3t" not in str(s.kafka.sasl_password)
    assert s.kafka.client_conf()["sasl.password"] == "s3cr3t"
    s2 = load_settings(env={"PERFTRACKER_ALERTS_WEBHOOK_SECRET": "k"})
    assert s2.alerts.webhook_secret == Secret("k")


def test_secret_value_in_file_is_refused(tmp_path):
    path = write(tmp_path, "pt.toml", '[kafka]\nsasl_password = "plain"\n')
    with pytest.raises(ConfigError, match="is a secret") as err:
        load_settings(path, env={})
    assert "plain" not in str(err.value)


@pytest.mark.parametrize("text, fragment", [
    ("[kafka\n", "not valid TOML"),
    ("[kafka]\nbootstrap = 'x'\n", "unknown setting kafka.bootstrap"),
    ("[streams]\nwindow_s = 'fast'\n", "streams.window_s: expected float"),
    ("kafka = 3\n", r"\[kafka\] must be a table"),
])
def test_broken_config_names_what_to_fix(tmp_path, text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_settings(write(tmp_path, "pt.toml", text), env={})


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "nope.toml", env={})


def test_bad_env_value_names_the_setting():
    with pytest.raises(ConfigError, match="kafka.partitions: expected int"):
        load_settings(env={"PERFTRACKER_KAFKA_PARTITIONS": "many"})


def test_collector_section_comes_from_its_env_variables():
    s = load_settings(env={"PERFTRACKER_COLLECTOR_FLUSH_INTERVAL_S": "2", "PERFTRACKER_COLLECTOR_GC": "0"})
    assert s.collector.flush_interval_s == 2.0 and s.collector.gc is False and s.collector.comms is True


def test_collector_section_in_the_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"\[collector\] cannot be set in the config file"):
        load_settings(write(tmp_path, "pt.toml", "[collector]\ngc = false\n"), env={})


def test_described_settings_cover_every_section_collectors_included():
    names = {row[0] for row in describe_settings()}
    assert {"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS", "PERFTRACKER_DETECTION_PEER_GROUPS",
            "PERFTRACKER_COLLECTOR_FLUSH_INTERVAL_S", "PERFTRACKER_COLLECTOR_LOG_EVERY_S"} <= names
    assert len({n for n in names if n.startswith("PERFTRACKER_COLLECTOR_")}) == len(fields(CollectorSettings))
