"""What the unit tests of the store and of the concerns that keep their state in it share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.postgres import PostgresServer, new_database


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer | None) -> str:
    """A store on each backend: the in-memory twin, a SQLite file, a database of the session's real PostgreSQL
    (skipped where it is not installed); ``indirect=True`` parametrisation picks some."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    if postgres is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    return new_database(postgres)
