"""Self-test of the fake Vertex AI (+ Google token endpoint) and fake Microsoft Foundry (+ Entra authority)
against real clients: ``AnthropicVertex`` / ``AnthropicFoundry`` from the anthropic SDK, google-auth
credentials and azure-identity's ``ClientSecretCredential`` (sync through MSAL, async through azure-core)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import google.auth.exceptions
import google.auth.jwt
import google.auth.transport.requests
import httpx
import pytest
from anthropic import AnthropicFoundry, AnthropicVertex, AsyncAnthropicFoundry, AsyncAnthropicVertex
from azure.core.exceptions import ClientAuthenticationError
from azure.identity import ClientSecretCredential, get_bearer_token_provider
from azure.identity.aio import ClientSecretCredential as AsyncClientSecretCredential
from azure.identity.aio import get_bearer_token_provider as get_async_bearer_token_provider
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import crypt
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account

from .claude_api import final_message
from .foundry import (
    AZURE_STATUS_SCENARIOS,
    FOUNDRY_SCOPE,
    INVALID_KEY_MESSAGE,
    INVALID_TOKEN_MESSAGE,
    FakeFoundry,
)
from .foundry import count_input_tokens as foundry_count
from .vertex import (
    ANTHROPIC_VERSION,
    BETA_FAMILIES,
    CLOUD_PLATFORM_SCOPE,
    FIELDS,
    GOOGLE_STATUS_SCENARIOS,
    GOOGLE_TOKEN_AUDIENCE,
    JWT_GRANT_TYPE,
    UNAUTHENTICATED_MESSAGE,
    FakeVertex,
    count_input_tokens,
    final_vertex_message,
    scenario_name,
    sign_jwt,
    stream_body,
    stream_events,
    unexpected_betas_message,
    vrtx_ids,
)

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
VERTEX_EXTRA: dict[str, Any] = {"anthropic_version": ANTHROPIC_VERSION}  # SDK 2.14 defaults to 2026-10-21
SCENARIOS = ["fake-text", "fake-citations", "fake-tools", "fake-thinking"]
REGION = "us-east5"


def _dump(message: Any) -> dict[str, Any]:
    return message.model_dump(warnings=False)  # type: ignore[no-any-return]


def _expected(message: dict[str, Any]) -> dict[str, Any]:
    """What the SDK's model of the ``Message`` dict dumps to (absent optional fields become None)."""
    return _dump(anthropic.types.Message.model_validate(message))


def _stream(client: Any, model: str, **kwargs: Any) -> tuple[Any, list[str]]:
    with client.messages.stream(model=model, max_tokens=64, messages=MESSAGES, **kwargs) as stream:
        types = [event.type for event in stream]
        return stream.get_final_message(), types


# =============================================================================================
# Vertex
# =============================================================================================


@pytest.fixture(scope="module")
def vertex() -> Iterator[FakeVertex]:
    with FakeVertex() as server:
        yield server


@pytest.fixture
def fake(vertex: FakeVertex) -> FakeVertex:
    vertex.reset()
    vertex.token_lifetime_s = 3600
    vertex.token_delay_s = 0.0
    return vertex


@pytest.fixture
def vclient(fake: FakeVertex) -> Iterator[AnthropicVertex]:
    with AnthropicVertex(
        region=REGION, project_id=fake.project, base_url=fake.base_url, access_token=fake.issue_token(), max_retries=0
    ) as c:
        yield c


def _vertex_url(fake: FakeVertex, model: str, specifier: str = "rawPredict", project: str | None = None) -> str:
    project = project or fake.project
    return f"{fake.base_url}/projects/{project}/locations/{REGION}/publishers/anthropic/models/{model}:{specifier}"


def _vertex_post(
    fake: FakeVertex, url: str, body: Any, token: str | None = "", *, raw: bytes | None = None
) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token or fake.issue_token()}"
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(url, content=content, headers=headers, timeout=10)


def test_vertex_helpers() -> None:
    assert scenario_name("fake-tools@20250929") == "fake-tools"
    assert scenario_name("claude-opus-4-6") == "claude-opus-4-6"
    events = stream_events("fake-text")
    types = [e["type"] for e in events]
    assert types.count("vertex_event") == 1
    assert types.index("vertex_event") == types.index("message_delta") + 1
    assert types[-1] == "message_stop"
    vertex_event = events[types.index("vertex_event")]
    usage = final_vertex_message("fake-text")["usage"]
    assert vertex_event["usage"]["output_tokens"] == usage["output_tokens"]
    assert "standard" in vertex_event["usage"]["tiers"]
    assert b"event: vertex_event\ndata: {" in stream_body("fake-text")
    expected = vrtx_ids(final_message("fake-tools"))
    assert final_vertex_message("fake-tools") == expected
    assert expected["id"].startswith("msg_vrtx_")
    assert all(b["id"].startswith("toolu_vrtx_") for b in expected["content"] if b["type"] == "tool_use")
    dated = final_vertex_message("fake-text@20250929")
    assert dated["model"] == "fake-text-20250929"
    assert dated["content"] == final_message("fake-text")["content"]
    assert count_input_tokens({"messages": MESSAGES}) == count_input_tokens(
        {"model": "x", "anthropic_version": "y", "messages": MESSAGES}
    )
    # error / cut endings have no message_delta, so no vertex_event
    assert "vertex_event" not in [e["type"] for e in stream_events("fake-error-midstream")]


@pytest.mark.parametrize("name", SCENARIOS)
def test_vertex_sdk_stream_matches_final_message(vclient: AnthropicVertex, fake: FakeVertex, name: str) -> None:
    streamed, types = _stream(vclient, name, extra_body=VERTEX_EXTRA)
    assert types[0] == "message_start"
    assert types[-1] == "message_stop"
    # SDK 2.14 hands unknown event names (vertex_event) to the caller; the accumulator ignores them.
    assert types.count("vertex_event") == 1
    recorded = fake.requests[-1]
    assert (recorded.route, recorded.project, recorded.region) == ("streamRawPredict", fake.project, REGION)
    assert (recorded.model, recorded.scenario, recorded.auth_error) == (name, name, None)
    assert "model" not in recorded.json
    assert recorded.json["stream"] is True
    assert recorded.anthropic_version == ANTHROPIC_VERSION
    assert recorded.token in fake.issued_tokens

    expected = final_vertex_message(name)
    assert expected == vrtx_ids(final_message(name))
    raw = vclient.messages.with_raw_response.create(
        model=name, max_tokens=64, messages=MESSAGES, extra_body=VERTEX_EXTRA
    )
    assert raw.http_response.json() == expected
    assert _dump(streamed) == _dump(raw.parse()) == _expected(expected)
    assert streamed.id.startswith("msg_vrtx_")
    for block in streamed.content:
        if block.type == "tool_use":
            assert block.id.startswith("toolu_vrtx_")
    headers = raw.http_response.headers
    assert headers["request-id"].startswith("req_vrtx_")
    assert not any(h.startswith("anthropic-ratelimit") for h in headers)
    assert fake.requests[-1].route == "rawPredict"
    assert "stream" not in fake.requests[-1].json


def test_vertex_sdk_raw_stream_and_dated_model(vclient: AnthropicVertex, fake: FakeVertex) -> None:
    with vclient.messages.create(
        model="fake-text@20250929", max_tokens=8, messages=MESSAGES, stream=True, extra_body=VERTEX_EXTRA
    ) as stream:
        events = list(stream)
    types: list[str] = [e.type for e in events]
    assert types.count("vertex_event") == 1  # SDK 2.14 yields it (as an untyped event); a gateway must drop it
    assert events[0].type == "message_start"
    assert events[0].message.model == "fake-text-20250929"
    recorded = fake.requests[-1]
    assert (recorded.model, recorded.scenario) == ("fake-text@20250929", "fake-text")
    assert "fake-text@20250929:streamRawPredict" in recorded.raw_path  # '@' is not escaped


def test_vertex_async_sdk(fake: FakeVertex) -> None:
    async def run() -> Any:
        async with (
            AsyncAnthropicVertex(
                region=REGION, project_id=fake.project, base_url=fake.base_url, access_token=fake.issue_token()
            ) as client,
            client.messages.stream(
                model="fake-thinking", max_tokens=8, messages=MESSAGES, extra_body=VERTEX_EXTRA
            ) as stream,
        ):
            return await stream.get_final_message()

    assert _dump(asyncio.run(run())) == _expected(final_vertex_message("fake-thinking"))


def test_vertex_sdk_default_anthropic_version_is_rejected(vclient: AnthropicVertex, fake: FakeVertex) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        vclient.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES)
    body = info.value.body
    assert isinstance(body, dict)
    assert body["error"]["status"] == "NOT_FOUND"
    assert body["error"]["code"] == 404
    assert "Publisher Model" in body["error"]["message"]
    assert info.value.type is None  # Google-shaped: no error.type
    assert fake.requests[-1].anthropic_version == anthropic._constants.ANTHROPIC_API_VERSION


def test_vertex_count_tokens(vclient: AnthropicVertex, fake: FakeVertex) -> None:
    counted = vclient.messages.count_tokens(
        model="fake-text@20250929", messages=MESSAGES, system="Be brief.", extra_body=VERTEX_EXTRA
    )
    recorded = fake.requests[-1]
    assert recorded.route == "count-tokens"
    assert recorded.raw_path.endswith("/models/count-tokens:rawPredict")
    assert (recorded.model, recorded.scenario) == ("fake-text@20250929", "fake-text")
    assert recorded.json["model"] == "fake-text@20250929"
    assert counted.input_tokens == count_input_tokens(recorded.json)
    with pytest.raises(anthropic.RateLimitError):
        vclient.messages.count_tokens(model="fake-quota", messages=MESSAGES)


def test_vertex_body_checks(fake: FakeVertex) -> None:
    good = {**VERTEX_EXTRA, "max_tokens": 8, "messages": MESSAGES}
    ok = _vertex_post(fake, _vertex_url(fake, "fake-text"), good)
    assert ok.status_code == 200
    assert ok.json() == final_vertex_message("fake-text")

    with_model = _vertex_post(fake, _vertex_url(fake, "fake-text"), {**good, "model": "fake-text"})
    assert with_model.status_code == 400
    assert with_model.json()["error"] == {
        "type": "invalid_request_error",
        "message": "model: Extra inputs are not permitted",
    }
    assert with_model.json()["request_id"] == with_model.headers["request-id"]
    assert with_model.headers["request-id"].startswith("req_vrtx_")

    no_version = _vertex_post(fake, _vertex_url(fake, "fake-text"), {"max_tokens": 8, "messages": MESSAGES})
    assert (no_version.status_code, no_version.json()["error"]["type"]) == (400, "invalid_request_error")

    bad_version = _vertex_post(fake, _vertex_url(fake, "fake-text"), {**good, "anthropic_version": "2023-06-01"})
    assert (bad_version.status_code, bad_version.json()["error"]["status"]) == (404, "NOT_FOUND")

    not_json = _vertex_post(fake, _vertex_url(fake, "fake-text"), None, raw=b"{nope")
    assert (not_json.status_code, not_json.json()["error"]["status"]) == (400, "INVALID_ARGUMENT")

    count_url = _vertex_url(fake, "count-tokens")
    no_model = _vertex_post(fake, count_url, {"messages": MESSAGES})
    assert no_model.status_code == 400
    assert no_model.json()["error"]["message"] == "model: Field required"
    counted = _vertex_post(fake, count_url, {"model": "fake-text", "messages": MESSAGES})
    assert counted.json() == {"input_tokens": count_input_tokens({"messages": MESSAGES})}
    assert _vertex_post(fake, _vertex_url(fake, "count-tokens", "streamRawPredict"), {}).status_code == 404

    other_project = _vertex_post(fake, _vertex_url(fake, "fake-text", project="someone-else"), good)
    assert other_project.status_code == 403
    assert other_project.json()["error"]["status"] == "PERMISSION_DENIED"

    unknown = _vertex_post(fake, f"{fake.base_url}/projects/{fake.project}/whatever", good)
    assert (unknown.status_code, unknown.json()["error"]["status"]) == (404, "NOT_FOUND")
    assert fake.requests[-1].route is None

    # stream:true on :rawPredict still streams (the body decides); the specifier is recorded
    streamed = _vertex_post(fake, _vertex_url(fake, "fake-text"), {**good, "stream": True})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.content == stream_body("fake-text")
    assert fake.requests[-1].route == "rawPredict"


def test_vertex_auth_failures(fake: FakeVertex, vclient: AnthropicVertex) -> None:
    good = {**VERTEX_EXTRA, "max_tokens": 8, "messages": MESSAGES}
    missing = _vertex_post(fake, _vertex_url(fake, "fake-text"), good, token=None)
    assert missing.status_code == 401
    assert missing.json() == {"error": {"code": 401, "message": UNAUTHENTICATED_MESSAGE, "status": "UNAUTHENTICATED"}}
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert fake.requests[-1].auth_error == "missing"

    with (
        AnthropicVertex(
            region=REGION, project_id=fake.project, base_url=fake.base_url, access_token="ya29.bogus", max_retries=0
        ) as bad,
        pytest.raises(anthropic.AuthenticationError) as info,
    ):
        bad.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES, extra_body=VERTEX_EXTRA)
    assert info.value.status_code == 401
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["status"] == "UNAUTHENTICATED"
    assert fake.requests[-1].auth_error == "unknown"
    assert fake.requests[-1].token == "ya29.bogus"

    expired = fake.issue_token(lifetime_s=0)
    assert fake.token_status(expired) == "expired"
    assert _vertex_post(fake, _vertex_url(fake, "fake-text"), good, token=expired).status_code == 401
    assert fake.requests[-1].auth_error == "expired"

    # server-side revocation: the SDK client's token stops working, a fresh one works
    assert vclient.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES, extra_body=VERTEX_EXTRA)
    assert fake.revoke_tokens() >= 1
    with pytest.raises(anthropic.AuthenticationError):
        vclient.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES, extra_body=VERTEX_EXTRA)
    assert fake.requests[-1].auth_error == "revoked"
    assert _vertex_post(fake, _vertex_url(fake, "fake-text"), good).status_code == 200


@pytest.mark.parametrize(
    ("model", "cls"),
    [
        ("fake-quota", anthropic.RateLimitError),
        ("fake-quota-list", anthropic.RateLimitError),
        ("fake-precondition", anthropic.BadRequestError),
        ("fake-unavailable", anthropic.ServiceUnavailableError),
    ],
)
def test_vertex_google_error_scenarios(vclient: AnthropicVertex, model: str, cls: type[Exception]) -> None:
    status, google_status, message = GOOGLE_STATUS_SCENARIOS[model]
    for stream in (False, True):
        with pytest.raises(cls) as info:
            vclient.messages.create(
                model=f"{model}@20250929", max_tokens=8, messages=MESSAGES, stream=stream, extra_body=VERTEX_EXTRA
            )
        assert isinstance(info.value, anthropic.APIStatusError)
        assert info.value.status_code == status
        body = info.value.body
        if model == "fake-quota-list":
            assert isinstance(body, list)
            body = body[0]
        assert body == {"error": {"code": status, "message": message, "status": google_status}}


def test_vertex_model_level_errors(vclient: AnthropicVertex) -> None:
    cases = {
        "fake-status-400": anthropic.BadRequestError,
        "fake-status-429": anthropic.RateLimitError,
        "fake-status-529": anthropic.OverloadedError,
        "fake-status-500": anthropic.InternalServerError,
    }
    for model, cls in cases.items():
        with pytest.raises(cls) as info:
            _stream(vclient, model, extra_body=VERTEX_EXTRA)
        assert isinstance(info.value, anthropic.APIStatusError)
        assert info.value.type is not None
        assert info.value.request_id is not None
        assert info.value.request_id.startswith("req_vrtx_")
    with pytest.raises(anthropic.APIStatusError) as err:
        _stream(vclient, "fake-error-midstream", extra_body=VERTEX_EXTRA)
    assert err.value.type == "overloaded_error"


def test_vertex_beta_header_is_recorded(vclient: AnthropicVertex, fake: FakeVertex) -> None:
    vclient.beta.messages.create(
        model="fake-text", max_tokens=8, messages=MESSAGES, betas=["context-1m-2025-08-07"], extra_body=VERTEX_EXTRA
    )
    recorded = fake.requests[-1]
    assert recorded.anthropic_beta == "context-1m-2025-08-07"
    assert recorded.route == "rawPredict"


def test_vertex_slow_disconnect(vclient: AnthropicVertex, fake: FakeVertex) -> None:
    started = time.monotonic()
    with vclient.messages.stream(model="fake-slow", max_tokens=8, messages=MESSAGES, extra_body=VERTEX_EXTRA) as s:
        for i, _event in enumerate(s):
            if i >= 4:
                break
    assert fake.wait_for_disconnect(timeout=5)
    assert fake.disconnects == 1
    assert time.monotonic() - started < 3
    _, types = _stream(vclient, "fake-slow-d3", extra_body=VERTEX_EXTRA)
    assert types.count("text") == 3


# -- google-auth ------------------------------------------------------------------------------


def test_vertex_service_account_credentials(fake: FakeVertex, tmp_path: Path) -> None:
    path = fake.make_service_account(tmp_path)
    info = json.loads(path.read_text())
    assert info["type"] == "service_account"
    assert info["token_uri"] == fake.token_uri
    assert info["project_id"] == fake.project
    creds = service_account.Credentials.from_service_account_file(str(path), scopes=[CLOUD_PLATFORM_SCOPE])
    with AnthropicVertex(
        region=REGION, project_id=fake.project, base_url=fake.base_url, credentials=creds, max_retries=0
    ) as client:
        streamed, _ = _stream(client, "fake-citations", extra_body=VERTEX_EXTRA)
        assert _dump(streamed) == _expected(final_vertex_message("fake-citations"))
        client.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES, extra_body=VERTEX_EXTRA)
    exchanges = fake.token_requests
    assert len(exchanges) == 1  # a 3600 s token is reused
    exchange = exchanges[0]
    assert (exchange.grant_type, exchange.error) == (JWT_GRANT_TYPE, None)
    assert exchange.jwt_header is not None
    assert exchange.jwt_header["kid"] == info["private_key_id"]
    assert exchange.claims is not None
    assert exchange.claims["iss"] == info["client_email"] == exchange.client
    assert exchange.claims["aud"] == GOOGLE_TOKEN_AUDIENCE  # not token_uri (docs/wire-formats.md §7.1)
    assert CLOUD_PLATFORM_SCOPE in exchange.claims["scope"].split()
    assert exchange.expires_in == 3600
    assert [r.token for r in fake.requests] == [exchange.access_token] * 2
    assert exchange.access_token is not None
    assert exchange.access_token.startswith("ya29.fake-")


def test_vertex_short_lived_tokens_are_refreshed(fake: FakeVertex, tmp_path: Path) -> None:
    fake.token_lifetime_s = 10  # under google-auth's 225 s refresh threshold: stale at once
    creds = service_account.Credentials.from_service_account_file(
        str(fake.make_service_account(tmp_path)), scopes=[CLOUD_PLATFORM_SCOPE]
    )
    with AnthropicVertex(
        region=REGION, project_id=fake.project, base_url=fake.base_url, credentials=creds, max_retries=0
    ) as client:
        for _ in range(3):
            client.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES, extra_body=VERTEX_EXTRA)
    exchanges = fake.token_requests
    assert len(exchanges) == 3
    assert {e.expires_in for e in exchanges} == {10}
    tokens = [r.token for r in fake.requests]
    assert tokens == [e.access_token for e in exchanges]
    assert len(set(tokens)) == 3
    assert all(r.auth_error is None for r in fake.requests)


def test_vertex_token_endpoint_rejects_bad_assertions(fake: FakeVertex, tmp_path: Path) -> None:
    path = fake.make_service_account(tmp_path)
    info = json.loads(path.read_text())
    email = info["client_email"]
    foreign_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    # google-auth with a key file whose private key is not the registered one
    pem = foreign_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    creds = service_account.Credentials.from_service_account_info(
        {**info, "private_key": pem}, scopes=[CLOUD_PLATFORM_SCOPE]
    )
    with pytest.raises(google.auth.exceptions.RefreshError, match="Invalid JWT Signature"):
        creds.refresh(google.auth.transport.requests.Request())
    assert fake.token_requests[-1].error == "invalid_grant: Invalid JWT Signature."
    assert fake.token_requests[-1].access_token is None

    now = int(time.time())
    base = {"iss": email, "aud": GOOGLE_TOKEN_AUDIENCE, "scope": CLOUD_PLATFORM_SCOPE, "iat": now, "exp": now + 3600}
    signer = crypt.RSASigner.from_service_account_info(info)

    def exchange(claims: dict[str, Any], *, key: rsa.RSAPrivateKey | None = None, grant: str = JWT_GRANT_TYPE) -> Any:
        assertion = google.auth.jwt.encode(signer, claims).decode() if key is None else sign_jwt(claims, key)
        return httpx.post(fake.token_uri, data={"grant_type": grant, "assertion": assertion}, timeout=10)

    ok = exchange(base)
    assert ok.status_code == 200
    assert set(ok.json()) == {"access_token", "expires_in", "token_type"}
    assert ok.json()["token_type"] == "Bearer"
    assert exchange({**base, "aud": fake.token_uri}).status_code == 200  # token_uri is accepted as aud too

    cases: list[tuple[dict[str, Any], rsa.RSAPrivateKey | None, str]] = [
        (base, foreign_key, "Invalid JWT Signature."),
        ({**base, "iss": "nobody@fake-project.iam.gserviceaccount.com"}, None, "account not found"),
        ({**base, "aud": "https://example.com/token"}, None, "Failed audience check"),
        ({**base, "iat": now - 7200, "exp": now - 3600}, None, "short-lived token"),
        ({**base, "exp": now + 7200}, None, "short-lived token"),
        ({**base, "scope": "https://www.googleapis.com/auth/userinfo.email"}, None, "Invalid OAuth scope"),
    ]
    for claims, key, needle in cases:
        got = exchange(claims, key=key)
        assert got.status_code == 400, needle
        assert needle in got.json()["error_description"]
    assert exchange(base, grant="client_credentials").json()["error"] == "unsupported_grant_type"
    malformed = httpx.post(fake.token_uri, data={"grant_type": JWT_GRANT_TYPE, "assertion": "x.y"}, timeout=10)
    assert malformed.json()["error"] == "invalid_grant"


def test_vertex_authorized_user_refresh_grant(fake: FakeVertex, tmp_path: Path) -> None:
    path = fake.make_authorized_user(tmp_path)
    info = json.loads(path.read_text())
    assert (info["type"], info["token_uri"]) == ("authorized_user", fake.token_uri)
    # google-auth >= 2.4x ignores an authorized_user file's token_uri (always oauth2.googleapis.com),
    # so the credentials are built with token_uri explicitly.
    loaded = user_credentials.Credentials.from_authorized_user_file(str(path), scopes=[CLOUD_PLATFORM_SCOPE])
    assert loaded.token_uri == GOOGLE_TOKEN_AUDIENCE

    def creds(**overrides: str) -> user_credentials.Credentials:
        fields = {k: info[k] for k in ("client_id", "client_secret", "refresh_token")} | overrides
        return user_credentials.Credentials(None, token_uri=fake.token_uri, scopes=[CLOUD_PLATFORM_SCOPE], **fields)

    good = creds()
    good.refresh(google.auth.transport.requests.Request())
    assert good.token in fake.issued_tokens
    assert (fake.token_requests[-1].grant_type, fake.token_requests[-1].client) == ("refresh_token", info["client_id"])
    body = {**VERTEX_EXTRA, "max_tokens": 8, "messages": MESSAGES}
    assert _vertex_post(fake, _vertex_url(fake, "fake-text"), body, good.token).is_success

    with pytest.raises(google.auth.exceptions.RefreshError, match="invalid_client"):
        creds(client_secret="nope").refresh(google.auth.transport.requests.Request())
    with pytest.raises(google.auth.exceptions.RefreshError, match="invalid_grant"):
        creds(refresh_token="1//stale").refresh(google.auth.transport.requests.Request())


def test_vertex_token_delay(fake: FakeVertex, tmp_path: Path) -> None:
    creds = service_account.Credentials.from_service_account_file(
        str(fake.make_service_account(tmp_path)), scopes=[CLOUD_PLATFORM_SCOPE]
    )
    fake.token_delay_s = 0.3
    started = time.monotonic()
    creds.refresh(google.auth.transport.requests.Request())
    assert time.monotonic() - started >= 0.3
    assert fake.token_requests[-1].access_token == creds.token


# -- what Vertex accepts (issue 32): refusals in the Anthropic envelope, Claude Code's Vertex mode accepted -------

#: Claude Code 2.1.332 in its own Vertex mode (../shared/claude-code-traffic.md, Vertex-mode column).
CC_VERTEX_BETAS = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,web-search-2025-03-05,tool-search-tool-2025-10-19,"
    "effort-2025-11-24,thinking-token-count-2026-05-13"
)
CC_TOOLS: list[dict[str, Any]] = [
    {"name": "Read", "description": "read a file", "input_schema": {"type": "object"}, "defer_loading": True},
    {"name": "Bash", "description": "run a command", "input_schema": {"type": "object"}},
]
CC_VERTEX_BODY: dict[str, Any] = {
    **VERTEX_EXTRA,
    "messages": MESSAGES,
    "system": [{"type": "text", "text": "You are Claude Code."}],
    "tools": CC_TOOLS,
    "metadata": {"user_id": "user_abc"},
    "max_tokens": 32000,
    "thinking": {"type": "adaptive"},
    "output_config": {"effort": "high"},
    "stream": True,
}
#: What Claude Code sends only the first party (Messages mode), and betas no provider knows.
FIRST_PARTY_ONLY_BETAS = [
    "context-management-2025-06-27",
    "per-turn-control-2026-07-01",
    "mid-conversation-tool-changes-2026-07-01",
    "advanced-tool-use-2025-11-20",
    "request-tags-2026-08-21",
    "prompt-caching-scope-2026-01-05",
    "evil-beta-2099-01-01",
]


def _beta_post(fake: FakeVertex, url: str, body: Any, betas: str | None) -> httpx.Response:
    headers = {"content-type": "application/json", "authorization": f"Bearer {fake.issue_token()}"}
    if betas is not None:
        headers["anthropic-beta"] = betas
    return httpx.post(url, content=json.dumps(body).encode(), headers=headers, timeout=10)


@pytest.mark.parametrize("specifier", ["streamRawPredict", "rawPredict"])
@pytest.mark.parametrize("stream", [True, False])
def test_vertex_accepts_claude_codes_vertex_mode_request(fake: FakeVertex, specifier: str, stream: bool) -> None:
    got = _beta_post(
        fake, _vertex_url(fake, "fake-text", specifier), {**CC_VERTEX_BODY, "stream": stream}, CC_VERTEX_BETAS
    )
    assert got.status_code == 200, got.text
    assert fake.requests[-1].refusal is None and fake.refusals == []


def test_vertex_accepts_every_field_and_beta_family(fake: FakeVertex) -> None:
    body: dict[str, Any] = {
        **CC_VERTEX_BODY,
        "stop_sequences": ["END"],
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 5,
        "tool_choice": {"type": "auto"},
        "output_format": {"type": "json_schema", "schema": {"type": "object"}},
        "anthropic_beta": ["context-1m-2025-08-07"],
    }
    assert set(body) == FIELDS
    betas = ",".join(f"{family}-2025-01-01" for family in sorted(BETA_FAMILIES))
    got = _beta_post(fake, _vertex_url(fake, "fake-text", "streamRawPredict"), body, betas)
    assert got.status_code == 200, got.text


@pytest.mark.parametrize("beta", FIRST_PARTY_ONLY_BETAS)
@pytest.mark.parametrize("route", ["streamRawPredict", "rawPredict", "count-tokens"])
def test_vertex_refuses_an_unknown_beta(fake: FakeVertex, beta: str, route: str) -> None:
    if route == "count-tokens":
        url, body = _vertex_url(fake, "count-tokens"), {"model": "fake-text", "messages": MESSAGES}
    else:
        url, body = _vertex_url(fake, "fake-text", route), CC_VERTEX_BODY
    got = _beta_post(fake, url, body, f"claude-code-20250219, {beta}")
    assert got.status_code == 400
    message = (
        f"Unexpected value(s) `{beta}` for the `anthropic-beta` header. Please consult our documentation at "
        "docs.anthropic.com or try again without the header."
    )
    assert got.json()["type"] == "error"
    assert got.json()["error"] == {"type": "invalid_request_error", "message": message}
    assert got.json()["request_id"].startswith("req_vrtx_")
    assert (fake.requests[-1].refusal, fake.requests[-1].refused) == (message, (f"beta:{beta}",))
    assert fake.refusals == [fake.requests[-1]]


def test_vertex_names_every_unknown_beta_and_reads_a_body_anthropic_beta(fake: FakeVertex) -> None:
    url = _vertex_url(fake, "fake-text")
    got = _beta_post(fake, url, CC_VERTEX_BODY, "evil-a-2099-01-01,effort-2025-11-24,evil-b-2099-01-01")
    assert got.json()["error"]["message"] == unexpected_betas_message(["evil-a-2099-01-01", "evil-b-2099-01-01"])
    assert "`evil-a-2099-01-01`, `evil-b-2099-01-01`" in got.json()["error"]["message"]
    got = _beta_post(fake, url, {**CC_VERTEX_BODY, "anthropic_beta": ["dev-full-thinking-2025-05-14"]}, None)
    assert got.status_code == 400  # a Bedrock beta, not a Vertex one
    assert fake.requests[-1].refused == ("beta:dev-full-thinking-2025-05-14",)


@pytest.mark.parametrize("key", ["context_management", "tags", "safeguards", "container", "model"])
def test_vertex_refuses_an_extra_top_level_field(fake: FakeVertex, key: str) -> None:
    body = {**CC_VERTEX_BODY, key: "fake-text" if key == "model" else {"edits": []}}
    got = _beta_post(fake, _vertex_url(fake, "fake-text", "streamRawPredict"), body, CC_VERTEX_BETAS)
    assert got.status_code == 400
    assert got.json()["error"] == {"type": "invalid_request_error", "message": f"{key}: Extra inputs are not permitted"}
    assert fake.requests[-1].refused == (f"field:{key}",)


def test_vertex_count_tokens_takes_model_but_not_first_party_fields(fake: FakeVertex) -> None:
    url = _vertex_url(fake, "count-tokens")
    body = {"model": "fake-text", "messages": MESSAGES, "tools": CC_TOOLS, "system": "be brief"}
    assert _beta_post(fake, url, body, "claude-code-20250219,token-efficient-tools-2025-02-19").status_code == 200
    got = _beta_post(fake, url, {**body, "context_management": {}}, None)
    assert got.status_code == 400
    assert got.json()["error"]["message"] == "context_management: Extra inputs are not permitted"


def test_vertex_refuses_eager_input_streaming_in_a_tool(fake: FakeVertex) -> None:
    tools = [*CC_TOOLS, {"name": "Edit", "input_schema": {"type": "object"}, "eager_input_streaming": True}]
    got = _beta_post(fake, _vertex_url(fake, "fake-text", "streamRawPredict"), {**CC_VERTEX_BODY, "tools": tools}, None)
    assert got.status_code == 400
    assert got.json()["error"]["message"] == "tools.2.eager_input_streaming: Extra inputs are not permitted"
    assert fake.requests[-1].refused == ("tool_field:eager_input_streaming",)


def test_vertex_extra_betas_and_strict_false() -> None:
    with FakeVertex(extra_betas=["context-management-2025-06-27"]) as wide:
        url = _vertex_url(wide, "fake-text")
        assert _beta_post(wide, url, CC_VERTEX_BODY, "context-management-2025-06-27").status_code == 200
        assert _beta_post(wide, url, CC_VERTEX_BODY, "per-turn-control-2026-07-01").status_code == 400
    with FakeVertex(strict=False) as lenient:
        url = _vertex_url(lenient, "fake-text")
        body = {**CC_VERTEX_BODY, "context_management": {}, "tags": ["a"]}
        assert _beta_post(lenient, url, body, "evil-beta-2099-01-01").status_code == 200
        got = _beta_post(lenient, url, {**CC_VERTEX_BODY, "model": "fake-text"}, None)
        assert got.json()["error"]["message"] == "model: Extra inputs are not permitted"  # the older check stays
        assert lenient.refusals == []


# =============================================================================================
# Foundry
# =============================================================================================


@pytest.fixture(scope="module")
def foundry() -> Iterator[FakeFoundry]:
    with FakeFoundry() as server:
        yield server


@pytest.fixture
def ffake(foundry: FakeFoundry) -> FakeFoundry:
    foundry.reset()
    foundry.token_lifetime_s = 3600
    foundry.token_delay_s = 0.0
    return foundry


@pytest.fixture
def fclient(ffake: FakeFoundry) -> Iterator[AnthropicFoundry]:
    with AnthropicFoundry(api_key="foundry-key", base_url=ffake.base_url, max_retries=0) as c:
        yield c


def _foundry_post(fake: FakeFoundry, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        f"{fake.base_url}{path}",
        json=body,
        headers={"anthropic-version": "2023-06-01", **headers},
        timeout=10,
    )


@pytest.mark.parametrize("name", SCENARIOS)
def test_foundry_sdk_stream_matches_final_message(fclient: AnthropicFoundry, ffake: FakeFoundry, name: str) -> None:
    streamed, types = _stream(fclient, name)
    assert types[0] == "message_start"
    assert types[-1] == "message_stop"
    recorded = ffake.requests[-1]
    assert (recorded.operation, recorded.model, recorded.auth, recorded.auth_error) == (
        "messages",
        name,
        "api-key",
        None,
    )
    assert recorded.api_key_headers == ("x-api-key", "api-key")  # the SDK sends both
    assert recorded.anthropic_version  # 2026-10-21 from SDK 2.14
    assert recorded.path == "/anthropic/v1/messages"
    assert recorded.json["model"] == name
    assert "authorization" not in recorded.headers

    expected = final_message(name)
    raw = fclient.messages.with_raw_response.create(model=name, max_tokens=64, messages=MESSAGES)
    assert raw.http_response.json() == expected
    assert _dump(streamed) == _dump(raw.parse()) == _expected(expected)
    headers = raw.http_response.headers
    assert headers["request-id"].startswith("req_")
    assert len(headers["apim-request-id"]) == 36
    assert not any(h.startswith("anthropic-ratelimit") for h in headers)


def test_foundry_count_tokens(fclient: AnthropicFoundry, ffake: FakeFoundry) -> None:
    counted = fclient.messages.count_tokens(model="fake-text", messages=MESSAGES)
    recorded = ffake.requests[-1]
    assert recorded.operation == "count_tokens"
    assert counted.input_tokens == foundry_count(recorded.json)


def test_foundry_api_key_headers(ffake: FakeFoundry) -> None:
    body = {"model": "fake-text", "max_tokens": 8, "messages": MESSAGES}
    for header in ("x-api-key", "api-key"):
        got = _foundry_post(ffake, "/v1/messages", body, {header: "foundry-key"})
        assert got.status_code == 200
        assert ffake.requests[-1].api_key_headers == (header,)
    for headers in ({}, {"api-key": "wrong"}, {"x-api-key": "foundry-key", "api-key": "wrong"}):
        got = _foundry_post(ffake, "/v1/messages", body, headers)
        assert got.status_code == 401
        assert got.json() == {"error": {"code": "401", "message": INVALID_KEY_MESSAGE}}
    assert ffake.requests[-1].auth_error == "bad-key"
    no_version = httpx.post(f"{ffake.base_url}/v1/messages", json=body, headers={"api-key": "foundry-key"})
    assert no_version.status_code == 400
    assert no_version.json()["error"]["type"] == "invalid_request_error"
    unknown = _foundry_post(ffake, "/v1/models", body, {"api-key": "foundry-key"})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "404")
    assert ffake.requests[-1].operation is None


def test_foundry_passes_claude_codes_messages_mode_request(ffake: FakeFoundry) -> None:
    """Foundry is the first-party API: the betas and fields only the first party takes are not refused."""
    betas = (
        "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
        "per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,advanced-tool-use-2025-11-20,"
        "effort-2025-11-24,thinking-token-count-2026-05-13,evil-beta-2099-01-01"
    )
    tools = [{"name": "Bash", "input_schema": {"type": "object"}, "eager_input_streaming": True, "defer_loading": True}]
    body = {
        "model": "fake-text",
        "max_tokens": 8,
        "messages": MESSAGES,
        "tools": tools,
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "tags": ["team-a"],
        "stream": True,
    }
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        got = _foundry_post(ffake, path, body, {"api-key": "foundry-key", "anthropic-beta": betas})
        assert got.status_code == 200, got.text
        assert ffake.requests[-1].anthropic_beta == betas


def test_foundry_sdk_wrong_key(ffake: FakeFoundry) -> None:
    with (
        AnthropicFoundry(api_key="wrong", base_url=ffake.base_url, max_retries=0) as client,
        pytest.raises(anthropic.AuthenticationError) as info,
    ):
        client.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES)
    assert info.value.status_code == 401
    assert info.value.body == {"error": {"code": "401", "message": INVALID_KEY_MESSAGE}}
    assert ffake.requests[-1].auth_error == "bad-key"


@pytest.mark.parametrize(
    ("model", "cls"),
    [
        ("fake-azure-429", anthropic.RateLimitError),
        ("fake-azure-500", anthropic.InternalServerError),
        ("fake-azure-content-filter", anthropic.BadRequestError),
    ],
)
def test_foundry_azure_error_scenarios(fclient: AnthropicFoundry, model: str, cls: type[Exception]) -> None:
    status, code, message, extra = AZURE_STATUS_SCENARIOS[model]
    for stream in (False, True):
        with pytest.raises(cls) as info:
            fclient.messages.create(model=model, max_tokens=8, messages=MESSAGES, stream=stream)
        assert isinstance(info.value, anthropic.APIStatusError)
        assert info.value.status_code == status
        assert info.value.body == {"error": {"code": code, "message": message}}
        for key, value in extra.items():
            assert info.value.response.headers[key] == value
        assert "apim-request-id" in info.value.response.headers


def test_foundry_model_level_errors(fclient: AnthropicFoundry) -> None:
    cases = {
        "fake-status-400": anthropic.BadRequestError,
        "fake-status-429": anthropic.RateLimitError,
        "fake-status-529": anthropic.OverloadedError,
    }
    for model, cls in cases.items():
        with pytest.raises(cls) as info:
            _stream(fclient, model)
        assert isinstance(info.value, anthropic.APIStatusError)
        assert info.value.type is not None
        assert info.value.request_id == info.value.response.headers["request-id"]


def test_foundry_slow_disconnect(fclient: AnthropicFoundry, ffake: FakeFoundry) -> None:
    with fclient.messages.stream(model="fake-slow", max_tokens=8, messages=MESSAGES) as stream:
        for i, _event in enumerate(stream):
            if i >= 4:
                break
    assert ffake.wait_for_disconnect(timeout=5)
    assert ffake.disconnects == 1


def test_foundry_https_resource(ffake: FakeFoundry) -> None:
    http_client = anthropic.DefaultHttpxClient(verify=ffake.ssl_context())
    with AnthropicFoundry(
        api_key="foundry-key", base_url=ffake.https_base_url, http_client=http_client, max_retries=0
    ) as client:
        created = client.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES)
    assert created.id == final_message("fake-text")["id"]
    assert ffake.requests[-1].tls is True


# -- Entra ID -----------------------------------------------------------------------------------


def test_foundry_entra_sync_credential(ffake: FakeFoundry) -> None:
    credential = ClientSecretCredential(
        ffake.tenant_id,
        ffake.client_id,
        ffake.client_secret,
        authority=ffake.authority_url,
        disable_instance_discovery=True,
        connection_verify=ffake.ca_file,
    )
    with credential:
        provider = get_bearer_token_provider(credential, FOUNDRY_SCOPE)
        with AnthropicFoundry(azure_ad_token_provider=provider, base_url=ffake.base_url, max_retries=0) as client:
            streamed, _ = _stream(client, "fake-tools")
            client.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES)
    assert _dump(streamed) == _expected(final_message("fake-tools"))
    kinds = [(t.kind, t.error) for t in ffake.token_requests]
    assert kinds == [("openid-configuration", None), ("token", None)]  # MSAL discovers, then caches the token
    exchange = ffake.token_requests[-1]
    assert (exchange.grant_type, exchange.client_id, exchange.scope) == (
        "client_credentials",
        ffake.client_id,
        FOUNDRY_SCOPE,
    )
    for recorded in ffake.requests:
        assert (recorded.auth, recorded.auth_error, recorded.api_key_headers) == ("bearer", None, ())
        assert recorded.headers["authorization"] == f"Bearer {exchange.access_token}"


def test_foundry_entra_async_credential(ffake: FakeFoundry) -> None:
    async def run() -> tuple[str, str]:
        async with AsyncClientSecretCredential(
            ffake.tenant_id,
            ffake.client_id,
            ffake.client_secret,
            authority=ffake.authority_host,  # scheme-less: azure-identity prefixes https://
            connection_verify=ffake.ca_file,
        ) as credential:
            token = await credential.get_token(FOUNDRY_SCOPE)
            provider = get_async_bearer_token_provider(credential, FOUNDRY_SCOPE)
            async with AsyncAnthropicFoundry(
                azure_ad_token_provider=provider, base_url=ffake.base_url, max_retries=0
            ) as client:
                created = await client.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES)
            return token.token, created.id

    token, message_id = asyncio.run(run())
    assert token in ffake.issued_tokens
    assert message_id == final_message("fake-text")["id"]
    assert [t.kind for t in ffake.token_requests] == ["token"]  # no discovery on the async path
    assert ffake.requests[-1].headers["authorization"] == f"Bearer {token}"
    # the token is a JWT for the Foundry audience
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert (claims["aud"], claims["tid"], claims["appid"]) == ("https://ai.azure.com", ffake.tenant_id, ffake.client_id)


def test_foundry_entra_errors(ffake: FakeFoundry) -> None:
    async def get_token(**overrides: Any) -> Any:
        args = {
            "tenant_id": ffake.tenant_id,
            "client_id": ffake.client_id,
            "client_secret": ffake.client_secret,
            **overrides,
        }
        scope = args.pop("scope", FOUNDRY_SCOPE)
        async with AsyncClientSecretCredential(
            authority=ffake.authority_url, connection_verify=ffake.ca_file, **args
        ) as credential:
            return await credential.get_token(scope)

    cases = [
        ({"client_secret": "wrong"}, "AADSTS7000215"),
        ({"client_id": "00000000-0000-4000-8000-00000000dead"}, "AADSTS700016"),
        ({"tenant_id": "00000000-0000-4000-8000-0000000000bb"}, "AADSTS90002"),
        ({"scope": "https://cognitiveservices.azure.com/.default"}, "AADSTS500011"),
    ]
    for overrides, code in cases:
        with pytest.raises(ClientAuthenticationError, match=code):
            asyncio.run(get_token(**overrides))
    assert all(t.access_token is None for t in ffake.token_requests)

    token_url = f"{ffake.authority_url}/{ffake.tenant_id}/oauth2/v2.0/token"
    form = {"grant_type": "client_credentials", "scope": FOUNDRY_SCOPE}
    with httpx.Client(verify=ffake.ssl_context(), timeout=10) as http:
        basic = http.post(token_url, data=form, auth=(ffake.client_id, ffake.client_secret))
        assert basic.status_code == 200
        assert set(basic.json()) == {"token_type", "expires_in", "ext_expires_in", "access_token"}
        assert ffake.token_requests[-1].secret_via == "basic"
        secret = {"client_id": ffake.client_id, "client_secret": ffake.client_secret}
        bad_scope = http.post(token_url, data={**form, **secret, "scope": "https://ai.azure.com/user_impersonation"})
        assert (bad_scope.status_code, bad_scope.json()["error"]) == (400, "invalid_scope")
        assert bad_scope.json()["error_codes"] == [1002012]
        no_secret = http.post(token_url, data={**form, "client_id": ffake.client_id})
        assert (no_secret.status_code, no_secret.json()["error"]) == (401, "invalid_client")
        assert http.get(f"{ffake.authority_url}/{ffake.tenant_id}/discovery/v2.0/keys").json() == ffake.jwks
        config = http.get(f"{ffake.authority_url}/{ffake.tenant_id}/v2.0/.well-known/openid-configuration").json()
        assert config["token_endpoint"] == token_url
    with pytest.raises(httpx.ConnectError):  # the CA is not trusted by default
        httpx.get(f"{ffake.authority_url}/{ffake.tenant_id}/discovery/v2.0/keys", timeout=10)


def test_foundry_bearer_failures(ffake: FakeFoundry) -> None:
    body = {"model": "fake-text", "max_tokens": 8, "messages": MESSAGES}
    token = ffake.issue_token()
    assert _foundry_post(ffake, "/v1/messages", body, {"authorization": f"Bearer {token}"}).status_code == 200
    assert ffake.requests[-1].auth == "bearer"
    expired = ffake.issue_token(lifetime_s=0)
    for bad, reason in ((expired, "expired"), ("not-a-token", "unknown")):
        got = _foundry_post(ffake, "/v1/messages", body, {"authorization": f"Bearer {bad}"})
        assert got.status_code == 401
        assert got.json() == {"error": {"code": "401", "message": INVALID_TOKEN_MESSAGE}}
        assert ffake.requests[-1].auth_error == reason
    assert ffake.revoke_tokens() >= 1
    got = _foundry_post(ffake, "/v1/messages", body, {"authorization": f"Bearer {token}"})
    assert got.status_code == 401
    assert ffake.requests[-1].auth_error == "revoked"
