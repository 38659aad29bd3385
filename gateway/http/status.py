"""``GET /v1/gateway/status``: every alias, its strategy and targets, and each target's health (breaker state,
cooldown left, recent success rate, time to first event, streams in flight) — the same objects the pipeline
routes with, read at the moment of the request. Keyed like the other routes when keys are configured.

Two scopes (``scope`` in the document). An admin key (or an open gateway, which has no one to hide from) reads
``gateway``: every alias with its targets' providers, upstream models, breaker statistics and the process's token
and outcome totals. A client key reads ``key``: only the aliases it may use, each with its state and its targets'
states (no provider, no upstream model, no counts of other keys' traffic), and its own usage today (UTC) from the
ledger — what ``/v1/organizations/usage_report/messages`` gives it (issue 31: a client key saw the whole
organisation's totals)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get

from gateway.governance.keys import is_admin, may_use
from gateway.governance.store import StoreError, UsageQuery
from gateway.http.routes import error_response
from gateway.observability.metrics import TOKEN_TYPES
from gateway.wire.errors import GatewayError, StoreUnavailable, new_request_id

if TYPE_CHECKING:
    from gateway.core import Gateway
    from gateway.governance.keys import ClientKey
    from gateway.routing.table import Route

__all__ = ["STATUS_HANDLERS", "key_document", "status_document"]

_encode = msgspec.json.Encoder().encode
_DAY_MS = 86_400_000


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


_ALIAS_STATE = {"closed": "available", "half_open": "recovering", "open": "unavailable"}


def _health(route: Route, now: float) -> dict[str, Any]:
    """An alias as a client key sees it: its state and its targets' (in order), nothing of their traffic."""
    targets = []
    for target in route.targets:
        snap = target.health.snapshot(now)
        throttled = snap["throttled_remaining_s"]
        state = "throttled" if snap["state"] == "closed" and throttled else _ALIAS_STATE[str(snap["state"])]
        targets.append(
            {
                "state": state,
                "cooldown_remaining_s": snap["cooldown_remaining_s"],
                "throttled_remaining_s": throttled,
            }
        )
    states = {t["state"] for t in targets}
    overall = "available" if "available" in states else "degraded" if states - {"unavailable"} else "unavailable"
    return {"alias": route.alias, "state": overall, "targets": targets}


async def _own_usage(gw: Gateway, key: ClientKey) -> dict[str, dict[str, Any]]:
    """The key's tokens and requests today (UTC) per alias, from the ledger (queued rows included)."""
    if gw.ledger is None:
        return {}
    now_ms = int(time.time() * 1000)
    start = now_ms - now_ms % _DAY_MS
    query = UsageQuery(
        start_ms=start, end_ms=now_ms + 1, bucket_ms=_DAY_MS, group_by=("alias",), filters={"key_name": (key.id,)}
    )
    await gw.ledger.flush()
    try:
        totals = await gw.ledger.store.totals(query)
    except StoreError as exc:
        raise StoreUnavailable(f"the usage store cannot be read: {exc}") from exc
    out: dict[str, dict[str, Any]] = {}
    for t in totals:
        out[t.dimensions.get("alias", "")] = {
            "requests": t.requests,
            "tokens": {
                "input": t.input_tokens,
                "output": t.output_tokens,
                "cache_read": t.cache_read_input_tokens,
                "cache_creation": t.cache_creation_input_tokens,
            },
        }
    return out


async def key_document(gw: Gateway, key: ClientKey, now: float | None = None) -> dict[str, Any]:
    """The ``key`` scope: the aliases ``key`` may use (as ``GET /v1/models`` lists them), their health, and its
    own usage today."""
    now = gw.resilience.clock() if now is None else now
    routes = [route for route in gw.routes.all_routes() if may_use(key, route, route.alias)]
    usage = await _own_usage(gw, key)
    zero = {"requests": 0, "tokens": dict.fromkeys(TOKEN_TYPES, 0)}
    aliases = [{**_health(route, now), "today": usage.get(route.alias, zero)} for route in routes]
    return {"scope": "key", "key": key.name, "aliases": aliases}


@get("/v1/gateway/status")
async def gateway_status(request: Request[Any, Any, Any]) -> Response[bytes]:
    gw: Gateway = request.app.state.gateway
    rid = new_request_id()
    try:
        if is_admin(gw.admin_keys, request.headers):
            document = {"scope": "gateway", **status_document(gw)}
        else:
            _, key = await gw.identity.authenticate(gw.runtime, request.headers)
            if key is None:  # an open gateway (auth.open): nobody to keep apart
                document = {"scope": "gateway", **status_document(gw)}
            else:
                document = await key_document(gw, key)
    except GatewayError as exc:
        return error_response(exc, rid)
    return Response(_encode(document), media_type="application/json", headers={"request-id": rid})


STATUS_HANDLERS = [gateway_status]
