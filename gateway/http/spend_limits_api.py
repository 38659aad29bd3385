"""Spend limits over HTTP (issue 34, items 5 and 6), in the shape of Anthropic's Admin API, and a signed-in person's
own standing (``GET /api/oauth/usage``). The logic lives in ``gateway.governance.spend_limits`` (the limits, their
store and audit), ``gateway.governance.limits`` (the counters) and ``gateway.governance.overage`` (what Claude Code
reads); this module is the HTTP shape only.

- ``POST /v1/organizations/spend_limits`` (``{"scope", "amount", "period", "pooled_budget"?}``) sets a limit (one of
  the same scope and period is replaced and keeps its id) and answers the ``spend_limit``; ``GET`` lists them by id
  (``limit``, ``after_id``, ``before_id``: ``data``, ``has_more``, ``first_id``, ``last_id``).
- ``GET|DELETE /v1/organizations/spend_limits/{id}``: one limit; its removal answers ``spend_limit_deleted``.
- ``GET /v1/organizations/spend_limits/effective?user_id=…&rbac_group_id=…`` (the group repeated, or
  ``rbac_group_id[]``): what applies to that person, with the spend of each cap's current window.
- ``GET /v1/organizations/spend_limits/audit``: the changes (``audit_event``), newest first, paginated as the list.

An admin key in ``x-api-key`` (or as a bearer): one of ``admin.keys`` reads and writes, one of ``admin.read_keys``
only reads (a write with it is ``403 permission_error``); none, or another, is ``401 authentication_error``.

``GET /api/oauth/usage`` takes the bearer every Messages request takes (``Identity.authenticate``) and answers for
whoever it is: a signed-in person, or a key (its own budgets and, when it names a user, the spend limits of that
user: the caps its requests are under; no error for a key, since nothing of another principal is shown).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get, route

from gateway.governance import overage
from gateway.governance.audit import audit
from gateway.governance.keys import ClientKey, authenticate, build_keys
from gateway.governance.limits import budget_window, budget_window_start
from gateway.governance.spend_limit_store import AuditEvent, SpendLimit
from gateway.governance.spend_limits import SpendLimits, effective, parse_limit, rules_of
from gateway.governance.store import StoreError, UsageQuery
from gateway.http.routes import error_response
from gateway.settings import Settings
from gateway.wire.errors import (
    AuthenticationError,
    GatewayError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    RequestTooLarge,
    StoreUnavailable,
    new_request_id,
)

if TYPE_CHECKING:
    from gateway.core import Gateway

__all__ = ["SPEND_LIMIT_HANDLERS", "audit_object", "limit_object", "usage_body"]

_encode = msgspec.json.Encoder().encode
_JSON = "application/json"
_MAX_BODY = 64 * 1024
_PATH = "/v1/organizations/spend_limits"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def limit_object(limit: SpendLimit) -> dict[str, Any]:
    """A limit as the Admin API shows it."""
    scope: dict[str, str] = {"type": limit.scope_type}
    if limit.scope_type == "user":
        scope["user_id"] = limit.scope_id
    elif limit.scope_type == "rbac_group":
        scope["rbac_group_id"] = limit.scope_id
    out: dict[str, Any] = {
        "type": "spend_limit",
        "id": limit.id,
        "scope": scope,
        "amount": str(limit.amount_cents),
        "period": limit.period,
    }
    if limit.pooled is not None:
        out["pooled_budget"] = {"amount": str(limit.pooled.amount_cents), "paused": limit.pooled.paused}
    out["created_at"] = _iso(limit.created_ms)
    out["updated_at"] = _iso(limit.updated_ms)
    return out


def audit_object(event: AuditEvent) -> dict[str, Any]:
    return {
        "type": "audit_event",
        "id": event.id,
        "created_at": _iso(event.at_ms),
        "actor": event.actor,
        "action": event.action,
        "target": event.target,
        "detail": msgspec.json.decode(event.detail),
    }


_read_keys: list[tuple[Settings, list[ClientKey]]] = []


def _readers(settings: Settings) -> list[ClientKey]:
    """``admin.read_keys`` of the running config (built once per config)."""
    if not _read_keys or _read_keys[0][0] is not settings:
        _read_keys[:] = [(settings, build_keys(settings.admin.read_keys))]
    return _read_keys[0][1]


def _matching(keys: Sequence[ClientKey], headers: Mapping[str, str]) -> ClientKey | None:
    if not keys:
        return None
    try:
        return authenticate(keys, headers)[1]
    except AuthenticationError:
        return None


def _admin(request: Request[Any, Any, Any], *, write: bool) -> tuple[Gateway, SpendLimits, str]:
    """The gateway, its spend limits and the admin key's name (the audit's actor); the refusal otherwise."""
    gw: Gateway = request.app.state.gateway
    runtime = gw.runtime
    readers = _readers(runtime.settings)
    path = request.url.path
    if not runtime.admin_keys and not readers:
        raise AuthenticationError(f"{path} needs admin.keys (or admin.read_keys), and an admin key on the request")
    admin = _matching(runtime.admin_keys, request.headers)
    if admin is None:
        reader = _matching(readers, request.headers)
        if reader is None:
            audit("admin.denied", path=path, write=write, reason="not_an_admin_key")
            raise AuthenticationError(f"{path} needs an admin key in x-api-key (admin.keys; admin.read_keys to read)")
        if write:
            audit("admin.denied", path=path, write=write, reason="read_only", actor=reader.name)
            raise PermissionDenied(
                f"admin key {reader.name!r} may only read (admin.read_keys): changing spend limits needs admin.keys"
            )
        admin = reader
    if gw.spend_limits is None:
        raise InvalidRequest("spend limits live in the store, and it is off (store.enabled: false)")
    return gw, gw.spend_limits, admin.name


def _json(body: Any, rid: str, status: int = 200) -> Response[bytes]:
    return Response(_encode(body), status_code=status, media_type=_JSON, headers={"request-id": rid})


def _page_params(request: Request[Any, Any, Any]) -> tuple[int, str | None, str | None]:
    params = request.query_params
    try:
        limit = int(params.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 1000:
        raise InvalidRequest("limit: an integer from 1 to 1000")
    after, before = params.get("after_id"), params.get("before_id")
    if after is not None and before is not None:
        raise InvalidRequest("after_id, before_id: give one of them, not both")
    return limit, after, before


def _page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {
        "data": data,
        "has_more": more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


@route(_PATH, http_method=["GET", "POST"])
async def spend_limits(request: Request[Any, Any, Any]) -> Response[bytes]:
    """One handler for the collection's two methods (so ``OPTIONS`` and a 405's ``allow`` name both)."""
    return await (_upsert(request) if request.method == "POST" else _list(request))


async def _upsert(request: Request[Any, Any, Any]) -> Response[bytes]:
    rid = new_request_id()
    try:
        _, limits, actor = _admin(request, write=True)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > _MAX_BODY:
            raise RequestTooLarge(f"a spend limit is at most {_MAX_BODY} bytes")
        body = await request.body()
        if len(body) > _MAX_BODY:
            raise RequestTooLarge(f"a spend limit is at most {_MAX_BODY} bytes")
        stored = await limits.upsert(parse_limit(body), actor)
    except GatewayError as exc:
        return error_response(exc, rid)
    return _json(limit_object(stored), rid)


async def _list(request: Request[Any, Any, Any]) -> Response[bytes]:
    rid = new_request_id()
    try:
        _, limits, _ = _admin(request, write=False)
        size, after, before = _page_params(request)
        found = await limits.listed()
    except GatewayError as exc:
        return error_response(exc, rid)
    if before is not None:
        newer = [limit for limit in found if limit.id < before]
        page, more = newer[-size:], len(newer) > size
    else:
        rest = [limit for limit in found if after is None or limit.id > after]
        page, more = rest[:size], len(rest) > size
    return _json(_page([limit_object(limit) for limit in page], more), rid)


@get(_PATH + "/effective")
async def effective_limits(request: Request[Any, Any, Any]) -> Response[bytes]:
    """What applies to ``user_id`` in the groups ``rbac_group_id`` (repeated, or ``rbac_group_id[]``), with the spend
    of each cap's current window (``spent``, cents; null when its counter cannot be read)."""
    rid = new_request_id()
    try:
        gw, limits, _ = _admin(request, write=False)
        params = request.query_params
        user = params.get("user_id") or ""
        groups = frozenset(params.getall("rbac_group_id", []) + params.getall("rbac_group_id[]", [])) - {""}
        if not user and not groups:
            raise InvalidRequest("user_id: give the person's id (their email, for one who signs in), or rbac_group_id")
        found = await limits.listed()
        rules = rules_of(found, user, user, groups)
        spends = await gw.limiter.budget_spend(rules)
    except GatewayError as exc:
        return error_response(exc, rid)
    data = []
    for item, (spent, ends) in zip(effective(found, user, user, groups), spends, strict=True):
        counted = spent is not None and (item.applies != "per_user" or bool(user))
        data.append(
            {
                "type": "effective_spend_limit",
                "applies": item.applies,
                "period": item.limit.period,
                "amount": str(round(item.usd * 100)),
                "spent": str(round(spent * 100)) if counted and spent is not None else None,
                "resets_at": _iso(math.ceil(ends) * 1000),
                "spend_limit": limit_object(item.limit),
            }
        )
    body = {"user_id": user or None, "rbac_group_ids": sorted(groups), "data": data}
    return _json(body, rid)


@get(_PATH + "/audit")
async def audit_events(request: Request[Any, Any, Any]) -> Response[bytes]:
    rid = new_request_id()
    try:
        _, limits, _ = _admin(request, write=False)
        size, after, before = _page_params(request)
        events, more = await limits.audit_page(limit=size, after_id=after, before_id=before)
    except GatewayError as exc:
        return error_response(exc, rid)
    return _json(_page([audit_object(event) for event in events], more), rid)


@route(_PATH + "/{limit_id:str}", http_method=["GET", "DELETE"], status_code=200)
async def one_limit(request: Request[Any, Any, Any], limit_id: str) -> Response[bytes]:
    rid = new_request_id()
    try:
        write = request.method == "DELETE"
        _, limits, actor = _admin(request, write=write)
        found = await (limits.delete(limit_id, actor) if write else limits.get(limit_id))
        if found is None:
            raise NotFound(f"no spend limit has the id {limit_id!r}")
    except GatewayError as exc:
        return error_response(exc, rid)
    if write:
        return _json({"type": "spend_limit_deleted", "id": found.id}, rid)
    return _json(limit_object(found), rid)


# --- a person's own standing: GET /api/oauth/usage ---

_ORDER = {"day": 0, "week": 1, "month": 2}


def _percent(cap: overage.Cap) -> int:
    return min(100, math.floor(overage.utilization(cap) * 100))


def _severity(cap: overage.Cap) -> str:
    used = overage.utilization(cap)
    return "critical" if used >= overage.CRITICAL else "warning" if used >= overage.WARNING else "normal"


def usage_body(caps: Sequence[overage.Cap], month_spent: float | None) -> dict[str, Any]:
    """The protocol's answer: ``extra_usage`` (the most utilised monthly cap, in cents and a whole percentage; with
    none, ``month_spent``, the month's spend) and one ``limits`` entry per cap, ``resets_at`` the same instant as
    the ``reset`` header. ``is_active``: the cap is reached (requests are refused until ``resets_at``)."""
    limits = [
        {
            "kind": "spend",
            "group": overage.PERIOD_NAMES[cap.per],
            "percent": _percent(cap),
            "resets_at": _iso(math.ceil(cap.ends) * 1000),
            "severity": _severity(cap),
            "is_active": cap.spent >= cap.limit,
        }
        for cap in sorted(caps, key=lambda c: (_ORDER.get(c.per, 3), -overage.utilization(c)))
    ]
    monthly = [cap for cap in caps if cap.per == "month"]
    extra: dict[str, Any] = {"is_enabled": bool(caps)}
    if monthly:
        cap = max(monthly, key=overage.utilization)
        extra |= {
            "monthly_limit": round(cap.limit * 100),
            "used_credits": round(cap.spent * 100),
            "utilization": _percent(cap),
        }
    else:
        spent = None if month_spent is None else round(month_spent * 100)
        extra |= {"monthly_limit": None, "used_credits": spent, "utilization": None}
    extra["currency"] = "USD"
    return {"extra_usage": extra, "limits": limits}


async def _month_spent(gw: Gateway, key: ClientKey | None) -> float | None:
    """The principal's spend this month (UTC) from the ledger (None: no ledger, or it cannot be read)."""
    if gw.ledger is None:
        return None
    now = time.time()
    period_s = gw.limiter._period_s
    start, ends = budget_window_start("month", now, period_s), budget_window("month", now, period_s)[1]
    who: dict[str, tuple[str, ...]] = (
        {"user": (key.user,)} if key is not None and key.user else {"key_name": (key.id if key else "",)}
    )
    query = UsageQuery(
        start_ms=int(start * 1000),
        end_ms=int(now * 1000) + 1,
        bucket_ms=max(1, int((ends - start) * 1000)),
        filters=who,
    )
    try:
        totals = await (await gw.ledger.ready()).totals(query)
    except StoreError:
        return None
    return sum(total.cost_usd or 0.0 for total in totals)


@get("/api/oauth/usage")
async def oauth_usage(request: Request[Any, Any, Any]) -> Response[bytes]:
    rid = new_request_id()
    gw: Gateway = request.app.state.gateway
    runtime = gw.runtime
    try:
        try:
            _, key = await gw.identity.authenticate(runtime, request.headers)
        except AuthenticationError:
            audit("auth.denied", reason="invalid_token", path=request.url.path)
            raise
        caps = await gw.limiter.caps(runtime.settings, key)
        if caps is None:
            raise StoreUnavailable("the spend counters cannot be read right now; try again shortly")
        month = None if any(cap.per == "month" for cap in caps) else await _month_spent(gw, key)
    except GatewayError as exc:
        return error_response(exc, rid)
    return _json(usage_body(caps, month), rid)


SPEND_LIMIT_HANDLERS = [spend_limits, effective_limits, audit_events, one_limit, oauth_usage]
