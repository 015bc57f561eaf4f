"""Readers shared by the deploy tests: the compose file, the Kubernetes objects (with the
ConfigMaps kustomize generates), compose interpolation, and the project's config loader.

Offline stand-ins for `docker compose config` and `kubectl kustomize`: no container
engine, cluster or network is needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import tomllib
import yaml
from perftracker_ml.schemas.settings import Settings
from perftracker_ml.schemas.settings_loader import describe_settings, load_settings

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yaml"
K8S = ROOT / "deploy" / "k8s"
GRAFANA = ROOT / "grafana"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"ghcr.io/perftracker/perftracker:{VERSION}"
PERFTRACKER_SERVICES = ("worker", "sink")
KNOWN_ENV = {row[0] for row in describe_settings()}
SECRET_ENV = {row[0] for row in describe_settings() if row[1] == "Secret"}
SECRET_NAME = re.compile("PASSWORD|SECRET|TOKEN|ROUTING_KEY|WEBHOOK_URL")

__all__ = ["Settings", "load_settings"]


# -- compose -------------------------------------------------------------------
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def env_example() -> dict[str, str]:
    out = {}
    for line in (COMPOSE_DIR / "env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


class MissingVariable(Exception):
    """A ``${NAME:?message}`` whose variable is empty: compose refuses to start."""


_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


def interpolate(obj: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable substitution: ``$$``, ``${X}``, ``${X:-d}``, ``${X-d}``, ``${X:?m}``, ``${X?m}``."""
    if isinstance(obj, dict):
        return {k: interpolate(v, env) for k, v in obj.items()}
    if isinstance(obj, list):
        return [interpolate(v, env) for v in obj]
    if not isinstance(obj, str):
        return obj

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1) or m.group(4), m.group(2) or "", m.group(3) or ""
        value = env.get(name)
        unset = not value if op.startswith(":") else value is None
        if op.endswith("-"):
            return arg if unset else str(value)
        if op.endswith("?") and unset:
            raise MissingVariable(f"{name}: {arg}")
        return value or ""

    return _VAR.sub(sub, obj)


def required_compose_variables() -> set[str]:
    return set(re.findall(r"\$\{(\w+):?\?", COMPOSE.read_text()))


def filled_env() -> dict[str, str]:
    """env.example with every required value filled in, as an operator's .env would be."""
    env = env_example()
    for name in required_compose_variables():
        env[name] = env.get(name) or f"example-{name.lower()}"
    env["KAFKA_EXTERNAL_HOST"] = "perftracker.example.internal"
    return env


def compose_env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


# -- kubernetes ----------------------------------------------------------------
def kustomization(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def _read_env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value
    return out


def generated_config_maps(folder: Path) -> Iterator[dict[str, Any]]:
    """The ConfigMaps of a kustomization's configMapGenerator, as kustomize builds them."""
    for gen in kustomization(folder).get("configMapGenerator", []):
        data: dict[str, str] = {}
        for rel in gen.get("files", []):
            data[Path(rel).name] = (folder / rel).read_text()
        for rel in gen.get("envs", []):
            data.update(_read_env_file(folder / rel))
        yield {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data}


@cache
def k8s_objects() -> list[tuple[str, dict[str, Any]]]:
    """(source, object) for every object `kubectl apply -k deploy/k8s` creates (shared: do not modify)."""
    out: list[tuple[str, dict[str, Any]]] = []

    def walk(folder: Path) -> None:
        for res in kustomization(folder).get("resources", []):
            path = (folder / res).resolve()
            if path.is_dir():
                walk(path)
                continue
            out.extend((path.name, d) for d in yaml.safe_load_all(path.read_text()) if d)
        out.extend((f"{folder.name}/kustomization.yaml", cm) for cm in generated_config_maps(folder))

    walk(K8S)
    return out


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in k8s_objects() if d["kind"] == kind and d["metadata"]["name"] == name)


def pod_specs() -> list[tuple[str, dict[str, Any]]]:
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for _, d in k8s_objects()
            if d["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet")]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec.get("initContainers", []) + spec["containers"]


def secret_keys() -> set[str]:
    return set(yaml.safe_load((K8S / "secrets.example.yaml").read_text())["stringData"])


def container_env(container: dict, secret_value: str = "s3cr3t",
                  by_name: dict[str, str] | None = None) -> dict[str, str]:
    """A container's env as the kubelet resolves it, secrets replaced by ``secret_value``
    (``by_name``: another value for some variables, e.g. a URL where a URL is checked)."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = (by_name or {}).get(e["name"], secret_value)
    return env


def image_tag_is_exact(image: str) -> bool:
    """name:1.2.3 or name:v1.2.3 (a full release version, not latest or a moving minor tag),
    optionally @sha256."""
    ref, _, digest = image.partition("@")
    name, _, tag = ref.rpartition(":")
    if digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return False
    return bool(name) and "/" not in tag and re.fullmatch(r"v?\d+\.\d+\.\d+(\.\d+)?([-.][\w.-]+)?", tag) is not None


def kubernetes_releases() -> list[str]:
    """The oldest and the newest Kubernetes release kubernetes-validate (dev extra) bundles
    (callers importorskip it first)."""
    import kubernetes_validate

    versions = sorted(set(kubernetes_validate.utils.all_versions()), key=lambda v: tuple(int(p) for p in v.split(".")))
    return [versions[0], versions[-1]]


def check_kubernetes_schema(obj: dict[str, Any], version: str) -> None:
    """Fail the test unless ``obj`` passes the API schema of ``version``, strictly (unknown fields
    rejected: a misspelt key would otherwise be dropped by the API server)."""
    import kubernetes_validate
    import pytest

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on Kubernetes {version}: "
                    f"{str(exc).splitlines()[0]} at {list(exc.path)}")
