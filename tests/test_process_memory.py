"""fleethealth.memory: the controller process's memory settings, and an operator's explicit ones winning.
Each case runs in a fresh interpreter (the settings are process-wide and numpy reads its variable at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = (
    "import json, numpy as np\n"
    "from fleethealth.memory import tune_process_memory\n"
    "got = tune_process_memory()\n"
    "from numpy._core import multiarray as m\n"
    "huge = m._set_madvise_hugepage(True); m._set_madvise_hugepage(huge)\n"
    "a = np.arange(3_000_000, dtype=np.float64); b = a * 2.0; del a\n"
    "print(json.dumps({**got, 'numpy_huge': bool(huge), 'sum': float(b.sum())}))\n"
)


def _probe(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items()
             if k != "NUMPY_MADVISE_HUGEPAGE" and not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env}, capture_output=True, text=True,
                         check=True).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_the_controller_process_turns_numpy_huge_pages_off_and_keeps_malloc_blocks() -> None:
    got = _probe()
    assert got["small_pages"] is True and got["numpy_huge"] is False
    assert got["malloc_keeps_blocks"] is True  # (glibc: the CI image is Debian)
    assert got["sum"] == float(sum(range(3_000_000))) * 2.0  # arrays read the same


def test_an_operator_setting_wins() -> None:
    got = _probe(NUMPY_MADVISE_HUGEPAGE="1", MALLOC_TRIM_THRESHOLD_="131072")
    assert got["small_pages"] is False and got["numpy_huge"] is True
    assert got["malloc_keeps_blocks"] is False


def test_gc_paused_defers_collection_and_restores_the_collector() -> None:
    import gc

    from fleethealth.memory import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the outer one turns it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a collector already off stays off
    finally:
        gc.enable()
    try:
        with gc_paused():
            raise ValueError("bad input")
    except ValueError:
        pass
    assert gc.isenabled()
