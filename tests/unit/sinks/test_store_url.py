from pathlib import Path

import pytest
from perftracker.sinks.errors import SinkError
from perftracker.sinks.store import parse_store_url


def test_empty_url_is_chdb_under_data_dir(tmp_path: Path):
    t = parse_store_url("", tmp_path)
    assert t.kind == "chdb" and t.path == str((tmp_path / "chdb").resolve())


def test_chdb_url():
    assert parse_store_url("chdb:///var/lib/pt", Path(".")).path == "/var/lib/pt"


def test_server_url_with_tls_and_password_never_described():
    t = parse_store_url("clickhouses://alice:s%40cret@ch.example:9443/metrics", Path("."))
    assert (t.kind, t.host, t.port, t.username, t.password, t.database, t.secure) == (
        "server", "ch.example", 9443, "alice", "s@cret", "metrics", True)
    assert "s@cret" not in t.describe() and "s@cret" not in repr(t.describe())


def test_secure_query_flag_and_default_port():
    t = parse_store_url("clickhouse://u:p@h/db?secure=true", Path("."))
    assert t.secure and t.port == 8443
    assert parse_store_url("clickhouse://h", Path(".")).port == 8123


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(SinkError, match="not supported"):
        parse_store_url("postgres://h/db", Path("."))
