"""Where the spend limits (``gateway.governance.spend_limits``) and their audit are kept: the tables
``spend_limits``, ``spend_limits_version`` and ``admin_audit`` of the ledger's store (schema version 5 of
``gateway.governance.store``), through ``SqlStore.sql`` on SQLite and PostgreSQL, or a twin in memory (a
``memory://`` store, the unit tests).

One narrow interface (``SpendLimitStore``). A change is one transaction: the limit's row, its ``admin_audit`` row
and the version every process polls move together, so a replica that sees the version has the change and its
audit. ``upsert`` inserts a limit or, when one of the same scope and period exists, replaces its amount and pool
and keeps its id and creation time; ``delete`` removes one by id (False when there is none). The audit is listed
newest first by id (``audit``: the spend limits' own actions only).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from gateway.governance.store import MemoryStore, SqlStep, SqlStore, Store

__all__ = [
    "ACTIONS",
    "AuditEvent",
    "MemorySpendLimitStore",
    "Pool",
    "SpendLimit",
    "SpendLimitStore",
    "SqlSpendLimitStore",
    "audit_detail",
    "new_id",
    "spend_limit_store",
]

ACTIONS = ("admin.limit.upsert", "admin.limit.delete", "admin.session.revoke")  # what the audit view lists


class Pool(msgspec.Struct, frozen=True, kw_only=True):
    """A budget a group's (or the organization's) members share."""

    amount_cents: int
    paused: bool = False


class SpendLimit(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    scope_type: str  # user | rbac_group | organization
    scope_id: str  # the user's id or the group's; "" for the organization
    period: str  # daily | weekly | monthly
    amount_cents: int
    pooled: Pool | None = None
    created_ms: int
    updated_ms: int


class AuditEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An admin change: who (the admin key's name), what (``admin.limit.upsert``…), to what (a limit's id) and the
    limit as JSON text (``detail``)."""

    id: str
    at_ms: int
    actor: str
    action: str
    target: str
    detail: str


class SpendLimitStore(Protocol):
    async def upsert(self, limit: SpendLimit, event: AuditEvent) -> SpendLimit:
        """Store ``limit`` (or replace the amount and pool of the one of its scope and period), audited by ``event``
        (whose target becomes the stored limit's id); the limit as stored."""
        ...

    async def delete(self, limit_id: str, event: AuditEvent) -> bool: ...

    async def record(self, event: AuditEvent) -> None:
        """An admin change that is not a limit's (a session revoked), in the same audit."""
        ...

    async def get(self, limit_id: str) -> SpendLimit | None: ...

    async def all(self) -> list[SpendLimit]: ...

    async def version(self) -> int: ...

    async def audit(self, *, limit: int, after_id: str | None, before_id: str | None) -> tuple[list[AuditEvent], bool]:
        """``limit`` events newest first, older than ``after_id`` or newer than ``before_id``; and whether there are
        more that way."""
        ...


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_last_id = [0]


def new_id(prefix: str, now_ms: int) -> str:
    """``prefix`` and 26 Crockford base32 digits: the time (48 bits of milliseconds) then 80 random bits; ids made
    by one process increase strictly, so they sort as they were made (the audit's newest first)."""
    value = (now_ms & (1 << 48) - 1) << 80 | secrets.randbits(80)
    value = _last_id[0] = max(value, _last_id[0] + 1)
    return prefix + "".join(_CROCKFORD[value >> shift & 31] for shift in range(125, -1, -5))


def audit_detail(limit: SpendLimit) -> str:
    """A limit as an audit row's ``detail`` (no secret is part of a limit)."""
    detail: dict[str, Any] = {
        "scope_type": limit.scope_type,
        "scope_id": limit.scope_id,
        "period": limit.period,
        "amount": str(limit.amount_cents),
    }
    if limit.pooled is not None:
        detail["pooled_budget"] = {"amount": str(limit.pooled.amount_cents), "paused": limit.pooled.paused}
    return msgspec.json.encode(detail).decode()


_decode_pool = msgspec.json.Decoder(Pool).decode
_COLUMNS = "id, scope_type, scope_id, period, amount_cents, pooled, created_ms, updated_ms"
_AUDIT_COLUMNS = "id, at_ms, actor, action, target, detail"
_BUMP = SqlStep("UPDATE spend_limits_version SET version = version + 1")


def _limit(row: Sequence[Any]) -> SpendLimit:
    limit_id, scope_type, scope_id, period, amount, pooled, created, updated = row
    return SpendLimit(
        id=limit_id,
        scope_type=scope_type,
        scope_id=scope_id,
        period=period,
        amount_cents=int(amount),
        pooled=None if pooled is None else _decode_pool(pooled),
        created_ms=int(created),
        updated_ms=int(updated),
    )


def _event(row: Sequence[Any]) -> AuditEvent:
    event_id, at_ms, actor, action, target, detail = row
    return AuditEvent(id=event_id, at_ms=int(at_ms), actor=actor, action=action, target=target, detail=detail)


def _pooled(limit: SpendLimit) -> str | None:
    return None if limit.pooled is None else msgspec.json.encode(limit.pooled).decode()


class SqlSpendLimitStore:
    """The limits in the ledger's SQLite or PostgreSQL database."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store

    async def upsert(self, limit: SpendLimit, event: AuditEvent) -> SpendLimit:
        same = "scope_type = ? AND scope_id = ? AND period = ?"
        where = (limit.scope_type, limit.scope_id, limit.period)
        values = (
            limit.id,
            *where,
            limit.amount_cents,
            _pooled(limit),
            limit.created_ms,
            limit.updated_ms,
        )
        results = await self._store.sql(
            [
                SqlStep(
                    f"INSERT INTO spend_limits ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (scope_type, scope_id, period) DO UPDATE SET amount_cents = excluded.amount_cents, "
                    "pooled = excluded.pooled, updated_ms = excluded.updated_ms",
                    values,
                ),
                SqlStep(
                    f"INSERT INTO admin_audit ({_AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, "
                    f"(SELECT id FROM spend_limits WHERE {same}), ?)",
                    (event.id, event.at_ms, event.actor, event.action, *where, event.detail),
                ),
                _BUMP,
                SqlStep(f"SELECT {_COLUMNS} FROM spend_limits WHERE {same}", where, fetch=True),
            ]
        )
        return _limit(results[-1].rows[0])

    async def delete(self, limit_id: str, event: AuditEvent) -> bool:
        results = await self._store.sql(
            [
                SqlStep(
                    f"INSERT INTO admin_audit ({_AUDIT_COLUMNS}) SELECT CAST(? AS TEXT), CAST(? AS BIGINT), "
                    "CAST(? AS TEXT), CAST(? AS TEXT), id, CAST(? AS TEXT) FROM spend_limits WHERE id = ?",
                    (event.id, event.at_ms, event.actor, event.action, event.detail, limit_id),
                ),
                SqlStep(
                    "UPDATE spend_limits_version SET version = version + 1 "
                    "WHERE EXISTS (SELECT 1 FROM spend_limits WHERE id = ?)",
                    (limit_id,),
                ),
                SqlStep("DELETE FROM spend_limits WHERE id = ?", (limit_id,)),
            ]
        )
        return results[-1].rowcount > 0

    async def record(self, event: AuditEvent) -> None:
        await self._store.sql(
            [
                SqlStep(
                    f"INSERT INTO admin_audit ({_AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                    (event.id, event.at_ms, event.actor, event.action, event.target, event.detail),
                )
            ]
        )

    async def get(self, limit_id: str) -> SpendLimit | None:
        step = SqlStep(f"SELECT {_COLUMNS} FROM spend_limits WHERE id = ?", (limit_id,), fetch=True)
        rows = (await self._store.sql([step], read_only=True))[0].rows
        return _limit(rows[0]) if rows else None

    async def all(self) -> list[SpendLimit]:
        step = SqlStep(f"SELECT {_COLUMNS} FROM spend_limits ORDER BY id", fetch=True)
        return [_limit(row) for row in (await self._store.sql([step], read_only=True))[0].rows]

    async def version(self) -> int:
        step = SqlStep("SELECT version FROM spend_limits_version", fetch=True)
        return int((await self._store.sql([step], read_only=True))[0].rows[0][0])

    async def audit(self, *, limit: int, after_id: str | None, before_id: str | None) -> tuple[list[AuditEvent], bool]:
        where = f"action IN ({', '.join('?' * len(ACTIONS))})"
        params: list[Any] = list(ACTIONS)
        order = "DESC"
        if before_id is not None:
            where, order = where + " AND id > ?", "ASC"
            params.append(before_id)
        elif after_id is not None:
            where += " AND id < ?"
            params.append(after_id)
        params.append(limit + 1)
        step = SqlStep(
            f"SELECT {_AUDIT_COLUMNS} FROM admin_audit WHERE {where} ORDER BY id {order} LIMIT ?", params, fetch=True
        )
        events = [_event(row) for row in (await self._store.sql([step], read_only=True))[0].rows]
        more = len(events) > limit
        events = events[:limit]
        return (events[::-1] if order == "ASC" else events), more


class MemorySpendLimitStore:
    """The twin of ``SqlSpendLimitStore`` in this process (a ``memory://`` store, the unit tests)."""

    def __init__(self) -> None:
        self.limits: dict[str, SpendLimit] = {}  # by id
        self.events: list[AuditEvent] = []
        self._version = 0

    async def upsert(self, limit: SpendLimit, event: AuditEvent) -> SpendLimit:
        same = next(
            (
                old
                for old in self.limits.values()
                if (old.scope_type, old.scope_id, old.period) == (limit.scope_type, limit.scope_id, limit.period)
            ),
            None,
        )
        if same is not None:
            limit = msgspec.structs.replace(limit, id=same.id, created_ms=same.created_ms)
        self.limits[limit.id] = limit
        self.events.append(msgspec.structs.replace(event, target=limit.id))
        self._version += 1
        return limit

    async def delete(self, limit_id: str, event: AuditEvent) -> bool:
        if self.limits.pop(limit_id, None) is None:
            return False
        self.events.append(msgspec.structs.replace(event, target=limit_id))
        self._version += 1
        return True

    async def record(self, event: AuditEvent) -> None:
        self.events.append(event)

    async def get(self, limit_id: str) -> SpendLimit | None:
        return self.limits.get(limit_id)

    async def all(self) -> list[SpendLimit]:
        return sorted(self.limits.values(), key=lambda limit: limit.id)

    async def version(self) -> int:
        return self._version

    async def audit(self, *, limit: int, after_id: str | None, before_id: str | None) -> tuple[list[AuditEvent], bool]:
        events = sorted((e for e in self.events if e.action in ACTIONS), key=lambda e: e.id, reverse=True)
        if before_id is not None:
            newer = [e for e in events if e.id > before_id]
            return newer[-limit:], len(newer) > limit
        if after_id is not None:
            events = [e for e in events if e.id < after_id]
        return events[:limit], len(events) > limit


def spend_limit_store(store: Store) -> SpendLimitStore:
    """The limits beside the ledger: in its database, or (a ``memory://`` store) beside its rows in this process
    (one twin per memory store, as one database per SQL store)."""
    if isinstance(store, MemoryStore):
        twin = getattr(store, "_spend_limits", None)
        if not isinstance(twin, MemorySpendLimitStore):
            twin = MemorySpendLimitStore()
            setattr(store, "_spend_limits", twin)  # noqa: B010  (the memory store knows nothing of spend limits)
        return twin
    sql: SqlStore = store  # type: ignore[assignment]  # SQLite and PostgreSQL both run SQL
    return SqlSpendLimitStore(sql)
