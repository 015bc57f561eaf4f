"""A small real cluster on one machine: hosts as network namespaces on a bridge.

Each host is a network namespace with its own address on a Linux bridge (``10.77.0.0/24``;
the root namespace is ``10.77.0.1`` on the bridge, where a test's perftracker stack listens),
its own host name (commands run under ``unshare --uts`` with ``hostname`` set), and, where a
test asks, its own CPU (``taskset``). Links degrade with ``tc`` (``tbf`` rate limits: this
kernel has no ``netem``) on both ends of the host's veth.

Only the namespaces' own addresses and loopback are used. :func:`cluster` removes what a
crashed run left (namespaces, bridge and veths with this module's prefix) before it builds,
and tears everything down after the test, even when it fails: the processes started in a
namespace, the qdiscs (they go with their veth), the veths, the namespaces and the bridge.
Needs root with ``ip``, ``tc``, ``unshare`` and ``taskset``; :func:`require` skips
elsewhere (CI runs as root).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

PREFIX = "ptlab"
BRIDGE = f"{PREFIX}br"
SUBNET = "10.77.0"
GATEWAY = f"{SUBNET}.1"
NETNS_ETC = Path("/etc/netns")


def require() -> None:
    """Skip unless this process can build namespaces (root, with the programs)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    missing = [p for p in ("ip", "tc", "unshare", "taskset", "hostname") if not shutil.which(p)]
    if missing:
        pytest.skip(f"missing for network namespaces: {', '.join(missing)}")


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)


@dataclass(frozen=True)
class Host:
    """One namespace host: ``name`` is its namespace, host name and veth stem."""

    index: int
    name: str
    address: str
    cpu: int | None = None

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def outer_veth(self) -> str:
        """The veth end on the bridge, in the root namespace (its egress is the host's ingress)."""
        return f"{PREFIX}{self.index}"

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host: its namespace, its host name, its CPU if it has one."""
        inner = list(argv) if self.cpu is None else ["taskset", "-c", str(self.cpu), *argv]
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c",
                f'hostname {self.name} && exec "$@"', "sh", *inner]

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout)

    def limit_rate(self, rate: str, burst: str = "64kb", latency: str = "100ms") -> None:
        """Degrade this host's link both ways with a token bucket (``tbf``) of ``rate``."""
        spec = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        _run("ip", "netns", "exec", self.netns, "tc", "qdisc", "replace", "dev", "eth0", *spec)
        _run("tc", "qdisc", "replace", "dev", self.outer_veth, *spec)


def _remove_stale() -> None:
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}-"):
            _kill_namespace_processes(name)
            _run("ip", "netns", "del", name, check=False)
    for folder in NETNS_ETC.glob(f"{PREFIX}-*"):
        shutil.rmtree(folder, ignore_errors=True)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            dev = parts[1].strip().split("@")[0]
            if dev.startswith(PREFIX):
                _run("ip", "link", "del", dev, check=False)


def _kill_namespace_processes(netns: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p) for p in _run("ip", "netns", "pids", netns, check=False).stdout.split() if p.isdigit()]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if not pids:
            return
        time.sleep(1.0)


def _name_files(hosts: list[Host]) -> None:
    """``ip netns exec`` mounts ``/etc/netns/<ns>/*`` over ``/etc``: each host resolves every
    host's name from its own hosts file, and has no name server (lookups fail at once
    instead of timing out on one it cannot reach)."""
    table = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in hosts)
    for h in hosts:
        folder = NETNS_ETC / h.netns
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(table)
        (folder / "resolv.conf").write_text("# no name server inside the test cluster\n")


def _build(hosts: list[Host]) -> None:
    _name_files(hosts)
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    for h in hosts:
        _run("ip", "netns", "add", h.netns)
        _run("ip", "link", "add", h.outer_veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
        _run("ip", "link", "set", h.outer_veth, "master", BRIDGE, "up")
        _run("ip", "netns", "exec", h.netns, "ip", "addr", "add", f"{h.address}/24", "dev", "eth0")
        _run("ip", "netns", "exec", h.netns, "ip", "link", "set", "lo", "up")
        _run("ip", "netns", "exec", h.netns, "ip", "link", "set", "eth0", "up")
        _run("ip", "netns", "exec", h.netns, "ip", "route", "add", "default", "via", GATEWAY)


def _teardown(hosts: list[Host]) -> None:
    for h in hosts:
        _kill_namespace_processes(h.netns)
        _run("ip", "link", "del", h.outer_veth, check=False)
        _run("ip", "netns", "del", h.netns, check=False)
        shutil.rmtree(NETNS_ETC / h.netns, ignore_errors=True)
    _run("ip", "link", "del", BRIDGE, check=False)


def leftovers() -> list[str]:
    """Namespaces, links and qdiscs of this module still present (empty after teardown)."""
    found = [ln.split()[0] for ln in _run("ip", "netns", "list", check=False).stdout.splitlines()
             if ln.startswith(f"{PREFIX}-")]
    found += [ln.split(":")[1].strip() for ln in _run("ip", "-o", "link", "show", check=False).stdout.splitlines()
              if len(ln.split(":")) > 1 and ln.split(":")[1].strip().startswith(PREFIX)]
    found += [str(p) for p in NETNS_ETC.glob(f"{PREFIX}-*")]
    found += [ln for ln in _run("tc", "qdisc", "show", check=False).stdout.splitlines() if f" dev {PREFIX}" in ln]
    return found


@contextmanager
def cluster(n: int, cpus: Sequence[int | None] | None = None) -> Iterator[list[Host]]:
    """``n`` hosts ``h0``..``h{n-1}`` at ``10.77.0.10``.. on one bridge; ``cpus[i]`` pins host i."""
    require()
    hosts = [Host(i, f"h{i}", f"{SUBNET}.{10 + i}", (cpus[i] if cpus else None)) for i in range(n)]
    _remove_stale()
    try:
        _build(hosts)
        yield hosts
    finally:
        _teardown(hosts)
