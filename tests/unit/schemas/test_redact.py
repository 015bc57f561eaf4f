"""Secrets are masked by structure (URL passwords) and by whole value, never as substrings."""

from __future__ import annotations

from perftracker_ml.schemas.redact import redact, redact_url_passwords


def test_a_one_letter_password_leaves_http_alone():
    text = "Code: 516. http://default:p@ch:8123/ refused: password p is wrong; see https://docs"
    assert redact(text, "p") == "Code: 516. http://default:***@ch:8123/ refused: password *** is wrong; see https://docs"


def test_whole_values_only_and_the_url_encoded_form():
    assert redact("token=s3cr&t and s3cr&t. but xs3cr&ty stays", "s3cr&t") == \
        "token=*** and ***. but xs3cr&ty stays"
    assert redact("clickhouse://u:p%40ss@h/db said p@ss", "p@ss") == "clickhouse://u:***@h/db said ***"
    assert redact("a key !k9 and x!k9", "!k9") == "a key *** and x***"  # a punctuation edge needs no boundary


def test_url_password_masked_whatever_it_is_and_nothing_else():
    assert redact_url_passwords("kafka://bob:hunter2@b:9092 and https://grafana.example/d/x?a=b") == \
        "kafka://bob:***@b:9092 and https://grafana.example/d/x?a=b"
    assert redact_url_passwords("http://host:8123/path") == "http://host:8123/path"  # a port is no password
    assert redact("nothing secret", "", "") == "nothing secret"
