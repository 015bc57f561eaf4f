"""The command line's error path and its listings (no stack is started)."""

from __future__ import annotations

import os

import pytest
from perftracker.deploy.cli import main


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.startswith("PERFTRACKER_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no ./perftracker.toml
    return monkeypatch


def run(args: list[str]) -> int:
    """The exit status of `perftracker ARGS`."""
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_bad_peer_groups_takes_the_normal_error_path(clean_env, tmp_path, capsys):
    clean_env.setenv("PERFTRACKER_DETECTION_PEER_GROUPS", "a=0-3;broken")
    assert run(["--data-dir", str(tmp_path), "worker"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perftracker: error: peer_groups: 'broken'") and "Traceback" not in err


def test_config_lists_every_setting_collectors_included(clean_env, capsys):
    assert run(["config"]) == 0
    out = capsys.readouterr().out
    for name in ("PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS", "PERFTRACKER_DETECTION_PEER_GROUPS",
                 "PERFTRACKER_COLLECTOR_ENABLED", "PERFTRACKER_COLLECTOR_NVML_INTERVAL_S"):
        assert name in out


def test_demo_fault_is_one_of_the_known_faults(clean_env, capsys):
    assert run(["demo", "--fault", "slow-disk"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--fault'" in err and "gc-storm" in err
