"""The run's memory: each phase's peak resident set for metrics.json (the freed heap given back at each phase's end is
trainers/heap.py's `release_free_heap`).

Why a sampling thread: the kernel's high-water mark (VmHWM, getrusage's ru_maxrss) is the peak since the process
began, so a phase that reads it at its end reads the peak so far (every phase of run e38 in docs/RESULTS.md read
4.25 GB, the warm start's); resetting it (writing 5 to /proc/self/clear_refs) would also take the run's true peak
away from getrusage and /usr/bin/time. A daemon thread that reads the resident set (/proc/self/statm) every 50 ms
gives each phase its own peak, short only of spikes briefer than that; the process's peak stays getrusage's.
Where /proc is missing (not Linux), a phase's figure is the process's peak so far, as before.
"""

from __future__ import annotations

import os
import resource
import threading

GB = 2**30
_PAGE = os.sysconf("SC_PAGE_SIZE")  # where `resource` imports (Unix), sysconf does too


def peak_rss_gb() -> float:
    """The process's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def resident_bytes() -> int | None:
    """The process's resident set now, or None where /proc/self/statm is missing."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


class PhasePeaks:
    """The highest resident set between one `take()` and the next, sampled every `interval_s` while the sampler
    runs (`with PhasePeaks() as peaks:`); phases that follow one another each take their own peak at their end."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._highest = 0  # bytes, since the last take
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        now = resident_bytes()
        if now is not None:
            with self._lock:
                self._highest = max(self._highest, now)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PhasePeaks:
        self.take()  # what came before the sampler started is no phase's
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="phase-peaks", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._thread = None

    def take(self) -> float:
        """The peak since the last take, in GB (a reading now included), and a new window from here."""
        self._sample()
        with self._lock:
            highest, self._highest = self._highest, 0
        return round(highest / GB, 2) if highest else peak_rss_gb()
