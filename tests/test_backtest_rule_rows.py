"""The rule baselines remember a metric's rows per layout array (the simulator hands the same arrays every
step): an arm that keeps them decides exactly as one that looks the rows up afresh every step, and a new
layout (a forked world's copied arrays, a grown fleet) is looked up again."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.backtest.arms import LivenessArm, RuleArm, StaticRulesArm
from fleethealth.signals.snapshot import Snapshot

NODES = ["n0", "n1", "n2"]
REPLICAS = {"r0": "n0", "r1": "n2"}
METRICS = ["up", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "vllm:num_requests_running"]


def _layout() -> tuple[list[str], list[tuple[tuple[str, str], ...]], np.ndarray, np.ndarray]:
    labelsets: list[tuple[tuple[str, str], ...]] = []
    mids: list[int] = []
    sids: list[int] = []
    for n in NODES:
        labelsets.append((("instance", f"{n}:9400"),))
        mids.append(0)
        sids.append(len(labelsets) - 1)
        for g in range(2):
            labelsets.append((("Hostname", n), ("gpu", str(g))))
            for m in (1, 2):
                mids.append(m)
                sids.append(len(labelsets) - 1)
    for r, n in REPLICAS.items():
        labelsets.append((("replica", r), ("node", n)))
        mids.append(3)
        sids.append(len(labelsets) - 1)
    return METRICS, labelsets, np.array(mids, np.int32), np.array(sids, np.int32)


def _fresh(arm: RuleArm) -> RuleArm:
    arm._rows_of = None  # forget the rows: look them up again this step
    return arm


step = st.tuples(st.lists(st.sampled_from([0.0, 1.0, 1.0]), min_size=3, max_size=3),  # up per node
                 st.lists(st.sampled_from([50.0, 60.0, 90.0]), min_size=6, max_size=6),  # temperatures
                 st.lists(st.sampled_from([0.0, 0.0, 0.0, 79.0]), min_size=6, max_size=6),  # Xid
                 st.sets(st.sampled_from(["r0", "r1"])),  # replicas whose engine vanished (running = NaN row dropped)
                 st.booleans())  # a new copy of the layout arrays (a forked world)


@settings(max_examples=50, deadline=None)
@given(script=st.lists(step, min_size=1, max_size=12))
def test_rule_arms_with_remembered_rows_decide_as_with_fresh_lookups(script: list) -> None:
    metrics, labelsets, mids, sids = _layout()
    kept = [StaticRulesArm(NODES), LivenessArm(NODES, REPLICAS)]
    plain = [StaticRulesArm(NODES), LivenessArm(NODES, REPLICAS)]
    for k, (up, temps, xids, gone, copy_layout) in enumerate(script):
        if copy_layout:
            mids, sids = mids.copy(), sids.copy()
        vals: list[float] = []
        ti = xi = 0
        for m in mids.tolist():
            if m == 0:
                vals.append(up[len([v for v in mids[: len(vals)].tolist() if v == 0])])
            elif m == 1:
                vals.append(temps[ti])
                ti += 1
            elif m == 2:
                vals.append(xids[xi])
                xi += 1
            else:
                vals.append(4.0)
        keep = np.ones(len(vals), bool)
        for j, s in enumerate(sids.tolist()):
            d = dict(labelsets[s])
            if mids[j] == 3 and d.get("replica") in gone:
                keep[j] = False
        if not keep.all():  # a different layout this step: new arrays, as a real snapshot would have
            m_arr, s_arr = mids[keep], sids[keep]
        else:
            m_arr, s_arr = mids, sids
        snap = Snapshot(60.0 * k, metrics, labelsets, m_arr, s_arr, np.array(vals)[keep], np.full(int(keep.sum()), 60.0 * k),
                        [], [])
        for a, b in zip(kept, plain, strict=True):
            a.observe(60.0 * k, snap)
            _fresh(b).observe(60.0 * k, snap)
            assert [t.to_dict() for t in a.log.transitions] == [t.to_dict() for t in b.log.transitions]
            assert [i.to_dict() for i in a.log.intents] == [i.to_dict() for i in b.log.intents]
