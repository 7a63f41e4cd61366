"""A child process's own peak RSS, for the tests and benchmarks that bound the ingestor's memory.

Not `os.wait4`'s ru_maxrss: Linux carries the parent's resident set across fork and exec into the child's
ru_maxrss, so a child of a large test process reports the parent's size. VmHWM (/proc/<pid>/status) is the
high-water mark of the child's own address space after exec; it is polled until the child exits.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_with_peak_rss(process: subprocess.Popen, poll_s: float = 0.05) -> tuple[int, int]:
    """Wait for `process`; its exit code and its peak RSS in bytes (0 if it exited before the first poll)."""
    status, peak = Path(f"/proc/{process.pid}/status"), 0
    while process.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
        except (FileNotFoundError, ProcessLookupError):  # it exited between the poll and the read
            pass
        time.sleep(poll_s)
    return process.returncode, peak
