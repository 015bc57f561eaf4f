"""Secrets out of printable text: URL passwords, and whole occurrences of known secret values.

Two rules, applied to any text that may reach a log, an error or the CLI:

* **Structure.** In every ``scheme://user:password@host`` the password part is
  replaced by ``***``, whatever it is.
* **Value boundaries.** A known secret value (and its percent-encoded form, as it
  appears inside URLs) is replaced where it stands as a value of its own: an
  edge of the secret that is a word character (letter, digit, ``_``) must not
  be continued by another word character in the text. A password ``p`` thus
  masks ``user:p@host`` and ``password=p``, never the ``p`` of ``http://``.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import traceback
from typing import Any
from urllib.parse import quote, unquote, urlsplit

MASK = "***"
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^@/\s]*(?=@)")


def redact_url_passwords(text: str) -> str:
    """``scheme://user:secret@host`` -> ``scheme://user:***@host`` everywhere in ``text``."""
    return _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)


def _value_pattern(value: str) -> re.Pattern[str]:
    before = r"(?<!\w)" if re.match(r"\w", value) else ""
    after = r"(?!\w)" if re.search(r"\w$", value) else ""
    return re.compile(before + re.escape(value) + after)


def redact(text: str, *secrets: str) -> str:
    """``text`` with URL passwords and each whole occurrence of ``secrets`` replaced by ``***``."""
    text = redact_url_passwords(text)
    forms = {form for secret in secrets if secret for form in (secret, quote(secret, safe=""))}
    for form in sorted(forms, key=len, reverse=True):  # the longer form first: it may contain the other
        text = _value_pattern(form).sub(MASK, text)
    return text


# -- the configured secrets: every Secret setting loaded in this process ---------------------
_CONFIGURED: set[str] = set()


def remember_secret(value: str) -> None:
    """Mask ``value`` (and, for a URL, its password) in everything :func:`redact_configured` sees."""
    if not value:
        return
    _CONFIGURED.add(value)
    try:
        password = urlsplit(value).password if "://" in value else None
    except ValueError:
        password = None
    if password:
        _CONFIGURED.add(unquote(password))


def configured_secrets() -> tuple[str, ...]:
    return tuple(_CONFIGURED)


def redact_configured(text: str) -> str:
    """``text`` with URL passwords and every configured secret masked."""
    return redact(text, *_CONFIGURED)


def _redact_record(record: logging.LogRecord) -> logging.LogRecord:
    try:
        message = record.getMessage()
    except Exception:  # arguments that do not format: left to the handler to report
        return record
    record.msg, record.args = redact_configured(message), ()
    if record.exc_info and record.exc_info[1] is not None:
        record.exc_text = redact_configured("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
    return record


def reset_redaction() -> None:
    """Forget the configured secrets and restore logging and the exception hooks (for tests)."""
    _CONFIGURED.clear()
    factory = logging.getLogRecordFactory()
    if getattr(factory, "redacting", False):
        logging.setLogRecordFactory(factory.previous)  # type: ignore[attr-defined]
        sys.excepthook, threading.excepthook = sys.__excepthook__, threading.__excepthook__


def install_redaction() -> None:
    """From now on, every log record of this process (message and traceback, any logger) and every
    uncaught exception's traceback (main thread and others) is redacted; idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return _redact_record(previous(*args, **kwargs))

    factory.redacting, factory.previous = True, previous  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
    sys.excepthook = _print_redacted
    threading.excepthook = lambda a: _print_redacted(a.exc_type, a.exc_value, a.exc_traceback, a.thread)


def _print_redacted(exc_type: Any, value: Any, tb: Any, thread: threading.Thread | None = None) -> None:
    if exc_type is SystemExit:
        return
    where = f"Exception in thread {thread.name}:\n" if thread is not None else ""
    sys.stderr.write(where + redact_configured("".join(traceback.format_exception(exc_type, value, tb))))
