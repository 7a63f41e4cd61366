"""The Typer apps every command registers on, and `main`, which turns the errors a user can cause into one line.

An error is a user's to fix (a bad flag, path or config, a missing file, a run or version that does not exist, a
broker that does not answer) when it is one of KNOWN_ERRORS: it is printed as one `error:` line and the command
exits with 2. A broker or storage failure mid-command is one line too. Anything else is a bug, and keeps its
traceback. GENENV_DEBUG=1 shows the traceback of all of them.
"""

from __future__ import annotations

import errno
import faulthandler
import logging
import os
import re
import signal
import sys

import typer
from rich.markup import escape

from .options import UserError
from .render import err

app = typer.Typer(
    help="GenEnv: co-evolving agents and environment simulators, as an event-sourced curriculum engine.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
lake_app = typer.Typer(help="Inspect the Delta lake: tables, versions, quarantine.", no_args_is_help=True)
app.add_typer(lake_app, name="lake")
experiment_app = typer.Typer(help="Experiments over several runs.", no_args_is_help=True)
app.add_typer(experiment_app, name="experiment")
audit_app = typer.Typer(help="Where a task, checkpoint or epoch came from and what it caused.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")

# module -> the exceptions of it that mean "the user must change something". Looked up only in modules already
# imported: an error of a module nobody imported cannot have been raised, and importing trainers costs torch.
KNOWN_ERRORS = {
    "lake": ("LakeError", "LeaseHeld", "StorageError"),
    "streams": ("BrokerError",),
    "trainers": ("TrainError", "CheckpointError", "ModelNotFound"),
    "engine.lineage": ("AuditError", "ReplayError"),
    "engine.benchmarks": ("EvalError", "DataMissing"),
}


def known_errors() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = [UserError]
    for module, names in KNOWN_ERRORS.items():
        if module in sys.modules:
            kinds += [getattr(sys.modules[module], name) for name in names]
    return tuple(kinds)


DISK_FULL = (
    "no space left on device: free some (`genenv lake prune --lake PATH --keep-last N --apply` deletes old "
    "checkpoint folders), then continue a run with `genenv run --resume RUN_ID` (GENENV_DEBUG=1 shows the traceback)"
)


def disk_full(exc: BaseException | None) -> bool:
    """Whether an exception, or one it was raised from, is a full disk: an OSError with ENOSPC, or the text that
    torch's and safetensors' writers put in their own exceptions for it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if any(text in str(exc) for text in ("No space left on device", "StorageFull", "os error 28")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _on_sigterm(signum, frame):  # a normal exit, so context managers stop the local broker
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    """The `genenv` command: argv, or the process's own arguments; always ends in SystemExit with the exit code."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # kafka-python logs every failed reconnect at ERROR (a broker that dies mid-run gave ~170 lines before genenv's
    # own one-line message, which says what happened and how to resume); GENENV_DEBUG=1 shows them.
    logging.getLogger("kafka").setLevel(logging.ERROR if os.environ.get("GENENV_DEBUG") else logging.CRITICAL)
    # The CLI shows its own progress: no per-file bars from transformers / huggingface_hub (read at their import,
    # so no need to import them here, which would slow every command's start).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # oneDNN (torch's CPU matrix kernels) keeps the primitive it built for each shape it met, 1024 of them by
    # default, and a bf16 one held about 1 MB on a CPU with AMX: a run's many sequence lengths left most of a GB of
    # them resident (docs/RESULTS.md, e63). 32 keep what a step reuses (a warm start no slower); 0 made it 5x slower.
    # oneDNN reads it at its first primitive, so here, before any work; workers and ranks inherit it.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "32")
    signal.signal(signal.SIGTERM, _on_sigterm)
    # `kill -USR1 PID` prints every thread's stack to stderr and the process goes on: how one finds where a run
    # (or one of its workers) that seems stuck is waiting. The process's own stderr (a test's redirect has no fd).
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    from deltalake.exceptions import DeltaError
    from kafka.errors import KafkaError
    from typer.exceptions import Abort, TyperException

    try:
        # Not standalone: click's usage errors (typer vendors click; they derive from TyperException) come here to be
        # one line, not a usage box (a negative positional, "-1", reads as an unknown option), and a command's
        # typer.Exit comes back as its exit code.
        code = app(args=argv, standalone_mode=False)
    except TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # a command group called bare: its help, as typer draws it
            app(args=argv)
        where = exc.ctx.command_path if getattr(exc, "ctx", None) else "genenv"
        message = exc.format_message()
        if negative := re.fullmatch(r"No such option: (-\d+)", message):
            message = f"{negative[1]}: a negative number is never an epoch, a version or a count"
        err.print(f"[bold red]error:[/] {escape(message)} (see {where} --help)", highlight=False)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, Abort):
        err.print("interrupted")
        sys.exit(130)
    except (KafkaError, DeltaError) as exc:  # the broker or the storage failed mid-command
        if os.environ.get("GENENV_DEBUG"):
            raise
        where = "Kafka" if isinstance(exc, KafkaError) else "Delta Lake"
        first = str(exc).splitlines()[0] if str(exc) else ""
        err.print(
            f"[bold red]error:[/] {escape(f'{where}: {exc.__class__.__name__}: {first}')} "
            "(GENENV_DEBUG=1 shows the traceback)",
            highlight=False,
        )
        sys.exit(2)
    except Exception as exc:
        if disk_full(exc) and not os.environ.get("GENENV_DEBUG"):  # a fault, not bad input: exit 1
            err.print(f"[bold red]error:[/] {escape(DISK_FULL)}", highlight=False)
            sys.exit(1)
        if not isinstance(exc, known_errors()) or os.environ.get("GENENV_DEBUG"):
            raise
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


def entry() -> None:
    """The process's entry point (the `genenv` script and `python -m engine.cli`): `main`, then an exit 2 (bad input
    or a known error, every `with` block already unwound) ends the process at once. At interpreter exit Arrow's C++
    threads can abort it (apache/arrow#34314), which turned a refused ingestor's exit 2 into a SIGABRT after its
    one-line error in 2 of 3 CI runs on an AMD EPYC. Tests call `main` in their own process, never this."""
    try:
        main()
    except SystemExit as exc:
        if exc.code != 2:
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)
