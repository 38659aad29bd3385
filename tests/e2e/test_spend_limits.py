"""Spend limits end to end (issue 34, items 5 and 6): the Admin-API-shaped routes on a gateway process with read and
write admin keys, their audit; two gateway processes sharing one SQLite file, where a limit set through one refuses
on the other within two seconds; and a person signed in with Claude Code's ``/login`` (the device flow against a
fake identity provider, the browser half as a browser sends it) seeing their cap in the
``anthropic-ratelimit-unified-*`` headers, refused as Claude Code expects over it, and reading their own standing at
``GET /api/oauth/usage``."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import run_gateway
from tests.fakes.claude_api import FakeClaudeAPI
from tests.fakes.oidc import FakeOidcIssuer, FakeUser
from tests.login_browser import open_verification
from tests.net import free_port
from tests.postgres import PostgresServer, new_database

PATH = "/v1/organizations/spend_limits"
WRITE = {"x-api-key": "sk-admin"}
READ = {"x-api-key": "sk-read"}
MSG = {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
V = {"anthropic-version": "2023-06-01"}
ALICE = FakeUser(sub="00u-alice", email="alice@example.com", name="Alice", groups=("engineering", "payments"))
UNIFIED = "anthropic-ratelimit-unified-"


def gateway_config(store_url: str, *, extra: str = "") -> str:
    return f"""
providers:
  demo: {{kind: mock}}
models:
  claude-sonnet-4-6: {{targets: [{{provider: demo}}]}}
pricing: {{"claude-*": {{input: 1, output: 1}}}}
auth: {{keys: [{{name: ci, key: sk-ci, user: bob}}, {{name: other, key: sk-other}}]}}
admin: {{keys: [{{name: ops, key: sk-admin}}], read_keys: [{{name: auditor, key: sk-read}}]}}
store: {{url: "{store_url}", flush_interval_s: 0.05}}
{extra}"""


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer | None) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    if postgres is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    return new_database(postgres)


def error_of(answer: httpx.Response, status: int, error_type: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type, body
    message: str = body["error"]["message"]
    return message


def test_the_admin_api_with_read_and_write_keys_and_its_audit(serve: Any, tmp_path: Path, store_url: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(gateway_config(store_url))
    url = serve(path).url + PATH

    # who may: no key, another key, a client key -> 401; a read key writing -> 403
    error_of(httpx.get(url), 401, "authentication_error")
    error_of(httpx.get(url, headers={"x-api-key": "sk-ci"}), 401, "authentication_error")
    bob = {"scope": {"type": "user", "user_id": "bob"}, "amount": "5000", "period": "daily"}
    assert "admin.read_keys" in error_of(httpx.post(url, json=bob, headers=READ), 403, "permission_error")
    assert httpx.get(url, headers=READ).json()["data"] == []

    # set, replace (same id), more
    made = httpx.post(url, json=bob, headers=WRITE)
    assert made.status_code == 200, made.text
    limit = made.json()
    assert limit["type"] == "spend_limit" and limit["id"].startswith("spl_") and len(limit["id"]) == 30
    assert (limit["scope"], limit["amount"], limit["period"]) == ({"type": "user", "user_id": "bob"}, "5000", "daily")
    assert limit["created_at"].endswith("Z") and "pooled_budget" not in limit
    replaced = httpx.post(url, json={**bob, "amount": "7000"}, headers=WRITE).json()
    assert (replaced["id"], replaced["amount"], replaced["created_at"]) == (limit["id"], "7000", limit["created_at"])
    group = {
        "scope": {"type": "rbac_group", "rbac_group_id": "contractors"},
        "amount": "10000",
        "period": "weekly",
        "pooled_budget": {"amount": "50000", "paused": False},
    }
    pooled = httpx.post(url, json=group, headers=WRITE).json()
    assert pooled["pooled_budget"] == {"amount": "50000", "paused": False}
    org = httpx.post(url, json={"scope": {"type": "organization"}, "amount": 50000, "period": "monthly"}, headers=WRITE)
    assert org.json()["scope"] == {"type": "organization"} and org.json()["amount"] == "50000"

    # the checks name the field
    wrong = {**bob, "period": "hourly"}
    assert error_of(httpx.post(url, json=wrong, headers=WRITE), 400, "invalid_request_error").startswith("period:")
    wrong = {**bob, "scope": {"type": "user"}}
    assert "scope.user_id" in error_of(httpx.post(url, json=wrong, headers=WRITE), 400, "invalid_request_error")
    wrong = {**bob, "amount": "1.5"}
    assert "amount" in error_of(httpx.post(url, json=wrong, headers=WRITE), 400, "invalid_request_error")
    bad = httpx.post(url, content=b"{", headers={**WRITE, "content-type": "application/json"})
    error_of(bad, 400, "invalid_request_error")

    # read: list (paginated by id), one, effective
    every = httpx.get(url, headers=READ).json()
    ids = [item["id"] for item in every["data"]]
    assert ids == sorted(ids) and len(ids) == 3 and not every["has_more"]
    assert (every["first_id"], every["last_id"]) == (ids[0], ids[-1])
    first = httpx.get(url, params={"limit": 2}, headers=READ).json()
    assert [item["id"] for item in first["data"]] == ids[:2] and first["has_more"]
    rest = httpx.get(url, params={"limit": 2, "after_id": first["last_id"]}, headers=READ).json()
    assert [item["id"] for item in rest["data"]] == ids[2:] and not rest["has_more"]
    back = httpx.get(url, params={"limit": 1, "before_id": ids[2]}, headers=READ).json()
    assert [item["id"] for item in back["data"]] == ids[1:2] and back["has_more"]
    error_of(httpx.get(url, params={"limit": 0}, headers=READ), 400, "invalid_request_error")
    assert httpx.get(f"{url}/{limit['id']}", headers=READ).json() == replaced
    error_of(httpx.get(f"{url}/spl_nope", headers=READ), 404, "not_found_error")
    applied = httpx.get(
        f"{url}/effective", params={"user_id": "bob", "rbac_group_id": ["contractors", "x"]}, headers=READ
    ).json()
    assert applied["user_id"] == "bob" and applied["rbac_group_ids"] == ["contractors", "x"]
    assert [(e["applies"], e["period"], e["amount"]) for e in applied["data"]] == [
        ("per_user", "daily", "7000"),  # bob's own
        ("per_user", "weekly", "10000"),  # his group's, for each member
        ("group_pool", "weekly", "50000"),  # and the pool the group shares
        ("per_user", "monthly", "50000"),  # the organization's default
    ]
    assert all(e["spent"] == "0" and e["resets_at"].endswith("T00:00:00Z") for e in applied["data"])
    error_of(httpx.get(f"{url}/effective", headers=READ), 400, "invalid_request_error")

    # delete: a read key may not; the answer; then it is gone
    error_of(httpx.delete(f"{url}/{limit['id']}", headers=READ), 403, "permission_error")
    gone = httpx.delete(f"{url}/{limit['id']}", headers=WRITE)
    assert gone.status_code == 200 and gone.json() == {"type": "spend_limit_deleted", "id": limit["id"]}
    error_of(httpx.delete(f"{url}/{limit['id']}", headers=WRITE), 404, "not_found_error")
    error_of(httpx.get(f"{url}/{limit['id']}", headers=WRITE), 404, "not_found_error")

    # the audit: every change, newest first, by the admin key's name, paginated
    audit = httpx.get(f"{url}/audit", headers=READ).json()
    events = audit["data"]
    assert [(e["type"], e["action"], e["target"], e["actor"]) for e in events] == [
        ("audit_event", "admin.limit.delete", limit["id"], "ops"),
        ("audit_event", "admin.limit.upsert", org.json()["id"], "ops"),
        ("audit_event", "admin.limit.upsert", pooled["id"], "ops"),
        ("audit_event", "admin.limit.upsert", limit["id"], "ops"),  # the replacement
        ("audit_event", "admin.limit.upsert", limit["id"], "ops"),
    ]
    assert events[3]["detail"] == {"scope_type": "user", "scope_id": "bob", "period": "daily", "amount": "7000"}
    assert events[2]["detail"]["pooled_budget"] == {"amount": "50000", "paused": False}
    page = httpx.get(f"{url}/audit", params={"limit": 2}, headers=READ).json()
    assert [e["id"] for e in page["data"]] == [e["id"] for e in events[:2]] and page["has_more"]
    page = httpx.get(f"{url}/audit", params={"limit": 2, "after_id": page["last_id"]}, headers=READ).json()
    assert [e["id"] for e in page["data"]] == [e["id"] for e in events[2:4]] and page["has_more"]
    page = httpx.get(f"{url}/audit", params={"limit": 10, "before_id": events[2]["id"]}, headers=READ).json()
    assert [e["id"] for e in page["data"]] == [e["id"] for e in events[:2]] and not page["has_more"]
    error_of(httpx.get(f"{url}/audit", headers={"x-api-key": "sk-ci"}), 401, "authentication_error")


def test_a_limit_set_through_one_process_refuses_on_another_within_two_seconds(serve: Any, tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(gateway_config(f"sqlite:///{tmp_path}/shared.db"))
    one, two = serve(path), serve(path)
    key = {"x-api-key": "sk-ci", **V}  # a key naming a user (bob): under the spend limits too

    def ask(served: Any, headers: dict[str, str] = key) -> httpx.Response:
        return httpx.post(f"{served.url}/v1/messages", json={"model": "claude-sonnet-4-6", **MSG}, headers=headers)

    assert ask(one).status_code == ask(two).status_code == 200
    stop = {"scope": {"type": "user", "user_id": "bob"}, "amount": "0", "period": "daily"}
    made = httpx.post(f"{one.url}{PATH}", json=stop, headers=WRITE)
    assert made.status_code == 200, made.text
    set_at = time.monotonic()
    error_of(ask(one), 429, "billing_error")  # the process that set it: at once
    while True:
        answer = ask(two)
        if answer.status_code == 429 or time.monotonic() - set_at > 5:
            break
        time.sleep(0.05)
    took = time.monotonic() - set_at
    message = error_of(answer, 429, "billing_error")
    assert took < 2.0, f"the other process refused only after {took:.2f} s"
    assert answer.headers["x-should-retry"] == "false" and int(answer.headers["retry-after"]) >= 1
    assert "user 'bob'" in message and "resets at" in message
    assert UNIFIED + "status" not in answer.headers  # a key is no signed-in person: the gateway's own refusal
    assert ask(two, {"x-api-key": "sk-other", **V}).status_code == 200  # a key of no user is under none

    # lifted through the other: the first admits again within the poll
    gone = httpx.delete(f"{two.url}{PATH}/{made.json()['id']}", headers=WRITE)
    assert gone.status_code == 200
    lifted_at = time.monotonic()
    while ask(one).status_code != 200:
        assert time.monotonic() - lifted_at < 2.0, "the first process still refuses"
        time.sleep(0.05)


# --- a person signed in with /login ---


@pytest.fixture
def idp() -> Iterator[FakeOidcIssuer]:
    with FakeOidcIssuer(user=ALICE) as issuer:
        yield issuer


def signin_config(idp: FakeOidcIssuer, port: int, upstream: str, store_url: str) -> str:
    idp.register_redirect(f"http://127.0.0.1:{port}/oauth/callback")
    return f"""
server: {{max_request_bytes: 200000}}
resilience: {{retry: {{max_attempts: 1}}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{upstream}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
pricing: {{"fake-*": {{input: 10000}}}}
auth: {{keys: [{{name: ci, key: sk-ci}}]}}
admin: {{keys: [{{name: ops, key: sk-admin}}], read_keys: [{{name: auditor, key: sk-read}}]}}
teams: {{payments: {{}}}}
store: {{url: "{store_url}", flush_interval_s: 0.05}}
login:
  public_url: http://127.0.0.1:{port}
  oidc: {{issuer: "{idp.issuer}", client_id: gateway, client_secret: gateway-secret}}
  poll_interval_s: 1
"""


def sign_in(url: str) -> dict[str, str]:
    """The device flow as the CLI and its browser do it; the bearer's headers."""
    started = httpx.post(f"{url}/oauth/device_authorization", data={"surface": "claude_code"}).json()
    assert open_verification(started["verification_uri_complete"]).status == 200
    time.sleep(started["interval"])
    grant = "urn:ietf:params:oauth:grant-type:device_code"
    token = httpx.post(f"{url}/oauth/token", data={"grant_type": grant, "device_code": started["device_code"]})
    assert token.status_code == 200, token.text
    return {"authorization": f"Bearer {token.json()['access_token']}", **V}


def utilization(answer: httpx.Response) -> float:
    return float(answer.headers[UNIFIED + "overage-utilization"])


def usage(url: str, bearer: dict[str, str], cents: int | None = None) -> dict[str, Any]:
    """``GET /api/oauth/usage``; with ``cents``, once the ledger holds that month's spend."""
    deadline = time.monotonic() + 5
    while True:
        answer = httpx.get(f"{url}/api/oauth/usage", headers=bearer)
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        if cents is None or body["extra_usage"]["used_credits"] == cents or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def test_a_signed_in_person_sees_their_cap_and_is_refused_as_claude_code_expects(
    idp: FakeOidcIssuer, fake: FakeClaudeAPI, tmp_path: Path
) -> None:
    port = free_port()
    config = signin_config(idp, port, fake.base_url, f"sqlite:///{tmp_path}/ledger.db")
    with run_gateway(config, port=port) as gw:
        url = gw.url
        bearer = sign_in(url)

        def ask(stream: bool = False) -> httpx.Response:
            body = {"model": "fake-text", **MSG, "stream": stream}
            return httpx.post(f"{url}/v1/messages", json=body, headers=bearer, timeout=30)

        # no cap: the provider's own rate-limit headers pass, none of the gateway's; the month's spend
        plain = ask()
        assert plain.status_code == 200, plain.text
        assert plain.headers["anthropic-ratelimit-requests-limit"] == "4000"
        assert not any(name.startswith(UNIFIED) for name in plain.headers)
        standing = usage(url, bearer, cents=21)  # 21 input tokens at $0.01
        assert standing == {
            "extra_usage": {
                "is_enabled": False,
                "monthly_limit": None,
                "used_credits": 21,
                "utilization": None,
                "currency": "USD",
            },
            "limits": [],
        }

        # a cap of $1 a day for her (by email): today's $0.21 counts against it at once
        cap = {"scope": {"type": "user", "user_id": "alice@example.com"}, "amount": "100", "period": "daily"}
        made = httpx.post(f"{url}{PATH}", json=cap, headers={"x-api-key": "sk-admin"})
        assert made.status_code == 200, made.text
        day_ends = math.ceil(datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()) + 86_400
        streamed = ask(stream=True)
        assert streamed.status_code == 200 and "message_stop" in streamed.text
        assert streamed.headers[UNIFIED + "status"] == streamed.headers[UNIFIED + "overage-status"] == "allowed"
        assert streamed.headers[UNIFIED + "representative-claim"] == "overage"
        assert utilization(streamed) == pytest.approx(0.21, abs=0.011)
        assert streamed.headers[UNIFIED + "reset"] == streamed.headers[UNIFIED + "overage-reset"] == str(day_ends)
        assert UNIFIED + "overage-surpassed-threshold" not in streamed.headers
        assert not any(name.startswith("anthropic-ratelimit-requests") for name in streamed.headers)  # stripped
        counted = httpx.post(
            f"{url}/v1/messages/count_tokens", json={"model": "fake-text", "messages": MSG["messages"]}, headers=bearer
        )
        assert counted.status_code == 200 and utilization(counted) == pytest.approx(0.42, abs=0.011)
        for spent in (0.42, 0.63):
            answer = ask()
            assert answer.headers[UNIFIED + "status"] == "allowed"
            assert utilization(answer) == pytest.approx(spent, abs=0.011)
            assert "anthropic-ratelimit-requests-limit" not in answer.headers
        standing = usage(url, bearer)
        assert standing["extra_usage"]["is_enabled"] and standing["extra_usage"]["monthly_limit"] is None
        (daily,) = standing["limits"]
        assert daily["kind"] == "spend" and daily["group"] == "daily" and daily["percent"] in (83, 84)
        assert daily["severity"] == "warning" and daily["is_active"] is False
        assert daily["resets_at"] == datetime.fromtimestamp(day_ends, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        warned = ask()
        assert warned.status_code == 200
        assert warned.headers[UNIFIED + "status"] == warned.headers[UNIFIED + "overage-status"] == "allowed_warning"
        assert warned.headers[UNIFIED + "overage-surpassed-threshold"] == "0.75"

        # over the cap: refused before the provider is asked, as Claude Code expects
        sent = len(fake.requests)
        for stream in (False, True):
            refused = ask(stream=stream)
            message = error_of(refused, 429, "billing_error")
            headers = {k: v for k, v in refused.headers.items() if k.startswith(UNIFIED)}
            assert headers == {
                UNIFIED + "status": "rejected",
                UNIFIED + "reset": str(day_ends),
                UNIFIED + "overage-reset": str(day_ends),
                UNIFIED + "overage-utilization": "1",
                UNIFIED + "overage-surpassed-threshold": "1",
                UNIFIED + "overage-period": "daily",
                UNIFIED + "overage-disabled-reason": "org_spend_cap_reached",
            }
            assert refused.headers["x-should-retry"] == "false"
            assert 1 <= int(refused.headers["retry-after"]) <= 86_400
            assert message.startswith("You have reached your daily spend limit of $1.00 ($1.05 spent). It resets at")
            assert "ask your administrator to raise the limit" in message
        assert len(fake.requests) == sent
        over = usage(url, bearer)["limits"][0]
        assert (over["percent"], over["severity"], over["is_active"]) == (100, "critical", True)

        # raised (the same limit, replaced): served again at once
        raised = httpx.post(f"{url}{PATH}", json={**cap, "amount": "10000"}, headers={"x-api-key": "sk-admin"})
        assert raised.json()["id"] == made.json()["id"]
        again = ask()
        assert again.status_code == 200 and again.headers[UNIFIED + "status"] == "allowed"
        assert utilization(again) == pytest.approx(0.01, abs=0.011)

        # a key is answered for itself; nobody is refused
        assert httpx.get(f"{url}/api/oauth/usage", headers={"x-api-key": "sk-ci"}).json()["limits"] == []
        nobody = httpx.get(f"{url}/api/oauth/usage", headers={"authorization": "Bearer nope"})
        error_of(nobody, 401, "authentication_error")
        assert nobody.headers["x-should-retry"] == "false"
