"""Network fault injection for the fault tests: a server that answers garbage, and a TCP
proxy that forwards, drops or stalls traffic on command (what toxiproxy does)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc

from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb


class FakeServer:
    """An fcache.v1.Cache server whose Get and Lease answer whatever `answer(key)` yields
    (a list of Transfer messages); every other method is unimplemented."""

    def __init__(self, answer: Callable[[str], list[pb.Transfer]]) -> None:
        self.answer = answer
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(4))

        def get(request: pb.GetRequest, context: grpc.ServicerContext) -> Iterator[pb.Transfer]:
            self.calls += 1
            yield from self.answer(request.key)

        def lease(
            request: pb.LeaseRequest, context: grpc.ServicerContext
        ) -> Iterator[pb.LeaseEvent]:
            self.calls += 1
            for message in self.answer(request.key):
                part = message.WhichOneof("part")
                if part == "info":
                    yield pb.LeaseEvent(info=message.info)
                elif part == "chunk":
                    yield pb.LeaseEvent(chunk=message.chunk)

        handler = grpc.method_handlers_generic_handler(
            wire.SERVICE,
            {
                "Get": grpc.unary_stream_rpc_method_handler(
                    get, pb.GetRequest.FromString, pb.Transfer.SerializeToString
                ),
                "Lease": grpc.unary_stream_rpc_method_handler(
                    lease, pb.LeaseRequest.FromString, pb.LeaseEvent.SerializeToString
                ),
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self._server.start()

    def stop(self) -> None:
        self._server.stop(0)


class Proxy:
    """A TCP proxy to `target`. mode "forward" passes bytes; "blackhole" accepts and holds
    connections but forwards nothing and drops what arrives (a dead network path)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self.mode = "forward"
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._sockets += [conn, upstream]
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.mode == "forward":
                    dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
