"""Fleet KPIs (review.kpis) on hand-made transitions with known answers: GPU-hours lost to isolated, unknown
and slow nodes (each hour once), training goodput, serving SLO attainment, live quarantine precision from
review's outcomes, time to detect and to repair, flap rate, pages; and the before/after comparison."""

from __future__ import annotations

import numpy as np
import pytest

from fleethealth.review.kpis import (
    EntityInfo,
    SloSampler,
    compare,
    compare_table,
    pool_kpis,
    slo_met,
    state_seconds,
    summary_table,
)

DAY = 86400.0
ENTS = {"n1": EntityInfo("node", "train-a", 8), "n2": EntityInfo("node", "train-a", 8),
        "r1": EntityInfo("replica", "serve-a")}


def t(ts: float, entity: str, frm: str, to: str, reason: str = "min:performance", detail: str = "") -> dict:
    return {"ts": ts, "entity": entity, "kind": "replica" if entity.startswith("r") else "node", "from": frm,
            "to": to, "reason": reason, "detail": detail}


TRANSITIONS = [
    t(3600, "n1", "READY", "DEGRADED"),  # slow for an hour
    t(7200, "n1", "DEGRADED", "QUARANTINED", "gate:xid:79"),  # isolated two hours; a hard gate: confirmed
    t(10800, "n1", "QUARANTINED", "RECOVERING", detail="active_test_failed"),
    t(14400, "n1", "RECOVERING", "READY", detail="active_test_passed"),
    t(20000, "n2", "READY", "DEGRADED"), t(20600, "n2", "DEGRADED", "READY"),  # a flap, repaired in 600 s
    t(30000, "r1", "READY", "QUARANTINED", "min:serving"),  # cleared by its test: not confirmed
    t(31000, "r1", "QUARANTINED", "RECOVERING", detail="active_test_passed"),
    t(32000, "r1", "RECOVERING", "READY", detail="warm"),
]
INTENTS = [{"ts": 7200, "intent": "page", "entity": "n1", "reason": "gate:xid:79", "params": {}},
           {"ts": 14400, "intent": "page", "entity": "n1", "reason": "gate:xid:79", "params": {"state": "resolved"}}]


def test_state_seconds_start_from_the_state_before_the_period() -> None:
    s = state_seconds(TRANSITIONS, ENTS, 5000, 12000)
    assert s["n1"] == {"DEGRADED": 2200, "QUARANTINED": 3600, "RECOVERING": 1200}
    assert s["n2"] == {"READY": 7000} and s["r1"] == {"READY": 7000}
    # no transition at all: the state the caller gives
    assert state_seconds([], {"x": EntityInfo("node", "p", 8, "QUARANTINED")}, 0, 100) == {"x": {"QUARANTINED": 100}}


def test_pool_kpis_with_values() -> None:
    k = pool_kpis(TRANSITIONS, INTENTS, ENTS, start=0, end=DAY, unknown_s={"n2": 1800},
                  slo={"serve-a": 0.9}, health_mean={"train-a": 0.95})
    a = k["train-a"]
    assert (a.nodes, a.replicas, a.gpus, a.gpu_hours) == (2, 0, 16, 384)
    assert a.lost_isolated_gpu_h == pytest.approx(8 * 2)  # QUARANTINED + RECOVERING, 7200..14400
    assert a.lost_slow_gpu_h == pytest.approx(8 * 1 + 8 * 600 / 3600)  # n1's hour and n2's 10 minutes
    assert a.lost_unknown_gpu_h == pytest.approx(8 * 0.5)
    assert a.goodput == pytest.approx(1 - (16 + 8 + 8 * 600 / 3600 + 4) / 384)
    assert (a.incidents, a.quarantines, a.confirmed, a.precision) == (2, 1, 1, 1.0)
    assert a.detect_median_s == 3600  # n1: first bad at 3600, isolated at 7200 (n2 never isolated)
    assert a.repair_median_s == pytest.approx((10800 + 600) / 2)  # first bad to READY
    assert a.flaps == 1 and a.flaps_per_entity_day == pytest.approx(0.5)
    assert a.pages == 1  # the resolution is not a new page
    assert a.slo_attainment is None and a.health_mean == 0.95
    s = k["serve-a"]
    assert s.gpus == 0 and s.goodput is None and s.slo_attainment == 0.9
    assert (s.quarantines, s.confirmed, s.precision) == (1, 0, 0.0)  # the test found nothing
    assert s.repair_median_s == 2000
    f = k["all"]
    assert f.precision == 0.5 and f.quarantines == 2 and f.gpus == 16 and f.slo_attainment == 0.9


def test_isolated_hours_are_not_also_unknown_or_slow() -> None:
    ents = {"n": EntityInfo("node", "p", 4, "QUARANTINED")}
    k = pool_kpis([], [], ents, start=0, end=3600, unknown_s={"n": 3600})["p"]
    assert (k.lost_isolated_gpu_h, k.lost_unknown_gpu_h, k.lost_slow_gpu_h) == (4, 0, 0) and k.goodput == 0.0
    empty = pool_kpis([], [], {"n": EntityInfo("node", "p", 4)}, start=0, end=3600)["p"]
    assert empty.goodput == 1.0 and empty.precision is None and empty.detect_median_s is None


def test_slo_met_needs_every_known_slo_signal_within_budget() -> None:
    sub = np.array([[1.0, 1.0, 0.3], [1.0, 0.7, 1.0], [np.nan, np.nan, 0.0], [np.nan, 1.0, 1.0]])
    known, met = slo_met(sub, [0, 1])  # column 2 is not an SLO signal (queue depth)
    assert known.tolist() == [True, True, False, True] and met.tolist() == [True, False, False, True]


class _Sig:
    def __init__(self, shape: str) -> None:
        self.shape = shape


class _Kind:
    def __init__(self, names: list[str], sub: list[list[float]]) -> None:
        self.names, self.sub = names, np.array(sub)
        self.signals = [_Sig("slo"), _Sig("ramp")]


class _Health:
    def __init__(self, k: _Kind) -> None:
        self.kinds = {"replica": k}


def test_slo_sampler_integrates_replica_time() -> None:
    s = SloSampler({"a": "serve", "b": "serve"})
    s.observe(0, _Health(_Kind(["a", "b"], [[1, 0], [1, 0]])))  # the first cycle only starts the clock
    s.observe(60, _Health(_Kind(["a", "b"], [[1, 0], [0.2, 1]])))  # b burns its budget: 60 of 120 s
    s.observe(120, _Health(_Kind(["a", "b"], [[1, 0], [np.nan, 1]])))  # b unknown: not counted
    assert s.attainment() == {"serve": pytest.approx(120 / 180)}


def test_compare_says_better_or_worse_per_figure() -> None:
    before = {"p": {"goodput": 0.90, "lost_gpu_h": 30.0, "precision": None, "detect_median_s": 600.0, "pages": 2}}
    after = {"p": {"goodput": 0.95, "lost_gpu_h": 40.0, "precision": 1.0, "detect_median_s": 600.0, "pages": 1},
             "q": {"goodput": 1.0}}
    rows = {r["figure"]: r for r in compare(before, after)}
    assert {r["pool"] for r in rows.values()} == {"p"}  # only pools in both
    assert rows["goodput"]["verdict"] == "better" and rows["goodput"]["change"] == pytest.approx(0.05)
    assert rows["lost_gpu_h"]["verdict"] == "worse" and rows["precision"]["verdict"] == "n/a"
    assert rows["detect_median_s"]["verdict"] == "same" and rows["pages"]["verdict"] == "better"
    table = compare_table(compare(before, after))
    good = next(r for r in table if r[1] == "GPU goodput")
    assert good[2:] == ["90.0%", "95.0%", "+5.0 pt", "better"]
    lost = next(r for r in table if r[1] == "node GPU-hours lost")
    assert lost[2:] == ["30.0", "40.0", "+10.0", "worse"]


def test_summary_table_rounds_for_people() -> None:
    k = pool_kpis(TRANSITIONS, INTENTS, ENTS, start=0, end=DAY, slo={"serve-a": 0.9})
    rows = summary_table({p: v.to_dict() for p, v in k.items()})
    assert rows[0][:3] == ["pool", "GPUs", "GPU goodput"]
    assert [r[0] for r in rows[1:]] == ["serve-a", "train-a", "all pools"]
    train = rows[2]
    assert train[2] == "93.4%" and train[3] == "25.3" and train[5] == "100.0%"
    assert "None" not in " ".join(" ".join(r) for r in rows)


def test_kpis_of_a_store_and_two_ranges_compared(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    from fleethealth.cli.main import app
    from test_review import T0, make_store

    db = tmp_path / "s.db"
    make_store(db).close()
    r = CliRunner().invoke(app, ["kpis", "--db", str(db), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (d["since"], d["until"]) == (T0 + 100, T0 + 3600)  # first transition to the latest cycle
    train = d["pools"]["train"]
    assert train["gpu_hours"] == pytest.approx(24 * 3500 / 3600)
    assert train["lost_isolated_gpu_h"] == pytest.approx(8 * (1200 + 2800 + 1200) / 3600)  # node-a, b, c
    assert train["lost_slow_gpu_h"] == pytest.approx(8 * (600 + 600) / 3600)  # node-b and node-c DEGRADED
    assert train["precision"] == pytest.approx(2 / 3) and train["outcomes"]["cleared"] == 1  # as `review` says
    text = CliRunner().invoke(app, ["kpis", "--db", str(db)])
    assert text.exit_code == 0 and "train" in text.stdout and "66.7%" in text.stdout and "None" not in text.stdout
    # the last half hour against the half hour before: train's goodput went from 16% to 61%
    r = CliRunner().invoke(app, ["kpis", "--db", str(db), "--since", "-30m", "--compare", "..-30m"])
    assert r.exit_code == 0, r.output
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("train") and "GPU goodput" in ln)
    assert row.split()[-5:] == ["15.7%", "61.1%", "+45.4", "pt", "better"], row
    bad = CliRunner().invoke(app, ["kpis", "--db", str(db), "--compare", "-30m"])
    assert bad.exit_code == 2 and "SINCE..UNTIL" in bad.stderr


def test_true_onsets_move_detect_and_repair_to_the_fault_start() -> None:
    # n1's fan began failing at 1800 s, an hour and a half before its first bad transition (3600 s)
    k = pool_kpis(TRANSITIONS, INTENTS, ENTS, start=0, end=DAY, onsets={"n1": [900, 1800, 5000]})["train-a"]
    assert k.detect_median_s == 7200 - 1800  # the latest onset before the incident began, to isolation
    assert k.repair_median_s == pytest.approx(((14400 - 1800) + 600) / 2)  # n2 has no onset: its own start


def test_kpis_period_before_the_store_says_no_records_and_clamps_to_its_first_record(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # QA finding 5: on a young store, a period entirely before its first record printed GPU goodput 100.0% and
    # `same` (an empty period read as a perfect one), and a period reaching back before it counted GPU-hours
    # the store never saw. The first record here is the transition at T0+100; the latest cycle T0+3600.
    import json

    from typer.testing import CliRunner

    from fleethealth.cli.main import app
    from test_review import T0, make_store

    db = tmp_path / "s.db"
    make_store(db).close()
    r = CliRunner().invoke(app, ["kpis", "--db", str(db), "--since", "-7d", "--compare", "-14d..-7d"])
    assert r.exit_code == 0, r.output
    goodput = next(ln for ln in r.stdout.splitlines() if ln.startswith("train") and "GPU goodput" in ln)
    assert "100.0%" not in goodput.split("GPU goodput")[1].split()[0] and goodput.endswith("no records"), goodput
    assert " same" not in r.stdout and "no records" in r.stdout.splitlines()[0]
    assert "clamped to the store's first record" in r.stdout
    d = json.loads(CliRunner().invoke(app, ["kpis", "--db", str(db), "--since", "-7d", "--compare", "-14d..-7d",
                                            "--format", "json"]).stdout)
    assert d["after"] == [T0 + 100, T0 + 3600] and d["records_from"] == T0 + 100
    assert d["no_records"] == {"before": True, "after": False} and d["clamped"] == {"before": False, "after": True}
    train = [row for row in d["rows"] if row["pool"] == "train"]
    assert all(row["before"] is None and row["verdict"] == "no records" for row in train)
    # one period alone, reaching back before the store: its GPU-hours are the store's, not a week's
    one = json.loads(CliRunner().invoke(app, ["kpis", "--db", str(db), "--since", "-7d", "--format", "json"]).stdout)
    assert (one["since"], one["clamped"]) == (T0 + 100, True)
    assert one["pools"]["train"]["gpu_hours"] == pytest.approx(24 * 3500 / 3600)
    empty = json.loads(CliRunner().invoke(app, ["kpis", "--db", str(db), "--since", "-14d", "--until", "-7d",
                                                "--format", "json"]).stdout)
    assert empty["no_records"] is True and empty["pools"]["train"]["goodput"] is None


def test_a_reisolation_after_release_counts_from_its_own_start_not_the_old_onset() -> None:
    # QA finding 6 (`backtest -s intermittent-nvlink --compress 90m`): node-14's fault began at 1800 s and was
    # quarantined at once; released, it was quarantined again at 5400 s. The second incident was measured from
    # the fault's onset an hour earlier (3600 s), so the KPI read "time to detect (median) 30min" (of 0 and
    # 3600) while the metric table said detection 0 s. An onset belongs to the first incident after it.
    trs = [t(1800, "n1", "READY", "QUARANTINED", "gate:xid"), t(2400, "n1", "QUARANTINED", "RECOVERING"),
           t(4200, "n1", "RECOVERING", "READY"), t(5400, "n1", "READY", "QUARANTINED", "gate:xid_count")]
    k = pool_kpis(trs, [], ENTS, start=0, end=7200, onsets={"n1": [1800]})["train-a"]
    assert k.incidents == 2 and k.detect_median_s == 0.0 and k.repair_median_s == 2400
    # a fault that began before the first incident still counts from its onset; a second onset, from its own
    late = pool_kpis(trs, [], ENTS, start=0, end=7200, onsets={"n1": [1200, 5000]})["train-a"]
    assert late.detect_median_s == pytest.approx((600 + 400) / 2)
