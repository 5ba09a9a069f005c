"""The container image, without a container runtime: the Dockerfile's shape (multi-stage, slim base,
non-root, the wheel installed without the source tree), every manifest in deploy/ naming that image, and
the Dockerfile's install steps carried out in a clean virtualenv, whose entry point then runs.

The virtualenv sees the machine's site-packages for the dependencies (there is no package index in CI);
fleethealth itself is the freshly built wheel, installed into the venv and imported from there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "ghcr.io/fleethealth/fleethealth:0.1.0"


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    text = dockerfile()
    froms = re.findall(r"^FROM (\S+)(?: AS (\w+))?", text, re.M)
    assert len(froms) >= 2 and froms[-1][0].endswith("-slim"), froms
    runtime = text.split(f"AS {froms[-1][1]}", 1)[1]
    assert "COPY --from=" in runtime and "COPY src" not in runtime  # only the wheels reach the runtime image
    assert re.search(r"^USER 65532", runtime, re.M)
    assert re.search(r'^ENTRYPOINT \["fleethealth"\]', runtime, re.M)
    assert "--no-index" in runtime  # nothing is fetched at install time beyond the built wheels


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for p in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(p.read_text()):
            if isinstance(doc, dict) and "kind" in doc:
                out.append((p, doc))
    return out


def test_every_manifest_runs_the_image_the_dockerfile_builds() -> None:
    assert IMAGE in dockerfile()
    seen = 0
    for p, doc in manifests():
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if "fleethealth" in c["image"]:
                assert c["image"] == IMAGE, (p.name, c["name"], c["image"])
                seen += 1
                uid = c.get("securityContext", {}).get("runAsUser", spec.get("securityContext", {}).get("runAsUser"))
                assert uid in (None, 65532), (p.name, c["name"], uid)
    assert seen >= 3  # controller, agent, sidecar


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_install_steps_work_in_a_clean_virtualenv(tmp_path: Path) -> None:
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    # stage 1, for fleethealth itself (its dependencies come from this machine's site-packages)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "--wheel-dir", str(wheels), str(ROOT)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = wheels.glob("fleethealth-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # stage 2: the Dockerfile's `pip install --no-index --find-links /wheels fleethealth`
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
                        "--ignore-installed", "--no-deps", "fleethealth"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    where = subprocess.run([str(py), "-c", "import fleethealth; print(fleethealth.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, env=env, timeout=60)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr  # the wheel, not the checkout
    exe = venv / "bin" / "fleethealth"
    assert exe.exists(), f"no entry point in {whl.name}"
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert r.returncode == 0 and "run" in r.stdout and "sidecar" in r.stdout and "agent" in r.stdout, r.stdout
    r = subprocess.run([str(exe), "policy", "show"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert r.returncode == 0 and "signals:" in r.stdout, r.stderr[-500:]  # package data (the shipped policy) is in
