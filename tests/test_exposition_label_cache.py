"""Parsed label strings live in a LabelCache the caller holds (PagePlans keeps one for a scrape source),
never in module state: a parse with the cache reads what a parse without it reads, and a held cache
spares the next parse of the same exporter its label parsing."""

from __future__ import annotations

import pytest

from fleethealth.bench.parse import dcgm_text
from fleethealth.sources import exposition_labels
from fleethealth.sources.exposition import LabelCache, PagePlans, iter_samples, parse_exposition, parse_many

NOW = 1_700_000_000.0


def _rows(snap: object) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return sorted(iter_samples(snap))  # type: ignore[arg-type]


def test_no_label_memo_lives_in_the_module() -> None:
    dicts = [k for k, v in vars(exposition_labels).items() if isinstance(v, dict) and not k.startswith("__")]
    assert dicts == ["_ESCAPES"]  # (a constant table of escape sequences)


def test_a_held_cache_is_filled_once_and_changes_no_result(monkeypatch: pytest.MonkeyPatch) -> None:
    text = dcgm_text(32, seed=5)
    labels = LabelCache()
    first = parse_exposition(text, default_ts=NOW, source="a", labels=labels)
    assert len(labels.parsed) == 32  # one label string per GPU
    calls: list[str] = []
    real = exposition_labels._split_labels

    def counted(s: str) -> object:
        calls.append(s)
        return real(s)

    monkeypatch.setattr(exposition_labels, "_split_labels", counted)
    again = parse_exposition(text, default_ts=NOW, source="a", labels=labels)
    assert calls == []  # every string known: nothing parsed again
    monkeypatch.undo()
    alone = parse_exposition(text, default_ts=NOW, source="a")  # a fresh cache for the call
    assert _rows(first) == _rows(again) == _rows(alone)


def test_page_plans_keep_the_label_cache_of_a_scrape_source() -> None:
    pages = [(dcgm_text(8, seed=s).encode(), {"instance": f"n{s}:9400"}, f"n{s}") for s in range(4)]
    plans = PagePlans()
    snap = parse_many(pages, default_ts=NOW, plans=plans)
    assert len(plans.labels.merged) == 32 and len(plans.labels.parsed) >= 8
    held = LabelCache()
    assert _rows(snap) == _rows(parse_many(pages, default_ts=NOW)) == _rows(
        parse_many(pages, default_ts=NOW, labels=held))
