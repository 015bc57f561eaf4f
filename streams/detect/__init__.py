"""perftracker_ml.streams.detect: the pure differential-diagnosis core (numpy + stdlib only).

Stage 1 :class:`RankSummarizer` (per job, rank): events -> FunctionPattern + RankWindow.
Stage 2 :class:`FunctionComparator` (per job, function): patterns -> FunctionComparison.
Stage 3 :class:`JobDiagnoser` (per job): comparisons + rank windows -> Anomaly + Control.
The records between the stages are the TypedDicts of :mod:`perftracker_ml.schemas.records`
(plain dicts, built with keywords); ``perftracker_ml.streams.topology`` wires the stages.
See docs/detection.md for the algorithm, thresholds and known failure cases.
"""

from .columnar import collective_lateness, peer_scores
from .compare import FunctionComparator
from .diagnose import JobDiagnoser
from .findings import Finding
from .policy import DetectionPolicy, PolicyError, parse_peer_groups
from .summarize import RankSummarizer

__all__ = [
    "DetectionPolicy", "Finding", "FunctionComparator", "JobDiagnoser",
    "PolicyError", "RankSummarizer", "collective_lateness",
    "parse_peer_groups", "peer_scores",
]
