"""Workloads: every synthetic job and fault that perftracker's demo, benchmarks and tests run.

One home for what stands in for a training job when none is running:

* :mod:`.faults` — the fault table: each fault a workload injects and the cause a correct
  diagnosis names (the demo, the fault suite of real jobs (``benchmarks``), the recordings' truth and the tests read it);
* :mod:`.synthetic` — a data-parallel job's EventBatches from a few parameters (``perftracker
  synth``, the stack and fault tests);
* :mod:`.batches` — a TP x PP x DP job's batches built by the collectors' own BatchBuilder
  (throughput, the chunk fold);
* :mod:`.ranks` — synthetic ranks at any scale, vectorized (scale and catch-up, up to 100,000 ranks);
* :mod:`.simulate` — the labelled detection benchmark's simulator (patterns and events per rank
  class, hardware readings, faults with their truth);
* :mod:`.store_records` — the records the stream stages emit, for the sink, the store and dashboards;
* :mod:`.kineto` — PyTorch profiler (Kineto) traces of many ranks, for trace import.

Real runs are not simulated: they are recorded (``perftracker record``) and replayed
(``benchmarks/recordings``, docs/recordings.md).
"""
