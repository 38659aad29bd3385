"""A budget's period at its edge, end to end with the real SDK: a stream admitted just before its period ends and
finished in the next is charged, once, to the period it was admitted in; the next period starts at 0 and is
exhausted by its own request only; the one after admits again. Periods are shortened to ``PERIOD_S`` seconds by
the test-only ``MESSAGES_GATEWAY_TEST_PERIOD_S`` (``gateway/governance/limits.py``), in memory and in Redis."""

from __future__ import annotations

import math
import time
from typing import Any

import anthropic
import pytest

from gateway.governance.limits import TEST_PERIOD_ENV
from tests.conftest import run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
PERIOD_S = 2.0
SLOW_COST = 61  # fake-slow-d20: 20 deltas 50 ms apart, 1 output token at message_start and 61 at the end, $1 each
TEXT_COST = 19  # fake-text: 19 output tokens


def _period(at: float) -> int:
    return math.floor(at / PERIOD_S)


@pytest.mark.parametrize("counters", ["memory", "redis"])
def test_a_stream_across_a_periods_end_is_charged_to_the_period_that_admitted_it(
    fake: FakeClaudeAPI, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, counters: str
) -> None:
    redis_line = ""
    if counters == "redis":
        redis_server = request.getfixturevalue("redis_server")
        redis_line = f'limits: {{redis_url: "{redis_server.url}"}}\n'
    config = f"""
auth: {{keys: [{{name: ci, key: sk-ci, limits: {{budget: {{usd: 15, per: day}}}}}}]}}
pricing: {{"fake-*": {{output: 1000000}}}}
store: {{enabled: false}}
{redis_line}providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""
    monkeypatch.setenv(TEST_PERIOD_ENV, f"{PERIOD_S:g}")  # read when the gateway makes its limiter
    with run_gateway(config) as gw:
        client = anthropic.Anthropic(api_key="sk-ci", base_url=gw.url, max_retries=0)
        time.sleep((PERIOD_S - 0.4 - time.time() % PERIOD_S) % PERIOD_S)  # 0.4 s before a period's end
        admitted = _period(time.time())
        with client.messages.stream(model="fake-slow-d20", **KW) as s:  # ~1 s: it ends in the next period
            assert s.get_final_message().usage.output_tokens == SLOW_COST
        assert _period(time.time()) == admitted + 1, "the stream was to end in the period after its admission"

        # The next period has none of the $61: its first request is admitted, and exhausts it with its own $19.
        client.messages.create(model="fake-text", **KW)
        with pytest.raises(anthropic.RateLimitError) as info:
            client.messages.create(model="fake-text", **KW)
        error = info.value.body["error"]  # type: ignore[index]
        assert error["type"] == "billing_error"
        assert f"has spent ${TEXT_COST:.2f} of its $15 budget" in error["message"]
        assert info.value.response.headers["x-should-retry"] == "false"
        assert 1 <= int(info.value.response.headers["retry-after"]) <= math.ceil(PERIOD_S)
        assert _period(time.time()) == admitted + 1, "the period ended before its refusal was seen"
        assert gw.sample("gateway_limited_total", limit="budget", scope="key") == 1

        if counters == "redis":  # the shared counters, read directly: each period has its own request's cost, once
            import redis as sync_redis

            direct = sync_redis.Redis.from_url(redis_server.url)
            spent = {
                n: float(direct.get(f"mgw:key:ci|usd|day:test-{PERIOD_S:g}s-{admitted + n}") or 0) for n in range(3)
            }
            assert spent == {0: SLOW_COST, 1: TEXT_COST, 2: 0}

        time.sleep(PERIOD_S - time.time() % PERIOD_S + 0.05)  # the period after: admitted again
        assert _period(time.time()) == admitted + 2
        assert client.messages.create(model="fake-text", **KW).usage.output_tokens == TEXT_COST
        assert gw.sample("gateway_limited_total", limit="budget", scope="key") == 1
