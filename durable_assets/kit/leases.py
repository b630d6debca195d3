"""Run leases: how we tell a live worker from a dead one, and how an orphan learns it was replaced.

Dagster's default run launcher cannot see whether the process running a run is alive, so a run
whose worker was SIGKILLed stays STARTED forever. The worker therefore renews a lease row in the
instance's database; a lease not renewed within ``ttl_s`` means the worker is dead. Every
takeover by another process increments the lease's *fence*; a worker checks its fence before each
side effect and stops when it has been superseded.

A lease also names its holder's process (host, pid, and the pid's incarnation: pid namespace and
start time). A process on the same host can therefore see that the holder no longer exists and take
the batch over at once instead of waiting out the TTL; a holder on another host, in another pid
namespace, or merely frozen (SIGSTOP) still keeps its lease until it lapses.

Every time a lease is written with or judged against is the database server's
(:meth:`DurableDatabase.clock`), read in the same transaction as the row: processes on hosts whose
clocks disagree by a minute still agree on which lease is live, so none steals a live lease and
none keeps a lapsed one.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from durable_assets.errors import FencedOutError, LeaseHeldError
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.db import DurableDatabase, from_row, leases
from durable_assets.kit.settings import DEFAULT_LEASE_TTL_S

#: The run a lease names before its run exists (`job run`/`job resume` take the batch first, so no
#: other process may start it meanwhile); the run takes the lease over when its worker starts.
PENDING_RUN = "pending"


def process_owner() -> str:
    """Identity of this worker process (``host:pid:incarnation``); the same process may re-acquire
    its own lease, and a process of this host can tell whether the holder still exists."""
    return _own_identity(os.getpid())


@functools.cache
def _own_identity(pid: int) -> str:
    # Keyed by pid so that a forked child gets its own identity; /proc is read once per process.
    return owner_of(pid)


def owner_of(pid: int) -> str:
    """The owner string of process ``pid`` of this host, as that process would write it."""
    start = _start_ticks(pid)
    incarnation = f"{_namespace()}.{start}" if start is not None else "?"
    return f"{socket.gethostname()}:{pid}:{incarnation}"


def owner_pid(owner: str) -> int | None:
    """The pid in a ``host:pid[:incarnation]`` owner, or None for an owner of another form."""
    parts = owner.split(":")
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


def holder_is_gone(owner: str) -> bool:
    """Whether ``owner`` names a process of this host (and pid namespace) that no longer exists.

    Only a definite answer counts: an owner of another form, host or namespace, or a system without
    ``/proc``, is not known to be gone. A zombie is gone (it runs nothing); a frozen process is not;
    a pid reused by a new process is told apart by its start time.
    """
    parts = owner.split(":")
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    namespace, _, start = parts[2].partition(".")
    if namespace != _namespace() or not start.isdigit():
        return False
    stat = _stat(int(parts[1]))
    if stat is None:
        return Path("/proc/self/stat").exists()  # no such process, where /proc can tell
    state, now_start = stat
    return state in ("Z", "X") or now_start != int(start)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of ``pid``, from /proc; None if it is absent."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5), counted from the state


def _start_ticks(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[1] if stat else None


@functools.cache
def _namespace() -> str:
    """This boot's pid namespace, in 8 hex digits: pids compare only within one."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return "unknown"
    return hashlib.blake2s(f"{boot}/{pid_ns}".encode(), digest_size=4).hexdigest()


@dataclass(frozen=True)
class Lease:
    batch_id: str
    run_id: str
    owner: str
    fence: int
    expires_at: float
    released: bool = False
    #: The database's clock when this copy was read or written (None for one built by hand).
    read_at: float | None = None

    @property
    def db_now(self) -> float:
        """The time this copy is judged at: the database's, on the clock that wrote ``expires_at``
        (this process's own clock may be a minute off the writer's)."""
        if self.read_at is None:
            raise ValueError("this lease was not read from the database: judge it at an explicit time")
        return self.read_at

    def is_live(self, at: float | None = None) -> bool:
        """Whether the holder may still act: not released, not lapsed, and not a process of this
        host known to be gone (whose lease is therefore taken over without waiting out the TTL)."""
        lapsed = self.seconds_left(at) <= 0
        return not self.released and not lapsed and not holder_is_gone(self.owner)

    def seconds_left(self, at: float | None = None) -> float:
        """Until the lease lapses unless renewed (negative: since it lapsed), at ``at`` or when read."""
        return self.expires_at - (self.db_now if at is None else at)


class LeaseStore:
    """Run leases by batch: one live holder per batch, renewed by its heartbeat, read on the
    database's clock so a host with a wrong clock can neither steal nor stretch one."""

    def __init__(self, db: DurableDatabase, ttl_s: float = DEFAULT_LEASE_TTL_S) -> None:
        self.db = db
        self.ttl_s = ttl_s

    def get(self, batch_id: str) -> Lease | None:
        query = sa.select(leases, self.db.clock_column()).where(leases.c.batch_id == batch_id)
        with self.db.read() as conn:
            row = conn.execute(query).first()
        return _to_lease(row, row.db_now) if row else None

    def acquire(self, batch_id: str, run_id: str, owner: str | None = None) -> Lease:
        """Take the batch's lease for ``run_id``, or raise :class:`LeaseHeldError`.

        The same process (owner) may adopt its own live lease for a new run id without a new
        fence: the CLI takes the lease before it creates the run, and the run then adopts it.
        """
        owner = owner or process_owner()
        with self.db.transaction() as conn:
            # The row's lock on Postgres; SQLite renders no FOR UPDATE (its BEGIN IMMEDIATE holds the file).
            query = sa.select(leases).where(leases.c.batch_id == batch_id).with_for_update()
            row = conn.execute(query).first()
            t = self.db.clock(conn)  # under the row's lock: a lease that lapsed while we waited has lapsed
            current = _to_lease(row, t) if row else None
            if current and current.is_live(t) and current.owner != owner:
                raise LeaseHeldError(
                    f"batch {batch_id!r} is held by worker {current.owner} (run {current.run_id}); "
                    f"its lease expires in {current.expires_at - t:.0f} s unless renewed. "
                    "Wait for it to finish or die, or cancel it with `job cancel`."
                )
            same_holder = current is not None and current.is_live(t) and current.owner == owner
            fence = current.fence if (current and same_holder) else (current.fence + 1 if current else 1)
            values = {
                "batch_id": batch_id,
                "run_id": run_id,
                "owner": owner,
                "fence": fence,
                "heartbeat_at": t,
                "expires_at": t + self.ttl_s,
                "released": False,
            }
            if current is None:
                conn.execute(leases.insert().values(**values))
            else:
                conn.execute(leases.update().where(leases.c.batch_id == batch_id).values(**values))
        crash_point(CrashPoint.AFTER_LEASE_TAKEOVER)
        return Lease(batch_id, run_id, owner, fence, t + self.ttl_s, read_at=t)

    def renew(self, lease: Lease) -> bool:
        """Extend the lease; False when another worker has taken over (our fence is stale)."""
        c = leases.c
        with self.db.transaction() as conn:
            # Read before the UPDATE waits for the row, if it must: the lease then ends that much
            # sooner, never later; and a takeover in between changed the fence, so nothing is renewed.
            t = self.db.clock(conn)
            updated = conn.execute(
                leases.update()
                .where(c.batch_id == lease.batch_id, c.fence == lease.fence, c.owner == lease.owner)
                .values(heartbeat_at=t, expires_at=t + self.ttl_s, released=False)
            ).rowcount
        crash_point(CrashPoint.AFTER_LEASE_RENEWAL)
        return bool(updated)

    def release(self, lease: Lease) -> None:
        c = leases.c
        with self.db.transaction() as conn:
            conn.execute(
                leases.update()
                .where(c.batch_id == lease.batch_id, c.fence == lease.fence, c.owner == lease.owner)
                .values(released=True, expires_at=self.db.clock(conn))
            )

    def check_fence(self, batch_id: str, fence: int) -> None:
        """Raise :class:`FencedOutError` when a newer worker took the batch over."""
        current = self.get(batch_id)
        if current is None or current.fence != fence:
            raise fenced_out_error(
                batch_id, current.run_id if current else None, current.fence if current else None, fence
            )


def fenced_out_error(
    batch_id: str, run_id: str | None, current_fence: int | None, fence: int
) -> FencedOutError:
    """``run_id`` and ``current_fence``: the lease as read now (None: the batch has no lease row)."""
    now_at = "no lease" if current_fence is None else f"fence {current_fence}"
    return FencedOutError(
        f"batch {batch_id!r} was taken over by run {run_id or '?'} ({now_at}; this worker held "
        f"fence {fence}); this worker stops before sending anything more."
    )


def acquire_unless_live_run(
    store: LeaseStore,
    batch_id: str,
    run_id: str,
    run_ended: Callable[[str], bool],
    owner: str | None = None,
) -> Lease:
    """Take the batch's lease; a lease still held by a run recorded as ended is taken over at once.

    A daemon-launched worker never releases its lease (it cannot know when the run's end is
    recorded), so without this a "Re-execute from failure" in the UI, or a `job resume`, right
    after a failure would be refused until the dead run's lease lapsed. A run recorded as ended
    sends nothing more; were its worker somehow still alive (a forced termination), the new fence
    stops it.
    """
    try:
        return store.acquire(batch_id, run_id, owner)
    except LeaseHeldError:
        holder = store.get(batch_id)
        if holder is None or not run_ended(holder.run_id):
            raise
        store.release(holder)
        return store.acquire(batch_id, run_id, owner)


class Heartbeat:
    """Renews a lease from a daemon thread until stopped; notes when the lease was lost."""

    def __init__(self, store: LeaseStore, lease: Lease, interval_s: float | None = None) -> None:
        self.store = store
        self.lease = lease
        self.interval_s = interval_s if interval_s is not None else max(store.ttl_s / 3.0, 0.2)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{lease.batch_id}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if not self.store.renew(self.lease):
                    self.lost.set()
                    return
            except Exception:  # a database hiccup: try again next beat; expiry is the safety net
                continue

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if release and not self.lost.is_set():
            self.store.release(self.lease)


def _to_lease(row: sa.Row[Any], read_at: float) -> Lease:
    return replace(from_row(Lease, row, released=bool), read_at=read_at)
