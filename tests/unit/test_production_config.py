"""config/production.example.yaml (issue 33, item 3) is a complete production config that passes every check
``serve`` makes: teams, named keys stored as digests, an admin key, a fallback alias across providers, prices, a
budget and rate limits, PostgreSQL and Redis, JWT sign-in, metrics labels."""

from __future__ import annotations

import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

from gateway.governance.pricing import Prices
from gateway.settings import ApiKey, BedrockProvider, load_settings

PATH = Path(__file__).resolve().parents[2] / "config" / "production.example.yaml"
ENV = {
    "GATEWAY_ADMIN_KEY": "admin-secret",
    "ANTHROPIC_API_KEY": "sk-ant-test",
    "AWS_REGION": "us-east-1",
    "PGPASSWORD": "pg-secret",
    "REDIS_PASSWORD": "redis-secret",
}


def test_check_config_passes_on_the_production_example() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", str(PATH)],
        env={"PATH": "/usr/bin:/bin", **ENV},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "OK — 2 providers, 2 model routes" in done.stdout
    assert "store: PostgreSQL postgresql://gateway:***@postgres:5432/gateway" in done.stdout
    assert "limits: Redis redis://:***@redis:6379/0; workers: 2" in done.stdout
    assert "secret" not in done.stdout + done.stderr


def test_the_production_example_has_every_block() -> None:
    settings = load_settings(PATH, environ=ENV)
    keys = [k for k in settings.auth.keys if isinstance(k, ApiKey)]
    assert keys and all(k.key is None and k.key_sha256 for k in keys)  # digests only
    assert {k.team for k in keys} <= set(settings.teams)
    assert settings.admin.keys == ["admin-secret"]
    assert settings.auth.jwt is not None and settings.auth.jwt.team_claim == "team"
    fallback = settings.models["claude-sonnet"]
    assert fallback.strategy == "fallback"
    kinds = {type(settings.providers[t.provider]) for t in fallback.targets}
    assert len(kinds) == 2 and BedrockProvider in kinds  # across providers
    for target in fallback.targets:  # every model a budgeted key reaches through the alias has a price
        assert target.model and Prices(settings.pricing).price_of(target.model) is not None
        assert any(fnmatchcase(target.model, glob) for glob in settings.pricing)  # the negotiated rate, not list
    assert any(t.limits is not None and t.limits.budget is not None for t in settings.teams.values())
    assert settings.limits is not None and settings.limits.requests_per_minute and settings.limits.redis_url
    assert settings.store.resolved_url().startswith("postgresql://")
    assert settings.metrics.labels == ["team"]
    assert settings.server.workers > 1
    assert settings.server.port == 8080
    assert load_settings(PATH, environ={**ENV, "PORT": "9000"}).server.port == 9000  # ${PORT} fills a number
