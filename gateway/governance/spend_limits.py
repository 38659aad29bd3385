"""Spend limits set at run time (issue 34, item 5), in the shape of Anthropic's Admin API spend limits
(``/v1/organizations/spend_limits``, ``gateway.http.spend_limits_api``), enforced by the limiter beside the
config's budgets.

A limit caps spending (US cents) per UTC ``daily``, ``weekly`` (ISO, from Monday) or ``monthly`` window, for a
scope: one ``user``, the members of an ``rbac_group``, or the whole ``organization``. One limit per scope and period:
setting it again replaces it (and keeps its id). As in Anthropic's gateway, ``amount`` is what **each** person may
spend: an organization limit is every user's default, a group limit every member's. A limit of a group or of the
organization may also carry ``pooled_budget: {amount, paused}``: a budget its members share (every member's spend
counted together), refused with ``overage-scope: group_pool`` for a group; a paused pool spends nothing (every
request under it is refused until it is unpaused).

Who is under them: every principal with a user (``ClientKey.user``): a signed-in person (Claude Code's
``/login``), whose user is the email the identity provider gave (else its subject) — so a ``user`` limit names a
signed-in person by email —, and a key or a JWT that names a user. A principal without one (a key of no user) is
under its key's and team's budgets only. A ``user`` scope matches ``ClientKey.user`` or ``ClientKey.email``; an
``rbac_group`` scope the identity provider's groups (``ClientKey.groups``) or the principal's team; the
``organization`` every principal with a user.

For each period, the amount a person may spend is the most specific that names them: their own ``user`` limit,
else the tightest of their groups', else the organization's; it is counted once, on their own counter
(``spend-user:<user>``, whoever set the amount). Every pool of their groups and of the organization for that period
applies as well (``spend-group:<group>``, ``spend-org``). So a person meets at most one cap of their own and the
pools they belong to per period, each a rule of the limiter (``Rule`` with a ``Budget``), checked and counted with
the same counters (memory or Redis) as the config's budgets, and refused the same ``429 billing_error``.

Every change (``upsert``, ``delete``) writes an ``admin_audit`` row (the admin key's name, the action
``admin.limit.upsert`` or ``admin.limit.delete``, the limit's id, the limit as JSON) and raises
``spend_limits_version`` in its own transaction. Every process keeps the limits in memory (so admission never
queries the store) and polls that version every ``POLL_S``: a limit set through one replica applies on every replica
within ``POLL_S`` plus one query (on the one that set it, at once). When the limits change, the ledger's spend of
the current windows is raised into the counters of their scopes (never lowered): the users' (``user_name``), the
organization's pool (every row with a user), and a group's pool when the group is also a team of the config (the
ledger's ``team``); a pool of any other group counts from the moment its limit was set (the ledger does not keep the
identity provider's groups).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from gateway.governance.audit import audit
from gateway.governance.limits import Limiter, Rule, SeedPlan, ledger_spend
from gateway.governance.spend_limit_store import (
    AuditEvent,
    Pool,
    SpendLimit,
    SpendLimitStore,
    audit_detail,
    new_id,
    spend_limit_store,
)
from gateway.governance.store import Store, StoreError
from gateway.settings import Budget, LimitSettings
from gateway.wire.errors import InvalidRequest, StoreUnavailable

if TYPE_CHECKING:
    from gateway.governance.keys import ClientKey

__all__ = [
    "GROUP_SCOPE",
    "ORG_SCOPE",
    "PERIODS",
    "POLL_S",
    "USER_SCOPE",
    "Effective",
    "LimitRequest",
    "SpendLimits",
    "effective",
    "groups_of",
    "parse_limit",
    "rules_of",
]

log = logging.getLogger("gateway")

POLL_S = 1.0
PERIODS = {"daily": "day", "weekly": "week", "monthly": "month"}  # the API's period -> the limiter's window
USER_SCOPE, GROUP_SCOPE, ORG_SCOPE = "spend-user:", "spend-group:", "spend-org"  # the limiter's scopes
MAX_CENTS = 10**11  # $1 billion
_FIELDS = frozenset({"scope", "amount", "period", "pooled_budget", "type"})
_ID_TEXT = re.compile(r"[^\x00-\x1f\x7f]{1,256}")


class LimitRequest(NamedTuple):
    """A limit as ``POST /v1/organizations/spend_limits`` asks for it, checked."""

    scope_type: str
    scope_id: str
    period: str
    amount_cents: int
    pooled: Pool | None


def _cents(value: Any, field: str) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        cents = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        cents = value
    else:
        raise InvalidRequest(f'{field}: a whole number of US cents, as a string (e.g. "5000" for $50)')
    if not 0 <= cents <= MAX_CENTS:
        raise InvalidRequest(f"{field}: from 0 to {MAX_CENTS} cents")
    return cents


def _scope(value: Any) -> tuple[str, str]:
    if not isinstance(value, dict):
        raise InvalidRequest('scope: required, e.g. {"type": "user", "user_id": "alice@example.com"}')
    kind = value.get("type")
    fields = {"user": "user_id", "rbac_group": "rbac_group_id", "organization": None}
    if kind not in fields:
        raise InvalidRequest("scope.type: one of user, rbac_group, organization")
    id_field = fields[kind]
    unknown = sorted(set(value) - {"type", *([id_field] if id_field else [])})
    if unknown:
        raise InvalidRequest(f"scope.{unknown[0]}: not a field of a {kind} scope")
    if id_field is None:
        return kind, ""
    scope_id = value.get(id_field)
    if not isinstance(scope_id, str) or not _ID_TEXT.fullmatch(scope_id) or scope_id != scope_id.strip():
        raise InvalidRequest(f"scope.{id_field}: required, 1 to 256 characters with no control characters")
    return kind, scope_id


def _pool(value: Any, scope_type: str) -> Pool | None:
    if value is None:
        return None
    if scope_type == "user":
        raise InvalidRequest("pooled_budget: only a group's or the organization's limit has a pool")
    if not isinstance(value, dict):
        raise InvalidRequest('pooled_budget: an object, e.g. {"amount": "100000", "paused": false}')
    unknown = sorted(set(value) - {"amount", "paused"})
    if unknown:
        raise InvalidRequest(f"pooled_budget.{unknown[0]}: not a field of a pooled budget")
    if "amount" not in value:
        raise InvalidRequest("pooled_budget.amount: required")
    paused = value.get("paused", False)
    if not isinstance(paused, bool):
        raise InvalidRequest("pooled_budget.paused: true or false")
    return Pool(amount_cents=_cents(value["amount"], "pooled_budget.amount"), paused=paused)


def parse_limit(body: bytes) -> LimitRequest:
    """The body of ``POST /v1/organizations/spend_limits``; ``InvalidRequest`` naming the field otherwise."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise InvalidRequest("the body is not JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body is not a JSON object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: not a field of a spend limit")
    if data.get("type", "spend_limit") != "spend_limit":
        raise InvalidRequest("type: spend_limit, or leave it out")
    scope_type, scope_id = _scope(data.get("scope"))
    if "amount" not in data:
        raise InvalidRequest("amount: required")
    amount = _cents(data["amount"], "amount")
    period = data.get("period")
    if period not in PERIODS:
        raise InvalidRequest("period: one of daily, weekly, monthly")
    return LimitRequest(scope_type, scope_id, period, amount, _pool(data.get("pooled_budget"), scope_type))


class Effective(NamedTuple):
    """A limit as it applies to one person: ``applies`` ``per_user`` (the amount they may spend themselves),
    ``group_pool`` or ``organization_pool``; the limiter's scope and window and the cap in dollars."""

    limit: SpendLimit
    applies: str
    scope: str
    per: str
    usd: float


def effective(limits: Iterable[SpendLimit], user: str, email: str, groups: Collection[str]) -> list[Effective]:
    """The limits that apply to a person known as ``user`` (their counter's name) or ``email``, in ``groups``: per
    period, the most specific per-person amount (their own, else their groups' tightest, else the organization's),
    then the pools (module docstring)."""
    names = {user, email} - {""}
    by_period: dict[str, tuple[list[SpendLimit], list[SpendLimit], list[SpendLimit]]] = {}
    for limit in limits:
        own, grouped, org = by_period.setdefault(limit.period, ([], [], []))
        if limit.scope_type == "user" and limit.scope_id in names:
            own.append(limit)
        elif limit.scope_type == "rbac_group" and limit.scope_id in groups:
            grouped.append(limit)
        elif limit.scope_type == "organization":
            org.append(limit)
    out: list[Effective] = []
    for period in PERIODS:
        if period not in by_period:
            continue
        per = PERIODS[period]
        own, grouped, org = by_period[period]
        chosen = own or grouped or org
        if chosen:
            tightest = min(chosen, key=lambda limit: limit.amount_cents)
            out.append(Effective(tightest, "per_user", USER_SCOPE + user, per, tightest.amount_cents / 100))
        for limit in sorted(grouped, key=lambda limit: limit.scope_id):
            if limit.pooled is not None:
                out.append(Effective(limit, "group_pool", GROUP_SCOPE + limit.scope_id, per, _pool_usd(limit.pooled)))
        for limit in org:
            if limit.pooled is not None:
                out.append(Effective(limit, "organization_pool", ORG_SCOPE, per, _pool_usd(limit.pooled)))
    return out


def _pool_usd(pool: Pool) -> float:
    return 0.0 if pool.paused else pool.amount_cents / 100


def groups_of(key: ClientKey) -> frozenset[str]:
    """A principal's groups for the ``rbac_group`` scope: the identity provider's, and its team."""
    return frozenset((*key.groups, key.team)) - {""}


class SpendLimits:
    """The spend limits as this process knows them (``rules``, for the limiter), polled from the store, and the
    admin's changes to them. ``store``: the opened ledger store (``Ledger.ready``); ``limiter``: the limiter whose
    ``spend`` hook they set and whose counters they seed; ``teams``: the running config's teams (a group's pool is
    seeded from the ledger's ``team`` when the group is one)."""

    def __init__(
        self,
        store: Callable[[], Awaitable[Store]],
        limiter: Limiter | None = None,
        *,
        teams: Callable[[], Collection[str]] = tuple,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._open = store
        self._store: SpendLimitStore | None = None
        self._limiter = limiter
        self._teams = teams
        self._poll_s = poll_s
        self._clock = clock
        self.version = -1  # the store's spend_limits_version the limits were read at
        self.limits: list[SpendLimit] = []
        self._cache: dict[tuple[str, str, str, tuple[str, ...]], list[Rule]] = {}
        self._logged_at = -1e18

    async def store(self) -> SpendLimitStore:
        """The limits' store, beside the ledger (``StoreError`` when it cannot be opened)."""
        if self._store is None:
            self._store = spend_limit_store(await self._open())
        return self._store

    def rules(self, key: ClientKey) -> list[Rule]:
        """The limiter's rules of the spend limits that apply to ``key`` (a principal with a user)."""
        known = (key.user, key.email, key.team, key.groups)
        rules = self._cache.get(known)
        if rules is None:
            rules = rules_of(self.limits, key.user, key.email, groups_of(key))
            if len(self._cache) >= 10_000:
                self._cache.clear()
            self._cache[known] = rules
        return rules

    def _use(self, limits: list[SpendLimit]) -> None:
        self.limits = limits
        self._cache = {}
        if self._limiter is not None:
            self._limiter.spend = self.rules if limits else None  # none: the limiter does no work for them

    def seed_plans(self) -> list[SeedPlan]:
        """What the ledger's spend seeds for these limits (``limits.seed_budgets``; module docstring)."""
        teams = set(self._teams())
        plans: list[SeedPlan] = []
        for period, per in PERIODS.items():
            limits = [limit for limit in self.limits if limit.period == period]
            if not limits:
                continue
            plans.append((per, "user", lambda name: USER_SCOPE + name))
            pools = {limit.scope_id for limit in limits if limit.scope_type == "rbac_group" and limit.pooled} & teams
            if pools:
                plans.append((per, "team", _pool_of(pools)))
            if any(limit.scope_type == "organization" and limit.pooled for limit in limits):
                plans.append((per, "user", lambda name: ORG_SCOPE))
        return plans

    async def seed(self) -> int:
        """The ledger's spend raised into the counters of the limits' scopes; the counters seeded."""
        if self._limiter is None or not self.limits:
            return 0
        spent = await ledger_spend(self._limiter, await self._open(), self.seed_plans())
        await self._limiter.seed(spent)
        return len(spent)

    async def refresh(self) -> bool:
        """Read the limits again if the store's version moved (True then); ``StoreError`` when it cannot be read."""
        store = await self.store()
        version = await store.version()
        if version == self.version:
            return False
        limits = await store.all()
        self.version = version
        self._use(limits)
        return True

    async def run(self) -> None:
        """Poll the store (every ``poll_s``); when the limits changed, seed their counters from the ledger. An
        unreachable store keeps the limits last read."""
        while True:
            try:
                changed = await self.refresh()
            except StoreError as exc:
                changed = False
                now = time.monotonic()
                if now - self._logged_at >= 60:
                    self._logged_at = now
                    log.warning("spend limits: the store cannot be read (%s); enforcing the limits last read", exc)
            if changed:
                await self._seeded()
            await asyncio.sleep(self._poll_s)

    async def _seeded(self) -> None:
        try:
            await self.seed()
        except Exception as exc:  # the ledger or the counters (Redis) are down: the limits count from what is counted
            log.warning("spend limits: the ledger's spend could not be seeded (%s); counting from now", exc)

    async def _changed(self) -> None:
        """This process applies its own change at once (the others at their next poll)."""
        try:
            changed = await self.refresh()
        except StoreError as exc:
            log.warning("spend limits: changed, but not yet read back (%s); the next poll will", exc)
            return
        if changed:
            await self._seeded()

    async def _checked(self, work: Callable[[SpendLimitStore], Awaitable[Any]], doing: str) -> Any:
        try:
            return await work(await self.store())
        except StoreError as exc:
            raise StoreUnavailable(f"the spend limits' store cannot be {doing}: {exc}") from exc

    async def upsert(self, request: LimitRequest, actor: str) -> SpendLimit:
        """Set a limit (one of the same scope and period is replaced, and keeps its id); audited."""
        now_ms = int(self._clock() * 1000)
        limit = SpendLimit(id=new_id("spl_", now_ms), **request._asdict(), created_ms=now_ms, updated_ms=now_ms)
        event = self._event(now_ms, actor, "admin.limit.upsert", limit)
        stored: SpendLimit = await self._checked(lambda store: store.upsert(limit, event), "written")
        audit(event.action, actor=actor, target=stored.id, **msgspec.json.decode(event.detail))
        await self._changed()
        return stored

    @staticmethod
    def _event(now_ms: int, actor: str, action: str, limit: SpendLimit, target: str = "") -> AuditEvent:
        detail = audit_detail(limit)
        return AuditEvent(
            id=new_id("aud_", now_ms), at_ms=now_ms, actor=actor, action=action, target=target, detail=detail
        )

    async def delete(self, limit_id: str, actor: str) -> SpendLimit | None:
        """Remove a limit; audited. None when there is none of that id."""
        found = await self.get(limit_id)
        if found is None:
            return None
        event = self._event(int(self._clock() * 1000), actor, "admin.limit.delete", found, limit_id)
        deleted: bool = await self._checked(lambda store: store.delete(limit_id, event), "written")
        if not deleted:
            return None
        audit(event.action, actor=actor, target=limit_id, **msgspec.json.decode(event.detail))
        await self._changed()
        return found

    async def get(self, limit_id: str) -> SpendLimit | None:
        found: SpendLimit | None = await self._checked(lambda store: store.get(limit_id), "read")
        return found

    async def listed(self) -> list[SpendLimit]:
        """Every limit, by id, read from the store (the truth, not this process's copy)."""
        limits: list[SpendLimit] = await self._checked(lambda store: store.all(), "read")
        return limits

    async def audit_page(
        self, *, limit: int, after_id: str | None = None, before_id: str | None = None
    ) -> tuple[list[AuditEvent], bool]:
        """The limits' audit events, newest first: ``limit`` of them after ``after_id`` (older) or before
        ``before_id`` (newer), and whether there are more that way."""
        page: tuple[list[AuditEvent], bool] = await self._checked(
            lambda store: store.audit(limit=limit, after_id=after_id, before_id=before_id), "read"
        )
        return page


def _pool_of(pools: Collection[str]) -> Callable[[str], str | None]:
    return lambda team: GROUP_SCOPE + team if team in pools else None


def rules_of(limits: Sequence[SpendLimit], user: str, email: str, groups: Collection[str]) -> list[Rule]:
    """The limiter's rules of ``effective``."""
    return [
        (e.scope, LimitSettings(budget=Budget(usd=e.usd, per=e.per)))  # type: ignore[arg-type]
        for e in effective(limits, user, email, groups)
    ]
