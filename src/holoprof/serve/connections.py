"""The dashboard server's connection limits: a thread per connection, at most ``max_connections`` of
them, and no connection kept waiting for a request for longer than ``request_timeout_s``.

* **Waiting for a request.** From the moment a connection is accepted, or has been answered and is
  kept alive for the next request, the client has ``request_timeout_s`` to send that request's line
  and headers (and, for a POST, its body); then the server closes the connection. So an idle
  keep-alive connection, a silent one and one that sends half a request (slowly or not at all) are
  all closed after ``request_timeout_s``. The deadline is enforced by the serving loop (it shuts the
  socket down), not only by the socket's timeout, so a client that trickles a byte at a time gains
  nothing.
* **Answering.** While a request is answered there is no deadline: an answer may take as long as it
  needs (a report built, a large artifact streamed), as long as the client keeps reading: each write
  of at most :data:`WRITE_CHUNK` bytes must go out within ``request_timeout_s``.
* **Too many connections.** At most ``max_connections`` connections are served at once (one thread
  each); a connection over that is answered at once with ``503 Service Unavailable``, ``Retry-After:
  1`` and ``Connection: close`` by the serving loop itself (no thread), which then closes it. Since
  idle connections are closed after ``request_timeout_s``, a slot frees within that time at most.

Nothing the dashboard does needs a connection to stay idle: it polls (every 1.5 s for a running run,
every 5–6 s otherwise) and nothing streams or long-polls; a browser reopens a closed keep-alive
connection by itself.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REQUEST_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
#: A refused connection is closed once the client has closed its side, or after this long.
LINGER_S = 1.0
#: Answers are written in pieces of at most this many bytes, each within the timeout.
WRITE_CHUNK = 64 * 1024


@dataclass
class _Conn:
    sock: socket.socket
    #: while the server waits for a request (or a body): when the connection is closed; else None
    deadline: float | None


class LimitedServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with the limits of the module's docstring."""

    daemon_threads = True
    request_queue_size = 128  # connections the kernel holds until they are accepted

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.request_timeout_s = float(request_timeout_s)
        self.max_connections = int(max_connections)
        self._conns: dict[int, _Conn] = {}
        self._conns_lock = threading.Lock()
        self._lingering: list[tuple[socket.socket, float]] = []
        super().__init__(address, handler)

    # called by the handler ---------------------------------------------------------------------------
    def waiting(self, sock: socket.socket) -> None:
        """The connection waits for a request (or a body): it has request_timeout_s from now."""
        with self._conns_lock:
            conn = self._conns.get(id(sock))
            if conn is not None:
                conn.deadline = time.monotonic() + self.request_timeout_s

    def answering(self, sock: socket.socket) -> None:
        """The request has been read: no deadline while it is answered."""
        with self._conns_lock:
            conn = self._conns.get(id(sock))
            if conn is not None:
                conn.deadline = None

    def connections(self) -> int:
        """How many connections are being served (each has a thread)."""
        with self._conns_lock:
            return len(self._conns)

    # socketserver's hooks -----------------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            full = len(self._conns) >= self.max_connections
            if not full:
                deadline = time.monotonic() + self.request_timeout_s
                self._conns[id(request)] = _Conn(request, deadline)
        if full:
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def service_actions(self) -> None:
        """Run by serve_forever between requests (every poll interval): closes the connections whose
        request is late, and the refused ones whose time is up."""
        super().service_actions()
        now = time.monotonic()
        with self._conns_lock:
            late = [c for c in self._conns.values() if c.deadline is not None and c.deadline <= now]
            for c in late:
                c.deadline = None  # once: its thread sees the end of the stream and closes it
        for c in late:
            _shutdown(c.sock)
        self._linger(now)

    def server_close(self) -> None:
        """Close the listening socket and every connection (ThreadingMixIn then joins their threads,
        which end at once)."""
        with self._conns_lock:
            socks = [c.sock for c in self._conns.values()]
        for sock in socks:
            _shutdown(sock)
        for sock, _ in self._lingering:
            sock.close()
        self._lingering = []
        super().server_close()

    # the rest -----------------------------------------------------------------------------------------
    def _forget(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.pop(id(request), None)

    def _refuse(self, sock: socket.socket) -> None:
        """Answer 503 without a thread (a few hundred bytes fit in a fresh socket's buffer), then
        linger: read what the client sends until it closes, so that closing does not reset the
        connection before the client has read the answer."""
        body = json.dumps(
            {
                "error": f"the dashboard serves at most {self.max_connections} connections at once; retry",
                "status": 503,
            }
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\r\n"
        ).encode()
        try:
            sock.setblocking(False)
            sock.send(head + body)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        self._lingering.append((sock, time.monotonic() + LINGER_S))
        while len(self._lingering) > 4 * self.max_connections:
            self._lingering.pop(0)[0].close()

    def _linger(self, now: float) -> None:
        keep = []
        for sock, until in self._lingering:
            if _drained(sock) or now >= until:
                sock.close()
            else:
                keep.append((sock, until))
        self._lingering = keep


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _drained(sock: socket.socket) -> bool:
    """Read what a refused client sent (a little at a time); True once it closed its side."""
    for _ in range(4):
        try:
            if not sock.recv(65536):
                return True
        except BlockingIOError:
            return False
        except OSError:
            return True
    return False
