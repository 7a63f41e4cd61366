"""The `genenv` command line: one entry point, one subcommand per job, each a thin layer over the engine.

    app.py        the Typer apps, and `main`: known errors become one line and exit code 2
    options.py    every option declared once (--lake, --set, --config, ...), and the checks of flag values
    render.py     what commands print: tables, JSON, progress bars
    data.py       broker, ingest, lake status | versions | prune
    runs.py       run, config, plan, experiment ablation, worker
    training.py   train (one update, in one or several processes)
    lineage.py    audit task | checkpoint | epoch, replay, ui
    evaluation.py eval

Commands import the engine inside their bodies, so `genenv --help` and the commands that need no model do not
pay for importing torch.
"""

# isort: off
from . import runs, training, data, lineage, evaluation  # noqa: F401 (importing a module registers its commands; this order is --help's)
from .app import app, entry, main
# isort: on

__all__ = ["app", "entry", "main"]
