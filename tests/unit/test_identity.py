"""Who a request is (``gateway/governance/identity.py``): config keys and issued keys looked up the same way, by digest;
issued keys made, listed, expired and revoked; a second process (another ``IssuedKeys`` on the same store)
sees a revocation at its next poll."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from gateway.governance.identity import ID_PREFIX, KEY_PREFIX, Identity, IssuedKeys, KeyRequest, new_key_id
from gateway.governance.keys import build_keys, digest_of
from gateway.governance.store import MemoryStore, Store
from gateway.settings import LimitSettings, Settings, parse_settings
from gateway.wire.errors import AuthenticationError, InvalidRequest, StoreUnavailable

CONFIG = """
auth: {keys: [{name: ci, key: sk-ci, team: pay}, sk-plain]}
admin: {keys: [sk-admin]}
teams:
  pay: {models: [sonnet], limits: {requests_per_minute: 100}}
  ops: {}
"""


class Snapshot:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        keys = build_keys(settings.auth.keys, settings.teams)
        self.key_index = {k.digest: k for k in keys}
        self.keys = keys


def setup(config: str = CONFIG, store: MemoryStore | None = None) -> tuple[Snapshot, IssuedKeys, Identity, MemoryStore]:
    store = store or MemoryStore()

    async def ready() -> Store:
        return store

    snapshot = Snapshot(parse_settings(config))
    issued = IssuedKeys(ready)
    issued.use_teams(snapshot.settings.teams)
    return snapshot, issued, Identity(issued), store


def auth(identity: Identity, snapshot: Snapshot, key: str, header: str = "x-api-key") -> Any:
    value = f"Bearer {key}" if header == "authorization" else key
    return asyncio.run(identity.authenticate(snapshot, {header: value}))[1]  # type: ignore[arg-type]


def test_config_keys_are_found_by_digest_from_either_header() -> None:
    snapshot, _, identity, _ = setup()
    assert auth(identity, snapshot, "sk-ci").name == "ci"
    assert auth(identity, snapshot, "sk-plain", "authorization").name == "key-2"
    for bad in ("sk-c", "sk-ci ", "x" * 1000):
        with pytest.raises(AuthenticationError, match="invalid API key"):
            auth(identity, snapshot, bad)
    with pytest.raises(AuthenticationError, match="missing API key"):
        asyncio.run(identity.authenticate(snapshot, {}))  # type: ignore[arg-type]


def test_an_issued_key_works_at_once_carries_its_attribution_and_is_stored_as_a_digest_only() -> None:
    snapshot, issued, identity, store = setup()

    async def go() -> tuple[str, Any]:
        request = KeyRequest(name="alice", team="pay", user="alice@example.com", limits=LimitSettings(max_inflight=2))
        return await issued.issue(request, snapshot.settings, {"ci", "key-2"})

    secret, record = asyncio.run(go())
    assert secret.startswith(KEY_PREFIX) and len(secret) > 40
    assert record.key_sha256 == digest_of(secret).hex() and secret not in repr(store.keys)
    assert record.hint == f"{secret[:9]}…{secret[-4:]}"
    key = auth(identity, snapshot, secret)
    assert (key.name, key.team, key.user, key.models) == ("alice", "pay", "alice@example.com", ("sonnet",))
    assert key.limits == LimitSettings(max_inflight=2)  # its own limits, read back from the store
    assert asyncio.run(issued.revoke("alice")) and not asyncio.run(issued.revoke("alice"))
    with pytest.raises(AuthenticationError):
        auth(identity, snapshot, secret)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "ci"}, "a key of the config file"),
        ({"name": "a b"}, "name: 1 to 128"),
        ({"name": "jwt:alice"}, "name: 1 to 128"),
        ({"name": "x" * 129}, "name: 1 to 128"),
        ({"name": "apikey_01AAAA"}, "starts the keys' ids"),  # a name never looks like an id
        ({"name": "a", "team": "nope"}, "not one of the config's teams"),
        ({"name": "a", "expires_at": "2020-01-01T00:00:00Z"}, "in the past"),
        ({"name": "a", "expires_at": "tomorrow"}, "RFC 3339"),
        ({"name": "a", "expires_at": "2099-01-01T00:00:00"}, "time zone"),
        ({"name": "a", "expires_at": "9999-12-31T23:59:59-01:00"}, "up to 9999-12-31"),  # year 10000 in UTC
        ({"name": "a", "user": "u" * 129}, "at most 128"),
    ],
)
def test_a_bad_key_request_is_a_400_naming_the_field(fields: dict[str, Any], message: str) -> None:
    snapshot, issued, _, _ = setup()
    with pytest.raises(InvalidRequest, match=message):
        asyncio.run(issued.issue(KeyRequest(**fields), snapshot.settings, {"ci", "key-2"}))


def test_a_budget_without_prices_and_a_name_taken_twice_are_refused() -> None:
    from gateway.settings import Budget

    snapshot, issued, _, _ = setup(CONFIG + "builtin_pricing: false\n")
    budget = LimitSettings(budget=Budget(usd=5, per="day"))
    with pytest.raises(InvalidRequest, match=r"no prices to count a budget with \(builtin_pricing: false\)"):
        asyncio.run(issued.issue(KeyRequest(name="b", limits=budget), snapshot.settings, set()))
    with_table, issued_too, _, _ = setup()  # the shipped Claude prices count it
    asyncio.run(issued_too.issue(KeyRequest(name="b", limits=budget), with_table.settings, set()))
    asyncio.run(issued.issue(KeyRequest(name="a"), snapshot.settings, set()))
    with pytest.raises(InvalidRequest, match="exists; revoke it first"):
        asyncio.run(issued.issue(KeyRequest(name="a"), snapshot.settings, set()))


def test_an_expired_key_is_refused_at_once() -> None:
    import time as clock

    snapshot, issued, identity, store = setup()
    secret, record = asyncio.run(
        issued.issue(KeyRequest(name="short", expires_at="2099-01-01T00:00:00Z"), snapshot.settings, set())
    )
    assert auth(identity, snapshot, secret).expires == record.expires_ms / 1000  # type: ignore[operator]
    import msgspec

    store.keys[record.id] = msgspec.structs.replace(record, expires_ms=int(clock.time() * 1000) - 1)
    store.version += 1
    asyncio.run(issued.refresh())
    with pytest.raises(AuthenticationError, match="'short' has expired"):
        auth(identity, snapshot, secret)


def test_another_process_sees_a_revocation_at_its_next_poll_and_keeps_its_keys_while_the_store_is_down() -> None:
    snapshot, here, _, store = setup()
    _, there, identity_there, _ = setup(store=store)

    async def go() -> None:
        secret, _ = await here.issue(KeyRequest(name="bob"), snapshot.settings, set())
        poll = asyncio.get_running_loop().create_task(there.run())
        there._poll_s = 0.05
        await asyncio.sleep(0.15)
        assert (await identity_there.authenticate(snapshot, {"x-api-key": secret}))[1].name == "bob"  # type: ignore[arg-type,union-attr]
        store.fail = ConnectionError("down")
        await asyncio.sleep(0.15)  # the poll fails: the keys last read stay
        assert (await identity_there.authenticate(snapshot, {"x-api-key": secret}))[1].name == "bob"  # type: ignore[arg-type,union-attr]
        with pytest.raises(StoreUnavailable):
            await here.revoke("bob")
        store.fail = None
        await here.revoke("bob")
        await asyncio.sleep(0.15)
        with pytest.raises(AuthenticationError):
            await identity_there.authenticate(snapshot, {"x-api-key": secret})  # type: ignore[arg-type]
        poll.cancel()

    asyncio.run(go())


def test_a_reload_gives_issued_keys_their_teams_new_models() -> None:
    snapshot, issued, identity, _ = setup()
    secret, _ = asyncio.run(issued.issue(KeyRequest(name="t", team="pay"), snapshot.settings, set()))
    assert auth(identity, snapshot, secret).models == ("sonnet",)
    issued.use_teams(parse_settings(CONFIG.replace("models: [sonnet]", "models: [haiku]")).teams)
    assert auth(identity, snapshot, secret).models == ("haiku",)


def test_an_open_gateway_checks_nothing() -> None:
    snapshot, _, identity, _ = setup("auth: {open: true}")
    sent, key = asyncio.run(identity.authenticate(snapshot, {"x-api-key": "anything"}))  # type: ignore[arg-type]
    assert key is None and sent == {"x-api-key": "anything"}


_ID = re.compile(r"apikey_[0-9A-HJKMNP-TV-Z]{26}")  # Crockford's base32: no I, L, O, U


def test_an_issued_key_is_known_by_an_id_of_its_own_and_config_keys_by_their_names() -> None:
    """Issue 31: the id is given at issue, stored with the key and carried by its ``ClientKey`` (what the limits,
    the ledger and the reports use); the name is the label. A config key (or a JWT's principal) has its name."""
    snapshot, issued, identity, store = setup()
    secret, record = asyncio.run(issued.issue(KeyRequest(name="dev-1"), snapshot.settings, {"ci", "key-2"}))
    assert _ID.fullmatch(record.id) and record.name == "dev-1" and list(store.keys) == [record.id]
    key = auth(identity, snapshot, secret)
    assert (key.id, key.name) == (record.id, "dev-1")
    assert [(k.id, k.name) for k in snapshot.keys] == [("ci", "ci"), ("key-2", "key-2")]


def test_ids_are_unique_and_sort_by_the_time_they_were_issued() -> None:
    ids = [new_key_id(ms) for ms in (1_700_000_000_000, 1_700_000_000_001, 1_800_000_000_000) for _ in range(50)]
    assert len(set(ids)) == len(ids) and all(_ID.fullmatch(i) for i in ids)
    assert [i[: len(ID_PREFIX) + 10] for i in ids] == sorted(i[: len(ID_PREFIX) + 10] for i in ids)
    assert ids[0][len(ID_PREFIX) :].startswith("01H")  # 2023: the shape of the Admin API's apikey_01… ids


def test_a_name_issued_again_after_revocation_is_a_new_key_with_fresh_limits() -> None:
    """The old holder of ``dev-1`` used its 2 a minute; revoked and issued again, ``dev-1`` is another id, so
    another limits scope: its requests pass (before, both were ``key:dev-1``, and the newcomer was refused)."""
    from gateway.governance.limits import Limiter, RateLimited

    snapshot, issued, identity, _ = setup()
    limiter = Limiter(lambda: 1_800_000_030.0)
    two = LimitSettings(requests_per_minute=2)

    def admit(secret: str) -> None:
        asyncio.run(limiter.admit(snapshot.settings, auth(identity, snapshot, secret)))

    old, first = asyncio.run(issued.issue(KeyRequest(name="dev-1", limits=two), snapshot.settings, set()))
    admit(old)
    admit(old)
    with pytest.raises(RateLimited):
        admit(old)
    assert asyncio.run(issued.revoke("dev-1"))  # by its name
    new, second = asyncio.run(issued.issue(KeyRequest(name="dev-1", limits=two), snapshot.settings, set()))
    admit(new)
    admit(new)  # the newcomer's own two
    with pytest.raises(RateLimited):
        admit(new)
    assert second.id != first.id and second.name == first.name
    assert [scope for scope, _ in Limiter.rules(snapshot.settings, auth(identity, snapshot, new))] == [
        f"key:{second.id}"
    ]


def test_revoke_takes_the_id_or_the_name() -> None:
    snapshot, issued, identity, _ = setup()
    secret, record = asyncio.run(issued.issue(KeyRequest(name="svc"), snapshot.settings, {"ci", "key-2"}))
    other, kept = asyncio.run(issued.issue(KeyRequest(name="kept"), snapshot.settings, {"ci", "key-2"}))
    assert asyncio.run(issued.revoke("apikey_nothing")) is None and asyncio.run(issued.revoke("key-2")) is None
    assert asyncio.run(issued.revoke(record.id)) == record
    assert asyncio.run(issued.revoke(record.id)) is None and asyncio.run(issued.revoke("svc")) is None
    with pytest.raises(AuthenticationError):
        auth(identity, snapshot, secret)
    assert auth(identity, snapshot, other).id == kept.id
    assert [r.id for r in asyncio.run(issued.listed())] == [kept.id]
