"""Artifacts on the fcache.v1 wire: method paths, chunking, and verified reassembly.

Shared by the client (fcache.cache.remote) and the server (service/), so that both frame
and check transfers the same way. A transfer is one `BlobInfo` (key, size, checksum)
followed by chunks of at most `CHUNK_BYTES`; `Assembler` rebuilds the bytes and refuses
anything that contradicts the BlobInfo, so no caller ever holds unverified bytes.

Importing this module imports the generated stubs (and so needs protobuf >= 7.35.1);
only fcache.cache.remote and service/ import it, lazily, never `import fcache`.
"""

from __future__ import annotations

from collections.abc import Iterator

import xxhash

from fcache.errors import CorruptArtifact
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.protocol.limits import CHECKSUM_BYTES, CHUNK_BYTES, MAX_ARTIFACT_BYTES

SERVICE = pb.DESCRIPTOR.services_by_name["Cache"].full_name  # "fcache.v1.Cache"


def method_path(name: str) -> str:
    """'/fcache.v1.Cache/Get' for 'Get'; KeyError for a method the proto does not declare."""
    method = pb.DESCRIPTOR.services_by_name["Cache"].methods_by_name[name]
    return f"/{SERVICE}/{method.name}"


def checksum(data: bytes | memoryview) -> bytes:
    """The transfer checksum of cache.proto: xxh3-128 of the whole envelope bytes, the
    16-byte big-endian digest."""
    return xxhash.xxh3_128(data).digest()


def blob_info(key: str, data: bytes | memoryview) -> pb.BlobInfo:
    return pb.BlobInfo(key=key, size=len(data), checksum=checksum(data))


def chunks(data: bytes | memoryview) -> Iterator[bytes]:
    """The chunks of one transfer, in order; none for empty data."""
    view = memoryview(data)
    for start in range(0, len(view), CHUNK_BYTES):
        yield bytes(view[start : start + CHUNK_BYTES])


def transfer(info: pb.BlobInfo, data: bytes | memoryview) -> Iterator[pb.Transfer]:
    """The messages of one Get answer or Put upload: `info`, then the chunks of data."""
    yield pb.Transfer(info=info)
    for chunk in chunks(data):
        yield pb.Transfer(chunk=chunk)


class Assembler:
    """Rebuilds one artifact from chunks and checks it against its BlobInfo.

    Not thread-safe; one per transfer. Raises CorruptArtifact, naming the key, at once if
    the declared size exceeds `max_size` (the receiver's own limit: a sender's say-so never
    makes it hold more), as soon as the chunks exceed the declared size, and in `finish` on
    a short transfer or a checksum mismatch.
    """

    def __init__(
        self,
        info: pb.BlobInfo,
        expected_key: str | None = None,
        max_size: int = MAX_ARTIFACT_BYTES,
    ) -> None:
        if expected_key is not None and info.key != expected_key:
            raise CorruptArtifact(f"asked for {expected_key!r}, received {info.key!r}")
        if info.size > max_size:
            raise CorruptArtifact(
                f"{info.key!r} is declared {info.size} bytes; this side takes at most {max_size}"
            )
        if len(info.checksum) != CHECKSUM_BYTES:
            raise CorruptArtifact(
                f"checksum of {info.key!r} is {len(info.checksum)} bytes, not {CHECKSUM_BYTES}"
            )
        self.info = info
        # One buffer of the declared size (checked against max_size above), filled chunk
        # by chunk: the transfer is held once, never as chunks plus their join, and never
        # in a buffer over-allocated by growing.
        self._buffer = bytearray(info.size)
        self._received = 0

    def add(self, chunk: bytes) -> None:
        start = self._received
        self._received += len(chunk)
        if self._received > self.info.size:
            raise CorruptArtifact(
                f"{self.info.key!r}: received more than the declared {self.info.size} bytes"
            )
        self._buffer[start : self._received] = chunk

    def finish(self) -> bytes:
        """The verified artifact as bytes (one copy of the buffer)."""
        return bytes(self.finish_view())

    def finish_view(self) -> memoryview:
        """The verified artifact as a read-only view of the receive buffer, no copy: for
        a receiver that bounds its memory (fcache-server)."""
        if self._received != self.info.size:
            raise CorruptArtifact(
                f"{self.info.key!r}: received {self._received} of {self.info.size} bytes"
            )
        view = memoryview(self._buffer).toreadonly()
        self._buffer = bytearray()
        if checksum(view) != self.info.checksum:
            raise CorruptArtifact(f"{self.info.key!r}: checksum mismatch")
        return view
