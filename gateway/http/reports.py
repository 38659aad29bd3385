"""The usage ledger read back in the shape of Anthropic's Admin API usage and cost reports, so tooling written
for that API works against the gateway:

- ``GET /v1/organizations/usage_report/messages``: ``starting_at`` (required, RFC 3339 or a date),
  ``ending_at``, ``bucket_width`` ``1m|1h|1d`` (default ``1d``), ``group_by[]``, filters, ``limit`` (default
  60/24/7, at most 1440/168/31 buckets per page for 1m/1h/1d), ``page`` (the ``next_page`` cursor).
- ``GET /v1/organizations/cost_report``: the same window, ``1d`` buckets only, ``group_by[]`` of ``workspace_id``
  and ``description``; ``amount`` in cents as a decimal string, ``currency`` ``USD``.

The gateway's dimensions map onto the API's: a key's name is ``api_key_id``, its team ``workspace_id``, its user
``account_id``; the gateway adds ``alias``, ``provider`` and ``session_id`` groupings and filters. Buckets are
UTC, aligned to the minute, hour or day, from ``starting_at`` floored to the width up to and including the bucket
that contains ``ending_at`` (default: now), as the Admin API's console shows today's spend: with ``1d`` and
``starting_at`` today the answer is today so far. That last bucket is partial: its ``ending_at`` is the bucket's
own end (``starting_at`` + the width), but it counts only the requests started before the requested end, so an
``ending_at`` mid-bucket still leaves the later ones out. ``ending_at`` at or before ``starting_at`` is a 400.
Empty buckets are included, oldest first. ``format=csv`` gives one line per result, each cell that a
spreadsheet would take for a formula (``= + - @``, a tab or a carriage return first) prefixed with ``'`` and every
line break in a cell written as ``\\n`` / ``\\r``. An admin key (``admin.keys``) reads everything; a client key
reads its own usage only.

What a report may cost the process (issue 31, settings ``reports``): a page holds at most ``max_results`` results,
ending on the last whole bucket that fits (``has_more`` and ``next_page`` point at the next one; a single bucket
holding more is a 400 naming ``group_by[]``); at most ``concurrency`` are built at once (another waits up to
``queue_s`` for a slot) and at most ``per_minute`` are admitted per principal (the admin or client key asking) in any
60 s: beyond either, ``429 rate_limit_error`` with ``retry-after`` (``ReportGate``). The aggregate runs in the store's
own threads and connections, the page is built and encoded in a thread too: the event loop only waits.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import csv
import io
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get

from gateway.governance.keys import authenticate
from gateway.governance.limits import RateLimited
from gateway.governance.store import StoreError, Totals, UsageQuery
from gateway.http.routes import error_response
from gateway.settings import ReportSettings
from gateway.wire.errors import (
    AuthenticationError,
    GatewayError,
    InvalidRequest,
    PermissionDenied,
    StoreUnavailable,
    new_request_id,
)

if TYPE_CHECKING:
    from gateway.core import Gateway

__all__ = ["REPORT_HANDLERS", "ReportGate", "ReportQuery", "csv_cell", "parse_report_query"]

_encode = msgspec.json.Encoder().encode


_WIDTHS = {"1m": 60_000, "1h": 3_600_000, "1d": 86_400_000}
_LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}  # (default, max) buckets per page

# the API's dimension -> the ledger's column; and the API's filter parameter -> the same column
_GROUPS = {
    "api_key_id": "key_name",
    "workspace_id": "team",
    "account_id": "user",
    "model": "model",
    "alias": "alias",
    "provider": "provider",
    "session_id": "session_id",
}
_FILTERS = {
    "api_key_ids[]": "key_name",
    "workspace_ids[]": "team",
    "account_ids[]": "user",
    "models[]": "model",
    "aliases[]": "alias",
    "providers[]": "provider",
    "session_ids[]": "session_id",
}
_COST_GROUPS = {"workspace_id": "team", "description": "model"}  # a description is the model's usage
# what the gateway does not track: always null in a usage result
_NULL_FIELDS = ("service_tier", "context_window", "inference_geo", "service_account_id")


class ReportQuery(msgspec.Struct, frozen=True, kw_only=True):
    query: UsageQuery
    width: str
    limit: int
    first_bucket: int  # the page's first bucket (index from the window's start)
    buckets: int  # in the whole window, the partial last one included
    group_by: tuple[str, ...]  # the API's names
    csv: bool


def _time(value: str, name: str) -> int:
    """RFC 3339 (``Z`` or an offset) or a date (midnight UTC), as epoch milliseconds."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"{name}: not an RFC 3339 timestamp: {value[:40]!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    ms = int(parsed.timestamp() * 1000)
    if not 0 <= ms < _YEAR_3000_MS:
        raise InvalidRequest(f"{name}: {value[:40]!r} is outside 1970-01-01 .. 2999-12-31")
    return ms


_YEAR_3000_MS = 32_503_680_000_000


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _one(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest(f"{name} given {len(values)} times")
    return values[0]


def parse_report_query(
    params: dict[str, list[str]], *, cost: bool, now_ms: int, max_results: int | None = None
) -> ReportQuery:
    """The query string (each parameter's values) as a store query, or ``InvalidRequest``; ``max_results``: the
    most results a page may hold (the store is asked for one more, to tell a page that is whole)."""
    if "group_by" in params:
        raise InvalidRequest("Invalid parameter `group_by`. Use `group_by[]` for array parameters.")
    known = {"starting_at", "ending_at", "bucket_width", "limit", "page", "format", "group_by[]"}
    if not cost:
        known |= set(_FILTERS)
    for name in params:
        if name not in known:
            raise InvalidRequest(f"unknown query parameter {name!r}")
    started = _one(params, "starting_at")
    if started is None:
        raise InvalidRequest("starting_at: required")
    width = _one(params, "bucket_width")
    width = "1d" if width is None else width
    if width not in _WIDTHS or (cost and width != "1d"):
        allowed = "1d" if cost else "1m, 1h or 1d"
        raise InvalidRequest(f"bucket_width: {width!r} is not one of {allowed}")
    step = _WIDTHS[width]
    asked = _time(started, "starting_at")
    start = asked // step * step
    ending = _one(params, "ending_at")
    end = _time(ending, "ending_at") if ending is not None else now_ms
    if end <= asked:
        raise InvalidRequest("ending date must be after starting date")
    buckets = -(-(end - start) // step)  # the ceiling: the bucket that contains the end is the last
    default, most = _LIMITS[width]
    raw_limit = _one(params, "limit")
    try:
        limit = default if raw_limit is None else int(raw_limit)
    except ValueError:
        raise InvalidRequest(f"limit: not an integer: {raw_limit!r}") from None
    if not 1 <= limit <= most:
        raise InvalidRequest(f"limit: must be between 1 and {most} for bucket_width {width}")
    first = _page(_one(params, "page"), start, step, buckets)
    allowed_groups = _COST_GROUPS if cost else _GROUPS
    group_by = tuple(dict.fromkeys(params.get("group_by[]", [])))
    for name in group_by:
        if name not in allowed_groups:
            raise InvalidRequest(f"group_by[]: {name!r} is not one of {', '.join(allowed_groups)}")
    columns = tuple(allowed_groups[g] for g in group_by)
    filters = {_FILTERS[name]: tuple(values) for name, values in params.items() if name in _FILTERS}
    page_start = start + first * step
    page_end = min(start + min(buckets, first + limit) * step, end)  # rows up to the requested end, not its bucket's
    query = UsageQuery(
        start_ms=page_start,
        end_ms=page_end,
        bucket_ms=step,
        group_by=columns,
        filters=filters,
        limit=None if max_results is None else max_results + 1,  # one more: a page that is whole is told apart
    )
    fmt = _one(params, "format")
    fmt = "json" if fmt is None else fmt
    if fmt not in ("json", "csv"):
        raise InvalidRequest(f"format: {fmt!r} is not json or csv")
    return ReportQuery(
        query=query, width=width, limit=limit, first_bucket=first, buckets=buckets, group_by=group_by, csv=fmt == "csv"
    )


def _page(cursor: str | None, start: int, step: int, buckets: int) -> int:
    """The bucket a ``next_page`` cursor (``page_`` + base64 of the next bucket's start) points at."""
    if cursor is None:
        return 0
    try:
        at = _time(base64.b64decode(cursor.removeprefix("page_"), validate=True).decode(), "page")
    except (binascii.Error, ValueError, InvalidRequest):  # ValueError: not ASCII; UnicodeDecodeError is one
        raise InvalidRequest("page: not a cursor this report gave") from None
    index, rest = divmod(at - start, step)
    if rest or not 0 <= index < buckets:
        raise InvalidRequest("page: the cursor does not belong to this window")
    return index


def _cursor(ms: int) -> str:
    return "page_" + base64.b64encode(_iso(ms).encode()).decode()


def _usage_result(t: Totals, group_by: tuple[str, ...]) -> dict[str, Any]:
    dims = t.dimensions
    result: dict[str, Any] = {
        "uncached_input_tokens": t.input_tokens,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": t.cache_creation_input_tokens},
        "cache_read_input_tokens": t.cache_read_input_tokens,
        "output_tokens": t.output_tokens,
        "server_tool_use": {"web_search_requests": 0},
    }
    for api_name, column in _GROUPS.items():
        result[api_name] = dims.get(column) if api_name in group_by else None
    for name in _NULL_FIELDS:
        result[name] = None
    result["requests"] = t.requests  # the gateway's own: requests in the group, and their cost (None: unpriced)
    result["cost_usd"] = t.cost_usd
    return result


def _cost_result(t: Totals, group_by: tuple[str, ...]) -> dict[str, Any]:
    described = "description" in group_by
    model = t.dimensions.get("model") if described else None
    return {
        "currency": "USD",
        "amount": _cents(t.cost_usd),
        "workspace_id": t.dimensions.get("team") if "workspace_id" in group_by else None,
        "description": f"{model} Usage" if described else None,
        "cost_type": "tokens" if described else None,
        "model": model,
        "token_type": None,  # the ledger keeps a request's cost whole, not per token type
        "service_tier": None,
        "context_window": None,
        "inference_geo": None,
    }


def _cents(usd: float | None) -> str:
    return f"{(usd or 0.0) * 100:.6f}".rstrip("0").rstrip(".") or "0"


def _document(report: ReportQuery, totals: list[Totals], *, cost: bool) -> dict[str, Any]:
    query = report.query
    count = min(report.buckets - report.first_bucket, report.limit)  # the page's buckets, a partial last one too
    if query.limit is not None and len(totals) >= query.limit:  # more than max_results: whole buckets only
        count = totals[-1].bucket  # the store's totals are the earliest buckets': the last one may be cut short
        if count == 0:
            raise InvalidRequest(
                f"group_by[]: the bucket starting {_iso(query.start_ms)} alone holds more than "
                f"{query.limit - 1} results (reports.max_results): group by fewer dimensions, filter, or use a "
                "narrower bucket_width"
            )
        totals = [t for t in totals if t.bucket < count]
    results: list[list[dict[str, Any]]] = [[] for _ in range(count)]
    for t in totals:
        if cost and not t.cost_usd:
            continue
        results[t.bucket].append(_cost_result(t, report.group_by) if cost else _usage_result(t, report.group_by))
    data = [
        {
            "starting_at": _iso(query.start_ms + i * query.bucket_ms),
            "ending_at": _iso(query.start_ms + (i + 1) * query.bucket_ms),
            "results": results[i],
        }
        for i in range(count)
    ]
    more = report.first_bucket + count < report.buckets
    next_page = _cursor(query.start_ms + count * query.bucket_ms) if more else None
    return {"data": data, "has_more": more, "next_page": next_page}


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A cell no spreadsheet takes for a formula (a text starting with ``= + - @``, a tab or a carriage return gets
    a leading ``'``) and that holds no line break (``\\r`` and ``\\n`` written as two characters each)."""
    if not isinstance(value, str):
        return value
    if value.startswith(_FORMULA_STARTS):
        value = "'" + value
    return value.replace("\r", "\\r").replace("\n", "\\n")


def _csv(document: dict[str, Any]) -> bytes:
    rows = []
    for bucket in document["data"]:
        for result in bucket["results"]:
            flat: dict[str, Any] = {"starting_at": bucket["starting_at"], "ending_at": bucket["ending_at"]}
            for name, value in result.items():
                if isinstance(value, dict):
                    flat.update({f"{name}.{k}": csv_cell(v) for k, v in value.items()})
                else:
                    flat[name] = "" if value is None else csv_cell(value)
            rows.append(flat)
    out = io.StringIO()
    names = list(rows[0]) if rows else ["starting_at", "ending_at"]
    writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()


def _params(request: Request[Any, Any, Any]) -> dict[str, list[str]]:
    params: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        params.setdefault(name, []).append(value)
    return params


class ReportGate:
    """Admission of reports in this process: at most ``concurrency`` built at once (one more waits up to
    ``queue_s`` for a slot) and at most ``per_minute`` admitted per principal in any 60 s (a log of the times
    each principal's reports were admitted); beyond either, ``RateLimited`` with ``retry-after``. A report
    refused is not counted. ``clock``: monotonic seconds."""

    _PRUNE_AT = 1024  # principals remembered before the idle ones are forgotten

    def __init__(self, settings: ReportSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._admitted: dict[str, deque[float]] = {}

    def reconfigured(self, settings: ReportSettings) -> ReportGate:
        """This gate, or a new one for changed settings (a reload) that remembers who was admitted when; the
        reports under way finish on the slots of the old one."""
        if settings == self.settings:
            return self
        gate = ReportGate(settings, clock=self._clock)
        gate._admitted = self._admitted
        return gate

    def _check_rate(self, principal: str, who: str) -> None:
        now = self._clock()
        admitted = self._admitted.get(principal)
        if admitted is None:
            return
        while admitted and admitted[0] <= now - 60:
            admitted.popleft()
        if len(admitted) >= self.settings.per_minute:
            wait = min(60, max(1, math.ceil(admitted[0] + 60 - now)))
            raise RateLimited(
                f"{who} has had {len(admitted)} reports in the last minute, its limit "
                f"(reports.per_minute: {self.settings.per_minute}); retry in {wait} s",
                headers={"retry-after": str(wait)},
            )

    def _record(self, principal: str) -> None:
        now = self._clock()
        if len(self._admitted) >= self._PRUNE_AT:
            for name in [p for p, times in self._admitted.items() if not times or times[-1] <= now - 60]:
                del self._admitted[name]
        self._admitted.setdefault(principal, deque()).append(now)

    @contextlib.asynccontextmanager
    async def admit(self, principal: str, who: str) -> AsyncIterator[None]:
        """A slot for one report of ``principal`` (``who``: how a refusal names it), held while the block runs."""
        self._check_rate(principal, who)
        queue_s = self.settings.queue_s
        if self._slots.locked() and queue_s == 0:
            raise self._busy()
        try:
            await asyncio.wait_for(self._slots.acquire(), queue_s or None)
        except TimeoutError:
            raise self._busy() from None
        try:
            self._check_rate(principal, who)  # the same principal's others may have been admitted while it waited
            self._record(principal)
            yield
        finally:
            self._slots.release()

    def _busy(self) -> RateLimited:
        wait = max(1, math.ceil(self.settings.queue_s))
        return RateLimited(
            f"{self.settings.concurrency} reports are being built on this gateway, its limit (reports.concurrency); "
            f"retry in {wait} s",
            headers={"retry-after": str(wait)},
        )


_RENDER = ThreadPoolExecutor(64, thread_name_prefix="report-render")  # threads start as used: the gate bounds them


def _render(report: ReportQuery, totals: list[Totals], *, cost: bool) -> bytes:
    document = _document(report, totals, cost=cost)
    return _csv(document) if report.csv else _encode(document)


def _gate(request: Request[Any, Any, Any], settings: ReportSettings) -> ReportGate:
    state = request.app.state
    current: ReportGate | None = getattr(state, "report_gate", None)
    gate = ReportGate(settings) if current is None else current.reconfigured(settings)
    if gate is not current:
        state.report_gate = gate
    return gate


async def _principal(gw: Gateway, request: Request[Any, Any, Any], report: ReportQuery) -> tuple[ReportQuery, str, str]:
    """The report narrowed to what the asker may read, who is asking (the per-principal rate's key) and how a
    refusal names them."""
    runtime = gw.runtime
    try:
        _, admin = authenticate(runtime.admin_keys, request.headers) if runtime.admin_keys else ({}, None)
    except AuthenticationError:
        admin = None
    if admin is not None:
        return report, f"admin:{admin.name}", f"admin key {admin.name!r}"
    if runtime.admin_keys or not runtime.settings.auth.open:
        _, key = await gw.identity.authenticate(runtime, request.headers)
        if key is None:  # an open gateway with admin keys: the reports are theirs
            raise PermissionDenied("the usage reports need an admin key (admin.keys)")
        own = {**report.query.filters, "key_name": (key.id,)}  # a client key reads its own usage only (by id)
        report = msgspec.structs.replace(report, query=msgspec.structs.replace(report.query, filters=own))
        return report, f"key:{key.id}", f"API key {key.name!r}"
    host = request.client.host if request.client is not None else ""
    return report, f"open:{host}", f"the address {host}"  # an open gateway: the caller's address


async def _report(request: Request[Any, Any, Any], *, cost: bool) -> Response[bytes]:
    gw: Gateway = request.app.state.gateway
    rid = new_request_id()
    try:
        if gw.ledger is None:
            raise InvalidRequest("the usage ledger is off on this gateway (store.enabled: false)")
        settings = gw.runtime.settings.reports
        now_ms = int(time.time() * 1000)
        report = parse_report_query(_params(request), cost=cost, now_ms=now_ms, max_results=settings.max_results)
        report, principal, who = await _principal(gw, request, report)
        async with _gate(request, settings).admit(principal, who):
            await gw.ledger.flush()  # what is queued is part of the answer
            try:
                totals = await gw.ledger.store.totals(report.query)
            except StoreError as exc:
                raise StoreUnavailable(f"the usage store cannot be read: {exc}") from exc
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(_RENDER, lambda: _render(report, totals, cost=cost))  # off the loop
    except GatewayError as exc:
        return error_response(exc, rid)
    media_type = "text/csv; charset=utf-8" if report.csv else "application/json"
    return Response(body, media_type=media_type, headers={"request-id": rid})


@get("/v1/organizations/usage_report/messages")
async def usage_report(request: Request[Any, Any, Any]) -> Response[bytes]:
    return await _report(request, cost=False)


@get("/v1/organizations/cost_report")
async def cost_report(request: Request[Any, Any, Any]) -> Response[bytes]:
    return await _report(request, cost=True)


REPORT_HANDLERS = [usage_report, cost_report]
