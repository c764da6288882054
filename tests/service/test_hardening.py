"""Smaller hardening of fcache-server: lease times that are not numbers, stalled uploads,
the Unix socket's mode and owner, a second server on a socket path, plaintext tokens."""

from __future__ import annotations

import asyncio
import math
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from service.servicer import InvalidRequest, _next
from tests.service.support import ROOT, RawStub, StartServer, client, key_of


def test_a_nan_wait_is_refused(start_server: StartServer) -> None:
    # Issue #42: a wait that is not a finite number of seconds >= 0 is refused outright
    # (it was once taken as "no wait"; inf and -1 were granted).
    server = start_server("--max-lease", "5")
    holder = client(server.tcp)
    assert holder.acquire(key_of(1), 10.0) is not None
    raw = RawStub(server.tcp)
    call = raw._lease(pb.LeaseRequest(key=key_of(1), wait_seconds=math.nan), timeout=30)
    with pytest.raises(grpc.RpcError) as refused:
        list(call)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_stalled_upload_ends() -> None:
    async def stalled() -> AsyncIterator[object]:
        await asyncio.sleep(3600)
        yield None

    async def run() -> None:
        with pytest.raises(InvalidRequest, match="nothing received"):
            await _next(stalled(), 0.05, "Put")  # type: ignore[arg-type]

    asyncio.run(run())


def test_the_socket_is_0660_and_owned_by_the_server(start_server: StartServer) -> None:
    os.umask(0o000)  # the mode must not follow the umask
    try:
        server = start_server()
    finally:
        os.umask(0o022)
    info = os.stat(server.unix.removeprefix("unix:"))
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o660
    assert (info.st_uid, info.st_gid) == (os.geteuid(), os.getegid())
    tight = start_server("--socket-mode", "0600", name="tight")
    assert stat.S_IMODE(os.stat(tight.unix.removeprefix("unix:")).st_mode) == 0o600


def test_a_second_server_on_a_live_socket_path_refuses_to_start(
    start_server: StartServer, tmp_path: Path
) -> None:
    server = start_server()
    done = subprocess.run(
        [sys.executable, "-m", "service.main", "--db", str(tmp_path / "other"),
         "--listen", server.unix],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "another server is listening" in done.stderr
    assert RawStub(server.unix).find_missing([key_of(1)]) == [key_of(1)]  # still its own


def test_tokens_on_plaintext_tcp_are_warned_about(
    start_server: StartServer, tmp_path: Path
) -> None:
    (tmp_path / "write").write_text("secret\n")
    server = start_server("--write-token-file", str(tmp_path / "write"))
    assert "tokens are accepted over plaintext TCP" in server.output()
