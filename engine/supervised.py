"""How a supervised process knows its supervisor is gone (kept apart from engine/workers so that `genenv ingest`
need not import the trainers to ask).

`genenv run --async` starts each worker with GENENV_SUPERVISOR_PID set to its own pid. SIGKILL of the launcher
leaves its children running; they stop at their next check instead of running on unsupervised.
"""

from __future__ import annotations

import os

SUPERVISOR_PID = "GENENV_SUPERVISOR_PID"


def supervisor_gone() -> bool:
    """True once the process that started this one under supervision has died; False for one nobody supervises."""
    pid = os.environ.get(SUPERVISOR_PID)
    return bool(pid) and os.getppid() != int(pid)
