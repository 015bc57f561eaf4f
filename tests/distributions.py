"""Installed distributions and what they require, read from this interpreter's metadata:
what ``pip install`` would resolve for them (the packaging test, the slim-install test)."""

from __future__ import annotations

import re
from importlib.metadata import Distribution, PackageNotFoundError, distribution


def requirement_name(requirement: str) -> str:
    """``"fastavro>=1.9,<2; python_version<'3.13'"`` -> ``"fastavro"`` (lower case)."""
    return re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0].lower()


def closure(names: set[str] | list[str]) -> dict[str, Distribution | None]:
    """``names`` and every distribution they require (not extras), by lower-case name; None
    for a name not installed here."""
    seen: dict[str, Distribution | None] = {}
    todo = [n.lower() for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist: Distribution | None = distribution(name)
        except PackageNotFoundError:
            dist = None
        seen[name] = dist
        if dist is not None:
            todo += [requirement_name(r) for r in dist.requires or [] if "extra ==" not in r]
    return seen
