"""A counting relay in front of the suite's Docker daemon, to see what a command asked it.

``CountingDockerProxy`` listens on a unix socket and relays every byte, both ways, to the
real daemon's socket, so the client speaks the real Docker API to the real daemon; on the
way it records the request line (method and path, API version dropped) of each HTTP
request the client sent.
"""

from __future__ import annotations

import pathlib
import re
import socket
import threading

_REQUEST_LINE = re.compile(rb"(GET|HEAD|POST|PUT|DELETE) (/\S*) HTTP/1\.[01]\r\n")
_VERSION = re.compile(r"^/v\d+\.\d+")


class CountingDockerProxy:
    """A relay at ``host`` (``unix://…``) to the daemon at ``daemon_host``; ``requests``
    lists ``(method, path)`` in the order the client sent them."""

    def __init__(self, daemon_host: str, directory: pathlib.Path) -> None:
        self.daemon_path = daemon_host.removeprefix("unix://")
        self.path = directory / "proxy.sock"
        self.host = f"unix://{self.path}"
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(64)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def paths(self, method: str | None = None) -> list[str]:
        """The paths requested (with ``method`` only, when given), query strings dropped."""
        with self._lock:
            return [p.split("?")[0] for m, p in self.requests if method in (None, m)]

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            daemon.connect(self.daemon_path)
            threading.Thread(target=self._pump, args=(client, daemon, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(daemon, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        tail = b""
        try:
            while chunk := source.recv(65536):
                if record:
                    seen = tail + chunk
                    for match in _REQUEST_LINE.finditer(seen):
                        if match.end() > len(tail):  # not one already counted in ``tail``
                            path = _VERSION.sub("", match.group(2).decode())
                            with self._lock:
                                self.requests.append((match.group(1).decode(), path))
                    tail = seen[-256:]
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
