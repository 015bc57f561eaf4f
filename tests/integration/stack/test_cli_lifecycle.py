"""`perftracker up` / `down` own exactly their processes; broken set-ups give one clear line."""

from __future__ import annotations

import os

import pytest
from perftracker_ml.deploy.tansu import free_port
from perftracker_ml.schemas.stackfile import pid_alive

from .conftest import Stack, stack_env

pytestmark = pytest.mark.integration


def test_down_leaves_no_process_of_ours(tmp_path):
    s = Stack(tmp_path, stack_env(tmp_path))
    s.cli("up", timeout=180)
    state = s.state()
    pids = [state["broker_pid"], state["sink_pid"], *state["worker_pids"]]
    assert all(pid_alive(p) for p in pids)
    out = s.cli("down").stdout
    assert "worker" in out and "broker" in out
    assert not any(pid_alive(p) for p in pids)
    assert not (tmp_path / "stack.json").exists()
    assert (tmp_path / "logs").is_dir()  # data and logs are kept
    assert "not running" in s.cli("down").stdout  # a second down is harmless
    assert s.cli("status", check=False).returncode == 1


def test_worker_with_unreachable_broker_says_what_to_fix(tmp_path):
    port = free_port()
    s = Stack(tmp_path, stack_env(tmp_path, PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{port}"))
    proc = s.cli("worker", check=False, timeout=60)
    assert proc.returncode == 1  # a runtime failure (issue 15: 2 is for usage errors)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach Kafka" in lines[0] and "bootstrap_servers" in lines[0]
    assert "Traceback" not in proc.stderr


def test_broken_config_file_is_one_line(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[kafka]\npartitions = 'many'\n")
    s = Stack(tmp_path, {**stack_env(tmp_path), "PERFTRACKER_CONFIG": str(cfg)})
    proc = s.cli("up", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"perftracker: error: kafka.partitions: expected int, got 'many' (from file {cfg})"
    assert not (tmp_path / "stack.json").exists()
    assert os.listdir(tmp_path) == ["bad.toml"]
