"""Persisted counters: the stats database, summed over every process that recorded.

    stats   tier name -> JSON of `fcache.stats.Counters`

Transaction bodies for LmdbStore's `record`, `read_stats` and `clear_stats`; each runs in
one of its transactions, so concurrent recorders never lose each other's deltas. An
unreadable row is logged and counted from zero rather than failing the caller.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import lmdb

from fcache.cache.lmdb.env import Handle
from fcache.stats import Counters

log = logging.getLogger(__name__)


def _counters(raw: bytes) -> Counters:
    try:
        return Counters.from_dict(json.loads(raw))
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("unreadable persisted stats, counting from zero: %s", exc)
        return Counters()


def add_stats(txn: lmdb.Transaction, h: Handle, deltas: Mapping[str, Counters]) -> None:
    for tier, delta in deltas.items():
        raw = txn.get(tier.encode(), db=h.stats)
        counters = Counters() if raw is None else _counters(raw)
        counters.add(delta)
        txn.put(tier.encode(), json.dumps(counters.to_dict(), sort_keys=True).encode(), db=h.stats)


def read_stats(txn: lmdb.Transaction, h: Handle) -> dict[str, Counters]:
    return {k.decode(): _counters(raw) for k, raw in txn.cursor(db=h.stats)}


def clear_stats(txn: lmdb.Transaction, h: Handle) -> None:
    txn.drop(h.stats, delete=False)
