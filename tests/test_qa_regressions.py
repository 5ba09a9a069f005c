"""Regressions QA found on inputs nobody on the team wrote, each pinned by the smallest input that shows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleethealth.review.kpis import EntityInfo, pool_kpis, state_seconds

DAY = 86400.0


def test_a_past_period_is_not_in_the_state_an_entity_took_later() -> None:
    # A node quarantined at day 14 (its store holds nothing older): `kpis --compare -14d..-7d` read the week
    # before as 168 h in QUARANTINED (its current state), 1344 GPU-h lost to isolated nodes, verdict 'better'.
    trs = [{"ts": 14 * DAY, "entity": "n", "kind": "node", "from": "READY", "to": "QUARANTINED",
            "reason": "gate:xid", "detail": ""}]
    ents = {"n": EntityInfo("node", "train-a", 8, "QUARANTINED")}
    assert state_seconds(trs, ents, 0.0, 7 * DAY) == {"n": {"READY": 7 * DAY}}
    k = pool_kpis(trs, [], ents, start=0.0, end=7 * DAY)["train-a"]
    assert k.lost_isolated_gpu_h == 0.0
    # inside and after the transition the current state still counts
    assert state_seconds(trs, ents, 15 * DAY, 16 * DAY) == {"n": {"QUARANTINED": DAY}}
    assert pool_kpis(trs, [], ents, start=13 * DAY, end=15 * DAY)["train-a"].lost_isolated_gpu_h == pytest.approx(8 * 24)


def test_explain_prints_a_peer_signals_deviation_as_a_share_not_a_rate(tmp_path: Path) -> None:
    # ByteDance's straggler trace AR, reduced: one rank of a stage 136 % slower than its peers. explain printed
    # `rank_compute_time [peer] raw=45.55 rate=1.36647/s`: the relative deviation from the peers' median, as a rate.
    from typer.testing import CliRunner

    from fleethealth.cli.main import app

    rows = ["ts,metric,value,job,rank,node,gpu,peer_group"]
    for step in range(3):
        for rank, secs in ((0, 45.5), (4, 19.2), (8, 19.3), (12, 19.25)):
            rows.append(f"{1796170000 + 30 * step},fleethealth_rank_compute_seconds,{secs},job-ar,{rank},n-{rank // 8},"
                        f"{rank % 8},stage0")
    table = tmp_path / "ar.csv"
    table.write_text("\n".join(rows) + "\n")
    res = CliRunner().invoke(app, ["explain", "job-ar/rank0", str(table)])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if "rank_compute_time [peer]" in x)
    assert "vs_peers=+136.1%" in line and "/s" not in line, line


def test_tune_names_a_mistyped_path_before_running_and_a_bad_value_in_words() -> None:
    # `tune -p bogus.key=1` ran the whole sweep (every point "invalid"), then suggested the current policy, exit 0; a bad
    # value read "{'lifecycle.quarantine_dwell_s': 'abc'}: not a valid policy: lifecycle  Value error, ... [type=value_error,
    # input_value={'flag_below': 0.9, ...}, input_type=dict]".
    from typer.testing import CliRunner

    from fleethealth.cli.main import app
    from fleethealth.policy import default_policy
    from fleethealth.review.tune import TuneError, with_overrides

    r = CliRunner().invoke(app, ["tune", "-s", "xid79-off-bus", "-p", "bogus.key=1", "-j", "1"])
    assert r.exit_code == 2 and "bogus.key: the policy has no 'bogus'" in r.output, r.output
    with pytest.raises(TuneError) as e:
        with_overrides(default_policy(), {"lifecycle.quarantine_dwell_s": "abc"})
    msg = str(e.value)
    assert msg.startswith("lifecycle.quarantine_dwell_s=abc: not a valid policy: lifecycle: quarantine_dwell_s: expected a"), msg
    assert "{" not in msg and "type=" not in msg and "input_value" not in msg, msg
