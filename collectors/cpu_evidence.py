"""Wires the training thread's CPU evidence into the sender: /proc deltas and stack samples;
and the rank's network evidence (:mod:`.net_stats`).

Started by :meth:`.collector.Collector.start` for the thread that attached (the training
thread). Every send cycle, on the sender thread, :meth:`CpuEvidence.collect` reads the
``/proc`` deltas (:mod:`.cpu_stats`) and the stack counts (:mod:`.stack_sampler`) of the
interval and hands them to the sender for the next batch. Nothing runs on the training
thread; every failure is counted (``cpu_read_errors``, ``stack_samples_skipped``).
"""

from __future__ import annotations

import threading

from .batch import StackRow
from .counters import CollectorCounters
from .cpu_stats import CpuReader
from .net_stats import NetReader
from .stack_sampler import StackSampler
from .transport import Sender


class CpuEvidence:
    """Reads the /proc counters and drives the stack sampler of one training thread."""

    def __init__(self, sender: Sender, counters: CollectorCounters, hz: float,
                 thread: threading.Thread | None = None, user_code: tuple[str, ...] = ()):
        thread = thread or threading.current_thread()
        self.sender, self.counters = sender, counters
        self.reader = CpuReader(thread.native_id or 0)
        self.hz = hz
        self.stacks = StackSampler(thread.ident or 0, hz, user_code) if hz > 0 else None
        self._errors_seen = 0
        self.net = NetReader()
        self._net_errors_seen = 0

    def start(self) -> None:
        self.reader.sample()  # the baseline the first interval is measured from
        self.net.sample()
        if self.stacks is not None:
            self.stacks.start()
        self.sender.add_task(self.collect)

    def collect(self) -> None:
        """One interval's evidence to the sender (sender thread)."""
        sample = self.reader.sample()
        rows: list[StackRow] = []
        record = sample.as_record() if sample is not None else None
        if self.stacks is not None:
            counts = self.stacks.take()
            rows = counts.rows()
            self.counters.inc(CollectorCounters.stack_samples, by=counts.samples)
            skipped = sum(counts.skipped.values()) + self.stacks.errors
            self.stacks.errors = 0
            if skipped:
                self.counters.inc(CollectorCounters.stack_samples_skipped, by=skipped)
            if record is not None:
                record.update(stack_samples=counts.samples, stack_hz=float(self.hz))
        new_errors = self.reader.errors - self._errors_seen
        if new_errors:
            self.counters.inc(CollectorCounters.cpu_read_errors, by=new_errors)
            self._errors_seen = self.reader.errors
        self.sender.add_cpu(record, rows if record is not None else [])
        self._collect_net()

    def _collect_net(self) -> None:
        net = self.net.sample()
        if net is not None:
            self.sender.add_net(net.as_record())
        if self.net.errors != self._net_errors_seen:
            self.counters.inc(CollectorCounters.net_read_errors, by=self.net.errors - self._net_errors_seen)
            self._net_errors_seen = self.net.errors

    def close(self) -> None:
        if self.stacks is not None:
            self.stacks.close()
