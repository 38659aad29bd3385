"""End to end with the real ``anthropic`` SDK: through the gateway to a fake Microsoft Foundry resource, with an
API key or with Entra ID tokens from a fake authority (real azure-identity), compared with the SDK's own
``AnthropicFoundry`` client talking to the same fake."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import RunningGateway, run_gateway, sdk_error
from tests.fakes.foundry import FakeFoundry

KW: dict[str, Any] = {"max_tokens": 1024, "messages": [{"role": "user", "content": "Hello"}]}
AUTH = {"x-api-key": "gw-key"}


def config(fake: FakeFoundry) -> str:
    entra = (
        f'{{tenant_id: "{fake.tenant_id}", client_id: "{fake.client_id}", client_secret: "{fake.client_secret}", '
        f'authority: "{fake.authority_url}", ca_file: "{fake.ca_file}"}}'
    )
    return f"""
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 100000}}}}
auth: {{keys: [gw-key]}}
providers:
  foundry: {{kind: foundry, base_url: "{fake.base_url}", api_key: foundry-key}}
  foundry-wrong: {{kind: foundry, base_url: "{fake.base_url}", api_key: not-the-key}}
  foundry-entra: {{kind: foundry, base_url: "{fake.base_url}", entra: {entra}}}
models:
  opus: {{targets: [{{provider: foundry, model: fake-citations}}]}}
  wrong-key: {{targets: [{{provider: foundry-wrong, model: fake-text}}]}}
  "entra-*": {{targets: [{{provider: foundry-entra}}]}}
  "*": {{targets: [{{provider: foundry}}]}}
"""


@pytest.fixture(scope="module")
def foundry() -> Iterator[FakeFoundry]:
    with FakeFoundry() as fake:
        yield fake


@pytest.fixture
def fake(foundry: FakeFoundry) -> FakeFoundry:
    foundry.reset()
    return foundry


@pytest.fixture(scope="module")
def gw(foundry: FakeFoundry) -> Iterator[RunningGateway]:
    with run_gateway(config(foundry)) as running:
        yield running


def direct(fake: FakeFoundry) -> anthropic.AnthropicFoundry:
    return anthropic.AnthropicFoundry(api_key="foundry-key", base_url=fake.base_url, max_retries=0)


def via(gw: RunningGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="gw-key", max_retries=0)


def streamed(client: Any, model: str) -> tuple[dict[str, Any], list[Any]]:
    with client.messages.stream(model=model, **KW) as stream:
        events = [event.model_dump(warnings=False) for event in stream]
        return stream.get_final_message().model_dump(warnings=False), events


@pytest.mark.parametrize("model", ["fake-text", "fake-citations", "fake-tools", "fake-thinking"])
def test_stream_equals_anthropic_foundry(model: str, fake: FakeFoundry, gw: RunningGateway) -> None:
    want, want_events = streamed(direct(fake), model)
    got, got_events = streamed(via(gw), model)
    assert got == want and got_events == want_events
    request = fake.requests[-1]
    assert request.auth == "api-key" and set(request.api_key_headers) == {"x-api-key", "api-key"}
    assert request.model == model and request.json["model"] == model


@pytest.mark.parametrize("model", ["fake-text", "fake-tools"])
def test_json_equals_anthropic_foundry(model: str, fake: FakeFoundry, gw: RunningGateway) -> None:
    want = direct(fake).messages.create(model=model, **KW).model_dump(warnings=False)
    assert via(gw).messages.create(model=model, **KW).model_dump(warnings=False) == want


def test_alias_to_deployment_name(fake: FakeFoundry, gw: RunningGateway) -> None:
    got, _ = streamed(via(gw), "opus")
    assert any(b.get("citations") for b in got["content"])
    assert fake.requests[-1].model == "fake-citations"


def test_entra_token_from_the_authority(fake: FakeFoundry, gw: RunningGateway) -> None:
    for model in ("entra-fake-text", "entra-fake-tools", "entra-fake-thinking"):
        got, _ = streamed(via(gw), model)
        assert got["content"]
    requests = fake.requests
    assert {r.auth for r in requests} == {"bearer"} and not any(r.api_key_headers for r in requests)
    tokens = [t for t in fake.token_requests if t.kind == "token"]
    assert len(tokens) == 1  # fetched once by the first request, reused by the others
    assert all(r.auth_error is None for r in requests)


@pytest.mark.parametrize(
    ("model", "status", "exc", "etype"),
    [
        ("fake-azure-429", 429, anthropic.RateLimitError, "rate_limit_error"),
        ("fake-azure-500", 500, anthropic.InternalServerError, "api_error"),
        ("fake-azure-content-filter", 400, anthropic.BadRequestError, "invalid_request_error"),
        ("wrong-key", 401, anthropic.AuthenticationError, "authentication_error"),
        ("fake-status-529", 529, anthropic.InternalServerError, "overloaded_error"),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
def test_azure_errors_reach_the_client_as_anthropic_errors(
    model: str, status: int, exc: type[Exception], etype: str, stream: bool, fake: FakeFoundry, gw: RunningGateway
) -> None:
    err = sdk_error(via(gw), model, exc, stream=stream, **KW)
    assert err.status_code == status
    assert err.body["type"] == "error" and err.body["error"]["type"] == etype  # type: ignore[index]
    assert "not-the-key" not in str(err.body) and "foundry-key" not in str(err.body)
    if model == "fake-azure-429":
        assert err.response.headers["retry-after"] == "5"


def test_count_tokens(fake: FakeFoundry, gw: RunningGateway) -> None:
    result = via(gw).messages.count_tokens(model="fake-text", messages=KW["messages"])
    assert result.input_tokens > 0 and fake.requests[-1].operation == "count_tokens"


def test_client_disconnect_closes_the_foundry_stream(fake: FakeFoundry, gw: RunningGateway) -> None:
    with via(gw).messages.stream(model="fake-slow", **KW) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                break
    assert fake.wait_for_disconnect(timeout=5)


def test_bad_entra_secret_is_a_clear_gateway_error(fake: FakeFoundry) -> None:
    yaml = f"""
auth: {{open: true}}
providers:
  f: {{kind: foundry, base_url: "{fake.base_url}", entra: {{tenant_id: "{fake.tenant_id}",
      client_id: "{fake.client_id}", client_secret: wrong-secret, authority: "{fake.authority_url}",
      ca_file: "{fake.ca_file}"}}}}
models: {{"*": {{targets: [{{provider: f}}]}}}}
"""
    with run_gateway(yaml) as running:
        resp = httpx.post(f"{running.url}/v1/messages", json={"model": "fake-text", **KW})
    assert resp.status_code == 500
    body = resp.json()
    assert body["error"]["type"] == "api_error" and "Entra" in body["error"]["message"]
    assert "wrong-secret" not in resp.text
