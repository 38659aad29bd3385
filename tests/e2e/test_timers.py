"""Issue 29: no timer of the gateway ends a healthy exchange. For the timers whose "outlives" half no other test
shows, a healthy exchange that lasts longer than the timer (shortened here; the defaults are the long-haul tests')
is untouched, and where it is cheap, the thing the timer guards is still stopped. The inventory of every timer,
with the tests of both halves, is the table of timers in ``docs/design.md`` (issue 29)."""

from __future__ import annotations

import json
import select
import socket
import socketserver
import sqlite3
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI, sse_body
from tests.jwt_issuer import AUDIENCE, LocalIssuer

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}


def claude(name: str, url: str, **extra: Any) -> str:
    more = "".join(f", {k}: {v}" for k, v in extra.items())
    return f'  {name}: {{kind: anthropic, api_key: provider-key, base_url: "{url}"{more}}}\n'


class Streamed:
    """One streamed request's answer: status, event names, text deltas, the body, and when it began and ended."""

    def __init__(self) -> None:
        self.status = 0
        self.names: list[str] = []
        self.text = ""
        self.body = ""
        self.headers: dict[str, str] = {}
        self.began = threading.Event()  # the response head is in: the stream is in flight
        self.started = 0.0
        self.ended = 0.0

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def complete(self) -> bool:
        return (
            self.status == 200 and bool(self.names) and self.names[-1] == "message_stop" and "error" not in self.names
        )


def stream(url: str, model: str, headers: dict[str, str] | None = None, out: Streamed | None = None) -> Streamed:
    out = out or Streamed()
    out.started = time.monotonic()
    body = {"model": model, "stream": True, **KW}
    with httpx.stream("POST", f"{url}/v1/messages", json=body, headers=headers, timeout=30) as resp:
        out.status, out.headers = resp.status_code, dict(resp.headers)
        out.began.set()
        out.body = resp.read().decode()
    out.ended = time.monotonic()
    out.names = [line[7:] for line in out.body.split("\n") if line.startswith("event: ")]
    for line in out.body.split("\n"):
        if line.startswith("data: ") and '"text_delta"' in line:
            out.text += json.loads(line[6:])["delta"]["text"]
    return out


def in_background(url: str, model: str, headers: dict[str, str] | None = None) -> tuple[Streamed, threading.Thread]:
    """A stream run in a thread; returns once its response has started."""
    out = Streamed()
    thread = threading.Thread(target=stream, args=(url, model, headers, out), daemon=True)
    thread.start()
    assert out.began.wait(10), "the stream did not start"
    return out, thread


def post(url: str, model: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", json={"model": model, **KW}, headers=headers, timeout=30)


def eventually(check: Callable[[], bool], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- the upstream timers: first event, the read timeout, total_s, pings ----------------------------------------


def test_a_stream_longer_than_its_first_event_read_and_total_timeouts_is_untouched(fake: FakeClaudeAPI) -> None:
    """A 2 s stream (a delta every 100 ms) against first_event_s 0.5, read_timeout_s 0.5 and pings every 70 ms,
    within total_s 4: the first-event timer stops at the first event, the read timer measures silence (not the
    body's time), and the ping timer, which also holds the total deadline, re-arms without cutting anything. A
    JSON answer after 1 s is not bound by first_event_s (it has no events)."""
    yaml = f"""
auth: {{open: true}}
server: {{ping_interval_s: 0.07}}
resilience: {{retry: {{max_attempts: 1}}, timeouts: {{first_event_s: 0.5, total_s: 4}}}}
providers:
{claude("c1", fake.base_url, read_timeout_s=0.5)}{claude("c2", fake.base_url, read_timeout_s=3)}models:
  streamed: {{targets: [{{provider: c1, model: fake-slow-d20-i100}}]}}
  answered: {{targets: [{{provider: c2, model: fake-slow-d10-i100}}]}}
"""
    with run_gateway(yaml) as gw:
        got = stream(gw.url, "streamed")
        assert got.complete, got.body[-300:]
        assert got.seconds >= 1.9  # four times the first-event and the read timeout
        assert got.text == "".join(f"tick {i}. " for i in range(20))  # every delta, in order
        assert "ping" in got.names
        started = time.monotonic()
        answer = post(gw.url, "answered")
        assert time.monotonic() - started >= 0.9
        assert answer.status_code == 200 and answer.json()["stop_reason"] == "end_turn"
        for alias, model in (("streamed", "fake-slow-d20-i100"), ("answered", "fake-slow-d10-i100")):
            provider = "c1" if alias == "streamed" else "c2"
            labels = {"alias": alias, "provider": provider, "model": model}
            assert gw.sample("gateway_requests_total", **labels, outcome="completed") == 1
            assert gw.sample("gateway_requests_total", **labels, outcome="timeout") == 0


# --- the Redis store timeout and the shared count delay ---------------------------------------------------------


def redis_config(fake: FakeClaudeAPI, url: str, name: str) -> str:
    return f"""
auth: {{keys: [{{name: {name}, key: sk-redis, limits: {{max_inflight: 1, tokens_per_minute: 1000000}}}}]}}
limits: {{redis_url: "{url}", on_store_error: deny}}
providers:
{claude("c1", fake.base_url)}models:
  "*": {{targets: [{{provider: c1}}]}}
"""


def test_a_stream_longer_than_the_redis_store_timeout_is_untouched_and_settled(
    fake: FakeClaudeAPI, redis_server: Any
) -> None:
    """Limits over Redis, a 2.5 s stream: longer than the store timeout (1 s, one timer per connection while a
    call is unanswered) and the shared count delay (1 s). With ``on_store_error: deny`` any call that timed out
    would show (529, a store error); none does. Its input tokens reach Redis while it runs, its slot in flight
    is held (a second request is 429) and given back at its end, with every token counted."""
    import redis as sync_redis

    name = f"timers-{uuid.uuid4().hex[:8]}"
    direct = sync_redis.Redis.from_url(redis_server.url)
    key = {"x-api-key": "sk-redis"}

    def tokens() -> float:
        return sum(float(direct.get(k) or 0) for k in direct.keys(f"mgw:key:{name}|tokens|*"))

    def inflight() -> float:
        return float(direct.get(f"mgw:key:{name}|inflight") or 0)

    with run_gateway(redis_config(fake, redis_server.url, name)) as gw:
        running, thread = in_background(gw.url, "fake-slow-d25-i100", key)
        assert inflight() == 1
        refused = post(gw.url, "fake-text", key)
        assert refused.status_code == 429 and "in flight" in refused.json()["error"]["message"]
        assert eventually(lambda: tokens() >= 10, within=2.0)  # message_start's 10 input tokens, within ~1 s
        assert thread.is_alive()  # counted while it runs, not by its settlement
        thread.join(10)
        assert running.complete, running.body[-300:]
        assert running.seconds >= 2.4
        assert eventually(lambda: inflight() == 0)
        assert eventually(lambda: tokens() == 10 + 76)  # input, and the 3n+1 output tokens of 25 deltas
        assert post(gw.url, "fake-text", key).status_code == 200  # the slot was given back
        assert gw.sample("gateway_limit_store_errors_total") == 0


def test_a_stream_longer_than_the_inflight_ttl_gives_back_only_its_own_slot(
    fake: FakeClaudeAPI, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-flight counter expires (``_INFLIGHT_TTL``, 3600 s; 1 s here) so that a slot a crashed process never
    gave back is forgotten. A healthy stream that outlives it (total_s may be set above 3600 s; at the defaults
    the two are equal) must not leave the counter below zero: with ``max_inflight: 1``, two streams at once must
    still be refused."""
    import redis as sync_redis

    import gateway.governance.limits

    monkeypatch.setattr(gateway.governance.limits, "_INFLIGHT_TTL", 1)
    name = f"timers-{uuid.uuid4().hex[:8]}"
    direct = sync_redis.Redis.from_url(redis_server.url)
    key = {"x-api-key": "sk-redis"}
    with run_gateway(redis_config(fake, redis_server.url, name)) as gw:
        assert stream(gw.url, "fake-slow-d10-i250", key).complete  # 2.5 s, alone: the counter expired meanwhile
        time.sleep(0.2)  # the settlement is sent off the request path
        assert float(direct.get(f"mgw:key:{name}|inflight") or 0) >= 0
        running, thread = in_background(gw.url, "fake-slow-d10-i100", key)
        second = post(gw.url, "fake-text", key)
        thread.join(10)
        assert running.complete
        assert second.status_code == 429  # max_inflight: 1 still holds


# --- the ledger's flush interval ----------------------------------------------------------------------------------


def test_a_stream_longer_than_the_flush_interval_is_one_ledger_row_with_its_duration(
    fake: FakeClaudeAPI, tmp_path: Path
) -> None:
    """flush_interval_s 0.2, a 1 s stream: five flushes run while it does; it is written once, when it ends, with
    its whole duration (not a partial row per flush, not the time to some flush)."""
    db = tmp_path / "ledger.db"
    yaml = f"""
auth: {{open: true}}
store: {{url: "sqlite:///{db}", flush_interval_s: 0.2}}
providers:
{claude("c1", fake.base_url)}models:
  "*": {{targets: [{{provider: c1}}]}}
"""

    def rows(rid: str) -> list[tuple[Any, ...]]:
        with sqlite3.connect(db) as conn:
            return conn.execute(
                "SELECT outcome, stream, duration_ms, ttft_ms, output_tokens FROM requests "
                "WHERE request_id = ? OR upstream_request_id = ?",
                (rid, rid),
            ).fetchall()

    with run_gateway(yaml) as gw:
        running, thread = in_background(gw.url, "fake-slow-d20")
        rid = running.headers["request-id"]
        time.sleep(0.6)  # three flush intervals into the stream
        assert rows(rid) == []  # nothing of it is written while it runs
        thread.join(10)
        assert running.complete
        assert eventually(lambda: bool(rows(rid)), within=3)
        time.sleep(0.5)  # more flushes: still one row
        ((outcome, streamed, duration_ms, ttft_ms, output_tokens),) = rows(rid)
        assert (outcome, bool(streamed), output_tokens) == ("completed", True, 61)
        assert 900 <= duration_ms <= running.seconds * 1000 + 50, (duration_ms, running.seconds)
        assert ttft_ms is not None and ttft_ms < 500


# --- identity: a JWT, the JWKS cache, a key issued with an expiry --------------------------------------------------


@pytest.fixture
def issuer() -> Iterator[LocalIssuer]:
    local = LocalIssuer()
    local.add_key("k2")
    yield local
    local.close()


def test_a_jwt_that_expires_mid_stream_ends_nothing_and_the_next_request_is_401(
    fake: FakeClaudeAPI, issuer: LocalIssuer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token with 2 s to live, a 3 s stream: the token is checked when the request arrives, so the stream
    completes; the next request with it is 401 (leeway_s 0). The JWKS cache (jwks_cache_s 1) expires mid-stream
    too: a new token after it verifies (the set is fetched again), and a signing key the issuer stopped publishing
    is refused once the cache has expired."""
    import gateway.governance.jwt_auth

    monkeypatch.setattr(
        gateway.governance.jwt_auth, "REFETCH_S", 0.0
    )  # the cache's own life, not the refetch floor (10 s)
    yaml = f"""
auth:
  jwt: {{issuer: "{issuer.url}", audience: {AUDIENCE}, user_claim: email, leeway_s: 0, jwks_cache_s: 1}}
store: {{url: "sqlite:///{tmp_path}/jwt.db"}}
providers:
{claude("c1", fake.base_url)}models:
  "*": {{targets: [{{provider: c1}}]}}
"""

    def bearer(token: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"}

    with run_gateway(yaml) as gw:
        expires = int(time.time()) + 2
        token = issuer.token(exp=expires, jti="mid-stream")
        running = stream(gw.url, "fake-slow-d10-i300", bearer(token))
        assert running.complete, running.body[-300:]
        assert time.time() >= expires  # it outlived its token, and the JWKS cache its life
        hits = issuer.hits
        late = post(gw.url, "fake-text", bearer(token))
        assert late.status_code == 401 and "expired" in late.json()["error"]["message"]
        assert late.headers["x-should-retry"] == "false"
        assert post(gw.url, "fake-text", bearer(issuer.token(jti="after"))).status_code == 200
        assert issuer.hits == hits + 1  # the expired cache was fetched again, once, and that broke nothing
        issuer.published.remove("k1")  # the issuer retires a signing key
        time.sleep(1.1)  # the cache's life
        retired = post(gw.url, "fake-text", bearer(issuer.token("k1", jti="retired")))
        assert retired.status_code == 401 and "does not publish" in retired.json()["error"]["message"]
        assert post(gw.url, "fake-text", bearer(issuer.token("k2", jti="kept"))).status_code == 200


def test_an_issued_key_that_expires_mid_stream_ends_nothing_and_the_next_request_is_refused(
    fake: FakeClaudeAPI, tmp_path: Path
) -> None:
    """A key issued at run time with 2 s to live, a 3 s stream (longer than the keys' 1 s poll too): the stream
    completes; the next request with the key is 401, and the key is listed as expired."""
    yaml = f"""
auth: {{keys: [{{name: ci, key: sk-ci}}]}}
admin: {{keys: [sk-admin]}}
store: {{url: "sqlite:///{tmp_path}/keys.db", flush_interval_s: 0.05}}
providers:
{claude("c1", fake.base_url)}models:
  "*": {{targets: [{{provider: c1}}]}}
"""
    admin = {"x-api-key": "sk-admin"}
    with run_gateway(yaml) as gw:
        expires = datetime.now(UTC) + timedelta(seconds=2)
        made = httpx.post(
            f"{gw.url}/v1/gateway/keys",
            json={"name": "short-lived", "expires_at": expires.isoformat().replace("+00:00", "Z")},
            headers=admin,
        )
        assert made.status_code == 201, made.text
        key = {"x-api-key": made.json()["key"]}
        running = stream(gw.url, "fake-slow-d10-i300", key)
        assert running.complete, running.body[-300:]
        assert datetime.now(UTC) >= expires  # it outlived its key
        late = post(gw.url, "fake-text", key)
        assert late.status_code == 401 and "has expired" in late.json()["error"]["message"]
        listed = httpx.get(f"{gw.url}/v1/gateway/keys", headers=admin).json()["data"]
        assert [(k["name"], k["status"]) for k in listed] == [("short-lived", "expired")]


# --- the breaker: cooldown and probe ----------------------------------------------------------------------------


def test_a_stream_running_when_its_target_opens_completes_and_the_probe_after_the_cooldown_closes_it(
    fake: FakeClaudeAPI,
) -> None:
    """A 3 s stream on c1; meanwhile two requests to c1 fail (500) and its breaker opens (threshold 2, cooldown
    1 s): the open breaker sends new requests to c2 (what it guards) but does not touch the stream already
    running, which completes. After the cooldown a request is let through to c1 as the probe, and closes it."""
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 2, window_s: 10, cooldown_s: 1}}}}
providers:
{claude("c1", fake.base_url)}{claude("c2", fake.base_url)}models:
  "fake-*": {{targets: [{{provider: c1}}, {{provider: c2}}]}}
"""

    def states(gw: RunningGateway) -> dict[str, dict[str, Any]]:
        (alias,) = httpx.get(f"{gw.url}/v1/gateway/status").json()["aliases"]
        return {t["provider"]: t for t in alias["targets"]}

    with run_gateway(yaml) as gw:
        running, thread = in_background(gw.url, "fake-slow-d10-i300")
        assert running.headers["x-gateway-provider"] == "c1"
        for _ in range(2):
            assert post(gw.url, "fake-status-500").status_code == 500
        c1 = states(gw)["c1"]
        assert c1["state"] == "open" and c1["inflight"] == 1  # open, with the stream still on it
        elsewhere = post(gw.url, "fake-text")
        assert elsewhere.status_code == 200 and elsewhere.headers["x-gateway-provider"] == "c2"
        thread.join(10)
        assert running.complete, running.body[-300:]
        assert running.seconds >= 2.5
        assert eventually(lambda: states(gw)["c1"]["state"] == "half_open", within=3)
        assert states(gw)["c1"]["inflight"] == 0
        probe = post(gw.url, "fake-text")
        assert probe.status_code == 200 and probe.headers["x-gateway-provider"] == "c1"
        assert states(gw)["c1"]["state"] == "closed"


# --- the upstream connection: the pool at the provider's idle close, the read to the end after message_stop ------


class RawUpstream:
    """An HTTP/1.1 provider on a raw socket: ``serve(conn, number)`` is called for each request of a connection
    (``number`` from 1) and returns False to stop serving the connection. Counts connections and answers."""

    def __init__(self, serve: Callable[[socket.socket, int], bool]) -> None:
        self.connections = 0
        self.answered = 0
        self.closed_at: list[float] = []
        lock = threading.Lock()
        upstream = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                with lock:
                    upstream.connections += 1
                number = 1
                while serve(conn, number):
                    number += 1

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def read_request(conn: socket.socket) -> bytes | None:
    """One request (head and body); None when the client closed the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head


SSE = sse_body("fake-text")
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nrequest-id: req_raw\r\n"


def raw_config(url: str) -> str:
    return f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}}}
providers:
{claude("raw", url)}models:
  "*": {{targets: [{{provider: raw, model: fake-text}}]}}
"""


@pytest.mark.parametrize("close", ["fin", "reset"])
def test_a_request_sent_as_the_provider_closes_its_idle_connection_is_served(close: str) -> None:
    """The pool has no idle expiry of its own: a kept-alive connection lives until the provider closes it (its
    keep-alive timeout). The worst moment is the boundary itself: the request is written on the pooled
    connection just as the provider closes it (after reading it: a FIN; before: a reset). Nothing was answered,
    so the request goes again on a new connection, and the client never knows."""

    def serve(conn: socket.socket, number: int) -> bool:
        if number == 1:
            if read_request(conn) is None:
                return False
            conn.sendall(SSE_HEAD + b"content-length: %d\r\n\r\n" % len(SSE) + SSE)
            upstream.answered += 1
            return True
        if close == "fin":
            read_request(conn)
            conn.shutdown(socket.SHUT_RDWR)
        else:
            select.select([conn], [], [], 10)  # the request has arrived, unread
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
        return False

    upstream = RawUpstream(serve)
    try:
        with run_gateway(raw_config(upstream.url)) as gw:
            for _ in range(2):
                got = stream(gw.url, "fake-text")
                assert got.complete, got.body[-300:]
        assert (upstream.connections, upstream.answered) == (2, 2)  # the second on a new connection
    finally:
        upstream.close()


def test_a_provider_body_that_lingers_after_message_stop_is_let_go_without_delaying_the_client() -> None:
    """After message_stop the provider's body is read to its end in the background, for at most DRAIN_SECONDS
    (2 s), so the connection can go back to the pool. A provider that never ends its body: the client's stream
    ends at message_stop at once (the timer does not hold it), and the connection is closed after 2 s (what the
    timer guards), never pooled: the next request goes on a new connection."""

    def serve(conn: socket.socket, number: int) -> bool:
        if read_request(conn) is None:
            return False
        conn.sendall(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(SSE), SSE))
        upstream.answered += 1
        sent = time.monotonic()
        conn.settimeout(10)
        try:
            while conn.recv(65536):  # the terminating chunk is never sent: wait for the gateway to let go
                pass
        except OSError:
            pass
        upstream.closed_at.append(time.monotonic() - sent)
        return False

    upstream = RawUpstream(serve)
    try:
        with run_gateway(raw_config(upstream.url)) as gw:
            got = stream(gw.url, "fake-text")
            assert got.complete, got.body[-300:]
            assert got.seconds < 1.0  # not held for the provider's unfinished body
            assert eventually(lambda: bool(upstream.closed_at), within=5)
            assert 1.8 <= upstream.closed_at[0] < 3.5, upstream.closed_at
            assert stream(gw.url, "fake-text").complete
        assert upstream.connections == 2
    finally:
        upstream.close()


# --- provider credentials: Entra ID tokens, AWS credentials ---------------------------------------------------


def test_a_stream_that_outlives_its_entra_token_completes_and_the_next_request_gets_a_new_one() -> None:
    """Entra tokens of 2 s (the fake authority's expires_in, and the fake resource's own lifetime): a 3 s stream
    with one completes (a token is checked when the request arrives); the next request is sent with a new token
    (renewed ahead of its expiry: nothing ever reaches the resource with an expired one)."""
    from tests.fakes.foundry import FakeFoundry

    with FakeFoundry(token_lifetime_s=2) as fake:
        entra = (
            f'{{tenant_id: "{fake.tenant_id}", client_id: "{fake.client_id}", client_secret: "{fake.client_secret}", '
            f'authority: "{fake.authority_url}", ca_file: "{fake.ca_file}"}}'
        )
        yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}}}
providers:
  foundry: {{kind: foundry, base_url: "{fake.base_url}", entra: {entra}}}
models:
  slow: {{targets: [{{provider: foundry, model: fake-slow-d10-i300}}]}}
  quick: {{targets: [{{provider: foundry, model: fake-text}}]}}
"""
        with run_gateway(yaml) as gw:
            running = stream(gw.url, "slow")
            assert running.complete, running.body[-300:]
            assert running.seconds >= 2.5
            assert post(gw.url, "quick").status_code == 200
        requests = fake.requests
        assert [r.auth_error for r in requests] == [None, None]
        first, second = (r.headers["authorization"] for r in requests)
        assert first != second
        assert len([t for t in fake.token_requests if t.kind == "token"]) == 2


def test_a_bedrock_stream_that_outlives_its_aws_credentials_completes_and_the_next_request_refreshes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials from a ``credential_process`` that live 2 s: a 3 s Bedrock stream signed with them completes
    (a request is signed once, when it is sent); the next request is signed with credentials fetched again (the
    gateway waits for fresh ones when fewer than 60 s are left)."""
    from tests.fakes.bedrock import FakeBedrock

    runs = tmp_path / "runs"
    script = tmp_path / "credentials.py"
    script.write_text(
        "import datetime, json\n"
        f"open({str(runs)!r}, 'a').write('run\\n')\n"
        "expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': 'AKIDFAKEBEDROCK', 'SecretAccessKey': 'fake-secret',\n"
        "                  'SessionToken': 'session-token', 'Expiration': expires.strftime('%Y-%m-%dT%H:%M:%SZ')}))\n"
    )
    config = tmp_path / "aws-config"
    config.write_text(f"[profile timers]\ncredential_process = {sys.executable} {script}\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)

    def count() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    with FakeBedrock(session_token="session-token") as fake:
        yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}}}
providers:
  b: {{kind: bedrock, region: us-east-1, base_url: "{fake.base_url}", profile: timers}}
models:
  slow: {{targets: [{{provider: b, model: "anthropic.fake-slow-d10-i300-v1:0"}}]}}
  quick: {{targets: [{{provider: b, model: "anthropic.fake-text-v1:0"}}]}}
"""
        with run_gateway(yaml) as gw:
            running = stream(gw.url, "slow")
            assert running.complete, running.body[-300:]
            assert running.seconds >= 2.5
            fetched = count()
            assert fetched >= 1
            assert post(gw.url, "quick").status_code == 200
            assert count() > fetched  # expired during the stream: fetched again for the next request
        assert [r.auth_error for r in fake.requests] == [None, None]
