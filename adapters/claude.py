"""``kind: anthropic`` — the Claude API itself (or anything that speaks it at ``base_url``) — and the surfaces
that speak the same first-party API: Claude Platform on AWS (``kind: claude_aws``), the Bedrock Messages
endpoint (``kind: bedrock_mantle``) and Microsoft Foundry (``kind: foundry``). They differ only in base URL,
authentication (an ``Auth``) and one extra header; the request is prepared the same way for all of them."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.settings import AnthropicProvider, BedrockMantleProvider, ClaudeAwsProvider, FoundryProvider
from gateway.wire.request import ProxyRequest
from gateway.wire.upstream import HttpClient, Timeouts

from ._aws import aws_auth, aws_region, bedrock_api_key
from ._http import (
    USER_AGENT,
    Auth,
    BearerAuth,
    ClientKeyAuth,
    HeaderAuth,
    HttpAdapter,
    Operation,
    Prepared,
    provider_timeouts,
)
from .profiles import filter_request

__all__ = [
    "DEFAULT_VERSION",
    "USER_AGENT",
    "ClaudeAdapter",
    "claude_aws_adapter",
    "foundry_adapter",
    "mantle_adapter",
]

DEFAULT_VERSION = "2023-06-01"


class ClaudeAdapter(HttpAdapter):
    kind = "anthropic"

    def __init__(
        self,
        name: str,
        client: HttpClient,
        *,
        base_url: str,
        timeouts: Timeouts,
        auth: Auth | None = None,
        extra_headers: Mapping[str, str] | None = None,
        kind: str = "anthropic",
    ) -> None:
        super().__init__(name, client, timeouts=timeouts, auth=auth)
        self.kind = kind
        base = base_url.rstrip("/")
        self._messages_url = base + "/v1/messages"
        self._count_url = base + "/v1/messages/count_tokens"
        self._extra_headers = dict(extra_headers or {})

    @classmethod
    def from_config(cls, name: str, config: AnthropicProvider, client: HttpClient) -> ClaudeAdapter:
        auth: Auth | None = None
        if config.forward_client_key:
            auth = ClientKeyAuth()
        elif config.api_key:
            auth = HeaderAuth({"x-api-key": config.api_key})
        return cls(
            name,
            client,
            base_url=config.base_url,
            timeouts=provider_timeouts(config),
            auth=auth,
        )

    def headers(self, request: ProxyRequest, *, stream: bool) -> dict[str, str]:
        """The headers before authentication. The client's forwarded extras first: what the gateway and the
        provider config set wins over them (and the credentials, added by ``auth``, over everything)."""
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
        return headers

    async def prepare(self, request: ProxyRequest, model: str, operation: Operation) -> Prepared:
        url = self._count_url if operation is Operation.COUNT else self._messages_url
        if request.beta:
            url += "?beta=true"
        headers = self.headers(request, stream=operation is Operation.STREAM)
        profile = self.profile
        if profile.passthrough:  # the first party (and Foundry): everything as it came
            request.dropped = ()
            body = request.body if model == request.model else request.body_with(set={"model": model})
            return Prepared(url, body, headers)
        kept = filter_request(profile, request)  # Bedrock Mantle, or an operator's override (adapters/profiles.py)
        headers.pop("anthropic-beta", None)
        if kept.header:
            headers["anthropic-beta"] = kept.header
        body = request.body_with(set={**kept.set, "model": model}, drop=kept.drop)
        return Prepared(url, body, headers)


def mantle_adapter(name: str, config: BedrockMantleProvider, client: HttpClient) -> ClaudeAdapter:
    """The Bedrock Messages endpoint: Bedrock API key (``api_key`` / ``AWS_BEARER_TOKEN_BEDROCK``) or SigV4."""
    region = aws_region(config.region, config.profile)
    return ClaudeAdapter(
        name,
        client,
        base_url=config.base_url or f"https://bedrock-mantle.{region}.api.aws/anthropic",
        timeouts=provider_timeouts(config),
        auth=aws_auth(name, config, config.signing_name, region, api_key=bedrock_api_key(config)),
        kind="bedrock_mantle",
    )


def claude_aws_adapter(name: str, config: ClaudeAwsProvider, client: HttpClient) -> ClaudeAdapter:
    """Claude Platform on AWS: an API key, or SigV4; every request names its ``anthropic-workspace-id``."""
    region = aws_region(config.region, config.profile)
    return ClaudeAdapter(
        name,
        client,
        base_url=config.base_url or f"https://aws-external-anthropic.{region}.api.aws",
        timeouts=provider_timeouts(config),
        auth=aws_auth(name, config, config.signing_name, region, api_key=config.api_key),
        extra_headers={"anthropic-workspace-id": config.workspace_id},
        kind="claude_aws",
    )


def foundry_adapter(name: str, config: FoundryProvider, client: HttpClient) -> ClaudeAdapter:
    """Microsoft Foundry: the first-party API under ``/anthropic``; the key as both ``x-api-key`` and ``api-key``
    (as the SDK sends it), or an Entra ID bearer token."""
    from ._entra import EntraTokenSource

    auth: Auth | None = None
    if config.entra is not None:
        tokens = EntraTokenSource(provider=name, settings=config.entra)
        auth = BearerAuth(tokens.token, close=tokens.aclose)
    elif config.api_key:
        auth = HeaderAuth({"x-api-key": config.api_key, "api-key": config.api_key})
    return ClaudeAdapter(
        name,
        client,
        base_url=config.base_url or f"https://{config.resource}.services.ai.azure.com/anthropic",
        timeouts=provider_timeouts(config),
        auth=auth,
        kind="foundry",
    )
