"""Limits end to end with the real SDK, in one process: the SDK's RateLimitError carries the gateway's
headers, successful responses carry the API's rate-limit headers, count_tokens is never limited, and a
refusal is in the metrics, not the ledger."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}


def test_a_key_over_its_rate_limit_gets_the_apis_429_and_headers(fake: FakeClaudeAPI, tmp_path: Any) -> None:
    config = f"""
auth: {{keys: [{{name: ci, key: sk-ci, team: pay, limits: {{requests_per_minute: 2}}}}, {{name: free, key: sk-free}}]}}
admin: {{keys: [sk-admin]}}
store: {{url: "sqlite:///{tmp_path}/l.db", flush_interval_s: 0.05}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""
    with run_gateway(config) as gw:
        client = anthropic.Anthropic(api_key="sk-ci", base_url=gw.url, max_retries=0)
        if time.time() % 60 > 55:  # the two requests and the refusal within one minute window
            time.sleep(61 - time.time() % 60)
        ok = client.messages.with_raw_response.create(model="fake-text", **KW)
        assert ok.headers["anthropic-ratelimit-requests-limit"] == "2"
        assert ok.headers["anthropic-ratelimit-requests-remaining"] == "1"
        assert ok.headers["anthropic-ratelimit-requests-reset"].endswith(":00Z")
        with client.messages.stream(model="fake-text", **KW) as s:
            s.get_final_message()
        with pytest.raises(anthropic.RateLimitError) as info:
            client.messages.create(model="fake-text", **KW)
        refused = info.value.response
        assert refused.status_code == 429 and info.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert refused.headers["anthropic-ratelimit-requests-remaining"] == "0"
        requests_before = len(fake.requests)
        for _ in range(4):  # never limited: it is how clients stay under a limit
            assert client.messages.count_tokens(model="fake-text", messages=KW["messages"]).input_tokens > 0
        assert len(fake.requests) == requests_before + 4
        free = anthropic.Anthropic(api_key="sk-free", base_url=gw.url, max_retries=0)
        plain = free.messages.with_raw_response.create(model="fake-text", **KW)  # a key without limits
        direct = httpx.post(
            f"{fake.base_url}/v1/messages", json={"model": "fake-text", **KW}, headers={"x-api-key": "p"}
        )
        name = "anthropic-ratelimit-requests-limit"  # the provider's own pass through untouched
        assert plain.headers[name] == direct.headers[name] != "2"
        assert gw.sample("gateway_limited_total", limit="requests_per_minute", scope="key") == 1
        report = httpx.get(
            f"{gw.url}/v1/organizations/usage_report/messages",
            params={
                "starting_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime()),
                "ending_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86_400)),
                "group_by[]": "api_key_id",
            },
            headers={"x-api-key": "sk-admin"},
            timeout=30,  # a report behind a loaded CI machine: not the 5 s default
        ).json()
        rows = {r["api_key_id"]: r["requests"] for b in report["data"] for r in b["results"]}
        # the refusal is no ledger row (it spent nothing: issue 31), nor are count_tokens (they are not messages)
        assert rows["ci"] == 2


def test_the_sdks_own_retry_waits_the_gateways_retry_after(fake: FakeClaudeAPI) -> None:
    """A key with one request in flight: a second request is refused with ``retry-after: 1``; the SDK waits that
    long, retries, and succeeds once the first has ended."""
    import threading

    config = f"""
auth: {{keys: [{{name: ci, key: sk-ci, limits: {{max_inflight: 1}}}}]}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""
    with run_gateway(config) as gw:
        started = threading.Event()

        def slow() -> None:
            client = anthropic.Anthropic(api_key="sk-ci", base_url=gw.url, max_retries=0)
            with client.messages.stream(model="fake-slow-d10", **KW) as s:  # ten deltas, 50 ms apart
                for event in s:
                    if event.type == "message_start":
                        started.set()

        first = threading.Thread(target=slow)
        first.start()
        assert started.wait(5)
        patient = anthropic.Anthropic(api_key="sk-ci", base_url=gw.url, max_retries=2)
        before = time.monotonic()
        raw = patient.messages.with_raw_response.create(model="fake-text", **KW)
        waited = time.monotonic() - before
        first.join(10)
        assert raw.parse().stop_reason == "end_turn"
        assert waited >= 0.9  # the SDK honoured retry-after: 1 (its own backoff would start at 0.5 s)
        assert gw.sample("gateway_limited_total", limit="max_inflight", scope="key") >= 1


def _stream_in_thread(gw: Any, model: str, seen_start: Any, key: str = "sk-ci") -> Any:
    import threading

    def run() -> None:
        client = anthropic.Anthropic(api_key=key, base_url=gw.url, max_retries=0)
        with client.messages.stream(model=model, **KW) as s:
            for event in s:
                if event.type == "message_start":
                    seen_start.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_streams_input_tokens_count_against_the_limit_while_it_runs(fake: FakeClaudeAPI) -> None:
    """The first stream's 10 input tokens are counted at its ``message_start``: a second request while it still
    runs is over 10 tokens per minute (counted only at the end, it would have been admitted)."""
    import threading

    config = f"""
auth: {{keys: [{{name: ci, key: sk-ci, limits: {{tokens_per_minute: 10}}}}]}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""
    with run_gateway(config) as gw:
        if time.time() % 60 > 55:
            time.sleep(61 - time.time() % 60)
        started = threading.Event()
        first = _stream_in_thread(gw, "fake-slow-d20", started)  # 20 deltas, 50 ms apart
        assert started.wait(5)
        time.sleep(0.1)
        client = anthropic.Anthropic(api_key="sk-ci", base_url=gw.url, max_retries=0)
        with pytest.raises(anthropic.RateLimitError, match="tokens per minute"):
            client.messages.create(model="fake-text", **KW)
        first.join(10)
        assert gw.sample("gateway_limited_total", limit="tokens_per_minute", scope="key") == 1


def test_concurrent_requests_overshoot_a_budget_by_at_most_their_own_usage(fake: FakeClaudeAPI) -> None:
    """$1 per input token, 10 input tokens a request, a $25 budget with $20 spent: of six requests sent at once,
    those admitted before any of them reported its usage all go through; the overshoot is at most their cost."""
    from concurrent.futures import ThreadPoolExecutor

    config = f"""
auth: {{keys: [{{name: ci, key: sk-ci, limits: {{budget: {{usd: 25, per: day}}}}}}]}}
pricing: {{"fake-*": {{input: 1000000}}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""
    with run_gateway(config) as gw:
        client = anthropic.Anthropic(api_key="sk-ci", base_url=gw.url, max_retries=0)
        for _ in range(2):
            client.messages.create(model="fake-slow-d1", **KW)  # $10 each: $20 of $25

        def one(_: int) -> str:
            try:
                client.messages.create(model="fake-slow-d4", **KW)
                return "ok"
            except anthropic.RateLimitError as exc:
                assert exc.body["error"]["type"] == "billing_error"  # type: ignore[index]
                return "refused"

        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(one, range(6)))
        admitted = results.count("ok")
        spent = sum(
            s.value
            for m in gw.metrics.registry.collect()
            if m.name == "gateway_cost_usd"
            for s in m.samples
            if s.name.endswith("_total")
        )
        assert admitted >= 1 and spent == 20 + 10 * admitted
        assert spent - 25 <= 10 * admitted  # the bound: the admitted requests' own usage
        with pytest.raises(anthropic.RateLimitError):  # and then the budget holds
            client.messages.create(model="fake-text", **KW)
        print(f"overshoot: {admitted} of 6 admitted, ${spent - 25:g} over a $25 budget")
