"""``create_app(settings)``: the Litestar app, whose lifespan owns the upstream client and adapters."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar

from adapters import Adapter, build_adapter
from gateway.api import HANDLERS, exception_handlers
from gateway.edge import build_keys
from gateway.messages import messages_endpoint, method_not_allowed
from gateway.metrics import Metrics
from gateway.pipeline import Resilience
from gateway.routing import RouteTable
from gateway.settings import Settings
from gateway.status import STATUS_HANDLERS
from gateway.upstream import HttpClient, make_client

__all__ = ["Gateway", "GatewayApp", "create_app"]

log = logging.getLogger("gateway")


class Gateway:
    """Everything a request needs, built once per process from the settings."""

    def __init__(
        self, settings: Settings, client: HttpClient, metrics: Metrics, resilience: Resilience | None = None
    ) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.keys = build_keys(settings.auth.keys)
        self.adapters: dict[str, Adapter] = {
            name: build_adapter(name, config, client, metrics) for name, config in settings.providers.items()
        }
        self.routes = RouteTable(settings.models, self.adapters, settings.resilience.breaker)
        self.resilience = resilience or Resilience(settings.resilience)

    async def aclose(self) -> None:
        for adapter in self.adapters.values():
            await adapter.aclose()
        await self.client.aclose()


class GatewayApp:
    """The ASGI app: ``POST /v1/messages`` goes straight to its endpoint, everything else to Litestar."""

    def __init__(self, litestar: Litestar) -> None:
        self.litestar = litestar

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/messages":
            if scope["method"] == "POST":
                await messages_endpoint(self.litestar.state.gateway, scope, receive, send)
            else:
                await method_not_allowed(scope, send, allow="POST")
        else:
            await self.litestar(scope, receive, send)  # type: ignore[arg-type]


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    upstream_client: str = "aiohttp",
    resilience: Resilience | None = None,
) -> GatewayApp:
    """``resilience``: the retry policy, timeouts and clock to use instead of the settings' (tests inject a
    fake clock and sleep)."""
    metrics = metrics or Metrics()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        gateway = Gateway(settings, make_client(upstream_client), metrics, resilience)
        if not gateway.keys:
            log.warning("auth.keys is empty: the gateway accepts requests without a key")
        app.state.gateway = gateway
        # Everything built so far lives as long as the process: take it out of the cyclic collector's
        # scans, so a full collection walks only what requests allocate.
        gc.freeze()
        try:
            yield
        finally:
            await gateway.aclose()

    return GatewayApp(
        Litestar(
            route_handlers=[*HANDLERS, *STATUS_HANDLERS],
            lifespan=[lifespan],
            exception_handlers=exception_handlers,
            request_max_body_size=None,
            logging_config=None,
            openapi_config=None,
        )
    )
