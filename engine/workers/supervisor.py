"""Keeping a run's worker processes alive: restart one that dies, a bounded number of times, and say so.

A worker that exits with an error (or is killed) is started again after a backoff of 2, 4, 8 s; each
restart is published as a WorkerRestarted event (so the lake records it and `genenv audit epoch` shows
it). A worker whose work is finite (the simulator, the trainers) is done when it exits with code 0; the
others (rollout, reward, ingest) run until stopped, so any exit of theirs is a death. After MAX_RESTARTS
deaths of one worker the run fails, naming it. Restarting is safe because every worker rebuilds its state
from the lake and its consumer group's committed offsets (worker.py), and repeated work yields events with
the ids it had the first time.

Process supervision is what systemd, Kubernetes or docker-compose's `restart: on-failure` do for a
deployment; this is the same for the one-machine convenience `genenv run --async`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kafka.errors import KafkaError

from streams import EventProducer, WorkerRestarted
from streams.broker import terminate

from ..supervised import SUPERVISOR_PID

ROOT = Path(__file__).resolve().parents[2]
MAX_RESTARTS = 3
BACKOFF_S = 2.0
FINITE = ("simulator", "train-agent", "train-env")  # done when they exit with code 0


class WorkerFailed(RuntimeError):
    """A worker died more often than the supervisor restarts one."""


@dataclass
class Managed:
    name: str  # what its events' `producer` says (GENENV_WORKER_NAME)
    role: str
    args: list[str]  # genenv command-line arguments
    process: subprocess.Popen | None = None
    restarts: int = 0
    restart_at: float | None = None
    stopped: bool = False

    def start(self) -> None:
        env = {**os.environ, "GENENV_WORKER_NAME": self.name, SUPERVISOR_PID: str(os.getpid())}
        # Its own session: a Ctrl-C at the terminal reaches the launcher alone, which then stops the workers in
        # order (the ingestor last, once it has landed what the others published).
        self.process = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", *self.args], cwd=ROOT, env=env, start_new_session=True
        )
        self.restart_at = None

    @property
    def done(self) -> bool:
        return self.role in FINITE and self.process.poll() == 0


@dataclass
class Supervisor:
    run_id: str
    bootstrap: str
    epoch_now: Callable[[], int]  # the epoch a restart is recorded under
    say: Callable[[str], None] = print
    workers: dict[str, Managed] = field(default_factory=dict)
    _producer: EventProducer | None = None

    def start(self, name: str, role: str, args: list[str]) -> None:
        self.workers[name] = Managed(name, role, args)
        self.workers[name].start()

    def check(self) -> None:
        """Restart the workers that died (once their backoff is over); WorkerFailed for one that died too often."""
        now = time.monotonic()
        for worker in self.workers.values():
            if worker.stopped:
                continue
            if worker.restart_at is not None:
                if now >= worker.restart_at:
                    worker.start()
                continue
            code = worker.process.poll()
            if code is None or worker.done:
                continue
            if worker.restarts >= MAX_RESTARTS:
                raise WorkerFailed(
                    f"async run: worker {worker.name} exited with code {code} after {worker.restarts} "
                    "restarts; giving up"
                )
            worker.restarts += 1
            delay = BACKOFF_S * 2 ** (worker.restarts - 1)
            worker.restart_at = now + delay
            self.say(
                f"supervisor: {worker.name} exited with code {code}; restart {worker.restarts}/{MAX_RESTARTS} "
                f"in {delay:.0f}s"
            )
            self.record(
                WorkerRestarted(
                    run_id=self.run_id,
                    epoch=self.epoch_now(),
                    worker=worker.name,
                    role=worker.role,
                    exit_code=code,
                    restart=worker.restarts,
                    producer="supervisor",
                )
            )

    def record(self, event: WorkerRestarted) -> None:
        try:
            if self._producer is None:
                self._producer = EventProducer(self.bootstrap, client_id="genenv-supervisor")
            self._producer.publish([event], timeout_s=10)
        except KafkaError as exc:  # the broker is down: the restart still happens (the launcher notices the broker)
            self.say(f"supervisor: could not record the restart of {event.worker}: {exc.__class__.__name__}")

    def finished(self, role: str) -> bool:
        """Every worker of the role has exited with code 0 (finite roles only)."""
        return all(w.done for w in self.workers.values() if w.role == role)

    def stop(self, *roles: str) -> None:
        """SIGTERM (then SIGKILL) the workers of these roles (all when none are named); they are not restarted."""
        for worker in self.workers.values():
            if roles and worker.role not in roles:
                continue
            worker.stopped = True
            if worker.process is not None:
                terminate(worker.process)

    def close(self) -> None:
        self.stop()
        if self._producer is not None:
            self._producer.close()
