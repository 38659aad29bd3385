"""Spend limits set at run time (``gateway.governance.spend_limits``): the request's checks, which limits apply to a
person, the store on each backend (the in-memory twin, SQLite, a real PostgreSQL: replace keeps the id, every change
audited and versioned in one transaction, the audit newest first and paginated), two processes' views of one store,
the limiter enforcing them with the config's budgets (seeded from the ledger), and what Claude Code is shown
(``gateway.governance.overage``: the ``anthropic-ratelimit-unified-*`` headers and the 429) for a signed-in
principal built as sign-in builds it (``ClientKey(session=…)``)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.governance import overage
from gateway.governance.keys import ClientKey
from gateway.governance.limits import (
    BudgetExceeded,
    CountersError,
    Limiter,
    MemoryCounters,
    SpendUnchecked,
    budget_window,
    budget_window_start,
    seed_budgets,
)
from gateway.governance.spend_limit_store import (
    AuditEvent,
    Pool,
    SpendLimit,
    SpendLimitStore,
    new_id,
    spend_limit_store,
)
from gateway.governance.spend_limits import LimitRequest, SpendLimits, effective, parse_limit
from gateway.governance.store import LedgerRow, MemoryStore, Store, open_store
from gateway.settings import Settings, parse_settings
from gateway.wire.errors import InvalidRequest

T0 = datetime(2026, 12, 2, 10, 0, 30, tzinfo=UTC).timestamp()  # a Wednesday
SETTINGS = parse_settings(
    """
providers: {demo: {kind: mock}}
models: {m: {targets: [{provider: demo}]}}
auth: {keys: [{name: ci, key: sk-ci}]}
teams: {payments: {}}
"""
)
ALICE = ClientKey(
    name="sso:alice@example.com",
    id="sso:00u-alice",
    user="alice@example.com",
    email="alice@example.com",
    session="s1",
    groups=("engineering", "payments"),
    team="payments",
)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def limit(body: dict[str, Any]) -> LimitRequest:
    return parse_limit(json.dumps(body).encode())


def user_limit(user: str, cents: int, period: str = "daily") -> LimitRequest:
    return limit({"scope": {"type": "user", "user_id": user}, "amount": str(cents), "period": period})


def group_limit(group: str, cents: int, period: str = "daily", pool: dict[str, Any] | None = None) -> LimitRequest:
    body: dict[str, Any] = {"scope": {"type": "rbac_group", "rbac_group_id": group}, "amount": str(cents)}
    return limit({**body, "period": period, **({"pooled_budget": pool} if pool else {})})


def org_limit(cents: int, period: str = "monthly", pool: dict[str, Any] | None = None) -> LimitRequest:
    body = {"scope": {"type": "organization"}, "amount": str(cents), "period": period}
    return limit({**body, **({"pooled_budget": pool} if pool else {})})


# --- the request's checks ---


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"[1]", "JSON object"),
        (b"{", "not JSON"),
        (b'{"scope": {"type": "organization"}, "amount": "5", "period": "daily", "colour": 1}', "colour:"),
        (b'{"amount": "5", "period": "daily"}', "scope:"),
        (b'{"scope": {"type": "team"}, "amount": "5", "period": "daily"}', "scope.type:"),
        (b'{"scope": {"type": "user"}, "amount": "5", "period": "daily"}', "scope.user_id:"),
        (b'{"scope": {"type": "user", "user_id": " a"}, "amount": "5", "period": "daily"}', "scope.user_id:"),
        (b'{"scope": {"type": "rbac_group", "rbac_group_id": ""}, "amount": "5", "period": "daily"}', "rbac_group_id"),
        (b'{"scope": {"type": "organization", "user_id": "a"}, "amount": "5", "period": "daily"}', "scope.user_id:"),
        (b'{"scope": {"type": "organization"}, "period": "daily"}', "amount:"),
        (b'{"scope": {"type": "organization"}, "amount": "5.5", "period": "daily"}', "amount:"),
        (b'{"scope": {"type": "organization"}, "amount": "-5", "period": "daily"}', "amount:"),
        (b'{"scope": {"type": "organization"}, "amount": true, "period": "daily"}', "amount:"),
        (b'{"scope": {"type": "organization"}, "amount": "99999999999999", "period": "daily"}', "amount:"),
        (b'{"scope": {"type": "organization"}, "amount": "5", "period": "hourly"}', "period:"),
        (b'{"scope": {"type": "organization"}, "amount": "5"}', "period:"),
        (
            b'{"scope": {"type": "user", "user_id": "a"}, "amount": "5", "period": "daily", '
            b'"pooled_budget": {"amount": "9"}}',
            "pooled_budget:",
        ),
        (
            b'{"scope": {"type": "organization"}, "amount": "5", "period": "daily", "pooled_budget": {"paused": true}}',
            "pooled_budget.amount:",
        ),
        (
            b'{"scope": {"type": "organization"}, "amount": "5", "period": "daily", '
            b'"pooled_budget": {"amount": "9", "paused": "no"}}',
            "pooled_budget.paused:",
        ),
        (b'{"type": "api_key", "scope": {"type": "organization"}, "amount": "5", "period": "daily"}', "type:"),
    ],
)
def test_a_request_with_a_wrong_field_is_refused_naming_it(body: bytes, field: str) -> None:
    with pytest.raises(InvalidRequest, match=field.replace(".", r"\.")):
        parse_limit(body)


def test_a_request_in_the_admin_apis_shape_is_read() -> None:
    assert parse_limit(
        b'{"type": "spend_limit", "scope": {"type": "rbac_group", "rbac_group_id": "contractors"}, "amount": "10000",'
        b' "period": "daily", "pooled_budget": {"amount": "50000", "paused": true}}'
    ) == ("rbac_group", "contractors", "daily", 10000, Pool(amount_cents=50000, paused=True))
    assert limit({"scope": {"type": "organization"}, "amount": 50000, "period": "monthly"}).amount_cents == 50000


# --- which limits apply to a person ---


def stored(request: LimitRequest, n: int) -> SpendLimit:
    return SpendLimit(
        id=f"spl_{n:02d}",
        scope_type=request.scope_type,
        scope_id=request.scope_id,
        period=request.period,
        amount_cents=request.amount_cents,
        pooled=request.pooled,
        created_ms=0,
        updated_ms=0,
    )


def test_the_most_specific_amount_applies_per_period_and_every_pool_of_the_persons_groups() -> None:
    limits = [
        stored(r, n)
        for n, r in enumerate(
            [
                org_limit(50_000, "monthly", {"amount": "1000000"}),  # every person's $500, and a $10k org pool
                org_limit(5_000, "daily"),
                group_limit("contractors", 1_000, "daily"),  # tighter for contractors
                group_limit("interns", 500, "daily"),
                group_limit("payments", 20_000, "daily", {"amount": "30000"}),  # looser for payments, and a pool
                user_limit("alice@example.com", 100_000, "monthly"),  # alice's own, over the org's default
                group_limit("engineering", 7_000, "weekly", {"amount": "9", "paused": True}),
            ]
        )
    ]
    applies = [
        (e.applies, e.scope, e.per, e.usd)
        for e in effective(limits, "alice@example.com", "alice@example.com", {"engineering", "payments"})
    ]
    assert applies == [
        ("per_user", "spend-user:alice@example.com", "day", 200.0),  # her group's, not the org's
        ("group_pool", "spend-group:payments", "day", 300.0),
        ("per_user", "spend-user:alice@example.com", "week", 70.0),
        ("group_pool", "spend-group:engineering", "week", 0.0),  # paused: nothing may be spent
        ("per_user", "spend-user:alice@example.com", "month", 1000.0),  # her own, not the org's default
        ("organization_pool", "spend-org", "month", 10000.0),
    ]
    contractor = effective(limits, "bob", "", {"contractors", "interns"})
    assert [(e.applies, e.scope, e.per, e.usd) for e in contractor] == [
        ("per_user", "spend-user:bob", "day", 5.0),  # the tightest of the groups
        ("per_user", "spend-user:bob", "month", 500.0),
        ("organization_pool", "spend-org", "month", 10000.0),
    ]
    # a user limit names a person by their user or their email
    by_email = effective([stored(user_limit("carol@example.com", 100), 0)], "00u-carol", "carol@example.com", ())
    assert [(e.scope, e.usd) for e in by_email] == [("spend-user:00u-carol", 1.0)]
    assert effective([stored(user_limit("carol@example.com", 100), 0)], "dave", "dave@example.com", ()) == []


# --- the store, on each backend ---


def run_with(url: str, work: Callable[[Store], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        store = open_store(url)
        await store.open()
        try:
            return await work(store)
        finally:
            await store.aclose()

    return asyncio.run(go())


def event(action: str, target: str = "", n: int = 0) -> AuditEvent:
    return AuditEvent(
        id=new_id("aud_", 1_000 + n), at_ms=1_000 + n, actor="ops", action=action, target=target, detail='{"n": 1}'
    )


def test_the_store_replaces_a_scope_and_periods_limit_keeping_its_id_and_audits_every_change(store_url: str) -> None:
    async def work(store: Store) -> None:
        limits: SpendLimitStore = spend_limit_store(store)
        assert await limits.version() == 0 and await limits.all() == []
        first = await limits.upsert(stored(user_limit("bob", 100), 1), event("admin.limit.upsert", n=1))
        assert (first.id, first.amount_cents) == ("spl_01", 100)
        replacing = msgspec.structs.replace(stored(user_limit("bob", 250), 2), created_ms=5, updated_ms=9)
        second = await limits.upsert(replacing, event("admin.limit.upsert", n=2))
        assert (second.id, second.amount_cents, second.created_ms, second.updated_ms) == ("spl_01", 250, 0, 9)
        weekly = await limits.upsert(stored(user_limit("bob", 900, "weekly"), 3), event("admin.limit.upsert", n=3))
        pool = stored(org_limit(1, "monthly", {"amount": "500", "paused": True}), 4)
        assert (await limits.upsert(pool, event("admin.limit.upsert", n=4))).pooled == pool.pooled
        assert [x.id for x in await limits.all()] == ["spl_01", "spl_03", "spl_04"]
        assert await limits.version() == 4
        assert await limits.get("spl_03") == weekly and await limits.get("spl_99") is None
        assert await limits.delete("spl_03", event("admin.limit.delete", "spl_03", n=5))
        assert not await limits.delete("spl_03", event("admin.limit.delete", "spl_03", n=6))  # nothing, unaudited
        assert await limits.version() == 5
        events, more = await limits.audit(limit=10, after_id=None, before_id=None)
        assert not more
        assert [(e.action, e.target) for e in events] == [
            ("admin.limit.delete", "spl_03"),
            ("admin.limit.upsert", "spl_04"),
            ("admin.limit.upsert", "spl_03"),
            ("admin.limit.upsert", "spl_01"),  # the replace: the kept id
            ("admin.limit.upsert", "spl_01"),
        ]
        assert events[0].actor == "ops" and json.loads(events[0].detail) == {"n": 1}
        page, more = await limits.audit(limit=2, after_id=None, before_id=None)
        assert [e.id for e in page] == [e.id for e in events[:2]] and more
        page, more = await limits.audit(limit=2, after_id=page[-1].id, before_id=None)
        assert [e.id for e in page] == [e.id for e in events[2:4]] and more
        page, more = await limits.audit(limit=2, after_id=page[-1].id, before_id=None)
        assert [e.id for e in page] == [events[4].id] and not more
        page, more = await limits.audit(limit=2, after_id=None, before_id=events[4].id)
        assert [e.id for e in page] == [e.id for e in events[2:4]] and more  # the two just newer, newest first
        page, more = await limits.audit(limit=5, after_id=None, before_id=events[1].id)
        assert [e.id for e in page] == [events[0].id] and not more

    run_with(store_url, work)


def test_audit_ids_sort_as_they_were_made() -> None:
    ids = [new_id("aud_", 5) for _ in range(1000)]
    assert ids == sorted(ids) and len(set(ids)) == 1000
    assert new_id("aud_", 6) > ids[-1] and len(ids[0]) == len("aud_") + 26


# --- the process's view, with the limiter ---


def spend_limits(store: Store, limiter: Limiter, clock: Clock) -> SpendLimits:
    async def ready() -> Store:
        return store

    return SpendLimits(ready, limiter, teams=lambda: SETTINGS.teams, clock=clock)


def admit(limiter: Limiter, key: ClientKey | None, settings: Settings = SETTINGS) -> tuple[Any, dict[str, str]]:
    return asyncio.run(limiter.admit(settings, key))


def test_limits_apply_to_every_principal_with_a_user_and_cost_nothing_without_one(store_url: str) -> None:
    clock = Clock()
    limiter = Limiter(clock)
    bob = ClientKey(name="ci", key=b"sk", user="bob")  # a key naming a user: under the spend limits too
    nobody = ClientKey(name="plain", key=b"sk2")

    async def work(store: Store) -> None:
        limits = spend_limits(store, limiter, clock)
        await limits.refresh()
        assert limiter.spend is None  # no limit: the limiter has nothing to ask
        await limits.upsert(org_limit(100, "daily"), "ops")
        assert limiter.spend is not None
        assert [scope for scope, _ in limiter.all_rules(SETTINGS, bob)] == ["spend-user:bob"]
        assert limiter.all_rules(SETTINGS, nobody) == [] and not limiter.budgeted(SETTINGS, nobody)
        lease, headers = await limiter.admit(SETTINGS, bob)
        assert lease is not None and headers == {}  # a key is shown no unified headers
        lease.settle(100, 1.0)
        with pytest.raises(BudgetExceeded) as info:
            await limiter.admit(SETTINGS, bob)
        assert info.value.scope == "spend-user:bob" and info.value.limit == "spend-user budget"
        assert "user 'bob' has spent $1.00 of its $1 budget" in info.value.message
        assert (await limiter.admit(SETTINGS, nobody)) == (None, {})
        assert isinstance(limiter.counters, MemoryCounters)
        assert not any("inflight" in k or "requests" in k for k in limiter.counters.values if "spend-" in k)
        deleted = await limits.delete((await limits.listed())[0].id, "ops")
        assert deleted is not None and limiter.spend is None
        lease, _ = await limiter.admit(SETTINGS, bob)
        assert lease is None  # no rule left

    run_with(store_url, work)


def test_a_limit_set_through_one_process_applies_in_another_at_its_next_poll(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    clock = Clock()

    async def go() -> None:
        one, two = open_store(url), open_store(url)
        await one.open()
        await two.open()
        first, second = Limiter(clock), Limiter(clock)
        mine, theirs = spend_limits(one, first, clock), spend_limits(two, second, clock)
        await mine.refresh()
        await theirs.refresh()
        poller = asyncio.get_running_loop().create_task(
            SpendLimits(_ready(two), second, poll_s=0.05, clock=clock).run()
        )
        try:
            await mine.upsert(user_limit("alice@example.com", 0), "ops")
            with pytest.raises(BudgetExceeded):
                await first.admit(SETTINGS, ALICE)
            for _ in range(40):
                await asyncio.sleep(0.05)
                if second.spend is not None:
                    break
            with pytest.raises(BudgetExceeded):
                await second.admit(SETTINGS, ALICE)
        finally:
            poller.cancel()
            await one.aclose()
            await two.aclose()

    asyncio.run(go())


def _ready(store: Store) -> Callable[[], Awaitable[Store]]:
    async def ready() -> Store:
        return store

    return ready


def test_the_ledgers_spend_is_seeded_for_users_the_organizations_pool_and_a_teams_pool() -> None:
    clock = Clock()
    limiter = Limiter(clock)
    store = MemoryStore()
    day = budget_window_start("day", clock.now)
    rows = [
        LedgerRow(started_ms=int((day - 60) * 1000), request_id="yesterday", user="alice@example.com", cost_usd=90.0),
        LedgerRow(
            started_ms=int((day + 60) * 1000),
            request_id="a1",
            user="alice@example.com",
            team="payments",
            cost_usd=3.0,
        ),
        LedgerRow(started_ms=int((day + 90) * 1000), request_id="b1", user="bob", team="payments", cost_usd=4.0),
        LedgerRow(started_ms=int((day + 99) * 1000), request_id="k1", key_name="ci", cost_usd=50.0),  # no user
    ]
    asyncio.run(store.write(rows))
    limits = spend_limits(store, limiter, clock)

    async def work() -> int:
        await limits.refresh()
        await limits.upsert(user_limit("alice@example.com", 500), "ops")  # $3 of $5 spent today
        await limits.upsert(group_limit("payments", 100_000, "daily", {"amount": "800"}), "ops")  # $7 of $8
        await limits.upsert(org_limit(100_000, "daily", {"amount": "1000"}), "ops")  # $7 of $10
        return await seed_budgets(limiter, SETTINGS, store, now=clock.now, plans=limits.seed_plans())

    assert asyncio.run(work()) == 4  # alice, bob, the payments pool, the org pool
    lease, headers = admit(limiter, ALICE)
    assert headers[overage.PREFIX + "overage-utilization"] == "0.87"  # the team pool: $7 of $8, the most used
    assert headers[overage.PREFIX + "status"] == "allowed_warning"
    lease.settle(0, 1.0)  # $8 of the pool's $8
    with pytest.raises(BudgetExceeded) as info:
        admit(limiter, ALICE)
    assert info.value.headers[overage.PREFIX + "overage-scope"] == "group_pool"
    assert "shares" in info.value.message and "payments" in info.value.message


# --- what Claude Code is shown ---


def test_the_unified_headers_follow_the_most_utilised_cap() -> None:
    ends = T0 + 3600.4
    assert overage.allowed_headers([]) == {}
    small = overage.Cap("spend-user:a", "day", 10.0, 1.0, ends)
    big = overage.Cap("spend-org", "month", 100.0, 80.0, ends + 86_400)
    assert overage.allowed_headers([small, big]) == {
        "anthropic-ratelimit-unified-status": "allowed_warning",
        "anthropic-ratelimit-unified-representative-claim": "overage",
        "anthropic-ratelimit-unified-overage-status": "allowed_warning",
        "anthropic-ratelimit-unified-overage-utilization": "0.80",
        "anthropic-ratelimit-unified-overage-surpassed-threshold": "0.75",
        "anthropic-ratelimit-unified-reset": str(math.ceil(ends + 86_400)),
        "anthropic-ratelimit-unified-overage-reset": str(math.ceil(ends + 86_400)),
    }
    calm = overage.allowed_headers([small])
    assert calm[overage.PREFIX + "status"] == calm[overage.PREFIX + "overage-status"] == "allowed"
    assert calm[overage.PREFIX + "overage-utilization"] == "0.10"
    assert overage.PREFIX + "overage-surpassed-threshold" not in calm
    nearly = overage.allowed_headers([small._replace(spent=9.999)])
    assert nearly[overage.PREFIX + "overage-utilization"] == "0.99"  # below 1 while allowed
    assert nearly[overage.PREFIX + "overage-surpassed-threshold"] == "0.95"


def test_a_signed_in_principal_under_a_cap_gets_the_unified_headers_and_claude_codes_429() -> None:
    clock = Clock()
    limiter = Limiter(clock)
    store = MemoryStore()
    limits = spend_limits(store, limiter, clock)

    async def setup() -> None:
        await limits.refresh()
        await limits.upsert(user_limit("alice@example.com", 1000), "ops")  # $10 a day

    asyncio.run(setup())
    lease, headers = admit(limiter, ALICE)
    assert headers[overage.PREFIX + "status"] == "allowed" and headers[overage.PREFIX + "overage-utilization"] == "0.00"
    day_ends = budget_window("day", clock.now)[1]
    assert headers[overage.PREFIX + "reset"] == headers[overage.PREFIX + "overage-reset"] == str(int(day_ends))
    lease.settle(1000, 7.6)
    _, headers = admit(limiter, ALICE)
    assert headers[overage.PREFIX + "status"] == "allowed_warning"
    assert headers[overage.PREFIX + "overage-surpassed-threshold"] == "0.75"
    assert headers[overage.PREFIX + "overage-utilization"] == "0.76"
    lease, _ = admit(limiter, ALICE)
    lease.settle(1000, 2.5)
    with pytest.raises(BudgetExceeded) as info:
        admit(limiter, ALICE)
    refusal = info.value
    assert refusal.status_code == 429 and refusal.error_type == "billing_error"
    assert refusal.headers == {
        "retry-after": str(math.ceil(day_ends - clock.now)),
        "x-should-retry": "false",
        "anthropic-ratelimit-unified-status": "rejected",
        "anthropic-ratelimit-unified-reset": str(int(day_ends)),
        "anthropic-ratelimit-unified-overage-reset": str(int(day_ends)),
        "anthropic-ratelimit-unified-overage-utilization": "1",
        "anthropic-ratelimit-unified-overage-surpassed-threshold": "1",
        "anthropic-ratelimit-unified-overage-period": "daily",
        "anthropic-ratelimit-unified-overage-disabled-reason": "org_spend_cap_reached",
    }
    assert refusal.message == (
        "You have reached your daily spend limit of $10.00 ($10.10 spent). It resets at 2026-12-03 00:00 UTC "
        "(in 14 h). To continue before then, ask your administrator to raise the limit."
    )
    body = json.loads(refusal.render("req_1"))
    assert body["error"] == {"type": "billing_error", "message": refusal.message}
    # the same key without a session (a key naming that user) keeps the gateway's own refusal
    with pytest.raises(BudgetExceeded) as plain:
        admit(limiter, ClientKey(name="ci", key=b"k", user="alice@example.com"))
    assert overage.PREFIX + "status" not in plain.value.headers and "has spent" in plain.value.message


def test_a_team_budget_of_the_config_shows_as_a_group_pool_and_a_paused_pool_refuses_at_once() -> None:
    settings = parse_settings(
        """
providers: {demo: {kind: mock}}
models: {m: {targets: [{provider: demo}]}}
auth: {keys: [{name: ci, key: sk-ci}]}
teams: {payments: {limits: {budget: {usd: 2, per: week}}}}
"""
    )
    clock = Clock()
    limiter = Limiter(clock)
    lease, headers = admit(limiter, ALICE, settings)
    assert headers[overage.PREFIX + "overage-utilization"] == "0.00"
    lease.settle(0, 2.0)
    with pytest.raises(BudgetExceeded) as info:
        admit(limiter, ALICE, settings)
    assert info.value.headers[overage.PREFIX + "overage-period"] == "weekly"
    assert info.value.headers[overage.PREFIX + "overage-scope"] == "group_pool"
    assert "team 'payments' shares" in info.value.message

    limits = spend_limits(MemoryStore(), limiter, clock)

    async def pause() -> None:
        await limits.refresh()
        await limits.upsert(group_limit("engineering", 100_000, "monthly", {"amount": "500", "paused": True}), "ops")

    asyncio.run(pause())
    with pytest.raises(BudgetExceeded) as paused:
        admit(limiter, ALICE)
    assert paused.value.message.startswith("Spending is paused: the monthly spend limit of $0.00 that your group")
    assert paused.value.headers[overage.PREFIX + "overage-scope"] == "group_pool"


class BrokenCounters:
    """Shared counters that cannot be reached (a Redis that is down)."""

    async def admit(self, checks: Any, adds: Any) -> tuple[int, list[float]]:
        raise CountersError("redis is down")

    async def add(self, adds: Any) -> None:
        raise CountersError("redis is down")

    async def read(self, keys: Any) -> list[float]:
        raise CountersError("redis is down")

    async def aclose(self) -> None:
        return None


def test_counters_that_cannot_be_read_refuse_a_signed_in_principal_with_fetch_error_when_denying() -> None:
    settings = parse_settings(
        """
providers: {demo: {kind: mock}}
models: {m: {targets: [{provider: demo}]}}
auth: {keys: [{name: ci, key: sk-ci}]}
limits: {budget: {usd: 5, per: month}, on_store_error: deny}
"""
    )
    limiter = Limiter(Clock(), counters=BrokenCounters(), on_store_error="deny")
    with pytest.raises(SpendUnchecked) as info:
        asyncio.run(limiter.admit(settings, ALICE))
    assert info.value.status_code == 429 and info.value.error_type == "billing_error"
    assert info.value.headers == {
        "x-should-retry": "false",
        "anthropic-ratelimit-unified-status": "rejected",
        "anthropic-ratelimit-unified-overage-disabled-reason": "fetch_error",
    }
    assert "cannot check your spend limit" in info.value.message
    from gateway.governance.limits import LimitStoreDown

    with pytest.raises(LimitStoreDown):  # a key keeps the gateway's own answer
        asyncio.run(limiter.admit(settings, ClientKey(name="ci", key=b"k")))


def test_the_usage_answer_has_the_protocols_shape() -> None:
    from gateway.http.spend_limits_api import usage_body

    ends = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    caps = [
        overage.Cap("spend-user:a", "month", 500.0, 400.0, ends),
        overage.Cap("spend-user:a", "day", 10.0, 10.5, ends - 86_400 * 29),
    ]
    assert usage_body(caps, None) == {
        "extra_usage": {
            "is_enabled": True,
            "monthly_limit": 50000,
            "used_credits": 40000,
            "utilization": 80,
            "currency": "USD",
        },
        "limits": [
            {
                "kind": "spend",
                "group": "daily",
                "percent": 100,
                "resets_at": "2026-12-03T00:00:00Z",
                "severity": "critical",
                "is_active": True,
            },
            {
                "kind": "spend",
                "group": "monthly",
                "percent": 80,
                "resets_at": "2027-01-01T00:00:00Z",
                "severity": "warning",
                "is_active": False,
            },
        ],
    }
    assert usage_body([], 12.345) == {
        "extra_usage": {
            "is_enabled": False,
            "monthly_limit": None,
            "used_credits": 1234,
            "utilization": None,
            "currency": "USD",
        },
        "limits": [],
    }


def test_two_processes_share_the_spend_counters_in_redis_and_the_ledgers_spend_is_raised_into_them(
    redis_server: Any,
) -> None:
    """Two limiters over one Redis (two replicas' worth) and one spend limit: spent through one, refused through the
    other; the ledger's spend seeded into Redis, never lowering what is counted; no request or in-flight counter for
    a spend limit's rule."""
    from gateway.governance.limits import RedisCounters

    clock = Clock()
    day = budget_window_start("day", clock.now)
    store = MemoryStore()
    asyncio.run(
        store.write(
            [LedgerRow(started_ms=int((day + 60) * 1000), request_id="r1", user="alice@example.com", cost_usd=0.5)]
        )
    )

    async def go() -> None:
        a = Limiter(clock, counters=RedisCounters(redis_server.url, prefix="spend1:"))
        b = Limiter(clock, counters=RedisCounters(redis_server.url, prefix="spend1:"))
        mine, theirs = spend_limits(store, a, clock), spend_limits(store, b, clock)
        await mine.refresh()
        await mine.upsert(user_limit("alice@example.com", 200), "ops")  # $2 a day; $0.50 spent (the ledger)
        await theirs.refresh()
        lease, headers = await b.admit(SETTINGS, ALICE)
        assert headers[overage.PREFIX + "overage-utilization"] == "0.25"
        lease.settle(10, 1.6)
        await asyncio.sleep(0.1)  # the settlement: one round trip off the request path
        with pytest.raises(BudgetExceeded) as info:
            await a.admit(SETTINGS, ALICE)
        assert info.value.headers[overage.PREFIX + "overage-period"] == "daily"
        await theirs.seed()  # the ledger's $0.50 is below what Redis counted: nothing lowered
        with pytest.raises(BudgetExceeded):
            await b.admit(SETTINGS, ALICE)
        import redis

        direct = redis.Redis.from_url(redis_server.url)
        keys = sorted(k.decode() for k in direct.keys("spend1:*"))
        assert keys == [f"spend1:spend-user:alice@example.com|usd|day:{datetime.fromtimestamp(day, UTC).date()}"]
        for limiter in (a, b):
            await limiter.aclose()

    asyncio.run(go())
