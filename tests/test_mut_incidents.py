"""Pages as incidents (decide/incidents.py), pinned down where mutation testing found nothing checking it
(issue 21; docs/mutation.md): one page when a condition opens, an update only when what it says changes
and not more often than ``update_s``, one resolve after ``clear_s`` of silence with the firing page's
identity, none while telemetry is frozen, and no second page after a restart that kept only the marks."""

from __future__ import annotations

from typing import Any

from fleethealth.decide import incidents as inc


def fire(incs: dict[str, Any], pages: dict[str, float], now: float, sig: Any = 1,
         params: dict[str, Any] | None = None, update_s: float = 300.0) -> inc.Page | None:
    return inc.assert_incident(incs, pages, "budget:node:a100", "pool:a100", "budget_exhausted",
                               params if params is not None else {"pool": "a100", "waiting": 3}, sig, now,
                               update_s)


def test_the_first_assertion_pages_once_as_firing_with_when_it_opened() -> None:
    incs: dict[str, Any] = {}
    pages: dict[str, float] = {}
    assert fire(incs, pages, 100.0) == ("pool:a100", "budget_exhausted", {
        "pool": "a100", "waiting": 3, "state": "firing", "incident": "budget:node:a100", "opened": 100.0})
    assert pages == {"incident:budget:node:a100": 100.0}
    assert incs["budget:node:a100"] == {"entity": "pool:a100", "reason": "budget_exhausted",
                                        "params": {"pool": "a100", "waiting": 3}, "sig": 1, "opened": 100.0,
                                        "seen": 100.0, "sent": 100.0, "updates": 0}
    # the same condition again: no page, only seen moves
    assert fire(incs, pages, 160.0) is None
    assert incs["budget:node:a100"]["seen"] == 160.0 and incs["budget:node:a100"]["sent"] == 100.0


def test_an_update_pages_when_the_signature_changes_at_most_once_per_update_s() -> None:
    incs: dict[str, Any] = {}
    pages: dict[str, float] = {}
    fire(incs, pages, 100.0, sig=1)
    assert fire(incs, pages, 399.0, sig=2) is None  # 299 s after the firing page: too soon
    assert incs["budget:node:a100"]["sig"] == 1 and incs["budget:node:a100"]["updates"] == 0
    got = fire(incs, pages, 400.0, sig=2, params={"pool": "b", "waiting": 5})  # exactly update_s later
    assert got == ("pool:a100", "budget_exhausted", {
        "pool": "a100", "waiting": 5, "state": "update", "incident": "budget:node:a100", "opened": 100.0,
        "updates": 1})  # the pool that names the alert is the firing page's; what changed is new
    rec = incs["budget:node:a100"]
    assert rec["sig"] == 2 and rec["sent"] == 400.0 and rec["updates"] == 1
    assert fire(incs, pages, 800.0, sig=2) is None  # unchanged: no update however long
    assert fire(incs, pages, 800.0, sig=3)[2]["updates"] == 2  # type: ignore[index]
    assert pages["incident:budget:node:a100"] == 100.0


def test_a_restart_that_kept_only_the_mark_adopts_the_incident_without_a_second_page() -> None:
    incs: dict[str, Any] = {}
    pages = {"incident:budget:node:a100": 50.0}
    assert fire(incs, pages, 500.0) is None
    rec = incs["budget:node:a100"]
    assert rec["opened"] == 50.0 and rec["sent"] == 50.0 and rec["seen"] == 500.0
    assert pages == {"incident:budget:node:a100": 50.0}
    # resolved later, the resolve counts from the original opening
    [(_, _, params)] = inc.close_stale(incs, pages, 2000.0, 900.0, frozen=False)
    assert params["opened"] == 50.0 and params["open_s"] == 1950.0


def test_the_mark_is_restored_on_each_assertion() -> None:
    incs: dict[str, Any] = {}
    pages: dict[str, float] = {}
    fire(incs, pages, 100.0)
    pages.clear()
    fire(incs, pages, 200.0)
    assert pages == {"incident:budget:node:a100": 100.0}


def test_an_incident_resolves_after_clear_s_of_silence_with_its_identity() -> None:
    incs: dict[str, Any] = {}
    pages: dict[str, float] = {}
    fire(incs, pages, 100.0, params={"pool": "a100", "kind": "node", "waiting": 3, "severity": "page"})
    fire(incs, pages, 700.0, sig=2, params={"pool": "a100", "waiting": 4})
    assert inc.close_stale(incs, pages, 1599.5, 900.0, frozen=False) == []  # 899.5 s of silence
    assert inc.close_stale(incs, pages, 3000.0, 900.0, frozen=True) == []  # frozen: nothing known
    got = inc.close_stale(incs, pages, 1600.0, 900.0, frozen=False)
    assert got == [("pool:a100", "budget_exhausted", {
        "pool": "a100", "kind": "node", "severity": "page", "state": "resolved", "incident": "budget:node:a100",
        "opened": 100.0, "open_s": 1500.0, "updates": 1})]
    assert incs == {} and pages == {}
    assert inc.close_stale(incs, pages, 5000.0, 900.0, frozen=False) == []


def test_open_s_is_rounded_to_milliseconds() -> None:
    incs: dict[str, Any] = {}
    pages: dict[str, float] = {}
    fire(incs, pages, 0.0)
    [(_, _, params)] = inc.close_stale(incs, pages, 1000.123456, 900.0, frozen=False)
    assert params["open_s"] == 1000.123


def test_incidents_resolve_in_key_order_and_only_the_stale_ones() -> None:
    incs: dict[str, Any] = {}
    pages: dict[str, float] = {}
    for key, t in (("b", 0.0), ("a", 0.0), ("c", 500.0)):
        inc.assert_incident(incs, pages, key, key, "r", {}, 1, t, 300.0)
    got = inc.close_stale(incs, pages, 900.0, 900.0, frozen=False)
    assert [p[2]["incident"] for p in got] == ["a", "b"]
    assert list(incs) == ["c"] and pages == {"incident:c": 500.0}
    assert list(inc.open_keys({"z": {}, "a": {}})) == ["a", "z"]


def test_an_orphaned_mark_is_dropped_after_clear_s() -> None:
    incs: dict[str, Any] = {}
    pages = {"incident:old": 100.0, "incident:new": 900.0, "node-1": 50.0}
    assert inc.close_stale(incs, pages, 999.0, 900.0, frozen=False) == []
    assert "incident:old" in pages  # 899 s old: kept
    inc.close_stale(incs, pages, 1000.0, 900.0, frozen=False)
    assert pages == {"incident:new": 900.0, "node-1": 50.0}  # other pages are not incidents' marks
    inc.close_stale(incs, pages, 1e6, 900.0, frozen=True)
    assert "incident:new" in pages  # frozen: nothing dropped


def test_refresh_keeps_an_open_incident_open() -> None:
    incs: dict[str, Any] = {}
    pages: dict[str, float] = {}
    fire(incs, pages, 0.0)
    inc.refresh(incs, "budget:node:a100", 800.0)
    inc.refresh(incs, "unknown", 800.0)  # nothing to refresh: no record made
    assert list(incs) == ["budget:node:a100"]
    assert inc.close_stale(incs, pages, 1600.0, 900.0, frozen=False) == []
    assert len(inc.close_stale(incs, pages, 1700.0, 900.0, frozen=False)) == 1


def test_only_firing_pages_are_new_pages() -> None:
    assert inc.is_new_page({}) and inc.is_new_page({"state": "firing"}) and inc.is_new_page({"state": "FIRING"})
    assert not inc.is_new_page({"state": "update"}) and not inc.is_new_page({"state": "Resolved"})


def test_a_fresh_incident_sorted_first_does_not_keep_the_stale_ones_open() -> None:
    incs: dict[str, Any] = {}
    pages: dict[str, float] = {}
    inc.assert_incident(incs, pages, "a", "a", "r", {}, 1, 800.0, 300.0)  # still asserted recently
    inc.assert_incident(incs, pages, "b", "b", "r", {}, 1, 0.0, 300.0)
    got = inc.close_stale(incs, pages, 900.0, 900.0, frozen=False)
    assert [p[2]["incident"] for p in got] == ["b"] and list(incs) == ["a"]


def test_an_incident_whose_mark_was_lost_still_resolves() -> None:
    incs: dict[str, Any] = {}
    pages: dict[str, float] = {}
    fire(incs, pages, 0.0)
    pages.clear()  # a store that kept the incidents but not the pages table
    [(_, _, params)] = inc.close_stale(incs, pages, 1000.0, 900.0, frozen=False)
    assert params["state"] == "resolved" and incs == {} and pages == {}
