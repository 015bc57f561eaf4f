"""Named counters: declared once per component, cheap to count, ready to export as metrics.

A component declares its counters as class attributes of a :class:`CounterSet`
subclass; the attribute's name is the counter's name::

    class SinkCounters(CounterSet):
        component = "sink"
        consumed = Counter("messages consumed from Kafka")
        dead_lettered = Counter("messages sent to the dead-letter topic", labels=("stage",))

    stats = SinkCounters()
    stats.inc(SinkCounters.consumed)             # +1, under the set's lock
    stats.inc(SinkCounters.dead_lettered, "decode", by=2)
    stats.consumed                               # 1: an unlabelled counter reads as its value
    stats.snapshot()                             # {"consumed": 1, "dead_lettered.decode": 2}

Counting costs one lock and one add (what prometheus client_python pays per
event); names and labels are only formatted by :meth:`CounterSet.snapshot` and
:meth:`CounterSet.samples`. A hot path that cannot afford a call and a lock
takes its :class:`Cell` once and adds to ``cell.value`` inline (see the cell's
docstring for what that gives up). A :class:`Histogram` counts observations
(latencies) into fixed buckets at the same cost:
``stats.observe(SinkCounters.flush_seconds, 12)``.

Names are in base units (``_seconds``, ``_bytes``; Prometheus' convention). A
value kept as an int in a smaller unit declares how many of those make one
unit of its name (``per_unit=1000``: counted and observed in ms, a
``_seconds`` name): counting stays an int add, and every view of it
(:meth:`CounterSet.samples`, :meth:`CounterSet.snapshot`, a histogram's bucket
bounds) gives the value divided by ``per_unit``, in the unit its name states.
"""

from __future__ import annotations

import bisect
import enum
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import ClassVar, NamedTuple, NoReturn, overload


class Kind(enum.Enum):
    COUNTER = "counter"  # only goes up, or mirrors a count kept elsewhere
    GAUGE = "gauge"  # a current value: goes up and down, or is set
    HISTOGRAM = "histogram"  # observations counted in buckets, with their sum (see Histogram)


class Counter:
    """Declares one counter (or gauge) of a :class:`CounterSet` subclass.

    ``help`` says what is counted, with its unit; ``labels`` name the dimensions
    a value is kept per (each ``inc`` gives one value per label, in this order);
    ``initial`` is every series' value before anything is counted (e.g. -1: unknown);
    ``per_unit``: how many counted units make one unit of the name (1000: counted in
    ms, named and exported in seconds; see the module docstring).
    """

    __slots__ = ("help", "initial", "kind", "labels", "name", "per_unit")

    def __init__(self, help: str, *, labels: Sequence[str] = (), kind: Kind = Kind.COUNTER,
                 initial: int = 0, per_unit: int = 1):
        if per_unit < 1:
            raise ValueError(f"per_unit must be at least 1, got {per_unit}")
        self.help = help
        self.labels = tuple(labels)
        self.kind = kind
        self.initial = initial
        self.per_unit = int(per_unit)
        self.name = ""

    def in_unit(self, value: int) -> float:
        """A counted value in the unit of the name (itself when ``per_unit`` is 1)."""
        return value if self.per_unit == 1 else value / self.per_unit

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Counter: ...
    @overload
    def __get__(self, obj: CounterSet, owner: type) -> int: ...

    def __get__(self, obj: CounterSet | None, owner: type) -> Counter | int:
        """On the class: the declaration. On a set: the value (labelled: the sum over labels)."""
        if obj is None:
            return self
        return obj.value(self) if not self.labels else sum(obj.series(self).values())

    def __set__(self, obj: CounterSet, value: object) -> NoReturn:
        raise AttributeError(f"counter {self.name!r} is changed with inc() or set(), not assigned")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, labels={self.labels})"

    def new_cell(self) -> Cell:
        return Cell(self.initial)


class Histogram(Counter):
    """Declares a histogram: :meth:`CounterSet.observe` counts a value into the first bucket
    whose upper bound holds it (inclusive, Prometheus' ``le``; above the last: ``+Inf``).

    Values and bounds are ints in the counted unit (ms for ``flush_seconds`` with
    ``per_unit=1000``); exported, the sum and the bounds are in the unit of the name. On a
    set it reads as the number of observations; its series carry the counts and the sum.
    """

    __slots__ = ("buckets",)

    def __init__(self, help: str, *, buckets: Sequence[int], labels: Sequence[str] = (), per_unit: int = 1):
        super().__init__(help, labels=labels, kind=Kind.HISTOGRAM, per_unit=per_unit)
        if not buckets or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"histogram buckets must be increasing and unique, got {buckets}")
        self.buckets = tuple(int(b) for b in buckets)

    def new_cell(self) -> Cell:
        return Buckets(len(self.buckets) + 1)


class Cell:
    """The value of one series (one counter, one set of label values).

    Everything but a hot path changes it through its set (``inc``/``set``, under
    the set's lock). A hot path may add to ``value`` directly: one attribute add,
    no call, no lock. Do that only for a cell nothing changes through the set.
    It is exact when one thread writes the cell; adds from several threads can
    in principle lose one another (CPython does not switch threads inside
    ``cell.value += 1`` in practice, but the language does not promise it),
    never corrupt the value. Reading is safe from any thread.
    """

    __slots__ = ("value",)

    def __init__(self, value: int = 0):
        self.value = value


class Buckets(Cell):
    """A histogram's series: ``value`` is the number of observations, ``counts`` the number in
    each bucket (not cumulative; the last one is ``+Inf``), ``sum`` their total."""

    __slots__ = ("counts", "sum")

    def __init__(self, n_buckets: int):
        super().__init__(0)
        self.counts = [0] * n_buckets
        self.sum = 0


class Sample(NamedTuple):
    """One series at one moment: what an exporter formats (Prometheus text, JSON)."""

    component: str
    name: str
    help: str
    kind: Kind
    labels: tuple[tuple[str, str], ...]  # (label name, value) in declaration order
    value: float  # in the unit of the name (an int unless the counter has a per_unit)
    suffix: str = ""  # a histogram's part: "_bucket" (labels end with ("le", bound)), "_sum", "_count"


class CounterSet:
    """The counters of one component; subclasses declare them (see the module docstring)."""

    component: ClassVar[str] = ""
    declared: ClassVar[tuple[Counter, ...]] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        found: dict[str, Counter] = {}
        for klass in reversed(cls.__mro__):
            found.update((k, v) for k, v in vars(klass).items() if isinstance(v, Counter))
        cls.declared = tuple(found.values())

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[Counter, dict[tuple[str, ...], Cell]] = {c: {} for c in self.declared}
        for counter in self.declared:
            if not counter.labels:
                self._series[counter][()] = counter.new_cell()

    def cell(self, counter: Counter, *labels: str) -> Cell:
        """The cell of one series, created at its first use."""
        try:
            series = self._series[counter]
        except KeyError:
            raise KeyError(f"{counter!r} is not declared by {type(self).__name__}") from None
        cell = series.get(labels)
        if cell is None:
            if len(labels) != len(counter.labels):
                raise ValueError(f"{counter.name} takes labels {counter.labels}, got {labels}")
            with self._lock:
                cell = series.setdefault(labels, counter.new_cell())
        return cell

    def inc(self, counter: Counter, *labels: str, by: int = 1) -> int:
        """Add ``by`` to the series of ``labels`` (a counter never goes down); return the new value."""
        if by < 0 and counter.kind is Kind.COUNTER:
            raise ValueError(f"counter {counter.name} cannot go down (by {by})")
        series = self._series.get(counter)
        cell = series.get(labels) if series is not None else None
        if cell is None:
            cell = self.cell(counter, *labels)
        with self._lock:
            cell.value += by
            return cell.value

    def set(self, counter: Counter, value: int, *labels: str) -> None:
        """A gauge's current value, or a counter mirrored from a count kept elsewhere."""
        cell = self.cell(counter, *labels)
        with self._lock:
            cell.value = value

    def observe(self, counter: Counter, value: int, *labels: str, times: int = 1) -> None:
        """Count ``times`` observations of a histogram (each ``value`` in its unit) for ``labels``."""
        cell = self.cell(counter, *labels)
        if not isinstance(counter, Histogram) or not isinstance(cell, Buckets):
            raise TypeError(f"{counter!r} is not a Histogram")
        i = bisect.bisect_left(counter.buckets, value)
        with self._lock:
            cell.counts[i] += times
            cell.sum += value * times
            cell.value += times

    def replace(self, counter: Counter, values: Mapping[tuple[str, ...], int]) -> None:
        """Every series of a labelled gauge at once (e.g. lag per assigned partition): series
        not in ``values`` are removed, so what is gone stops being exported."""
        for labels in values:
            self.cell(counter, *labels)
        with self._lock:
            series = self._series[counter]
            for labels in [k for k in series if k not in values]:
                del series[labels]
            for labels, value in values.items():
                series[labels].value = value

    def remove(self, counter: Counter, *labels: str) -> None:
        """Forget every series whose label values start with ``labels`` (a job gone): it stops
        being exported; counting it again starts it from its initial value."""
        n = len(labels)
        with self._lock:
            series = self._series[counter]
            for key in [k for k in series if k[:n] == labels]:
                del series[key]

    def value(self, counter: Counter, *labels: str) -> int:
        """One series' value (its initial value if nothing was counted for these labels)."""
        cell = self._series[counter].get(labels)
        return cell.value if cell is not None else counter.initial

    def series(self, counter: Counter) -> dict[tuple[str, ...], int]:
        """Every series of one counter: label values -> value."""
        with self._lock:
            return {labels: cell.value for labels, cell in self._series[counter].items()}

    def snapshot(self) -> dict[str, float]:
        """Flat, JSON-ready: ``name`` for an unlabelled counter, ``name.value1.value2`` for a
        labelled one (empty label values left out, as Prometheus treats an empty label).
        A histogram gives its number of observations, and their sum (in the unit of its
        name) as ``name_sum``."""
        out: dict[str, float] = {}
        with self._lock:
            for counter, series in self._series.items():
                for labels, cell in series.items():
                    values = tuple(v for v in labels if v)
                    if isinstance(cell, Buckets):
                        out[".".join((counter.name, *values))] = cell.value
                        out[".".join((counter.name + "_sum", *values))] = counter.in_unit(cell.sum)
                    else:
                        out[".".join((counter.name, *values))] = counter.in_unit(cell.value)
        return out

    def samples(self) -> Iterator[Sample]:
        """Every series with its declaration, for an exporter; a histogram's series as its
        cumulative buckets (``_bucket``, label ``le``), ``_sum`` and ``_count``."""
        for counter in self.declared:
            with self._lock:
                cells = [(labels, cell.value, list(getattr(cell, "counts", ())), getattr(cell, "sum", 0))
                         for labels, cell in self._series[counter].items()]
            for labels, value, counts, total in cells:
                named = tuple(zip(counter.labels, labels, strict=True))
                if not isinstance(counter, Histogram):
                    yield Sample(self.component, counter.name, counter.help, counter.kind, named,
                                 counter.in_unit(value))
                    continue
                yield from self._histogram_samples(counter, named, counts, total, value)

    def _histogram_samples(self, counter: Histogram, named: tuple[tuple[str, str], ...],
                           counts: list[int], total: int, value: int) -> Iterator[Sample]:
        head = (self.component, counter.name, counter.help, counter.kind)
        running = 0
        bounds = (str(b) if counter.per_unit == 1 else repr(b / counter.per_unit) for b in counter.buckets)
        for bound, n in zip((*bounds, "+Inf"), counts, strict=True):
            running += n
            yield Sample(*head, (*named, ("le", bound)), running, "_bucket")
        yield Sample(*head, named, counter.in_unit(total), "_sum")
        yield Sample(*head, named, value, "_count")
