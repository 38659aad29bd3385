"""A real PostgreSQL server for the tests: Debian's ``postgresql`` binaries, a fresh cluster in a temporary
directory, listening on 127.0.0.1 on a free port, trust authentication for the one test role. PostgreSQL
refuses to run as root, so as root the server runs as the ``postgres`` user (``runuser``)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.net import free_port

__all__ = ["PostgresServer", "find_bin_dir", "new_database", "start_postgres"]


def find_bin_dir() -> Path | None:
    """The directory of ``initdb``/``pg_ctl``: Debian keeps them under /usr/lib/postgresql/<major>/bin."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(os.path.realpath(on_path)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


@dataclass
class PostgresServer:
    root: Path
    port: int
    bin_dir: Path
    user: str = "gateway"
    database: str = "gateway"

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> PostgresServer:
    """A running server with an empty database ``gateway`` owned by the superuser role ``gateway``."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server = PostgresServer(root, free_port(), bin_dir)
    data = root / "data"
    init = server._run("initdb", "-D", str(data), "-U", server.user, "-A", "trust", "-E", "UTF8", "--no-sync")
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed: {init.stderr or init.stdout}")
    options = f"-p {server.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    start = server._run("pg_ctl", "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "-t", "30", "start")
    if start.returncode != 0:
        log = (root / "log").read_text() if (root / "log").exists() else ""
        raise RuntimeError(f"pg_ctl start failed: {start.stderr or start.stdout}\n{log}")
    created = server._run("createdb", "-h", "127.0.0.1", "-p", str(server.port), "-U", server.user, server.database)
    if created.returncode != 0:
        server.stop()
        raise RuntimeError(f"createdb failed: {created.stderr}")
    return server


_NAMES = iter(range(1, 1_000_000))


def new_database(server: PostgresServer) -> str:
    """The URL of a new, empty database on ``server`` (one per test: no test sees another's rows)."""
    name = f"t{next(_NAMES)}"
    created = server._run("createdb", "-h", "127.0.0.1", "-p", str(server.port), "-U", server.user, name)
    if created.returncode != 0:
        raise RuntimeError(f"createdb failed: {created.stderr}")
    return server.url.rsplit("/", 1)[0] + "/" + name
