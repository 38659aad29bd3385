"""Exact token counters in ``/metrics`` for every way a request ends: usage from ``message_start`` plus the
cumulative ``message_delta`` (overwritten, never added), for streams and JSON, complete or not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI, final_message, get_scenario

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}
TYPES = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_input_tokens",
    "cache_creation": "cache_creation_input_tokens",
}


@pytest.fixture
def gw(fake: FakeClaudeAPI) -> Iterator[RunningGateway]:
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}}}
providers: {{c1: {{kind: anthropic, api_key: p, base_url: "{fake.base_url}"}}}}
models: {{"*": {{targets: [{{provider: c1}}]}}}}
"""
    with run_gateway(yaml) as running:
        yield running


def tokens(gw: RunningGateway, model: str) -> dict[str, float]:
    # the model a glob route forwards is no label ("" here; each test has its own gateway): `model` names the scenario
    return {name: gw.sample("gateway_tokens_total", alias="*", provider="c1", model="", type=name) for name in TYPES}


def expect(usage: dict[str, Any], times: int = 1) -> dict[str, float]:
    return {name: float((usage.get(field) or 0) * times) for name, field in TYPES.items()}


def wait_for(gw: RunningGateway, model: str, outcome: str, count: float = 1) -> None:
    deadline = time.monotonic() + 5
    while gw.sample("gateway_requests_total", alias="*", provider="c1", model="", outcome=outcome) < count:
        assert time.monotonic() < deadline, f"{outcome} not recorded for {model}"
        time.sleep(0.02)


def test_streams_with_cache_tokens_count_exactly_and_output_is_not_added_up(gw: RunningGateway) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
    for _ in range(3):
        with client.messages.stream(model="fake-text", **KW) as stream:
            stream.get_final_message()
    usage = final_message("fake-text")["usage"]
    assert usage["cache_read_input_tokens"] > 0  # the scenario has cache tokens
    # message_start says output_tokens 1, message_delta the cumulative total: the total, not total + 1
    assert tokens(gw, "fake-text") == expect(usage, 3)
    assert gw.sample("gateway_requests_total", alias="*", provider="c1", model="", outcome="completed") == 3


def test_server_tools_usage_overwritten_by_message_delta(gw: RunningGateway) -> None:
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0).messages.stream(
        model="fake-server-tools", **KW
    ) as stream:
        stream.get_final_message()
    events = get_scenario("fake-server-tools").events
    start = events[0]["message"]["usage"]
    final = final_message("fake-server-tools")["usage"]
    assert start["input_tokens"] != final["input_tokens"]  # message_delta overwrites the input count too
    assert tokens(gw, "fake-server-tools") == expect(final)


def test_json_response(gw: RunningGateway) -> None:
    anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0).messages.create(model="fake-tools", **KW)
    assert tokens(gw, "fake-tools") == expect(final_message("fake-tools")["usage"])


def test_stream_that_fails_mid_way_counts_what_arrived(gw: RunningGateway) -> None:
    httpx.post(f"{gw.url}/v1/messages", json={"model": "fake-error-midstream", "stream": True, **KW})
    wait_for(gw, "fake-error-midstream", "upstream_error")
    start = get_scenario("fake-error-midstream").events[0]["message"]["usage"]
    assert tokens(gw, "fake-error-midstream") == expect(start)  # message_start's counts, no message_delta


def test_cancelled_stream_counts_what_arrived(fake: FakeClaudeAPI, gw: RunningGateway) -> None:
    with (
        httpx.Client() as client,
        client.stream("POST", f"{gw.url}/v1/messages", json={"model": "fake-slow", "stream": True, **KW}) as resp,
    ):
        for line in resp.iter_lines():
            if line.startswith("event: content_block_delta"):
                break
    wait_for(gw, "fake-slow", "client_cancelled")
    start = get_scenario("fake-slow").events[0]["message"]["usage"]
    assert tokens(gw, "fake-slow") == expect(start)
    assert gw.sample("gateway_inflight_requests") == 0
