"""A TCP proxy in front of the loopback S3 server that cuts connections on demand (failure injection).

``cut_after(n)``: the connection carrying the n-th byte (counted client to server from now) is reset
mid-stream, as a network drop would. ``fail_connections(k)``: the next k new connections get an
HTTP 503 after their request head, as an overloaded S3 endpoint answers.
"""

from __future__ import annotations

import socket
import struct
import threading


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


class CuttingProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self.bytes_up = 0  # client -> server, every connection
        self._cut_at: int | None = None
        self._fail_next = 0
        self.cuts = 0
        self.failed_with_503 = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut_after(self, n_bytes: int) -> None:
        with self._lock:
            self._cut_at = self.bytes_up + max(1, n_bytes)

    def disarm(self) -> None:
        with self._lock:
            self._cut_at = None

    @property
    def armed(self) -> bool:
        return self._cut_at is not None

    def fail_connections(self, count: int) -> None:
        with self._lock:
            self._fail_next = count

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            fail = self._fail_next > 0
            if fail:
                self._fail_next -= 1
        if fail:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    break
                head += chunk
            client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.failed_with_503 += 1
            client.close()
            return
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            _reset(client)
            return
        threading.Thread(target=self._pump_down, args=(upstream, client), daemon=True).start()
        self._pump_up(client, upstream)

    def _pump_up(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while chunk := client.recv(262144):
                with self._lock:
                    cut = self._cut_at is not None and self.bytes_up + len(chunk) >= self._cut_at
                    send = chunk[: self._cut_at - self.bytes_up] if cut and self._cut_at is not None else chunk
                    self.bytes_up += len(send)
                    if cut:
                        self._cut_at = None
                        self.cuts += 1
                if send:
                    upstream.sendall(send)
                if cut:
                    _reset(client)
                    _reset(upstream)
                    return
        except OSError:
            pass
        _reset(upstream)

    def _pump_down(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while chunk := upstream.recv(262144):
                client.sendall(chunk)
        except OSError:
            pass
        _reset(client)
