"""Who may call the HTTP endpoints: loopback by default, a bearer token beyond it."""

from __future__ import annotations

import pytest
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.http_auth import auth_headers, authorized, check_bind, is_loopback
from perftracker_ml.schemas.settings import Secret, Settings
from perftracker_ml.schemas.settings_loader import load_settings


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False), ("worker-1.svc", False),
])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_binding_beyond_loopback_needs_a_token():
    check_bind("127.0.0.1", Secret(""), "streams.web_host")
    check_bind("0.0.0.0", Secret("t0k3n"), "streams.web_host")
    with pytest.raises(ConfigError, match="streams.web_host = 0.0.0.0 serves beyond this machine.*HTTP_TOKEN"):
        check_bind("0.0.0.0", Secret(""), "streams.web_host")


def test_bearer_token_check():
    token = Secret("t0k3n")
    assert authorized("Bearer t0k3n", token)
    for header in (None, "", "t0k3n", "Bearer", "Bearer t0k3", "Bearer t0k3n2", "Basic dDBrM246", "bearer t0k3n"):
        assert not authorized(header, token), header
    assert authorized(None, Secret("")) and authorized("Bearer anything", Secret(""))
    assert auth_headers(token) == {"Authorization": "Bearer t0k3n"} and auth_headers(Secret("")) == {}


def test_endpoints_default_to_loopback_and_the_token_is_a_secret(tmp_path):
    s = Settings()
    assert s.streams.web_host == "127.0.0.1" and s.store.query_host == "127.0.0.1" and not s.http_token
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    assert load_settings(env={"PERFTRACKER_HTTP_TOKEN_FILE": str(token_file)}).http_token.reveal() == "from-a-file"
    (tmp_path / "pt.toml").write_text('http_token = "in-the-file"\n')
    with pytest.raises(ConfigError, match="is a secret"):
        load_settings(tmp_path / "pt.toml", env={})
