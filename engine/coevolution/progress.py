"""How long work reports itself: a `Say` for one-line messages and a `Phase` for one progress bar per phase.

The CLI passes rich's console and progress bars; library callers and tests get the quiet defaults.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

Say = Callable[[str], None]
Tick = Callable[[int, int], None]  # (done, total)
Phase = Callable[[str], contextlib.AbstractContextManager[Tick]]


@contextlib.contextmanager
def no_phase(description: str):
    """A Phase that shows nothing."""
    yield lambda done, total: None
