"""A real Redis for the tests: Debian's ``redis-server`` on 127.0.0.1 on a free port, nothing saved to disk."""

from __future__ import annotations

import atexit
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.net import free_port

__all__ = ["RedisServer", "start_redis"]


@dataclass
class RedisServer:
    port: int
    root: Path
    proc: subprocess.Popen[bytes] | None = field(default=None)
    extra: tuple[str, ...] = ()  # more redis-server options (--requirepass, --unixsocket …)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    reply = conn.recv(16)
                    if reply.startswith(b"+PONG"):
                        self._check_answering_is_ours(conn)
                        return
                    if reply.startswith(b"-NOAUTH"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def _check_answering_is_ours(self, conn: socket.socket) -> None:
        """The server answering on the port is the process just started, not another test's that took the port
        while it was free (``INFO server``'s ``process_id``)."""
        conn.sendall(b"INFO server\r\n")
        reply = b""
        while (found := re.search(rb"\r\nprocess_id:(\d+)\r\n", reply)) is None:
            chunk = conn.recv(65536)
            if not chunk:
                raise RuntimeError("redis-server closed the connection during INFO")
            reply += chunk
        pid = int(found[1])
        assert self.proc is not None
        if pid != self.proc.pid:
            raise RuntimeError(
                f"port {self.port}: another redis-server (pid {pid}) answers, not ours ({self.proc.pid})"
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


def start_redis(*extra: str) -> RedisServer:
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    directory = Path(tempfile.mkdtemp(prefix="gateway-redis-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)  # (its data: gone with the test process)
    server = RedisServer(free_port(), directory, extra=extra)
    server.start()
    return server
