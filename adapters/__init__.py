"""Provider adapters. ``build_adapter`` turns one provider entry of the config into its adapter."""

from __future__ import annotations

from gateway.settings import AnthropicProvider, MockProvider, ProviderConfig
from gateway.upstream import HttpClient

from .base import Adapter
from .claude import ClaudeAdapter
from .mock import MockAdapter

__all__ = ["Adapter", "build_adapter"]


def build_adapter(name: str, config: ProviderConfig, client: HttpClient) -> Adapter:
    match config:
        case AnthropicProvider():
            return ClaudeAdapter(name, config, client)
        case MockProvider():
            return MockAdapter(name, config)
