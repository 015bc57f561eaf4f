"""The sink's local query API and the client's fallbacks."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas.settings import Secret, Settings, StoreSettings
from perftracker_ml.schemas.stackfile import StackState
from perftracker_ml.sinks import client
from perftracker_ml.sinks.api import QueryServer
from perftracker_ml.sinks.errors import NoStore, UnknownQuery
from perftracker_ml.sinks.schema import migrate
from perftracker_ml.sinks.store import Store, parse_store_url

from .test_store import load

pytestmark = pytest.mark.integration


@pytest.fixture
def served(tmp_path: Path):
    store = Store.open(parse_store_url(f"chdb://{tmp_path / 'chdb'}", tmp_path))
    migrate(store)
    load(store, samples.job_records("api-job", world=4, windows=2))
    api = QueryServer(store, 0, lambda: {"consumed": 7}).start()
    settings = Settings(data_dir=tmp_path / "data")
    StackState(bootstrap="", broker_pid=0, sink_pid=os.getpid(), query_url=api.url).save(settings.data_dir)
    yield api, settings
    api.stop()
    store.close()


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_health_and_named_queries_over_http(served):
    api, settings = served
    assert get(api.url + "/health") == (200, {"ok": True, "stats": {"consumed": 7}})
    status, body = get(api.url + "/query/incidents?job=api-job")
    assert status == 200 and body["rows"] and "evidence_json" in body["columns"]
    assert get(api.url + "/query/nope")[0] == 400
    assert get(api.url + "/query/incidents?job=x&sql=DROP")[0] == 400
    assert get(api.url + "/elsewhere")[0] == 404
    found = client.diagnose(settings, "api-job")
    assert found[0]["ranks"] == [3] and isinstance(found[0]["first_seen"], str)
    with pytest.raises(UnknownQuery):
        client.query(settings, "incidents", job="x", limit="many")


def test_no_sink_and_no_store_is_a_clear_error(tmp_path: Path):
    settings = Settings(data_dir=tmp_path, store=StoreSettings(url=Secret("clickhouse://u:pw@127.0.0.1:9/db")))
    with pytest.raises(NoStore, match=r"cannot reach ClickHouse at http://u:\*\*\*@127\.0\.0\.1:9/db") as exc:
        client.diagnose(settings, "j")
    assert "pw" not in str(exc.value).replace("perftracker", "").replace("PASSWORD", "")
    assert "perftracker up" not in str(exc.value)  # a production server: no advice for the embedded stack


def test_dead_sink_api_is_a_clear_error(tmp_path: Path):
    settings = Settings(data_dir=tmp_path)
    StackState(bootstrap="", broker_pid=0, sink_pid=os.getpid(),
               query_url="http://127.0.0.1:9").save(settings.data_dir)
    with pytest.raises(NoStore, match="did not answer"):
        client.diagnose(settings, "j")


def test_without_a_sink_the_store_is_opened_directly(tmp_path: Path):
    settings = Settings(data_dir=tmp_path)
    store = Store.from_settings(settings)
    migrate(store)
    load(store, [("Anomaly", samples.anomaly("direct-job"))])
    store.close()
    assert client.diagnose(settings, "direct-job")[0]["job"] == "direct-job"


@pytest.fixture
def writable(tmp_path: Path):
    """A query API that stores what is POSTed to /store, as the sink's does."""
    from perftracker_ml.sinks.keep import decode_records, write_records

    store = Store.open(parse_store_url(f"chdb://{tmp_path / 'chdb'}", tmp_path))
    migrate(store)
    api = QueryServer(store, 0, keep=lambda body: write_records(store, StoreSettings(),
                                                                decode_records(body)).as_dict()).start()
    settings = Settings(data_dir=tmp_path / "data")
    StackState(bootstrap="", broker_pid=0, sink_pid=os.getpid(), query_url=api.url).save(settings.data_dir)
    yield api, settings
    api.stop()
    store.close()


def test_keep_writes_through_a_running_sink(writable):
    api, settings = writable
    records = list(samples.job_records("kept-job", world=4, windows=2))
    bad = dict(samples.anomaly("kept-job", "bad-inc"), ranks=[-5])
    kept = client.keep(settings, [*records, ("Anomaly", bad)])
    assert kept.where == f"the stack's sink (pid {os.getpid()})"
    assert kept.records == len(records) + 1 and kept.rows_written > len(records) and kept.rows_rejected == 0
    assert len(kept.invalid) == 1 and "Anomaly.ranks" in kept.invalid[0]  # left out, named
    assert [r["incident_id"] for r in client.diagnose(settings, "kept-job")] == ["kept-job-inc"]
    assert "kept-job" in [r["job"] for r in client.query(settings, "jobs")]
    request = urllib.request.Request(api.url + "/store", data=b"\x00\x00\x00\x09short", method="POST")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(request, timeout=5)
    assert exc.value.code == 400 and "truncated body" in json.loads(exc.value.read())["error"]


def test_keep_without_a_sink_creates_the_tables_and_writes_directly(tmp_path: Path):
    settings = Settings(data_dir=tmp_path)
    kept = client.keep(settings, list(samples.job_records("direct-kept", world=2, windows=1)))
    assert kept.where == f"chdb://{(tmp_path / 'chdb').resolve()}" and kept.rows_written > 0
    assert client.diagnose(settings, "direct-kept")[0]["ranks"] == [3]
