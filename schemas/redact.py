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

import re
from urllib.parse import quote

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
