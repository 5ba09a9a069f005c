"""Recordings round-trip, the `fleethealth sim` commands, and the generation speed (printed, not
asserted tightly: the machine is shared)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fleethealth.cli.main import app
from fleethealth.signals.snapshot import Snapshot, merge_snapshots
from fleethealth.sim import Simulation, load_scenario
from fleethealth.sim.recording import read_recording, write_recording
from sim_support import small_scenario


def rows(snap: Snapshot) -> list[tuple]:
    return sorted((m, tuple(sorted(ls.items())), round(v, 6), t) for m, ls, v, t in snap.rows())


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_recording_round_trip(tmp_path: Path, suffix: str) -> None:
    faults = [{"kind": "xid79_off_bus", "target": "node-01/gpu3", "onset": 30},
              {"kind": "exporter_outage", "target": "node-04", "onset": 30, "end": 60}]
    path = tmp_path / f"rec{suffix}"
    stats = write_recording(Simulation(small_scenario(faults)), path, steps=6)
    assert stats.steps == 6 and stats.rows > 0
    again = [s for _, s in Simulation(small_scenario(faults)).steps(6)]
    expected = merge_snapshots(again)
    got = read_recording(path)
    assert len(got) == len(expected) == stats.rows
    assert rows(got) == rows(expected)


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl.gz"])
def test_shared_table_reader_reads_recordings(tmp_path: Path, suffix: str) -> None:
    from fleethealth.sources.tables import read_table

    path = tmp_path / f"rec{suffix}"
    write_recording(Simulation(small_scenario()), path, steps=3)
    got = read_table(path)
    expected = merge_snapshots([s for _, s in Simulation(small_scenario()).steps(3)])
    assert not got.issues
    assert rows(got) == rows(expected)


def test_recording_columns(tmp_path: Path) -> None:
    path = tmp_path / "rec.parquet"
    write_recording(Simulation(small_scenario()), path, steps=2)
    t = pq.read_table(path)
    assert t.column_names[:3] == ["ts", "metric", "value"]
    for k in ("gpu", "UUID", "Hostname", "le", "replica", "job", "rank", "peer_group", "instance", "xid"):
        assert k in t.column_names
    metrics = set(t.column("metric").to_pylist())
    assert "vllm:inter_token_latency_seconds_bucket" in metrics and "up" in metrics


def test_every_keeps_every_nth_step(tmp_path: Path) -> None:
    path = tmp_path / "rec.parquet"
    write_recording(Simulation(small_scenario()), path, steps=6, every=3)
    ts = np.unique(pq.read_table(path).column("ts").to_numpy())
    assert len(ts) == 2 and ts[1] - ts[0] == 45


def test_cli_list_truth_run(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["sim", "list"])
    assert r.exit_code == 0 and "node37-thermal-drift" in r.output and "noise-only" in r.output
    r = runner.invoke(app, ["sim", "truth", "--scenario", "replica-slo-burn", "--format", "json"])
    assert r.exit_code == 0
    truth = json.loads(r.output)
    assert {g["kind"] for g in truth} == {"gpu", "node", "replica"}
    scen = tmp_path / "s.yaml"
    scen.write_text(small_scenario([{"kind": "cuda_oom", "target": "replica:llama3-8b-001", "onset": 15,
                                     "params": {"class": "driver", "count": 1}}]).model_dump_json())
    out = tmp_path / "r.parquet"
    ev = tmp_path / "ev.jsonl"
    r = runner.invoke(app, ["sim", "run", "--scenario", str(scen), "--duration", "2m", "--out", str(out),
                            "--events", str(ev)])
    assert r.exit_code == 0, r.output
    assert "steps/s" in r.output and out.exists()
    kinds = [json.loads(line)["kind"] for line in ev.read_text().splitlines()]
    assert "cuda_oom" in kinds and "xid" in kinds
    r = runner.invoke(app, ["sim", "run", "--scenario", "no-such"])
    assert r.exit_code == 2 and "no scenario" in r.output
    r = runner.invoke(app, ["sim", "show", "noise-only"])
    assert r.exit_code == 0 and "name: noise-only" in r.output


def test_generation_speed_512_gpus() -> None:
    sim = Simulation(load_scenario("noise-only"))
    n = 200
    t0 = time.perf_counter()
    samples = sum(len(s) for _, s in sim.steps(n))
    dt = time.perf_counter() - t0
    rate = n / dt
    print(f"\n512 GPUs: {rate:.0f} steps/s, {samples / dt:,.0f} samples/s; a 7-day week at 15 s "
          f"(40,320 steps) would take {40320 / rate:.0f} s")
    assert rate > 20  # a loose floor: a week must stay far below an hour even on a loaded machine
