"""act.lease without an API server: when a Lease held by another replica expires on this replica's clock
(``lease_expiry``: the holder's renewTime plus the duration, never before the renew deadline counted from
when the record was seen to change, so a skewed clock never lets a replica take a Lease while its holder
may still act), when a waiting elector steps next (just after that expiry, not at its next poll), and the
renewing thread both electors use. The Lease I/O itself runs on the real kube-apiserver in
tests/test_act_k8s.py, tests/test_act_fencing_k8s.py and tests/test_shards.py.
"""

from __future__ import annotations

import threading
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.act.lease import (
    EXPIRY_MARGIN_S,
    LeaseElector,
    RenewingThread,
    lease_expiry,
    micro_time,
    parse_micro_time,
)

WALL0 = 1_764_000_000.0  # the wall clock when the monotonic one reads 0 (no skew)


def spec(renewed_wall: float | None, duration: int = 6, holder: str = "rep-b") -> dict[str, Any]:
    out: dict[str, Any] = {"holderIdentity": holder, "leaseDurationSeconds": duration, "leaseTransitions": 3}
    if renewed_wall is not None:
        out["renewTime"] = micro_time(renewed_wall)
    return out


def test_micro_time_round_trips_and_bad_text_reads_none() -> None:
    assert parse_micro_time(micro_time(WALL0 + 0.123456)) == WALL0 + 0.123456
    assert parse_micro_time("2026-12-02T03:44:53Z") is not None
    for bad in (None, "", "yesterday", "2026-12-02T03:44:53.1", 17):
        assert parse_micro_time(bad) is None


def test_expiry_is_the_renewal_plus_the_duration_not_when_it_was_seen() -> None:
    # renewed at 10.0, seen here 0.4 s later (one LIST period): expires at 16.0, not at 16.4
    assert abs(lease_expiry(spec(WALL0 + 10.0), 10.4, 10.5, WALL0 + 10.5, 15.0) - 16.0) < 1e-6
    # no renewTime (or an unreadable one): client-go's rule, from when the record changed here
    assert lease_expiry(spec(None), 10.4, 10.5, WALL0 + 10.5, 15.0) == 10.4 + 6.0
    assert lease_expiry({"renewTime": "garbage"}, 10.4, 10.5, WALL0 + 10.5, 6.0) == 10.4 + 6.0
    # the Lease's own duration wins over this replica's default
    assert abs(lease_expiry(spec(WALL0 + 10.0, duration=15), 10.4, 10.5, WALL0 + 10.5, 6.0) - 25.0) < 1e-6


def test_a_skewed_clock_never_takes_before_the_renew_deadline_nor_after_client_gos_expiry() -> None:
    # this replica's wall clock 30 s ahead: the record looks 30 s old; taken no earlier than seen + 2/3 of 6
    assert lease_expiry(spec(WALL0 + 10.0), 10.4, 10.5, WALL0 + 40.5, 6.0) == 10.4 + 4.0
    assert lease_expiry(spec(WALL0 + 10.0), 10.4, 10.5, WALL0 + 40.5, 6.0, renew_fraction=0.75) == 10.4 + 4.5
    # 30 s behind: the record looks renewed in the future; never later than client-go's seen + 6
    assert lease_expiry(spec(WALL0 + 10.0), 10.4, 10.5, WALL0 - 19.5, 6.0) == 10.4 + 6.0
    # seen late (a step held up by 1.5 s of load): still the renewal plus the duration, not seen + 6
    assert abs(lease_expiry(spec(WALL0 + 10.0), 11.5, 11.6, WALL0 + 11.6, 6.0) - 16.0) < 1e-6


@given(st.floats(-1e4, 1e4), st.floats(0, 10.0), st.floats(-60, 60), st.integers(1, 60), st.floats(0.3, 0.95))
@settings(max_examples=200, deadline=None)
def test_expiry_never_before_the_holders_renew_deadline(renewed: float, lag: float, skew: float, duration: int,
                                                         fraction: float) -> None:
    """Whatever the clocks say, a replica that saw the renewal ``lag`` after it happened never takes the
    Lease before the holder's renew deadline (``fraction`` of the duration after its renewal, by when it
    stopped acting), nor later than client-go would (the duration after it saw the renewal)."""
    seen = renewed + lag
    now = seen + 0.01
    e = lease_expiry(spec(WALL0 + renewed + skew, duration), seen, now, WALL0 + now, 6.0, fraction)
    assert renewed + fraction * duration - 1e-6 <= e <= seen + duration + 1e-6
    if skew == 0 and lag <= (1 - fraction) * duration:
        assert abs(e - (renewed + duration)) < 1e-5  # no skew: exactly the renewal plus the duration


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> float:
        return WALL0 + self.t


def test_a_waiting_elector_steps_next_just_after_the_expiry() -> None:
    """A Lease another replica holds and renews is observed; the waiting elector's next step is due at the
    renewal plus the duration (plus the margin), sooner than its retry period once that comes near.
    (``kube`` is never called: the Lease is handed in as listed, and a live one is not written.)"""
    clock = _Clock()
    e = LeaseElector(None, "rep-a", lease_duration_s=6.0, retry_period_s=0.5,  # type: ignore[arg-type]
                     clock=clock.mono, wall=clock.wall)
    lease = {"metadata": {"resourceVersion": "7"}, "spec": spec(WALL0 + 0.0)}
    clock.t = 0.3
    assert not e.step(lease)
    assert e.next_step_in() == 0.5  # the expiry (6.0) is far: the retry period
    clock.t = 5.8
    assert not e.step(lease)  # unchanged record: the holder stopped renewing at 0.0
    assert abs(e.next_step_in() - (0.2 + EXPIRY_MARGIN_S)) < 1e-6  # at 6.0 + margin, not at 6.3
    clock.t = 5.9
    lease["spec"] = spec(WALL0 + 5.85)  # it renewed after all: the next expiry is 11.85
    assert not e.step(lease)
    assert e.next_step_in() == 0.5


class _Ticker(RenewingThread):
    thread_name = "test-ticker"

    def __init__(self) -> None:
        super().__init__()
        self.retry_period_s = 0.01
        self.ticks = 0
        self.failed = 0
        self.done = threading.Event()

    def tick(self) -> float:
        self.ticks += 1
        if self.ticks == 2:
            raise RuntimeError("a bug in one step")
        if self.ticks >= 4:
            self.done.set()
        return 0.0

    def tick_failed(self) -> None:
        self.failed += 1


def test_the_renewing_thread_survives_a_failing_step_and_stops() -> None:
    t = _Ticker().start()
    assert t.done.wait(10), "the thread stopped after a failing step"
    t.stop()
    assert t.failed == 1 and not t.running()
    n = t.ticks
    assert t.start() is t and t.done.wait(10)
    t.stop()
    assert t.ticks > n  # started again after a stop
