"""Every object `kubectl apply -k deploy/k8s` creates passes the Kubernetes API schema.

kubernetes-validate (dev extra) bundles the OpenAPI schemas of each Kubernetes release,
so this runs offline. Strict mode also rejects unknown fields (a misspelt
``readinesProbe`` would otherwise be dropped silently by the API server). Checked
against the oldest and the newest release the package bundles. The ConfigMaps that
kustomize generates are built from their files as kustomize would; the example Secret
is checked too.
"""

from __future__ import annotations

import pytest
import yaml

from .manifests import K8S, check_kubernetes_schema, k8s_objects, kubernetes_releases

pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate missing: pip install -e '.[dev]'")

OBJECTS = [*k8s_objects(), ("secrets.example.yaml", yaml.safe_load((K8S / "secrets.example.yaml").read_text()))]


@pytest.mark.parametrize("version", kubernetes_releases())
@pytest.mark.parametrize("obj", [d for _, d in OBJECTS],
                         ids=[f"{src}:{d['kind']}/{d['metadata']['name']}" for src, d in OBJECTS])
def test_object_passes_the_kubernetes_schema(obj, version):
    check_kubernetes_schema(obj, version)


def test_every_kind_is_checked():
    kinds = {d["kind"] for _, d in OBJECTS}
    assert {"Namespace", "Service", "StatefulSet", "Deployment", "ConfigMap",
            "PersistentVolumeClaim", "Secret"} <= kinds
