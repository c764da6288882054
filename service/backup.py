"""`fcache-server backup PATH`: a consistent copy of a server's store, taken while it serves.

    fcache-server backup /backups/fcache-2024-06-01 [--db DIR] [--config FILE]

The store is found as the server finds it (--db, FCACHE_SERVER_DB, or the config file).
LMDB copies one read transaction's snapshot, compacted (free pages left out), so the copy
holds every entry committed before the backup began and none half-written, whatever the
server commits meanwhile; the server is not paused. PATH must be new or empty. Restore by
serving the copy (`fcache-server --db PATH`) or by putting its `lmdb.v1` directory in
place of the old one while no server runs.

Exit status: 0 once the copy is complete, 2 for a bad argument or setting, 1 when the
store cannot be read or the copy cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from fcache.cache.lmdb import LmdbStore
from fcache.errors import ConfigError, StoreUnavailable
from service.config import load

# The backup needs only the store's settings; this stands in for the listeners that
# `load` validates (nothing is bound).
_NO_LISTENER = ("--listen", "unix:/nonexistent/fcache-server-backup.sock")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fcache-server backup",
        description="Copy the store (consistent, compacted) while the server runs.",
    )
    p.add_argument("path", help="new or empty directory to copy the store into")
    p.add_argument("--db", help="the server's store (default: as the server finds it)")
    p.add_argument("--config", help="the server's config file")
    return p


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)
    flags = [*_NO_LISTENER]
    if args.db:
        flags += ["--db", args.db]
    if args.config:
        flags += ["--config", args.config]
    try:
        config = load(flags, environ)
        if not config.db.is_dir():
            raise ConfigError("db", str(config.db), "the directory of an existing store")
        store = LmdbStore(config.db, config.max_bytes)
        try:
            target = store.backup(Path(args.path))
        finally:
            store.close()
        copy = LmdbStore(Path(args.path), config.max_bytes)
        try:
            entries, size = len(copy.entries()), copy.total_bytes()
        finally:
            copy.close()
    except (ConfigError, ValueError) as exc:
        print(f"fcache-server backup: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(f"fcache-server backup: {exc}", file=sys.stderr)
        return 1
    print(f"backed up {entries} entries ({size} bytes) to {target}")
    return 0
