"""OOM classification at its edges, as the verdict an operator reads (issue 21): the class, the explanation,
the evidence and the suggested action, for the cases where a threshold is met exactly, a number is missing,
or nothing is reserved-but-unallocated."""

from __future__ import annotations

from fleethealth.decide.model import IntentKind, Tier
from fleethealth.decide.oom import (
    OomClass,
    OomEvent,
    classify_oom,
    oom_intents,
)

GiB = 1024**3


def test_enough_free_memory_but_nothing_reserved_unallocated_is_not_fragmentation() -> None:
    # 10 GiB free of 80 and a 2 GiB allocation failed, but the allocator holds nothing cached: there is no
    # fragmented pool a worker rebuild would release, so no rebuild; the fallback says it lacks context
    ev = OomEvent(0, requested_bytes=2 * GiB, free_bytes=10 * GiB, reserved_bytes=0, total_bytes=80 * GiB,
                  entity="r1")
    v = classify_oom(ev)
    assert v.cls is OomClass.BATCH_OVERLOAD
    assert v.confident is False
    assert v.evidence == ("insufficient_context",)
    kinds = [i.kind for i in oom_intents(ev, 5.0, current_limit=8)]
    assert IntentKind.REBUILD_WORKER not in kinds and kinds == [IntentKind.LIMIT_CONCURRENCY]
    # the same with reserved equal to allocated (torch's total reservation, nothing cached)
    ev2 = OomEvent(0, requested_bytes=2 * GiB, free_bytes=10 * GiB, reserved_bytes=60 * GiB,
                   allocated_bytes=60 * GiB, total_bytes=80 * GiB)
    assert classify_oom(ev2).cls is OomClass.BATCH_OVERLOAD
    # one byte cached is enough to call it fragmentation, and the explanation says how much was spare
    ev3 = OomEvent(0, requested_bytes=2 * GiB, free_bytes=10 * GiB, reserved_bytes=60 * GiB + 1,
                   allocated_bytes=60 * GiB, total_bytes=80 * GiB, entity="r1")
    v3 = classify_oom(ev3)
    assert v3.cls is OomClass.FRAGMENTATION
    assert v3.explanation == ("10.00 GiB was free or reserved-but-unallocated (of 80.00 GiB) yet an allocation of "
                              "2.00 GiB failed: memory is fragmented; drain and rebuild the worker")
    assert v3.evidence == (f"spare_bytes:{10 * GiB + 1}", f"requested_bytes:{2 * GiB}", "cached_bytes:1")
    it = oom_intents(ev3, 7.0)
    assert [(i.kind, i.tier, i.entity, i.ts) for i in it] == [
        (IntentKind.DRAIN, Tier.POD, "r1", 7.0), (IntentKind.REBUILD_WORKER, Tier.POD, "r1", 7.0),
        (IntentKind.CAPTURE_EVIDENCE, Tier.POD, "r1", 7.0)]
    assert all(i.params == {"oom_class": "fragmentation"} for i in it)


def test_device_fault_names_every_fatal_xid_and_context_error() -> None:
    ev = OomEvent(0, recent_xids=(13, 79, 63), entity="node-3",
                  cuda_errors=("CUDA error: an ILLEGAL MEMORY ACCESS was encountered",  # any case
                               "CUDA error: invalid argument",  # another CUDA error: not trusted either
                               "CUDA error: device-side assert triggered"))  # an application bug: not the device
    v = classify_oom(ev)
    assert v.cls is OomClass.DEVICE_FAULT and v.confident
    # 13 is an application Xid: not named; 63 (reset) and 79 (gate) are, in order
    assert v.explanation == ("OOM together with fatal Xid 63,79 and CUDA context error (cuda_error; illegal "
                             "memory access): the device cannot be trusted; quarantine and run a health check")
    assert v.evidence == ("xid:63", "xid:79", "cuda_error:cuda_error", "cuda_error:illegal memory access")
    it = oom_intents(ev, 12.5, policy_version="p@1")
    assert [(i.ts, i.kind, i.entity, i.tier, i.policy_version, i.reason) for i in it] == [
        (12.5, k, "node-3", Tier.NODE, "p@1", v.explanation)
        for k in (IntentKind.DRAIN, IntentKind.QUARANTINE, IntentKind.RUN_ACTIVE_TEST, IntentKind.CAPTURE_EVIDENCE)]
    assert [i.params for i in it] == [
        {"oom_class": "device_fault"}, {"oom_class": "device_fault", "evidence": list(v.evidence)},
        {"oom_class": "device_fault"}, {"oom_class": "device_fault"}]
    assert not any(i.soft for i in it)


def test_device_fault_from_xids_alone_and_from_a_context_error_alone() -> None:
    v = classify_oom(OomEvent(0, recent_xids=(48,)))
    assert v.explanation == ("OOM together with fatal Xid 48: the device cannot be trusted; quarantine and run a "
                             "health check")
    assert v.evidence == ("xid:48",)
    v2 = classify_oom(OomEvent(0, cuda_errors=("an illegal memory access was encountered",)))
    assert v2.explanation == ("OOM together with CUDA context error (illegal memory access): the device cannot be "
                              "trusted; quarantine and run a health check")
    assert v2.evidence == ("cuda_error:illegal memory access",)


def test_the_callers_thresholds_decide_which_xids_are_fatal() -> None:
    from fleethealth.decide.oom import OomThresholds
    lenient = OomThresholds(gate_xids=(), gate_buckets=(), reset_xids=())
    ev = OomEvent(0, recent_xids=(79,), batch_tokens=100, max_batch_tokens=100, entity="r")
    assert classify_oom(ev).cls is OomClass.DEVICE_FAULT
    assert classify_oom(ev, lenient).cls is OomClass.BATCH_OVERLOAD
    assert [i.kind for i in oom_intents(ev, 0.0, lenient, current_limit=8)] == [IntentKind.LIMIT_CONCURRENCY]


def test_oversized_names_the_tightest_capacity_and_what_would_fit() -> None:
    # a capacity reported as 0 is unknown, not the tightest
    ev = OomEvent(0, prompt_tokens=3000, max_tokens=2000, model_max_len=4096, max_batch_tokens=8192,
                  kv_capacity_tokens=0, entity="r2")
    v = classify_oom(ev)
    assert v.cls is OomClass.OVERSIZED_REQUEST
    assert v.explanation == ("request needs 5000 tokens (prompt 3000 + output 2000) but model_max_len is 4096: "
                             "reject it or lower max_tokens to at most 1096")
    assert v.evidence == ("request_tokens:5000", "model_max_len:4096")
    assert v.max_tokens_allowed == 1096
    (it,) = oom_intents(ev, 3.0, policy_version="v@x")
    assert (it.ts, it.kind, it.entity, it.reason, it.tier, it.policy_version) == (
        3.0, IntentKind.REJECT_REQUEST, "r2", v.explanation, Tier.INSTANCE, "v@x")
    assert it.params == {"oom_class": "oversized_request", "prompt_tokens": 3000, "max_tokens": 2000,
                         "max_tokens_allowed": 1096}
    # the batch budget and the KV capacity are named when they are the tightest
    v2 = classify_oom(OomEvent(0, prompt_tokens=3000, max_tokens=2000, max_batch_tokens=4000, model_max_len=0))
    assert v2.evidence == ("request_tokens:5000", "max_batch_tokens:4000")
    v3 = classify_oom(OomEvent(0, prompt_tokens=10, max_tokens=5, kv_capacity_tokens=12, model_max_len=4096))
    assert v3.evidence == ("request_tokens:15", "kv_capacity_tokens:12")
    assert v3.max_tokens_allowed == 2
    # a capacity of 1 token is still a capacity
    assert classify_oom(OomEvent(0, prompt_tokens=1, max_tokens=1, kv_capacity_tokens=1)).cls is \
        OomClass.OVERSIZED_REQUEST


def test_oversized_at_the_edges() -> None:
    # exactly the capacity fits: not oversized
    assert classify_oom(OomEvent(0, prompt_tokens=4000, max_tokens=96, model_max_len=4096)).cls is \
        OomClass.BATCH_OVERLOAD
    # one token of room: max_tokens 1
    v = classify_oom(OomEvent(0, prompt_tokens=4095, max_tokens=2, model_max_len=4096))
    assert v.max_tokens_allowed == 1
    assert v.explanation.endswith("reject it or lower max_tokens to at most 1")
    # no room: the prompt alone is too long, no max_tokens suggested
    v0 = classify_oom(OomEvent(0, prompt_tokens=4096, max_tokens=1, model_max_len=4096))
    assert v0.max_tokens_allowed is None
    assert v0.explanation == ("request needs 4097 tokens (prompt 4096 + output 1) but model_max_len is 4096: "
                              "reject it or lower max_tokens (the prompt alone is too long)")


def test_one_request_dominating_a_full_batch_is_oversized() -> None:
    # half the failed batch, exactly: oversized (lowering concurrency would not help); half of max_tokens offered
    ev = OomEvent(0, prompt_tokens=4089, max_tokens=7, batch_tokens=8192, max_batch_tokens=8192, entity="r")
    v = classify_oom(ev)
    assert v.cls is OomClass.OVERSIZED_REQUEST
    assert v.explanation == "one request holds 4096 of the batch's 8192 tokens: reject it or lower max_tokens"
    assert v.evidence == ("request_tokens:4096", "batch_tokens:8192")
    assert v.max_tokens_allowed == 3
    # max_tokens 1: still at least 1
    assert classify_oom(OomEvent(0, prompt_tokens=4095, max_tokens=1, batch_tokens=8192,
                                 max_batch_tokens=8192)).max_tokens_allowed == 1
    # output budget unknown (it struck mid-decode): no max_tokens to suggest
    mid = classify_oom(OomEvent(0, prompt_tokens=4000, output_tokens=96, batch_tokens=8192, max_batch_tokens=8192))
    assert mid.cls is OomClass.OVERSIZED_REQUEST and mid.max_tokens_allowed is None
    # one token under half: the batch as a whole was too much
    less = classify_oom(OomEvent(0, prompt_tokens=4088, max_tokens=7, batch_tokens=8192, max_batch_tokens=8192))
    assert less.cls is OomClass.BATCH_OVERLOAD and less.confident


def test_batch_full_exactly_at_the_thresholds() -> None:
    ev = OomEvent(0, batch_tokens=8500, max_batch_tokens=10000, kv_cache_usage=0.9, running_requests=40,
                  entity="r5")
    v = classify_oom(ev)
    assert v.cls is OomClass.BATCH_OVERLOAD and v.confident
    assert v.explanation == ("the batch was full (batch_tokens 8500/10000, kv_cache_usage 0.90): lower "
                             "concurrency or the batch token limit")
    assert v.evidence == ("batch_tokens 8500/10000", "kv_cache_usage 0.90")
    (it,) = oom_intents(ev, 9.0, current_limit=64, policy_version="pv")
    assert (it.ts, it.kind, it.entity, it.reason, it.tier, it.policy_version) == (
        9.0, IntentKind.LIMIT_CONCURRENCY, "r5", v.explanation, Tier.INSTANCE, "pv")
    assert it.params == {"oom_class": "batch_overload", "max_concurrency": 30, "confident": True}
    # just under both: not full, the fallback (not confident)
    under = classify_oom(OomEvent(0, batch_tokens=8499, max_batch_tokens=10000, kv_cache_usage=0.899))
    assert under.confident is False
    assert under.explanation == ("no sign of an oversized request, fragmentation or a device fault; treated as "
                                 "batch overload (the softest action: lower concurrency) for want of context")
    # the batch alone
    assert classify_oom(OomEvent(0, batch_tokens=8500, max_batch_tokens=10000)).evidence == ("batch_tokens 8500/10000",)
    assert classify_oom(OomEvent(0, batch_tokens=1, max_batch_tokens=2)).confident is False


def test_concurrency_limit_without_a_current_limit_and_with_one_running() -> None:
    # nothing known about the limit: what was running is the base; one running request stays at the floor
    (it,) = oom_intents(OomEvent(0, running_requests=8, kv_cache_usage=0.95), 0.0)
    assert it.params["max_concurrency"] == 6 and it.params["confident"] is True
    (it1,) = oom_intents(OomEvent(0, kv_cache_usage=0.95), 0.0)
    assert it1.params["max_concurrency"] == 1
    (it2,) = oom_intents(OomEvent(0, running_requests=1, kv_cache_usage=0.95), 0.0, current_limit=10)
    assert it2.params["max_concurrency"] == 1  # from the one running (0.75 -> floor 1), not from the limit 10
    (it3,) = oom_intents(OomEvent(0, running_requests=0, kv_cache_usage=0.95), 0.0, current_limit=10)
    assert it3.params["max_concurrency"] == 7  # none running (a counter read at 0): from the limit
    (it4,) = oom_intents(OomEvent(0, kv_cache_usage=0.95), 0.0, current_limit=1)
    assert it4.policy_version == "" and it4.params["max_concurrency"] == 1
    from fleethealth.decide.oom import OomThresholds
    (it5,) = oom_intents(OomEvent(0, running_requests=10, kv_cache_usage=0.95), 0.0,
                         OomThresholds(concurrency_factor=0.5), current_limit=20)
    assert it5.params["max_concurrency"] == 5


def test_fragmentation_edges() -> None:
    # free unknown, cached known: the cached part alone covers the allocation
    v = classify_oom(OomEvent(0, requested_bytes=2 * GiB, reserved_bytes=6 * GiB, total_bytes=80 * GiB))
    assert v.cls is OomClass.FRAGMENTATION
    assert v.evidence == (f"spare_bytes:{6 * GiB}", f"requested_bytes:{2 * GiB}", f"cached_bytes:{6 * GiB}")
    # spare exactly the allocation: enough; one byte less: not
    assert classify_oom(OomEvent(0, requested_bytes=1000, free_bytes=0, reserved_bytes=1000,
                                 total_bytes=10000)).cls is OomClass.FRAGMENTATION
    assert classify_oom(OomEvent(0, requested_bytes=1000, free_bytes=0, reserved_bytes=999,
                                 total_bytes=10000)).cls is OomClass.BATCH_OVERLOAD
    # spare must also be 5% of the card: exactly 5% is enough, 4% is not
    assert classify_oom(OomEvent(0, requested_bytes=10, free_bytes=0, reserved_bytes=50,
                                 total_bytes=1000)).cls is OomClass.FRAGMENTATION
    assert classify_oom(OomEvent(0, requested_bytes=10, free_bytes=0, reserved_bytes=40,
                                 total_bytes=1000)).cls is OomClass.BATCH_OVERLOAD
    # the total unknown: no fragmentation call
    assert classify_oom(OomEvent(0, requested_bytes=10, free_bytes=0, reserved_bytes=50)).cls is \
        OomClass.BATCH_OVERLOAD


def test_fragmentation_with_the_failed_allocation_unknown() -> None:
    # without the allocation's size, spare memory must be 10% of the card
    v = classify_oom(OomEvent(0, free_bytes=2 * GiB, reserved_bytes=6 * GiB, total_bytes=80 * GiB))
    assert v.cls is OomClass.FRAGMENTATION
    assert v.explanation == ("8.00 GiB was free or reserved-but-unallocated (of 80.00 GiB) yet an allocation "
                             "failed: memory is fragmented; drain and rebuild the worker")
    assert v.evidence == (f"spare_bytes:{8 * GiB}", "requested_bytes:None", f"cached_bytes:{6 * GiB}")
    # 6.25% spare: above the 5% floor but short of 10%: not called fragmentation
    assert classify_oom(OomEvent(0, free_bytes=0, reserved_bytes=5 * GiB, total_bytes=80 * GiB)).cls is \
        OomClass.BATCH_OVERLOAD
    # exactly 10%
    assert classify_oom(OomEvent(0, free_bytes=0, reserved_bytes=100, total_bytes=1000)).cls is \
        OomClass.FRAGMENTATION


def test_context_error_kinds_and_xids_in_text() -> None:
    from fleethealth.decide.oom import context_error_kinds, xids_in
    assert context_error_kinds("an illegal memory access was encountered") == ["illegal memory access"]
    assert context_error_kinds("CUDA ERROR: MISALIGNED ADDRESS") == ["misaligned address"]
    assert context_error_kinds("CUDA error: invalid argument") == ["cuda_error"]
    assert context_error_kinds("CUDA out of memory") == []
    assert context_error_kinds("CUDA error: device-side assert triggered") == []
    assert context_error_kinds("connection reset") == []
    assert xids_in("GPU 3: Xid 79 seen; xid=48") == [79, 48]
    assert xids_in("NVRM: Xid (PCI:0000:3b:00): 31, pid=1, Ch 0000001 and Xid 79 later") == [31]


def test_fragmentation_intents_carry_the_explanation_and_policy_version() -> None:
    ev = OomEvent(0, requested_bytes=2 * GiB, free_bytes=1 * GiB, reserved_bytes=4 * GiB, total_bytes=80 * GiB,
                  entity="r9")
    v = classify_oom(ev)
    it = oom_intents(ev, 1.0, policy_version="pol@abc")
    assert [(i.kind, i.reason, i.policy_version, i.tier) for i in it] == [
        (k, v.explanation, "pol@abc", Tier.POD)
        for k in (IntentKind.DRAIN, IntentKind.REBUILD_WORKER, IntentKind.CAPTURE_EVIDENCE)]


def test_an_empty_prompt_with_an_oversized_output_budget() -> None:
    v = classify_oom(OomEvent(0, prompt_tokens=0, max_tokens=5000, model_max_len=4096))
    assert v.cls is OomClass.OVERSIZED_REQUEST
    assert v.explanation == ("request needs 5000 tokens (prompt 0 + output 5000) but model_max_len is 4096: "
                             "reject it or lower max_tokens to at most 4096")
    assert v.max_tokens_allowed == 4096


def test_nothing_known_about_concurrency_means_a_limit_of_one() -> None:
    from fleethealth.decide.oom import OomThresholds
    (it,) = oom_intents(OomEvent(0, kv_cache_usage=0.95), 0.0, OomThresholds(concurrency_factor=1.0))
    assert it.params["max_concurrency"] == 1
