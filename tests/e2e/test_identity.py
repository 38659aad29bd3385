"""Identity end to end: keys issued at run time through ``/v1/gateway/keys`` (used with the real SDK, limited,
listed without secrets, revoked — on every replica within 2 s, two gateway processes sharing PostgreSQL), and
bearer JWTs from a local identity provider (``tests/jwt_issuer.py``): the claims attribute the request, and every
kind of bad token is a 401 the SDK does not retry."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import access_lines, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI
from tests.jwt_issuer import AUDIENCE, LocalIssuer
from tests.postgres import PostgresServer, new_database

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
ADMIN = {"x-api-key": "sk-admin"}


def keyed_config(fake: FakeClaudeAPI, tmp_path: Path) -> str:
    return f"""
auth: {{keys: [{{name: ci, key: sk-ci}}]}}
admin: {{keys: [sk-admin]}}
store: {{url: "sqlite:///{tmp_path}/keys.db", flush_interval_s: 0.05}}
teams: {{pay: {{models: ["fake-*"]}}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""


def test_an_issued_key_is_shown_once_used_limited_listed_and_revoked(
    fake: FakeClaudeAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    with run_gateway(keyed_config(fake, tmp_path)) as gw:
        url = f"{gw.url}/v1/gateway/keys"
        wanted = {"name": "dev-1", "team": "pay", "user": "bob", "limits": {"requests_per_minute": 2}}
        for headers, status in (({}, 401), ({"x-api-key": "sk-ci"}, 401)):  # a client key is not an admin key
            refused = httpx.post(url, json=wanted, headers=headers)
            assert refused.status_code == status and refused.json()["error"]["type"] == "authentication_error"
        made = httpx.post(url, json=wanted, headers=ADMIN)
        assert made.status_code == 201, made.text
        issued = made.json()
        secret = issued.pop("key")
        assert secret.startswith("sk-gw-") and issued["partial_key_hint"].endswith(secret[-4:])
        assert (issued["type"], issued["name"], issued["team"], issued["user"], issued["status"]) == (
            "api_key",
            "dev-1",
            "pay",
            "bob",
            "active",
        )
        key_id = issued["id"]  # its own, immutable: the name is a label (issue 31)
        assert key_id.startswith("apikey_") and len(key_id) == 33
        client = anthropic.Anthropic(api_key=secret, base_url=gw.url, max_retries=0)
        if time.time() % 60 > 55:
            time.sleep(61 - time.time() % 60)
        reply = client.messages.with_raw_response.create(model="fake-text", **KW)
        assert reply.headers["anthropic-ratelimit-requests-limit"] == "2"  # its own limits
        assert access_lines(caplog, reply.headers["request-id"])[0]["key"] == key_id
        with pytest.raises(anthropic.PermissionDeniedError):  # its team's models
            client.messages.create(model="claude-other", **KW)
        client.messages.create(model="fake-text", **KW)
        with pytest.raises(anthropic.RateLimitError):
            client.messages.create(model="fake-text", **KW)
        listed = httpx.get(url, headers=ADMIN)
        assert listed.status_code == 200 and secret not in listed.text and secret[6:] not in listed.text
        assert [(k["id"], k["name"]) for k in listed.json()["data"]] == [(key_id, "dev-1")]
        assert "key" not in listed.json()["data"][0]
        assert httpx.post(url, json={"name": "dev-1"}, headers=ADMIN).status_code == 400  # the name is taken
        assert httpx.post(url, content=b"{", headers=ADMIN).json()["error"]["type"] == "invalid_request_error"
        assert httpx.post(url, json={"name": "x", "colour": "red"}, headers=ADMIN).status_code == 400
        assert httpx.delete(f"{url}/ci", headers=ADMIN).status_code == 400  # a config key: remove it in the file
        gone = httpx.delete(f"{url}/{key_id}", headers=ADMIN)
        assert gone.status_code == 200 and gone.json() == {"type": "api_key_deleted", "id": key_id, "name": "dev-1"}
        with pytest.raises(anthropic.AuthenticationError) as info:
            client.messages.create(model="fake-text", **KW)
        assert info.value.response.headers["x-should-retry"] == "false"
        assert httpx.delete(f"{url}/{key_id}", headers=ADMIN).status_code == 404
        assert httpx.delete(f"{url}/dev-1", headers=ADMIN).status_code == 404


def test_a_revocation_reaches_every_replica_within_two_seconds(
    tmp_path: Path, serve: Any, postgres: PostgresServer | None
) -> None:
    if postgres is None:
        pytest.skip("PostgreSQL is not installed")
    config = tmp_path / "g.yaml"
    config.write_text(
        f"""
admin: {{keys: [sk-admin]}}
store: {{url: "{new_database(postgres)}"}}
providers:
  m1: {{kind: mock, deltas: 3}}
models:
  live: {{targets: [{{provider: m1}}]}}
"""
    )
    first, second = serve(config), serve(config)
    made = httpx.post(f"{first.url}/v1/gateway/keys", json={"name": "roaming"}, headers=ADMIN)
    assert made.status_code == 201, made.text
    key = {"x-api-key": made.json()["key"]}

    def status_on(gw: Any) -> int:
        return httpx.post(f"{gw.url}/v1/messages", json={**KW, "model": "live"}, headers=key).status_code

    assert status_on(first) == 200  # the issuing replica at once
    deadline = time.monotonic() + 2
    while status_on(second) != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status_on(second) == 200
    assert httpx.delete(f"{first.url}/v1/gateway/keys/roaming", headers=ADMIN).status_code == 200
    revoked = time.monotonic()
    assert status_on(first) == 401
    while status_on(second) == 200:
        assert time.monotonic() - revoked < 2.0, "the other replica still takes the revoked key"
        time.sleep(0.05)
    assert status_on(second) == 401
    listed = httpx.get(f"{second.url}/v1/gateway/keys", headers=ADMIN).json()
    assert listed["data"] == []


@pytest.fixture(scope="module")
def issuer() -> Iterator[LocalIssuer]:
    local = LocalIssuer()
    yield local
    local.close()


def jwt_config(fake: FakeClaudeAPI, issuer: LocalIssuer, tmp_path: Path, **extra: str) -> str:
    fields = "".join(f", {k}: {v}" for k, v in extra.items())
    return f"""
auth:
  jwt: {{issuer: "{issuer.url}", audience: {AUDIENCE}, user_claim: email, team_claim: groups{fields}}}
admin: {{keys: [sk-admin]}}
store: {{url: "sqlite:///{tmp_path}/jwt.db", flush_interval_s: 0.05}}
teams: {{pay: {{models: ["fake-*"], limits: {{requests_per_minute: 1000}}}}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""


def test_a_token_of_the_identity_provider_attributes_the_request_to_its_user_and_team(
    fake: FakeClaudeAPI, issuer: LocalIssuer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    with run_gateway(jwt_config(fake, issuer, tmp_path)) as gw:
        token = issuer.token()
        client = anthropic.Anthropic(auth_token=token, base_url=gw.url, max_retries=0)  # Authorization: Bearer
        reply = client.messages.with_raw_response.create(model="fake-text", **KW)
        assert reply.headers["anthropic-ratelimit-requests-limit"] == "1000"  # the team's limits
        assert access_lines(caplog, reply.headers["request-id"])[0]["key"] == "jwt:alice@example.com"
        with pytest.raises(anthropic.PermissionDeniedError):  # the team's models
            client.messages.create(model="claude-other", **KW)
        hits = issuer.hits
        helper = anthropic.Anthropic(api_key=token, base_url=gw.url, max_retries=0)  # x-api-key (apiKeyHelper)
        for _ in range(5):
            helper.messages.create(model="fake-text", **KW)
        assert issuer.hits == hits  # the keys are cached, the token remembered
        day = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime())
        report = httpx.get(
            f"{gw.url}/v1/organizations/usage_report/messages",
            params={
                "starting_at": day,
                "ending_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86_400)),
                "group_by[]": ["account_id", "workspace_id"],
            },
            headers=ADMIN,
        ).json()
        rows = [r for b in report["data"] for r in b["results"]]
        assert {(r["account_id"], r["workspace_id"]) for r in rows} == {("alice@example.com", "pay")}
        assert sum(r["requests"] for r in rows) == 6  # not the refused one: the gateway's own 403 is no row (issue 31)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda i: i.token(exp=int(time.time()) - 3600), "expired"),
        (lambda i: i.token(nbf=int(time.time()) + 3600), "not valid yet"),
        (lambda i: i.token(aud="someone-else"), "audience"),
        (lambda i: i.token(iss="https://evil.example"), "issuer"),
        (lambda i: i.token(exp=None), "'exp' claim"),
        (lambda i: i.token(email=None), "'email' claim is not a name"),
        (lambda i: i.token("unpublished"), "does not publish"),
        (lambda i: i.unsigned(), "algorithm is not one of"),
        (lambda i: i.hs256_with_public_key(), "algorithm is not one of"),
        (lambda i: i.token()[:-6] + "AAAAAA", "signature does not verify"),
        (lambda i: "eyJhbGciOi.broken.token", "not a JWT"),
    ],
)
def test_a_bad_token_is_a_401_the_client_does_not_retry(
    fake: FakeClaudeAPI, issuer: LocalIssuer, tmp_path: Path, make: Any, reason: str
) -> None:
    if "unpublished" not in issuer.private:
        issuer.add_key("unpublished", publish=False)
    with run_gateway(jwt_config(fake, issuer, tmp_path)) as gw:
        refused = httpx.post(
            f"{gw.url}/v1/messages",
            json={"model": "fake-text", **KW},
            headers={"authorization": f"Bearer {make(issuer)}"},
        )
        assert refused.status_code == 401, refused.text
        assert (
            refused.json()["error"]["type"] == "authentication_error" and reason in refused.json()["error"]["message"]
        )
        assert refused.headers["x-should-retry"] == "false"


def test_a_rotated_key_is_picked_up_and_the_jwks_url_may_be_given(
    fake: FakeClaudeAPI, issuer: LocalIssuer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gateway.governance.jwt_auth

    monkeypatch.setattr(gateway.governance.jwt_auth, "REFETCH_S", 0.0)
    with run_gateway(jwt_config(fake, issuer, tmp_path, jwks_url=f'"{issuer.url}/jwks"')) as gw:
        client = anthropic.Anthropic(auth_token=issuer.token(), base_url=gw.url, max_retries=0)
        client.messages.create(model="fake-text", **KW)
        issuer.add_key("k2-ec", "EC")  # the issuer rotates: a new key, of another type
        rotated = anthropic.Anthropic(auth_token=issuer.token("k2-ec"), base_url=gw.url, max_retries=0)
        assert rotated.messages.create(model="fake-text", **KW).stop_reason == "end_turn"
