"""End to end with the real ``anthropic`` SDK: through the gateway to a fake Vertex AI whose OAuth tokens come
from a fake Google token endpoint (real google-auth signing a JWT with a key generated here), compared with
the SDK's own ``AnthropicVertex`` client talking to the same fake."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from adapters._google import GoogleTokenSource
from tests.conftest import RunningGateway, run_gateway, sdk_error
from tests.fakes.vertex import FakeVertex

KW: dict[str, Any] = {"max_tokens": 1024, "messages": [{"role": "user", "content": "Hello"}]}
AUTH = {"x-api-key": "gw-key"}
VERTEX_BODY = {"extra_body": {"anthropic_version": "vertex-2023-10-16"}}  # SDK 2.14 defaults its own (§7.1)


def config(fake: FakeVertex, credentials: Path, region: str = "us-east5") -> str:
    return f"""
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 100000}}}}
auth: {{keys: [gw-key]}}
providers:
  vertex: {{kind: vertex, region: {region}, project: {fake.project}, credentials_file: "{credentials}",
           base_url: "{fake.base_url}"}}
models:
  sonnet: {{targets: [{{provider: vertex, model: fake-citations@20250929}}]}}
  "*": {{targets: [{{provider: vertex}}]}}
"""


@pytest.fixture(scope="module")
def vertex() -> Iterator[FakeVertex]:
    with FakeVertex() as fake:
        yield fake


@pytest.fixture(scope="module")
def credentials(vertex: FakeVertex, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vertex.make_service_account(tmp_path_factory.mktemp("gcp"))


@pytest.fixture
def fake(vertex: FakeVertex) -> FakeVertex:
    vertex.reset()
    vertex.token_lifetime_s = 3600
    vertex.token_delay_s = 0.0
    return vertex


@pytest.fixture(scope="module")
def gw(vertex: FakeVertex, credentials: Path) -> Iterator[RunningGateway]:
    with run_gateway(config(vertex, credentials)) as running:
        yield running


def direct(fake: FakeVertex) -> anthropic.AnthropicVertex:
    return anthropic.AnthropicVertex(
        region="us-east5",
        project_id=fake.project,
        base_url=fake.base_url,
        access_token=fake.issue_token(),
        max_retries=0,
    )


def via(gw: RunningGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="gw-key", max_retries=0)


def streamed(client: Any, model: str, **kw: Any) -> tuple[dict[str, Any], list[Any]]:
    with client.messages.stream(model=model, **{**KW, **kw}) as stream:
        events = [event.model_dump(warnings=False) for event in stream]
        return stream.get_final_message().model_dump(warnings=False), events


@pytest.mark.parametrize(
    "model", ["fake-text", "fake-citations@20250929", "fake-tools", "fake-thinking", "fake-server-tools"]
)
def test_stream_equals_anthropic_vertex(model: str, fake: FakeVertex, gw: RunningGateway) -> None:
    want, want_events = streamed(direct(fake), model, **VERTEX_BODY)
    got, got_events = streamed(via(gw), model)
    assert got == want
    assert got_events == [e for e in want_events if e.get("type") != "vertex_event"]
    request = fake.requests[-1]
    assert request.route == "streamRawPredict" and request.region == "us-east5" and request.auth_error is None
    assert request.json.get("stream") is True and "model" not in request.json
    assert request.anthropic_version == "vertex-2023-10-16"


def test_vertex_event_frames_are_dropped(fake: FakeVertex, gw: RunningGateway) -> None:
    resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "fake-text", "stream": True, **KW}, headers=AUTH)
    assert resp.status_code == 200
    assert "vertex_event" not in resp.text and resp.text.rstrip().endswith('data: {"type":"message_stop"}')


@pytest.mark.parametrize("model", ["fake-text", "fake-tools", "fake-thinking"])
def test_json_equals_anthropic_vertex(model: str, fake: FakeVertex, gw: RunningGateway) -> None:
    want = direct(fake).messages.create(model=model, **KW, **VERTEX_BODY).model_dump(warnings=False)
    assert via(gw).messages.create(model=model, **KW).model_dump(warnings=False) == want
    assert fake.requests[-1].route == "rawPredict"


def test_alias_and_beta_header(fake: FakeVertex, gw: RunningGateway) -> None:
    via(gw).beta.messages.create(model="sonnet", betas=["context-1m-2025-08-07"], **KW)
    request = fake.requests[-1]
    assert request.model == "fake-citations@20250929"
    assert request.anthropic_beta == "context-1m-2025-08-07"
    assert "anthropic_beta" not in request.json


def test_count_tokens_keeps_the_model(fake: FakeVertex, gw: RunningGateway) -> None:
    result = via(gw).messages.count_tokens(model="fake-text", messages=KW["messages"])
    request = fake.requests[-1]
    assert request.route == "count-tokens" and request.json["model"] == "fake-text"
    assert result.input_tokens > 0


@pytest.mark.parametrize(
    ("model", "status", "exc", "etype"),
    [
        ("fake-quota", 429, anthropic.RateLimitError, "rate_limit_error"),
        ("fake-quota-list", 429, anthropic.RateLimitError, "rate_limit_error"),
        ("fake-precondition", 400, anthropic.BadRequestError, "invalid_request_error"),
        ("fake-unavailable", 529, anthropic.InternalServerError, "overloaded_error"),
        ("fake-status-529", 529, anthropic.InternalServerError, "overloaded_error"),
        ("fake-status-400", 400, anthropic.BadRequestError, "invalid_request_error"),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
def test_google_and_model_errors_reach_the_client_as_anthropic_errors(
    model: str, status: int, exc: type[Exception], etype: str, stream: bool, fake: FakeVertex, gw: RunningGateway
) -> None:
    err = sdk_error(via(gw), model, exc, stream=stream, **KW)
    assert err.status_code == status
    assert err.body["type"] == "error" and err.body["error"]["type"] == etype  # type: ignore[index]
    assert err.body["error"]["message"]  # type: ignore[index]


def test_every_request_carries_a_token_from_the_fake(fake: FakeVertex, gw: RunningGateway) -> None:
    for _ in range(3):
        via(gw).messages.create(model="fake-text", **KW)
    tokens = {r.token for r in fake.requests}
    assert len(tokens) == 1 and tokens <= set(fake.issued_tokens)


def test_revoked_token_is_refreshed_and_the_request_retried_once(fake: FakeVertex, gw: RunningGateway) -> None:
    via(gw).messages.create(model="fake-text", **KW)
    fake.revoke_tokens()
    fake.reset()
    got, _ = streamed(via(gw), "fake-text")
    assert got["content"][0]["type"] == "text"
    assert [r.auth_error for r in fake.requests] == ["revoked", None]
    assert len(fake.token_requests) == 1


def test_client_disconnect_closes_the_vertex_stream(fake: FakeVertex, gw: RunningGateway) -> None:
    with via(gw).messages.stream(model="fake-slow", **KW) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                break
    assert fake.wait_for_disconnect(timeout=5)


# --- the token source on its own: refresh before expiry, one refresh for many waiters ----------------------


def test_near_expiry_token_is_refreshed_before_use(fake: FakeVertex, credentials: Path) -> None:
    fake.token_lifetime_s = 60  # inside google-auth's 3 min 45 s window: stale as soon as it is issued

    async def main() -> list[str]:
        source = GoogleTokenSource(provider="v", credentials_file=str(credentials))
        first = await source.token()
        fake.token_lifetime_s = 3600
        second = await source.token()
        third = await source.token()
        return [first, second, third]

    first, second, third = asyncio.run(main())
    assert first != second and second == third
    assert len(fake.token_requests) == 2


def test_one_refresh_for_fifty_concurrent_requests(fake: FakeVertex, credentials: Path) -> None:
    fake.token_delay_s = 0.3

    async def main() -> set[str]:
        source = GoogleTokenSource(provider="v", credentials_file=str(credentials))
        tokens = await asyncio.gather(*(source.token() for _ in range(50)))
        return set(tokens)

    tokens = asyncio.run(main())
    assert len(tokens) == 1
    assert len(fake.token_requests) == 1


def test_fifty_concurrent_streams_through_the_gateway_share_one_token(
    fake: FakeVertex, credentials: Path, tmp_path: Path
) -> None:
    fake.token_delay_s = 0.3
    with run_gateway(config(fake, credentials, region="global")) as running:

        async def main() -> None:
            client = anthropic.AsyncAnthropic(base_url=running.url, api_key="gw-key", max_retries=0)
            async with client:
                await asyncio.gather(*(client.messages.create(model="fake-text", **KW) for _ in range(50)))

        asyncio.run(main())
    assert len(fake.token_requests) == 1
    assert len({r.token for r in fake.requests}) == 1 and len(fake.requests) == 50
    assert all(r.region == "global" for r in fake.requests)


def test_missing_credentials_file_is_a_clear_error(fake: FakeVertex, tmp_path: Path) -> None:
    with run_gateway(config(fake, tmp_path / "nope.json")) as running:
        resp = httpx.post(f"{running.url}/v1/messages", json={"model": "fake-text", **KW}, headers=AUTH)
    assert resp.status_code == 500
    assert resp.json()["error"]["type"] == "api_error"
    assert "Google credentials" in resp.json()["error"]["message"]
