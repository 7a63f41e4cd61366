"""`python -m engine.cli`: what the installed `genenv` command runs (workers and ranks are started this way)."""

import os
import sys

from engine.cli import main

try:
    main()
except SystemExit as exc:
    # A command that stopped on bad input or a known error (exit 2, every `with` block already unwound) ends at
    # once: at interpreter exit Arrow's C++ threads can abort the process (apache/arrow#34314), which turned a
    # refused ingestor's exit 2 into a SIGABRT after its one-line error, in 2 of 3 CI runs on an AMD EPYC.
    if exc.code != 2:
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2)
