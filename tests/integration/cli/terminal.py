"""Run the real CLI with its stdout on a pseudo-terminal (where progress displays are drawn)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import tempfile

from ..stack.conftest import Stack

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SPINNER_LINE = re.compile(r"[\u2800-\u28ff] ([^\r\n]*?) \d+:\d\d:\d\d")  # rich: spinner, text, elapsed


def on_terminal(s: Stack, *args: str) -> tuple[int, str, str]:
    """`perftracker ARGS` with stdout on a pseudo-terminal: (exit status, what the terminal
    got with its line ends as written, stderr)."""
    leader, follower = pty.openpty()
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a chatty stderr cannot block it
        proc = subprocess.Popen([sys.executable, "-m", "perftracker_ml.deploy.cli", *args], env={
            **s.env, "TERM": "xterm", "COLUMNS": "160"}, stdout=follower, stderr=err)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the command ended
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        code = proc.wait(timeout=120)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    return code, b"".join(chunks).decode(errors="replace"), stderr


def phases(screen: str) -> list[str]:
    """The texts a spinner display showed, in order, each once."""
    return list(dict.fromkeys(SPINNER_LINE.findall(ANSI.sub("", screen))))
