"""The CLI's and the report's way to the store: ``diagnose``, named ``query``, and ``keep``.

A running sink owns chDB, so when ``<data_dir>/stack.json`` names a live sink
its local query API answers (and ``keep`` writes through it, ``POST /store``);
otherwise the store is opened directly.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from ..schemas.diagnosis import diagnosis_row
from ..schemas.http_auth import auth_headers
from ..schemas.settings import Secret, Settings
from ..schemas.stackfile import pid_alive, read_state
from .api import to_json_value
from .errors import NoStore, SinkError, StoreUnavailable, UnknownQuery
from .queries import QUERIES, run_query
from .store import Store, StoreTarget, store_target

if TYPE_CHECKING:
    from .keep import Kept

TIMEOUT_S = 10.0
KEEP_TIMEOUT_S = 300.0  # a large import's rows, written by the sink before it answers


def _via_api(url: str, name: str, params: dict[str, Any], token: Secret) -> list[dict]:
    target = f"{url.rstrip('/')}/query/{quote(name)}?{urlencode(params)}"
    try:
        with urllib.request.urlopen(urllib.request.Request(target, headers=auth_headers(token)),
                                    timeout=TIMEOUT_S) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", "")
        except ValueError:
            detail = ""
        if exc.code == 400:
            raise UnknownQuery(detail) from None
        raise NoStore(f"the sink's query API at {url} answered {exc.code}: {detail}") from None
    return [dict(zip(body["columns"], row, strict=True)) for row in body["rows"]]


def _open_store(settings: Settings) -> Store:
    """The data dir's store, opened directly (no sink runs); :class:`NoStore` when it cannot be.

    A ClickHouse server that cannot be reached is one line: the URL tried (password masked),
    why in a word, and what to check; `perftracker up` is advised only for the embedded store
    (no ``store.url``), never for a production server."""
    target = store_target(settings)  # a malformed URL is the caller's usage error, not "no store"
    try:
        return Store.open(target)
    except SinkError as exc:
        if target.kind == "server":
            raise NoStore(f"cannot reach ClickHouse at {shown_target(target)} ({_why(str(exc))}); check "
                          "store.url's address and port, the credentials (store.username, "
                          "PERFTRACKER_STORE_PASSWORD) and TLS (clickhouses:// or ?secure=true, "
                          "store.ca_file, store.verify)") from None
        advice = " (start it with `perftracker up`)" if not settings.store.url else ""
        raise NoStore(f"no running sink found in {settings.data_dir}{advice} "
                      f"and the store could not be opened: {exc}") from None


def shown_target(target: StoreTarget) -> str:
    """The server URL as tried, its password (if any) masked."""
    shown = target.describe()
    if target.password:
        shown = shown.replace(f"//{target.username}@", f"//{target.username}:***@", 1)
    return shown


# words in a driver's error -> why the server could not be used, in a few words
_WHY = (("connection refused", "connection refused"), ("timed out", "timed out"),
        ("timeout", "timed out"), ("name or service not known", "host name not found"),
        ("nodename nor servname", "host name not found"), ("name resolution", "host name not found"),
        ("getaddrinfo", "host name not found"), ("authentication", "authentication failed"),
        ("code: 516", "authentication failed"), ("certificate", "TLS failed"), ("ssl", "TLS failed"),
        ("unknown_database", "no such database"), ("code: 81", "no such database"))


def _why(error: str) -> str:
    low = error.lower()
    # otherwise the driver's own words, without the "cannot open store URL:" they come after
    return next((why for words, why in _WHY if words in low), error.rsplit(": ", 1)[-1][:200])


def _direct(settings: Settings, name: str, params: dict[str, Any]) -> list[dict]:
    store = _open_store(settings)
    try:
        res = run_query(store, name, params)
    finally:
        store.close()
    return [{k: to_json_value(v) for k, v in row.items()} for row in res.dicts()]


def query(settings: Settings, name: str, **params: Any) -> list[dict]:
    """Run the named query ``name`` (see ``perftracker_ml.sinks.queries.QUERIES``); rows as dicts."""
    if name not in QUERIES:
        raise UnknownQuery(f"no query named {name!r}; known: {sorted(QUERIES)}")
    QUERIES[name].bind(params)  # fail early on bad parameters
    sink = _live_sink(settings)
    if sink is not None:
        url, pid = sink
        try:
            return _via_api(url, name, params, settings.http_token)
        except (urllib.error.URLError, OSError) as exc:
            raise NoStore(f"the sink (pid {pid}) did not answer at {url}: {exc}; is it still starting?") from None
    return _direct(settings, name, params)


def diagnose(settings: Settings, job: str, include_resolved: bool = False) -> list[dict[str, Any]]:
    """Current root causes of ``job``, most costly first (the ``perftracker diagnose`` JSON): open
    incidents, and those the job's end resolved (``resolved_reason`` says which)."""
    rows = [incident_view(r) for r in query(settings, "incidents", job=job, include_resolved=include_resolved)]
    return with_remediations(rows, _remediations(settings, job)) if rows else rows


def _remediations(settings: Settings, job: str) -> list[dict]:
    """What the remediation hook recorded for ``job``'s incidents; none from a sink or store
    older than the ``remediations`` table (migration 9)."""
    try:
        return query(settings, "remediations", job=job)
    except (UnknownQuery, NoStore, StoreUnavailable):
        return []


def with_remediations(rows: list[dict[str, Any]], actions: list[dict]) -> list[dict[str, Any]]:
    """Each diagnosis row with a ``remediation`` list (oldest first: at, node, mode, action,
    outcome, reason, command, patch) where the hook recorded something for it; the key is
    absent from the others."""
    by_incident: dict[str, list[dict]] = {}
    for a in actions:
        by_incident.setdefault(str(a["incident_id"]), []).append(
            {k: v for k, v in a.items() if k != "incident_id"})
    for row in rows:
        if row["incident_id"] in by_incident:
            row["remediation"] = by_incident[row["incident_id"]]
    return rows


def incident_view(row: dict) -> dict[str, Any]:
    """One ``incidents`` query row as a diagnosis row (first/last seen as the store has them)."""
    return diagnosis_row(row, row["first_seen"], row["last_seen"])


def _live_sink(settings: Settings) -> tuple[str, int] | None:
    """The query API URL and pid of the sink recorded in the data dir, when it runs."""
    state = read_state(settings.data_dir)
    if state and state.query_url and pid_alive(state.sink_pid):
        return state.query_url, state.sink_pid
    return None


def keep(settings: Settings, records: list[tuple[str, dict]]) -> Kept:
    """Write ``records`` (FunctionPattern, RankWindow, FunctionComparison, Anomaly) into the store:
    through the running sink's query API when there is one, else into the store directly
    (tables created or migrated first). Raises :class:`NoStore` when neither can take them."""
    from .keep import Kept, decode_records, encode_records, write_records

    body = encode_records(records)  # both paths store what went through Avro, as the sink does
    sink = _live_sink(settings)
    if sink is None:
        store = _open_store(settings)
        try:
            return write_records(store, settings.store, decode_records(body), setup=True)
        except StoreUnavailable as exc:
            raise NoStore(f"could not write into {store_target(settings).describe()}: {exc}") from None
        finally:
            store.close()
    url, pid = sink
    request = urllib.request.Request(f"{url.rstrip('/')}/store", data=body, method="POST", headers={
        **auth_headers(settings.http_token), "Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=KEEP_TIMEOUT_S) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", "")
        except ValueError:
            detail = ""
        hint = " (a sink older than this CLI: restart it with `perftracker down` and `perftracker up`)" \
            if exc.code == 404 else ""
        raise NoStore(f"the sink's query API at {url} refused the records ({exc.code}): {detail}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise NoStore(f"the sink (pid {pid}) did not answer at {url}: {exc}; is it still starting?") from None
    return Kept(records=answer["records"], rows_written=answer["rows_written"],
                rows_rejected=answer["rows_rejected"], invalid=list(answer["invalid"]),
                where=f"the stack's sink (pid {pid})")
