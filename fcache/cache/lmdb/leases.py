"""Single-flight leases among the processes sharing one LMDB directory.

The leases database holds, per key being compiled, a JSON `LeaseRecord`: who holds it
(a holder id unique per grant), in which pid space and process, and until when. A lease
is live while its process runs and its deadline has not passed; a dead holder's lease,
or one past its deadline, is taken over by the next acquirer. Comparing process start
times catches a pid that the kernel has handed to a new process since.

The functions taking a transaction are transaction bodies for LmdbStore's `acquire` and
`release`, which poll and count; they run inside its transactions. Pure functions of the
records and /proc otherwise: thread-safe. A record this version cannot read counts as
abandoned.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from dataclasses import dataclass

import lmdb

from fcache.cache.lmdb.env import Handle
from fcache.cache.store import LeaseGrant

log = logging.getLogger(__name__)

# Lease polling: quick at first (most compiles of a region take a second or less), then
# at most four times a second per waiter so that many waiting ranks cost little.
POLL_FIRST_S = 0.02
POLL_MAX_S = 0.25
POLL_GROWTH = 1.5


def _pid_space() -> str:
    """Where a pid names the same process: this boot of this machine and this pid
    namespace (containers on one node may share a directory but not their pids). The
    hostname stands in where /proc cannot tell."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return socket.gethostname()


_HOST = socket.gethostname()
_PID_SPACE = _pid_space()


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What the leases database holds per key (as JSON)."""

    holder: str  # unique per grant
    host: str  # for people reading the record
    pid_space: str  # see _pid_space
    pid: int
    start: int | None  # process start time in clock ticks since boot, None without /proc
    deadline: float  # seconds since the epoch

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseRecord | None:
        """None for a record this version cannot read; such a lease counts as abandoned."""
        try:
            raw = json.loads(data)
            start = raw["start"]
            return cls(
                holder=str(raw["holder"]),
                host=str(raw["host"]),
                pid_space=str(raw["pid_space"]),
                pid=int(raw["pid"]),
                start=None if start is None else int(start),
                deadline=float(raw["deadline"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def is_live(self, now: float) -> bool:
        """Held by a running process and not past its deadline. A holder in another pid
        space (another container, or another machine on a network share, which LMDB does
        not support anyway) cannot be checked, so only the deadline ends its lease."""
        if now >= self.deadline:
            return False
        return self.pid_space != _PID_SPACE or process_is(self.pid, self.start)


def process_start(pid: int) -> int | None:
    """Start time of a running process (/proc/<pid>/stat field 22); None if there is no
    such process, it is a zombie, or the system has no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name (field 2) may hold spaces and parentheses: split after it.
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    if fields[0] in (b"Z", b"X"):  # exited, not yet reaped by its parent
        return None
    return int(fields[19])


def process_is(pid: int, start: int | None) -> bool:
    """Whether process `pid`, started at `start`, still runs. Comparing start times
    catches a pid that the kernel has handed to a new process since."""
    if os.path.isdir("/proc/self"):
        started = process_start(pid)
        return started is not None and (start is None or started == start)
    try:  # no /proc (macOS): existence is all we can learn
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _new_lease(hold_s: float) -> LeaseRecord:
    pid = os.getpid()
    # Random per grant, so that a holder whose lease was taken over (deadline passed)
    # cannot release its successor's, even one in the same process.
    holder = f"{_HOST}/{pid}/{os.urandom(6).hex()}"
    return LeaseRecord(
        holder=holder,
        host=_HOST,
        pid_space=_PID_SPACE,
        pid=pid,
        start=process_start(pid),
        deadline=time.time() + hold_s,
    )


# --- transaction bodies -------------------------------------------------------------------


def try_lease(
    txn: lmdb.Transaction, h: Handle, k: bytes, hold_s: float
) -> bytes | LeaseGrant | LeaseRecord:
    """The stored artifact, a new grant, or the live record of the current holder."""
    data = txn.get(k, db=h.artifacts)
    if data is not None:
        return data
    raw = txn.get(k, db=h.leases)
    current = None if raw is None else LeaseRecord.from_bytes(raw)
    if current is not None and current.is_live(time.time()):
        return current
    if current is not None:
        log.info("taking over the lease of %s from %s", k.decode(), current.holder)
    record = _new_lease(hold_s)
    txn.put(k, record.to_bytes(), db=h.leases)
    return LeaseGrant(k.decode(), record.holder)


def lease_changed(txn: lmdb.Transaction, h: Handle, k: bytes, record: LeaseRecord) -> bool:
    """Whether the artifact is stored, or `record` is no longer the key's live lease."""
    if txn.cursor(db=h.artifacts).set_key(k):
        return True
    raw = txn.get(k, db=h.leases)
    current = None if raw is None else LeaseRecord.from_bytes(raw)
    return current != record or not record.is_live(time.time())


def drop_lease(txn: lmdb.Transaction, h: Handle, k: bytes, holder: str) -> None:
    """Remove the lease record of `k` if it is still `holder`'s (not taken over since)."""
    raw = txn.get(k, db=h.leases)
    record = None if raw is None else LeaseRecord.from_bytes(raw)
    if record is not None and record.holder == holder:
        txn.delete(k, db=h.leases)
