"""Fail loudly, early, in one place (issue 33, item 2): ``serve`` and ``check-config`` refuse, with the fix named, a
PostgreSQL ledger without its driver, a SQLite ledger that cannot be written, and several workers counting limits on
their own; both say where the gateway keeps its state (the ledger, the limits, the workers)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import describe, main, preflight
from gateway.settings import parse_settings

OPEN = "auth: {open: true}\nproviders: {m: {kind: mock}}\nmodels: {a: {targets: [{provider: m}]}}\n"


def _config(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(OPEN + extra)
    return path


def test_a_postgresql_ledger_without_its_driver_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    path = _config(tmp_path, "store: {url: 'postgresql://gw:secret@127.0.0.1:1/gw'}\n")
    assert main(["check-config", str(path)]) == 0  # the driver is installed here: OK
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # the import system's own "not installed"
    capsys.readouterr()
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "asyncpg" in err and "pip install 'messages-gateway[postgres]'" in err
    assert main(["serve", "--config", str(path)]) == 2  # refused before anything listens
    assert "pip install 'messages-gateway[postgres]'" in capsys.readouterr().err


def test_an_unwritable_ledger_directory_is_refused_at_start(tmp_path: Path, capsys: Any) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the ledger's directory should be\n")
    path = _config(tmp_path, f"store: {{url: 'sqlite:///{blocker}/ledger.db'}}\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot be written" in err and str(blocker) in err and "store.enabled: false" in err
    assert main(["serve", "--config", str(path)]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_a_writable_ledger_passes_and_a_missing_directory_is_made(tmp_path: Path) -> None:
    settings = parse_settings(OPEN + f"store: {{url: 'sqlite:///{tmp_path}/new/dir/ledger.db'}}\n")
    assert preflight(settings, 1) == []
    assert (tmp_path / "new" / "dir").is_dir()
    assert list((tmp_path / "new" / "dir").iterdir()) == []  # the probe file is gone


def test_workers_without_redis_are_refused_by_check_config_too(tmp_path: Path, capsys: Any) -> None:
    path = _config(
        tmp_path,
        f"server: {{workers: 2}}\nlimits: {{requests_per_minute: 5}}\nstore: {{url: 'sqlite:///{tmp_path}/l.db'}}\n",
    )
    assert main(["check-config", str(path)]) == 2
    assert "set limits.redis_url" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("store: {url: 'memory://'}\n", "store: memory (lost at exit); limits: memory (this process); workers: 1"),
        ("store: {enabled: false}\n", "store: none (store.enabled: false)"),
        (
            "store: {url: 'postgresql://gw:s3cret@db.internal:5432/gw'}\n"
            "limits: {redis_url: 'redis://:hunter2@redis.internal:6379/0'}\nserver: {workers: 4}\n",
            "store: PostgreSQL postgresql://gw:***@db.internal:5432/gw; "
            "limits: Redis redis://:***@redis.internal:6379/0; workers: 4",
        ),
    ],
)
def test_the_start_up_line_names_the_store_the_limits_and_the_workers(extra: str, expected: str) -> None:
    settings = parse_settings(OPEN + extra)
    line = describe(settings, settings.server.workers)
    assert line.startswith(expected)
    assert "s3cret" not in line and "hunter2" not in line


def test_check_config_prints_where_state_lives(tmp_path: Path, capsys: Any) -> None:
    path = _config(tmp_path, f"store: {{url: 'sqlite:///{tmp_path}/ledger.db'}}\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"store: SQLite {tmp_path}/ledger.db; limits: memory (this process); workers: 1" in out


def test_check_config_connect_reaches_the_store_redis_and_each_provider(
    tmp_path: Path, redis_server: Any, capsys: Any
) -> None:
    """``--connect`` against the real thing: a SQLite ledger, the real Redis, a provider host listening on
    127.0.0.1; then the same config with the provider's port and Redis's closed: exit 1, each failure named."""
    import socket

    from tests.net import free_port

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = (
        "auth: {open: true}\n"
        f"providers: {{up: {{kind: anthropic, base_url: 'http://127.0.0.1:{port}', api_key: k}}}}\n"
        "models: {a: {targets: [{provider: up}]}}\n"
        f"store: {{url: 'sqlite:///{tmp_path}/ledger.db'}}\n"
        f"limits: {{redis_url: '{redis_server.url}'}}\n"
    )
    path = tmp_path / "g.yaml"
    path.write_text(config)
    try:
        assert main(["check-config", "--connect", str(path)]) == 0
        out = capsys.readouterr().out
        assert f"store SQLite {tmp_path}/ledger.db: reached" in out
        assert "Redis redis://" in out and f"provider 'up' 127.0.0.1:{port}: reached" in out
        assert (tmp_path / "ledger.db").exists()  # opened for real: its schema made
    finally:
        listener.close()
    closed = free_port()
    path.write_text(
        config.replace(f"127.0.0.1:{port}", f"127.0.0.1:{closed}").replace(
            redis_server.url, f"redis://127.0.0.1:{free_port()}/0"
        )
    )
    assert main(["check-config", "--connect", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"provider 'up' 127.0.0.1:{closed}: FAILED" in err
    assert "Redis redis://127.0.0.1:" in err and "2 of the --connect checks failed" in err
