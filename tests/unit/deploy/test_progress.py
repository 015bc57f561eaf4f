"""The progress display of `import-traces` and `demo`: drawn on a terminal only, never with --json;
and where `import-traces` stores a job older than the store keeps."""

from __future__ import annotations

import io
import os

from perftracker_ml.deploy import progress as progress_mod
from perftracker_ml.deploy.cli import main
from perftracker_ml.deploy.progress import Progress, RichProgress, progress_for, wants_display
from perftracker_ml.deploy.trace_import import DAY_MS, store_time_ms
from perftracker_ml.schemas.settings import Settings, StoreSettings


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_display_only_on_a_terminal_and_never_for_json(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    assert wants_display(False, Terminal()) and isinstance(progress_for(False, Terminal()), RichProgress)
    assert not wants_display(True, Terminal()) and type(progress_for(True, Terminal())) is Progress
    assert not wants_display(False, io.StringIO())  # piped
    monkeypatch.setenv("TERM", "dumb")
    assert not wants_display(False, Terminal())


def test_rich_display_shows_phase_files_and_events_and_prints_lines_above(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    screen = Terminal()
    with progress_for(False, screen) as progress:
        progress.trace_read("/t/rank0.pt.trace.json", 1200)
        progress.trace_read("/t/broken.json", 0)
        progress.phase("detecting over 1 rank(s)")
        progress.echo("a line\nwith a break")
    out = screen.getvalue()
    assert "detecting over 1 rank(s) - 1 file(s) parsed, 1 skipped, 1,200 events" in out
    assert "a line\\nwith a break" in out  # names from user code stay inert here too


def test_demo_reports_its_phases_to_the_display(monkeypatch, tmp_path, capsys):
    from perftracker_ml.deploy.demo import runner

    seen: list[str] = []

    class Recording(Progress):
        def phase(self, text: str) -> None:
            seen.append(text)

    def fake_demo(settings, fault, ranks, steps, echo, phase, model="mlp"):
        phase("starting the stack (broker, sink, workers)")
        echo("stack started")
        phase("training demo-x: step 10/200")
        return runner.DemoResult(job="demo-x", fault=fault, fault_rank=2)

    monkeypatch.setattr(runner, "run_demo", fake_demo)
    monkeypatch.setattr(progress_mod, "progress_for", lambda as_json=False, stream=None: Recording())
    for name in [n for n in os.environ if n.startswith("PERFTRACKER_")]:
        monkeypatch.delenv(name)
    main(["--data-dir", str(tmp_path), "demo", "--fault", "none"])  # returns: exit status 0
    assert seen == ["starting the stack (broker, sink, workers)", "training demo-x: step 10/200"]
    assert capsys.readouterr().out.startswith("stack started\njob demo-x: no anomaly found")


def test_old_traces_are_stored_as_of_the_import_time():
    now = 1_800_000_000_000
    settings = Settings(store=StoreSettings(retention_days=30))
    assert store_time_ms(settings, now - 3 * DAY_MS, now) is None  # kept at its own time
    assert store_time_ms(settings, now - 28 * DAY_MS, now) is None
    assert store_time_ms(settings, now - 30 * DAY_MS, now) == now  # would expire within a day
    assert store_time_ms(settings, 1_000, now) == now  # a clock from boot, not the epoch
