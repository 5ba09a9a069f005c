"""Failpoints: let a test kill the process at a chosen point (crash-consistency tests, never production).

Theory of operation
- ``FLEETHEALTH_FAILPOINT`` names points and on which hit they fire: ``after-commit`` (the first cycle
  whose committed decision has intents, before any is acted on), ``after-commit:3`` (the third such
  cycle), ``after-apply:2`` (the second actuator call that succeeded, before the ledger records it: the
  "applied but crashed before marking" case), several separated by commas.
- Firing is SIGKILL of this process: no cleanup, no atexit, no flush, exactly what a node failure or an
  OOM kill does. The line logged just before says which point fired.
- Counts live in the ``Failpoints`` object the controller is built with (no module state); unset, every
  ``hit`` is a dictionary lookup that finds nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

log = logging.getLogger("fleethealth.failpoint")

ENV = "FLEETHEALTH_FAILPOINT"
POINTS = ("after-commit", "after-apply")


class Failpoints:
    def __init__(self, spec: str | None = None) -> None:
        self.armed: dict[str, int] = {}
        self.hits: dict[str, int] = {}
        for part in (spec or "").split(","):
            part = part.strip()
            if not part:
                continue
            name, _, n = part.partition(":")
            if name not in POINTS or (n and not n.isdigit()):
                raise ValueError(f"{ENV}: unknown failpoint {part!r} (known: {', '.join(POINTS)}, as NAME or NAME:N)")
            self.armed[name] = int(n or "1")

    @classmethod
    def from_env(cls) -> Failpoints:
        return cls(os.environ.get(ENV))

    def hit(self, name: str) -> None:
        want = self.armed.get(name)
        if want is None:
            return
        self.hits[name] = self.hits.get(name, 0) + 1
        if self.hits[name] == want:
            log.critical("failpoint %s reached (hit %d): killing this process (SIGKILL)", name, want)
            for h in logging.getLogger().handlers:
                h.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
