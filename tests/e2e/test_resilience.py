"""Routing and resilience end to end with the real ``anthropic`` SDK: fallback, retries that honour the
provider's hints (on a fake clock), the circuit breaker, strategies, timeouts, pings and cancellation."""

from __future__ import annotations

import http.client
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from gateway.routing.pipeline import Resilience
from gateway.settings import parse_settings
from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

KW: dict[str, Any] = {"max_tokens": 256, "messages": [{"role": "user", "content": "Hello"}]}


def client(gw: RunningGateway, retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=retries)


def claude(name: str, url: str, **extra: Any) -> str:
    more = "".join(f", {k}: {v}" for k, v in extra.items())
    return f'  {name}: {{kind: anthropic, api_key: p, base_url: "{url}"{more}}}\n'


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# --- fallback before the first byte, never after ---------------------------------------------------------


@pytest.fixture
def two_targets(fake: FakeClaudeAPI) -> Iterator[RunningGateway]:
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 3, base_delay_s: 0}}, breaker: {{failure_threshold: 1000}}}}
providers:
{claude("c1", fake.base_url)}{claude("c2", fake.base_url)}{claude("dead", "http://127.0.0.1:9", connect_timeout_s=1)}
models:
  overloaded-then-ok: {{targets: [{{provider: c1, model: fake-status-529}}, {{provider: c2, model: fake-text}}]}}
  dead-then-ok: {{targets: [{{provider: dead, model: fake-text}}, {{provider: c2, model: fake-tools}}]}}
  fails-mid-stream: {{targets: [{{provider: c1, model: fake-error-midstream}}, {{provider: c2, model: fake-text}}]}}
  bad-request: {{targets: [{{provider: c1, model: fake-status-400}}, {{provider: c2, model: fake-text}}]}}
"""
    with run_gateway(yaml) as gw:
        yield gw


@pytest.mark.parametrize("stream", [True, False])
def test_fallback_on_529(stream: bool, fake: FakeClaudeAPI, two_targets: RunningGateway) -> None:
    if stream:
        with client(two_targets).messages.stream(model="overloaded-then-ok", **KW) as s:
            message = s.get_final_message()
    else:
        message = client(two_targets).messages.create(model="overloaded-then-ok", **KW)
    assert message.content[0].type == "text"
    assert [r.json["model"] for r in fake.requests] == ["fake-status-529", "fake-text"]
    labels = {"alias": "overloaded-then-ok", "from": "c1", "to": "c2", "reason": "overloaded_error"}
    assert two_targets.sample("gateway_fallbacks_total", **labels) >= 1


def test_fallback_on_connect_error(fake: FakeClaudeAPI, two_targets: RunningGateway) -> None:
    message = client(two_targets).messages.create(model="dead-then-ok", **KW)
    assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
    assert two_targets.sample("gateway_upstream_errors_total", provider="dead", error_type="api_error") >= 1


def test_no_retry_once_an_event_was_sent(fake: FakeClaudeAPI, two_targets: RunningGateway) -> None:
    resp = httpx.post(f"{two_targets.url}/v1/messages", json={"model": "fails-mid-stream", "stream": True, **KW})
    names = [line[7:] for line in resp.text.split("\n") if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "error" and "message_stop" not in names
    assert len(fake.requests) == 1  # the second target was never asked


def test_no_retry_and_no_fallback_on_400(fake: FakeClaudeAPI, two_targets: RunningGateway) -> None:
    with pytest.raises(anthropic.BadRequestError):
        client(two_targets).messages.create(model="bad-request", **KW)
    assert len(fake.requests) == 1


# --- retries on a fake clock ----------------------------------------------------------------------------


def test_retry_after_is_honoured_and_the_client_told_not_to_retry(fake: FakeClaudeAPI, clock: FakeClock) -> None:
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 3}}, breaker: {{failure_threshold: 1000}}}}
providers:
{claude("c1", fake.base_url)}models: {{limited: {{targets: [{{provider: c1, model: fake-status-429}}]}}}}
"""
    settings = parse_settings(yaml, environ={})
    res = Resilience(settings.resilience, clock=clock, sleep=clock.sleep)
    with run_gateway(settings, resilience=res) as gw, pytest.raises(anthropic.RateLimitError) as info:
        client(gw, retries=2).messages.create(model="limited", **KW)
    assert clock.sleeps == [7.0, 7.0]  # the fake's retry-after: 7, twice; no real sleep happened
    assert len(fake.requests) == 3
    assert info.value.response.headers["x-should-retry"] == "false"  # so the SDK did not retry on top


def test_backoff_without_a_hint(fake: FakeClaudeAPI, clock: FakeClock) -> None:
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 3, base_delay_s: 0.5, max_delay_s: 8}}, breaker: {{failure_threshold: 1000}}}}
providers:
{claude("c1", fake.base_url)}models: {{broken: {{targets: [{{provider: c1, model: fake-status-500}}]}}}}
"""
    settings = parse_settings(yaml, environ={})
    res = Resilience(settings.resilience, clock=clock, sleep=clock.sleep)
    with run_gateway(settings, resilience=res) as gw, pytest.raises(anthropic.InternalServerError):
        client(gw).messages.create(model="broken", **KW)
    assert len(clock.sleeps) == 2
    assert 0.375 <= clock.sleeps[0] <= 0.5 and 0.75 <= clock.sleeps[1] <= 1.0  # exponential with jitter


def breaker_gateway(fake: FakeClaudeAPI, clock: FakeClock, targets: str, **breaker: Any) -> Any:
    opts = {"failure_threshold": 2, "window_s": 60, "cooldown_s": 30, **breaker}
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}, breaker: {json.dumps(opts)}}}
providers:
{claude("c1", fake.base_url)}{claude("c2", fake.base_url)}models: {{"fake-*": {{targets: {targets}}}}}
"""
    settings = parse_settings(yaml, environ={})
    return run_gateway(settings, resilience=Resilience(settings.resilience, clock=clock, sleep=clock.sleep))


def target_states(http: httpx.Client) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = http.get("/v1/gateway/status").json()["aliases"][0]["targets"]
    return result


def test_a_single_target_alias_is_never_answered_in_the_providers_place(fake: FakeClaudeAPI, clock: FakeClock) -> None:
    """Before: once the breaker opened, every request for 30 s got a synthetic `529 ... cooling down`
    without reaching the provider, even ones it would have served. Now the breaker's state runs its course,
    but every request still goes to the provider (the panic rule), and the client gets its real answer."""
    with breaker_gateway(fake, clock, "[{provider: c1}]") as gw:
        http = httpx.Client(base_url=gw.url)
        for _ in range(2):
            assert http.post("/v1/messages", json={"model": "fake-status-500", **KW}).status_code == 500
        assert target_states(http)[0]["state"] == "open"
        assert 'gateway_target_state{alias="fake-*",model="",provider="c1"} 2.0' in http.get("/metrics").text
        served = http.post("/v1/messages", json={"model": "fake-text", **KW})
        assert served.status_code == 200 and served.json()["content"][0]["type"] == "text"
        limited = http.post("/v1/messages", json={"model": "fake-status-429", **KW})
        assert limited.status_code == 429 and limited.headers["retry-after"] == "7"  # the provider's own
        assert limited.json()["error"]["type"] == "rate_limit_error"
        assert limited.headers["request-id"].startswith("req_fake_")  # its request id too
        assert "cooling down" not in limited.text
        assert len(fake.requests) == 4  # every request reached the provider
        assert gw.sample("gateway_breaker_panics_total", alias="fake-*") == 2
        clock.now += 31
        assert target_states(http)[0]["state"] == "half_open"
        assert http.post("/v1/messages", json={"model": "fake-text", **KW}).status_code == 200  # the probe
        assert target_states(http)[0]["state"] == "closed"
        assert 'gateway_target_state{alias="fake-*",model="",provider="c1"} 0.0' in http.get("/metrics").text


def test_an_open_target_is_skipped_while_another_can_serve(fake: FakeClaudeAPI, clock: FakeClock) -> None:
    with breaker_gateway(fake, clock, "[{provider: c1}, {provider: c2}]", failure_threshold=1) as gw:
        http = httpx.Client(base_url=gw.url)
        assert http.post("/v1/messages", json={"model": "fake-status-500", **KW}).status_code == 500
        assert [t["state"] for t in target_states(http)] == ["open", "closed"]
        fake.reset()
        resp = http.post("/v1/messages", json={"model": "fake-text", **KW})
        assert resp.status_code == 200 and resp.headers["x-gateway-provider"] == "c2"
        assert len(fake.requests) == 1 and gw.sample("gateway_breaker_panics_total", alias="fake-*") == 0


def test_when_every_target_is_open_the_one_free_soonest_answers(fake: FakeClaudeAPI, clock: FakeClock) -> None:
    with breaker_gateway(fake, clock, "[{provider: c1}, {provider: c2}]", failure_threshold=1) as gw:
        http = httpx.Client(base_url=gw.url)
        assert http.post("/v1/messages", json={"model": "fake-status-500", **KW}).status_code == 500  # c1 opens
        clock.now += 10
        assert http.post("/v1/messages", json={"model": "fake-status-500", **KW}).status_code == 500  # c2 opens
        assert [t["state"] for t in target_states(http)] == ["open", "open"]
        resp = http.post("/v1/messages", json={"model": "fake-text", **KW})
        assert resp.status_code == 200 and resp.headers["x-gateway-provider"] == "c1"  # free 10 s before c2


def test_a_429_throttles_its_target_for_its_retry_after_and_is_no_failure(
    fake: FakeClaudeAPI, clock: FakeClock
) -> None:
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 2, base_delay_s: 0}}, breaker: {{failure_threshold: 1}}}}
providers:
{claude("c1", fake.base_url)}{claude("c2", fake.base_url)}models:
  limited-then-ok: {{targets: [{{provider: c1, model: fake-status-429}}, {{provider: c2, model: fake-text}}]}}
"""
    settings = parse_settings(yaml, environ={})
    res = Resilience(settings.resilience, clock=clock, sleep=clock.sleep)
    with run_gateway(settings, resilience=res) as gw:
        http = httpx.Client(base_url=gw.url)
        first = http.post("/v1/messages", json={"model": "limited-then-ok", **KW})
        assert first.status_code == 200 and first.headers["x-gateway-provider"] == "c2"
        c1 = target_states(http)[0]
        assert c1["state"] == "closed" and c1["failures"] == 0  # a 429 is not a health failure
        assert c1["throttled_remaining_s"] == 7
        fake.reset()
        second = http.post("/v1/messages", json={"model": "limited-then-ok", **KW})
        assert second.headers["x-gateway-provider"] == "c2" and len(fake.requests) == 1  # c1 skipped
        clock.now += 7
        fake.reset()
        http.post("/v1/messages", json={"model": "limited-then-ok", **KW})
        assert [r.json["model"] for r in fake.requests] == ["fake-status-429", "fake-text"]  # c1 asked again


def test_a_probe_ended_by_a_400_does_not_block_the_recovered_target(fake: FakeClaudeAPI, clock: FakeClock) -> None:
    """Reproduced before: trip, probe at t=31 gets a 400, requests at t=32 and t=90 both refused."""
    with breaker_gateway(fake, clock, "[{provider: c1}]") as gw:
        http = httpx.Client(base_url=gw.url)
        for _ in range(2):
            http.post("/v1/messages", json={"model": "fake-status-500", **KW})
        clock.now += 31
        assert http.post("/v1/messages", json={"model": "fake-status-400", **KW}).status_code == 400  # the probe
        assert target_states(http)[0]["state"] == "half_open"
        clock.now += 1
        assert http.post("/v1/messages", json={"model": "fake-text", **KW}).status_code == 200
        assert target_states(http)[0]["state"] == "closed"  # that request was the probe, and it closed


def test_a_408_is_retried_on_the_same_target(fake: FakeClaudeAPI, clock: FakeClock) -> None:
    """One table decides retries and failures: a 408 used to fall over and count against the breaker, but was
    never retried on the same target."""
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 3, base_delay_s: 0.5}}, breaker: {{failure_threshold: 1000}}}}
providers:
{claude("c1", fake.base_url)}models: {{slow: {{targets: [{{provider: c1, model: fake-status-408}}]}}}}
"""
    settings = parse_settings(yaml, environ={})
    res = Resilience(settings.resilience, clock=clock, sleep=clock.sleep)
    with run_gateway(settings, resilience=res) as gw:
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "slow", **KW})
    assert resp.status_code == 408 and len(fake.requests) == 3 and len(clock.sleeps) == 2


def test_total_timeout_bounds_the_retries_of_a_json_request(fake: FakeClaudeAPI, clock: FakeClock) -> None:
    """``timeouts.total_s`` is the whole request's: a retry whose wait would end past it is not made."""
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 5, base_delay_s: 0.5, max_delay_s: 8}}, timeouts: {{total_s: 1.2}},
  breaker: {{failure_threshold: 1000}}}}
providers:
{claude("c1", fake.base_url)}models: {{broken: {{targets: [{{provider: c1, model: fake-status-500}}]}}}}
"""
    settings = parse_settings(yaml, environ={})
    res = Resilience(settings.resilience, clock=clock, sleep=clock.sleep, rng=random.Random(0))
    with run_gateway(settings, resilience=res) as gw:
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "broken", **KW})
    assert resp.status_code == 500
    assert len(clock.sleeps) == 1 and len(fake.requests) == 2  # the second wait (~1 s) would pass 1.2 s


def test_total_timeout_bounds_the_wait_for_a_streams_first_event() -> None:
    yaml = """
auth: {open: true}
resilience: {retry: {max_attempts: 3}, timeouts: {first_event_s: 120, total_s: 0.3}}
providers: {silent: {kind: mock, first_event_delay_ms: 3000}}
models: {silent: {targets: [{provider: silent}]}}
"""
    with run_gateway(yaml) as gw:
        started = time.monotonic()
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "silent", "stream": True, **KW})
        assert time.monotonic() - started < 2
        assert resp.status_code == 504 and "total timeout of 0.3 s" in resp.json()["error"]["message"]


# --- strategies over 1,000 requests -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mocks() -> Iterator[RunningGateway]:
    yaml = """
auth: {open: true}
resilience: {breaker: {failure_threshold: 1000}}
providers:
  m1: {kind: mock, deltas: 1}
  m2: {kind: mock, deltas: 1}
  m3: {kind: mock, deltas: 1}
  slow: {kind: mock, deltas: 1, first_event_delay_ms: 15}
models:
  weighted: {strategy: weighted, targets: [{provider: m1, weight: 3}, {provider: m2, weight: 1}]}
  rr: {strategy: round_robin, targets: [{provider: m1}, {provider: m2}, {provider: m3}]}
  fastest: {strategy: least_latency, targets: [{provider: slow}, {provider: m1}]}
  ordered: {targets: [{provider: m2}, {provider: m1}]}
"""
    with run_gateway(yaml) as gw:
        yield gw


def distribution(gw: RunningGateway, alias: str, n: int) -> Counter[str]:
    """Which provider served each of ``n`` requests. ``http.client`` sends head and body in one write (httpx
    sends two, and then waits ~40 ms per request on delayed ACKs here, which says nothing about the gateway)."""
    host, port = gw.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    body = json.dumps({"model": alias, **KW}).encode()
    seen: Counter[str] = Counter()
    try:
        for _ in range(n):
            conn.request("POST", "/v1/messages", body=body, headers={"content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
            seen[resp.getheader("x-gateway-provider") or "?"] += 1
    finally:
        conn.close()
    return seen


def test_weighted_distribution(mocks: RunningGateway) -> None:
    got = distribution(mocks, "weighted", 1000)
    assert 680 <= got["m1"] <= 820 and got["m1"] + got["m2"] == 1000


def test_round_robin_distribution(mocks: RunningGateway) -> None:
    got = distribution(mocks, "rr", 999)
    assert got == Counter({"m1": 333, "m2": 333, "m3": 333})


def test_least_latency_prefers_the_fastest_and_explores(mocks: RunningGateway) -> None:
    got = distribution(mocks, "fastest", 1000)
    assert 820 <= got["m1"] <= 960 and got["slow"] >= 30  # ~90 % fastest, ~10 % exploration


def test_fallback_strategy_always_takes_the_first(mocks: RunningGateway) -> None:
    assert distribution(mocks, "ordered", 200) == Counter({"m2": 200})


def test_status_shows_every_alias_and_target(mocks: RunningGateway) -> None:
    aliases = {a["alias"]: a for a in httpx.get(f"{mocks.url}/v1/gateway/status").json()["aliases"]}
    assert aliases["weighted"]["strategy"] == "weighted"
    assert [t["weight"] for t in aliases["weighted"]["targets"]] == [3, 1]
    target = aliases["rr"]["targets"][0]
    assert {"state", "success_rate", "ttft_ewma_s", "inflight", "cooldown_remaining_s"} <= set(target)


# --- timeouts --------------------------------------------------------------------------------------------------


def test_first_event_timeout(fake: FakeClaudeAPI) -> None:
    yaml = """
auth: {open: true}
resilience: {retry: {max_attempts: 1}, timeouts: {first_event_s: 0.2}}
providers: {silent: {kind: mock, first_event_delay_ms: 3000}}
models: {silent: {targets: [{provider: silent}]}}
"""
    with run_gateway(yaml) as gw:
        started = time.monotonic()
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "silent", "stream": True, **KW})
        assert time.monotonic() - started < 2
        assert resp.status_code == 504 and resp.json()["error"]["type"] == "timeout_error"
        assert gw.sample("gateway_requests_total", alias="silent", provider="silent", model="", outcome="timeout")


def test_idle_gap_timeout_ends_the_stream_with_an_error(fake: FakeClaudeAPI) -> None:
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}}}
providers:
{claude("c1", fake.base_url, read_timeout_s=0.02)}models: {{slow: {{targets: [{{provider: c1, model: fake-slow}}]}}}}
"""
    with run_gateway(yaml) as gw:
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "slow", "stream": True, **KW})
        assert resp.status_code == 200
        assert resp.text.rstrip().split("\n")[-1].startswith('data: {"type":"error","error":{"type":"timeout_error"')
        assert gw.sample("gateway_requests_total", alias="slow", provider="c1", model="fake-slow", outcome="timeout")


def test_total_timeout_ends_the_stream_with_an_error(fake: FakeClaudeAPI) -> None:
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}, timeouts: {{total_s: 0.4}}}}
providers:
{claude("c1", fake.base_url)}models: {{slow: {{targets: [{{provider: c1, model: fake-slow}}]}}}}
"""
    with run_gateway(yaml) as gw:
        started = time.monotonic()
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "slow", "stream": True, **KW})
        assert time.monotonic() - started < 3
        last = resp.text.rstrip().split("\n")[-1]
        assert last.startswith('data: {"type":"error","error":{"type":"timeout_error"') and "total timeout" in last
        assert "message_stop" not in resp.text
        assert fake.wait_for_disconnect(timeout=5)  # the upstream request was closed
        assert gw.sample("gateway_requests_total", alias="slow", provider="c1", model="fake-slow", outcome="timeout")


# --- keep-alive pings, cancellation ------------------------------------------------------------------------------


def test_pings_while_the_upstream_is_silent() -> None:
    yaml = """
auth: {open: true}
server: {ping_interval_s: 5}
providers: {paced: {kind: mock, deltas: 2, event_delay_ms: 250}}
models: {paced: {ping_interval_s: 0.05, targets: [{provider: paced}]}}
"""
    with run_gateway(yaml) as gw:
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "paced", "stream": True, **KW}, timeout=20)
        names = [line[7:] for line in resp.text.split("\n") if line.startswith("event: ")]
        assert names.count("ping") >= 10
        assert names[0] == "message_start" and names[-1] == "message_stop"
        assert 'event: ping\ndata: {"type": "ping"}\n\n' in resp.text
        with client(gw).messages.stream(model="paced", **KW) as stream:
            assert stream.get_final_message().stop_reason == "end_turn"


def test_client_leaving_a_non_streamed_request_cancels_it_upstream(
    fake: FakeClaudeAPI, gateway: RunningGateway
) -> None:
    before = gateway.sample(
        "gateway_requests_total", alias="*", provider="claude", model="", outcome="client_cancelled"
    )
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gateway.url}/v1/messages",
            json={"model": "fake-slow", **KW},
            headers={"x-api-key": "gw-key-1"},
            timeout=0.5,
        )
    assert fake.wait_for_disconnect(timeout=5)
    labels = {"alias": "*", "provider": "claude", "model": "", "outcome": "client_cancelled"}  # forwarded: no label
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and gateway.sample("gateway_requests_total", **labels) == before:
        time.sleep(0.05)
    assert gateway.sample("gateway_requests_total", **labels) == before + 1


def test_a_stream_failing_after_it_started_counts_against_its_target(fake: FakeClaudeAPI, clock: FakeClock) -> None:
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 1, window_s: 60, cooldown_s: 30}}}}
providers:
{claude("c1", fake.base_url)}models: {{"fake-*": {{targets: [{{provider: c1}}]}}}}
"""
    settings = parse_settings(yaml, environ={})
    res = Resilience(settings.resilience, clock=clock, sleep=clock.sleep)
    with run_gateway(settings, resilience=res) as gw:
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "fake-error-midstream", "stream": True, **KW})
        assert resp.status_code == 200 and "event: error" in resp.text
        target = httpx.get(f"{gw.url}/v1/gateway/status").json()["aliases"][0]["targets"][0]
        assert target["state"] == "open" and target["cooldown_remaining_s"] == 30  # on the breaker's own clock
        assert target["inflight"] == 0
