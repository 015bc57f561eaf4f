"""Session-wide fixtures: one real tansu broker per test session on a free port."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from perftracker.deploy.tansu import LocalBroker, start_broker
from perftracker.schemas.redact import reset_redaction

from .registry_fake import registry  # noqa: F401 (a fixture: a fake schema registry on 127.0.0.1)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    broker = start_broker(log_path=log)
    yield broker
    broker.stop()


@pytest.fixture
def kafka_conf(kafka_broker: LocalBroker) -> dict[str, str]:
    return {"bootstrap.servers": kafka_broker.bootstrap}


@pytest.fixture(autouse=True)
def _forget_configured_secrets() -> Iterator[None]:
    """Each test starts without the secrets and log redaction an earlier test configured
    (settings loaded in-process remember their secrets for redaction)."""
    yield
    reset_redaction()


@pytest.fixture
def unique() -> str:
    """A random suffix for topic prefixes, group ids and job ids."""
    return uuid.uuid4().hex[:8]
