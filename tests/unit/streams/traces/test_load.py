"""Trace discovery and reading: directories, archives, gzip, and every kind of bad file."""

from __future__ import annotations

import gzip
import json
import tarfile

import pytest
from perftracker_ml.streams.traces import TraceError, import_traces
from perftracker_ml.streams.traces.importer import import_traces_with_report
from perftracker_ml.streams.traces.load import RawTrace, Skip, read_traces

from .helpers import tiny_trace, write


def test_directory_with_json_gz_and_tar(tmp_path):
    (tmp_path / "r0.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(tiny_trace(0)).encode()))
    member = write(tmp_path / "r1.json", tiny_trace(1))
    with tarfile.open(tmp_path / "more.tar.gz", "w:gz") as tar:
        tar.add(member, arcname="inner/r1.pt.trace.json")
    member.unlink()
    got = list(read_traces(tmp_path))
    assert [type(g) for g in got] == [RawTrace, RawTrace]
    assert got[0].source.endswith("more.tar.gz!inner/r1.pt.trace.json")


def test_bad_files_are_skipped_with_the_file_and_reason(tmp_path):
    write(tmp_path / "a.json", "{not json")
    write(tmp_path / "b.json", {"foo": 1})
    write(tmp_path / "c.json", [1, 2])
    (tmp_path / "d.json.gz").write_bytes(b"\x1f\x8bnot really gzip")
    reasons = {s.source.rsplit("/", 1)[-1]: s.reason for s in read_traces(tmp_path) if isinstance(s, Skip)}
    assert reasons["a.json"].startswith("not JSON")
    assert "no traceEvents" in reasons["b.json"]
    assert "JSON list" in reasons["c.json"]
    assert "gzip" in reasons["d.json.gz"]


def test_import_counts_skips_and_keeps_good_ranks(tmp_path):
    for r in range(4):
        write(tmp_path / f"r{r}.json", tiny_trace(r, world=4))
    write(tmp_path / "broken.json", "]]")
    no_rank = tiny_trace(0)
    no_rank.pop("distributedInfo")
    write(tmp_path / "norank.json", no_rank)
    write(tmp_path / "r0-again.json", tiny_trace(0, world=4))
    rows, report = import_traces_with_report(tmp_path, "job-x")
    assert sorted(report.batches) == [0, 1, 2, 3] and rows == []
    skipped = {s.source.rsplit("/", 1)[-1]: s.reason for s in report.skipped_files}
    assert skipped["broken.json"].startswith("not JSON")
    assert "no distributedInfo.rank" in skipped["norank.json"]
    dup = skipped.get("r0.json") or skipped.get("r0-again.json")  # the later of the two by name
    assert dup and "rank 0 already imported" in dup


@pytest.mark.parametrize("setup, fragment", [
    (lambda p: p, "no trace files found"),
    (lambda p: write(p / "x.json", "nope") and p, "not JSON"),
    (lambda p: p / "missing", "no such file or directory"),
    (lambda p: write(p / "notes.txt", "hi"), "expected a directory"),
])
def test_nothing_importable_is_one_clear_error(tmp_path, setup, fragment):
    with pytest.raises(TraceError, match=fragment):
        import_traces(setup(tmp_path), "job-x")
