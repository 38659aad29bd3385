"""What a gateway remembers of a bearer JWT, end to end against a local identity provider (``tests/jwt_issuer.py``):
claims, not a principal, so a reload that narrows a team applies at once to a token already seen (the served CLI,
reloaded on SIGHUP); a signing key the issuer withdraws takes its earlier tokens with it at the next JWKS fetch;
an entry lives at most ``jwks_cache_s``, and a healthy token outlives that life (short, and the default 300 s);
``auth.jwt.unknown_team`` refuses (default) or allows a token that names no configured team (issue 31)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import run_gateway
from tests.jwt_issuer import AUDIENCE, LocalIssuer

KW: dict[str, Any] = {"max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def issuer() -> Iterator[LocalIssuer]:
    local = LocalIssuer()
    local.add_key("k2")
    yield local
    local.close()


def config(
    issuer: LocalIssuer, tmp_path: Path, *, pay: str = '["claude-opus-*", "claude-sonnet-*"]', **jwt: Any
) -> str:
    fields = "".join(f", {k}: {v}" for k, v in jwt.items())
    return f"""
auth:
  jwt: {{issuer: "{issuer.url}", audience: {AUDIENCE}, user_claim: email, team_claim: groups{fields}}}
store: {{url: "sqlite:///{tmp_path}/jwt.db", flush_interval_s: 0.05}}
teams: {{pay: {{models: {pay}}}}}
providers:
  m1: {{kind: mock, deltas: 2}}
models:
  claude-opus-4-6: {{targets: [{{provider: m1}}]}}
  claude-sonnet-4-6: {{targets: [{{provider: m1}}]}}
  claude-haiku-4-5: {{targets: [{{provider: m1}}]}}
"""


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def ask(url: str, token: str, model: str = "claude-opus-4-6") -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", json={"model": model, **KW}, headers=bearer(token), timeout=10)


def listed(url: str, token: str) -> list[str]:
    models = httpx.get(f"{url}/v1/models", headers=bearer(token), timeout=10)
    assert models.status_code == 200, models.text
    return [m["id"] for m in models.json()["data"]]


def test_a_reload_that_narrows_a_team_applies_at_once_to_a_token_already_seen(
    issuer: LocalIssuer, tmp_path: Path, serve: Any
) -> None:
    """Before: the cached token kept team pay's old models — opus served, and listed — until its ``exp``."""
    path = tmp_path / "gateway.yaml"
    path.write_text(config(issuer, tmp_path))
    gw = serve(path)
    token = issuer.token(groups=["pay"])
    assert ask(gw.url, token).status_code == 200
    assert listed(gw.url, token) == ["claude-opus-4-6", "claude-sonnet-4-6"]
    hits = issuer.hits
    reloads = gw.log.read_text().count("config reloaded")
    path.write_text(config(issuer, tmp_path, pay='["claude-sonnet-*"]'))
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while gw.log.read_text().count("config reloaded") == reloads:  # waiting for the condition: the reload applied
        assert time.monotonic() < deadline, gw.log.read_text()[-2000:]
        time.sleep(0.05)
    refused = ask(gw.url, token)
    assert refused.status_code == 403, refused.text
    assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "permission_error"
    assert listed(gw.url, token) == ["claude-sonnet-4-6"]
    assert ask(gw.url, token, "claude-sonnet-4-6").status_code == 200
    assert issuer.hits == hits  # the token's claims were still remembered: nothing was fetched or verified again


def test_a_withdrawn_signing_key_takes_its_earlier_tokens_at_the_next_jwks_fetch(
    issuer: LocalIssuer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issuer rotates: it publishes k3 and withdraws k2. The first k3 token fetches the set (default 300 s
    cache, well before any entry's time is up), and from then a k2 token verified earlier is refused as a new
    one is. Before: the earlier k2 token was accepted until its ``exp``."""
    import gateway.governance.jwt_auth

    monkeypatch.setattr(gateway.governance.jwt_auth, "REFETCH_S", 0.0)  # the kid refetch floor is not under test
    with run_gateway(config(issuer, tmp_path)) as gw:
        earlier, kept = issuer.token("k2", jti="earlier"), issuer.token("k1", jti="kept")
        assert ask(gw.url, earlier).status_code == 200 and ask(gw.url, kept).status_code == 200
        issuer.published.remove("k2")
        issuer.add_key("k3")
        hits = issuer.hits
        assert ask(gw.url, issuer.token("k3")).status_code == 200
        assert issuer.hits == hits + 1
        refused = ask(gw.url, earlier)
        assert refused.status_code == 401 and "does not publish" in refused.json()["error"]["message"]
        assert refused.headers["x-should-retry"] == "false"
        assert ask(gw.url, kept).status_code == 200  # a key still published keeps its tokens


def test_with_a_short_jwks_cache_a_withdrawn_key_is_refused_once_the_cache_life_is_up(
    issuer: LocalIssuer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``jwks_cache_s: 1``, no other token to make a fetch: the earlier k2 token's entry ends with the cache life
    (the cap), so the token is verified again against a fresh set, which no longer has k2. Before: accepted."""
    import gateway.governance.jwt_auth

    monkeypatch.setattr(gateway.governance.jwt_auth, "REFETCH_S", 0.0)  # the cache's own life, not the 10 s floor
    with run_gateway(config(issuer, tmp_path, jwks_cache_s=1)) as gw:
        earlier = issuer.token("k2", jti="earlier")
        assert ask(gw.url, earlier).status_code == 200
        issuer.published.remove("k2")
        assert ask(gw.url, earlier).status_code == 200  # remembered, within the life
        time.sleep(1.1)
        refused = ask(gw.url, earlier)
        assert refused.status_code == 401 and "does not publish" in refused.json()["error"]["message"]


def outlives_the_jwks_cache(issuer: LocalIssuer, url: str, wait_s: float) -> None:
    """One token, used again after ``wait_s`` (past the cache life): still accepted, having been verified again
    against a set fetched again once."""
    token = issuer.token(exp=int(time.time()) + int(wait_s) + 300)
    assert ask(url, token).status_code == 200
    hits = issuer.hits
    assert ask(url, token).status_code == 200 and issuer.hits == hits  # remembered
    time.sleep(wait_s)
    again = ask(url, token)
    assert again.status_code == 200, again.text
    assert listed(url, token) == ["claude-opus-4-6", "claude-sonnet-4-6"]
    assert issuer.hits == hits + 1


def test_a_healthy_token_outlives_a_short_jwks_cache_life(
    issuer: LocalIssuer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the token was never verified again (no fetch after the cache life)."""
    import gateway.governance.jwt_auth

    monkeypatch.setattr(gateway.governance.jwt_auth, "REFETCH_S", 0.0)
    with run_gateway(config(issuer, tmp_path, jwks_cache_s=1)) as gw:
        outlives_the_jwks_cache(issuer, gw.url, 1.2)


@pytest.mark.long
def test_a_healthy_token_outlives_the_default_jwks_cache_life(issuer: LocalIssuer, tmp_path: Path) -> None:
    """The default configuration, nothing shortened: 301 s past the first use, past both the remembered entry
    and the key set (``jwks_cache_s`` 300), the token is accepted."""
    with run_gateway(config(issuer, tmp_path)) as gw:
        outlives_the_jwks_cache(issuer, gw.url, 301)


@pytest.mark.parametrize("groups", [["staff", "ops"], None])
def test_a_token_of_no_configured_team_is_refused_by_default(
    issuer: LocalIssuer, tmp_path: Path, groups: list[str] | None
) -> None:
    """Before: it got every model. Now 403 ``permission_error`` in Anthropic's envelope, on every route."""
    with run_gateway(config(issuer, tmp_path)) as gw:
        token = issuer.token(groups=groups)
        for refused in (
            ask(gw.url, token, "claude-haiku-4-5"),
            httpx.get(f"{gw.url}/v1/models", headers=bearer(token)),
        ):
            assert refused.status_code == 403, refused.text
            body = refused.json()
            assert body["type"] == "error" and body["error"]["type"] == "permission_error"
            assert "no configured team matches its 'groups' claim" in body["error"]["message"]
            assert refused.headers["x-should-retry"] == "false"
        assert ask(gw.url, issuer.token(groups=["staff", "pay"]), "claude-opus-4-6").status_code == 200


def test_unknown_team_allow_serves_every_model_as_before(issuer: LocalIssuer, tmp_path: Path) -> None:
    with run_gateway(config(issuer, tmp_path, unknown_team="allow")) as gw:
        token = issuer.token(groups=["staff", "ops"])
        assert ask(gw.url, token, "claude-haiku-4-5").status_code == 200
        assert listed(gw.url, token) == ["claude-opus-4-6", "claude-sonnet-4-6", "claude-haiku-4-5"]
        pay = issuer.token(groups=["pay"])  # a token that does name a team still gets only its models
        assert ask(gw.url, pay, "claude-haiku-4-5").status_code == 403
