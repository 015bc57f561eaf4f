"""Test certificates made with the ``openssl`` command, and a TLS listener that records handshakes.

No broker here speaks TLS or SASL (tansu is plaintext only), so the TLS settings are
checked up to what a real client proves: librdkafka and aiokafka load the CA, the
client certificate and the encrypted key with its password, and complete a mutual-TLS
handshake with :class:`TLSListener` (which requires a client certificate signed by
the test CA and records its subject).
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

KEY_PASSWORD = "key-pass-7Qx"


@dataclass(frozen=True)
class TLSFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path  # encrypted with KEY_PASSWORD
    other_ca: Path  # a CA that signed nothing here


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_tls_files(where: Path) -> TLSFiles:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate (CN=perftracker-client)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    where.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "2", "-subj", f"/CN={ca}", cwd=where)
    (where / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, cn in (("server", "localhost"), ("client", "perftracker-client")):
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=where)
        extra = ["-extfile", "san.ext"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *extra, cwd=where)
    _openssl("pkey", "-in", "client.key", "-out", "client.enc.key", "-aes256", "-passout", f"pass:{KEY_PASSWORD}",
             cwd=where)
    return TLSFiles(where / "ca.pem", where / "server.pem", where / "server.key", where / "client.pem",
                    where / "client.enc.key", where / "other-ca.pem")


class TLSListener:
    """A TLS server on 127.0.0.1 that requires a client certificate from the test CA (unless
    ``client_cert`` is False); it completes handshakes, records each peer's common name ('' without
    a certificate) or the handshake error, and closes."""

    def __init__(self, files: TLSFiles, client_cert: bool = True):
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(files.ca))
        self.context.load_cert_chain(str(files.server_cert), str(files.server_key))
        self.context.verify_mode = ssl.CERT_REQUIRED if client_cert else ssl.CERT_NONE
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.peers: list[str] = []
        self.errors: list[str] = []
        self.handshake = threading.Event()
        self._stop = threading.Event()
        self.sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"localhost:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(5)
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    subject = dict(x[0] for x in (tls.getpeercert() or {}).get("subject", ()))
                    self.peers.append(subject.get("commonName", ""))
                    self.handshake.set()
            except (OSError, ssl.SSLError) as exc:
                self.errors.append(str(exc))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
