"""Slow or lossy network links named by host, from the hosts' own network evidence.

A collective group's time says the group is slow, not which link: in a ring or tree every
member waits for the slowest hop, so every member's transfer time rises together, and when
the job has one group there are no sibling groups to compare (:func:`.group_links.slow_links`).
The link shows in what each host reads in its own network namespace (RankWindow v6
``net_*``, :mod:`...collectors.net_stats`):

* **send queues**: a connection whose send queue holds more than ``backlog_min_bytes`` in
  most of a window's samples is backed up: its path cannot carry what the rank writes (an
  idle connection keeps a few dozen bytes of small messages waiting for a delayed ACK;
  data waiting for the link is segments' worth). Each backed-up
  connection is an edge (its host -> the host of its remote address). A host that is an end
  of *every* backed-up edge, while some hosts' connections stay drained, is the slow link's
  host: its outgoing connections back up because its link sends slowly, and its peers'
  connections to it because it receives slowly. Needs three or more hosts (with two, both
  ends of the one link are alike); with every host backed up the network as a whole is
  saturated, not one link, and nothing is named.
* **retransmits**: a host whose TCP retransmits are a large share of what it sends
  (``net_retrans_pct`` at least ``retrans_pct``, and several times the other hosts'
  median) loses packets on its link.

GPU/NCCL rank: NCCL over its socket transport (and gloo) shows here as on a CPU; NCCL over
InfiniBand or RoCE bypasses TCP, and its link shows as ``ib_xmit_wait_per_s`` (a port with
data and no credit) and ``ib_errors``, which a host above its peers' median adds to the
finding's evidence. CPU rank (gloo): send queues and retransmits. The cost is the time the
collectives through that host spend moving data (``transfer_ms_per_step``): a slow link
costs the whole job that much each step.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

import numpy as np

from ...schemas.causes import Cause
from ...schemas.records import FunctionComparison, RankWindow
from ...schemas.vocabulary import Kind, SpanKind
from .findings import Finding
from .policy import DetectionPolicy
from .shape import short_ranks


def net_link_findings(comparisons: list[FunctionComparison], rank_windows: dict[int, RankWindow],
                      policy: DetectionPolicy) -> tuple[list[Finding], set[int]]:
    """(one finding per host whose link is slow or lossy, the ranks on those hosts)."""
    hosts = _hosts(rank_windows)
    if len(hosts) < policy.link_min_hosts:
        return [], set()
    edges = _backed_up(rank_windows, hosts, policy)
    suspects: dict[str, dict[str, Any]] = defaultdict(dict)
    host = _common_end(edges, hosts)
    if host is not None:
        suspects[host]["backed_up"] = [{"from": a, "to": b, "samples": s, "median_bytes": q}
                                       for (a, b), (s, q) in sorted(edges.items())]
        suspects[host]["drained_hosts"] = sorted(set(hosts) - {a for a, _ in edges})
    for h, pct, others in _lossy(rank_windows, hosts, policy):
        suspects[h].update(retrans_pct=round(pct, 3), peer_retrans_pct=round(others, 3))
    findings, ranks = [], set()
    for h, ev in suspects.items():
        f = _finding(h, ev, hosts[h], comparisons, rank_windows, policy)
        if f is not None:
            findings.append(f)
            ranks |= set(f.ranks)
    return findings, ranks


def _hosts(rank_windows: dict[int, RankWindow]) -> dict[str, list[int]]:
    """Host -> its ranks that sent network evidence this window."""
    out: dict[str, list[int]] = defaultdict(list)
    for r, rw in rank_windows.items():
        if int(rw.get("net_samples", 0)) > 0:
            out[str(rw.get("host", "?"))].append(int(r))
    return dict(out)


def _backed_up(rank_windows: dict[int, RankWindow], hosts: dict[str, list[int]],
               policy: DetectionPolicy) -> dict[tuple[str, str], tuple[str, int]]:
    """(host, remote host) -> ("k/n" samples backed up, median unsent bytes) of each connection
    whose send queue held at least ``backlog_min_bytes`` in ``backlog_share`` of its rank's samples."""
    by_addr = {str(rw.get("net_addr")): str(rw.get("host")) for rw in rank_windows.values() if rw.get("net_addr")}
    edges: dict[tuple[str, str], tuple[str, int]] = {}
    for ranks in hosts.values():
        for r in ranks:
            rw = rank_windows[r]
            n = int(rw.get("net_samples", 0))
            backlog = _json(str(rw.get("net_backlog_json") or ""))
            for remote, queued in backlog.items():
                full = [b for b in _ints(queued) if b >= policy.backlog_min_bytes]
                if n >= 2 and len(full) / n >= policy.backlog_share:
                    edges[(str(rw.get("host")), by_addr.get(remote, remote))] = (f"{len(full)}/{n}",
                                                                                 int(np.median(full)))
    return edges


def _common_end(edges: dict[tuple[str, str], tuple[str, int]], hosts: dict[str, list[int]]) -> str | None:
    """The one host at an end of every backed-up edge, when some host's connections stayed drained."""
    if not edges or {a for a, _ in edges} >= set(hosts):
        return None
    common = set.intersection(*({a, b} for a, b in edges))
    return next(iter(common)) if len(common) == 1 else None


def _lossy(rank_windows: dict[int, RankWindow], hosts: dict[str, list[int]],
           policy: DetectionPolicy) -> list[tuple[str, float, float]]:
    """(host, its retransmit %, the other hosts' median) for hosts that lose packets."""
    pct = {h: max(float(rank_windows[r].get("net_retrans_pct", -1.0)) for r in rs) for h, rs in hosts.items()}
    out = []
    for h, p in pct.items():
        others = [v for o, v in pct.items() if o != h and v >= 0]
        if others and p >= policy.retrans_pct and p >= policy.retrans_ratio * float(np.median(others)):
            out.append((h, p, float(np.median(others))))
    return out


def _finding(host: str, ev: dict[str, Any], host_ranks: list[int], comparisons: list[FunctionComparison],
             rank_windows: dict[int, RankWindow], policy: DetectionPolicy) -> Finding | None:
    through = [c for c in comparisons if c["kind"] == SpanKind.COLLECTIVE and set(c["members"]) & set(host_ranks)]
    cost = sum(float(c["transfer_ms_per_step"]) for c in through)
    if not through or cost < policy.min_cost_ms_per_step:
        return None
    top = max(through, key=lambda c: float(c["transfer_ms_per_step"]))
    ev = {**ev, **_throughput(rank_windows, host_ranks), "transfer_ms_per_step": round(cost, 3), "explains_ms": cost}
    ranks = tuple(sorted(host_ranks))
    return Finding(kind=Kind.OUTLIER, cause=Cause.SLOW_LINK, identity=f"slow_link|host:{host}", ranks=ranks,
                   hosts=(host,), gpus=tuple(sorted({int(rank_windows[r].get("gpu", -1)) for r in ranks})),
                   function=top["function"], score=float(len(ev.get("backed_up", ())) + ev.get("retrans_pct", 0.0)),
                   impact_ms=cost, summary=_summary(host, ranks, ev, cost), evidence=ev)


def _throughput(rank_windows: dict[int, RankWindow], ranks: list[int]) -> dict[str, Any]:
    """The host's send/receive rates and InfiniBand counters, against the other hosts' median."""
    mine = [rank_windows[r] for r in ranks]
    rest = [rw for r, rw in rank_windows.items() if r not in ranks and int(rw.get("net_samples", 0)) > 0]
    out: dict[str, Any] = {}
    for key in ("net_tx_mb_per_s", "net_rx_mb_per_s", "ib_xmit_wait_per_s", "ib_errors"):
        vals = [v for v in (_number(rw, key) for rw in mine) if v >= 0]
        peers = [v for v in (_number(rw, key) for rw in rest) if v >= 0]
        if vals:
            out[key.removeprefix("net_")] = round(max(vals), 3)
            out[f"peer_{key.removeprefix('net_')}"] = round(float(np.median(peers)), 3) if peers else -1.0
    return out


def _summary(host: str, ranks: tuple[int, ...], ev: dict[str, Any], cost: float) -> str:
    parts = []
    if "backed_up" in ev:
        shown = ", ".join(f"{e['from']}->{e['to']} ({e['samples']} samples, {e['median_bytes'] / 1e6:.2f} MB unsent)"
                          for e in ev["backed_up"][:4])
        drained = ", ".join(ev["drained_hosts"][:4])
        parts.append(f"every backed-up connection runs through {host}: {shown}; "
                     f"{drained} kept {'its' if len(ev['drained_hosts']) == 1 else 'their'} send queues drained")
    if "retrans_pct" in ev:
        parts.append(f"{host} retransmits {ev['retrans_pct']:.2f}% of its TCP segments "
                     f"(other hosts {ev['peer_retrans_pct']:.2f}%)")
    return (f"slow network link at host {host} (rank(s) {short_ranks(ranks)}): " + "; ".join(parts)
            + f"; collectives through it spend ~{cost:.1f} ms per step moving data")


def _number(rw: RankWindow, key: str) -> float:
    value = rw.get(key, -1)
    return float(value) if isinstance(value, (int, float)) else -1.0


def _json(text: str) -> dict[str, Any]:
    """``net_backlog_json`` as a dict; {} when it is not one (the rule reads what it can)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _ints(values: Any) -> list[int]:
    """The whole numbers among ``values`` (a sample's unsent bytes); anything else is skipped."""
    if not isinstance(values, list):
        return []
    return [int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
