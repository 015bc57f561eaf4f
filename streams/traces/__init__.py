"""Import PyTorch profiler (Kineto / Chrome JSON) traces of many ranks into the detection core.

``import_traces(path, job, policy=None) -> list[dict]``: the diagnosis rows (the
``perftracker diagnose --json`` shape) for a directory, ``.tar.gz`` or ``.json[.gz]`` of
per-rank traces. See docs/trace-import.md.
"""

from .importer import ImportReport, import_policy, import_traces, import_traces_with_report
from .kineto import parse_trace
from .load import TraceError

__all__ = ["ImportReport", "TraceError", "import_policy", "import_traces", "import_traces_with_report",
           "parse_trace"]
