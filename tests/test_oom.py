"""CUDA OOM classification: table tests for each class, properties for the safety rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.decide.model import IntentKind, Tier
from fleethealth.decide.oom import (
    OomClass,
    OomEvent,
    classify_oom,
    fatal_xids,
    is_oom_text,
    new_concurrency_limit,
    oom_intents,
    parse_torch_oom,
    xids_in,
)

GiB = 1024**3

TORCH_MSG = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 1.50 GiB is free. Including non-PyTorch memory, this process has 77.6 GiB memory in use. "
    "Of the allocated memory 70.00 GiB is allocated by PyTorch, and 5.00 GiB is reserved by PyTorch but "
    "unallocated."
)

CASES = [
    # (name, event, expected class)
    ("fatal xid 79", OomEvent(0, prompt_tokens=10, max_tokens=10, recent_xids=(79,)), OomClass.DEVICE_FAULT),
    ("row remap pending xid 63", OomEvent(0, recent_xids=(63,)), OomClass.DEVICE_FAULT),
    ("illegal memory access", OomEvent(0, cuda_errors=("CUDA error: an illegal memory access was encountered",)),
     OomClass.DEVICE_FAULT),
    ("xid beats oversized", OomEvent(0, prompt_tokens=9000, max_tokens=100, model_max_len=4096, recent_xids=(48,)),
     OomClass.DEVICE_FAULT),
    ("app xid 13 alone is not a device fault",
     OomEvent(0, recent_xids=(13,), batch_tokens=8000, max_batch_tokens=8192), OomClass.BATCH_OVERLOAD),
    ("prompt+max_tokens over model length", OomEvent(0, prompt_tokens=3000, max_tokens=2000, model_max_len=4096),
     OomClass.OVERSIZED_REQUEST),
    ("over kv capacity", OomEvent(0, prompt_tokens=1000, max_tokens=60000, kv_capacity_tokens=50000,
                                  model_max_len=131072), OomClass.OVERSIZED_REQUEST),
    ("one request dominates a full batch",
     OomEvent(0, prompt_tokens=6000, max_tokens=1000, batch_tokens=8000, max_batch_tokens=8192, model_max_len=32768),
     OomClass.OVERSIZED_REQUEST),
    ("fragmented: reserved-but-unallocated covers the allocation",
     OomEvent(0, prompt_tokens=100, max_tokens=100, model_max_len=4096, requested_bytes=2 * GiB, free_bytes=GiB,
              reserved_bytes=6 * GiB, total_bytes=80 * GiB, kv_cache_usage=0.4), OomClass.FRAGMENTATION),
    ("full batch of small requests", OomEvent(0, prompt_tokens=200, max_tokens=200, batch_tokens=8100,
                                             max_batch_tokens=8192, running_requests=40, model_max_len=4096),
     OomClass.BATCH_OVERLOAD),
    ("kv cache full", OomEvent(0, prompt_tokens=200, max_tokens=200, kv_cache_usage=0.97, running_requests=64),
     OomClass.BATCH_OVERLOAD),
    ("no context at all", OomEvent(0), OomClass.BATCH_OVERLOAD),
    ("any other CUDA error next to the OOM", OomEvent(0, cuda_errors=("CUDA error: unspecified failure",)),
     OomClass.DEVICE_FAULT),
    ("a device-side assert is the application's", OomEvent(0, cuda_errors=(
        "CUDA error: device-side assert triggered",)), OomClass.BATCH_OVERLOAD),
    ("fragmented, failed allocation unknown: free+cached large",
     OomEvent(0, free_bytes=4 * GiB, reserved_bytes=12 * GiB, total_bytes=80 * GiB), OomClass.FRAGMENTATION),
    ("reserved given as the allocator's total: cached = reserved - allocated",
     OomEvent(0, requested_bytes=2 * GiB, free_bytes=GiB // 2, reserved_bytes=78 * GiB, allocated_bytes=77 * GiB,
              total_bytes=80 * GiB), OomClass.BATCH_OVERLOAD),
    ("total reservation with a big cached part",
     OomEvent(0, requested_bytes=2 * GiB, free_bytes=GiB // 2, reserved_bytes=78 * GiB, allocated_bytes=60 * GiB,
              total_bytes=80 * GiB), OomClass.FRAGMENTATION),
]


@pytest.mark.parametrize(("name", "event", "expected"), CASES, ids=[c[0] for c in CASES])
def test_classify_table(name: str, event: OomEvent, expected: OomClass) -> None:
    v = classify_oom(event)
    assert v.cls is expected, v.explanation
    assert v.explanation


def test_missing_context_is_flagged_not_confident() -> None:
    v = classify_oom(OomEvent(0))
    assert not v.confident
    assert "insufficient_context" in v.evidence


def test_oversized_suggests_a_max_tokens_that_fits() -> None:
    v = classify_oom(OomEvent(0, prompt_tokens=3000, max_tokens=2000, model_max_len=4096))
    assert v.max_tokens_allowed == 1096
    assert "1096" in v.explanation
    too_long_prompt = classify_oom(OomEvent(0, prompt_tokens=5000, max_tokens=10, model_max_len=4096))
    assert too_long_prompt.max_tokens_allowed is None
    assert "prompt alone" in too_long_prompt.explanation


def test_parse_torch_message_and_classify_fragmentation() -> None:
    n = parse_torch_oom(TORCH_MSG)
    assert n.requested_bytes == 2 * GiB
    assert n.free_bytes == int(1.5 * GiB)
    assert n.total_bytes == int(79.15 * GiB)
    assert n.allocated_bytes == 70 * GiB
    assert n.reserved_unallocated_bytes == 5 * GiB
    ev = OomEvent(0, requested_bytes=n.requested_bytes, free_bytes=n.free_bytes,
                  reserved_bytes=n.reserved_unallocated_bytes, total_bytes=n.total_bytes)
    assert classify_oom(ev).cls is OomClass.FRAGMENTATION
    assert is_oom_text(TORCH_MSG)
    assert not is_oom_text("CUDA error: an illegal memory access was encountered")


def test_xids_in_log_lines() -> None:
    assert xids_in("[12345.678901] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.") == [79]
    assert xids_in("kernel: NVRM: Xid (PCI:0000:3d:00): 48, pid=0, DBE") == [48]
    assert xids_in("nothing here") == []


def test_intents_per_class() -> None:
    kinds = lambda ev: [(i.kind, i.tier) for i in oom_intents(ev, 5.0, current_limit=32)]  # noqa: E731
    assert kinds(CASES[5][1]) == [(IntentKind.REJECT_REQUEST, Tier.INSTANCE)]
    assert kinds(CASES[9][1]) == [(IntentKind.LIMIT_CONCURRENCY, Tier.INSTANCE)]
    assert (IntentKind.REBUILD_WORKER, Tier.POD) in kinds(CASES[8][1])
    assert (IntentKind.DRAIN, Tier.POD) in kinds(CASES[8][1])
    dev = kinds(CASES[0][1])
    assert (IntentKind.QUARANTINE, Tier.NODE) in dev and (IntentKind.RUN_ACTIVE_TEST, Tier.NODE) in dev
    limit = oom_intents(CASES[9][1], 5.0, current_limit=32)[0]
    assert limit.params["max_concurrency"] == 30  # 40 running * 0.75, capped by the current limit 32
    assert limit.ts == 5.0 and limit.to_dict()["intent"] == "limit_concurrency"


# ---- properties -----------------------------------------------------------------------------------

opt_int = st.one_of(st.none(), st.integers(min_value=0, max_value=2_000_000))
opt_pos = st.one_of(st.none(), st.integers(min_value=1, max_value=2_000_000))
opt_bytes = st.one_of(st.none(), st.integers(min_value=0, max_value=200 * GiB))
events = st.builds(
    OomEvent,
    ts=st.floats(min_value=0, max_value=1e9),
    prompt_tokens=opt_int, max_tokens=opt_int, output_tokens=opt_int, batch_tokens=opt_int,
    max_batch_tokens=opt_pos, running_requests=opt_int,
    kv_cache_usage=st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
    kv_capacity_tokens=opt_pos, requested_bytes=opt_bytes, free_bytes=opt_bytes, reserved_bytes=opt_bytes,
    allocated_bytes=opt_bytes, total_bytes=opt_bytes,
    recent_xids=st.lists(st.integers(min_value=1, max_value=160), max_size=3).map(tuple),
    cuda_errors=st.lists(st.sampled_from(["", "CUDA out of memory", "illegal memory access", "timeout"]),
                         max_size=2).map(tuple),
    model_max_len=opt_pos,
)
FATAL = fatal_xids(range(1, 200))


@settings(max_examples=80, deadline=None)
@given(events)
def test_total_and_explained(ev: OomEvent) -> None:
    v = classify_oom(ev)
    assert v.cls in set(OomClass)
    assert v.explanation


@settings(max_examples=60, deadline=None)
@given(events, st.sampled_from(FATAL))
def test_any_recent_fatal_xid_is_a_device_fault(ev: OomEvent, xid: int) -> None:
    ev2 = OomEvent(**{**{f: getattr(ev, f) for f in ev.__dataclass_fields__}, "recent_xids": (*ev.recent_xids, xid)})
    assert classify_oom(ev2).cls is OomClass.DEVICE_FAULT


@settings(max_examples=80, deadline=None)
@given(events, st.integers(min_value=1, max_value=512))
def test_never_restart_on_every_oom(ev: OomEvent, limit: int) -> None:
    intents = oom_intents(ev, 1.0, current_limit=limit)
    kinds = {i.kind for i in intents}
    cls = classify_oom(ev).cls
    assert intents
    # A worker rebuild only for fragmentation, and then only behind a drain (requests finish first).
    if IntentKind.REBUILD_WORKER in kinds:
        assert cls is OomClass.FRAGMENTATION and IntentKind.DRAIN in kinds
    # Request-level and load-level OOMs never take the replica out.
    if cls in (OomClass.OVERSIZED_REQUEST, OomClass.BATCH_OVERLOAD):
        assert kinds.isdisjoint({IntentKind.DRAIN, IntentKind.QUARANTINE, IntentKind.REBUILD_WORKER})
    for i in intents:
        if i.kind is IntentKind.LIMIT_CONCURRENCY:
            assert 1 <= i.params["max_concurrency"] <= limit


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=10_000), st.one_of(st.none(), st.integers(min_value=0, max_value=20_000)))
def test_concurrency_only_goes_down(limit: int, running: int | None) -> None:
    new = new_concurrency_limit(limit, running)
    assert 1 <= new <= limit


# Verbatim from torch 2.11 on an NVIDIA H200 (tests/test_gpu_real.py): sizes up to 1 KiB are written "N bytes".
H200_MSG = (
    "CUDA out of memory. Tried to allocate 111.84 GiB. GPU 0 has a total capacity of 139.80 GiB of which 69.29 GiB "
    "is free. Including non-PyTorch memory, this process has 70.50 GiB memory in use. Of the allocated memory "
    "69.93 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)


def test_parse_real_h200_message_with_sizes_in_bytes() -> None:
    n = parse_torch_oom(H200_MSG)
    assert n.requested_bytes == int(111.84 * GiB)
    assert n.total_bytes == int(139.80 * GiB)
    assert n.free_bytes == int(69.29 * GiB)
    assert n.allocated_bytes == int(69.93 * GiB)
    assert n.reserved_unallocated_bytes == 0  # "0 bytes", not unknown
    assert parse_torch_oom("Tried to allocate 512 bytes. GPU 0 ...").requested_bytes == 512
    assert parse_torch_oom("Tried to allocate 1 byte.").requested_bytes == 1
    ev = OomEvent(0, requested_bytes=n.requested_bytes, free_bytes=n.free_bytes,
                  reserved_bytes=n.reserved_unallocated_bytes, allocated_bytes=n.allocated_bytes,
                  total_bytes=n.total_bytes)
    # Nothing cached to defragment: not fragmentation; no Xid or context error: not a device fault.
    assert classify_oom(ev).cls is OomClass.BATCH_OVERLOAD
