"""The typed records the window's rules read and hand on (:mod:`.pipeline`): a rank's
:class:`Outlier` in one function and its :class:`LateArrival` in one collective.

Each is built once from the comparisons (:func:`outliers_by_rank`, and
:func:`.stragglers.find_stragglers` for late arrivals): a ``RankOutlier`` or ``Straggler`` of a
:class:`...schemas.records.FunctionComparison` with the comparison's function (and kind). The
rules read their fields by name, never a dict by string keys. Values are kept as the record
carries them (no rounding, no conversion), so the findings built from them are unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from ...schemas.records import FunctionComparison
from ...schemas.vocabulary import SpanKind


@dataclass(frozen=True, kw_only=True)
class Outlier:
    """One rank above its peers in one non-collective function (a ``RankOutlier`` of the
    function's comparison, with its ``function`` and SpanKind ``kind``). Fields a record lacks
    (an older or partial record) take their defaults."""

    rank: int
    function: str
    kind: int
    host: str = ""
    gpu: int = -1
    peer_group: str = ""
    value_ms_per_step: float = 0.0
    peer_median_ms_per_step: float = 0.0
    ratio: float = 0.0
    robust_z: float = 0.0
    cost_ms_per_step: float = 0.0
    calls_ratio: float = 1.0
    per_call_ratio: float = 1.0
    intermittent: bool = False

    @classmethod
    def of(cls, entry: Mapping[str, Any], function: str, kind: int) -> Outlier:
        """The outlier ``entry`` (a RankOutlier) of the comparison of ``function`` (of ``kind``)."""
        return cls(function=function, kind=kind, **_known(cls, entry, ("function", "kind")))


@dataclass(frozen=True, kw_only=True)
class LateArrival:
    """One rank last into a collective more often than chance, a late culprit (a ``Straggler``
    of the collective's comparison, with the collective's ``function``)."""

    rank: int
    function: str
    host: str = ""
    gpu: int = -1
    late_seqs: int = 0
    late_fraction: float = 0.0
    caused_ms_per_step: float = 0.0
    p_value: float = 1.0

    @classmethod
    def of(cls, entry: Mapping[str, Any], function: str) -> LateArrival:
        """The straggler ``entry`` of the collective ``function``'s comparison."""
        return cls(function=function, **_known(cls, entry, ("function",)))


def _known(cls: type, entry: Mapping[str, Any], given: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``cls`` that ``entry`` carries, as it carries them, but the ``given`` ones."""
    return {f.name: entry[f.name] for f in fields(cls) if f.name in entry and f.name not in given}


Outliers = dict[int, list[Outlier]]  # rank -> its outliers
LateArrivals = dict[int, list[LateArrival]]  # rank -> its late arrivals


def outliers_by_rank(comparisons: list[FunctionComparison],
                     field: Literal["outliers", "minor_outliers"]) -> Outliers:
    """Rank -> its ``field`` entries (``outliers`` or ``minor_outliers``) of the non-collective
    comparisons, each an :class:`Outlier` with its function and kind."""
    out: Outliers = defaultdict(list)
    for c in comparisons:
        if c["kind"] != SpanKind.COLLECTIVE:
            for o in c.get(field) or []:
                out[int(o["rank"])].append(Outlier.of(o, c["function"], c["kind"]))
    return out
