"""One logging set-up for the worker, the sink and the CLI: levels, text or JSON, a log file.

:func:`setup_logging` (called from each command's ``main``, never at import)
configures the root logger: a handler on standard error and, for a server
process, one on its log file (``log_file``, default
``<data_dir>/logs/<component>.log``), both at ``log_level``, formatted as
``log_format`` says: ``text`` (one line: time, level, logger, pid, message)
or ``json`` (one object per line: ``time``, ``level``, ``logger``,
``component``, ``pid``, ``message``, ``exc_info`` when there is one).

When standard error already is that file (``perftracker up`` sends a
process's output there, so tracebacks printed before logging starts are kept)
it is written once. The file handler reopens the file when it was moved, so
logrotate may rotate it. Calling it again replaces the handlers it installed.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .settings import Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
FORMATS = ("text", "json")
STDERR_ONLY = "-"


class JsonFormatter(logging.Formatter):
    """One JSON object per line (strict JSON: no NaN; non-ASCII kept)."""

    def __init__(self, component: str):
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "component": self.component,
            "pid": record.process, "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class _Ours:
    """Marks the handlers :func:`setup_logging` installed (replaced on the next call)."""


class _StderrHandler(logging.StreamHandler, _Ours):
    """Writes to the ``sys.stderr`` of the moment (as logging's last resort does), so a
    replaced stream (a test runner's capture) is never written after it was closed."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr


class _FileHandler(logging.handlers.WatchedFileHandler, _Ours):
    pass


def log_path(settings: Settings, component: str) -> Path | None:
    """The log file of ``component``; None when it logs to standard error only."""
    if settings.log_file == STDERR_ONLY:
        return None
    if settings.log_file:
        return Path(settings.log_file)
    return settings.data_dir / "logs" / f"{component}.log"


def _is_stderr(path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(sys.stderr.fileno()), os.stat(path))
    except (OSError, ValueError, AttributeError):  # no such file, or stderr is no real file
        return False


def setup_logging(settings: Settings, component: str, to_file: bool = True) -> Path | None:
    """Configure the root logger for ``component`` (worker, sink, cli); return the log file
    written (None: standard error only). Raises ConfigError on a bad level or format."""
    level = logging.getLevelName(settings.log_level.upper())
    if not isinstance(level, int):
        raise ConfigError(f"log_level {settings.log_level!r}: use DEBUG, INFO, WARNING or ERROR")
    if settings.log_format not in FORMATS:
        raise ConfigError(f"log_format {settings.log_format!r}: use one of {', '.join(FORMATS)}")
    formatter = JsonFormatter(component) if settings.log_format == "json" else logging.Formatter(TEXT_FORMAT)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Ours)]:
        root.removeHandler(old)
        old.close()
    path = log_path(settings, component) if to_file else None
    handlers: list[logging.Handler] = [_StderrHandler()]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not _is_stderr(path):  # else standard error goes to that file already
            handlers.append(_FileHandler(path, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.setLevel(level)
        root.addHandler(handler)
    root.setLevel(level)
    return path
