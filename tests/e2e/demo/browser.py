"""Open a page in Debian's headless chromium: screenshot, rendered DOM, and console messages.

Console messages are read from chromium's own log (``--enable-logging=stderr``
prints each as an ``INFO:CONSOLE`` line without its level); the report has no
scripts, so any console message at all counts as a problem.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--window-size=1400,2000"]
CONSOLE = re.compile(r":CONSOLE[^\]]*\]\s*(.*)")


@dataclass(frozen=True)
class PageResult:
    console: tuple[str, ...]
    dom: str
    screenshot: Path


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="pt-chromium-") as profile:
        return subprocess.run([chromium() or "chromium", *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout_s)


def open_page(page: Path, screenshot: Path, timeout_s: float = 60) -> PageResult:
    url = page.resolve().as_uri()
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    shot = _run([f"--screenshot={screenshot.resolve()}", url], timeout_s)
    dump = _run(["--dump-dom", url], timeout_s)
    console = [m.group(1) for line in (shot.stderr + dump.stderr).splitlines()
               if (m := CONSOLE.search(line))]
    return PageResult(tuple(console), dump.stdout, screenshot)
