"""One ingestor per lake: a lease held in a Delta table, taken and renewed with optimistic concurrency.

    <root>/_leases     one row per lease name: name, owner, seq, taken_at, expires_at

A name's row says who holds it and until when. Taking or renewing the lease replaces that row (an
overwrite of the name's rows) at exactly the next table version: the row's `seq` is that version, and the
commit is made with no retries, so of two ingestors that read the same version and both try, delta-rs commits
one and refuses the other (CommitFailedError): the loser re-reads and finds the winner. A holder renews well
before expiry; one that dies stops renewing, and after `ttl_s` anyone may take the lease. The check comes
before the ingestor writes anything, so a second ingestor refuses at start with one line naming the owner.
Owners are <name>@<host>:<pid>; a holder on this host whose process is gone (killed, or a restarted
container's earlier life) is taken over at once rather than after its TTL.

Clocks: expiry compares wall-clock times written by different processes; on one machine or NTP-synced
hosts the error is far below the TTL.

Size: a run lasting days renews its lease 8,640 times a day (every ttl_s / 3 seconds), one commit each.
Readers read only the live row's file. At every 100th commit the holder checkpoints the log and deletes what
is over an hour old (the replaced rows' files by vacuum, log entries by the table's log retention, which it
sets to an hour), so the table keeps a few hundred files however long the run.

Why by hand: delta-rs gives the atomic, non-retried commit this needs (CommitProperties(max_commit_retries=0)),
but no lock or lease on top of it; Kafka's own answer (one consumer group member per partition) does not
fit an ingestor that assigns itself every partition and keeps its offsets in the lake.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

LEASES = "_leases"
LEASES_SCHEMA = pa.schema(
    [
        ("name", pa.string()),
        ("owner", pa.string()),
        ("seq", pa.int64()),
        ("taken_at", pa.float64()),
        ("expires_at", pa.float64()),
    ]
)
log = logging.getLogger(__name__)
TTL_S = 30.0
TIDY_EVERY = 100  # commits of the lease table between two deletions of what is older than KEEP_HOURS
KEEP_HOURS = 1


class LeaseHeld(RuntimeError):
    """Someone else holds the lease (the message names them and until when)."""


def default_owner() -> str:
    """Who takes a lease: <name>@<host>:<pid>, the name GENENV_WORKER_NAME or "ingest"."""
    return f"{os.environ.get('GENENV_WORKER_NAME') or 'ingest'}@{socket.gethostname()}:{os.getpid()}"


def dead_here(owner: str) -> bool:
    """The owner was a process on this host that no longer runs (or an earlier life of this very pid, as in a
    restarted container): its lease need not wait out its TTL."""
    _, _, where = owner.rpartition("@")
    host, _, pid = where.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, someone else's
        return False
    return False


@dataclass
class Holder:
    owner: str
    expires_at: float


class Lease:
    def __init__(
        self,
        uri: str,
        storage_options: dict[str, str] | None = None,
        name: str = "ingest",
        owner: str | None = None,
        ttl_s: float = TTL_S,
    ):
        if ttl_s <= 0:
            raise ValueError(f"a lease's ttl must be > 0 s, got {ttl_s}")
        self.uri, self.name, self.owner, self.ttl_s = uri, name, owner or default_owner(), ttl_s
        self.storage_options = storage_options or {}
        self.renewed_at = 0.0

    def holder(self, table: DeltaTable | None = None) -> Holder | None:
        """Who holds the lease now (None: nobody, or it expired)."""
        table = table or self._table()
        rows = pl.from_arrow(table.to_pyarrow_table(filters=[("name", "=", self.name)]))
        if rows.is_empty():
            return None
        newest = rows.sort("seq").row(-1, named=True)
        if newest["expires_at"] <= time.time() or (newest["owner"] != self.owner and dead_here(newest["owner"])):
            return None
        return Holder(newest["owner"], newest["expires_at"])

    def take(self) -> None:
        """Take the lease (or renew it, when ours); LeaseHeld when someone else holds it."""
        table = self._table()
        holder = self.holder(table)
        if holder is not None and holder.owner != self.owner:
            raise LeaseHeld(self._held_message(holder))
        now = time.time()
        self._append(table, now, now + self.ttl_s)
        self.renewed_at = time.monotonic()

    def renew_if_due(self) -> None:
        """Renew once a third of the TTL has passed (LeaseHeld if it was lost meanwhile: stop writing)."""
        if time.monotonic() - self.renewed_at >= self.ttl_s / 3:
            self.take()

    @contextlib.contextmanager
    def kept_alive(self):
        """Renew the lease from a thread while the block runs (a long step: hashing a large checkpoint takes more
        than a TTL). A renewal that fails is raised here, after the block: the holder must not write then."""
        done, failed = threading.Event(), []

        def renew() -> None:
            while not done.wait(self.ttl_s / 6):
                try:
                    self.renew_if_due()
                except Exception as exc:  # noqa: BLE001 (handed to the caller below)
                    failed.append(exc)
                    return

        thread = threading.Thread(target=renew, name=f"lease-{self.name}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
        if failed:
            raise failed[0]

    def release(self) -> None:
        """Give the lease up (it expires now), if it is still ours."""
        table = self._table()
        holder = self.holder(table)
        if holder is not None and holder.owner == self.owner:
            self._append(table, time.time(), time.time())

    def _table(self) -> DeltaTable:
        return DeltaTable(self.uri, storage_options=self.storage_options)

    def _append(self, table: DeltaTable, taken_at: float, expires_at: float) -> None:
        row = pa.table(
            {
                "name": [self.name],
                "owner": [self.owner],
                "seq": [table.version() + 1],
                "taken_at": [taken_at],
                "expires_at": [expires_at],
            },
            schema=LEASES_SCHEMA,
        )
        try:
            write_deltalake(
                table,
                row,
                mode="overwrite",
                predicate=f"name = '{self.name}'",
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except CommitFailedError:
            # Another writer committed first: whoever it was now holds the lease (or just renewed theirs).
            holder = self.holder()
            raise LeaseHeld(self._held_message(holder) if holder else "the lease changed hands meanwhile") from None
        if table.version() % TIDY_EVERY == 0:
            try:
                self._tidy(table)
            except (DeltaError, OSError) as exc:  # housekeeping: the lease is renewed; the next tidy tries again
                log.warning("could not tidy the lease table %s: %s", self.uri, exc)

    def _tidy(self, table: DeltaTable) -> None:
        """Delete the replaced rows' files and the log entries older than KEEP_HOURS (the log's by the table's own
        retention, which is set here the first time)."""
        retention = {
            f"delta.{key}": f"interval {KEEP_HOURS} hours"
            for key in ("logRetentionDuration", "deletedFileRetentionDuration")
        }
        if any(table.metadata().configuration.get(key) != value for key, value in retention.items()):
            table.alter.set_table_properties(retention)
        table.vacuum(retention_hours=KEEP_HOURS, enforce_retention_duration=False, dry_run=False)
        table.create_checkpoint()  # log entries before the newest checkpoint are the ones that may go
        table.cleanup_metadata()

    def _held_message(self, holder: Holder) -> str:
        left = max(0.0, holder.expires_at - time.time())
        return (
            f"{self.name} lease of {self.uri.removesuffix('/' + LEASES)} is held by {holder.owner} "
            f"(expires in {left:.0f}s unless renewed); only one ingestor writes a lake"
        )
