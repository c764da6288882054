"""Single flight across nodes: a compile lease per key in Redis.

`RedisLeases` is the Leases half of RedisStore (fcache.cache.store.Leases), mixed into it:

- A lease is `SET fcache:v1:{KEY}:lease TOKEN NX PX ttl`: of every process (or node
  server) that asks at once, exactly one gets it. The token names the holder (host, pid and
  a random part) and is what releasing and renewing compare against.
- While held, a lease is renewed every third of its ttl by one background thread per
  store (Lua compare-and-PEXPIRE), so a compile may take longer than the ttl; a holder
  that dies (SIGKILL, a lost node) stops renewing and its lease lapses within `ttl`, after
  which the next asker takes it over and compiles.
- Release is Lua compare-and-delete: only the token's holder removes the lease, so a
  holder whose lease lapsed (a stall past the ttl) cannot release its successor's.
- A waiter polls (50 ms, doubling to 1 s): the artifact, once the holder put it, ends the
  wait with its bytes; a free lease is taken over. Polling needs nothing but GET and SET,
  which every Redis, Cluster and proxy supports, and a lost message cannot strand it.

Two levels of use: `acquire` (the Leases protocol: blocks, for fcache processes that use
Redis directly) and the steps `try_lease`, `release`, `get` on their own (fcache-server,
which waits on its event loop, service.cluster). Failures raise StoreUnavailable through
the store's `_call` (breaker, counting): the tiered cache then falls back to its local
leases. Thread-safe; a forked child holds none of its parent's leases.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from fcache.cache.redis import layout
from fcache.cache.store import LeaseGrant
from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats

log = logging.getLogger(__name__)

T = TypeVar("T")
POLL_FIRST_S = 0.05
POLL_MAX_S = 1.0


class RedisLeases:
    """try_lease/acquire/release over Redis; needs the RedisStore it is mixed into."""

    # Provided by RedisStore.
    name: str
    _stats: CacheStats
    _lease_ttl_ms: int
    _scripts: dict[str, Any]

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        raise NotImplementedError

    def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def _init_leases(self) -> None:
        self._lease_lock = threading.Lock()
        self._held: dict[str, LeaseGrant] = {}  # token -> grant
        self._renewer: threading.Thread | None = None
        self._holder = f"{socket.gethostname()}:{os.getpid()}"

    # -- steps -------------------------------------------------------------------------

    def try_lease(self, key: str) -> LeaseGrant | None:
        """Take the key's lease if nobody holds it: a grant (renewed until released), or
        None when another holder has it. Raises StoreUnavailable."""
        token = f"{self._holder}:{uuid.uuid4().hex}"
        taken = self._call(
            f"lease {key}",
            lambda c: c.set(layout.lease_key(key), token, nx=True, px=self._lease_ttl_ms),
        )
        if not taken:
            return None
        grant = LeaseGrant(key=key, holder=token)
        with self._lease_lock:
            self._held[token] = grant
            if self._renewer is None:
                self._renewer = threading.Thread(
                    target=self._renew_while_held, name="fcache-redis-leases", daemon=True
                )
                self._renewer.start()
        self._stats.add(self.name, lease_grants=1)
        return grant

    def release(self, grant: LeaseGrant) -> None:
        """Give the lease up (compare-and-delete: a lapsed holder removes nothing). Raises
        StoreUnavailable; the lease then lapses by itself within its ttl."""
        with self._lease_lock:
            self._held.pop(grant.holder, None)
        self._call(
            f"release {grant.key}",
            lambda c: self._scripts["release"](
                keys=[layout.lease_key(grant.key)], args=[grant.holder], client=c
            ),
        )

    def holds(self, grant: LeaseGrant) -> bool:
        """Whether this store still renews `grant` (False once released, or lost)."""
        with self._lease_lock:
            return grant.holder in self._held

    # -- the Leases protocol ------------------------------------------------------------

    def acquire(
        self, key: str, wait_s: float, waiting: Callable[[], None] | None = None
    ) -> LeaseGrant | bytes | None:
        """A grant, the artifact's bytes once another holder put them, or None after wait_s
        (see Leases in fcache.cache.store). Bytes are checked against their frame; the
        envelope is the caller's to verify."""
        outcome = self._lease_or_bytes(key)
        if outcome is not None:
            return outcome
        self._stats.add(self.name, lease_waits=1)
        if waiting is not None:
            waiting()
        deadline = time.monotonic() + wait_s
        delay = POLL_FIRST_S
        while (remaining := deadline - time.monotonic()) > 0:
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, POLL_MAX_S)
            data = self.get(key)
            if data is not None:
                return data
            outcome = self._lease_or_bytes(key)
            if outcome is not None:
                return outcome
        return None

    def _lease_or_bytes(self, key: str) -> LeaseGrant | bytes | None:
        """The lease if free, unless the artifact landed just before it was freed (then
        its bytes, and the lease given back); None while another holder has it."""
        grant = self.try_lease(key)
        if grant is None:
            return None
        data = self.get(key)
        if data is None:
            return grant
        self.release(grant)
        return data

    # -- renewal -------------------------------------------------------------------------

    def _renew_while_held(self) -> None:
        """Renew every held lease every third of the ttl; exit when none is held."""
        interval = self._lease_ttl_ms / 3000
        while True:
            time.sleep(interval)
            with self._lease_lock:
                held = list(self._held.values())
                if not held:
                    self._renewer = None
                    return
            for grant in held:
                self._renew(grant)

    def _renew(self, grant: LeaseGrant) -> None:
        try:
            kept = self._call(
                f"renew {grant.key}",
                lambda c: self._scripts["renew"](
                    keys=[layout.lease_key(grant.key)],
                    args=[grant.holder, self._lease_ttl_ms],
                    client=c,
                ),
            )
        except StoreUnavailable:
            return  # counted; tried again next round, and the lease may lapse meanwhile
        with self._lease_lock:
            if kept or grant.holder not in self._held:
                return
            self._held.pop(grant.holder, None)
        log.warning(
            "fcache: the Redis lease of %s lapsed while compiling (Redis restarted, or this "
            "process stalled longer than the lease's ttl); another node may compile it too",
            grant.key,
        )

    def _leases_after_fork(self) -> None:
        # A child holds none of its parent's leases, and has no renewal thread. (Also on
        # close: a renewal thread finds nothing held and exits.)
        self._lease_lock = threading.Lock()
        self._held = {}
        self._renewer = None
        self._holder = f"{socket.gethostname()}:{os.getpid()}"
