"""One diagnosis row for the live path and the trace import."""

from __future__ import annotations

from perftracker_ml.schemas.diagnosis import ROW_FIELDS, diagnosis_row

INCIDENT = {"incident_id": "i1", "job": "j", "status": "OPEN", "kind": "rank", "cause": "slow_gpu",
            "ranks": (5,), "hosts": ["h0", ""], "gpus": None, "function": "f", "score": 7,
            "impact_ms_per_step": 12, "step_time_ms": 100.0, "windows": 3, "summary": "rank 5 is slow",
            "evidence_json": '{"ratio": 2.0}'}


def test_row_shape_and_conversions():
    row = diagnosis_row(INCIDENT, "2024-01-01T00:00:00+00:00", "later")
    assert list(row) == list(ROW_FIELDS) == [
        "incident_id", "job", "status", "kind", "cause", "ranks", "hosts", "gpus", "function", "score",
        "impact_ms_per_step", "step_time_ms", "first_seen", "last_seen", "windows", "summary", "evidence",
        "resolved_reason"]
    assert row["ranks"] == [5] and row["hosts"] == ["h0"] and row["gpus"] == []
    assert row["score"] == 7.0 and isinstance(row["score"], float) and row["evidence"] == {"ratio": 2.0}
    assert (row["first_seen"], row["last_seen"]) == ("2024-01-01T00:00:00+00:00", "later")


def test_evidence_that_is_not_json_is_kept_raw_and_missing_fields_default():
    row = diagnosis_row({k: v for k, v in INCIDENT.items() if k not in ("step_time_ms", "windows")}
                        | {"evidence_json": "{oops"}, None, None)
    assert row["evidence"] == {"raw": "{oops"} and row["step_time_ms"] == 0.0 and row["windows"] == 0
    assert row["resolved_reason"] == ""
