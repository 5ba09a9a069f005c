"""Process-wide memory settings of a controller process (imperative shell; called once at start).

Theory of operation. A controller cycle at 100k GPUs makes and drops hundreds of numpy arrays of a few to
tens of MB. Two defaults make each of them cost kernel time, which in a virtual machine is the costliest
thing the controller does:

- numpy asks for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on every array of 4 MiB and more.
  Where the kernel's THP setting is ``madvise`` (Debian's default) the first touch of such an array faults
  in and zeroes whole 2 MiB pages. Measured on a Firecracker VM (``python benchmarks/bench_cycle.py
  --gpus 100000``, one run each): the cold first cycle spent 4.8 s of its 8.7 s CPU in the kernel with
  numpy's huge pages, 0.9 s of 5.1 s without; a steady cycle 1.0 s of 2.4 s, 0.2-0.5 s of 2.0 s.
- glibc's malloc hands big blocks back to the kernel when they are freed (blocks past its mmap
  threshold, and the top of the heap past its trim threshold), so the next cycle's arrays of the same
  sizes are faulted in and zeroed again. Keeping blocks up to 32 MiB in the heap and not trimming it
  below 1 GiB lets the allocator reuse them: the cold cycle's page faults 540k -> 280k, its kernel time
  0.96 -> 0.42 s; peak memory unchanged (2.25 GB), since the freed blocks are the next ones' memory.

A third cost is Python's cyclic garbage collector: a cold cycle makes millions of small objects that can
never form a cycle (label sets: tuples of str pairs; bytes rows; dict entries), and every 700 of them the
collector walks the young ones, and now and then all of them (0.4 s of a 4.4 s cold cycle at 100k GPUs).
``gc_paused`` defers collection over such a bulk build; what it made is collected as usual afterwards.

``tune_process_memory`` applies the first two to this process. An operator's explicit choice wins: numpy's own
``NUMPY_MADVISE_HUGEPAGE`` (read at import) and glibc's ``MALLOC_*_`` / ``GLIBC_TUNABLES`` variables leave
the respective setting alone (note that any ``MALLOC_*_`` variable also turns glibc's dynamic mmap threshold
off, which is not its default either). It changes no result, only where the memory comes from; on a libc
other than glibc the allocator part does nothing.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MALLOC_SETTINGS = ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20))
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def tune_process_memory() -> dict[str, bool]:
    """Numpy's huge pages off and glibc's malloc keeping freed blocks (see the module docstring).
    Returns which of the two this process now has: ``small_pages``, ``malloc_keeps_blocks``."""
    return {"small_pages": _numpy_small_pages(), "malloc_keeps_blocks": _malloc_keeps_blocks()}


def _numpy_small_pages() -> bool:
    toggle = None
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2, numpy 1
        try:
            toggle = getattr(importlib.import_module(name), "_set_madvise_hugepage", None)
        except ImportError:
            continue
        if toggle is not None:
            break
    if toggle is None:
        return False
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:  # the operator decided
        huge = bool(toggle(True))
        toggle(huge)
        return not huge
    toggle(False)
    return True


def _malloc_keeps_blocks() -> bool:
    if any(k in os.environ for k in _MALLOC_ENV):  # the operator decided
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this interpreter runs on (no ldconfig lookup)
    except (OSError, AttributeError, TypeError):
        return False  # no mallopt: not glibc
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all([mallopt(param, value) == 1 for param, value in _MALLOC_SETTINGS])


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (see the module docstring): for code that makes many objects
    that cannot form reference cycles. Nested uses, and a collector already off, leave it as they found it."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
