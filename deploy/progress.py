"""Progress of the long commands, on a terminal only: `import-traces` (files parsed, events read,
then detection and storing) and `demo` (stack up, training, waiting for the diagnosis).

Shown with rich (a dependency of the server extra, as these commands are; the collectors never
import it) when stdout is a terminal and the command was not asked for ``--json``; otherwise
:func:`progress_for` gives a :class:`Progress` that only prints the lines it is handed, so piped
output and JSON stay exactly what they were. The live display is transient: it disappears when
the command ends, leaving the command's own lines. Lines printed while it runs (:meth:`echo`)
go above it.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any, TextIO

import click

from .output import printable


class Progress:
    """No display: lines are printed as they come (the piped, ``--json`` and dumb-terminal case)."""

    shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def phase(self, text: str) -> None:
        """What the command is doing now (replaces the previous phase)."""

    def trace_read(self, source: str, events: int) -> None:
        """One trace file parsed, with its ``events`` (0: the file was skipped)."""

    def echo(self, line: str) -> None:
        """A line of the command's own output (names from user code made inert)."""
        click.echo(printable(line))


class RichProgress(Progress):
    """A spinner with the phase, files and events so far, and the time elapsed."""

    shown = True

    def __init__(self, stream: TextIO):
        from rich.console import Console
        from rich.progress import Progress as Bar
        from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = Console(file=stream, highlight=False)
        self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=self.console, transient=True, redirect_stdout=False, redirect_stderr=False)
        self._task = self._bar.add_task("starting", total=None)
        self.files = 0
        self.events = 0
        self.skipped = 0
        self._phase = "starting"

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._bar.stop()

    def _show(self) -> None:
        text = printable(self._phase)
        if self.files or self.skipped:
            skipped = f", {self.skipped} skipped" if self.skipped else ""
            text += f" - {self.files} file(s) parsed{skipped}, {self.events:,} events"
        self._bar.update(self._task, description=text.replace("[", "\\["))

    def phase(self, text: str) -> None:
        self._phase = text
        self._show()

    def trace_read(self, source: str, events: int) -> None:
        if events:
            self.files += 1
            self.events += events
        else:
            self.skipped += 1
        self._phase = f"parsing traces: {source.rsplit('/', 1)[-1]}"
        self._show()

    def echo(self, line: str) -> None:
        self.console.print(printable(line), markup=False, highlight=False, soft_wrap=True)


def wants_display(as_json: bool = False, stream: Any = None) -> bool:
    """A live display only on a terminal that can draw it, never around JSON output."""
    stream = sys.stdout if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        tty = False
    return tty and not as_json and os.environ.get("TERM", "") != "dumb"


def progress_for(as_json: bool = False, stream: TextIO | None = None) -> Progress:
    """The progress display the command's stdout allows (see :func:`wants_display`)."""
    stream = sys.stdout if stream is None else stream
    return RichProgress(stream) if wants_display(as_json, stream) else Progress()
