"""``GET /v1/gateway/status``: every alias, its strategy and targets, and each target's health (breaker state,
cooldown left, recent success rate, time to first event, streams in flight) — the same objects the pipeline
routes with, read at the moment of the request. Keyed like the other routes when keys are configured."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get

from gateway.governance.keys import is_admin, may_use
from gateway.http.routes import error_response
from gateway.observability.metrics import TOKEN_TYPES
from gateway.wire.errors import GatewayError, new_request_id

if TYPE_CHECKING:
    from gateway.core import Gateway
    from gateway.routing.table import Route

__all__ = ["STATUS_HANDLERS", "status_document"]

_encode = msgspec.json.Encoder().encode


_Totals = dict[tuple[str, str, str], dict[str, float]]


def status_document(
    gw: Gateway, now: float | None = None, *, visible: Callable[[Route], bool] | None = None
) -> dict[str, Any]:
    """Routes and health from the live route table; token totals and request outcomes from the metrics
    registry (the samples ``/metrics`` renders), per target and per alias; only the routes ``visible`` keeps."""
    now = gw.resilience.clock() if now is None else now  # the clock the breakers run on
    tokens = gw.metrics.totals(gw.metrics.tokens, "type")
    outcomes = gw.metrics.totals(gw.metrics.requests, "outcome")
    routes = [route for route in gw.routes.all_routes() if visible is None or visible(route)]
    # Token totals and outcomes are every worker's (merged); target health is the answering worker's own.
    workers = int(os.environ.get("MESSAGES_GATEWAY_WORKERS") or gw.settings.server.workers)  # set by `serve`
    worker = {"pid": os.getpid(), "workers": workers}
    return {"aliases": [_route(route, now, tokens, outcomes) for route in routes], "worker": worker}


def _sum(totals: _Totals, alias: str, provider: str | None, model: str | None, keys: tuple[str, ...] = ()) -> Any:
    """The rows of ``totals`` for an alias (and a target: its provider, and its model unless it passes the
    client's through), added up by label."""
    out: dict[str, int] = dict.fromkeys(keys, 0)
    for (a, p, m), row in totals.items():
        if a == alias and (provider is None or p == provider) and (model is None or m == model):
            for key, value in row.items():
                out[key] = out.get(key, 0) + int(value)
    return out


def _route(route: Route, now: float, tokens: _Totals, outcomes: _Totals) -> dict[str, Any]:
    weights = route.balancer.weights
    alias = route.alias
    return {
        "alias": alias,
        "strategy": route.strategy,
        "tokens": _sum(tokens, alias, None, None, TOKEN_TYPES),
        "requests": _sum(outcomes, alias, None, None),
        "targets": [
            {
                "provider": target.provider,
                "model": target.model,
                **({"weight": weights[i]} if weights is not None else {}),
                **target.health.snapshot(now),
                "tokens": _sum(tokens, alias, target.provider, target.model, TOKEN_TYPES),
                "requests": _sum(outcomes, alias, target.provider, target.model),
            }
            for i, target in enumerate(route.targets)
        ],
    }


@get("/v1/gateway/status")
async def gateway_status(request: Request[Any, Any, Any]) -> Response[bytes]:
    gw: Gateway = request.app.state.gateway
    rid = new_request_id()
    if is_admin(gw.admin_keys, request.headers):
        document = status_document(gw)
    else:
        try:
            _, key = await gw.identity.authenticate(gw.runtime, request.headers)
        except GatewayError as exc:
            return error_response(exc, rid)
        # a client key sees the aliases it may use, as GET /v1/models lists them
        document = status_document(gw, visible=lambda route: may_use(key, route, route.alias))
    return Response(_encode(document), media_type="application/json", headers={"request-id": rid})


STATUS_HANDLERS = [gateway_status]
