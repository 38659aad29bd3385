"""``gateway_cost_usd_total`` from the pricing table, and ``gateway_added_latency_seconds``."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.conftest import run_gateway
from tests.fakes.claude_api import FakeClaudeAPI, final_message

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}


@pytest.mark.parametrize("stream", [True, False])
def test_cost_follows_the_pricing_table(stream: bool, fake: FakeClaudeAPI) -> None:
    yaml = f"""
auth: {{open: true}}
providers: {{c1: {{kind: anthropic, api_key: p, base_url: "{fake.base_url}"}}}}
models:
  fake-text: {{targets: [{{provider: c1, model: fake-text}}]}}
  unpriced: {{targets: [{{provider: c1, model: unpriced}}]}}
pricing:
  "fake-text": {{input: 3, output: 15, cache_read: 0.3, cache_creation: 3.75}}
  "fake-*": {{input: 1000, output: 1000}}
"""
    with run_gateway(yaml) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
        for _ in range(2):
            if stream:
                with client.messages.stream(model="fake-text", **KW) as s:
                    s.get_final_message()
            else:
                client.messages.create(model="fake-text", **KW)
        client.messages.create(model="unpriced", **KW)
        usage = final_message("fake-text")["usage"]
        one = (
            usage["input_tokens"] * 3
            + usage["output_tokens"] * 15
            + usage["cache_read_input_tokens"] * 0.3
            + usage["cache_creation_input_tokens"] * 3.75
        ) / 1e6
        got = gw.sample("gateway_cost_usd_total", alias="fake-text", provider="c1", model="fake-text")
        assert got == pytest.approx(2 * one)  # the first matching pattern wins, not "fake-*"
        assert gw.sample("gateway_cost_usd_total", alias="unpriced", provider="c1", model="unpriced") == 0
        assert gw.sample("gateway_added_latency_seconds_count", alias="fake-text", provider="c1") == 2
        assert gw.sample("gateway_added_latency_seconds_count", alias="unpriced", provider="c1") == 1
        added = gw.sample("gateway_added_latency_seconds_sum", alias="fake-text", provider="c1") + gw.sample(
            "gateway_added_latency_seconds_sum", alias="unpriced", provider="c1"
        )
        assert 0 <= added < 1
