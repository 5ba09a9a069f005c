"""Render a Snapshot as Prometheus' classic text format (0.0.4), the latest sample of each series.

Classic text, not OpenMetrics: scrapers of dcgm-exporter expect it, and it keeps names exactly as given.
Label order follows dcgm-exporter's (gpu, UUID, pci_bus_id, device, modelName, Hostname, driver) so a diff
against a dcgm-exporter page reads naturally; the rest follow sorted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fleethealth.signals.snapshot import Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABEL_ORDER = {k: i for i, k in enumerate(
    ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"))}


_ESCAPE = str.maketrans({"\\": "\\\\", "\n": "\\n", '"': '\\"'})


def escape_label_value(value: str) -> str:
    """A label value as the text format writes it: backslash, newline and double quote escaped."""
    return value.translate(_ESCAPE)


def _format_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def _format_labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    ordered = sorted(labels, key=lambda kv: (_LABEL_ORDER.get(kv[0], len(_LABEL_ORDER)), kv[0]))
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in ordered) + "}"


def render_exposition(snapshot: Snapshot, metric_help: Mapping[str, tuple[str, str]] | None = None) -> str:
    """One line per series (its latest sample), grouped by metric with HELP/TYPE where known
    (``metric_help``: name -> (type, help)); metrics in first-seen order, series in first-seen order."""
    help_ = metric_help or {}
    if len(snapshot) == 0:
        return ""
    # Latest sample per (metric, series): a stable sort by time keeps the last one per key.
    order = np.argsort(snapshot.ts, kind="stable")
    latest: dict[tuple[int, int], float] = {}
    for m, s, v in zip(snapshot.metric_ids[order].tolist(), snapshot.series_ids[order].tolist(),
                       snapshot.values[order].tolist(), strict=True):
        latest[(m, s)] = v
    by_metric: dict[int, list[tuple[int, float]]] = {}
    for m in dict.fromkeys(snapshot.metric_ids.tolist()):
        by_metric[m] = []
    for (m, s), v in latest.items():
        by_metric[m].append((s, v))
    lines: list[str] = []
    for m, series in by_metric.items():
        name = snapshot.metrics[m]
        if name in help_:
            kind, text = help_[name]
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
        for s, v in sorted(series):
            lines.append(f"{name}{_format_labels(snapshot.labelsets[s])} {_format_value(v)}")
    return "\n".join(lines) + "\n"
