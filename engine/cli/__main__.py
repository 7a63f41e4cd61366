"""`python -m engine.cli`: what the installed `genenv` command runs (workers and ranks are started this way)."""

from engine.cli import entry

entry()
