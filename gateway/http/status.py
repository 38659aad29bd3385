"""``GET /v1/gateway/status``: every alias, its strategy and targets, and each target's health (breaker state,
cooldown left, recent success rate, time to first event, streams in flight) — the same objects the pipeline
routes with, read at the moment of the request. Keyed like the other routes when keys are configured.

Two scopes (``scope`` in the document). An admin key (or an open gateway, which has no one to hide from) reads
``gateway``: every alias with its targets' providers, upstream models, breaker statistics and the process's token
and outcome totals. A client key reads ``key``: only the aliases it may use, each with its state and its targets'
states (no provider, no upstream model, no counts of other keys' traffic), and its own usage today (UTC) from the
ledger — what ``/v1/organizations/usage_report/messages`` gives it (issue 31: a client key saw the whole
organisation's totals).

Both scopes carry ``limits``: per team and per key (an admin's: every team of the config and every key, the config's
and the issued; a client key's: its own, and its team's budget), the budget (``usd``, ``per``) with the spend of its
current window (``spent_usd``, read from the limiter's counters — what admission compares with the budget — and
``resets_at``), the rate limits, and the requests each limit refused (``refusals``, by limit kind), counted by this
process since it started (``refusals_since``; with several workers, the answering worker's own)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
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
    from gateway.settings import LimitSettings

__all__ = ["STATUS_HANDLERS", "key_document", "limits_document", "status_document"]

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
                "recent_failures": target.health.recent_failures(now),  # in the breaker's window
                "failure_window_s": target.health.window_s,
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


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_RATES = ("requests_per_minute", "tokens_per_minute", "max_inflight")
_Entry = tuple[str, dict[str, Any], "LimitSettings | None"]  # (scope, what names it, its limits)


async def _limit_entries(gw: Gateway, entries: Sequence[_Entry], *, refusals: bool = True) -> list[dict[str, Any]]:
    """Each scope's budget and the spend of its window, its rate limits and its refusals by limit kind."""
    limiter = gw.limiter
    budgeted = [(scope, limits) for scope, _, limits in entries if limits is not None and limits.budget is not None]
    spends = iter(await limiter.budget_spend(budgeted))
    counts: dict[str, dict[str, int]] = {}
    for (scope, kind), n in limiter.refusals.items():
        counts.setdefault(scope, {})[kind] = n
    out = []
    for scope, names, limits in entries:
        budget = None
        if limits is not None and limits.budget is not None:
            spent, ends = next(spends)
            budget = {"usd": limits.budget.usd, "per": limits.budget.per, "spent_usd": spent, "resets_at": _iso(ends)}
        rates = {name: getattr(limits, name) for name in _RATES if getattr(limits, name, None) is not None}
        entry = {"scope": scope, **names, "budget": budget, "rate_limits": rates}
        if refusals:
            entry["refusals"] = counts.get(scope, {})
        out.append(entry)
    return out


def _key_entry(gw: Gateway, key: ClientKey) -> _Entry:
    own = key.limits if key.limits is not None else gw.settings.limits  # as Limiter.rules: its own, else the default
    return f"key:{key.id}", {"id": key.id, "name": key.name, "team": key.team}, own


def _team_entry(gw: Gateway, team: str) -> _Entry:
    settings = gw.settings.teams.get(team)
    return f"team:{team}", {"name": team}, settings.limits if settings is not None else None


def _limits_meta(gw: Gateway, teams: list[dict[str, Any]], keys: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "teams": teams,
        "keys": keys,
        "refusals_since": _iso(gw.limiter.started_at),
        "refusals_counted_by": "process",  # not shared between workers or replicas
    }


async def limits_document(gw: Gateway) -> dict[str, Any]:
    """Every team of the config and every key (the config's, the issued ones, and any other principal a limit has
    refused, such as a JWT's), with its budget, spend, rate limits and refusals."""
    settings = gw.settings
    keys = list(gw.keys)
    issued = gw.identity.issued
    if issued is not None:
        keys += sorted(issued.all(), key=lambda k: (k.name, k.id))
    entries = [_key_entry(gw, key) for key in keys]
    if settings.auth.open:  # everyone is the default key
        entries.insert(0, ("key:", {"id": "", "name": "", "team": ""}, settings.limits))
    known = {scope for scope, _, _ in entries}
    for scope, _ in sorted(gw.limiter.refusals):
        kind, _, name = scope.partition(":")
        if kind == "key" and scope not in known:
            known.add(scope)
            entries.append((scope, {"id": name, "name": name, "team": ""}, settings.limits))
    teams = [_team_entry(gw, team) for team in sorted(settings.teams)]
    return _limits_meta(gw, await _limit_entries(gw, teams), await _limit_entries(gw, entries))


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
    own = await _limit_entries(gw, [_key_entry(gw, key)])
    # its team's budget (a refusal names it), not the team's refusals (other keys' requests)
    team = await _limit_entries(gw, [_team_entry(gw, key.team)], refusals=False) if key.team else []
    return {"scope": "key", "key": key.name, "aliases": aliases, "limits": _limits_meta(gw, team, own)}


@get("/v1/gateway/status")
async def gateway_status(request: Request[Any, Any, Any]) -> Response[bytes]:
    gw: Gateway = request.app.state.gateway
    rid = new_request_id()
    try:
        if is_admin(gw.admin_keys, request.headers):
            document = {"scope": "gateway", **status_document(gw), "limits": await limits_document(gw)}
        else:
            _, key = await gw.identity.authenticate(gw.runtime, request.headers)
            if key is None:  # an open gateway (auth.open): nobody to keep apart
                document = {"scope": "gateway", **status_document(gw), "limits": await limits_document(gw)}
            else:
                document = await key_document(gw, key)
    except GatewayError as exc:
        return error_response(exc, rid)
    return Response(_encode(document), media_type="application/json", headers={"request-id": rid})


STATUS_HANDLERS = [gateway_status]
