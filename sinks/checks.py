"""The content rules of :mod:`perftracker_ml.schemas.validate` as ClickHouse ``CHECK`` constraints.

Raw-ingested records (:mod:`.raw`) are decoded by ClickHouse, never by
Python, so their validation runs there: the ``raw_*`` tables carry one
constraint per rule, rendered from the same rule objects. ClickHouse refuses
a container holding one violating record (``VIOLATED_CONSTRAINT``) before any
materialized view sees it; the sink then decodes that container in Python,
where :func:`~perftracker_ml.schemas.validate.validate` names the bad records,
which are dead-lettered while the others are written.
"""

from __future__ import annotations

from ..schemas.rules import (
    DEFAULT_LIMITS,
    INT64_MAX,
    FloatArrays,
    Floats,
    IntArrays,
    Ints,
    Limits,
    MembersRange,
    RankInWorld,
    Rule,
    SameLength,
    StrArrays,
    Strs,
    Times,
    TotalWithin,
    static,
)
from ..schemas.validate import RULES


def _between(x: str, lo: int | float, hi: int | float) -> str:
    return f"{x} >= {lo}" if hi >= INT64_MAX else f"{x} BETWEEN {lo} AND {hi}"


def _rule_sql(rule: Rule, limits: Limits) -> list[str]:
    """One boolean expression per field (or per cross-field rule)."""
    if isinstance(rule, Ints):
        lo, hi = static(rule.lo, limits), static(rule.hi, limits)
        return [_between(f"`{f}`", lo, hi) for f in rule.fields]
    if isinstance(rule, Floats):
        lo, hi = static(rule.lo, limits), static(rule.hi, limits)
        return [f"isFinite(`{f}`) AND `{f}` BETWEEN {lo} AND {hi}" for f in rule.fields]
    if isinstance(rule, Strs):
        n = static(rule.max_bytes, limits)
        return [f"length(`{f}`) {'BETWEEN 1 AND' if rule.required else '<='} {n}" for f in rule.fields]
    if isinstance(rule, Times):
        ms = "toUnixTimestamp64Milli(`{}`)"
        unset = " OR {} = 0" if rule.unset_ok else ""
        return [f"{ms.format(f)} BETWEEN {limits.min_time_ms} AND {limits.max_time_ms}{unset.format(ms.format(f))}"
                for f in rule.fields]
    if isinstance(rule, IntArrays):
        lo, hi = static(rule.lo, limits), static(rule.hi, limits)
        return [f"length(`{f}`) <= {limits.max_items} AND arrayAll(v -> {_between('v', lo, hi)}, `{f}`)"
                for f in rule.fields]
    if isinstance(rule, FloatArrays):
        lo, hi = static(rule.lo, limits), static(rule.hi, limits)
        return [f"length(`{f}`) <= {limits.max_items} AND arrayAll(v -> isFinite(v) AND v BETWEEN {lo} AND {hi}, `{f}`)"
                for f in rule.fields]
    if isinstance(rule, StrArrays):
        n = static(rule.max_bytes, limits)
        return [f"length(`{f}`) <= {limits.max_items} AND arrayAll(s -> length(s) <= {n}, `{f}`)"
                for f in rule.fields]
    if isinstance(rule, SameLength):
        first, *rest = rule.fields
        return [" AND ".join(f"length(`{f}`) = length(`{first}`)" for f in rest)]
    if isinstance(rule, RankInWorld):
        unknown = f"`{rule.world}` = 0 OR " if rule.unknown_ok else ""
        return [f"{unknown}`{rule.rank}` < `{rule.world}`"]
    if isinstance(rule, TotalWithin):
        return [f"toInt128(`{rule.total}`) <= toInt128(greatest(`{rule.count}`, 1)) * {limits.max_duration_ns}"]
    if isinstance(rule, MembersRange):
        first, step, count = (f"`{f}`" for f in rule.fields())
        hi = static(rule.hi, limits)
        return [f"{count} = 0 OR ({count} BETWEEN 1 AND {limits.max_items} AND {step} >= 1 AND {first} >= 0"
                f" AND toInt64({first}) + toInt64({step}) * ({count} - 1) <= {hi} AND length(`{rule.prefix}`) = 0)"]
    raise ValueError(f"{type(rule).__name__} has no SQL form (only flat records are raw-ingested)")


def constraints_sql(name: str, limits: Limits = DEFAULT_LIMITS) -> list[str]:
    """``CONSTRAINT valid_<i> CHECK (...)`` clauses enforcing the content rules of ``name``."""
    exprs = [e for rule in RULES[name] for e in _rule_sql(rule, limits)]
    return [f"CONSTRAINT valid_{i} CHECK ({e})" for i, e in enumerate(exprs)]
