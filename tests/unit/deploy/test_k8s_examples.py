"""The training-job examples of deploy/k8s/examples (docs/attach.md): a PyTorchJob and a JobSet
whose ranks report to the stack of deploy/k8s.

kubernetes-validate knows no custom kind (it only warns on one), so what it can check is
checked strictly: every pod template of the PyTorchJob, every Job template of the JobSet,
against the Kubernetes API schema of the oldest and the newest release it bundles. Then the
parts perftracker relies on: `perftracker launch` in front of torchrun, the job id from the
pod's own label into a variable the collectors read, and the Kafka address that the
cluster's Kafka advertises.
"""

from __future__ import annotations

import re

import pytest
import yaml
from perftracker_ml.collectors.job_agreement import LAUNCHER_JOB_VARS

from .manifests import K8S, check_kubernetes_schema, k8s_object, kubernetes_releases

pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate missing: pip install -e '.[dev]'")

EXAMPLES = K8S / "examples"
PYTORCHJOB = yaml.safe_load((EXAMPLES / "pytorchjob.yaml").read_text())
JOBSET = yaml.safe_load((EXAMPLES / "jobset.yaml").read_text())


def internal_kafka() -> str:
    (c,) = k8s_object("StatefulSet", "kafka")["spec"]["template"]["spec"]["containers"]
    advertised = {e["name"]: e for e in c["env"]}["KAFKA_ADVERTISED_LISTENERS"]["value"]
    (internal,) = (a for a in advertised.split(",") if a.startswith("INTERNAL://"))
    return internal.removeprefix("INTERNAL://")


def templates() -> list[tuple[str, dict]]:
    """(id, a core object holding the example's template) for kubernetes-validate."""
    out = [(f"pytorchjob/{role}", {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()},
                                   "template": spec["template"]})
           for role, spec in PYTORCHJOB["spec"]["pytorchReplicaSpecs"].items()]
    out += [(f"jobset/{rj['name']}", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": rj["name"]},
                                      "spec": rj["template"]["spec"]})
            for rj in JOBSET["spec"]["replicatedJobs"]]
    return out


@pytest.mark.parametrize("version", kubernetes_releases())
@pytest.mark.parametrize("obj", [o for _, o in templates()], ids=[i for i, _ in templates()])
def test_every_template_passes_the_kubernetes_schema(obj, version):
    check_kubernetes_schema(obj, version)


def pods() -> list[tuple[str, dict]]:
    out = [(PYTORCHJOB["kind"], spec["template"]["spec"]) for spec in PYTORCHJOB["spec"]["pytorchReplicaSpecs"].values()]
    out += [(JOBSET["kind"], rj["template"]["spec"]["template"]["spec"]) for rj in JOBSET["spec"]["replicatedJobs"]]
    return out


def test_the_kinds_and_versions_are_the_ones_docs_attach_names():
    assert (PYTORCHJOB["apiVersion"], PYTORCHJOB["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert (JOBSET["apiVersion"], JOBSET["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert set(PYTORCHJOB["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"}


@pytest.mark.parametrize("kind, pod", pods(), ids=[k for k, _ in pods()])
def test_every_rank_runs_under_launch_reports_to_the_advertised_kafka_under_the_jobs_name(kind, pod):
    label = {"PyTorchJob": ("PYTORCHJOB_NAME", "training.kubeflow.org/job-name"),
             "JobSet": ("JOBSET_NAME", "jobset.sigs.k8s.io/jobset-name")}[kind]
    (c,) = pod["containers"]
    assert c["command"][:4] == ["perftracker", "launch", "--", "torchrun"]
    env = {e["name"]: e for e in c["env"]}
    assert env["PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS"]["value"] == internal_kafka()
    name, key = label
    assert name in LAUNCHER_JOB_VARS
    assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{key}']"
    if kind == "PyTorchJob":
        assert c["name"] == "pytorch"  # the container the operator gives RANK, WORLD_SIZE, PET_*


def test_the_jobset_ranks_find_node_rank_and_master_from_jobset_names():
    spec = JOBSET["spec"]
    (rj,) = spec["replicatedJobs"]
    job = rj["template"]["spec"]
    assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"]
    (c,) = job["template"]["spec"]["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"] if a.startswith("--"))
    assert args["node-rank"] == "$(JOB_COMPLETION_INDEX)" and int(args["nnodes"]) == job["completions"]
    name = JOBSET["metadata"]["name"]
    assert spec["network"]["enableDNSHostnames"] is True
    assert args["master-addr"] == f"{name}-{rj['name']}-0-0.{name}"  # pod 0 of job 0, subdomain = JobSet name
    assert re.fullmatch(r"\d+", args["master-port"]) and {"containerPort": int(args["master-port"]),
                                                          "name": "rendezvous"} in c["ports"]


def test_the_examples_are_not_applied_with_the_stack():
    from .manifests import kustomization

    assert not any("examples" in r for r in kustomization(K8S)["resources"])
