"""Settings: file + environment, precedence, secrets, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from perftracker.deploy.config import ConfigError, Secret, load_settings


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
    path = write(tmp_path, "pt.toml", f'[kafka]\nsasl_password_file = "{secret_file}"\nsasl_mechanism = "PLAIN"\n')
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
