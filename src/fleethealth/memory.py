"""Process-wide memory settings of a controller process (imperative shell; called once at start).

Theory of operation. numpy asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on
every array of 4 MiB and more. Where the kernel's THP setting is ``madvise`` (Debian's default) the first
touch of such an array then faults in and zeroes 2 MiB pages, and an array freed and made again (a
controller cycle makes and drops hundreds of them, each a few to tens of MB at 100k GPUs) is faulted in
afresh. In a virtual machine this is the costliest thing the controller does: measured on a Firecracker
VM (``python benchmarks/bench_cycle.py --gpus 100000``), the cold first cycle spent 4.8 s of its 8.7 s CPU
in the kernel with numpy's huge pages and 0.9 s of 5.1 s without; a steady cycle 1.0 s of 2.4 s and 0.2-0.5
s of 2.0 s. Plain 4 KiB pages fault more often but each fault zeroes only what is touched.

``prefer_small_pages`` turns numpy's madvise off for this process, unless the operator set
``NUMPY_MADVISE_HUGEPAGE`` (numpy's documented switch, read at import): an explicit choice wins. It changes
no result, only where the memory comes from.
"""

from __future__ import annotations

import importlib
import os


def prefer_small_pages() -> bool:
    """Stop numpy from asking for transparent huge pages in this process (see the module docstring).
    Returns whether numpy's huge-page madvise is on afterwards."""
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
        current = bool(toggle(True))
        toggle(current)
        return current
    toggle(False)
    return False

