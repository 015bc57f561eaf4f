"""The network reader on a fake /proc/self and /sys/class/infiniband (real file formats)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from perftracker_ml.collectors.net_stats import NetReader, connections, hex_address

TCP_HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout"
              " inode\n")


def tcp_line(local: str, remote: str, state: str, txq: int, inode: int) -> str:
    return (f"   0: {local} {remote} {state} {txq:08X}:00000000 00:00000000 00000000     0        0"
            f" {inode} 1 0000000000000000 20 4 30 10 -1\n")


def snmp(retrans: int, out: int) -> str:
    keys = "RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors"
    values = f"1 200 120000 -1 10 10 0 0 4 1000 {out} {retrans} 0 0 0"
    return f"Ip: Forwarding\nIp: 1\nTcp: {keys}\nTcp: {values}\n"


def dev(rx: int, tx: int) -> str:
    head = "Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes ...\n"
    return head + f"    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n  eth0: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0\n"


def fake_proc(root: Path, tcp: str, retrans: int, out: int, rx: int, tx: int, inodes: list[int]) -> Path:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "fd").mkdir(exist_ok=True)
    (root / "net" / "tcp").write_text(TCP_HEADER + tcp)
    (root / "net" / "snmp").write_text(snmp(retrans, out))
    (root / "net" / "dev").write_text(dev(rx, tx))
    for i, inode in enumerate(inodes):
        link = root / "fd" / str(10 + i)
        if not link.is_symlink():
            os.symlink(f"socket:[{inode}]", link)
    return root


def test_hex_addresses_decode_as_the_kernel_prints_them():
    assert hex_address("0100007F") == "127.0.0.1"
    assert hex_address("0A004D0A") == "10.77.0.10"
    assert hex_address("0000000000000000FFFF00000B004D0A") == "10.77.0.11"  # v4-mapped v6
    packed = socket.inet_pton(socket.AF_INET6, "fe80::1")
    words = b"".join(packed[i:i + 4][::-1] for i in range(0, 16, 4))
    assert hex_address(words.hex().upper()) == "fe80::1"


def test_only_this_process_s_established_non_loopback_connections_count():
    tcp = (tcp_line("0A004D0A:1F90", "0B004D0A:D431", "01", 5000, 11)  # ours, backed up
           + tcp_line("0A004D0A:1F91", "0C004D0A:D432", "01", 0, 12)  # ours, drained
           + tcp_line("0A004D0A:1F92", "0D004D0A:D433", "01", 7000, 99)  # another process's
           + tcp_line("0100007F:1F93", "0100007F:D434", "01", 9000, 13)  # ours, loopback
           + tcp_line("0A004D0A:1F94", "0B004D0A:D435", "0A", 0, 14))  # listening
    got = connections(TCP_HEADER + tcp, {11, 12, 13, 14})
    assert got == [("10.77.0.10", "10.77.0.11", 5000), ("10.77.0.10", "10.77.0.12", 0)]


def test_a_sample_holds_deltas_and_the_backlog_per_remote(tmp_path: Path):
    root = tmp_path / "self"
    tcp = tcp_line("0A004D0A:1F90", "0B004D0A:D431", "01", 5000, 11) + tcp_line("0A004D0A:1F91", "0B004D0A:D432", "01", 300, 12)
    fake_proc(root, tcp, retrans=10, out=1000, rx=5000, tx=9000, inodes=[11, 12])
    ib = tmp_path / "ib" / "mlx5_0" / "ports" / "1" / "counters"
    ib.mkdir(parents=True)
    (ib / "port_xmit_wait").write_text("100\n")
    (ib / "symbol_error").write_text("0\n")
    reader = NetReader(root, tmp_path / "ib")
    assert reader.sample() is None  # the baseline
    fake_proc(root, tcp, retrans=25, out=2000, rx=6000, tx=19000, inodes=[])
    (ib / "port_xmit_wait").write_text("400\n")
    (ib / "symbol_error").write_text("2\n")
    s = reader.sample()
    assert s is not None and s.interval_ns > 0
    assert (s.retrans_segs, s.out_segs, s.rx_bytes, s.tx_bytes) == (15, 1000, 1000, 10000)
    assert (s.ib_xmit_wait, s.ib_errors) == (300, 2)
    assert s.local_addr == "10.77.0.10" and s.backlog == {"10.77.0.11": 5300}
    assert reader.errors == 0
    rec = s.as_record()
    assert rec["backlog"] == [{"remote": "10.77.0.11", "bytes": 5300}]


def test_missing_files_are_unknown_and_counted_never_raised(tmp_path: Path):
    reader = NetReader(tmp_path / "nothing", tmp_path / "no-ib")
    reader.sample()
    s = reader.sample()
    assert s is not None
    assert (s.retrans_segs, s.tx_bytes, s.ib_xmit_wait) == (-1, -1, -1)
    assert s.backlog == {} and reader.errors > 0


def test_the_real_proc_of_this_process_reads(tmp_path: Path):
    reader = NetReader()
    reader.sample()
    s = reader.sample()
    assert s is not None and s.out_segs >= 0 and s.tx_bytes >= 0
