"""fcache-server's command line: flags, environment and file -> ServerConfig -> serve.

Exit status: 0 after a clean shutdown, 2 for an invalid setting (the message names it),
1 when the store cannot be opened. `fcache-server backup PATH` copies the store instead
(service.backup).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from fcache.errors import ConfigError, StoreUnavailable
from service.config import load
from service.server import serve


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["backup"]:
        from service import backup

        return backup.main(args[1:], os.environ)
    try:
        config = load(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"fcache-server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(serve(config))
    except ConfigError as exc:
        print(f"fcache-server: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(f"fcache-server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
