"""Open a page in Debian's headless chromium: screenshot, rendered DOM, and console messages.

Console messages are read from chromium's own log (``--enable-logging=stderr``
prints each as an ``INFO:CONSOLE`` line without its level); the report has no
scripts, so any console message at all counts as a problem.

A *probe* measures the laid-out page in the browser: the test's own script, run on a
copy of the page (the report itself stays script-free), returns a JSON value that it
leaves in the ``data-probe`` attribute of ``<html>``, which ``--dump-dom`` brings back.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--window-size=1400,2000"]
CONSOLE = re.compile(r":CONSOLE[^\]]*\]\s*(.*)")
PROBE_ATTR = re.compile(r'<html[^>]*\sdata-probe="([^"]*)"')

# Every <svg>'s <text> elements against the svg's own box, and the page's horizontal scroll.
LAYOUT_PROBE = """
const out = {scrollWidth: document.documentElement.scrollWidth,
             clientWidth: document.documentElement.clientWidth, svgs: 0, texts: 0, outside: []};
for (const svg of document.querySelectorAll("svg")) {
  out.svgs += 1;
  const box = svg.getBoundingClientRect();
  for (const t of svg.querySelectorAll("text")) {
    out.texts += 1;
    const r = t.getBoundingClientRect();
    if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
      out.outside.push({text: t.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom,
                        box: [box.left, box.right, box.top, box.bottom]});
  }
}
return out;
"""


@dataclass(frozen=True)
class PageResult:
    console: tuple[str, ...]
    dom: str
    screenshot: Path
    probe: Any = None  # what the probe script returned (None without one)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="pt-chromium-") as profile:
        return subprocess.run([chromium() or "chromium", *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout_s)


def _with_probe(page: Path, script: str, where: Path) -> Path:
    """A copy of ``page`` whose last element runs ``script`` (a function body; the page above it is
    parsed and its inline styles apply) and stores its JSON result in ``<html data-probe>``;
    errors go to the console like any other."""
    run = ("<script>document.documentElement.setAttribute('data-probe', "
           f"JSON.stringify((() => {{{script}}})()));</script>")
    html = page.read_text(encoding="utf-8")
    cut = html.rfind("</body>")
    copy = where / f"{page.stem}.probe.html"
    copy.write_text(html[:cut] + run + html[cut:] if cut >= 0 else html + run, encoding="utf-8")
    return copy


def open_page(page: Path, screenshot: Path, timeout_s: float = 60, probe: str | None = None) -> PageResult:
    """Screenshot, DOM and console of ``page``; with ``probe`` (a JavaScript function body), both
    runs open a copy that also runs it (beside ``screenshot``) and ``PageResult.probe`` is its result."""
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    if probe is not None:
        page = _with_probe(page, probe, screenshot.parent)
    url = page.resolve().as_uri()
    shot = _run([f"--screenshot={screenshot.resolve()}", url], timeout_s)
    dump = _run(["--dump-dom", url], timeout_s)
    console = [m.group(1) for line in (shot.stderr + dump.stderr).splitlines()
               if (m := CONSOLE.search(line))]
    found = PROBE_ATTR.search(dump.stdout) if probe is not None else None
    return PageResult(tuple(console), dump.stdout, screenshot,
                      json.loads(unescape(found.group(1))) if found else None)
