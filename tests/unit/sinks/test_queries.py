import pytest
from perftracker_ml.sinks.errors import UnknownQuery
from perftracker_ml.sinks.queries import QUERIES, run_query


def test_parameters_are_typed_and_defaulted():
    bound = QUERIES["incidents"].bind({"job": "j", "include_resolved": "true"})
    assert bound == {"job": "j", "include_resolved": 1, "limit": 100}


def test_missing_or_unknown_parameters_are_refused():
    with pytest.raises(UnknownQuery, match="required"):
        QUERIES["step_times"].bind({})
    with pytest.raises(UnknownQuery, match="unknown parameters"):
        QUERIES["step_times"].bind({"job": "j", "sql": "DROP TABLE x"})
    with pytest.raises(UnknownQuery, match="must be int"):
        QUERIES["step_times"].bind({"job": "j", "minutes": "ten"})


def test_unknown_query_name():
    with pytest.raises(UnknownQuery, match="no query named"):
        run_query(None, "drop_everything", {})  # type: ignore[arg-type]


def test_no_query_formats_values_into_sql():
    for name, q in QUERIES.items():
        for param in q.params:
            assert "{" + param + ":" in q.sql, (name, param)
        assert "%s" not in q.sql and "format(" not in q.sql
