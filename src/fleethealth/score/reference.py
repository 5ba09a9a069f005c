"""A plain scalar transcription of the seed's per-node algorithm, kept as the reference the vectorised
engine is checked against (tests and ``fleethealth bench scoring``). Deliberately simple and slow:
Python loops, ``statistics.median``, one entity at a time. GPU and node entities only (no SLO shape).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from fleethealth.policy import Policy, SignalSpec
from fleethealth.signals.snapshot import Snapshot
from fleethealth.signals.xid import classify_xid


@dataclass
class RefHealth:
    value: float | None
    confidence: float
    worst: str | None
    reason: str


def ramp(x: float, warn: float, crit: float) -> float:
    if crit > warn:
        if x <= warn:
            return 1.0
        if x >= crit:
            return 0.0
        return 1.0 - (x - warn) / (crit - warn)
    if x >= warn:
        return 1.0
    if x <= crit:
        return 0.0
    return 1.0 - (warn - x) / (warn - crit)


def _node_of(labels: dict[str, str], policy: Policy) -> str | None:
    for k in policy.node_labels:
        if labels.get(k):
            return labels[k]
    return None


def score_reference(snap: Snapshot, policy: Policy, now: float, how: str = "min") -> dict[str, RefHealth]:
    """Health of every gpu (``node/gpuN``) and node, computed the slow, obvious way."""
    skew = policy.freshness.future_skew_s
    by_metric: dict[str, list[tuple[dict[str, str], float, float]]] = defaultdict(list)
    for metric, labels, value, ts in snap.rows():
        if ts > now + skew or value != value:
            continue
        by_metric[metric].append((labels, value, ts))

    # per gpu: signal name -> (sub-score or None, seen)
    subs: dict[str, dict[str, float | None]] = defaultdict(dict)
    seen: dict[str, set[str]] = defaultdict(set)
    gpus_of_node: dict[str, set[str]] = defaultdict(set)
    specs = [s for s in policy.signals if "gpu" in s.entities and s.shape != "slo" and s.score]  # read-only: not scored
    for spec in specs:
        max_age = spec.max_age_s or policy.freshness.max_age_s
        series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
        for labels, value, ts in by_metric.get(spec.metric, []):
            series[tuple(sorted(labels.items()))].append((ts, value))
        per_gpu: dict[str, list[tuple[float, dict[str, str], float]]] = defaultdict(list)  # (x, labels, ts)
        newest = _newest_per_gpu(series, policy)
        for key, pts in series.items():
            labels = dict(key)
            node = _node_of(labels, policy)
            if not node or labels.get("gpu", "") == "":
                continue
            gpu = f"{node}/gpu{labels['gpu']}"
            gpus_of_node[node].add(gpu)
            seen[gpu].add(spec.family_name)
            subs[gpu].setdefault(spec.name, None)
            pts.sort()
            if spec.shape == "xid" and pts[-1][0] < newest[gpu]:
                continue  # superseded by a relabelled series of the same GPU: its Xids no longer count
            if spec.shape == "xid" and spec.kind == "gauge":
                window = spec.xid_window_s or policy.xid.window_s
                fresh = now - pts[-1][0] <= max_age
                xids = {int(v) for t, v in pts if t > now - window and v > 0}
                per_gpu[gpu].append((1.0 if fresh else float("nan"), labels, pts[-1][0]))
                for code in xids:
                    cls = classify_xid(code, policy.xid.gate_buckets, policy.xid.gate_xids, policy.xid.app_xids,
                                       policy.xid.reset_xids)
                    if cls == "gate":
                        per_gpu[gpu].append((0.0, labels, pts[-1][0]))
                continue
            if spec.kind == "counter":
                window = spec.rate_window_s or policy.freshness.rate_window_s
                rate = _rate(pts, now, window, max_age, window if spec.sustained else 0.0)
                if rate is None:
                    continue
                if spec.short_window_s is not None and spec.warn is not None and rate > spec.warn:
                    short = _rate(pts, now, spec.short_window_s, max_age)
                    if short is not None:  # the long window confirms: the worse of the two
                        rate = max(rate, short)
                per_gpu[gpu].append((rate, labels, pts[-1][0]))
            else:
                ts, v = pts[-1]
                if now - ts <= max_age and ts >= newest[gpu]:  # superseded by a relabelled series: not counted
                    per_gpu[gpu].append((v, labels, ts))
        if spec.shape == "peer":
            _peer(spec, policy, per_gpu, subs)
            continue
        for gpu, xs in per_gpu.items():
            vals = [x for x, _, _ in xs if x == x]
            if spec.shape == "xid":
                subs[gpu][spec.name] = None if not xs or all(x != x for x, _, _ in xs) else min(
                    x for x, _, _ in xs if x == x
                )
                continue
            if not vals:
                continue
            worst = max(vals) if spec.worse_if == "higher" else min(vals)
            if spec.shape == "flag" and spec.values and any(v in spec.values for v in vals):
                worst = next(v for v in vals if v in spec.values)  # any series at a flagged value
            if spec.relative_to is not None:  # a share of the same GPU's reference gauge
                ref = _latest_worst(by_metric.get(spec.relative_to, []), gpu, spec, policy, now, max_age)
                if ref is None or not ref > 0:
                    subs[gpu][spec.name] = None
                    continue
                worst = worst / ref
            subs[gpu][spec.name] = _shape(spec, worst)

    out: dict[str, RefHealth] = {}
    for gpu in subs:
        out[gpu] = _entity_health(subs[gpu], seen[gpu], specs, policy, how)
    for node, gpus in gpus_of_node.items():
        hs = [out[g] for g in sorted(gpus)]
        gated = [h for h in hs if h.reason.startswith("gate:")]
        known = [h for h in hs if h.value is not None]
        n_exp = sum(_n_expected(subs[g], seen[g], specs) for g in gpus)
        n_fresh = sum(_n_fresh_expected(subs[g], seen[g], specs) for g in gpus)
        conf = n_fresh / n_exp if n_exp else 0.0
        # a GPU unknown or below min_confidence (most of its signals gone) is missing from its node
        lost = [g.rsplit("/", 1)[-1] for g in sorted(gpus)
                if out[g].value is None or out[g].confidence < policy.lifecycle.min_confidence]
        if gated:
            out[node] = RefHealth(0.0, 1.0, gated[0].worst, gated[0].reason)
        elif not known:
            out[node] = RefHealth(None, conf, None, "no_fresh_data")
        elif lost and len(lost) < len(gpus):
            out[node] = RefHealth(None, conf, None, "missing:" + ",".join(lost))
        else:
            w = min(known, key=lambda h: h.value)  # type: ignore[arg-type,return-value]
            out[node] = RefHealth(w.value, conf, w.worst, w.reason)
    _short_of_gpus(snap, policy, gpus_of_node, out)
    return out


def _short_of_gpus(snap: Snapshot, policy: Policy, gpus_of_node: dict[str, set[str]],
                   out: dict[str, RefHealth]) -> None:
    """The peers rule for the GPU count, one node at a time: a pool of at least ``gpu_count_min_peers``
    nodes with GPUs, at least ``gpu_count_fraction`` of them with the same count k; a node with fewer is
    unknown, ``missing:`` the GPUs absent from 0..k-1, its confidence times its share of k."""
    label = policy.expectation.gpu_group_by[0] if policy.expectation.gpu_group_by else "pool"
    pool_of: dict[str, str] = {}
    for _metric, labels, _value, _ts in snap.rows():
        node = _node_of(labels, policy)
        if node and labels.get(label) and node not in pool_of:
            pool_of[node] = labels[label]
    by_pool: dict[str, list[str]] = defaultdict(list)
    for node in gpus_of_node:
        by_pool[pool_of.get(node, "")].append(node)
    for nodes in by_pool.values():
        counts = [len(gpus_of_node[n]) for n in nodes]
        if len(nodes) < policy.expectation.gpu_count_min_peers:
            continue
        k = max(set(counts), key=lambda c: (counts.count(c), -c))  # the most common; the smallest on a tie
        if counts.count(k) < policy.expectation.gpu_count_fraction * len(nodes):
            continue  # a heterogeneous pool expects nothing
        for node in nodes:
            have = len(gpus_of_node[node])
            h = out[node]
            if have >= k or h.reason.startswith("gate:"):
                continue
            conf = h.confidence * have / k
            if h.value is None and not h.reason.startswith("missing:"):
                out[node] = RefHealth(None, conf, h.worst, h.reason)
                continue
            ids = sorted(g.rsplit("/", 1)[-1] for g in gpus_of_node[node])
            if all(i.startswith("gpu") and i[3:].isdigit() for i in ids):
                got = {int(i[3:]) for i in ids}
                lost = [f"gpu{i}" for i in range(k) if i not in got]
            else:
                lost = [f"gpus({have}/{k})"]
            before = h.reason[len("missing:"):].split(",") if h.reason.startswith("missing:") else []
            out[node] = RefHealth(None, conf, None, "missing:" + ",".join(before + [x for x in lost if x not in before]))


def _rate(pts: list[tuple[float, float]], now: float, window: float, max_age: float,
          min_span: float = 0.0) -> float | None:
    """Reset-aware rate of one counter series over the samples in the window, over at least ``min_span``
    (a sustained signal's window; None: fewer than two, or the last one stale)."""
    win = [(t, v) for t, v in pts if t > now - window]
    if len(win) < 2 or now - win[-1][0] > max_age:
        return None
    inc = 0.0
    for (_, a), (_, b) in zip(win, win[1:], strict=False):
        inc += b - a if b >= a else b
    dt = win[-1][0] - win[0][0]
    if dt <= 0:
        return None
    return inc / max(dt, min_span)


def _shape(spec: SignalSpec, x: float) -> float:
    if spec.shape == "ramp":
        assert spec.warn is not None and spec.crit is not None
        return ramp(x, spec.warn, spec.crit)
    if spec.shape == "gate":
        bad = (spec.above is not None and x > spec.above) or (spec.values is not None and x in spec.values)
        return 0.0 if bad else 1.0
    if spec.shape == "flag":
        raised = (spec.above is not None and x > spec.above) or (spec.values is not None and x in spec.values)
        raised = raised or (x >= 0 and any(int(x) & b for b in spec.bits))
        return spec.flag_score if raised else 1.0
    raise ValueError(spec.shape)


def _newest_per_gpu(series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]],
                    policy: Policy) -> dict[str, float]:
    """Per GPU, the time of the newest sample among its series of one metric. A gauge series whose last
    sample is older was superseded (a relabel ends one series and starts another): only series at this
    time count, as Prometheus marks a series stale at the first scrape without it."""
    out: dict[str, float] = {}
    for key, pts in series.items():
        labels = dict(key)
        node = _node_of(labels, policy)
        if not node or labels.get("gpu", "") == "" or not pts:
            continue
        gpu = f"{node}/gpu{labels['gpu']}"
        out[gpu] = max(out.get(gpu, -float("inf")), max(t for t, _ in pts))
    return out


def _latest_worst(rows: list[tuple[dict[str, str], float, float]], gpu: str, spec: SignalSpec, policy: Policy,
                  now: float, max_age: float) -> float | None:
    """The worst latest fresh value among one GPU's series of a gauge (None: none)."""
    latest: dict[tuple[tuple[str, str], ...], tuple[float, float]] = {}
    for labels, value, ts in rows:
        node = _node_of(labels, policy)
        if not node or f"{node}/gpu{labels.get('gpu', '')}" != gpu or labels.get("gpu", "") == "":
            continue
        key = tuple(sorted(labels.items()))
        if key not in latest or ts > latest[key][0]:
            latest[key] = (ts, value)
    newest = max((ts for ts, _ in latest.values()), default=0.0)
    vals = [v for ts, v in latest.values() if now - ts <= max_age and ts >= newest]
    if not vals:
        return None
    return max(vals) if spec.worse_if == "higher" else min(vals)


def _peer(spec: SignalSpec, policy: Policy, per_gpu: dict[str, list[tuple[float, dict[str, str], float]]],
          subs: dict[str, dict[str, float | None]]) -> None:
    groups: dict[tuple[str, ...], list[tuple[str, float]]] = defaultdict(list)
    for gpu, xs in per_gpu.items():
        if not xs:
            continue
        x, labels, _ = max(xs, key=lambda r: r[2])
        # The exporter's own value where a scraper displaced it to exported_<name> (honor_labels: false).
        groups[tuple(labels.get("exported_" + k) or labels.get(k, "") for k in spec.peer_by)].append((gpu, x))
    k_warn = spec.k_warn if spec.k_warn is not None else policy.peer.k_warn
    k_crit = spec.k_crit if spec.k_crit is not None else policy.peer.k_crit
    min_peers = spec.min_peers if spec.min_peers is not None else policy.peer.min_peers
    for members in groups.values():
        if len(members) < min_peers:
            continue
        vals = [x for _, x in members]
        med = statistics.median(vals)
        mad = statistics.median(abs(v - med) for v in vals)
        mad = max(mad, spec.mad_floor_rel * abs(med), 1e-9)
        for gpu, x in members:
            dev = x - med
            if abs(dev) < spec.min_rel_dev * abs(med):
                dev = 0.0
            z = dev / (1.4826 * mad)
            if spec.worse_if == "lower":
                z = -z
            subs[gpu][spec.name] = ramp(z, k_warn, k_crit)


def _n_expected(sub: dict[str, float | None], fams: set[str], specs: list[SignalSpec]) -> int:
    return sum(1 for s in specs if (s.expected and s.family_name in fams) or sub.get(s.name) is not None)


def _n_fresh_expected(sub: dict[str, float | None], fams: set[str], specs: list[SignalSpec]) -> int:
    return sum(1 for s in specs if sub.get(s.name) is not None)


def _entity_health(sub: dict[str, float | None], fams: set[str], specs: list[SignalSpec], policy: Policy,
                   how: str) -> RefHealth:
    n_exp = _n_expected(sub, fams, specs)
    conf = _n_fresh_expected(sub, fams, specs) / n_exp if n_exp else 0.0
    for s in specs:  # gates first, in policy order
        if s.shape in ("gate", "xid") and sub.get(s.name) == 0.0:
            return RefHealth(0.0, 1.0, s.category, f"gate:{s.name}")
    cats: dict[str, list[tuple[float, float]]] = {}
    for s in specs:
        v = sub.get(s.name)
        if v is not None:
            cats.setdefault(s.category, []).append((s.weight, v))
    if not cats:
        return RefHealth(None, conf, None, "no_fresh_data")
    scores = {}
    for c, xs in cats.items():
        if policy.critical_zeroes_category and any(v == 0.0 for _, v in xs):
            scores[c] = 0.0
        else:
            scores[c] = sum(w * v for w, v in xs) / sum(w for w, _ in xs)
    order = list(dict.fromkeys(s.category for s in policy.signals if s.score))  # ties: the policy's order
    worst = min(sorted(scores, key=order.index), key=lambda c: scores[c])
    if how == "min":
        return RefHealth(scores[worst], conf, worst, f"min:{worst}")
    import math

    if how == "gmean":
        val = 0.0 if min(scores.values()) == 0 else math.exp(sum(math.log(v) for v in scores.values()) / len(scores))
        return RefHealth(val, conf, worst, f"gmean:{worst}")
    return RefHealth(sum(scores.values()) / len(scores), conf, worst, f"mean:{worst}")
