"""The stage-record TypedDicts name exactly the fields of the latest bundled Avro schemas."""

from __future__ import annotations

import pytest
from perftracker_ml.schemas import bundled_schemas
from perftracker_ml.schemas import records as r

NESTED = {"groups": r.PeerGroupStat, "outliers": r.RankOutlier, "stragglers": r.Straggler}


@pytest.mark.parametrize("typed", [r.FunctionPattern, r.RankWindow, r.FunctionComparison, r.Anomaly, r.Control])
def test_typed_record_matches_latest_schema(typed):
    schema = bundled_schemas().latest(typed.__name__).raw
    assert sorted(typed.__annotations__) == sorted(f["name"] for f in schema["fields"])
    for f in schema["fields"]:
        if f["name"] in NESTED and typed is r.FunctionComparison:
            item = f["type"]["items"]
            assert item["name"] == NESTED[f["name"]].__name__
            assert sorted(NESTED[f["name"]].__annotations__) == sorted(g["name"] for g in item["fields"])


def test_keyword_construction_is_a_plain_dict():
    c = r.Control(schema_version=1, job="j", request_id="x", command="PROFILE", start_step=5,
                  duration_s=20.0, reason="slow", issued_ms=0)
    assert type(c) is dict and c["command"] == "PROFILE"
