"""No unnamed threshold in streams/detect/: every number a rule compares against is a
:class:`DetectionPolicy` field.

Every module of ``streams/detect/`` is checked (a new one too) but those of :data:`EXCLUDED`,
which hold no decision: the policy itself (each field a commented default), the record model's
names, and the encodings of stage 1 (histogram buckets, exact percentiles, the chunk fold's
packed keys and bit widths). A numeric literal in a checked module fails this test unless it is

* a mathematical constant or unit conversion (:data:`MATH`: zero, one, minus one, two for
  halves and squares, fifty for the median's percentile, a hundred for percent, 1e3/1e6/1e9);
* display precision or a position: the digits of ``round(x, n)``, or a subscript (``xs[:5]``,
  ``m[4]``): display truncation and tuple positions, never a threshold;
* inside a module-level constant of :data:`NAMED` (bit masks, sentinels, conversion factors,
  memory and work bounds), each with the reason it is no threshold;
* a site in :data:`ALLOWED` (module, enclosing function, value), each with the reason it is
  no threshold.

A module-level constant bound to a number (any number, ``0``, ``1`` and ``2`` too: a threshold
of one window is still a threshold) fails unless it is in :data:`NAMED`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import perftracker_ml.streams.detect as detect

DETECT = Path(detect.__file__).parent

EXCLUDED = {
    "__init__.py": "re-exports only",
    "policy.py": "DetectionPolicy itself: every field a commented default",
    "model.py": "the record model's names, prefixes and kind sets",
    "histogram.py": "the log2/4 bucket encoding of durations (BUCKETS_PER_OCTAVE, the bucket midpoint)",
    "quantiles.py": "exact p50/p90/p99 of a window's durations: the percentiles a record carries",
    "chunk_fold.py": "stage 1's column-wise fold: packed keys, bit widths and shifts, no decision",
    "chunk_columns.py": "stage 1's column-wise fold: packed keys, bit widths and shifts, no decision",
    "chunk_plan.py": "stage 1's column-wise fold: packed keys, bit widths and shifts, no decision",
    "chunk_order.py": "stage 1's column-wise fold: packed keys, bit widths and shifts, no decision",
    "chunk_apply.py": "stage 1's column-wise fold: packed keys, bit widths and shifts, no decision",
}

MATH = frozenset({0, 1, -1, 2, 50, 100, 1e3, 1e6, 1e9})

NAMED = {
    ("columnar.py", "MAD_TO_SIGMA"): "the normal distribution's sigma per MAD (1.4826): a constant of the estimator",
    ("columnar.py", "CENTRAL_TO_SIGMA"): "q60 - q40 of a normal distribution in sigmas: a constant of the estimator",
    ("accumulate.py", "THERMAL_POWER_BITS"): "NVML's thermal and power throttle-reason bits: a bit mask",
    ("accumulate.py", "MAX_DURATIONS_PER_FUNCTION"): "memory bound on the exact durations a window keeps "
                                                     "per function (the rest counted as overflow)",
    ("step_gating.py", "UNGATED"): "EventBatch functional_steps of a rank recorded on every step (the "
                                   "schema's default): an encoding, not a threshold",
    ("peers.py", "INF_RATIO"): "the finite sentinel of a ratio against peers that spend no time",
    ("cpu_evidence.py", "WHERE_KIND"): "the collector's code for a user-code stack frame: a sentinel",
    ("job_clock.py", "DUE_NOW"): "the 'due at once' sentinel (at=0)",
    ("compare.py", "MAX_EVALUATED_REMEMBERED"): "memory bound on the evaluated window ids kept (32, four times "
                                                "the windows a comparator may hold open)",
    ("onset.py", "MAX_CANDIDATES"): "work bound: onset steps tried per window, evenly spaced",
    ("rank_windows.py", "MAX_CLOSED_PER_POLL"): "work bound: windows a rank closes in one poll (the rest next tick)",
    ("window_columns.py", "SETTLE_EVENTS"): "memory bound: a window's pending events grouped early (same result)",
    ("window_close.py", "CLOSE_EVENTS"): "memory bound: the events of the windows closed together (same records)",
    ("window_evidence.py", "TOP_FRAMES"): "record size: sampled frames a RankWindow carries per kind",
    ("summarize.py", "MAX_MESH_DIMS"): "input bound: mesh dimensions kept from a batch",
    ("decisions.py", "MAX_STORED_DECISIONS"): "record size: the window's trace entries an incident's evidence carries",
}

ALLOWED = {
    ("findings.py", "finite_ratio", 10): "a tenth of the INF_RATIO sentinel: a margin, not a threshold",
    ("late_entries.py", "late_entries", 10): "a late fraction (0-1) scaled to a 0-10 score",
    ("group_links.py", "slow_links", 1e-6): "a floor that keeps a division by the spread finite",
    ("late_arrival.py", "score_collective", 1e-9): "a floor that keeps a division by the steps finite",
    ("peers.py", "find_outliers", 1e-12): "a floor that keeps a division by the calls finite",
    ("peers.py", "_small_stage_outliers", 1e-12): "a floor that keeps a division by the calls finite",
    ("incidents.py", "_material", 1e-9): "a floor that keeps a division by the impact finite",
    ("columnar.py", "_quantile_rows", 40): "the 40th percentile CENTRAL_TO_SIGMA is defined on",
    ("columnar.py", "_quantile_rows", 60): "the 60th percentile CENTRAL_TO_SIGMA is defined on",
    ("columnar.py", "_quantile_rows", 0.4): "the 40th percentile CENTRAL_TO_SIGMA is defined on, as a fraction",
    ("columnar.py", "_quantile_rows", 0.5): "the median, as a fraction",
    ("columnar.py", "_quantile_rows", 0.6): "the 60th percentile CENTRAL_TO_SIGMA is defined on, as a fraction",
    ("liveness.py", "_trend_free_mad", 3): "first differences need three values to have a spread",
    ("layout.py", "layout_peer_map", 3): "the default for callers without a policy; the comparator passes min_peers",
    ("rank_events.py", "frame_text", 8192): "cache size of the frame texts (a job's few hundred frames)",
    ("shape.py", "short_ranks", 8): "how many ranks a summary lists",
    ("cpu_evidence.py", "top_frames", 3): "how many stack frames a finding shows",
    ("liveness.py", "_flight_words", 4): "how many ranks' flight records a hang summary lists",
    ("liveness.py", "_hang_words", 8): "how many waiting ranks a hang summary lists",
}


def checked_modules() -> list[Path]:
    return sorted(p for p in DETECT.glob("*.py") if p.name not in EXCLUDED)


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _constant_name(node: ast.stmt) -> str | None:
    """The name a module-level assignment binds, when it binds a number (any literal in it)."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        target, value = node.targets[0].id, node.value
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        target, value = node.target.id, node.value
    else:
        return None
    return target if any(_is_number(n) for n in ast.walk(value)) else None


def _literals(path: Path) -> list[tuple[str, object, int]]:
    """(enclosing function or ``<module> NAME``, value, line) of each numeric literal of the
    module that is not exempt, and of each module-level numeric constant not in NAMED."""
    name = path.name
    tree = ast.parse(path.read_text())
    exempt: set[int] = set()
    found: list[tuple[str, object, int]] = []
    for node in tree.body:
        const = _constant_name(node)
        if const is None:
            continue
        exempt.update(id(n) for n in ast.walk(node))  # the constant is reported, not its literals
        if (name, const) not in NAMED:
            found.append((f"<module> {const}", "named constant", node.lineno))
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

    def visit(node: ast.AST, fn: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = node.name
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
                and isinstance(node.operand, ast.Constant) and id(node.operand) not in exempt:
            value = node.operand.value
            if type(value) in (int, float) and -value not in MATH:
                found.append((fn, -value, node.lineno))
            return
        if _is_number(node) and id(node) not in exempt and node.value not in MATH:  # type: ignore[attr-defined]
            found.append((fn, node.value, node.lineno))  # type: ignore[attr-defined]
        for child in ast.iter_child_nodes(node):
            visit(child, fn)

    visit(tree, "<module>")
    return sorted(((fn, v, line) for fn, v, line in found if (name, fn, v) not in ALLOWED), key=lambda x: x[2])


def test_every_threshold_of_streams_detect_is_a_policy_field():
    bare = [f"{path.name}:{line} {fn}: {value!r}" for path in checked_modules() for fn, value, line in _literals(path)]
    assert not bare, "unnamed numbers in streams/detect/ (make each a DetectionPolicy field with a one-line " \
                     "comment, or, if it is no threshold, list it in NAMED or ALLOWED with why):\n" + "\n".join(bare)


def test_the_modules_checked_make_the_decisions():
    """The rule modules are checked (an exclusion that grew to cover one would be caught here)."""
    names = {p.name for p in checked_modules()}
    assert {"window.py", "diagnose.py", "stragglers.py", "late_entries.py", "stalls.py", "peers.py", "compare.py",
            "late_arrival.py", "job_checks.py", "liveness.py", "hang.py", "rare.py", "onset.py", "rank_cpu.py",
            "net_links.py", "cpu_evidence.py", "device_evidence.py", "job_windows.py"} <= names
    assert all((DETECT / n).exists() for n in EXCLUDED), "a stale exclusion"


def test_no_module_of_streams_detect_is_longer_than_300_lines():
    """A rule module stays short enough to read whole: a longer one is split (as chunk_fold was)."""
    long = {p.name: n for p in DETECT.glob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"modules of streams/detect/ over 300 lines (split them): {long}"


def test_allow_lists_name_real_sites():
    """Every allowed site and named constant still exists: a stale entry would allow a new one silently."""
    for name, fn, value in ALLOWED:
        source = (DETECT / name).read_text()
        funcs = {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
        assert fn in funcs, (name, fn)
        assert any(isinstance(n, ast.Constant) and n.value == value for n in ast.walk(funcs[fn])), (name, fn, value)
    for name, const in NAMED:
        assert name not in EXCLUDED, (name, const)
        tree = ast.parse((DETECT / name).read_text())
        assert const in {_constant_name(n) for n in tree.body}, (name, const)


def test_the_check_catches_a_bare_threshold(tmp_path):
    rule = tmp_path / "rule.py"
    rule.write_text("LIMIT = 3  # named and commented: not enough\nWINDOWS = 1\nNAME = 'x'\n\ndef rule(xs):\n"
                    "    return xs[0] > 0.7 and round(xs[-1], 3) > LIMIT * 2 and -5 < WINDOWS and xs[:4][xs > 0.3]\n")
    assert _literals(rule) == [("<module> LIMIT", "named constant", 1), ("<module> WINDOWS", "named constant", 2),
                               ("rule", 0.7, 6), ("rule", -5, 6), ("rule", 0.3, 6)]
