"""Provider adapters. ``build_adapter`` turns one provider entry of the config into its adapter."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gateway.settings import (
    AnthropicProvider,
    BedrockMantleProvider,
    BedrockProvider,
    ClaudeAwsProvider,
    FoundryProvider,
    MockProvider,
    ProviderConfig,
    VertexProvider,
)
from gateway.wire.upstream import HttpClient

from ._http import HttpAdapter
from .base import Adapter
from .bedrock import BedrockAdapter, BedrockConverseAdapter
from .claude import ClaudeAdapter, claude_aws_adapter, foundry_adapter, mantle_adapter
from .mock import MockAdapter
from .profiles import profile_for
from .vertex import VertexAdapter

__all__ = ["Adapter", "build_adapter"]


def build_adapter(
    name: str, config: ProviderConfig, client: HttpClient, on_usage_mismatch: Callable[[str], None] | None = None
) -> Adapter:
    """``on_usage_mismatch(provider)``: called when a Bedrock stream's own usage and its invocation metrics
    disagree (the metrics layer counts it; adapters know nothing of metrics)."""
    adapter = _build(name, config, client, on_usage_mismatch)
    if isinstance(adapter, HttpAdapter):  # what its provider accepts of a request (adapters/profiles.py)
        tag = str(type(config).__struct_config__.tag)  # the config's `kind`
        kind = "bedrock_converse" if isinstance(config, BedrockProvider) and config.api == "converse" else tag
        adapter.kind = kind  # the provider's kind as configured (a span's gen_ai.provider.name)
        adapter.profile = profile_for(
            kind, allow=config.betas.allow, drop=config.betas.drop, drop_fields=config.drop_fields
        )
    return adapter


def _build(
    name: str, config: ProviderConfig, client: HttpClient, on_usage_mismatch: Callable[[str], None] | None
) -> Adapter:
    mismatch = partial(on_usage_mismatch, name) if on_usage_mismatch is not None else None
    match config:
        case AnthropicProvider():
            return ClaudeAdapter.from_config(name, config, client)
        case MockProvider():
            return MockAdapter(name, config)
        case BedrockProvider(api="converse"):
            return BedrockConverseAdapter(name, config, client, on_usage_mismatch=mismatch)
        case BedrockProvider():
            return BedrockAdapter(name, config, client, on_usage_mismatch=mismatch)
        case BedrockMantleProvider():
            return mantle_adapter(name, config, client)
        case ClaudeAwsProvider():
            return claude_aws_adapter(name, config, client)
        case VertexProvider():
            return VertexAdapter(name, config, client)
        case FoundryProvider():
            return foundry_adapter(name, config, client)
