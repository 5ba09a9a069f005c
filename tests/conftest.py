"""Shared test set-up.

Hypothesis profiles: locally the property tests draw new examples on every run (that is how they find
bugs); CI (``.ci/run``) replays a fixed, derandomized set so that a landing never depends on the draw.
``FLEETHEALTH_HYPOTHESIS=ci bash scripts/test`` reproduces CI's examples.

``cluster``: one real kube-apiserver + etcd (+ controller-manager) per test module that asks for it, started
once for the module because a start costs seconds; skipped where the binaries are not built."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("FLEETHEALTH_HYPOTHESIS", "dev"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    """A real Kubernetes control plane for the module (tests/k8s_harness.py); its logs if it fails to start."""
    import k8s_harness

    reason = k8s_harness.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    c = k8s_harness.KubeCluster()
    try:
        c.start()
    except Exception:
        log = c.log("apiserver") + c.log("etcd")
        c.stop()
        raise RuntimeError("control plane did not start:\n" + log) from None
    print(f"\nkube control plane ready in {c.start_s:.1f}s")
    try:
        yield c
    finally:
        c.stop()
