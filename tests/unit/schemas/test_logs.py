"""One logging set-up: levels, text or JSON lines, the log file in the data dir, written once."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.logs import log_path, setup_logging
from perftracker_ml.schemas.settings import Settings


@pytest.fixture(autouse=True)
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
        h.close()
    root.setLevel(level)


def settings(tmp_path: Path, **kw: str) -> Settings:
    return dataclasses.replace(Settings(), data_dir=tmp_path, **kw)


def test_text_lines_at_the_level_in_the_component_file(tmp_path: Path):
    path = setup_logging(settings(tmp_path, log_level="WARNING"), "sink")
    assert path == tmp_path / "logs" / "sink.log"
    logging.getLogger("perftracker_ml.sinks").info("not at this level")
    logging.getLogger("perftracker_ml.sinks").warning("store not ready (%s)", "down")
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and " WARNING perftracker_ml.sinks [" in lines[0] and lines[0].endswith("store not ready (down)")


def test_json_lines_carry_level_logger_component_and_the_traceback(tmp_path: Path):
    path = setup_logging(settings(tmp_path, log_format="json", log_level="DEBUG"), "worker")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("perftracker_ml.streams").exception("error in %s", "summarize")
    (entry,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert entry["level"] == "ERROR" and entry["logger"] == "perftracker_ml.streams"
    assert entry["component"] == "worker" and entry["message"] == "error in summarize"
    assert "RuntimeError: boom" in entry["exc_info"] and entry["time"].endswith("+00:00")


def test_calling_again_replaces_its_handlers(tmp_path: Path):
    setup_logging(settings(tmp_path), "sink")
    setup_logging(settings(tmp_path), "sink")
    logging.getLogger("perftracker").warning("once")
    assert (tmp_path / "logs" / "sink.log").read_text().count("once") == 1


def test_log_file_setting_and_stderr_only(tmp_path: Path):
    assert log_path(settings(tmp_path, log_file=str(tmp_path / "w.log")), "worker") == tmp_path / "w.log"
    assert log_path(settings(tmp_path, log_file="-"), "worker") is None
    assert setup_logging(settings(tmp_path), "cli", to_file=False) is None
    assert not (tmp_path / "logs").exists()


def test_bad_level_or_format_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="log_format"):
        setup_logging(settings(tmp_path, log_format="xml"), "sink")
    with pytest.raises(ConfigError, match="log_level"):
        setup_logging(settings(tmp_path, log_level="LOUD"), "sink")


def test_a_file_that_already_is_stderr_is_written_once(tmp_path: Path):
    """`perftracker up` sends a process's output to its log file: no line twice."""
    log = tmp_path / "logs" / "sink.log"
    log.parent.mkdir()
    code = ("import dataclasses, logging, pathlib\n"
            "from perftracker_ml.schemas.logs import setup_logging\n"
            "from perftracker_ml.schemas.settings import Settings\n"
            f"setup_logging(dataclasses.replace(Settings(), data_dir=pathlib.Path({str(tmp_path)!r})), 'sink')\n"
            "logging.getLogger('perftracker').info('hello once')\n")
    with open(log, "ab") as out:
        subprocess.run([sys.executable, "-c", code], stderr=out, check=True, timeout=60)
    assert log.read_text().count("hello once") == 1
