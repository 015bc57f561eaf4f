"""The per-host relay: its frames, its grouping (pure), and the rank's sink over a real Unix socket."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perftracker_ml.collectors.counters import CollectorCounters
from perftracker_ml.collectors.relay import FrameError, RelaySink, frame, parse_frame
from perftracker_ml.collectors.relay_server import RelayBuffer, RelayCounters
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.schemas import bundle


@settings(max_examples=100, deadline=None)
@given(topic=st.text(min_size=1, max_size=30), key=st.binary(max_size=40), payload=st.binary(max_size=300))
def test_a_frame_reads_back_its_topic_key_and_message(topic, key, payload):
    assert parse_frame(frame(topic, key, payload)) == (topic, key, payload)


@pytest.mark.parametrize("data, problem", [
    (b"PTR", "shorter than its 8-byte header"),
    (b"XXXX\x01\x00\x00\x00t", "not b'PTR1'"),
    (b"PTR1\x09\x00\x00\x00abc", "cannot hold a topic of 9"),
    (b"PTR1\x00\x00\x00\x00abc", "cannot hold a topic of 0"),
    (b"PTR1\x01\x00\x00\x00\xff", "not UTF-8"),
])
def test_a_datagram_that_is_not_a_frame_is_refused_naming_why(data, problem):
    with pytest.raises(FrameError, match=problem.replace("(", r"\(")):
        parse_frame(data)


def test_a_hosts_ranks_of_one_job_go_out_together_after_the_linger_in_their_order():
    buf = RelayBuffer("h1", linger_s=0.2)
    for i, rank in enumerate((3, 1, 2)):
        buf.add(frame("pt.events", f"job-a|{rank}".encode(), f"a{rank}".encode()), 10.0 + i / 100)
    buf.add(frame("pt.events", b"job-b|0", b"b0"), 10.05)
    buf.add(frame("pt.hardware", b"job-a|1", b"hw1"), 10.1)
    assert buf.due(10.19) == [] and buf.size == 11
    assert buf.next_due_s(10.19) == pytest.approx(0.01)  # job-a's first (10.0) + linger - now
    assert buf.due(10.21) == [("pt.events", "job-a|relay:h1", [b"a3", b"a1", b"a2"])]
    assert buf.due(10.30) == [("pt.events", "job-b|relay:h1", [b"b0"]), ("pt.hardware", "job-a|relay:h1", [b"hw1"])]
    assert buf.groups == {} and buf.size == 0 and buf.counters.frames_in == 5


def test_a_full_group_goes_at_once_and_a_full_buffer_drops_and_counts():
    buf = RelayBuffer("h", linger_s=5.0, max_buffer_bytes=bundle.MAX_BYTES + 10)
    buf.add(frame("t", b"j|0", b"x" * bundle.MAX_BYTES), 0.0)
    buf.add(frame("t", b"j|1", b"y" * 20), 0.0)  # past the buffer's bound
    assert buf.counters.frames_dropped == 1
    (sent,) = buf.due(0.0)
    assert sent[2] == [b"x" * bundle.MAX_BYTES]


def test_a_bad_datagram_is_counted_and_the_rest_go_on():
    buf = RelayBuffer("h")
    buf.add(b"nonsense", 0.0)
    buf.add(frame("t", b"\xff\xfe|0", b"v"), 0.0)  # a key that is not UTF-8
    buf.add(frame("t", b"j|0", b"v"), 0.0)
    assert buf.counters.frames_bad == 2
    assert buf.due(0.0, flush=True) == [("t", "j|relay:h", [b"v"])]


def test_a_group_is_sent_as_bundles_whose_items_are_the_ranks_messages():
    items = [bytes([i % 256]) * 100 for i in range(1200)]  # past a bundle's records limit
    messages = bundle.bundled_counted(items)
    assert sum(n for _, n in messages) == len(items) and len(messages) == 2
    assert [i for m, _ in messages for i in bundle.records_in(m)] == items


class Direct:
    """Where the sink sends what the relay did not take (narrow stand-in for the KafkaSink)."""

    wire_at_ns = 0

    def __init__(self, counters):
        self.counters, self.sent, self.other = counters, [], []

    def send(self, key, payload, n_events):
        self.sent.append((key, payload, n_events))

    def send_to(self, topic, key, payload):
        self.other.append((topic, key, payload))

    def poll(self):
        pass

    def flush(self, timeout_s):
        return 0


def test_the_sink_hands_each_message_to_the_relay_socket_and_counts_it_sent(tmp_path):
    path = str(tmp_path / "relay.sock")
    relay = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    relay.bind(path)
    counters = CollectorCounters()
    made = []
    sink = RelaySink(path, "pt.events", counters, lambda: made.append(Direct(counters)) or made[-1], ErrorBudget())
    try:
        sink.send(b"j|3", b"batch", 7)
        sink.send_to("pt.hardware", b"j|3", b"hw")
        assert parse_frame(relay.recv(1 << 16)) == ("pt.events", b"j|3", b"batch")
        assert parse_frame(relay.recv(1 << 16)) == ("pt.hardware", b"j|3", b"hw")
        assert (counters.batches_relayed, counters.batches_sent, counters.events_sent, counters.sent_bytes) == (1, 1, 7, 5)
        assert made == [] and sink.flush(1.0) == 0  # no producer made while the relay takes everything
    finally:
        relay.close()
        sink.close()


def test_without_a_relay_the_sink_sends_to_kafka_directly_and_counts_the_fallback(tmp_path):
    path = str(tmp_path / "nobody.sock")
    counters = CollectorCounters()
    made: list[Direct] = []
    sink = RelaySink(path, "pt.events", counters, lambda: made.append(Direct(counters)) or made[-1], ErrorBudget())
    sink.send(b"j|0", b"batch", 3)
    sink.send_to("pt.hardware", b"j|0", b"hw")
    (direct,) = made
    assert direct.sent == [(b"j|0", b"batch", 3)] and direct.other == [("pt.hardware", b"j|0", b"hw")]
    assert counters.relay_fallbacks == 2 and counters.batches_relayed == 0
    sink.close()


def test_a_full_relay_queue_never_blocks_the_rank(tmp_path):
    path = str(tmp_path / "slow.sock")
    relay = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    relay.bind(path)  # bound, never read: its queue fills
    counters = CollectorCounters()
    made: list[Direct] = []
    sink = RelaySink(path, "pt.events", counters, lambda: made.append(Direct(counters)) or made[-1], ErrorBudget())
    try:
        for _ in range(5000):
            sink.send(b"j|0", b"x" * 4000, 1)
        assert counters.batches_relayed + len(made[0].sent) == 5000 and counters.relay_fallbacks > 0
    finally:
        relay.close()
        sink.close()


def test_counters_are_declared_with_help():
    assert RelayCounters.frames_in.help and CollectorCounters.relay_fallbacks.help


def test_the_relay_reads_each_datagram_whole_and_counts_one_cut_short(tmp_path, monkeypatch):
    from perftracker_ml.collectors import relay_server

    monkeypatch.setattr(relay_server, "MAX_DATAGRAM", 64)
    path = str(tmp_path / "r.sock")
    sock = relay_server.bind(path)
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sender.sendto(frame("t", b"j|0", b"small"), path)
        sender.sendto(frame("t", b"j|1", b"x" * 100), path)  # past the read buffer
        buf = RelayBuffer("h")
        relay_server.receive(sock, buf)
        relay_server.receive(sock, buf)
        assert buf.counters.frames_in == 1 and buf.counters.frames_bad == 1
        assert buf.due(0.0, flush=True) == [("t", "j|relay:h", [b"small"])]
    finally:
        sender.close()
        sock.close()


def test_the_relay_replaces_a_stale_socket_and_refuses_a_live_one_or_a_file(tmp_path):
    from perftracker_ml.collectors import relay_server
    from perftracker_ml.schemas.errors import ConfigError

    stale = str(tmp_path / "stale.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(stale)
    dead.close()  # the file stays, nobody reads it: a relay that died
    assert not relay_server.serving(stale)
    sock = relay_server.bind(stale)
    try:
        assert relay_server.serving(stale)
        with pytest.raises(ConfigError, match="another relay serves"):
            relay_server.bind(stale)  # the first relay is left serving
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"still mine", stale)
        assert sock.recv(64) == b"still mine"
    finally:
        sock.close()
    taken = tmp_path / "notes.txt"
    taken.write_text("keep me")
    with pytest.raises(ConfigError, match="not a socket"):
        relay_server.bind(str(taken))
    assert taken.read_text() == "keep me"
