"""Health tuples as the decider reads them, and their reuse from one cycle to the next. Pure.

The engine's FleetHealth is columnar (``score.engine``): per entity kind, arrays of value, confidence and
worst category, with reasons, flags and metadata labels beside them. The decider needs full
``HealthTuple`` objects only for lifecycle entities (nodes and replicas) and for the GPUs that carry
flags, and never reads the per-signal details or category maps, so ``_light_tuples`` and
``_flagged_gpus`` build tuples straight from the columns without them (a fleet-wide flag storm, every
GPU flagged, made one full tuple per GPU: ~14 s of a cycle at 100k GPUs). A plain mapping or iterable of
tuples (tests, replay) is accepted as well.

Reuse across cycles (the decider's ``fast`` path): ``_light_tuples_reusing`` keeps last cycle's columns
as bit patterns (``_Rows``) and hands back the same tuple object for every row whose columns, reason,
flags, worst member and labels are unchanged; ``_serving_replicas`` does the same for the serving
consumer's replica rows and ``_flagged_gpus`` for the flagged GPUs' rows. Identity then carries the meaning "nothing changed" to the decider's other
caches. These caches are answers, never state: they live in the ``Decider`` object the caller holds,
and a cache that cannot be compared (a different set of names, categories or shapes) is rebuilt whole.

Labels are asked for in one call per kind and cycle where the engine offers it (``labels_many``): a
fleet's first decision needs every node's, a flag storm every GPU's; the same dicts as row by row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fleethealth.score.health import EntityKind, HealthTuple

LIFECYCLE_KINDS = ("node", "replica")


class HealthSource(Protocol):
    """What the decider reads of a FleetHealth (score.engine): tuples keyed by entity id."""

    @property
    def tuples(self) -> Mapping[str, HealthTuple]: ...


def _all_tuples(health: HealthSource | Mapping[str, HealthTuple] | Iterable[HealthTuple]) -> list[HealthTuple]:
    if hasattr(health, "tuples"):
        return list(health.tuples.values())
    if isinstance(health, Mapping):
        return list(health.values())
    return list(health)


LabelMemo = dict[tuple[str, str], dict[str, str]]


def _lifecycle_and_flagged(health: Any, memo: LabelMemo | None = None,
                           rows: dict[str, _Rows] | None = None) -> tuple[list[HealthTuple], list[HealthTuple]]:
    """Node and replica tuples, and the GPU tuples that carry flags. The engine's FleetHealth is
    columnar: only the flagged GPUs are turned into tuples (a 100k-GPU fleet has few). ``rows``: the
    decider's cache of last cycle's columns and tuples (unchanged rows keep their tuple)."""
    kinds = getattr(health, "kinds", None)
    if kinds is not None and hasattr(health, "by_kind") and hasattr(health, "tuples"):
        try:
            if rows is None:
                life = [t for k in LIFECYCLE_KINDS for t in _light_tuples(health, k, memo)]
            else:
                life = [t for k in LIFECYCLE_KINDS for t in _light_tuples_reusing(health, k, memo, rows)]
        except (AttributeError, TypeError, IndexError, KeyError):  # an engine without these columns
            if rows is not None:
                rows.clear()
            life = [t for k in LIFECYCLE_KINDS for t in health.by_kind(k)]
        return life, _flagged_gpus(health, memo, rows)
    tuples = _all_tuples(health)
    return ([t for t in tuples if t.kind in LIFECYCLE_KINDS],
            [t for t in tuples if t.kind == "gpu" and t.flags])


_FLAGGED = "gpu:flagged"  # the key of the flagged GPUs' rows in the decider's row cache


def _flagged_gpus(health: Any, memo: LabelMemo | None, rows: dict[str, _Rows] | None) -> list[HealthTuple]:
    """The GPUs that carry flags, as tuples built straight from the columns like the lifecycle ones (the
    decider reads a GPU tuple's name, flags and labels, never its per-signal details: building those made
    a fleet-wide flag storm cost ~14 s at 100k GPUs). ``rows``: with a label memo, a flagged row whose
    columns are unchanged since last cycle keeps last cycle's tuple; nothing is kept while none is
    flagged."""
    ks = health.kinds.get("gpu")
    flagged = sorted(i for i, f in ks.flags.items() if f) if ks is not None else []
    prev = rows.get(_FLAGGED) if rows is not None else None
    if rows is None or ks is None or memo is None or not flagged:
        if rows is not None:
            rows.pop(_FLAGGED, None)
        return _tuples_at(health, ks, flagged, _labels_of(health, ks, flagged, memo))
    diff = None if prev is None or prev.memo is not memo else _changed_rows(ks, prev)
    if diff is None:
        changed = None
        value, conf, reason = _bits(ks.value), _bits(ks.confidence), [str(r) for r in ks.reason]
        flags, wm = {int(i): tuple(f) for i, f in ks.flags.items()}, dict(ks.worst_member)
    else:
        changed, value, conf, reason, flags, wm = diff
    out: list[HealthTuple] = []
    by_row: dict[int, HealthTuple] = {}
    kept = {i: t for i in flagged
            if changed is not None and prev is not None and not changed[i] and (t := prev.by_row.get(i)) is not None}
    # the newly flagged rows' labels in one call and their tuples from the columns at once (a storm flags
    # every GPU at once)
    need = [i for i in flagged if i not in kept]
    made = dict(zip(need, _tuples_at(health, ks, need, _labels_of(health, ks, need, memo)), strict=True))
    for i in flagged:
        t = kept.get(i)
        if t is None:
            t = made[i]
        by_row[i] = t
        out.append(t)
    rows[_FLAGGED] = _Rows(_FLAGGED, prev.names if diff is not None and prev is not None else list(ks.names), value,
                           conf, np.array(ks.worst, np.int64), reason, flags, wm, list(ks.categories), memo, [], by_row)
    return out


def _ask_labels(meta: Any, kind: str, rows: list[int]) -> list[dict[str, str]]:
    """The metadata labels of ``rows``, in one call where the engine has one (``labels_many``: a fleet's
    first decision asks for every node's)."""
    many = getattr(meta, "labels_many", None)
    if many is not None:
        got: list[dict[str, str]] = many(kind, rows)
        return got
    return [meta.labels(kind, i) for i in rows]


def _memo_labels(meta: Any, kind: str, names: list[str], rows: list[int], memo: LabelMemo) -> None:
    """Fill ``memo`` for ``rows`` (the labels of the first row of a name missing from it), asking for
    all of them in one call."""
    want: dict[tuple[str, str], int] = {}
    for i in rows:
        key = (kind, names[i])
        if key not in memo and key not in want:
            want[key] = i
    if want:
        memo.update(zip(want, _ask_labels(meta, kind, list(want.values())), strict=True))


def _labels_of(health: Any, ks: Any, rows: list[int], memo: LabelMemo | None) -> list[dict[str, str]]:
    """``_labels_at`` of each of ``rows``, asked for in one call."""
    if memo is None:
        return _ask_labels(health.meta, ks.kind, rows)
    _memo_labels(health.meta, ks.kind, ks.names, rows, memo)
    return [memo[(ks.kind, ks.names[i])] for i in rows]


def _labels_at(health: Any, ks: Any, i: int, memo: LabelMemo | None) -> dict[str, str]:
    """Row ``i``'s metadata labels, through the decider's memo when it has one (as ``_light_tuples``)."""
    if memo is None:
        labels: dict[str, str] = health.meta.labels(ks.kind, i)
        return labels
    key = (ks.kind, ks.names[i])
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = health.meta.labels(ks.kind, i)
    return hit


def _replica_tuple(name: str, kind: EntityKind, value: float, confidence: float, reason: str, now: float) -> HealthTuple:
    """A serving tuple as the router reads it: value (None for NaN), confidence, reason."""
    v = float(value)
    return HealthTuple(entity=name, kind=kind, value=None if v != v else v,
                       confidence=float(confidence), worst=None, reason=reason, ts=now)


def _serving_replicas(serving: Any, cache: list[Any] | None = None) -> dict[str, HealthTuple]:
    """The serving consumer's replica tuples: only value, confidence and reason are read (router
    weights), so the engine's columns are read without metadata labels or node tuples. ``cache``: a
    one-slot list holding last cycle's (names, value bits, confidence bits, reasons, tuples); a row
    unchanged bit for bit keeps its tuple object."""
    kinds = getattr(serving, "kinds", None)
    if kinds is not None and hasattr(serving, "by_kind") and hasattr(serving, "tuples"):
        try:
            ks = kinds.get("replica")
            if ks is None:
                return {}
            now = serving.now
            if cache is not None:
                vb, cb, rs = _bits(ks.value), _bits(ks.confidence), [str(r) for r in ks.reason]
                prev = cache[0] if cache else None
                if (prev is not None and (ks.names is prev[0] or ks.names == prev[0])
                        and vb.shape == prev[1].shape and cb.shape == prev[2].shape):
                    same = ((vb == prev[1]) & (cb == prev[2])).tolist()
                    tuples = list(prev[4])
                    vals, cfs = vb.view(np.float64), cb.view(np.float64)
                    for i, name in enumerate(prev[0]):
                        if not same[i] or rs[i] != prev[3][i]:
                            tuples[i] = _replica_tuple(name, ks.kind, vals[i], cfs[i], rs[i], now)
                    names = prev[0]
                else:
                    names = list(ks.names)
                    tuples = [_replica_tuple(name, ks.kind, v, cf, r, now)
                              for name, v, cf, r in zip(names, ks.value.tolist(), ks.confidence.tolist(), rs,
                                                        strict=True)]
                cache[:] = [(names, vb, cb, rs, tuples)]
                return dict(zip(names, tuples, strict=True))
            values = ks.value.tolist()
            conf = ks.confidence.tolist()
            return {name: _replica_tuple(name, ks.kind, v, cf, str(r), now)
                    for name, v, cf, r in zip(ks.names, values, conf, ks.reason, strict=True)}
        except (AttributeError, TypeError, IndexError, KeyError, ValueError):
            if cache is not None:
                cache.clear()
    return {t.entity: t for t in _lifecycle_and_flagged(serving)[0] if t.kind == "replica"}


def _light_tuples(health: Any, kind: str, memo: LabelMemo | None = None) -> list[HealthTuple]:
    """The engine's tuples without the per-signal details and category maps the decider never reads
    (building those was most of a cycle's cost). ``memo``: labels already fetched for views with the
    same set of series (the engine's lazy labels are the rest of the cost)."""
    ks = health.kinds.get(kind)
    if ks is None:
        return []
    rows = list(range(len(ks.names)))
    return _tuples_at(health, ks, rows, _labels_of(health, ks, rows, memo))


@dataclass(slots=True)
class _Rows:
    """One kind's columns as last read, and the tuples built from them: a row whose columns are
    bit-for-bit the same (and whose labels come from the same memo) gets the same tuple object again."""

    kind: str
    names: list[str]
    value: np.ndarray  # float64 bits as int64
    conf: np.ndarray
    worst: np.ndarray
    reason: list[str]
    flags: dict[int, tuple[str, ...]]
    worst_member: dict[int, str]
    categories: list[str]
    memo: LabelMemo | None
    tuples: list[HealthTuple]
    by_row: dict[int, HealthTuple] = field(default_factory=dict)  # the flagged GPUs' tuples (``_flagged_gpus``)


def _bits(a: Any) -> np.ndarray:
    return np.array(a, np.float64).view(np.int64)  # a copy: the engine's arrays are not ours to keep


def _changed_rows(ks: Any, prev: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str],
                                                  dict[int, tuple[str, ...]], dict[int, str]] | None:
    """Which rows of ``ks`` differ from ``prev`` (None: not comparable, rebuild all). Also returns the
    new columns in the cached form."""
    names = ks.names
    if names is not prev.names and names != prev.names:
        return None
    if list(ks.categories) != prev.categories:
        return None
    value, conf = _bits(ks.value), _bits(ks.confidence)
    worst = np.array(ks.worst, np.int64)
    if value.shape != prev.value.shape or conf.shape != prev.conf.shape or worst.shape != prev.worst.shape:
        return None
    changed = (value != prev.value) | (conf != prev.conf) | (worst != prev.worst)
    reason = [str(r) for r in ks.reason]
    if reason != prev.reason:
        for i, (a, b) in enumerate(zip(reason, prev.reason, strict=True)):
            if a != b:
                changed[i] = True
    flags = {int(i): tuple(f) for i, f in ks.flags.items()}
    if flags != prev.flags:
        for i in set(flags) | set(prev.flags):
            if flags.get(i, ()) != prev.flags.get(i, ()):
                changed[i] = True
    wm = dict(ks.worst_member)
    if wm != prev.worst_member:
        for i in set(wm) | set(prev.worst_member):
            if wm.get(i) != prev.worst_member.get(i):
                changed[i] = True
    return changed, value, conf, reason, flags, wm


def _light_tuples_reusing(health: Any, kind: str, memo: LabelMemo | None, cache: dict[str, _Rows]) -> list[HealthTuple]:
    """``_light_tuples``, handing back last cycle's tuple object for every row whose columns and labels
    are unchanged (a steady fleet: nearly all). The tuples' ``ts`` is then that of the cycle that built
    them; the decider never reads it. Without a memo (no ``labels_key``: the set of series may have
    changed) every row's labels are asked for, as ``_light_tuples`` does, and a row is unchanged only if
    they are equal too."""
    ks = health.kinds.get(kind)
    prev = cache.get(kind)
    if ks is None:
        cache.pop(kind, None)
        return []
    asked: list[dict[str, str]] | None = None
    if memo is None:
        meta = health.meta
        asked = _ask_labels(meta, kind, list(range(len(ks.names))))
    diff = None if prev is None or prev.memo is not memo else _changed_rows(ks, prev)
    if diff is None or prev is None:
        if asked is None:
            out = _light_tuples(health, kind, memo)
        else:
            out = _tuples_at(health, ks, list(range(len(ks.names))), asked)
        cache[kind] = _Rows(kind, list(ks.names), _bits(ks.value), _bits(ks.confidence), np.array(ks.worst, np.int64),
                            [str(r) for r in ks.reason], {int(i): tuple(f) for i, f in ks.flags.items()},
                            dict(ks.worst_member), list(ks.categories), memo, out)
        return out
    changed, value, conf, reason, flags, wm = diff
    if asked is not None:
        for i, lab in enumerate(asked):
            if not changed[i] and lab != prev.tuples[i].labels:
                changed[i] = True
    tuples = list(prev.tuples)
    if changed.any():
        redo = np.flatnonzero(changed).tolist()
        if asked is None:
            assert memo is not None
            _memo_labels(health.meta, kind, ks.names, redo, memo)
        labels = [asked[i] for i in redo] if asked is not None else [memo[(kind, ks.names[i])] for i in redo]  # type: ignore[index]
        for i, t in zip(redo, _tuples_at(health, ks, redo, labels), strict=True):
            tuples[i] = t
    cache[kind] = _Rows(kind, prev.names, value, conf, np.array(ks.worst, np.int64), reason, flags, wm,
                        prev.categories, memo, tuples)
    return tuples


def _tuple_at(health: Any, ks: Any, i: int, labels: dict[str, str]) -> HealthTuple:
    """Row ``i`` of the engine's columns as ``_light_tuples`` builds it."""
    return _tuples_at(health, ks, [i], [labels])[0]


def _tuples_at(health: Any, ks: Any, rows: list[int], labels: list[dict[str, str]]) -> list[HealthTuple]:
    """``_tuple_at`` of each of ``rows`` (with its labels), the columns read at once instead of one numpy
    scalar at a time (a storm makes one per GPU)."""
    if not rows:
        return []
    values = np.asarray(ks.value, np.float64)[rows].tolist()
    conf = np.asarray(ks.confidence, np.float64)[rows].tolist()
    worst = np.asarray(ks.worst)[rows].tolist()
    names, ek, cats, reason, wm, flags, now = ks.names, ks.kind, ks.categories, ks.reason, ks.worst_member, ks.flags, health.now
    out = []
    for j, i in enumerate(rows):
        v = values[j]
        w = int(worst[j])
        out.append(HealthTuple(
            entity=names[i], kind=ek, value=None if v != v else v, confidence=conf[j],
            worst=cats[w] if w >= 0 else None, reason=str(reason[i]), labels=labels[j],
            worst_member=wm.get(i), flags=tuple(flags.get(i, ())), ts=now,
        ))
    return out


def node_of(t: HealthTuple) -> str:
    if t.kind == "node":
        return t.entity
    labels = t.labels
    if labels:  # (asked of every flagged GPU every cycle: a storm flags them all)
        for k in ("node", "Hostname", "hostname"):
            v = labels.get(k)
            if v:
                return v
    return t.entity.rsplit("/", 1)[0]
