"""Token authentication: who may read, who may also write.

A caller sends `authorization: Bearer <token>` as call metadata. Tokens come from two
files, one token a line: read tokens may call Get, FindMissing and Stats; write tokens
may also call Put, Lease and Report (a lease promises a Put, a report drops an entry).
The health service is always open, so that probes need no secret. Refusals end the call before the
servicer sees it: UNAUTHENTICATED for a missing or unknown token, PERMISSION_DENIED for
a read token calling a write method, each counted as `rejected`.

Tokens are compared with hmac.compare_digest, so a wrong token's timing does not reveal
how much of it was right.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc
from grpc import aio

from fcache.errors import ConfigError
from fcache.protocol import wire
from fcache.stats import CacheStats

WRITE_METHODS = frozenset(wire.method_path(name) for name in ("Put", "Lease", "Report"))
OPEN_SERVICES = ("/grpc.health.v1.Health/",)
_BEARER = "bearer "


class Access(enum.IntEnum):
    NONE = 0
    READ = 1
    WRITE = 2


class Tokens:
    """The accepted tokens. Immutable after construction; safe to share between threads."""

    def __init__(self, read: Sequence[str], write: Sequence[str]) -> None:
        self._read = tuple(t.encode() for t in read)
        self._write = tuple(t.encode() for t in write)

    @classmethod
    def from_files(cls, read_file: Path | None, write_file: Path | None) -> Tokens | None:
        """The tokens in the files; None (no authentication) when neither is given."""
        if read_file is None and write_file is None:
            return None
        read = _read_tokens("read_token_file", read_file) if read_file else []
        write = _read_tokens("write_token_file", write_file) if write_file else []
        return cls(read, write)

    def access(self, token: str | None) -> Access:
        if not token:
            return Access.NONE
        given = token.encode()
        # Every comparison runs, so the time taken does not say which list matched.
        is_write = _any_equal(given, self._write)
        is_read = _any_equal(given, self._read)
        if is_write:
            return Access.WRITE
        return Access.READ if is_read else Access.NONE


def _any_equal(given: bytes, tokens: Sequence[bytes]) -> bool:
    found = False
    for token in tokens:
        found |= hmac.compare_digest(given, token)
    return found


def _read_tokens(setting: str, path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(setting, str(path), f"a readable token file ({exc})") from None
    tokens = [line.strip() for line in lines if line.strip()]
    if not tokens:
        raise ConfigError(setting, str(path), "a file with at least one token")
    return tokens


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for name, value in metadata or ():
        if (
            name == "authorization"
            and isinstance(value, str)
            and value[: len(_BEARER)].lower() == _BEARER
        ):
            return value[len(_BEARER) :].strip()
    return None


class AuthInterceptor(aio.ServerInterceptor):
    """Refuses calls whose token does not grant the method's access."""

    def __init__(self, tokens: Tokens, stats: CacheStats, tier: str) -> None:
        self._tokens = tokens
        self._stats = stats
        self._tier = tier

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = details.method
        handler = await continuation(details)
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        access = self._tokens.access(bearer_token(details.invocation_metadata))
        needed = Access.WRITE if method in WRITE_METHODS else Access.READ
        if access >= needed:
            return handler
        self._stats.add(self._tier, rejected=1)
        if access is Access.NONE:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, "missing or unknown token")
        return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED, f"{method} needs a write token")


def _refusal(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call with `code`.

    Same shape, so that gRPC reads the request the way the real method would; requests
    are not deserialized (the refusal does not look at them)."""

    async def refuse(request: object, context: aio.ServicerContext) -> None:
        await context.abort(code, details)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
