"""One immutable snapshot of everything a request reads of the config.

A request takes ``Gateway.runtime`` once, at its start, and uses that object to its end: its keys, routes,
settings and resilience all come from the same config, whatever reload happens in between (reading
``gw.keys`` before the body and ``gw.routes`` after it could serve one request with two configs). A reload
builds a new ``Runtime`` and swaps it in with one assignment; the one it replaced is *retired*, and its
adapters are closed as soon as its last request ends (not kept until shutdown).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from adapters import Adapter, build_adapter
from gateway.governance.keys import ClientKey, build_keys
from gateway.routing.resilience import Resilience
from gateway.routing.table import RouteTable
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.observability.metrics import Metrics
    from gateway.wire.upstream import HttpClient

__all__ = ["Runtime", "build_runtime"]

log = logging.getLogger("gateway")


class Runtime:
    """``settings``, ``keys``, ``admin_keys``, ``routes``, ``adapters`` and ``resilience`` of one config; never
    changed once built. ``enter``/``leave`` count the requests using it."""

    __slots__ = (
        "_closing",
        "_on_closed",
        "active",
        "adapters",
        "admin_keys",
        "key_index",
        "keys",
        "resilience",
        "retired",
        "routes",
        "settings",
    )

    def __init__(
        self,
        settings: Settings,
        adapters: Mapping[str, Adapter],
        routes: RouteTable,
        resilience: Resilience,
        keys: list[ClientKey],
        admin_keys: list[ClientKey],
    ) -> None:
        self.settings = settings
        self.adapters = dict(adapters)
        self.routes = routes
        self.resilience = resilience
        self.keys = keys
        self.key_index: dict[bytes, ClientKey] = {}  # digest -> key (governance.identity looks keys up by digest)
        for key in keys:
            self.key_index.setdefault(key.digest, key)  # two entries with one key: the first is the one
        self.admin_keys = admin_keys
        self.active = 0  # requests that took this runtime and have not ended
        self.retired = False  # a newer runtime serves new requests
        self._closing: asyncio.Task[None] | None = None
        self._on_closed: Callable[[Runtime], None] | None = None

    def enter(self) -> None:
        self.active += 1

    def leave(self) -> None:
        self.active -= 1
        if self.retired and self.active == 0:
            self._close_soon()

    def retire(self, on_closed: Callable[[Runtime], None] | None = None) -> None:
        """A newer runtime took over: close this one's adapters once its last request has ended (then call
        ``on_closed``)."""
        self.retired = True
        self._on_closed = on_closed
        if self.active == 0:
            self._close_soon()

    def _close_soon(self) -> None:
        if self._closing is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # retired outside the event loop: it is closed at shutdown instead
                return
            self._closing = loop.create_task(self.aclose())

    async def aclose(self) -> None:
        for name, adapter in self.adapters.items():
            try:
                await adapter.aclose()
            except Exception:  # one adapter's close must not keep the others open
                log.exception("closing provider %r of a retired config failed", name)
        if self._on_closed is not None:
            self._on_closed(self)

    async def closed(self) -> None:
        """Wait for the close a retirement started (tests, shutdown); close now if none could start."""
        if self._closing is None and self.retired and self.active == 0:
            self._close_soon()
        if self._closing is not None:
            await self._closing


def build_runtime(
    settings: Settings, client: HttpClient, metrics: Metrics, resilience: Resilience | None = None
) -> Runtime:
    """Build a runtime (adapters, routes, keys) from ``settings``. Blocking work may happen here (resolving an
    AWS region builds a botocore session): a reload runs it in a worker thread."""

    def mismatch(provider: str) -> None:
        metrics.usage_mismatch.labels(provider).inc()

    adapters = {name: build_adapter(name, config, client, mismatch) for name, config in settings.providers.items()}
    routes = RouteTable(settings.models, adapters, settings.resilience.breaker)
    return Runtime(
        settings,
        adapters,
        routes,
        resilience or Resilience(settings.resilience),
        build_keys(settings.auth.keys, settings.teams),
        build_keys(settings.admin.keys),
    )
