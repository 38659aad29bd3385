"""Claude Code's ``/login`` to the gateway (issue 34), end to end over HTTP: the device flow against a fake OIDC
provider (``tests/fakes/oidc.py``) with the browser half done as a browser sends it (``tests/signin_browser.py``),
every RFC 8628 answer, the minted bearer on the Messages route (attribution, team, ``availableModels``), managed
settings, the refresh grant against the IdP (and its refusal: deprovisioning), sign-out and the admin's revocation,
the verification page's CSRF guard, on SQLite and PostgreSQL; two gateway processes sharing one store."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import access_lines, run_gateway
from tests.fakes.oidc import FakeOidcIssuer, FakeUser
from tests.login_browser import open_verification as sign_in_in_browser
from tests.net import free_port
from tests.postgres import PostgresServer, new_database

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
ADMIN = {"x-api-key": "sk-admin"}
ALICE = FakeUser(sub="00u-alice", email="alice@example.com", name="Alice", groups=("engineering", "payments"))
MSG = {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
V = {"anthropic-version": "2023-06-01"}


@pytest.fixture
def idp() -> Iterator[FakeOidcIssuer]:
    with FakeOidcIssuer(user=ALICE) as issuer:
        yield issuer


def config(idp: FakeOidcIssuer, port: int, store_url: str, **extra: str) -> str:
    idp.register_redirect(f"http://127.0.0.1:{port}/oauth/callback")
    return (
        extra.get("head", "")
        + f"""
providers:
  demo: {{kind: mock}}
models:
  claude-sonnet-4-6: {{targets: [{{provider: demo}}]}}
  claude-opus-4-7: {{targets: [{{provider: demo}}]}}
auth: {{keys: [{{name: ci, key: sk-ci}}]}}
admin: {{keys: [sk-admin]}}
teams: {{payments: {{}}, platform: {{}}}}
store: {{url: "{store_url}", flush_interval_s: 0.05}}
login:
  public_url: http://127.0.0.1:{port}
  oidc: {{issuer: "{idp.issuer}", client_id: gateway, client_secret: gateway-secret}}
  poll_interval_s: 1
  notice: Sign in with your Example account
  device_requests_per_minute: {extra.get("per_minute", "20")}
managed:
  policies:
    - match: {{groups: [engineering]}}
      settings: {{availableModels: [sonnet], env: {{FROM_GATEWAY: "1"}}, permissions: {{deny: ["WebFetch"]}}}}
    - match: {{groups: [interns]}}
      settings: {{}}
"""
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer | None) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    if postgres is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    return new_database(postgres)


def start_device(url: str, **form: str) -> dict[str, Any]:
    answer = httpx.post(f"{url}/oauth/device_authorization", data={"surface": "claude_code", **form})
    assert answer.status_code == 200, answer.text
    assert answer.headers["cache-control"] == "no-store"
    body: dict[str, Any] = answer.json()
    return body


def poll(url: str, device_code: str) -> httpx.Response:
    return httpx.post(f"{url}/oauth/token", data={"grant_type": DEVICE_GRANT, "device_code": device_code})


def sign_in(url: str) -> dict[str, Any]:
    """The whole device flow, as the CLI and its browser do it: the token answer."""
    started = start_device(url)
    assert sign_in_in_browser(started["verification_uri_complete"]).status == 200
    time.sleep(started["interval"])
    answer = poll(url, started["device_code"])
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_claude_codes_login_signs_in_attributes_and_refreshes(
    idp: FakeOidcIssuer, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    port = free_port()
    with run_gateway(config(idp, port, store_url), port=port) as gw:
        url = gw.url
        meta = httpx.get(f"{url}/.well-known/oauth-authorization-server").json()
        assert meta["issuer"] == url and meta["token_endpoint"] == f"{url}/oauth/token"
        assert meta["device_authorization_endpoint"] == f"{url}/oauth/device_authorization"
        assert meta["revocation_endpoint"] == f"{url}/oauth/revoke" and "authorization_endpoint" not in meta
        assert meta["grant_types_supported"] == [DEVICE_GRANT, "refresh_token"]

        started = start_device(url, client_id="ignored", scope="ignored", unknown="x")
        assert started["expires_in"] == 600 and started["interval"] == 1
        assert started["login_notice"] == "Sign in with your Example account"
        code = started["user_code"]
        assert len(code) == 9 and code[4] == "-" and set(code) - {"-"} <= set("BCDFGHJKLMNPQRSTVWXZ")
        assert len(started["device_code"]) >= 43  # 256 bits, base64url
        assert started["verification_uri_complete"] == f"{url}/device?user_code={code}"
        pending = poll(url, started["device_code"])
        assert pending.status_code == 400 and pending.json()["error"] == "authorization_pending"
        too_fast = poll(url, started["device_code"])
        assert too_fast.status_code == 400 and too_fast.json()["error"] == "slow_down"

        page = httpx.get(started["verification_uri_complete"])
        assert page.status_code == 200 and code in page.text
        assert "<script" not in page.text  # nothing submits the code by itself
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        browser = sign_in_in_browser(started["verification_uri_complete"])
        assert browser.status == 200 and "alice@example.com" in browser.body, browser.body
        assert any(u.startswith(idp.authorization_endpoint) for u in browser.visited)
        time.sleep(1)
        minted = poll(url, started["device_code"])
        assert minted.status_code == 200, minted.text
        token = minted.json()
        assert token["token_type"] == "Bearer" and token["expires_in"] == 3600
        assert token["email"] == "alice@example.com" and token["refresh_token"].startswith("mgr_")
        again = poll(url, started["device_code"])  # a device code gives one token
        assert again.status_code == 400 and again.json()["error"] == "invalid_grant"

        bearer = {"authorization": f"Bearer {token['access_token']}", **V}
        reply = httpx.post(f"{url}/v1/messages", json={"model": "claude-sonnet-4-6", **MSG}, headers=bearer)
        assert reply.status_code == 200, reply.text
        assert access_lines(caplog, reply.headers["request-id"])[0]["key"] == "sso:00u-alice"  # the IdP subject
        assert reply.headers["x-gateway-mock"] == "true"
        refused = httpx.post(f"{url}/v1/messages", json={"model": "claude-opus-4-7", **MSG}, headers=bearer)
        assert refused.status_code == 400 and "claude-opus-4-7" in refused.json()["error"]["message"]
        models = httpx.get(f"{url}/v1/models", headers=bearer).json()
        assert [m["id"] for m in models["data"]] == ["claude-sonnet-4-6"]

        managed = httpx.get(f"{url}/managed/settings", headers=bearer)
        assert managed.status_code == 200
        body = managed.json()
        assert body["settings"]["env"] == {"FROM_GATEWAY": "1"}
        canonical = json.dumps(body["settings"], sort_keys=True, separators=(",", ":"))
        import hashlib

        assert body["checksum"] == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
        assert managed.headers["etag"] == f'"{body["checksum"]}"'
        cached = httpx.get(f"{url}/managed/settings", headers={**bearer, "if-none-match": managed.headers["etag"]})
        assert cached.status_code == 304
        other = httpx.get(f"{url}/managed/settings", headers={**bearer, "if-none-match": '"sha256:0"'})
        assert other.status_code == 200

        # the refresh grant: against the IdP, a new bearer, the refresh token rotated and single use
        refreshed = httpx.post(
            f"{url}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": token["refresh_token"]}
        )
        assert refreshed.status_code == 200, refreshed.text
        assert idp.token_count["refresh_token"] == 1
        new = refreshed.json()
        reused = httpx.post(
            f"{url}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": token["refresh_token"]}
        )
        assert reused.status_code == 401 and reused.json()["error"] == "invalid_grant"
        fresh = {"authorization": f"Bearer {new['access_token']}", **V}
        assert httpx.post(f"{url}/v1/messages", json={"model": "claude-sonnet-4-6", **MSG}, headers=fresh).is_success

        # sign-out (RFC 7009): the bearer is refused at once, without retries
        assert httpx.post(f"{url}/oauth/revoke", data={"token": new["refresh_token"]}).status_code == 200
        out = httpx.post(f"{url}/v1/messages", json={"model": "claude-sonnet-4-6", **MSG}, headers=fresh)
        assert out.status_code == 401 and out.headers["x-should-retry"] == "false"
        assert "revoked" in out.json()["error"]["message"]
        assert httpx.post(f"{url}/oauth/revoke", data={"token": "unknown"}).status_code == 200

        # the ledger: the user is the IdP's email, the team the first configured team among its groups
        day = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime())
        report = httpx.get(
            f"{url}/v1/organizations/usage_report/messages",
            params={
                "starting_at": day,
                "ending_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86_400)),
                "group_by[]": ["account_id", "workspace_id", "api_key_id"],
            },
            headers=ADMIN,
            timeout=30,
        ).json()
        rows = [r for b in report["data"] for r in b["results"]]
        assert {(r["account_id"], r["workspace_id"], r["api_key_id"]) for r in rows} == {
            ("alice@example.com", "payments", "sso:00u-alice")
        }
        assert sum(r["requests"] for r in rows) == 2

    audit = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.audit"]
    events = [e["event"] for e in audit]
    for wanted in ("device.authorize", "device.verify", "session.mint", "session.refresh", "managed.serve"):
        assert wanted in events
    assert "session.revoke" in events and "auth.denied" in events
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "gateway.audit")
    for secret in (token["access_token"], token["refresh_token"], started["device_code"], "gateway-secret"):
        assert secret not in text


def test_the_identity_provider_refusing_a_refresh_ends_the_session(idp: FakeOidcIssuer, tmp_path: Path) -> None:
    port = free_port()
    with run_gateway(config(idp, port, f"sqlite:///{tmp_path}/ledger.db"), port=port) as gw:
        token = sign_in(gw.url)
        idp.refuse_refresh = True  # the user was deprovisioned
        refused = httpx.post(
            f"{gw.url}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": token["refresh_token"]}
        )
        assert refused.status_code == 401 and refused.json()["error"] == "invalid_grant"
        bearer = {"authorization": f"Bearer {token['access_token']}", **V}
        out = httpx.post(f"{gw.url}/v1/messages", json={"model": "claude-sonnet-4-6", **MSG}, headers=bearer)
        assert out.status_code == 401 and out.headers["x-should-retry"] == "false"
        idp.refuse_refresh = False  # the session stays ended
        again = httpx.post(
            f"{gw.url}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": token["refresh_token"]}
        )
        assert again.status_code == 401


def test_deny_csrf_and_the_device_errors(idp: FakeOidcIssuer, tmp_path: Path) -> None:
    port = free_port()
    with run_gateway(config(idp, port, f"sqlite:///{tmp_path}/ledger.db", per_minute="6"), port=port) as gw:
        url = gw.url
        denied = start_device(url)
        page = sign_in_in_browser(denied["verification_uri_complete"], action="deny")
        assert page.status == 200 and "denied" in page.body.lower()
        answer = poll(url, denied["device_code"])
        assert answer.status_code == 400 and answer.json()["error"] == "access_denied"

        guarded = start_device(url)
        link = guarded["verification_uri_complete"]
        for headers in (
            {"origin": "http://evil.example", "sec-fetch-site": "cross-site"},
            {"origin": url, "sec-fetch-site": "cross-site"},
        ):
            refused = sign_in_in_browser(link, headers=headers)
            assert refused.status == 403, refused.body
        no_cookie = httpx.post(f"{url}/device", data={"csrf": "x", "user_code": guarded["user_code"]})
        assert no_cookie.status_code == 403
        unknown = sign_in_in_browser(link, user_code="BBBB-BBBB")
        assert unknown.status == 400 and "unknown" in unknown.body
        assert poll(url, guarded["device_code"]).json()["error"] == "authorization_pending"
        idp.deny_next_authorize = True  # the IdP says no
        assert sign_in_in_browser(link).status == 200
        assert poll(url, guarded["device_code"]).json()["error"] == "access_denied"

        assert poll(url, "never-issued").json()["error"] == "invalid_grant"
        grants = httpx.post(f"{url}/oauth/token", data={"grant_type": "password"})
        assert grants.status_code == 400 and grants.json()["error"] == "unsupported_grant_type"
        assert httpx.post(f"{url}/oauth/token", data={}).json()["error"] == "invalid_request"
        statuses = [
            httpx.post(f"{url}/oauth/device_authorization", data={"surface": "claude_code"}).status_code
            for _ in range(6)
        ]
        assert statuses[-1] == 429  # six a minute from this address, four already asked
        limited = httpx.post(f"{url}/oauth/device_authorization", data={})
        assert limited.status_code == 429 and limited.json()["error"] == "slow_down"


def test_a_policy_that_does_not_match_is_404_and_an_empty_one_is_200_empty(idp: FakeOidcIssuer, tmp_path: Path) -> None:
    port = free_port()
    with run_gateway(config(idp, port, f"sqlite:///{tmp_path}/ledger.db"), port=port) as gw:
        idp.user = FakeUser(sub="u-intern", email="intern@example.com", name="Intern", groups=("interns",))
        token = sign_in(gw.url)
        bearer = {"authorization": f"Bearer {token['access_token']}"}
        empty = httpx.get(f"{gw.url}/managed/settings", headers=bearer)
        assert empty.status_code == 200 and empty.json()["settings"] == {}
        idp.user = FakeUser(sub="u-guest", email="guest@example.com", name="Guest", groups=("guests",))
        guest = {"authorization": f"Bearer {sign_in(gw.url)['access_token']}"}
        assert httpx.get(f"{gw.url}/managed/settings", headers=guest).status_code == 404
        assert httpx.get(f"{gw.url}/managed/settings").status_code == 401
        # the guest's groups name no team: attributed to no team, every model allowed
        reply = httpx.post(f"{gw.url}/v1/messages", json={"model": "claude-opus-4-7", **MSG}, headers={**guest, **V})
        assert reply.status_code == 200


def test_two_replicas_share_the_flow_and_a_revocation_reaches_the_other_within_two_seconds(
    idp: FakeOidcIssuer, tmp_path: Path, serve: Any
) -> None:
    store = f"sqlite:///{tmp_path}/shared.db"
    one_port, two_port = free_port(), free_port()
    # both replicas behind one public URL: the first's (the callback comes back to it)
    text = config(idp, one_port, store)
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    one = serve(path, port=one_port)
    two = serve(path, port=two_port)
    started = start_device(two.url)  # started on the second
    assert sign_in_in_browser(started["verification_uri_complete"]).status == 200  # approved through the first
    time.sleep(1)
    token = poll(two.url, started["device_code"]).json()
    bearer = {"authorization": f"Bearer {token['access_token']}", **V}
    for served in (one, two):
        assert httpx.post(f"{served.url}/v1/messages", json={"model": "claude-sonnet-4-6", **MSG}, headers=bearer)
    sessions = httpx.get(f"{one.url}/v1/gateway/sessions", headers=ADMIN).json()["data"]
    assert [s["email"] for s in sessions] == ["alice@example.com"]
    assert httpx.get(f"{one.url}/v1/gateway/sessions", headers={"x-api-key": "sk-ci"}).status_code == 401
    revoked = httpx.delete(f"{one.url}/v1/gateway/sessions/{sessions[0]['id']}", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["type"] == "session_revoked"
    start = time.monotonic()
    while True:
        answer = httpx.post(f"{two.url}/v1/messages", json={"model": "claude-sonnet-4-6", **MSG}, headers=bearer)
        if answer.status_code == 401:
            break
        assert time.monotonic() - start < 2.0, "the other replica still accepts a revoked session's bearer"
        time.sleep(0.05)
    assert httpx.delete(f"{one.url}/v1/gateway/sessions/ses_nope", headers=ADMIN).status_code == 404
    events = httpx.get(f"{two.url}/v1/organizations/spend_limits/audit", headers=ADMIN).json()["data"]
    assert (events[0]["action"], events[0]["target"]) == ("admin.session.revoke", sessions[0]["id"])
    assert events[0]["detail"] == {"subject": ALICE.sub, "email": ALICE.email}


class Collector:
    """An OTLP/HTTP collector on 127.0.0.1 that keeps what it is sent (path, headers, body)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.received: list[tuple[str, dict[str, str], bytes]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                collector.received.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_telemetry_is_answered_at_once_relayed_unchanged_and_announced_in_the_policy(
    idp: FakeOidcIssuer, tmp_path: Path
) -> None:
    collector = Collector()
    try:
        head = f"""
telemetry:
  forward_to:
    - url: {collector.url}
      headers: {{x-collector-key: c-123}}
      signals: [metrics, logs]
"""
        port = free_port()
        with run_gateway(config(idp, port, f"sqlite:///{tmp_path}/ledger.db", head=head), port=port) as gw:
            token = sign_in(gw.url)
            bearer = {"authorization": f"Bearer {token['access_token']}"}
            env = httpx.get(f"{gw.url}/managed/settings", headers=bearer).json()["settings"]["env"]
            assert env["FROM_GATEWAY"] == "1" and env["CLAUDE_CODE_ENABLE_TELEMETRY"] == "1"
            assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == gw.url
            assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
            assert (env["OTEL_METRICS_EXPORTER"], env["OTEL_LOGS_EXPORTER"], env["OTEL_TRACES_EXPORTER"]) == (
                "otlp",
                "otlp",
                "none",
            )
            body = bytes(range(256)) * 4  # opaque to the relay: forwarded as it is
            protobuf = {**bearer, "content-type": "application/x-protobuf"}
            for signal in ("metrics", "logs", "traces"):
                answer = httpx.post(f"{gw.url}/v1/{signal}", content=body, headers=protobuf)
                assert answer.status_code == 200 and answer.content == b""
            assert httpx.post(f"{gw.url}/v1/metrics", content=body).status_code == 401
            deadline = time.monotonic() + 10
            while len(collector.received) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)
            paths = sorted(path for path, _, _ in collector.received)
            assert paths == ["/v1/logs", "/v1/metrics"]  # the traces were not asked for
            for _, headers, received in collector.received:
                assert received == body and headers["x-collector-key"] == "c-123"
                assert "authorization" not in headers and headers["content-type"] == "application/x-protobuf"
    finally:
        collector.close()


def test_the_bearer_works_on_the_bedrock_and_vertex_shaped_routes_and_a_reload_changes_the_policy(
    idp: FakeOidcIssuer, tmp_path: Path, serve: Any
) -> None:
    port = free_port()
    path = tmp_path / "gateway.yaml"
    text = config(idp, port, f"sqlite:///{tmp_path}/ledger.db")
    path.write_text(text)
    served = serve(path, port=port)
    bearer = {"authorization": f"Bearer {sign_in(served.url)['access_token']}"}
    bedrock = httpx.post(
        f"{served.url}/model/claude-sonnet-4-6/invoke",
        json={**MSG, "anthropic_version": "bedrock-2023-05-31"},
        headers=bearer,
    )
    assert bedrock.status_code == 200, bedrock.text
    vertex = httpx.post(
        f"{served.url}/v1/projects/p/locations/global/publishers/anthropic/models/claude-sonnet-4-6:rawPredict",
        json={**MSG, "anthropic_version": "vertex-2023-10-16"},
        headers=bearer,
    )
    assert vertex.status_code == 200, vertex.text
    opus = httpx.post(
        f"{served.url}/model/claude-opus-4-7/invoke",
        json={**MSG, "anthropic_version": "bedrock-2023-05-31"},
        headers=bearer,
    )
    assert opus.status_code == 400 and "claude-opus-4-7" in opus.text  # availableModels, on every shape

    first = httpx.get(f"{served.url}/managed/settings", headers=bearer)
    assert first.json()["settings"]["availableModels"] == ["sonnet"]
    path.write_text(text.replace("availableModels: [sonnet]", "availableModels: [sonnet, opus]"))
    deadline = time.monotonic() + 10
    while True:  # the watcher reloads within a second or two
        now = httpx.get(f"{served.url}/managed/settings", headers={**bearer, "if-none-match": first.headers["etag"]})
        if now.status_code == 200:
            break
        assert now.status_code == 304 and time.monotonic() < deadline
        time.sleep(0.2)
    assert now.json()["settings"]["availableModels"] == ["sonnet", "opus"]
    assert now.headers["etag"] != first.headers["etag"]
    opus = httpx.post(
        f"{served.url}/model/claude-opus-4-7/invoke",
        json={**MSG, "anthropic_version": "bedrock-2023-05-31"},
        headers=bearer,
    )
    assert opus.status_code == 200, opus.text  # the reloaded policy applies to a bearer already seen


@pytest.mark.long
def test_a_sign_in_that_takes_the_user_over_a_minute_is_polled_at_the_default_interval_and_completes(
    idp: FakeOidcIssuer, tmp_path: Path
) -> None:
    """The defaults: a 5 s interval, a 600 s code, 20 device requests a minute per address. The CLI polls every
    interval for 70 s (past the rate limit's minute) while the user is slow in the browser: never ``slow_down``,
    then the token."""
    port = free_port()
    text = config(idp, port, f"sqlite:///{tmp_path}/ledger.db").replace("  poll_interval_s: 1\n", "")
    with run_gateway(text, port=port) as gw:
        started = start_device(gw.url)
        assert started["interval"] == 5 and started["expires_in"] == 600
        begun = time.monotonic()
        answers = []
        while time.monotonic() - begun < 70:
            answers.append(poll(gw.url, started["device_code"]).json()["error"])
            time.sleep(started["interval"])
        assert set(answers) == {"authorization_pending"} and len(answers) >= 13
        assert sign_in_in_browser(started["verification_uri_complete"]).status == 200
        time.sleep(started["interval"])
        token = poll(gw.url, started["device_code"])
        assert token.status_code == 200, token.text
        reply = httpx.post(
            f"{gw.url}/v1/messages",
            json={"model": "claude-sonnet-4-6", **MSG},
            headers={"authorization": f"Bearer {token.json()['access_token']}", **V},
        )
        assert reply.status_code == 200


def test_readiness_says_whether_the_store_opens(tmp_path: Path) -> None:
    ready = f'auth: {{keys: [sk-x]}}\nstore: {{url: "sqlite:///{tmp_path}/ledger.db"}}'
    with run_gateway(ready) as gw:
        assert httpx.get(f"{gw.url}/readyz").json() == {"status": "ready"}
    blocked = tmp_path / "file"
    blocked.write_text("")
    with run_gateway(f'auth: {{keys: [sk-x]}}\nstore: {{url: "sqlite:///{blocked}/ledger.db"}}') as gw:
        answer = httpx.get(f"{gw.url}/readyz")
        assert answer.status_code == 503 and "store" in answer.json()["reason"]
        assert httpx.get(f"{gw.url}/healthz").status_code == 200
