"""Reversible monkey-patching and a post-import hook (patch a module when it gets imported)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

PATCHED_FLAG = "__perftracker_original__"


class Patches:
    """Records every attribute replaced so :meth:`undo` restores them (tests, detach)."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any] | Callable[[], Any]] = []

    def replace(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> bool:
        """Replace ``owner.attr`` by ``make(original)``; skip if missing or already patched."""
        original = getattr(owner, attr, None)
        if original is None or getattr(original, PATCHED_FLAG, None) is not None:
            return False
        wrapper = make(original)
        try:
            setattr(wrapper, PATCHED_FLAG, original)
        except (AttributeError, TypeError):
            pass
        setattr(owner, attr, wrapper)
        self._undo.append((owner, attr, original))
        return True

    def add_undo(self, owner: Any, attr: str, original: Any) -> None:
        self._undo.append((owner, attr, original))

    def add_callback(self, undo: Callable[[], Any]) -> None:
        """Run ``undo()`` at :meth:`undo`, in reverse order with the replaced attributes."""
        self._undo.append(undo)

    def undo(self) -> None:
        while self._undo:
            item = self._undo.pop()
            if callable(item):
                item()
                continue
            owner, attr, original = item
            setattr(owner, attr, original)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, after: Callable[[ModuleType], None]):
        self._inner = inner
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class PostImportHook(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` right after ``name`` finishes importing (or now, if it has)."""

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._busy: set[str] = set()

    def when_imported(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        module = sys.modules.get(name)
        if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
            callback(module)
            return
        self._callbacks.setdefault(name, []).append(callback)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self._callbacks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        callbacks = self._callbacks.pop(fullname)

        def after(module: ModuleType) -> None:
            for cb in callbacks:
                cb(module)

        spec.loader = _Loader(spec.loader, after)
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self._callbacks.clear()
