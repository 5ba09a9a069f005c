"""Aggregation and confidence: a kind's signals x entities sub-scores -> one value per entity.

Theory of operation
-------------------
Per entity: hard gates first (a fresh gate at 0 forces 0), a weighted mean inside each category, then
the consumer's cross-category function (min; geometric mean, or mean for baselines). Confidence is the
share of *expected* signals that are fresh (a signal is expected when the policy says so and its family
was seen, or when it is fresh); no fresh data -> unknown, never healthy. Everything before the
cross-category step is the same for every consumer (``_Base``, made once per evaluation). A read-only
signal (``score: false``, its sub-score NaN) is in no category and never seen or expected here. What follows
from a kind's signal list alone (``_SpecPlan``), from which signals are seen and fresh, and from
sub-scores bit for bit last cycle's is kept on the plan in the scorer's memory, by equality: a healthy
fleet's cycle re-derives almost nothing. ``KindScores`` is one kind's columnar result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fleethealth.policy import SignalSpec
from fleethealth.score.context import _Mats, _SignalResult
from fleethealth.score.expect import (
    WHY_FRESH,
    WHY_INVENTORY,
    WHY_OWN,
    WHY_PEERS,
    WHY_PENDING,
    WHY_PRIOR,
    KindExpect,
)
from fleethealth.score.health import REASON_NO_FRESH_DATA, EntityKind

if TYPE_CHECKING:
    from fleethealth.score.kept import Kept


@dataclass
class KindScores:
    """Columnar scores of every entity of one kind. raw/rate/z/age matrices (for explanation only) are
    stacked on first use."""

    kind: EntityKind
    names: list[str]
    signals: list[SignalSpec]
    sub: np.ndarray  # entities x signals
    results: list[_SignalResult]
    expected: np.ndarray  # entities x signals (bool)
    categories: list[str]
    cat: np.ndarray  # entities x categories
    value: np.ndarray  # NaN = unknown
    confidence: np.ndarray
    worst: np.ndarray  # category index or -1
    reason: list[str]
    flags: dict[int, list[str]]
    notes: dict[tuple[int, int], str]
    worst_member: Mapping[int, str] = field(default_factory=dict)
    member_of: np.ndarray | None = None  # for gpu: node index
    gated: np.ndarray | None = None  # bool per entity: a hard gate decided it
    n_expected: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per entity: expected signals
    n_fresh: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per entity: fresh ones
    # why each expected signal is expected (entities x signals, ``score.expect.WHY_*``), the kind's
    # expectation inputs (peer groups, prior, declared) and each group's carriers per signal
    expected_by: np.ndarray | None = None
    expect: KindExpect | None = None
    carry: np.ndarray | None = None  # signals x groups
    fams: list[str] = field(default_factory=list)
    fam_fresh: np.ndarray | None = None  # families x entities: reported fresh (what FamilyMemory learns)
    # for a node short of GPUs by its peers (the node roll-up): node index -> why it is expected to have more
    gpu_count_why: dict[int, str] = field(default_factory=dict)
    _stacked: dict[str, np.ndarray] = field(default_factory=dict)
    # the matrices the results are rows of, when they are: raw, rate, z and age are stacked by them on
    # first use (most of their rows are never written, see ``_Mats``)
    _mats: _Mats | None = field(default=None, repr=False, compare=False)
    # what its scores were made from (the kind's derived scores, this consumer's entry of them): equal
    # tokens, equal scores (the node roll-up keeps its results by them)
    _made_from: tuple[Any, Any] | None = None

    def _stack(self, attr: str) -> np.ndarray:
        m = self._stacked.get(attr)
        if m is None and self._mats is not None:  # (the results are rows of these)
            m = self._stacked[attr] = getattr(self._mats, attr).T
        if m is None:
            n = len(self.names)
            m = self._stacked[attr] = (
                np.column_stack([getattr(r, attr) for r in self.results]) if self.results else np.zeros((n, 0))
            )
        return m

    @property
    def raw(self) -> np.ndarray:
        return self._stack("raw")

    @property
    def rate(self) -> np.ndarray:
        return self._stack("rate")

    @property
    def z(self) -> np.ndarray:
        return self._stack("z")

    @property
    def age(self) -> np.ndarray:
        return self._stack("age")


def _lowest_category(cat_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entity (columns of ``cat_t``, categories x entities): the lowest known category score (inf
    when none is known) and its index, the first of equal minima (-1 when none is known)."""
    c, n = cat_t.shape
    if c == 0:
        return np.full(n, np.inf), np.full(n, -1, np.int64)
    filled = np.where(np.isnan(cat_t), np.inf, cat_t)
    worst = filled.argmin(axis=0)  # the first of equal minima, as a scan that keeps strict improvements
    low = filled.min(axis=0)
    return low, np.where(low < np.inf, worst, -1)


def _cross_value(cat_t: np.ndarray, low: np.ndarray, any_: np.ndarray, how: str) -> np.ndarray:
    """The cross-category value per entity (NaN when no category is known): min, geometric mean
    (0 when any category is 0) or mean (baselines only: averages away a fatal category)."""
    n = cat_t.shape[1]
    if cat_t.shape[0] == 0:
        return np.full(n, np.nan)
    if how == "min":
        return np.where(any_, low, np.nan)
    if how == "gmean":
        have = ~np.isnan(cat_t)
        logs = np.where(have, np.log(np.maximum(np.where(have, cat_t, 1.0), 1e-300)), 0.0)
        k_have = have.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            val = np.where(any_, np.exp(logs.sum(axis=0) / np.maximum(k_have, 1)), np.nan)
        return np.where(any_ & (low == 0), 0.0, val)
    if not n:
        return np.zeros(0)
    # the mean of the categories present; np.nanmean would warn on an entity with none (it reads NaN anyway)
    have = ~np.isnan(cat_t)
    total = np.where(have, cat_t, 0.0).sum(axis=0)
    return np.where(any_, total / np.maximum(have.sum(axis=0), 1), np.nan)


@dataclass
class _Base:
    """One kind's aggregation up to the cross-category step: the same for every consumer, computed once
    per evaluation and shared read-only (what a consumer may change is copied out of it)."""

    sub_t: np.ndarray  # signals x entities
    expected_t: np.ndarray
    n_exp: np.ndarray
    n_fresh: np.ndarray
    confidence: np.ndarray  # a gated entity's is 1 (a gate is certain evidence)
    cat_t: np.ndarray  # categories x entities
    cat_ix: np.ndarray
    gated: np.ndarray
    first_gate: np.ndarray
    flags: dict[int, list[str]]
    notes: dict[tuple[int, int], str]
    low: np.ndarray  # lowest known category score (inf: none)
    worst: np.ndarray  # its index (-1: none); a gated entity's is its first gate's category
    any_gated: bool
    n_exp_f: np.ndarray = field(default_factory=lambda: np.zeros(0))  # n_exp, n_fresh as floats (read-only)
    n_fresh_f: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # per cross-category function: (reasons, worst category, value)
    by_how: dict[str, tuple[list[str], np.ndarray, np.ndarray]] = field(default_factory=dict)
    # entity -> ``pending:<signals>``: signals that need two samples, expected and not yet fresh
    pending: dict[int, str] = field(default_factory=dict)
    why_t: np.ndarray | None = None  # signals x entities: WHY_* codes
    carry: np.ndarray | None = None
    fam_fresh: np.ndarray | None = None


def _aggregate(
    kind: EntityKind, names: list[str], specs: list[SignalSpec], results: list[_SignalResult], how: str,
    categories: list[str], critical_zeroes: bool = True, cache: dict[str, _Base] | None = None,
    mats: _Mats | None = None, kept: Kept | None = None, expect: KindExpect | None = None,
) -> KindScores:
    """Scores of one kind for one cross-category function ``how``. Everything before the cross-category
    step is the same for every consumer: kept in ``cache`` (per evaluation) and shared, read-only; what
    a caller may change in place (per-entity vectors, flags, category list) is its own copy."""
    base = cache.get(kind) if cache is not None else None
    if base is None:
        base = _aggregate_base(names, specs, results, categories, critical_zeroes, mats, kept, expect)
        if cache is not None:
            cache[kind] = base
    m = len(specs)
    hit = base.by_how.get(how)
    if hit is None:
        value = _cross_value(base.cat_t, base.low, base.worst >= 0, how)
        if base.any_gated:
            value = np.where(base.gated, 0.0, value)
        unknown = np.isnan(value)
        gate_reasons, cat_reasons = _spec_plan(kept, specs, categories).reasons(how)
        reason_arr = np.where(
            base.gated, gate_reasons[base.first_gate] if m else "",
            np.where(unknown, REASON_NO_FRESH_DATA, cat_reasons[np.maximum(base.worst, 0)] if len(categories) else ""),
        )
        reasons = reason_arr.tolist()
        for e, why in base.pending.items():  # known, not gated: say what is not yet fresh
            if not base.gated[e] and not unknown[e]:
                reasons[e] = why
        hit = base.by_how[how] = (reasons, np.where(unknown, -1, base.worst), value)
    reason, worst, value = hit
    ks = KindScores(
        kind, names, specs, base.sub_t.T, list(results), base.expected_t.T, list(categories), base.cat_t.T,
        value.copy(), base.confidence.copy(), worst.copy(), list(reason),
        {e: list(f) for e, f in base.flags.items()}, dict(base.notes), gated=base.gated,
        n_expected=base.n_exp_f, n_fresh=base.n_fresh_f,
        expected_by=base.why_t.T if base.why_t is not None else None, expect=expect, carry=base.carry,
        fams=_spec_plan(kept, specs, categories).fams, fam_fresh=base.fam_fresh,
    )
    if mats is not None and m:  # the results are rows of these: stacked by them on first use
        ks._mats = mats
    ks._made_from = (base.by_how, hit)
    return ks


@dataclass
class _SpecPlan:
    """What aggregation needs from a kind's signal list alone (the same every cycle)."""

    fam_rows: list[np.ndarray]  # per family: its signals
    fam_ix: np.ndarray
    exp_flag: np.ndarray
    cat_ix: np.ndarray
    direct: list[tuple[int, int]]  # (category, signal) where the category is that one signal
    multi: list[tuple[int, np.ndarray, np.ndarray]]  # (category, its signals, their weights)
    gate_rows: np.ndarray
    gate_reasons: np.ndarray
    categories: list[str]
    weights: np.ndarray = field(default_factory=lambda: np.zeros(0))
    direct_cats: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    direct_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _cat_reasons: dict[str, np.ndarray] = field(default_factory=dict)
    two: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # needs two samples (rate, burn rate)
    names: list[str] = field(default_factory=list)
    fams: list[str] = field(default_factory=list)
    read_only: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # ``score: false``: never seen here
    # (seen, fresh, expected, n expected, n fresh, confidence, per multi category (weight > 0, weight
    # sum or 1)): the last masks' consequences (see _aggregate_base)
    fixed: tuple[Any, ...] | None = None
    # (that ``fixed``, critical zeroes, sub-scores, what _derive made of them): the last cycle's
    memo: tuple[Any, ...] | None = None

    def reasons(self, how: str) -> tuple[np.ndarray, np.ndarray]:
        """Reason strings (object arrays): per signal when it gates, per category when it is the worst."""
        cat = self._cat_reasons.get(how)
        if cat is None:
            prefix = "min" if how == "min" else how
            cat = self._cat_reasons[how] = np.array(
                [f"{prefix}:{c}" for c in self.categories] or [REASON_NO_FRESH_DATA], dtype=object)
        return self.gate_reasons, cat


def _spec_plan(kept: Kept | None, specs: list[SignalSpec], categories: list[str]) -> _SpecPlan:
    """The kind's plan: kept per (signal list, category list) while the scorer keeps it (``kept``;
    None: made for this call alone). The lists are the scorer's per policy, the same every cycle."""
    if kept is None:
        return _spec_plan_of(None, specs, categories)
    hit_lists = kept.spec_plan_of_lists.get((id(specs), id(categories)))
    if hit_lists is not None and hit_lists[0] is specs and hit_lists[1] is categories:
        return hit_lists[2]
    plan = _spec_plan_of(kept, specs, categories)
    if len(kept.spec_plan_of_lists) > 64:
        kept.spec_plan_of_lists.clear()
    kept.spec_plan_of_lists[(id(specs), id(categories))] = (specs, categories, plan)
    return plan


def _spec_plan_of(kept: Kept | None, specs: list[SignalSpec], categories: list[str]) -> _SpecPlan:
    key = (tuple(id(s) for s in specs), tuple(categories))
    hit = kept.spec_plans.get(key) if kept is not None else None
    if hit is not None and all(a is b for a, b in zip(hit[0], specs, strict=True)):
        return hit[1]
    fams = sorted({s.family_name for s in specs})
    fam_ix = np.array([fams.index(s.family_name) for s in specs], np.int64)
    # a read-only signal (``score: false``) is in no category (-1): its sub-score is NaN, never fresh
    cat_ix = np.array([categories.index(s.category) if s.score else -1 for s in specs], np.int64)
    w = np.array([s.weight for s in specs], np.float64)
    direct: list[tuple[int, int]] = []
    multi: list[tuple[int, np.ndarray, np.ndarray]] = []
    for c in range(len(categories)):
        rows = np.flatnonzero(cat_ix == c)
        if rows.size == 0:
            continue
        if rows.size == 1 and w[rows[0]] > 0:
            direct.append((c, int(rows[0])))
        else:
            multi.append((c, rows, w[rows]))
    plan = _SpecPlan(
        [np.flatnonzero(fam_ix == fi) for fi in range(len(fams))], fam_ix,
        np.array([s.expected and s.score for s in specs], bool), cat_ix, direct, multi,
        np.flatnonzero(np.array([s.shape in ("gate", "xid") for s in specs], bool)),
        np.array([f"gate:{s.name}" for s in specs] or ["gate:"], dtype=object), list(categories), w,
        np.array([c for c, _ in direct], np.int64), np.array([j for _, j in direct], np.int64),
    )
    plan.two = np.array([s.shape == "slo" or (s.kind == "counter" and s.shape != "xid") for s in specs], bool)
    plan.names = [s.name for s in specs]
    plan.fams = fams
    plan.read_only = np.array([not s.score for s in specs], bool)
    if kept is not None:
        if len(kept.spec_plans) > 64:
            kept.spec_plans.clear()
        kept.spec_plans[key] = (list(specs), plan)
    return plan


def _aggregate_base(
    names: list[str], specs: list[SignalSpec], results: list[_SignalResult], categories: list[str],
    critical_zeroes: bool, mats: _Mats | None = None, kept: Kept | None = None, expect: KindExpect | None = None,
) -> _Base:
    # Signals x entities: each signal's column is one contiguous row, so stacking is a memcpy per signal
    # and a category is a block of rows; the entities x signals views handed out are transposes. With
    # ``mats`` the results already are those rows.
    n = len(names)
    m = len(specs)
    plan = _spec_plan(kept, specs, categories)
    if mats is not None and m:
        sub_t, seen_t = mats.sub, mats.seen
    else:
        sub_t = np.stack([r.sub for r in results]) if m else np.zeros((0, n))
        seen_t = np.stack([r.seen for r in results]) if m else np.zeros((0, n), bool)
    if plan.read_only.any():
        # a read-only signal is no evidence of its family, nor expected by peers or a past: not seen here
        # (its sub-score is NaN: never fresh either), so it cannot move expected sets or confidence
        seen_t = seen_t & ~plan.read_only[:, None]
    fresh_t = ~np.isnan(sub_t)
    # What depends only on which signals are seen and fresh (expected signals, confidence, each
    # category's weight sum) is as last cycle's while those masks are: the steady state.
    fixed = plan.fixed
    if fixed is None or fixed[-1] is not expect or not (
            np.array_equal(fixed[0], seen_t) and np.array_equal(fixed[1], fresh_t)):
        fam_seen = np.zeros((len(plan.fam_rows), n), bool)
        fam_fresh = np.zeros((len(plan.fam_rows), n), bool)
        for fi, rows in enumerate(plan.fam_rows):
            fam_seen[fi] = seen_t[rows[0]] if rows.size == 1 else seen_t[rows].any(axis=0)
            fam_fresh[fi] = fresh_t[rows[0]] if rows.size == 1 else fresh_t[rows].any(axis=0)
        expected_t, why_t, carry, pending = _expected(plan, seen_t, fresh_t, fam_seen, fam_fresh, expect)
        n_exp = expected_t.sum(axis=0)
        n_fresh = fresh_t.sum(axis=0)  # fresh implies expected
        with np.errstate(invalid="ignore", divide="ignore"):
            confidence = np.where(n_exp > 0, n_fresh / np.maximum(n_exp, 1), 0.0)
        weights = []
        for _, rows, wr in plan.multi:
            ws = (wr[:, None] * fresh_t[rows]).sum(axis=0)
            weights.append((ws > 0, np.where(ws > 0, ws, 1.0)))
        # the masks as they are now: fresh_t is this call's own array (read-only from here: nothing writes
        # it), seen_t a copy unless it is one already (a read-only signal masked out above)
        kept_seen = seen_t if mats is None or seen_t is not mats.seen else seen_t.copy()
        for a in (expected_t, n_exp, n_fresh, confidence, why_t, fam_fresh, fresh_t, kept_seen):
            a.setflags(write=False)  # shared by every cycle while the masks hold
        # the signals with any fresh sub-score: every other row is NaN throughout while the masks hold
        live = np.flatnonzero(fresh_t.any(axis=1))
        fixed = plan.fixed = (kept_seen, fresh_t, expected_t, n_exp, n_fresh, confidence, weights,
                              pending, why_t, carry, fam_fresh, live, expect)
    _, _, expected_t, n_exp, n_fresh, confidence, weights, pending, why_t, carry, fam_fresh, live, _ = fixed

    flags: dict[int, list[str]] = {}
    notes: dict[tuple[int, int], str] = {}
    for j, r in enumerate(results):
        for e, f in r.flags:
            lst = flags.setdefault(e, [])
            if f not in lst:
                lst.append(f)
        for e, note in r.notes.items():
            notes[(e, j)] = note
    # Everything else follows from the sub-scores alone (with the masks above): as last cycle's when they
    # are equal, bit for bit (a healthy fleet's sub-scores mostly sit at exactly 1). With the same
    # ``fixed`` the NaNs are where they were (``fixed`` holds while the fresh mask is equal), so only the
    # rows with a fresh sub-score (``live``) are kept and compared: a signal of the policy the fleet does
    # not export is a NaN row, and a copy of every row was 22 MB of new memory on a cold 100k-GPU cycle.
    memo = plan.memo
    if (memo is not None and memo[0] is fixed and memo[1] == critical_zeroes
            and np.array_equal(memo[2], sub_t[live], equal_nan=True)):
        derived = memo[3]
    else:
        derived = _derive(plan, sub_t, fresh_t, weights, confidence, n_exp, n_fresh, critical_zeroes)
        plan.memo = (fixed, critical_zeroes, sub_t[live], derived)  # (a fancy index: a copy)
    cat_t, gated, first_gate, low, worst, any_gated, conf, n_exp_f, n_fresh_f, by_how = derived
    return _Base(sub_t, expected_t, n_exp, n_fresh, conf, cat_t, plan.cat_ix, gated, first_gate, flags, notes,
                 low, worst, any_gated, n_exp_f, n_fresh_f, by_how, pending, why_t, carry, fam_fresh)


def _expected(plan: _SpecPlan, seen_t: np.ndarray, fresh_t: np.ndarray, fam_seen: np.ndarray,
              fam_fresh: np.ndarray, expect: KindExpect | None,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, dict[int, str]]:
    """Which signals are expected of each entity, and why (the expectation model, README):

    * its own: a policy-expected signal of a family the entity reports (``WHY_OWN``), or any fresh one;
    * its past (``WHY_PRIOR``): a family it reported before (``KindExpect.prior``) and lacks now counts
      as seen: its policy-expected signals;
    * its peers (``WHY_PEERS``): a signal more than ``carried_share`` of its peer group carries and it
      lacks; for an entity declared by inventory with no sample at all, ``WHY_INVENTORY``;
    * a signal that needs two samples, seen while its family reports fresh (``WHY_PENDING``).

    Returns the expected mask, the codes (signals x entities), each group's carriers per signal, and the
    reasons of entities that lack something (``missing:<families or signals>``, ``pending:<signals>``)."""
    m, n = seen_t.shape
    if m == 0:
        return np.zeros((0, n), bool), np.zeros((0, n), np.int8), None, {}
    has_data: np.ndarray = np.asarray(seen_t.any(axis=0), bool)
    own_t = plan.exp_flag[:, None] & fam_seen[plan.fam_ix]
    prior_sig = np.zeros((m, n), bool)
    prior_gone = None
    lacking = np.zeros((m, n), bool)
    carry = None
    declared_only = np.zeros(n, bool)
    if expect is not None and n:
        if expect.declared is not None:
            declared_only = expect.declared & ~has_data
        prior = expect.prior_matrix(plan.fams, n)
        if prior is not None:
            # a family it reported before and lacks now counts as seen (as it does in the history while
            # its samples are kept): its policy-expected signals are expected
            prior_gone = prior & ~fam_seen & (has_data | declared_only)[None, :]
            prior_sig = prior_gone[plan.fam_ix] & plan.exp_flag[:, None]
        g = expect.groups
        if g is not None and g.grp.size == n:
            carry = g.counts(seen_t)
            carried = carry > expect.carried_share * g.sizes[None, :]
            lacking = carried[:, g.grp] & ~seen_t
    pending_t = (plan.two[:, None] & seen_t & ~fresh_t & fam_fresh[plan.fam_ix]) if plan.two.size \
        else np.zeros((m, n), bool)
    expected_t = own_t | fresh_t | prior_sig | lacking | pending_t
    why_t = np.zeros((m, n), np.int8)
    why_t[lacking] = WHY_PEERS
    why_t[prior_sig] = WHY_PRIOR
    why_t[pending_t] = WHY_PENDING
    why_t[own_t] = WHY_OWN
    why_t[fresh_t] = WHY_FRESH
    if declared_only.any():
        why_t[:, declared_only] = np.where(why_t[:, declared_only] > 0, WHY_INVENTORY, 0)
    def pending_of(e: int) -> str:
        return "pending:" + ",".join(plan.names[j] for j in np.flatnonzero(pending_t[:, e]).tolist())

    ents = np.flatnonzero((pending_t & ~plan.exp_flag[:, None]).any(axis=0))
    reasons = _by_pattern(ents, pending_t[:, ents], pending_of)
    # what an entity with data lacks beyond its own policy-expected signals (those are counted missing by
    # their family already): a family it lacks entirely by its name, else the signals
    gone = (lacking | prior_sig) & ~own_t & has_data[None, :]

    def missing_of(e: int) -> str:
        items: list[str] = []
        for fi, rows in enumerate(plan.fam_rows):
            miss = rows[gone[rows, e]]
            if miss.size == 0:
                continue
            if not fam_seen[fi, e]:
                items.append(plan.fams[fi])
            else:
                items.extend(plan.names[j] for j in miss.tolist())
        return "missing:" + ",".join(items)

    ents = np.flatnonzero(gone.any(axis=0))
    reasons.update(_by_pattern(ents, np.concatenate((gone[:, ents], fam_seen[:, ents])), missing_of))
    return expected_t, why_t, carry, reasons


def _by_pattern(ents: np.ndarray, cols: np.ndarray, make: Callable[[int], str]) -> dict[int, str]:
    """``{e: make(e)}`` for the entities ``ents`` (ascending), where ``make(e)`` depends only on column
    ``cols[:, i]`` (entity ``ents[i]``): ``make`` runs once per distinct column, not per entity (a cold
    cycle's fleet lacking a signal its peers carry is thousands of entities with a handful of patterns)."""
    if ents.size <= 8:
        return {e: make(e) for e in ents.tolist()}
    packed = np.packbits(cols.T, axis=1)  # one row of bytes per entity
    _, first, inv = np.unique(packed, axis=0, return_index=True, return_inverse=True)
    made = [make(e) for e in ents[first].tolist()]
    return dict(zip(ents.tolist(), map(made.__getitem__, inv.reshape(-1).tolist()), strict=True))


def _derive(plan: _SpecPlan, sub_t: np.ndarray, fresh_t: np.ndarray, weights: list[tuple[np.ndarray, np.ndarray]],
            confidence: np.ndarray, n_exp: np.ndarray, n_fresh: np.ndarray, critical_zeroes: bool,
            ) -> tuple[Any, ...]:
    """Category scores, gates, the lowest category and confidence from one kind's sub-scores: read-only
    arrays (shared by every consumer, and by later cycles with equal sub-scores)."""
    m, n = sub_t.shape
    cat_ix = plan.cat_ix
    # Weighted mean per category. A sum over axis 0 adds the rows one after the other, in signal order
    # (the same numbers as a loop of row additions). A one-signal category is that signal.
    cat_t = np.full((len(plan.categories), n), np.nan)
    if plan.direct:
        cat_t[plan.direct_cats] = sub_t[plan.direct_rows]
    if plan.multi:
        # one category's rows at a time: its temporaries are freed before the next one's (malloc hands
        # the same blocks back), not one m x n weighted copy of every signal (new pages on a cold cycle)
        with np.errstate(invalid="ignore", divide="ignore"):
            for (c, rows, wr), (pos, safe) in zip(plan.multi, weights, strict=True):
                sub_c = sub_t[rows]
                wsub = np.where(fresh_t[rows], sub_c, 0.0)  # NaN exactly where not fresh
                wsub *= wr[:, None]
                cat_t[c] = np.where(pos, wsub.sum(axis=0) / safe, np.nan)
                if critical_zeroes:
                    cat_t[c][(sub_c == 0).any(axis=0)] = 0.0  # NaN is never == 0: only fresh zeroes
    gate_rows = plan.gate_rows
    if gate_rows.size:
        gate_hit = sub_t[gate_rows] == 0
        gated = gate_hit.any(axis=0)
        first_gate = gate_rows[gate_hit.argmax(axis=0)]
    else:
        gated = np.zeros(n, bool)
        first_gate = np.zeros(n, np.int64)
    gated = np.asarray(gated, bool)
    low, worst = _lowest_category(cat_t)
    any_gated = bool(gated.any())
    if any_gated:
        confidence = np.where(gated, 1.0, confidence)
        worst = np.where(gated, cat_ix[first_gate] if m else -1, worst)
    n_exp_f, n_fresh_f = n_exp.astype(np.float64), n_fresh.astype(np.float64)
    for a in (cat_t, gated, first_gate, low, worst, confidence, n_exp_f, n_fresh_f):
        a.setflags(write=False)  # handed to every consumer's scores as they are
    by_how: dict[str, tuple[list[str], np.ndarray, np.ndarray]] = {}
    return cat_t, gated, first_gate, low, worst, any_gated, confidence, n_exp_f, n_fresh_f, by_how
