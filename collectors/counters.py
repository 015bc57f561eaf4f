"""The collector's counters, declared once; one set per collector (see :mod:`..schemas.counters`)."""

from __future__ import annotations

from enum import Enum

from ..schemas.counters import Counter, CounterSet, Kind


class DropReason(str, Enum):
    """Why events were lost (the ``reason`` label of ``events_dropped``)."""

    BUFFER_FULL = "buffer_full"  # the recorder's bounded buffer was full: its oldest event fell out
    UNDELIVERED = "undelivered"  # in a batch the brokers never acknowledged (or no broker)
    CUDA_QUEUE_FULL = "cuda_queue_full"  # too many collectives' CUDA events still pending


class CollectorCounters(CounterSet):
    component = "collector"

    events_dropped = Counter("events lost before reaching Kafka; the total travels in every "
                             "batch header", labels=("reason",))
    events_sent = Counter("events in batches the brokers acknowledged")
    batches_sent = Counter("batches the brokers acknowledged")
    cycles_held = Counter("send cycles that kept their events for a larger message (batch_min_events, "
                          "batch_max_delay_s)")
    batches_failed = Counter("batches (and other records, e.g. HardwareBatch) not delivered: "
                             "producer queue full, broker away past message.timeout.ms, or no broker")
    sent_bytes = Counter("encoded bytes of the batches the brokers acknowledged")
    batches_relayed = Counter("batches handed to the host's relay (relay_socket; counted as sent: the relay "
                              "counts their delivery)")
    relay_fallbacks = Counter("messages sent to Kafka directly because the relay did not take them (not "
                              "running, its queue full, larger than a datagram)")
    events_in_flight = Counter("events produced whose delivery is not yet reported", kind=Kind.GAUGE)
    wire_bytes = Counter("bytes written to the brokers (compressed, with Kafka framing) up to "
                         "librdkafka's last statistics; -1 unknown", kind=Kind.GAUGE, initial=-1)
    wire_base_bytes = Counter("sent_bytes when wire_bytes was last read (the base of the "
                              "wire ratio)", kind=Kind.GAUGE)
    errors_caught = Counter("exceptions caught inside instrumentation (never raised into training)")
    gc_short_pauses = Counter("GC pauses shorter than gc_min_us: counted here, not sent")
    gc_short_pause_seconds = Counter("total duration of those short GC pauses, in seconds (counted in ns)",
                                     per_unit=1_000_000_000)
    profile_windows = Counter("profiling windows summarized and queued for sending")
    profile_windows_dropped = Counter("profiling windows running or unsummarized at exit, dropped: "
                                      "summarizing a trace would hold the process's exit up")
    exit_tasks_skipped = Counter("exits at which the sender thread was inside a periodic task (a CPU sample, the "
                                 "job agreement): the last batch went out without waiting for it")
    cpu_read_errors = Counter("/proc files of the training thread or host that could not be read or parsed "
                              "(no schedstat, thread gone, garbage); their values are sent as unknown")
    net_read_errors = Counter("/proc/self/net or InfiniBand counter files that could not be read or parsed; "
                              "their values are sent as unknown")
    stack_samples = Counter("samples taken of the training thread's Python stack")
    stack_samples_skipped = Counter("stack samples or frames skipped: thread gone, no user frame, "
                                    "too many distinct frames, non-UTF-8 names (escaped), errors")
