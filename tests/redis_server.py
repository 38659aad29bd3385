"""A real Redis for the tests: Debian's ``redis-server`` on 127.0.0.1 on a free port, nothing saved to disk."""

from __future__ import annotations

import atexit
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
                    if conn.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

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
