"""Building blocks of content validation (:mod:`.validate`): limits, bounds and rule types.

A rule is a frozen dataclass naming fields and bounds (data, so the sink can render the
same rules as SQL constraints); :meth:`Rule.bind` turns it into a check function with the
bounds resolved once per :class:`Limits`, so checking a record is a few calls of builtins
(``min``, ``max``, ``sum``: C loops over the decoded lists) per field. :func:`bind_all` adds a
fast path for EventBatch v8's blocks of numpy columns (all blocks' columns checked in a few numpy
calls; the per-rule checks run only when that finds something, so verdicts and messages are theirs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache, lru_cache
from operator import itemgetter, le
from typing import Any

from . import columns

INT64_MAX = (1 << 63) - 1
NUMPY_FROM = 256  # an array column this long is checked with numpy's min/max, a shorter one as a list


@dataclass(frozen=True)
class Limits:
    max_world_size: int = 1 << 22
    max_gpu: int = (1 << 16) - 1
    max_duration_ns: int = 3600 * 10**9
    max_id_bytes: int = 256
    max_name_bytes: int = 4096
    max_text_bytes: int = 64 << 10
    max_items: int = 1 << 20
    max_kind: int = (1 << 15) - 1  # stored as Int16
    max_hist_bucket: int = 255  # FunctionPattern.hist_first: a duration of 2^63 ns is bucket 252
    max_count: int = INT64_MAX  # counters, sequence numbers, bytes: only non-negative
    max_float: float = 1e15
    min_time_ms: int = 946_684_800_000  # 2000-01-01
    max_time_ms: int = 4_102_444_800_000  # 2100-01-01

    @property
    def max_rank(self) -> int:
        return self.max_world_size - 1

    @property
    def max_function_bytes(self) -> int:
        return 2 * self.max_name_bytes + 64

    @property
    def min_duration_ns(self) -> int:
        return -self.max_duration_ns

    @property
    def min_time_ns(self) -> int:
        return self.min_time_ms * 1_000_000

    @property
    def max_time_ns(self) -> int:
        return self.max_time_ms * 1_000_000


DEFAULT_LIMITS = Limits()


@lru_cache(maxsize=8)
def limits_for(max_duration_s: float) -> Limits:
    """Default limits with the detection policy's longest plausible duration."""
    return Limits(max_duration_ns=int(max_duration_s * 1e9))


@dataclass(frozen=True)
class Lim:
    """A bound that is an attribute of :class:`Limits`."""

    name: str


@dataclass(frozen=True)
class LastIndexOf:
    """A bound that is the last index of an array field of the whole record."""

    field: str


@dataclass(frozen=True)
class Below:
    """A bound just below an int field of the whole record (e.g. ranks below world_size)."""

    field: str


Bound = int | float | Lim | LastIndexOf | Below
Fields = tuple[str, ...]


Check = Callable[[dict, dict, str], "str | None"]  # (record, whole record, path) -> reason


def resolve(bound: Bound, limits: Limits) -> Callable[[dict], Any]:
    """The bound as a function of the whole record (constant for literals and limits)."""
    field = bound.field if isinstance(bound, (LastIndexOf, Below)) else ""
    if isinstance(bound, LastIndexOf):
        return lambda root: len(root[field]) - 1
    if isinstance(bound, Below):
        return lambda root: int(root[field]) - 1
    value = getattr(limits, bound.name) if isinstance(bound, Lim) else bound
    return lambda root: value


def depends_on_record(bound: Bound) -> bool:
    """Whether ``bound`` is a function of the record (not a literal or a limit)."""
    return isinstance(bound, (LastIndexOf, Below))


def static(bound: Bound, limits: Limits) -> Any:
    """A bound that does not depend on the record (what SQL constraints need)."""
    if isinstance(bound, (LastIndexOf, Below)):
        raise ValueError(f"{bound} depends on the record")
    return getattr(limits, bound.name) if isinstance(bound, Lim) else bound


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _nbytes(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def _too_long(s: str, max_bytes: int) -> bool:
    return len(s) > max_bytes or (len(s) * 4 > max_bytes and _nbytes(s) > max_bytes)


def epoch_ms(value: Any) -> int:
    """A timestamp-millis field: epoch ms, or a ``datetime`` after Avro decoding."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return int(value.timestamp() * 1000)
    return int(value)


class Rule:
    """One check; subclasses are frozen dataclasses (data: the sink also renders them as SQL)."""

    def bind(self, limits: Limits) -> Check:
        """A function that applies the rule with ``limits`` (built once per limits)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Ints(Rule):
    fields: Fields
    lo: Bound
    hi: Bound

    def bind(self, limits: Limits) -> Check:
        if not (depends_on_record(self.lo) or depends_on_record(self.hi)):
            return self._bind_static(static(self.lo, limits), static(self.hi, limits))
        lo_of, hi_of, fields = resolve(self.lo, limits), resolve(self.hi, limits), self.fields

        def check(rec: dict, root: dict, path: str) -> str | None:
            return _ints_outside(rec, path, fields, lo_of(root), hi_of(root))
        return check

    def _bind_static(self, lo: Any, hi: Any) -> Check:
        """The check with bounds that do not depend on the record (most of them): no call per record to find them."""
        fields = self.fields

        def check(rec: dict, root: dict, path: str) -> str | None:
            return _ints_outside(rec, path, fields, lo, hi)
        return check


def _ints_outside(rec: dict, path: str, fields: Fields, lo: Any, hi: Any) -> str | None:
    """:class:`Ints`' message for the first of ``fields`` outside [lo, hi]; None when all are within."""
    for f in fields:
        v = rec[f]
        if not lo <= v <= hi:
            return f"{path}{f} = {show(v)}: outside [{lo}, {hi}]"
    return None


@dataclass(frozen=True)
class Floats(Rule):
    fields: Fields
    lo: Bound
    hi: Bound

    def bind(self, limits: Limits) -> Check:
        lo, hi, fields = static(self.lo, limits), static(self.hi, limits), self.fields

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                v = rec[f]
                if not (math.isfinite(v) and lo <= v <= hi):
                    return f"{path}{f} = {v!r}: not a finite number in [{lo}, {hi}]"
            return None
        return check


@dataclass(frozen=True)
class Strs(Rule):
    fields: Fields
    max_bytes: Bound
    required: bool = False

    def bind(self, limits: Limits) -> Check:
        n, fields, required = static(self.max_bytes, limits), self.fields, self.required

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                s = rec[f]
                if _too_long(s, n):
                    return f"{path}{f}: {_nbytes(s)} bytes, more than {n}"
                if required and not s:
                    return f"{path}{f} is empty"
            return None
        return check


@dataclass(frozen=True)
class Times(Rule):
    """Wall-clock times in epoch ms (``timestamp-millis``); 0 allowed when ``unset_ok``."""

    fields: Fields
    unset_ok: bool = False

    def bind(self, limits: Limits) -> Check:
        lo, hi, fields, unset_ok = limits.min_time_ms, limits.max_time_ms, self.fields, self.unset_ok

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                ms = epoch_ms(rec[f])
                if not (lo <= ms <= hi or (unset_ok and ms == 0)):
                    return f"{path}{f} = {ms} ms: not a wall-clock time between 2000 and 2100"
            return None
        return check


@dataclass(frozen=True)
class IntArrays(Rule):
    fields: Fields
    lo: Bound
    hi: Bound

    def bind(self, limits: Limits) -> Check:
        lo_of, hi_of, fields, most = resolve(self.lo, limits), resolve(self.hi, limits), self.fields, limits.max_items
        # Avro longs cannot pass INT64_MAX: skip that pass over the column
        open_top = not isinstance(self.hi, (LastIndexOf, Below)) and hi_of({}) >= INT64_MAX

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                a = rec[f]
                if len(a) > most:
                    return f"{path}{f}: {len(a)} entries, more than {most}"
                if len(a):
                    lo, hi = lo_of(root), hi_of(root)
                    if type(a) is list:  # v1..v7 columns, groups' ranks
                        bad = min(a) < lo or (not open_top and max(a) > hi)
                    elif hasattr(a, "dtype") and len(a) >= NUMPY_FROM:  # EventBatch v8: numpy's own loops
                        bad = int(a.min()) < lo or (not open_top and int(a.max()) > hi)
                    else:
                        a = a.tolist() if hasattr(a, "tolist") else a  # a short array: a numpy call costs more
                        bad = min(a) < lo or (not open_top and max(a) > hi)
                    if bad:
                        i = next(i for i, v in enumerate(a) if not lo <= v <= hi)
                        return f"{path}{f}[{i}] = {a[i]}: outside [{lo}, {hi}]"
            return None
        return check


@dataclass(frozen=True)
class FloatArrays(Rule):
    fields: Fields
    lo: Bound
    hi: Bound

    def bind(self, limits: Limits) -> Check:
        lo, hi, fields, most = static(self.lo, limits), static(self.hi, limits), self.fields, limits.max_items

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                a = rec[f]
                if len(a) > most:
                    return f"{path}{f}: {len(a)} entries, more than {most}"
                # a NaN or inf anywhere makes the sum non-finite (min/max skip NaN)
                if a and not (math.isfinite(sum(a)) and min(a) >= lo and max(a) <= hi):
                    i = next(i for i, v in enumerate(a) if not (math.isfinite(v) and lo <= v <= hi))
                    return f"{path}{f}[{i}] = {a[i]!r}: not a finite number in [{lo}, {hi}]"
            return None
        return check


@dataclass(frozen=True)
class StrArrays(Rule):
    fields: Fields
    max_bytes: Bound

    def bind(self, limits: Limits) -> Check:
        n, fields, most = static(self.max_bytes, limits), self.fields, limits.max_items

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                a = rec[f]
                if len(a) > most:
                    return f"{path}{f}: {len(a)} entries, more than {most}"
                if a and max(map(len, a)) * 4 > n:
                    for i, s in enumerate(a):
                        if _too_long(s, n):
                            return f"{path}{f}[{i}]: {_nbytes(s)} bytes, more than {n}"
            return None
        return check


@dataclass(frozen=True)
class SameLength(Rule):
    """Columnar block: every array of equal length."""

    fields: Fields

    def bind(self, limits: Limits) -> Check:
        fields = self.fields

        def check(rec: dict, root: dict, path: str) -> str | None:
            lengths = [len(rec[f]) for f in fields]
            if min(lengths) != max(lengths):
                shown = ", ".join(f"{f}={n}" for f, n in zip(fields, lengths, strict=True))
                return f"{path}columns of unequal length ({shown})"
            return None
        return check


@dataclass(frozen=True)
class RankInWorld(Rule):
    """``rank < world_size``; with ``unknown_ok`` a world size of 0 means not known yet."""

    rank: str
    world: str
    unknown_ok: bool = False

    def bind(self, limits: Limits) -> Check:
        rank_f, world_f, unknown_ok = self.rank, self.world, self.unknown_ok

        def check(rec: dict, root: dict, path: str) -> str | None:
            rank, world = rec[rank_f], rec[world_f]
            if rank >= world and not (unknown_ok and world == 0):
                return f"{path}{rank_f} = {rank}: not below {world_f} = {world}"
            return None
        return check


@dataclass(frozen=True)
class MembersRange(Rule):
    """A process group's members given as a range (``<prefix>_first``, ``_step``, ``_count``;
    absent or a count of 0: listed in ``<prefix>``, checked apart; EventBatch v9, FunctionPattern
    v3): a count of at most ``max_items``, a step of at least 1, every member in [0, ``hi``], and
    no list beside it."""

    prefix: str
    hi: Bound

    def bind(self, limits: Limits) -> Check:
        listed, hi_of, most = self.prefix, resolve(self.hi, limits), limits.max_items
        first_f, step_f, count_f = self.fields()

        def check(rec: dict, root: dict, path: str) -> str | None:
            count = rec.get(count_f, 0)
            if not count:
                return None
            first, step, hi = rec.get(first_f, 0), rec.get(step_f, 0), hi_of(root)
            if not 0 < count <= most:
                return f"{path}{count_f} = {show(count)}: outside [0, {most}]"
            if step < 1:
                return f"{path}{step_f} = {show(step)}: a range of members needs a step of at least 1"
            last = first + step * (count - 1)
            if first < 0 or last > hi:
                return f"{path}{first_f} = {first}, {step_f} = {step}, {count_f} = {count}: members up to {last}, " \
                       f"outside [0, {hi}]"
            if len(rec[listed]):
                return f"{path}{listed}: listed beside a range of {count} members"
            return None
        return check

    def fields(self) -> tuple[str, str, str]:
        """The range's fields: first member, step, count."""
        return f"{self.prefix}_first", f"{self.prefix}_step", f"{self.prefix}_count"


@dataclass(frozen=True)
class TotalWithin(Rule):
    """A summed duration is at most ``max(count, 1)`` times the longest plausible one."""

    total: str
    count: str

    def bind(self, limits: Limits) -> Check:
        total_f, count_f, longest = self.total, self.count, limits.max_duration_ns

        def check(rec: dict, root: dict, path: str) -> str | None:
            total, count = rec[total_f], rec[count_f]
            if total > max(count, 1) * longest:
                return f"{path}{total_f} = {total}: more than {count_f} = {count} times {longest}"
            return None
        return check


@dataclass(frozen=True)
class Packed(Rule):
    """EventBatch v8 packed columns of one block (:mod:`.columns`): a column the decoder left as
    bytes is not a whole number of its items (truncated or padded). Columns that are lists
    or arrays pass; the rules after this one check them as arrays."""

    block: str

    def bind(self, limits: Limits) -> Check:
        cols = columns.PACKED[self.block]

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f, code in cols:
                a = rec.get(f)
                if columns.is_raw(a):
                    why = columns.raw_problem(a, code) or "still packed bytes (not decoded by the codec)"
                    return f"{path}{f}: {why}"
            return None
        return check


@dataclass(frozen=True)
class Block(Rule):
    """A nested record (e.g. EventBatch.spans)."""

    field: str
    rules: tuple[Rule, ...]
    optional: bool = False  # a field newer versions add: absent from older records (decoded by their writer schema)

    def bind(self, limits: Limits) -> Check:
        checks, field, optional = bind_all(self.rules, limits), self.field, self.optional

        def check(rec: dict, root: dict, path: str) -> str | None:
            if optional and not rec.get(field):
                return None
            return run(checks, rec[field], root, f"{path}{field}.")
        return check


@dataclass(frozen=True)
class Items(Rule):
    """An array of records, each checked with ``rules``."""

    field: str
    rules: tuple[Rule, ...]
    optional: bool = False  # a field newer versions add: absent from older records (decoded by their writer schema)

    def bind(self, limits: Limits) -> Check:
        checks, field, most = bind_all(self.rules, limits), self.field, limits.max_items
        optional = self.optional

        def check(rec: dict, root: dict, path: str) -> str | None:
            items = rec.get(field, ()) if optional else rec[field]
            if len(items) > most:
                return f"{path}{field}: {len(items)} entries, more than {most}"
            for i, item in enumerate(items):
                for each in checks:
                    if each(item, root, ""):  # the item's path is needed for the message only: built then
                        return run(checks, item, root, f"{path}{field}[{i}].")
            return None
        return check


def bind_all(rules: tuple[Rule, ...], limits: Limits, fast: bool = True) -> tuple[Check, ...]:
    """Each rule bound with ``limits``; with ``fast``, the numpy columns of the blocks that
    allow it are checked together first (:func:`with_fast_blocks`: same verdicts, same messages)."""
    checks = tuple(rule.bind(limits) for rule in rules)
    return with_fast_blocks(rules, checks, limits) if fast else checks


def run(checks: tuple[Check, ...], rec: dict, root: dict, path: str = "") -> str | None:
    for check in checks:
        reason = check(rec, root, path)
        if reason:
            return reason
    return None


# ---- the fast path for EventBatch v8's numpy columns ---------------------------------------------
# A v8 block's columns are short numpy arrays (tens of values), so a numpy or list call per column
# and rule costs more than the values' own work. A valid batch has every column of every block an
# int array, of one length per block, within its bounds: one concatenation of all the bounded
# columns and one min and one max per column (``reduceat``) show that. Anything else runs the
# per-rule checks, whose first failing one gives the message as before. A block known to pass is
# skipped, so the first failing rule, and with it the verdict and the message, cannot change.

DynamicBound = tuple[int, bool, Callable[[dict], Any]]  # (column, whether its high bound, bound of the record)


@dataclass(frozen=True)
class BlockPlan:
    """What a :class:`Block` of EventBatch v8's shape asks of its columns, the bounds that do not
    depend on the record resolved once: each column a numpy array; with ``same``, all of one
    length and each within ``lows[i]``..``highs[i]`` (None there: set by ``dynamic``)."""

    field: str
    optional: bool
    columns: Fields
    same: bool
    lows: tuple[Any, ...]
    highs: tuple[Any, ...]
    dynamic: tuple[DynamicBound, ...]


def _plan_bound(bound: Bound, limits: Limits) -> tuple[Any, Callable[[dict], Any] | None]:
    """A bound as (its value, None) when static, (None, its function of the record) otherwise."""
    if depends_on_record(bound):
        return None, resolve(bound, limits)
    return static(bound, limits), None


def plan_block(block: Block, limits: Limits) -> BlockPlan | None:
    """The fast path's plan of ``block``, or None unless its rules are EventBatch v8's shape: one
    :class:`Packed` and nothing else, or at most one Packed, one :class:`SameLength` and
    :class:`IntArrays` bounding each of its columns once (the Packed block's columns, if any).
    A block of another shape keeps the per-rule checks only."""
    packed = [r for r in block.rules if isinstance(r, Packed)]
    same = [r for r in block.rules if isinstance(r, SameLength)]
    ints = [r for r in block.rules if isinstance(r, IntArrays)]
    if len(packed) + len(same) + len(ints) != len(block.rules) or len(packed) > 1 or len(same) > 1:
        return None
    packed_fields = tuple(f for r in packed for f, _ in columns.PACKED[r.block])
    bounded = tuple(f for r in ints for f in r.fields)
    if not same:
        return BlockPlan(block.field, block.optional, packed_fields, False, (), (), ()) if not ints else None
    if sorted(bounded) != sorted(set(same[0].fields)) or (packed and set(packed_fields) != set(bounded)):
        return None
    lows: list[Any] = []
    highs: list[Any] = []
    dynamic: list[DynamicBound] = []
    for rule in ints:
        (lo, lo_of), (hi, hi_of) = _plan_bound(rule.lo, limits), _plan_bound(rule.hi, limits)
        for _ in rule.fields:
            dynamic += [(len(lows), False, lo_of)] if lo_of else []
            dynamic += [(len(lows), True, hi_of)] if hi_of else []
            lows.append(lo)
            highs.append(hi)
    return BlockPlan(block.field, block.optional, bounded, True, tuple(lows), tuple(highs), tuple(dynamic))


def _getter(fields: Fields) -> Callable[[dict], tuple]:
    """A function of a record giving the values of ``fields`` as a tuple (one C call)."""
    if len(fields) == 1:
        only = fields[0]
        return lambda rec: (rec[only],)
    return itemgetter(*fields) if fields else lambda rec: ()


def blocks_pass(plans: tuple[BlockPlan, ...], most: int, np: Any) -> Callable[[dict, dict], bool]:
    """A function of (record, whole record) that is True only when every planned block's rules
    pass: its columns numpy arrays, and with ``same`` int arrays of one length, at most ``most``
    long, within their bounds. False means "not known": the per-rule checks decide. May raise on a
    malformed record."""
    ndarray = np.ndarray
    arrays_only = {ndarray}
    concatenate, int64, as_array = np.concatenate, np.int64, np.array
    lowest, highest = np.minimum.reduceat, np.maximum.reduceat
    steps = tuple((plan, _getter(plan.columns)) for plan in plans)

    def passes(rec: dict, root: dict) -> bool:
        seen: list[Any] = []  # every column, all to be numpy arrays
        bounded: list[Any] = []  # the columns of the non-empty blocks with bounds
        starts: list[int] = []
        lows: list[Any] = []
        highs: list[Any] = []
        end = 0
        for plan, get in steps:
            part = rec.get(plan.field) if plan.optional else rec[plan.field]
            if plan.optional and not part:
                continue
            if type(part) is not dict:
                return False
            block = get(part)
            if type(block[0]) is not ndarray:  # list columns (v1..v7): leave at once
                return False
            seen += block
            if not plan.same:
                continue
            lengths = {*map(len, block)}
            n = lengths.pop()
            if lengths or n > most:
                return False
            if n:
                first = len(lows)
                bounded += block
                starts += range(end, end + n * len(block), n)
                end += n * len(block)
                lows += plan.lows
                highs += plan.highs
                for i, high, bound_of in plan.dynamic:
                    (highs if high else lows)[first + i] = bound_of(root)
        if {*map(type, seen)} != arrays_only:
            return not seen
        if not bounded:
            return True
        values = concatenate(bounded, dtype=int64, casting="safe")  # TypeError unless all ints (or bools)
        if values.ndim != 1:
            return False
        at = as_array(starts)
        return all(map(le, lows, lowest(values, at).tolist())) and all(map(le, highest(values, at).tolist(), highs))
    return passes


def with_fast_blocks(rules: tuple[Rule, ...], checks: tuple[Check, ...], limits: Limits) -> tuple[Check, ...]:
    """``checks`` (``rules`` bound) as one check that first tries the planned blocks' fast path
    (:func:`blocks_pass`) and, when it holds, runs the other checks only; otherwise all of them.
    Unchanged without numpy or without a block to plan."""
    plans = {i: plan for i, rule in enumerate(rules) if isinstance(rule, Block) and (plan := plan_block(rule, limits))}
    np = _numpy()
    if np is None or not plans:
        return checks
    passes = blocks_pass(tuple(plans.values()), limits.max_items, np)
    rest = tuple(c for i, c in enumerate(checks) if i not in plans)

    def check(rec: dict, root: dict, path: str) -> str | None:
        try:
            fast = passes(rec, root)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError):
            fast = False  # a malformed record: the per-rule checks name it
        return run(rest if fast else checks, rec, root, path)
    return (check,)


@cache
def _numpy() -> Any:
    """numpy, or None (the slim collector install: its columns are not numpy arrays anyway)."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy
