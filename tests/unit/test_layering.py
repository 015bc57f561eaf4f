"""The packages import each other one way only: the layering rule, checked on every module.

Each module's imports (relative and absolute ``perftracker_ml.*`` ones, at the top,
inside functions or under ``TYPE_CHECKING``) are read with :mod:`ast`, resolved
to the perftracker module they name, and checked against ``MAY_IMPORT``. A
package also fails the check when its imports form a cycle with another
package's. docs/architecture.md quotes the table.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "collectors", "streams", "sinks", "grafana", "deploy")

# package -> the other perftracker packages it may import. Nothing imports deploy.
MAY_IMPORT: dict[str, set[str]] = {
    "schemas": set(),  # bottom: settings, topics, errors, codec, vocabulary
    "collectors": {"schemas"},
    "streams": {"schemas"},
    "sinks": {"schemas", "streams"},
    "grafana": {"schemas", "streams", "sinks"},
    "deploy": {"schemas", "collectors", "streams", "sinks", "grafana"},
}
# The detection core is stricter: these schemas modules, numpy and the standard library only.
DETECT = "streams.detect"
DETECT_MAY_IMPORT = {"schemas.causes", "schemas.errors", "schemas.records", "schemas.settings", "schemas.vocabulary"}
DETECT_THIRD_PARTY = {"numpy"}

# TEMPORARY allow-list of violations another change of issue 12 removes, as
# "importer -> imported module". An entry that no longer occurs fails the test, so
# the list only shrinks; the goal is an empty set.
KNOWN_VIOLATIONS: set[str] = set()


def module_name(path: Path) -> str:
    """``streams/detect/policy.py`` -> ``streams.detect.policy`` (without ``perftracker_ml.``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield module_name(path), path


KNOWN = {name for name, _ in modules()}


def imports(path: Path) -> list[tuple[int, str]]:
    return imports_in(module_name(path), path.name == "__init__.py", path.read_text())


def imports_in(name: str, is_package: bool, text: str) -> list[tuple[int, str]]:
    """(line, imported name) of every import in module ``name``, sorted; perftracker names
    without the ``perftracker_ml.`` prefix, any other as ``<external>.<top-level name>``."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, _absolute(alias.name)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = _absolute(node.module or "")
            for alias in node.names:  # `from . import x` may name a module
                sub = f"{target}.{alias.name}" if target else alias.name
                found.append((node.lineno, sub if sub in KNOWN else target))
    return sorted(set(found))


def _absolute(name: str) -> str:
    if name == "perftracker_ml" or name.startswith("perftracker_ml."):
        return name.partition(".")[2]
    return "<external>." + name.partition(".")[0]


def package_of(module: str) -> str:
    return module.partition(".")[0]


def violation(importer: str, imported: str) -> str | None:
    """Why ``importer`` may not import ``imported``; None when it may."""
    if imported.startswith("<external>."):
        top = imported.removeprefix("<external>.")
        if _in(importer, DETECT) and top not in DETECT_THIRD_PARTY and top not in sys.stdlib_module_names:
            return f"{DETECT} imports only numpy and the standard library, not {top}"
        return None
    if _in(importer, DETECT) and not _in(imported, DETECT) and \
            not any(_in(imported, allowed) for allowed in DETECT_MAY_IMPORT):
        return f"{DETECT} may import only {sorted(DETECT_MAY_IMPORT)} of perftracker"
    source, target = package_of(importer), package_of(imported)
    if source != target and target not in MAY_IMPORT[source]:
        return f"{source} may import only {sorted(MAY_IMPORT[source]) or 'no other package'}"
    return None


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_every_import_follows_the_layering_rule():
    problems, seen = [], set()
    for name, path in modules():
        for line, imported in imports(path):
            why = violation(name, imported)
            if why is None:
                continue
            key = f"{name} -> {imported}"
            seen.add(key)
            if key not in KNOWN_VIOLATIONS:
                problems.append(f"{path.relative_to(ROOT)}:{line}: imports {imported}: {why}")
    assert not problems, "layering rule broken (see MAY_IMPORT in this file):\n" + "\n".join(problems)
    stale = KNOWN_VIOLATIONS - seen
    assert not stale, f"fixed: remove from KNOWN_VIOLATIONS: {sorted(stale)}"


def test_no_import_cycle_between_packages():
    edges: dict[str, set[str]] = {p: set() for p in PACKAGES}
    where: dict[tuple[str, str], str] = {}
    for name, path in modules():
        for line, imported in imports(path):
            source, target = package_of(name), package_of(imported)
            if target in edges and target != source:
                edges[source].add(target)
                where.setdefault((source, target), f"{path.relative_to(ROOT)}:{line}")
    cycle = find_cycle(edges) or []
    steps = [f"  {a} -> {b} at {where[a, b]}" for a, b in zip(cycle, cycle[1:], strict=False)]
    assert not cycle, "import cycle between packages: " + " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_the_rule_itself_has_no_cycle():
    assert find_cycle(MAY_IMPORT) is None
    assert not any("deploy" in allowed for allowed in MAY_IMPORT.values())


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_checker_sees_relative_absolute_and_nested_imports():
    source = ("from ...schemas import errors\nfrom .. import app\nimport perftracker_ml.deploy.cli\n"
              "import faust\n\ndef f():\n    from ...deploy.stack import up\n")
    found = imports_in("streams.detect.probe", False, source)
    assert found == [(1, "schemas.errors"), (2, "streams.app"), (3, "deploy.cli"),
                     (4, "<external>.faust"), (7, "deploy.stack")]
    assert imports_in("sinks.alerts", True, "from ...schemas import settings\n") == [(1, "schemas.settings")]
    assert violation("streams.detect.x", "streams.app") and violation("streams.detect.x", "deploy.cli")
    assert violation("collectors.api", "deploy.stack") and violation("streams.detect.x", "<external>.faust")
    assert violation("streams.detect.x", "schemas.errors") is None
    assert violation("sinks.client", "streams.detect") is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
