"""PeerCheckedSocket: fcache-server's Unix socket, open only to the users it names.

gRPC's Python server cannot tell who is at the other end of a Unix socket connection (it
reports "unix:" and no credentials), and file modes alone are a weak lock: a socket can
be reached through a file descriptor passed on, from another mount or user namespace, or
after a mode set by a careless umask. So fcache-server does not let gRPC listen on the
public socket. gRPC listens on a socket in a private directory (0700, made per server),
and this listener owns the public path: for each connection it asks the kernel who the
peer is (SO_PEERCRED: pid, uid, gid, which the peer cannot forge), closes it at once
unless the `PeerPolicy` allows that user, and otherwise splices the bytes both ways
between the peer and gRPC's private socket (`os.splice` through a pipe: the kernel copies,
the GIL is released). A refused peer sees its connection closed (the client reports
UNAVAILABLE) and is counted `rejected`.

Allowed: root, the server's own user, and members of the socket's group (the peer's
primary group, or a supplementary group of the peer's user in the group database). The
socket file itself is created with `mode` (0660 by default) and that group, under a
temporary name then renamed into place, so it is never reachable with looser modes.

Threads: one accepting, two per connection (connections are few and long-lived: one or
two per client process). `close()` stops accepting at once; `close_connections()` ends
those still open (after the gRPC server drained them). Linux only (SO_PEERCRED).
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_SPLICE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class PeerPolicy:
    """Who may connect: root, `owner`, and members of group `gid`."""

    owner: int
    gid: int

    def allows(self, uid: int, gid: int) -> bool:
        if uid in (0, self.owner) or gid == self.gid:
            return True
        try:
            user = pwd.getpwuid(uid).pw_name
            return self.gid in os.getgrouplist(user, gid)
        except KeyError:  # a uid with no passwd entry: its primary group is all we know
            return False


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket connection."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid, gid


def group_id(name: str | None) -> int:
    """The gid of a group name or number; the server's own group when None."""
    if name is None:
        return os.getegid()
    return int(name) if name.isdigit() else grp.getgrnam(name).gr_gid


class PeerCheckedSocket:
    """Listens on `path`, forwards allowed peers to `backend` (gRPC's private socket)."""

    def __init__(
        self,
        path: str,
        backend: str,
        policy: PeerPolicy,
        mode: int = 0o660,
        on_refused: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.path = path
        self._backend = backend
        self._policy = policy
        self._mode = mode
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._open: set[_Link] = set()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Create the socket file (mode and group set before it appears) and accept.
        Raises OSError if the path cannot be bound, or a live server already answers there."""
        if _answers(self.path):
            raise OSError(f"another server is listening on {self.path}")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        staging = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
        try:
            listener.bind(staging)
            os.chmod(staging, self._mode)
            os.chown(staging, -1, self._policy.gid)
            os.rename(staging, self.path)
        except OSError:
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging)
            raise
        listener.listen(128)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="fcache-peercheck", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting and remove the socket file; open connections go on."""
        listener, self._listener = self._listener, None
        if listener is None:
            return
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self._thread is not None:
            self._thread.join(5)

    def close_connections(self) -> None:
        """End every forwarded connection (after the server has drained its calls)."""
        with self._lock:
            links, self._open = list(self._open), set()
        for link in links:
            link.close()

    def _accept(self) -> None:
        while True:
            listener = self._listener
            if listener is None:
                return
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                self._admit(conn)
            except OSError as exc:
                log.warning("unix socket connection dropped: %s", exc)
                conn.close()

    def _admit(self, conn: socket.socket) -> None:
        pid, uid, gid = peer_credentials(conn)
        if not self._policy.allows(uid, gid):
            log.warning(
                "refused a connection on %s from pid %d uid %d gid %d", self.path, pid, uid, gid
            )
            if self._on_refused is not None:
                self._on_refused(pid, uid, gid)
            conn.close()
            return
        backend = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            backend.connect(self._backend)
        except OSError:
            backend.close()
            raise
        link = _Link(conn, backend)
        with self._lock:
            self._open.add(link)
        for src, dst in ((conn, backend), (backend, conn)):
            threading.Thread(
                target=self._pump, args=(link, src, dst), name="fcache-peercheck-io", daemon=True
            ).start()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        """Copy src to dst until src ends, then end dst's writing half; the second
        direction to end closes the link."""
        read_end, write_end = os.pipe()
        try:
            while True:
                n = os.splice(src.fileno(), write_end, _SPLICE_BYTES)
                if n == 0:
                    break
                while n:
                    n -= os.splice(read_end, dst.fileno(), n)
        except OSError:
            pass  # reset, or closed by close_connections
        finally:
            os.close(read_end)
            os.close(write_end)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with self._lock:
                link.ended += 1
                last = link.ended == 2
                if last:
                    self._open.discard(link)
            if last:
                link.close()


class _Link:
    """One forwarded connection: the peer's socket and the one to gRPC."""

    def __init__(self, peer: socket.socket, backend: socket.socket) -> None:
        self.peer = peer
        self.backend = backend
        self.ended = 0

    def close(self) -> None:
        for sock in (self.peer, self.backend):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _answers(path: str) -> bool:
    """Whether something accepts connections on the Unix socket at path."""
    if not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()
