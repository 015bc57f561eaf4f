from pathlib import Path

import pytest
from perftracker_ml.sinks.errors import SinkError
from perftracker_ml.sinks.store import parse_store_url


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


def test_store_settings_give_user_password_and_tls(tmp_path: Path):
    from perftracker_ml.schemas.settings_loader import load_settings
    from perftracker_ml.sinks.store import store_target

    pw_file = tmp_path / "ch-pw"
    pw_file.write_text("f1le-pw\n")
    settings = load_settings(env={"PERFTRACKER_STORE_URL": "clickhouse://url-user:url-pw@ch.example/metrics?secure=1",
                                  "PERFTRACKER_STORE_USERNAME": "perftracker",
                                  "PERFTRACKER_STORE_PASSWORD_FILE": str(pw_file),
                                  "PERFTRACKER_STORE_CA_FILE": "/etc/ssl/ch-ca.pem",
                                  "PERFTRACKER_STORE_VERIFY": "false"})
    t = store_target(settings)
    assert (t.username, t.password, t.secure, t.port, t.ca_file, t.verify) == (
        "perftracker", "f1le-pw", True, 8443, "/etc/ssl/ch-ca.pem", False)
    assert "f1le-pw" not in repr(t) and "url-pw" not in repr(t) and "f1le-pw" not in t.describe()
    plain = store_target(load_settings(env={"PERFTRACKER_STORE_URL": "clickhouse://u:p@h/db"}))
    assert (plain.username, plain.password, plain.secure, plain.verify, plain.ca_file) == ("u", "p", False, True, "")


def test_a_password_in_the_config_file_is_refused(tmp_path: Path):
    from perftracker_ml.schemas.errors import ConfigError
    from perftracker_ml.schemas.settings_loader import load_settings

    (tmp_path / "pt.toml").write_text('[store]\npassword = "in-the-file"\n')
    with pytest.raises(ConfigError, match="is a secret") as err:
        load_settings(tmp_path / "pt.toml", env={})
    assert "in-the-file" not in str(err.value)


@pytest.mark.parametrize("url, fragment", [
    ("clickhouse://u:p@ss@h:port/db", "malformed"),
    ("clickhouse://u:pw@h/db?secure=ture", "not understood"),
    ("clickhouse://u:pw@h/db?password=pw", "not understood"),
])
def test_bad_server_urls_are_refused_without_showing_the_password(url, fragment):
    with pytest.raises(SinkError, match=fragment) as err:
        parse_store_url(url, Path("."))
    assert "pw" not in str(err.value).replace("password", "") and "p@ss" not in str(err.value)


@pytest.mark.filterwarnings("ignore:Unverified HTTPS request")
@pytest.mark.parametrize("ca, verify, handshake", [("ca", True, True), ("other_ca", True, False),
                                                   ("other_ca", False, True)])
def test_clickhouse_tls_checks_the_server_with_the_configured_ca(tmp_path: Path, ca, verify, handshake):
    """clickhouse-connect gets store.ca_file and store.verify: a handshake with a local TLS listener
    succeeds with the CA that signed its certificate, fails with another unless verify is off."""
    from perftracker_ml.schemas.settings import StoreSettings
    from perftracker_ml.sinks.errors import StoreUnavailable
    from perftracker_ml.sinks.store import Store

    from ...tls import TLSListener, make_tls_files

    files = make_tls_files(tmp_path / "tls")
    listener = TLSListener(files, client_cert=False)
    try:
        store = StoreSettings(ca_file=str(getattr(files, ca)), verify=verify)
        target = parse_store_url(f"clickhouses://u:tls-pw-5@localhost:{listener.port}/db", tmp_path, store)
        with pytest.raises(StoreUnavailable) as err:  # the listener speaks TLS, not HTTP
            Store.open(target)
        assert "tls-pw-5" not in str(err.value)
        assert (listener.handshake.wait(3 if handshake else 0.5)) is handshake, listener.errors
    finally:
        listener.close()
