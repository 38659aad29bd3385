"""``kind: anthropic`` — the Claude API itself (or anything that speaks it at ``base_url``) — and the AWS
surfaces that speak the same first-party API: Claude Platform on AWS (``kind: claude_aws``) and the Bedrock
Messages endpoint (``kind: bedrock_mantle``). They differ only in base URL, auth and one extra header."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping

from gateway.request import ProxyRequest
from gateway.settings import AnthropicProvider, BedrockMantleProvider, ClaudeAwsProvider, FoundryProvider
from gateway.upstream import HttpClient, Timeouts, UpstreamResponse

from ._aws import CredentialSource, SigV4Signer, sigv4_headers
from .base import JsonReply, SseEventStream, checked

__all__ = [
    "DEFAULT_VERSION",
    "ClaudeAdapter",
    "aws_region",
    "claude_aws_adapter",
    "foundry_adapter",
    "mantle_adapter",
]

DEFAULT_VERSION = "2023-06-01"
USER_AGENT = "messages-gateway/0.1"

Sign = Callable[[str, str, Mapping[str, str], bytes], Awaitable[dict[str, str]]]
"""``(method, url, headers, body) -> headers to send``: request signing (SigV4) for providers that need it."""


class ClaudeAdapter:
    kind = "anthropic"

    def __init__(
        self,
        name: str,
        client: HttpClient,
        *,
        base_url: str,
        timeouts: Timeouts,
        key_headers: Mapping[str, str] | None = None,
        forward_client_key: bool = False,
        extra_headers: Mapping[str, str] | None = None,
        sign: Sign | None = None,
        kind: str = "anthropic",
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self._client = client
        base = base_url.rstrip("/")
        self._messages_url = base + "/v1/messages"
        self._count_url = base + "/v1/messages/count_tokens"
        self._timeouts = timeouts
        self._key_headers = dict(key_headers or {})
        self._forward_client_key = forward_client_key
        self._extra_headers = dict(extra_headers or {})
        self._sign = sign
        self._on_close = on_close

    @classmethod
    def from_config(cls, name: str, config: AnthropicProvider, client: HttpClient) -> ClaudeAdapter:
        return cls(
            name,
            client,
            base_url=config.base_url,
            timeouts=Timeouts(config.connect_timeout_s, config.read_timeout_s),
            key_headers={"x-api-key": config.api_key} if config.api_key else None,
            forward_client_key=config.forward_client_key,
        )

    def _headers(self, request: ProxyRequest, *, stream: bool) -> dict[str, str]:
        # The client's forwarded extras first: what the gateway and the provider config set wins over them.
        headers = {
            **request.extra_headers,
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
            "anthropic-version": request.anthropic_version or DEFAULT_VERSION,
            "user-agent": USER_AGENT,
            **self._extra_headers,
        }
        if request.anthropic_beta:
            headers["anthropic-beta"] = request.anthropic_beta
        if self._forward_client_key:
            headers.update(request.client_auth)
        else:
            headers.update(self._key_headers)
        return headers

    async def _post(self, url: str, request: ProxyRequest, body: bytes, *, stream: bool) -> UpstreamResponse:
        if request.beta:
            url += "?beta=true"
        headers = self._headers(request, stream=stream)
        if self._sign is not None:
            headers = await self._sign("POST", url, headers, body)
        resp = await self._client.send("POST", url, headers=headers, body=body, timeouts=self._timeouts)
        return await checked(resp, self.name)

    def _body(self, request: ProxyRequest, model: str) -> bytes:
        return request.body if model == request.model else request.body_with(set={"model": model})

    async def open_stream(self, request: ProxyRequest, model: str) -> SseEventStream:
        resp = await self._post(self._messages_url, request, self._body(request, model), stream=True)
        return SseEventStream(resp)

    async def complete(self, request: ProxyRequest, model: str) -> JsonReply:
        resp = await self._post(self._messages_url, request, self._body(request, model), stream=False)
        return await JsonReply.read(resp, self.name, check_json=False)

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply:
        resp = await self._post(self._count_url, request, self._body(request, model), stream=False)
        return await JsonReply.read(resp, self.name)

    async def aclose(self) -> None:
        if self._on_close is not None:
            await self._on_close()


def aws_region(configured: str | None, profile: str | None = None) -> str:
    """The configured region, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` / the profile's, else us-east-1."""
    if configured:
        return configured
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if os.environ.get(var):
            return os.environ[var]
    from botocore.session import Session

    region = Session(profile=profile).get_config_variable("region")
    return region if isinstance(region, str) and region else "us-east-1"


def aws_signer(name: str, config: BedrockMantleProvider | ClaudeAwsProvider, service: str, region: str) -> Sign:
    signer = SigV4Signer(service, region)
    source = CredentialSource(
        provider=name,
        access_key_id=config.access_key_id,
        secret_access_key=config.secret_access_key,
        session_token=config.session_token,
        profile=config.profile,
    )

    async def sign(method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        return await sigv4_headers(signer, source, method, url, headers, body)

    return sign


def _aws_first_party(
    name: str,
    config: BedrockMantleProvider | ClaudeAwsProvider,
    client: HttpClient,
    *,
    base_url: str,
    api_key: str | None,
    region: str,
    kind: str,
    extra_headers: Mapping[str, str] | None = None,
) -> ClaudeAdapter:
    return ClaudeAdapter(
        name,
        client,
        base_url=config.base_url or base_url,
        timeouts=Timeouts(config.connect_timeout_s, config.read_timeout_s),
        key_headers={"authorization": f"Bearer {api_key}"} if api_key else None,
        extra_headers=extra_headers,
        sign=None if api_key else aws_signer(name, config, config.signing_name, region),
        kind=kind,
    )


def mantle_adapter(name: str, config: BedrockMantleProvider, client: HttpClient) -> ClaudeAdapter:
    """The Bedrock Messages endpoint: Bedrock API key (``api_key`` / ``AWS_BEARER_TOKEN_BEDROCK``) or SigV4."""
    region = aws_region(config.region, config.profile)
    api_key = config.api_key
    if not api_key and not (config.access_key_id or config.profile):
        api_key = os.environ.get("AWS_BEARER_TOKEN_BEDROCK") or None
    return _aws_first_party(
        name,
        config,
        client,
        base_url=f"https://bedrock-mantle.{region}.api.aws/anthropic",
        api_key=api_key,
        region=region,
        kind="bedrock_mantle",
    )


def claude_aws_adapter(name: str, config: ClaudeAwsProvider, client: HttpClient) -> ClaudeAdapter:
    """Claude Platform on AWS: an API key, or SigV4; every request names its ``anthropic-workspace-id``."""
    region = aws_region(config.region, config.profile)
    return _aws_first_party(
        name,
        config,
        client,
        base_url=f"https://aws-external-anthropic.{region}.api.aws",
        api_key=config.api_key,
        region=region,
        kind="claude_aws",
        extra_headers={"anthropic-workspace-id": config.workspace_id},
    )


def foundry_adapter(name: str, config: FoundryProvider, client: HttpClient) -> ClaudeAdapter:
    """Microsoft Foundry: the first-party API under ``/anthropic``; the key as both ``x-api-key`` and ``api-key``
    (as the SDK sends it), or an Entra ID bearer token."""
    from ._entra import EntraTokenSource

    base_url = config.base_url or f"https://{config.resource}.services.ai.azure.com/anthropic"
    sign: Sign | None = None
    on_close: Callable[[], Awaitable[None]] | None = None
    if config.entra is not None:
        tokens = EntraTokenSource(provider=name, settings=config.entra)

        async def bearer(method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
            return {**headers, "authorization": f"Bearer {await tokens.token()}"}

        sign, on_close = bearer, tokens.aclose
    return ClaudeAdapter(
        name,
        client,
        base_url=base_url,
        timeouts=Timeouts(config.connect_timeout_s, config.read_timeout_s),
        key_headers={"x-api-key": config.api_key, "api-key": config.api_key} if config.api_key else None,
        sign=sign,
        kind="foundry",
        on_close=on_close,
    )
