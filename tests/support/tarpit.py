"""A webhook receiver that answers one byte at a time (a tarpit), on loopback, over real TCP.

It reads each request whole, then writes a 200 answer one byte every `interval` seconds: from its
first byte ("headers": the status line itself drips) or after promptly sent headers ("body": a
Content-Length of `body_bytes` that arrives drop by drop). Each byte comes well within any per-read
timeout, so only a deadline on the whole attempt ends it. chaos S8 runs it for one tenant.
"""

from __future__ import annotations

import select
import socket
import threading
import time

from tests.support.processes import free_port


class Tarpit:
    def __init__(self, interval: float = 0.5, drip: str = "headers", body_bytes: int = 2000):
        self.interval = interval
        self.drip = drip
        self.body_bytes = body_bytes
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks/slow"
        self.requests = 0
        self.open_connections = 0
        self.most_open = 0  # the most connections open at once: the attempts in flight to it
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._server = socket.create_server(("127.0.0.1", self.port), backlog=64)
        self._server.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True, name="tarpit").start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            body += chunk
        return True

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self.open_connections += 1
            self.most_open = max(self.most_open, self.open_connections)
        try:
            conn.settimeout(60)
            if not self._read_request(conn):
                return
            with self._lock:
                self.requests += 1
            body = b"x" * self.body_bytes
            answer = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            if self.drip == "body":
                conn.sendall(answer)
                answer = body
            else:
                answer += body
            for byte in answer:
                if self._caller_gone(conn, self.interval):
                    return
                conn.sendall(bytes([byte]))
        except OSError:
            pass  # the caller gave up and closed: what a tarpit is for
        finally:
            conn.close()
            with self._lock:
                self.open_connections -= 1

    def _caller_gone(self, conn: socket.socket, seconds: float) -> bool:
        """Waits `seconds`; True as soon as the caller shuts down or closes its end (or the tarpit stops). Seen at the
        caller's FIN, not at the next byte's failed send: otherwise an attempt cut at its deadline would still count
        as open while the caller's next attempt starts, and `most_open` would count one attempt twice."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0 and not self._stopped.is_set():
            readable, _, _ = select.select([conn], [], [], min(left, 0.2))
            if readable:
                try:
                    if not conn.recv(65536):
                        return True
                except OSError:
                    return True
        return self._stopped.is_set()

    def connections(self) -> int:
        with self._lock:
            return self.open_connections

    def wait_closed(self, seconds: float) -> bool:
        """True once every connection the caller opened has been closed by it."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if self.connections() == 0:
                return True
            time.sleep(0.05)
        return self.connections() == 0

    def stop(self) -> None:
        self._stopped.set()
        self._server.close()
