"""The fast path of EventBatch v8 validation (:func:`perftracker_ml.schemas.rules.with_fast_blocks`)
gives the per-rule checks' verdict and message on every batch: real ones, and real ones with a
value out of a bound, a ragged, empty, missing or mistyped column, a name index past the names."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker_ml.deploy.workloads.batches import Workload, batches
from perftracker_ml.schemas import Codec, bundled_schemas, columns
from perftracker_ml.schemas import validate as validate_module
from perftracker_ml.schemas.rules import (
    DEFAULT_LIMITS,
    NUMPY_FROM,
    Block,
    Check,
    Limits,
    bind_all,
    plan_block,
)
from perftracker_ml.schemas.validate import RULES, validate

BLOCKS = ("iterations", "spans", "comms")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
LIMITS = (DEFAULT_LIMITS, Limits(max_duration_ns=10**9), Limits(max_items=40), Limits(max_kind=3, max_count=10**13))


@cache
def real_batches(version: int = 8) -> tuple[dict, ...]:
    """Batches of the throughput workload as the worker decodes them (v8: numpy columns)."""
    w = Workload(ranks=32, seconds=2)
    codec = Codec("EventBatch", bundled_schemas().restricted("EventBatch", version))
    return tuple(codec.decode(codec.encode(r)) for _, r in batches(w, 1_700_000_000_000 * 1_000_000))


@cache
def _plain_checks(name: str, limits: Limits) -> tuple[Check, ...] | None:
    """The rules of ``name`` bound without the fast path: each rule's own check."""
    rules = RULES.get(name)
    return None if rules is None else bind_all(rules, limits, fast=False)


def old_validate(name: str, record: Any, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """:func:`validate` through the per-rule checks only (what it was before the fast path)."""
    with mock.patch.object(validate_module, "_checks", _plain_checks):
        return validate(name, record, limits)


def same_verdict(record: dict, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """Assert the fast and the per-rule validation agree on ``record``; the verdict."""
    new, old = validate("EventBatch", record, limits), old_validate("EventBatch", record, limits)
    assert new == old
    return new


def thawed(record: dict) -> dict:
    """A copy of ``record`` whose block columns are writable arrays (decoded ones are read-only views)."""
    out = copy.copy(record)
    for block in (*BLOCKS, "stacks"):
        part = record.get(block)
        if isinstance(part, dict):
            out[block] = {col: a.copy() if hasattr(a, "copy") else list(a) for col, a in part.items()}
    return out


def test_every_event_batch_block_takes_the_fast_path() -> None:
    rules = RULES["EventBatch"]
    assert all(plan_block(r, DEFAULT_LIMITS) for r in rules if isinstance(r, Block))
    assert len(bind_all(rules, DEFAULT_LIMITS)) == 1  # the blocks' fast path and the other checks as one
    assert len(bind_all(rules, DEFAULT_LIMITS, fast=False)) == len(rules)


@pytest.mark.parametrize("version", [7, 8])
def test_real_batches_pass_both_ways(version: int) -> None:
    for record in real_batches(version):
        for limits in LIMITS:
            assert validate("EventBatch", record, limits) == old_validate("EventBatch", record, limits)
        assert same_verdict(record) is None


# ---- corruptions --------------------------------------------------------------------------------
def bound_values(record: dict, block: str, col: str) -> list[int]:
    """Values at and across the bounds a column has (static and of the record), and extremes."""
    names, groups, world = len(record["names"]), len(record["groups"]), record["world_size"]
    near = [-2, -1, 0, 1, 2, 3, 32_767, 32_768, names - 1, names, groups - 1, groups, world,
            3600 * 10**9, 3600 * 10**9 + 1, -3600 * 10**9, -3600 * 10**9 - 1, 10**9, 10**9 + 1,
            10**13, 10**13 + 1, INT32_MIN, INT32_MAX, INT64_MIN, INT64_MAX]
    if columns.TYPECODE[(block, col)] == columns.I32:
        return [v for v in near if INT32_MIN <= v <= INT32_MAX]
    return near


@st.composite
def out_of_bound(draw: st.DrawFn) -> tuple[dict, Limits]:
    """A real batch with one value of one column set at or past a bound."""
    record = thawed(draw(st.sampled_from(real_batches())))
    block = draw(st.sampled_from(BLOCKS))
    col, _ = draw(st.sampled_from(columns.PACKED[block]))
    a = record[block][col]
    if len(a):
        a[draw(st.integers(0, len(a) - 1))] = draw(st.sampled_from(bound_values(record, block, col)))
    return record, draw(st.sampled_from(LIMITS))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(out_of_bound())
def test_a_value_at_or_past_a_bound(case: tuple[dict, Limits]) -> None:
    same_verdict(*case)


class SubArray(np.ndarray):
    """An ndarray subclass: not what the decoder gives, so the per-rule checks decide."""


def _mistyped(a: np.ndarray, kind: str) -> Any:
    """``a`` as another type or dtype of column."""
    return {
        "float": lambda: a.astype(np.float64),
        "uint64": lambda: a.astype(np.uint64),
        "uint32": lambda: a.astype(np.uint32),
        "timedelta": lambda: a.astype("m8[ns]"),
        "int8": lambda: a.astype(np.int8),
        "bool": lambda: a.astype(bool),
        "object": lambda: a.astype(object),
        "list": lambda: a.tolist(),
        "tuple": lambda: tuple(a.tolist()),
        "packed": lambda: a.tobytes(),
        "truncated": lambda: a.tobytes()[:-1] if len(a) else b"\x00",
        "2-d": lambda: a.reshape(len(a), 1),
        "0-d": lambda: np.int64(7),
        "none": lambda: None,
        "str": lambda: "1,2,3",
        "subclass": lambda: a.view(SubArray),
    }[kind]()


SHAPES = ("drop_last", "append", "empty_column", "empty_block", "missing_column", "block_not_dict",
          "missing_block", "names_empty", "names_short", "long_block", "world_size", "stacks_raw", "stacks_empty")


def _reshaped(record: dict, shape: str, block: str, col: str) -> None:
    """Change ``record`` (thawed) in place by ``shape``."""
    part = record[block]
    if shape == "drop_last":
        part[col] = part[col][:-1]
    elif shape == "append":
        part[col] = np.append(part[col], part[col][:1]).astype(part[col].dtype)
    elif shape == "empty_column":
        part[col] = part[col][:0]
    elif shape == "empty_block":
        record[block] = {c: a[:0] for c, a in part.items()}
    elif shape == "missing_column":
        del part[col]
    elif shape == "block_not_dict":
        record[block] = list(part.values())
    elif shape == "missing_block":
        del record[block]
    elif shape == "names_empty":
        record["names"] = []
    elif shape == "names_short":
        record["names"] = record["names"][:3]
    elif shape == "long_block":  # past NUMPY_FROM: the per-rule checks' numpy branch
        reps = NUMPY_FROM // max(1, len(part[col])) + 1
        record[block] = {c: np.tile(a, reps) for c, a in part.items()}
    elif shape == "world_size":
        record["world_size"] = 1
    elif shape == "stacks_raw":
        record["stacks"]["count"] = record["stacks"]["count"].tobytes()[:-3]
    elif shape == "stacks_empty":
        record["stacks"] = {}


@st.composite
def misshapen(draw: st.DrawFn) -> tuple[dict, Limits]:
    """A real batch with a column mistyped, or a block or the names reshaped, maybe with a value
    past a bound as well."""
    record = thawed(draw(st.sampled_from(real_batches())))
    block = draw(st.sampled_from(BLOCKS))
    col, _ = draw(st.sampled_from(columns.PACKED[block]))
    if draw(st.booleans()):
        kinds = ["float", "uint64", "uint32", "timedelta", "int8", "bool", "object", "list", "tuple", "packed", "truncated", "2-d",
                 "0-d", "none", "str", "subclass"]
        record[block][col] = _mistyped(record[block][col], draw(st.sampled_from(kinds)))
    else:
        _reshaped(record, draw(st.sampled_from(SHAPES)), block, col)
    if draw(st.booleans()):
        other = draw(st.sampled_from(BLOCKS))
        part = record.get(other)
        if isinstance(part, dict):
            c, _ = draw(st.sampled_from(columns.PACKED[other]))
            a = part.get(c)
            if isinstance(a, np.ndarray) and a.ndim == 1 and len(a) and a.dtype.kind == "i":
                a = part[c] = a.copy()
                a[-1] = draw(st.sampled_from([v for v in bound_values(record, other, c)
                                              if np.iinfo(a.dtype).min <= v <= np.iinfo(a.dtype).max]))
    return record, draw(st.sampled_from(LIMITS))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(misshapen())
def test_a_misshapen_batch(case: tuple[dict, Limits]) -> None:
    same_verdict(*case)


def test_the_named_problems_read_as_before() -> None:
    """A few corruptions by hand: the message itself, not only agreement."""
    record = thawed(real_batches()[3])
    names = len(record["names"])
    record["spans"]["name"][0] = names
    assert same_verdict(record) == f"EventBatch.spans.name[0] = {names}: outside [0, {names - 1}]"
    record = thawed(real_batches()[3])
    record["comms"]["seq"] = record["comms"]["seq"][:-1]
    assert "EventBatch.comms.columns of unequal length (op=" in str(same_verdict(record))
    record = thawed(real_batches()[3])
    record["iterations"]["dur_ns"][-1] = -5
    assert same_verdict(record) == "EventBatch.iterations.dur_ns[2] = -5: outside [0, 3600000000000]"
    record = thawed(real_batches()[3])
    record["spans"]["step"] = record["spans"]["step"].tobytes()[:-1]
    assert str(same_verdict(record)).startswith("EventBatch.spans.step: ")


def test_blocks_of_lists_keep_the_per_rule_checks() -> None:
    """v7 batches (list columns) and v8 ones whose columns are lists both validate as before."""
    for record in (*real_batches(7)[:8], *map(columns.as_lists, real_batches()[:8])):
        assert same_verdict(record) is None
        record = copy.deepcopy(record)
        record["comms"]["group"][-1] = len(record["groups"])
        assert same_verdict(record) is not None
