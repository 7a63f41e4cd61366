"""Every option that more than one command takes, declared once, and the checks of flag values.

A flag value that is out of range stops the command with a UserError (one line, exit code 2: engine/cli/app.py)
before any work starts. `bad_input` does the same for the ValueError of a check of what the user gave (a run
configuration, by config.py's rule; a benchmark's data files).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated

import typer

from streams import BOOTSTRAP_ENV


class UserError(Exception):
    """A bad flag, path or config: reported as one line, exit code 2."""


LakeOpt = Annotated[
    str,
    typer.Option(
        "--lake", help="Lake root: a directory, or s3://bucket/prefix (storage options from AWS_* variables)."
    ),
]
BootstrapOpt = Annotated[
    str | None,
    typer.Option(
        "--bootstrap", help=f"Kafka bootstrap servers; default ${BOOTSTRAP_ENV}, else a local broker for the run."
    ),
]
ProfileOpt = Annotated[
    str, typer.Option(help="quick (tiny models, ~1 min), default (smollm2-135m on CPU), paper (GPU settings).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="A TOML file with any of the options (see `genenv config`; configs/).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Any option as name=value or section.name=value (sections: curriculum, agent, env); repeatable."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")]
RunOpt = Annotated[str | None, typer.Option("--run", help="Run id (default: the newest run in the lake).")]


@contextlib.contextmanager
def bad_input():
    """The ValueError of checking the user's input (a configuration that does not load, malformed data) as a
    UserError: one line, exit code 2."""
    try:
        yield
    except ValueError as exc:
        raise UserError(str(exc)) from None


def check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def check_non_negative(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not value >= 0:  # `not >=` also refuses NaN
            raise UserError(f"--{name.replace('_', '-')} must be >= 0, got {value}")


def check_output_folder(path: Path | None, flag: str) -> None:
    """A folder the command will write into at its end, made (or found writable) now: a long run must not end in
    a path it cannot write."""
    if path is None:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot create the folder ({exc.strerror or exc})") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: not a folder this user can write into")


def check_port(port: int, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if not low <= port <= 65535:
        raise UserError(f"--port must be in {low}-65535{' (0: a free one)' if allow_zero else ''}, got {port}")
