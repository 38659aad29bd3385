"""``create_app(settings)``: the Litestar app, whose lifespan owns the upstream client and adapters."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.plugins import PluginProtocol
from litestar.plugins.core import MsgspecDIPlugin

import surfaces
from gateway.core import Gateway
from gateway.http.keys_api import KEY_HANDLERS
from gateway.http.login import LOGIN_HANDLERS
from gateway.http.managed import MANAGED_HANDLERS
from gateway.http.messages import messages_endpoint, method_not_allowed, send_error
from gateway.http.pages import PAGE_HANDLERS
from gateway.http.reports import REPORT_HANDLERS
from gateway.http.routes import HANDLERS, exception_handlers
from gateway.http.server import HeaderLimits
from gateway.http.spend_limits_api import SPEND_LIMIT_HANDLERS
from gateway.http.status import STATUS_HANDLERS
from gateway.observability.metrics import Metrics, multiprocess_dir
from gateway.observability.usage import Outcome, access_line, access_log
from gateway.routing.resilience import Resilience
from gateway.settings import Settings
from gateway.wire.errors import GatewayError, new_request_id
from gateway.wire.request import client_id
from gateway.wire.upstream import DEFAULT_CLIENT, make_client

__all__ = ["Gateway", "GatewayApp", "create_app"]

log = logging.getLogger("gateway")


_MESSAGES_ROUTES = {"/v1/messages": False, "/v1/messages/count_tokens": True}  # path -> count
_PROBES = frozenset({"/", "/api/hello"})  # Claude Code's start-up probes (HEAD): 200, no body
_SURFACE_PREFIXES = (surfaces.BEDROCK_PREFIX, surfaces.VERTEX_PREFIX)


class _Litestar(Litestar):
    """Litestar without the plugins it adds whenever a library is importable: its Pydantic and attrs plugins
    (DI, init, OpenAPI schemas) serve handlers that take or return those models, and none here does (msgspec
    throughout; no OpenAPI). Where pydantic is installed beside the gateway (the ``anthropic`` SDK brings it)
    they cost ~7 MB resident a worker and an import of pydantic and pydantic.v1."""

    @staticmethod
    def _get_default_plugins(plugins: list[PluginProtocol]) -> list[PluginProtocol]:
        plugins.append(MsgspecDIPlugin())
        return plugins


class GatewayApp:
    """The ASGI app: the Messages routes go straight to their edge (``gateway/http/messages.py``), everything else
    to Litestar, behind one boundary: every request leaves one access line, every response a ``request-id``,
    and an exception nothing handled becomes ``500 api_error`` in the Anthropic envelope."""

    def __init__(self, litestar: Litestar) -> None:
        self.litestar = litestar

    def header_limits(self) -> HeaderLimits:
        """What ``gateway.http.server``'s protocol enforces on a request head, from the running config."""
        gw: Gateway | None = getattr(self.litestar.state, "gateway", None)
        if gw is None:
            return HeaderLimits()
        server = gw.settings.server
        return HeaderLimits(
            server.max_header_bytes, server.max_headers, server.client_timeout_s, server.keep_alive_timeout_s
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.litestar(scope, receive, send)  # type: ignore[arg-type]
            return
        gw: Gateway = self.litestar.state.gateway
        path = scope["path"]
        count = _MESSAGES_ROUTES.get(path)
        if count is None:
            call = surfaces.match(scope["method"], path) if path.startswith(_SURFACE_PREFIXES) else None
            if call is not None and scope["method"] == "POST":  # Bedrock- and Vertex-shaped clients
                await messages_endpoint(gw, scope, receive, send, call=call)
            elif call is not None:
                await method_not_allowed(gw, scope, send, allow="POST", call=call)
            else:
                await self._other(gw, scope, receive, send)
        elif scope["method"] == "POST":
            await messages_endpoint(gw, scope, receive, send, count=count)
        else:
            await method_not_allowed(gw, scope, send, allow="POST")

    async def _other(self, gw: Gateway, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = time.monotonic()
        reply = _Watched(send)
        outcome = None
        try:
            if scope["path"] in _PROBES:
                await _probe(scope["method"], reply.send, reply.request_id)
            else:
                await self.litestar(scope, receive, reply.send)  # type: ignore[arg-type]
        except Exception:
            log.exception("unhandled error on %s %s (request %s)", scope["method"], scope["path"], reply.request_id)
            outcome = Outcome.INTERNAL_ERROR
            if not reply.started:
                await send_error(send, GatewayError("internal gateway error"), reply.request_id)
                reply.status = 500
        finally:
            if access_log.isEnabledFor(logging.INFO):
                headers = dict(scope["headers"])
                access_log.info(
                    "%s",
                    access_line(
                        request_id=reply.request_id,
                        method=scope["method"],
                        path=scope["path"],
                        status=reply.status,
                        outcome=outcome or _outcome_of_status(reply.status),
                        duration=time.monotonic() - started,
                        session_id=client_id(headers.get(b"x-claude-code-session-id", b"").decode("latin-1")) or "",
                        agent_id=client_id(headers.get(b"x-claude-code-agent-id", b"").decode("latin-1")) or "",
                    ),
                )


async def _probe(method: str, send: Any, request_id: str) -> None:
    """``HEAD`` (and ``GET``) of a probe path: 200 with no body; any other method: 405."""
    if method not in ("HEAD", "GET"):
        error = GatewayError(f"{method} is not allowed here; use HEAD or GET", headers={"allow": "GET, HEAD"})
        error.status_code, error.error_type = 405, "invalid_request_error"
        await send_error(send, error, request_id)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _outcome_of_status(status: int) -> str:
    if status == 0:
        return Outcome.CLIENT_CANCELLED
    if status >= 500:
        return Outcome.INTERNAL_ERROR
    return Outcome.REJECTED if status >= 400 else Outcome.COMPLETED


class _Watched:
    """A route's ``send``, watched: the status and request id it answered with; a response without a
    ``request-id`` gets the gateway's, and every response ``x-content-type-options: nosniff``."""

    __slots__ = ("_send", "request_id", "started", "status")

    def __init__(self, send: Any) -> None:
        self._send = send
        self.request_id = new_request_id()
        self.status = 0
        self.started = False

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            nosniff = False
            for name, value in headers:
                low = name.lower()
                if low == b"request-id":
                    self.request_id = value.decode("latin-1")
                elif low == b"x-content-type-options":
                    nosniff = True
            if not any(name.lower() == b"request-id" for name, _ in headers):
                headers.append((b"request-id", self.request_id.encode()))
            if not nosniff:
                headers.append((b"x-content-type-options", b"nosniff"))
            message = {**message, "headers": headers}
            self.status = message["status"]
            await self._send(message)
            self.started = True
            return
        await self._send(message)


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    upstream_client: str = DEFAULT_CLIENT,
    resilience: Resilience | None = None,
    config_path: str | Path | None = None,
    watch_interval_s: float | None = 1.0,
) -> GatewayApp:
    """``resilience``: the retry policy, timeouts and clock to use instead of the settings' (tests inject a
    fake clock and sleep). ``config_path``: the file to reload on SIGHUP and, every ``watch_interval_s``
    seconds, when it changes (None: no watching)."""
    metrics = metrics or Metrics()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        gateway = Gateway(settings, make_client(upstream_client), metrics, resilience, config_path=config_path)
        if settings.auth.open:
            log.warning("auth.open: true: the gateway serves requests without a key")
        app.state.gateway = gateway
        gateway.start()
        watcher = None
        if config_path is not None and watch_interval_s:
            watcher = asyncio.get_running_loop().create_task(gateway.watch(watch_interval_s))
        restore = _install_signals(gateway)
        # Everything built so far lives as long as the process: take it out of the cyclic collector's
        # scans, so a full collection walks only what requests allocate.
        gc.freeze()
        try:
            yield
        finally:
            restore()
            if watcher is not None:
                watcher.cancel()
            await gateway.aclose()
            if multiprocess_dir():  # this worker's live gauges leave the merged sums
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    return GatewayApp(
        _Litestar(
            route_handlers=[
                *HANDLERS,
                *STATUS_HANDLERS,
                *PAGE_HANDLERS,
                *REPORT_HANDLERS,
                *KEY_HANDLERS,
                *LOGIN_HANDLERS,
                *MANAGED_HANDLERS,
                *SPEND_LIMIT_HANDLERS,
            ],
            lifespan=[lifespan],
            exception_handlers=exception_handlers,
            request_max_body_size=None,
            logging_config=None,
            openapi_config=None,
        )
    )


def _install_signals(gateway: Gateway) -> Callable[[], None]:
    """SIGHUP reloads the config; SIGTERM starts the drain, then hands over to the server's own handler
    (uvicorn's, which stops accepting and waits for the requests in flight). Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGTERM)

    def on_term() -> None:
        gateway.begin_drain()
        if callable(previous):
            previous(signal.SIGTERM, None)

    try:
        loop.add_signal_handler(signal.SIGHUP, gateway.reload_soon)
        loop.add_signal_handler(signal.SIGTERM, on_term)
    except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - platforms without signals
        return lambda: None

    def restore() -> None:
        loop.remove_signal_handler(signal.SIGHUP)
        loop.remove_signal_handler(signal.SIGTERM)

    return restore
