from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.sinks.rows import flat_rows, incident_version
from perftracker_ml.sinks.schema import TABLES


def test_every_row_fits_its_table():
    seen = set()
    for name, rec in samples.job_records("j", world=4, windows=1):
        for table, row in flat_rows(name, rec):
            assert len(row) == len(TABLES[table].columns), table
            seen.add(table)
    assert seen == set(TABLES) - {"remediations"}  # the remediation hook's (remediation.action_row)


def test_iterations_are_numbered_by_step():
    rw = samples.rank_window("j", 10, 2, steps=5)
    steps = [row[2] for t, row in flat_rows("RankWindow", rw) if t == "iterations"]
    assert steps == list(range(rw["last_step"] - 4, rw["last_step"] + 1))


def test_incident_version_orders_lifecycle():
    a = samples.anomaly("j")
    t = int(a["last_seen_ms"].timestamp() * 1000)
    assert incident_version("OPEN", t) < incident_version("UPDATED", t) < incident_version("RESOLVED", t)
    assert incident_version("OPEN", t + 1) > incident_version("RESOLVED", t)


def test_comparison_of_a_collective_has_a_row_per_member():
    rows = list(flat_rows("FunctionComparison", samples.comparison("j", 1, world=4, slow_rank=2)))
    assert [t for t, _ in rows] == ["collectives"] * 4
    late = {row[4]: row[8] for _, row in rows}
    assert late == {0: 0, 1: 0, 2: 45, 3: 0}


def test_comparison_of_a_function_gives_its_outliers():
    rows = list(flat_rows("FunctionComparison", samples.comparison("j", 1, function="f", slow_rank=2)))
    assert [(t, row[4]) for t, row in rows] == [("function_outliers", 2)]
