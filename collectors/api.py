"""Public API: attach(), timed (decorator and context manager), step(), stats(), detach()."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from typing import Any, TypeVar, overload

from ..schemas.redact import redact_configured
from ..schemas.vocabulary import SpanKind
from .collector import Collector, CollectorStats
from .config import load_attach_settings
from .identity import identity_from_env
from .job_agreement import provisional_job, settled_job, world_size

log = logging.getLogger("perftracker_ml.collectors")

F = TypeVar("F", bound=Callable[..., Any])

ATTACHED_PID_ENV = "PERFTRACKER_COLLECTOR_ATTACHED_PID"

_lock = threading.Lock()
_current: Collector | None = None


def attach(job: str | None = None, *, env: Mapping[str, str] | None = None,
           **overrides: Any) -> Collector | None:
    """Start collecting in this process (idempotent); returns the collector, or None if disabled.

    Settings come from ``PERFTRACKER_COLLECTOR_*`` / ``PERFTRACKER_KAFKA_*`` (see
    :mod:`.config`); keyword ``overrides`` (e.g. ``flush_interval_s=0.5``) win.
    Never raises: a collector that cannot start logs one line and returns None.
    """
    global _current
    with _lock:
        if _current is not None:
            return _current
        try:
            env = os.environ if env is None else env
            settings = load_attach_settings(env, **overrides)
            if not settings.collector.enabled:
                return None
            settled = settled_job(job or settings.collector.job, env)
            agree = not settled and world_size(env) > 1
            job = settled or provisional_job(env)
            identity = identity_from_env(job, env, settings.collector.host)
            bootstrap = settings.collector.bootstrap_servers or _bootstrap(env)
            collector = Collector(settings, identity, bootstrap, job_settled=not agree)
            collector.start()
        except Exception as exc:  # noqa: BLE001 - attaching must never break the job
            log.warning("perftracker: collector not attached: %s: %s", type(exc).__name__,
                        redact_configured(str(exc)))
            return None
        _current = collector
        os.environ[ATTACHED_PID_ENV] = str(os.getpid())
        return collector


def _bootstrap(env: Mapping[str, str]) -> str:
    from ..schemas.settings_loader import read_settings
    from ..schemas.stackfile import resolve_bootstrap
    from .config import warn_once
    return resolve_bootstrap(read_settings(env=env, warn=warn_once)[0])


def detach() -> None:
    """Flush, stop and remove every hook (mostly for tests)."""
    global _current
    with _lock:
        collector, _current = _current, None
    if collector is not None:
        collector.close()
        collector.remove_hooks()
        os.environ.pop(ATTACHED_PID_ENV, None)


def current() -> Collector | None:
    return _current


def stats() -> CollectorStats | None:
    """The attached collector's own counters (events sent/dropped, bytes/s, errors), or None."""
    return _current.stats() if _current is not None else None


def step() -> None:
    """Mark an iteration boundary explicitly; from the first call, automatic detection is off."""
    collector = _current
    if collector is None:
        return
    try:
        collector.recorder.mark_step(perf_counter_ns())
    except Exception as exc:  # noqa: BLE001
        collector.errors.caught("step", exc)


class _Block:
    """Context manager and decorator timing one named span."""

    __slots__ = ("name", "kind", "_t0")

    def __init__(self, name: str, kind: int):
        self.name = name
        self.kind = kind
        self._t0 = 0

    def __enter__(self) -> _Block:
        self._t0 = perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        t1 = perf_counter_ns()
        collector = _current
        if collector is None:
            return
        try:
            collector.recorder.span(self.kind, self.name, self._t0, t1 - self._t0)
        except Exception as err:  # noqa: BLE001
            collector.errors.caught(self.name, err)

    def __call__(self, fn: F) -> F:
        name, kind = self.name, self.kind

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _Block(name, kind):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


@overload
def timed(name: F) -> F: ...
@overload
def timed(name: str | None = None, *, kind: SpanKind = SpanKind.USER) -> _Block: ...


def timed(name: Any = None, *, kind: SpanKind = SpanKind.USER) -> Any:
    """Time a function or a block as one span.

    ``@timed`` / ``@timed("name")`` on a function; ``with timed("name"):`` on a
    block. Without an attached collector it only costs two clock reads.
    """
    if callable(name):
        fn = name
        return _Block(f"{fn.__module__}.{fn.__qualname__}", int(SpanKind.PYTHON))(fn)
    return _Block(name or "block", int(kind))
