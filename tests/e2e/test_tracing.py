"""Optional OpenTelemetry spans: off by default; with ``server.tracing: true`` one span per request carrying
the route, outcome and token counts (and no prompt text, no keys)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import run_gateway
from tests.fakes.claude_api import FakeClaudeAPI, final_message

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "a secret prompt"}]}
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def ours(exporter: InMemorySpanExporter) -> list[Any]:
    """The gateway's spans (the anthropic SDK, the client here, emits its own)."""
    return [s for s in exporter.get_finished_spans() if s.instrumentation_scope.name == "messages-gateway"]


def config(fake: FakeClaudeAPI, tracing: bool) -> str:
    return f"""
auth: {{open: true}}
server: {{tracing: {str(tracing).lower()}}}
providers: {{c1: {{kind: anthropic, api_key: planted-key-123, base_url: "{fake.base_url}"}}}}
models: {{"*": {{targets: [{{provider: c1}}]}}}}
"""


def test_off_by_default(fake: FakeClaudeAPI, spans: InMemorySpanExporter) -> None:
    with run_gateway(config(fake, tracing=False)) as gw:
        anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0).messages.create(model="fake-text", **KW)
    assert ours(spans) == []


def test_one_span_per_request(fake: FakeClaudeAPI, spans: InMemorySpanExporter) -> None:
    with run_gateway(config(fake, tracing=True)) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
        with client.messages.stream(model="fake-text", **KW) as stream:
            stream.get_final_message()
        with pytest.raises(anthropic.InternalServerError):
            client.messages.create(model="fake-status-500", **KW)
    finished = {span.attributes["gateway.model"]: span for span in ours(spans)}
    ok = finished["fake-text"]
    usage = final_message("fake-text")["usage"]
    assert ok.name == "messages *"
    assert ok.attributes["gateway.outcome"] == "completed" and ok.attributes["http.response.status_code"] == 200
    assert ok.attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    assert ok.attributes["gateway.usage.cache_read_input_tokens"] == usage["cache_read_input_tokens"]
    assert ok.end_time is not None and ok.start_time is not None and ok.end_time >= ok.start_time
    failed = finished["fake-status-500"]
    assert failed.attributes["gateway.outcome"] == "upstream_error"
    assert failed.attributes["http.response.status_code"] == 500
    everything = repr([dict(s.attributes or {}) for s in ours(spans)])
    assert "a secret prompt" not in everything and "planted-key-123" not in everything
