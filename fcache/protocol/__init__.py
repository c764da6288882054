"""fcache's wire contract: what an fcache process and fcache-server say to each other.

The protocol is `fcache.v1.Cache` (proto/fcache/v1/cache.proto), a gRPC service that
stores artifact envelopes under 32-hex-character keys: Get, Put, FindMissing, a Lease
stream for single flight across a cluster, and Stats. Artifacts travel as one BlobInfo
(key, size, checksum) and then chunks; the receiver verifies both before it uses or
stores anything. Fields are only ever added; an incompatible change is a new package
(fcache.v2).

- `limits`: what client and server must agree on (key pattern, chunk and batch sizes);
  plain Python, cheap to import.
- `wire`: method paths, chunking and the verifying `Assembler`, shared by both sides.
- `_gen`: the generated message stubs (`make proto`); nothing edits them by hand.

Importing this package imports nothing else: `wire` and `_gen` need protobuf, and only
the server tier (fcache.cache.remote) and service/ load them, never `import fcache`.
"""
