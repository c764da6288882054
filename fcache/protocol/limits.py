"""What the client and the server of the fcache.v1 protocol must agree on.

Keys, chunk and checksum sizes, the FindMissing batch bound and the largest artifact are
part of the wire contract (cache.proto): a client that sent more, or a server that
accepted less, would break the other side. Both import them from here, so neither
depends on the other.

Plain constants and a pure function: thread-safe, and importing this module loads
neither gRPC nor protobuf (`import fcache` uses the key check).
"""

from __future__ import annotations

import re

# A key is the 32 lowercase hex characters of an xxh3-128 digest, nothing before or after
# (`\Z`, not `$`: `$` would accept a trailing newline, a second name for the same digest).
KEY_PATTERN = re.compile(r"\A[0-9a-f]{32}\Z")

# 1 MiB keeps each message well under gRPC's 4 MiB default limit while amortizing the
# per-message cost; bazel-remote uses 2 MiB for the same reason.
CHUNK_BYTES = 1 << 20
# A transfer's checksum: the xxh3-128 digest of the whole envelope.
CHECKSUM_BYTES = 16
# FindMissing accepts at most this many keys per call (cache.proto).
FIND_MISSING_BATCH = 10_000
# The largest artifact either side handles: a server accepts no larger upload (whatever
# its own setting), and a client refuses a transfer that declares more before it receives
# a byte of it, so a declared size can never make the receiver allocate beyond this.
MAX_ARTIFACT_BYTES = 2 << 30


def is_valid_key(key: object) -> bool:
    return isinstance(key, str) and KEY_PATTERN.fullmatch(key) is not None
