"""Freed heap given back to the OS: glibc keeps what a program frees for its own reuse, and torch and Python never
ask it to return it. The sync loop calls this at each phase's end (engine/coevolution/sync.py) and the warm start after
each of its micro-batches (trainers/sft.py). Written by hand: no library we use exposes malloc_trim."""

from __future__ import annotations

import ctypes
import ctypes.util

_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None)


def release_free_heap() -> None:
    """Give the pages that a phase freed back to the OS, at the phase's end (glibc's malloc_trim; a no-op where the
    C library has none). glibc keeps freed memory for reuse, and the next phase allocates in other sizes (a bf16
    update's activations, then generation's caches), so what each phase left behind piled up: peak RSS rose from
    5.3 to 7.05-7.65 GB over a default run's five epochs in bf16, and 5.74-5.95 GB with this (docs/RESULTS.md, runs
    e21-e26). The warm start calls it after each micro-batch too: its peak grew step by step with the heap the steps
    left behind (given back, the agent's warm start alone peaked at 2.89 GB against 3.07; run e64 of docs/RESULTS.md).
    The async mode's worker processes do not call it yet."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)
