"""Building blocks of content validation (:mod:`.validate`): limits, bounds and rule types.

A rule is a frozen dataclass naming fields and bounds (data, so the sink can render the
same rules as SQL constraints); :meth:`Rule.bind` turns it into a check function with the
bounds resolved once per :class:`Limits`, so checking a record is a few calls of builtins
(``min``, ``max``, ``sum``: C loops over the decoded lists) per field.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
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
        lo_of, hi_of, fields = resolve(self.lo, limits), resolve(self.hi, limits), self.fields

        def check(rec: dict, root: dict, path: str) -> str | None:
            lo, hi = lo_of(root), hi_of(root)
            for f in fields:
                v = rec[f]
                if not lo <= v <= hi:
                    return f"{path}{f} = {show(v)}: outside [{lo}, {hi}]"
            return None
        return check


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
                    if hasattr(a, "dtype") and len(a) >= NUMPY_FROM:  # EventBatch v8: numpy's own loops
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
                reason = run(checks, item, root, f"{path}{field}[{i}].")
                if reason:
                    return reason
            return None
        return check


def bind_all(rules: tuple[Rule, ...], limits: Limits) -> tuple[Check, ...]:
    return tuple(rule.bind(limits) for rule in rules)


def run(checks: tuple[Check, ...], rec: dict, root: dict, path: str = "") -> str | None:
    for check in checks:
        reason = check(rec, root, path)
        if reason:
            return reason
    return None
