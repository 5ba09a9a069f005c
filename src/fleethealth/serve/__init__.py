"""The serving sidecar: health truth, drain, OOM handling and canary recovery for one inference replica.

``create_app(SidecarConfig(upstream=...), clock=...)`` builds the FastAPI app; ``fleethealth sidecar`` runs
it. Names are loaded lazily so importing the package stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SidecarConfig", "create_app", "run_sidecar"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from fleethealth.serve.app import create_app

        return create_app
    if name == "SidecarConfig":
        from fleethealth.serve.config import SidecarConfig

        return SidecarConfig
    if name == "run_sidecar":
        from fleethealth.serve.server import run_sidecar

        return run_sidecar
    raise AttributeError(name)
