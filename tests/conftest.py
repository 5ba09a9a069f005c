"""Hypothesis profiles. Locally the property tests draw new examples on every run (that is how they find
bugs); CI (``.ci/run``) replays a fixed, derandomized set so that a landing never depends on the draw.
``FLEETHEALTH_HYPOTHESIS=ci bash scripts/test`` reproduces CI's examples."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("FLEETHEALTH_HYPOTHESIS", "dev"))
