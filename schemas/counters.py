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
docstring for what that gives up).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterator, Sequence
from typing import ClassVar, NamedTuple, NoReturn, overload


class Kind(enum.Enum):
    COUNTER = "counter"  # only goes up, or mirrors a count kept elsewhere
    GAUGE = "gauge"  # a current value: goes up and down, or is set


class Counter:
    """Declares one counter (or gauge) of a :class:`CounterSet` subclass.

    ``help`` says what is counted, with its unit; ``labels`` name the dimensions
    a value is kept per (each ``inc`` gives one value per label, in this order);
    ``initial`` is every series' value before anything is counted (e.g. -1: unknown).
    """

    __slots__ = ("help", "initial", "kind", "labels", "name")

    def __init__(self, help: str, *, labels: Sequence[str] = (), kind: Kind = Kind.COUNTER,
                 initial: int = 0):
        self.help = help
        self.labels = tuple(labels)
        self.kind = kind
        self.initial = initial
        self.name = ""

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
        return f"Counter({self.name!r}, labels={self.labels})"


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


class Sample(NamedTuple):
    """One series at one moment: what an exporter formats (Prometheus text, JSON)."""

    component: str
    name: str
    help: str
    kind: Kind
    labels: tuple[tuple[str, str], ...]  # (label name, value) in declaration order
    value: int


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
                self._series[counter][()] = Cell(counter.initial)

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
                cell = series.setdefault(labels, Cell(counter.initial))
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

    def value(self, counter: Counter, *labels: str) -> int:
        """One series' value (its initial value if nothing was counted for these labels)."""
        cell = self._series[counter].get(labels)
        return cell.value if cell is not None else counter.initial

    def series(self, counter: Counter) -> dict[tuple[str, ...], int]:
        """Every series of one counter: label values -> value."""
        with self._lock:
            return {labels: cell.value for labels, cell in self._series[counter].items()}

    def snapshot(self) -> dict[str, int]:
        """Flat, JSON-ready: ``name`` for an unlabelled counter, ``name.value1.value2`` for a
        labelled one (empty label values left out, as Prometheus treats an empty label)."""
        with self._lock:
            return {".".join((counter.name, *(v for v in labels if v))): cell.value
                    for counter, series in self._series.items() for labels, cell in series.items()}

    def samples(self) -> Iterator[Sample]:
        """Every series with its declaration, for an exporter."""
        for counter in self.declared:
            for labels, value in self.series(counter).items():
                yield Sample(self.component, counter.name, counter.help, counter.kind,
                             tuple(zip(counter.labels, labels, strict=True)), value)
