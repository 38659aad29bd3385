"""What Claude Code shows of a spend cap: the ``anthropic-ratelimit-unified-*`` headers, for a signed-in principal
(``ClientKey.session``) under a cap — a spend limit set at run time (``gateway.governance.spend_limits``) or a
budget of the config (its key's, its default, its team's) — as the Claude apps gateway protocol lists them.

Allowed (every successful Messages response): ``status`` ``allowed``, or ``allowed_warning`` from 75 % of the cap;
``representative-claim: overage``; ``overage-status`` (the same value); ``overage-utilization``, the spend over the
cap as a fraction with two decimals (floored, so it stays below 1 while allowed); ``overage-surpassed-threshold``
``0.75`` or ``0.95`` (none below 75 %); ``reset`` and ``overage-reset``, when the cap's window ends (Unix
seconds). Of several caps, the most utilised one speaks. The CLI says "You've used NN% …" from these.

Refused (before anything is sent upstream): ``429`` with ``retry-after`` (seconds until the window ends),
``x-should-retry: false``, ``status: rejected``, ``reset``, ``overage-reset``, ``overage-utilization: 1``,
``overage-surpassed-threshold: 1``, ``overage-period`` (``daily``, ``weekly``, ``monthly``),
``overage-disabled-reason: org_spend_cap_reached`` and, for a budget a group shares (a team's budget, a group's
pool), ``overage-scope: group_pool``; a ``billing_error`` whose message says which cap, when it resets and what to
do. Never ``representative-claim`` nor ``overage-status`` on the refusal: with them the CLI writes its own line
and drops the gateway's. When the counters cannot be read and ``limits.on_store_error`` is ``deny``: ``429``,
``x-should-retry: false``, ``status: rejected``, ``overage-disabled-reason: fetch_error`` and a message.

Pure functions over ``Cap``s: the limiter (``gateway.governance.limits``) builds them from the counters it read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

__all__ = [
    "PERIOD_NAMES",
    "PREFIX",
    "Cap",
    "allowed_headers",
    "describe",
    "fetch_error",
    "is_pool",
    "rejected",
    "utilization",
]

PREFIX = "anthropic-ratelimit-unified-"
PERIOD_NAMES = {"day": "daily", "week": "weekly", "month": "monthly"}  # a budget's `per` as the protocol says it
WARNING = 0.75
CRITICAL = 0.95

# the limiter's scopes of spend limits (gateway.governance.spend_limits); named here for the messages
_USER, _GROUP, _ORG = "spend-user:", "spend-group:", "spend-org"


class Cap(NamedTuple):
    """One budget that applies to a request: its limiter scope, its window (``day``/``week``/``month``), the cap
    and what has been spent in the window (US dollars), and when the window ends (epoch seconds)."""

    scope: str
    per: str
    limit: float
    spent: float
    ends: float


def utilization(cap: Cap) -> float:
    """Spent over the cap (1 for a cap of 0: a paused pool)."""
    return cap.spent / cap.limit if cap.limit > 0 else 1.0


def is_pool(scope: str) -> bool:
    """A budget a group shares: a team's (``team:``) or a group's pool (``spend-group:``)."""
    return scope.startswith(("team:", _GROUP))


_STATUS, _CLAIM, _OVERAGE_STATUS = PREFIX + "status", PREFIX + "representative-claim", PREFIX + "overage-status"
_UTILIZATION, _RESET, _OVERAGE_RESET = PREFIX + "overage-utilization", PREFIX + "reset", PREFIX + "overage-reset"
_THRESHOLD = PREFIX + "overage-surpassed-threshold"
_FRACTIONS = [f"{n / 100:.2f}" for n in range(100)]  # "0.00" … "0.99"


def allowed_headers(caps: Sequence[Cap]) -> dict[str, str]:
    """The headers of a successful response under ``caps`` (none when there is no cap)."""
    if not caps:
        return {}
    cap = caps[0] if len(caps) == 1 else max(caps, key=utilization)
    used = utilization(cap)
    status = "allowed_warning" if used >= WARNING else "allowed"
    reset = str(math.ceil(cap.ends))
    headers = {
        _STATUS: status,
        _CLAIM: "overage",
        _OVERAGE_STATUS: status,
        _UTILIZATION: _FRACTIONS[max(0, min(math.floor(used * 100), 99))],
        _RESET: reset,
        _OVERAGE_RESET: reset,
    }
    if used >= WARNING:
        headers[_THRESHOLD] = "0.95" if used >= CRITICAL else "0.75"
    return headers


def _dollars(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.4f}"


def describe(scope: str, per: str, limit: float) -> str:
    """The cap in words, as the person it refuses reads it."""
    period = PERIOD_NAMES.get(per, per)
    amount = _dollars(limit)
    if scope.startswith(_USER):
        return f"your {period} spend limit of {amount}"
    if scope.startswith(_GROUP):
        return f"the {period} spend limit of {amount} that your group {scope[len(_GROUP) :]!r} shares"
    if scope == _ORG:
        return f"the {period} spend limit of {amount} that your organization shares"
    if scope.startswith("team:"):
        return f"the {period} budget of {amount} that your team {scope[len('team:') :]!r} shares"
    return f"your {period} budget of {amount}"


def _in(seconds: float) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{minutes} min" if minutes else ""]
    return " ".join(p for p in parts if p)


def rejected(cap: Cap, now: float) -> tuple[dict[str, str], str]:
    """The headers and the message of the ``429 billing_error`` for a request over ``cap``."""
    reset = str(math.ceil(cap.ends))
    headers = {
        "retry-after": str(max(1, math.ceil(cap.ends - now))),
        "x-should-retry": "false",
        PREFIX + "status": "rejected",
        PREFIX + "reset": reset,
        PREFIX + "overage-reset": reset,
        PREFIX + "overage-utilization": "1",
        PREFIX + "overage-surpassed-threshold": "1",
        PREFIX + "overage-period": PERIOD_NAMES.get(cap.per, "monthly"),
        PREFIX + "overage-disabled-reason": "org_spend_cap_reached",
    }
    if is_pool(cap.scope):
        headers[PREFIX + "overage-scope"] = "group_pool"
    when = datetime.fromtimestamp(math.ceil(cap.ends), UTC).strftime("%Y-%m-%d %H:%M UTC")
    what = describe(cap.scope, cap.per, cap.limit)
    if cap.limit <= 0:
        reached = f"Spending is paused: {what}."
    else:
        reached = f"You have reached {what} ({_dollars(cap.spent)} spent)."
    message = (
        f"{reached} It resets at {when} (in {_in(cap.ends - now)}). To continue before then, ask your "
        "administrator to raise the limit."
    )
    return headers, message


def fetch_error() -> tuple[dict[str, str], str]:
    """The headers and message of the ``429`` when the spend counters cannot be read and the gateway fails closed."""
    headers = {
        "x-should-retry": "false",
        PREFIX + "status": "rejected",
        PREFIX + "overage-disabled-reason": "fetch_error",
    }
    message = (
        "The gateway cannot check your spend limit right now (its counters cannot be reached), so it is not "
        "serving requests under it; try again in a few minutes, or tell your administrator if this persists."
    )
    return headers, message
