"""Read-side checks the CLI makes before it answers about a job.

* **Stack not initialised.** With no live sink to ask and the embedded chDB
  directory absent or empty (or the store answering that its tables do not
  exist), `diagnose` and `report` say "stack not initialised, run `perftracker
  up`" instead of a raw ClickHouse ``UNKNOWN_TABLE`` (and create nothing).
* **Unknown job.** A job with no incident (resolved ones included) and no
  window in the store is refused, naming the known ones, so a mistyped id never
  reads as "no anomaly found".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..schemas.errors import PerftrackerError
from ..schemas.settings import Settings
from ..schemas.stackfile import pid_alive, read_state
from ..sinks.client import diagnose, query
from ..sinks.errors import SinkError
from ..sinks.store import parse_store_url

SHOW_KNOWN = 10


class StackNotInitialised(PerftrackerError):
    """Nothing was ever stored here: the stack never ran on this data dir."""


class UnknownJob(PerftrackerError):
    """The store holds nothing of the job asked about."""


def _not_initialised(settings: Settings) -> StackNotInitialised:
    return StackNotInitialised(f"stack not initialised in {settings.data_dir.resolve()}, run `perftracker up`")


def _embedded_store_absent(settings: Settings) -> bool:
    """No live sink to ask, and the chDB directory the store would open is missing or empty."""
    state = read_state(settings.data_dir)
    if state and state.query_url and pid_alive(state.sink_pid):
        return False
    url = settings.store.url.reveal()
    if url and not url.startswith("chdb:"):
        return False  # a ClickHouse server: only its answer tells
    path = Path(parse_store_url(url, settings.data_dir).path)
    return not path.is_dir() or not any(path.iterdir())


@contextmanager
def reading_store(settings: Settings) -> Iterator[None]:
    """Run store reads inside: an uninitialised store becomes :class:`StackNotInitialised`."""
    if _embedded_store_absent(settings):
        raise _not_initialised(settings)
    try:
        yield
    except SinkError as exc:
        if "UNKNOWN_TABLE" in str(exc):
            raise _not_initialised(settings) from None
        raise


def known_jobs(settings: Settings) -> list[str]:
    """Jobs with windows in the store, newest first (as far back as anything is kept)."""
    days = max(settings.store.retention_days, settings.store.incident_retention_days) + 1
    return [str(row["job"]) for row in query(settings, "jobs", minutes=days * 24 * 60)]


def require_job(settings: Settings, job: str) -> None:
    """Raise :class:`UnknownJob` unless the store holds incidents or windows of ``job``."""
    if diagnose(settings, job, include_resolved=True):
        return
    known = known_jobs(settings)
    if job in known:
        return
    shown = ", ".join(known[:SHOW_KNOWN]) or "none yet"
    more = f" and {len(known) - SHOW_KNOWN} more" if len(known) > SHOW_KNOWN else ""
    raise UnknownJob(f"no such job '{job}' (known: {shown}{more})")
