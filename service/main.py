"""fcache-server's command line: flags, environment and file -> ServerConfig -> serve.

    fcache-server [--flags]              serve (`fcache-server --help` lists every flag)
    fcache-server backup PATH            copy the store while it serves (service.backup)
    fcache-server health [ADDR]          ask a server's health service (service.probe)

Exit status: 0 after a clean shutdown, 2 for an invalid setting (the message names it),
1 when the store cannot be opened. Everything the server says while it starts and runs
(where it listens, a flag that overrides the config file, warnings) goes through logging,
in one format, at --log-level; only an invalid setting, which stops it before it
starts, is a line on stderr.
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

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["backup"]:
        from service import backup

        return backup.main(args[1:], os.environ)
    if args[:1] == ["health"]:
        from service import probe

        return probe.main(args[1:])
    # Before `load`, which logs what overrides the config file: in this format too. The
    # level is the config's once it is known.
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        config = load(args, os.environ)
    except ConfigError as exc:
        print(f"fcache-server: {exc}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(config.log_level)
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
