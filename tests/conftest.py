"""Shared fixtures: one real local broker per session, real Delta lakes in temp dirs, one GX context."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.cli import main  # noqa: E402
from lake import Lake  # noqa: E402
from lake.expectations import SuiteRunner  # noqa: E402
from streams import LocalBroker, ensure_topics  # noqa: E402

TIERS = ("unit", "integration", "e2e")


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook (see the group below)
def pytest_collection_modifyitems(config, items):
    """Every test is in exactly one tier (docs/HACKING.md), so that `-m "not e2e"` and `-m unit` mean what they say;
    the slow tiers first; and the tests of the shared quick run in one pytest-xdist group."""
    wrong = [
        f"{item.nodeid}: {tiers or 'none'}"
        for item in items
        if len(tiers := sorted({m.name for m in item.iter_markers() if m.name in TIERS})) != 1
    ]
    if wrong:
        raise pytest.UsageError(
            "tests must carry exactly one tier marker (unit, integration, e2e): " + "; ".join(wrong)
        )
    # The slow tiers first: pytest-xdist hands tests out in this order, so the minutes-long runs start at once and
    # the seconds-long tests fill both workers at the end, instead of one worker running a 4-minute test alone
    # while the other has finished (longest first is the classic schedule for two machines).
    items.sort(key=lambda item: -TIERS.index(next(m.name for m in item.iter_markers() if m.name in TIERS)))
    # One quick run per session: with --dist loadgroup the tests that share it go to one worker. pytest-xdist 3.8
    # groups by a `@group` suffix that it writes into `item._nodeid`, which pytest 9 no longer reads (its node ids
    # are structured: pytest-xdist issue 1386), so the group was split and the quick run made twice (68 s each).
    # The suffix is written here, where pytest 9 reads it.
    if getattr(config.option, "loadgroup", False):  # set in pytest-xdist's workers under --dist loadgroup
        from _pytest.nodeid import coerce_node_id

        for item in items:
            if "quick_run" in getattr(item, "fixturenames", ()) and "@" not in item.nodeid:
                item._id = coerce_node_id(f"{item.nodeid}@quick_run")


def _tansu_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "tansu" in (p.name() or "")]


@pytest.fixture
def broker():
    """A fresh local Tansu broker per test (it starts in well under a second), so topics never leak between tests."""
    local = LocalBroker().start()
    ensure_topics(local.bootstrap)
    yield local
    local.stop()


@pytest.fixture(scope="session", autouse=True)
def no_broker_outlives_the_session():
    yield
    assert not _tansu_children(), "a broker process outlived the test session"


@pytest.fixture(scope="session")
def runner():
    return SuiteRunner()


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(tmp_path / "lake")


def genenv_cli(*args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        **kwargs,
    )


def genenv_inline(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI's `main` in this process, for a command that only reads or prunes the lake (an audit, a status) or
    stops before any work: the same exit code and output as `genenv_cli` gives, without a new interpreter's imports
    (seconds each on 2 cores). `env` is set for the call and restored after."""
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
            main(list(args))  # always ends in SystemExit; anything else is a bug, and fails the test
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["genenv", *args], exit_.value.code, out.getvalue(), err.getvalue())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_server(command: list[str], port: int, what: str) -> subprocess.Popen:
    """Start a server process and wait (60 s at most) until http://127.0.0.1:<port> answers; fail the test with
    its output otherwise. The output goes to a file, not a pipe: a server that logs every request would block once
    a pipe nobody reads is full."""
    log = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}", timeout=2)
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                log.seek(0)
                pytest.fail(f"{what} did not start: {log.read()[-2000:]}")
            time.sleep(0.2)


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    """One `genenv run --profile quick` (tiny models, through the real broker into a real lake), shared by the
    engine's end-to-end tests and the audit/replay tests: (lake, stdout)."""
    root = tmp_path_factory.mktemp("quick") / "lake"
    # A tiny model's groups are almost all right or all wrong (zero advantages), and the KL term's reference is the
    # warm start, where the first update begins (zero KL gradient): AdamW's weight decay makes every GRPO update
    # move the weights anyway, so replaying an epoch has real updates to reproduce; beta keeps the KL term in them.
    # Three epochs: a tiny simulator's second epoch can write no valid task (so no update continues an optimiser).
    # guidance 2: the tasks no rollout solved get their reference answer as a rollout, so replay and audit cover them.
    sets = ["agent.beta=0.04", "agent.weight_decay=0.01", "epochs=3", "guidance=2"]
    result = genenv_cli(
        "run",
        "--profile",
        "quick",
        "--lake",
        str(root),
        "--seed",
        "2",
        *[a for s in sets for a in ("--set", s)],
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return Lake(root, create=False), result.stdout
