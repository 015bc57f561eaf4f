"""A slow or lossy link named by host from the hosts' own network evidence (net_links.py)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from perftracker_ml.schemas.causes import Cause
from perftracker_ml.schemas.vocabulary import SpanKind
from perftracker_ml.streams.detect.net_links import net_link_findings
from perftracker_ml.streams.detect.policy import DetectionPolicy

from .synth import rank_window

POLICY = DetectionPolicy()


def addr(host: int) -> str:
    return f"10.77.0.{10 + host}"


def rw(rank: int, backlog: dict[int, tuple[int, int]] | None = None, samples: int = 5,
       retrans_pct: float = 0.0) -> dict:
    """Rank ``rank`` alone on host h<rank>; ``backlog``: remote host -> (samples backed up, bytes)."""
    json_backlog = {addr(h): [b] * k for h, (k, b) in (backlog or {}).items()}
    return rank_window(rank, world=4, host=f"h{rank}", net_samples=samples, net_addr=addr(rank),
                       net_retrans_pct=retrans_pct, net_tx_mb_per_s=3.0, net_rx_mb_per_s=3.0,
                       net_backlog_json=json.dumps(json_backlog) if json_backlog else "",
                       ib_xmit_wait_per_s=-1.0, ib_errors=-1)


def allreduce(transfer_ms: float = 400.0, n: int = 4) -> dict:
    return {"function": "comm:all_reduce:0", "kind": SpanKind.COLLECTIVE, "members": list(range(n)),
            "transfer_ms_per_step": transfer_ms}


def ring(slow: int, n: int = 4, k: int = 5) -> dict[int, dict]:
    """A ring h_i -> h_{i+1}: the slow host's own sends back up, and so do its sender's."""
    out = {r: rw(r) for r in range(n)}
    out[slow] = rw(slow, {(slow + 1) % n: (k, 1_100_000)})
    sender = (slow - 1) % n
    out[sender] = rw(sender, {slow: (k, 900_000)})
    return out


def test_the_host_at_an_end_of_every_backed_up_connection_is_named_with_its_numbers():
    findings, ranks = net_link_findings([allreduce()], ring(slow=1), POLICY)
    assert ranks == {1}
    [f] = findings
    assert (f.cause, f.hosts, f.ranks) == (Cause.SLOW_LINK, ("h1",), (1,))
    assert f.impact_ms == 400.0 and f.evidence["explains_ms"] == 400.0
    assert {(e["from"], e["to"]) for e in f.evidence["backed_up"]} == {("h1", "h2"), ("h0", "h1")}
    assert f.evidence["drained_hosts"] == ["h2", "h3"]
    assert "slow network link at host h1" in f.summary and "h1->h2 (5/5 samples, 1.10 MB unsent)" in f.summary


@given(st.integers(0, 5), st.integers(4, 8))
def test_any_slow_host_of_any_ring_is_the_one_named(slow: int, n: int):
    slow %= n
    findings, _ = net_link_findings([allreduce(n=n)], ring(slow, n), POLICY)
    assert [f.hosts for f in findings] == [(f"h{slow}",)]


def test_queues_backed_up_in_fewer_than_half_the_samples_are_a_link_that_keeps_up():
    assert net_link_findings([allreduce()], ring(slow=1, k=2), POLICY) == ([], set())


def test_small_messages_awaiting_a_delayed_ack_are_not_a_backlog():
    windows = ring(slow=1)
    windows[3] = rw(3, {0: (5, 48), 2: (5, 96)})  # every sample, a few dozen bytes
    findings, _ = net_link_findings([allreduce()], windows, POLICY)
    assert [f.hosts for f in findings] == [("h1",)]
    windows = {r: rw(r, {(r + 1) % 4: (5, 48)}) for r in range(4)}
    assert net_link_findings([allreduce()], windows, POLICY) == ([], set())


def test_every_host_backed_up_is_a_saturated_network_not_one_link():
    windows = {r: rw(r, {(r + 1) % 4: (5, 1_000_000)}) for r in range(4)}
    assert net_link_findings([allreduce()], windows, POLICY) == ([], set())


def test_two_hosts_cannot_tell_the_ends_of_their_link_apart():
    windows = {0: rw(0, {1: (5, 1_000_000)}), 1: rw(1)}
    assert net_link_findings([allreduce()], windows, POLICY) == ([], set())


def test_a_link_that_costs_nothing_is_not_a_finding():
    assert net_link_findings([allreduce(transfer_ms=0.01)], ring(slow=1), POLICY) == ([], set())


def test_a_host_retransmitting_far_more_than_its_peers_loses_packets():
    windows = {r: rw(r, retrans_pct=0.05) for r in range(4)}
    windows[2] = rw(2, retrans_pct=4.0)
    [f] = net_link_findings([allreduce()], windows, POLICY)[0]
    assert f.hosts == ("h2",) and f.evidence["retrans_pct"] == 4.0
    assert "h2 retransmits 4.00% of its TCP segments (other hosts 0.05%)" in f.summary


def test_ranks_without_network_evidence_are_left_out():
    windows = {r: rank_window(r, world=4, host=f"h{r}") for r in range(4)}
    assert net_link_findings([allreduce()], windows, POLICY) == ([], set())


def test_malformed_backlog_evidence_is_skipped_not_raised():
    windows = ring(slow=1)
    for r, bad in ((2, '{"10.77.0.11": ["x", null, Infinity, NaN]}'), (3, '{"10.77.0.10": 5}'), (0, "[1, 2]")):
        windows[r] = dict(windows[r], net_backlog_json=bad)
    windows[1] = dict(windows[1], net_backlog_json="not json")
    assert net_link_findings([allreduce()], windows, POLICY) == ([], set())
