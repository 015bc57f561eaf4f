"""No unnamed threshold in the rule modules: every number a rule compares against is a
:class:`DetectionPolicy` field or a named, commented module-level constant.

The rule modules are the files :func:`.window.diagnose_window` calls into (:data:`RULE_MODULES`).
A numeric literal there fails this test unless it is

* a mathematical constant (:data:`MATH`: zero, one, minus one, two for halves and squares,
  fifty for the median's percentile, a hundred for percent, unit conversions);
* a module-level constant assignment whose line carries a comment or follows a comment line
  (named and documented);
* the digits of ``round(x, n)`` or a subscript (``xs[:5]``, ``m[4]``): display precision,
  display truncation and tuple positions, never a threshold;
* a site in :data:`ALLOWED` (module, enclosing function, value), each with the reason it is
  no threshold.
"""

from __future__ import annotations

import ast
from pathlib import Path

import perftracker_ml.streams.detect as detect

DETECT = Path(detect.__file__).parent

RULE_MODULES = (
    "window.py", "stragglers.py", "late_entries.py", "rank_findings.py", "host_level.py",
    "group_links.py", "shape.py", "net_links.py", "late_arrival.py", "cpu_evidence.py",
    "findings.py", "device_evidence.py", "rank_cpu.py", "onset.py",
)

MATH = frozenset({0, 1, -1, 2, 50, 100, 1e3, 1e6, 1e9})

ALLOWED = {
    ("findings.py", "finite_ratio", 10): "a tenth of the INF_RATIO sentinel: a margin, not a threshold",
    ("late_entries.py", "late_entries", 10): "a late fraction (0-1) scaled to a 0-10 score",
    ("group_links.py", "slow_links", 1e-6): "a floor that keeps a division by the spread finite",
    ("late_arrival.py", "score_collective", 1e-9): "a floor that keeps a division by the steps finite",
    ("shape.py", "short_ranks", 8): "how many ranks a summary lists",
    ("cpu_evidence.py", "top_frames", 3): "how many stack frames a finding shows",
}


def _documented(lines: list[str], node: ast.stmt) -> bool:
    return "#" in lines[node.lineno - 1] or (node.lineno > 1 and lines[node.lineno - 2].lstrip().startswith("#"))


def _literals(path: Path) -> list[tuple[str, object, int]]:
    """(enclosing function, value, line) of each numeric literal of the module not exempt."""
    name = path.name
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    exempt: set[int] = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _documented(lines, node):
            exempt.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):  # an index or slice bound itself, not a mask's threshold
            bounds = [node.slice.lower, node.slice.upper, node.slice.step] \
                if isinstance(node.slice, ast.Slice) else [node.slice]
            for bound in bounds:
                if isinstance(bound, ast.UnaryOp):
                    bound = bound.operand
                if isinstance(bound, ast.Constant):
                    exempt.add(id(bound))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "round" \
                and len(node.args) > 1:
            exempt.update(id(n) for n in ast.walk(node.args[1]))
    found = []

    def visit(node: ast.AST, fn: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = node.name
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
                and isinstance(node.operand, ast.Constant) and id(node.operand) not in exempt:
            value = node.operand.value
            if type(value) in (int, float) and -value not in MATH:
                found.append((fn, -value, node.lineno))
            return
        if isinstance(node, ast.Constant) and type(node.value) in (int, float) and id(node) not in exempt \
                and node.value not in MATH:
            found.append((fn, node.value, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, fn)

    visit(tree, "<module>")
    return [(fn, v, line) for fn, v, line in found if (name, fn, v) not in ALLOWED]


def test_rule_modules_name_their_thresholds():
    bare = [f"{name}:{line} {fn}: {value!r}" for name in RULE_MODULES for fn, value, line in _literals(DETECT / name)]
    assert not bare, "unnamed numbers in rule modules (a DetectionPolicy field or a named, " \
                     "commented constant):\n" + "\n".join(bare)


def test_allow_list_names_real_sites():
    """Every allowed site still holds its literal: a stale entry would allow a new one silently."""
    for name, fn, value in ALLOWED:
        source = (DETECT / name).read_text()
        funcs = {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
        assert fn in funcs, (name, fn)
        assert any(isinstance(n, ast.Constant) and n.value == value for n in ast.walk(funcs[fn])), (name, fn, value)


def test_the_check_catches_a_bare_threshold(tmp_path):
    rule = tmp_path / "rule.py"
    rule.write_text("LIMIT = 3  # named\nBARE = 4\n\ndef rule(xs):\n"
                    "    return xs[0] > 0.7 and round(xs[-1], 3) > LIMIT * 2 and -5 < BARE and xs[:4][xs > 0.3]\n")
    assert _literals(rule) == [("<module>", 4, 2), ("rule", 0.7, 5), ("rule", -5, 5), ("rule", 0.3, 5)]
