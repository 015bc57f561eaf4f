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

from .manifests import K8S, k8s_objects

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate missing: pip install -e '.[dev]'")

VERSIONS = sorted(set(kubernetes_validate.utils.all_versions()),
                  key=lambda v: tuple(int(p) for p in v.split(".")))
OBJECTS = [*k8s_objects(), ("secrets.example.yaml", yaml.safe_load((K8S / "secrets.example.yaml").read_text()))]


@pytest.mark.parametrize("version", [VERSIONS[0], VERSIONS[-1]])
@pytest.mark.parametrize("obj", [d for _, d in OBJECTS],
                         ids=[f"{src}:{d['kind']}/{d['metadata']['name']}" for src, d in OBJECTS])
def test_object_passes_the_kubernetes_schema(obj, version):
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on Kubernetes {version}: "
                    f"{str(exc).splitlines()[0]} at {list(exc.path)}")


def test_every_kind_is_checked():
    kinds = {d["kind"] for _, d in OBJECTS}
    assert {"Namespace", "Service", "StatefulSet", "Deployment", "ConfigMap",
            "PersistentVolumeClaim", "Secret"} <= kinds
