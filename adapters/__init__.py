"""Provider adapters. ``build_adapter`` turns one provider entry of the config into its adapter."""

from __future__ import annotations

from gateway.metrics import Metrics
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
from gateway.upstream import HttpClient

from .base import Adapter
from .bedrock import BedrockAdapter
from .claude import ClaudeAdapter, claude_aws_adapter, foundry_adapter, mantle_adapter
from .mock import MockAdapter
from .vertex import VertexAdapter

__all__ = ["Adapter", "build_adapter"]


def build_adapter(name: str, config: ProviderConfig, client: HttpClient, metrics: Metrics | None = None) -> Adapter:
    match config:
        case AnthropicProvider():
            return ClaudeAdapter.from_config(name, config, client)
        case MockProvider():
            return MockAdapter(name, config)
        case BedrockProvider():
            mismatch = metrics.usage_mismatch.labels(name).inc if metrics is not None else None
            return BedrockAdapter(name, config, client, on_usage_mismatch=mismatch)
        case BedrockMantleProvider():
            return mantle_adapter(name, config, client)
        case ClaudeAwsProvider():
            return claude_aws_adapter(name, config, client)
        case VertexProvider():
            return VertexAdapter(name, config, client)
        case FoundryProvider():
            return foundry_adapter(name, config, client)
