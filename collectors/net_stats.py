"""The rank's network evidence, read from ``/proc`` and ``/sys`` off the training thread (Linux).

Once per flush interval the sender thread reads, in the rank's own network namespace:

* the process's established TCP connections (``/proc/self/net/tcp``, ``tcp6``, matched to
  the process's own sockets through ``/proc/self/fd``): the bytes each one holds in its send
  queue (written, not yet acknowledged) at that instant, summed per remote address, and the
  local address they use. A link that cannot carry what the collectives send keeps the
  queues of the connections through it full; a healthy link drains them between samples.
* the host's TCP segments sent and retransmitted (``/proc/self/net/snmp``): a lossy link
  shows as retransmits;
* bytes received and sent on the non-loopback interfaces (``/proc/self/net/dev``);
* InfiniBand ports (``/sys/class/infiniband/*/ports/*/counters``), where there are any:
  ``port_xmit_wait`` (ticks a port had data to send and no credit: congestion or a slow
  link) and the error counters (symbol errors, link downs, receive errors, discards).
  NCCL over InfiniBand or RoCE bypasses TCP, so on a GPU cluster these are its link's
  evidence; gloo and NCCL's socket transport show in the TCP counters.

:class:`NetReader` turns successive readings into one :class:`NetSample` per interval
(deltas; -1 unknown). What cannot be read is counted in ``errors``; nothing raises. The
roots are parameters so tests use a fake ``/proc`` and ``/sys``.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .cpu_stats import UNKNOWN, counter_delta

PROC_SELF = Path("/proc/self")
SYS_IB = Path("/sys/class/infiniband")
ESTABLISHED = "01"
MAX_REMOTES = 8  # remotes with the fullest send queues kept per sample
IB_ERRORS = ("symbol_error", "link_downed", "port_rcv_errors", "port_xmit_discards", "link_error_recovery")


@dataclass(frozen=True)
class NetTotals:
    """Cumulative counters at one instant (-1 unknown)."""

    mono_ns: int
    retrans_segs: int = UNKNOWN
    out_segs: int = UNKNOWN
    rx_bytes: int = UNKNOWN
    tx_bytes: int = UNKNOWN
    ib_xmit_wait: int = UNKNOWN
    ib_errors: int = UNKNOWN


@dataclass(frozen=True)
class NetSample:
    """One interval: counter deltas and the send queues at its end."""

    interval_ns: int
    local_addr: str
    retrans_segs: int
    out_segs: int
    rx_bytes: int
    tx_bytes: int
    ib_xmit_wait: int
    ib_errors: int
    backlog: dict[str, int] = field(default_factory=dict)  # remote address -> unsent bytes

    def as_record(self) -> dict:
        return {"interval_ns": self.interval_ns, "local_addr": self.local_addr,
                "retrans_segs": self.retrans_segs, "out_segs": self.out_segs,
                "rx_bytes": self.rx_bytes, "tx_bytes": self.tx_bytes,
                "ib_xmit_wait": self.ib_xmit_wait, "ib_errors": self.ib_errors,
                "backlog": [{"remote": r, "bytes": b} for r, b in self.backlog.items()]}


def hex_address(text: str) -> str:
    """``/proc/net/tcp``'s ``0100007F`` (v4) or 32 hex digits (v6, four host-order words) as text."""
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    words = struct.unpack(">4I", raw)
    packed = b"".join(struct.pack("<I", w) for w in words)
    mapped = packed[:12] == b"\x00" * 10 + b"\xff\xff"
    return socket.inet_ntop(socket.AF_INET, packed[12:]) if mapped else socket.inet_ntop(socket.AF_INET6, packed)


def connections(table: str, inodes: set[int]) -> list[tuple[str, str, int]]:
    """(local address, remote address, send-queue bytes) of the established connections of
    ``table`` (the text of ``/proc/net/tcp`` or ``tcp6``) whose socket inode is in ``inodes``;
    loopback connections are left out (they cross no link)."""
    out = []
    for line in table.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != ESTABLISHED or int(cols[9]) not in inodes:
            continue
        local, remote = hex_address(cols[1].split(":")[0]), hex_address(cols[2].split(":")[0])
        if remote.startswith("127.") or remote == "::1":
            continue
        out.append((local, remote, int(cols[4].split(":")[0], 16)))
    return out


def socket_inodes(fd_dir: Path) -> set[int]:
    """Inodes of the sockets this process holds open (``/proc/self/fd`` links ``socket:[N]``)."""
    found = set()
    for entry in os.scandir(fd_dir):
        try:
            target = os.readlink(entry.path)
        except OSError:  # closed while listing
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


class NetReader:
    """Reads the counters and send queues; hands out one :class:`NetSample` per call."""

    def __init__(self, proc_self: Path = PROC_SELF, sys_ib: Path = SYS_IB):
        self.proc, self.sys_ib = proc_self, sys_ib
        self.errors = 0
        self._last: NetTotals | None = None

    def _text(self, path: Path) -> str | None:
        try:
            return path.read_text(errors="replace")
        except OSError:
            self.errors += 1
            return None

    def totals(self) -> NetTotals:
        values: dict[str, int] = {}
        for parse in (self._snmp, self._dev, self._infiniband):
            try:
                values.update(parse())
            except (ValueError, IndexError, KeyError):
                self.errors += 1
        return NetTotals(mono_ns=time.monotonic_ns(), **values)

    def queues(self) -> tuple[str, dict[str, int]]:
        """(the local address most connections use, unsent bytes per remote address now)."""
        try:
            inodes = socket_inodes(self.proc / "fd")
        except OSError:
            self.errors += 1
            return "", {}
        conns: list[tuple[str, str, int]] = []
        for name in ("tcp", "tcp6"):
            text = self._text(self.proc / "net" / name) if (self.proc / "net" / name).exists() else ""
            try:
                conns += connections(text or "", inodes)
            except (ValueError, IndexError):
                self.errors += 1
        locals_ = Counter(local for local, _, _ in conns)
        per_remote: Counter[str] = Counter()
        for _, remote, queued in conns:
            if queued > 0:
                per_remote[remote] += queued
        return (locals_.most_common(1)[0][0] if locals_ else ""), dict(per_remote.most_common(MAX_REMOTES))

    def sample(self) -> NetSample | None:
        """The interval since the previous call; None at the first call."""
        cur, prev = self.totals(), self._last
        self._last = cur
        if prev is None:
            return None
        local, backlog = self.queues()
        return NetSample(interval_ns=cur.mono_ns - prev.mono_ns, local_addr=local,
                         retrans_segs=counter_delta(cur.retrans_segs, prev.retrans_segs),
                         out_segs=counter_delta(cur.out_segs, prev.out_segs),
                         rx_bytes=counter_delta(cur.rx_bytes, prev.rx_bytes), tx_bytes=counter_delta(cur.tx_bytes, prev.tx_bytes),
                         ib_xmit_wait=counter_delta(cur.ib_xmit_wait, prev.ib_xmit_wait),
                         ib_errors=counter_delta(cur.ib_errors, prev.ib_errors), backlog=backlog)

    def _snmp(self) -> dict[str, int]:
        text = self._text(self.proc / "net" / "snmp")
        if text is None:
            return {}
        rows = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp:")]
        tcp = dict(zip(rows[0], rows[1], strict=True))
        return {"retrans_segs": int(tcp["RetransSegs"]), "out_segs": int(tcp["OutSegs"])}

    def _dev(self) -> dict[str, int]:
        text = self._text(self.proc / "net" / "dev")
        if text is None:
            return {}
        rx = tx = 0
        for line in text.splitlines()[2:]:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                continue
            cols = counters.split()
            rx, tx = rx + int(cols[0]), tx + int(cols[8])
        return {"rx_bytes": rx, "tx_bytes": tx}

    def _infiniband(self) -> dict[str, int]:
        if not self.sys_ib.is_dir():
            return {}
        wait = errors = 0
        for counters in self.sys_ib.glob("*/ports/*/counters"):
            wait += _counter(counters / "port_xmit_wait")
            errors += sum(_counter(counters / name) for name in IB_ERRORS)
        return {"ib_xmit_wait": wait, "ib_errors": errors}


def _counter(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0
