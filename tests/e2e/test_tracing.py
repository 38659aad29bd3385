"""The gateway's own OpenTelemetry traces and GenAI metrics, received by an OTLP collector (``OtlpCollector``: the
official ``opentelemetry-proto`` messages over gRPC and HTTP/protobuf, checked against the SDK's own exporters in
``tests/unit/test_otlp_collector.py``), with the real ``anthropic`` SDK as the client.

What must hold (issue 35): a SERVER span per request and a CLIENT span per upstream attempt, in the GenAI semantic
conventions, whose token attributes equal the client's usage to the token (Anthropic's arithmetic: input tokens
count the cache reads and writes); the caller's ``traceparent`` continued and the CLIENT span's sent upstream; a
failover's failed attempt a span with its error; a stream that breaks, or a client that leaves, ends the spans with
that outcome; an export that fails is counted and never felt; no prompt text, no key."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.bedrock import FakeBedrock
from tests.fakes.claude_api import FakeClaudeAPI
from tests.fakes.otlp_collector import OtlpCollector, Span

PROMPT = "a secret prompt about tracing"
KW: dict[str, Any] = {
    "max_tokens": 64,
    "stop_sequences": ["\n\nHuman:"],
    "messages": [{"role": "user", "content": PROMPT}],
    # (this SDK's typed signature has none of the sampling parameters any more; the API still takes them)
    "extra_body": {"temperature": 0.25, "top_p": 0.9, "top_k": 7},
}
PROVIDER_KEY = "planted-provider-key-123"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SESSION = "5f0e2c1a-8b7d-4c3e-9a6f-1d2e3f4a5b6c"


@pytest.fixture
def collector() -> Iterator[OtlpCollector]:
    with OtlpCollector() as running:
        yield running


def config(
    collector: OtlpCollector, upstream: str, *, protocol: str = "http/protobuf", models: str = "", extra: str = ""
) -> str:
    endpoint = collector.grpc_endpoint if protocol == "grpc" else collector.http_endpoint
    return f"""
auth: {{open: true}}
telemetry:
  otlp:
    endpoint: "{endpoint}"
    protocol: {protocol}
    headers: {{x-collector-key: c-123}}
    resource_attributes: {{deployment.environment.name: test}}
    schedule_delay_s: 0.2
    metrics_interval_s: 0.3
{extra}
providers:
  c1: {{kind: anthropic, api_key: {PROVIDER_KEY}, base_url: "{upstream}"}}
  c2: {{kind: anthropic, api_key: {PROVIDER_KEY}, base_url: "{upstream}"}}
resilience: {{retry: {{max_attempts: 2}}, breaker: {{failure_threshold: 100000}}}}
models:
{models}
  "*": {{targets: [{{provider: c1}}]}}
"""


def client(gw: RunningGateway, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0, default_headers=headers)


def traced_headers() -> dict[str, str]:
    return {
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
        "tracestate": "vendor=abc",
        "x-claude-code-session-id": SESSION,
    }


def one_trace(collector: OtlpCollector, count: int) -> list[Span]:
    """The spans of the first trace that has ``count`` of them."""
    spans = collector.wait_spans(lambda spans: len(spans) >= count)
    return spans


def by_kind(spans: list[Span], kind: str) -> list[Span]:
    return sorted((s for s in spans if s.kind == kind), key=lambda s: s.start_ns)


def check_usage(span: Span, usage: Any) -> None:
    """The span's token attributes are the client's usage, to the token."""
    read = usage.cache_read_input_tokens or 0
    created = usage.cache_creation_input_tokens or 0
    assert span.attributes["gen_ai.usage.input_tokens"] == usage.input_tokens + read + created
    assert span.attributes["gen_ai.usage.output_tokens"] == usage.output_tokens
    assert span.attributes["gen_ai.usage.cache_read.input_tokens"] == read
    assert span.attributes["gen_ai.usage.cache_creation.input_tokens"] == created


def no_secrets(spans: list[Span]) -> None:
    everything = repr([(s.attributes, s.resource, s.name) for s in spans])
    assert PROMPT not in everything and PROVIDER_KEY not in everything


def test_a_stream_is_a_server_span_over_a_client_span_continuing_the_callers_trace(
    fake: FakeClaudeAPI, collector: OtlpCollector
) -> None:
    with run_gateway(config(collector, fake.base_url)) as gw:
        with client(gw, **traced_headers()).messages.stream(model="fake-text", **KW) as stream:
            message = stream.get_final_message()
        spans = one_trace(collector, 2)
    (server,) = by_kind(spans, "SERVER")
    (upstream,) = by_kind(spans, "CLIENT")
    # the caller's trace, continued; the CLIENT span under the SERVER span; the CLIENT span's context sent upstream
    assert server.trace_id == upstream.trace_id == CLIENT_TRACE
    assert server.parent_span_id == CLIENT_SPAN and upstream.parent_span_id == server.span_id
    assert server.trace_state == "vendor=abc"
    (sent,) = [r for r in fake.requests if r.path == "/v1/messages"]
    assert sent.headers["traceparent"] == f"00-{CLIENT_TRACE}-{upstream.span_id}-01"
    assert server.name == "POST /v1/messages" and upstream.name == "chat fake-text"
    assert server.start_ns <= upstream.start_ns <= upstream.end_ns <= server.end_ns
    for span in (server, upstream):
        a = span.attributes
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "anthropic"
        assert a["gen_ai.request.model"] == "fake-text" and a["gen_ai.request.stream"] is True
        assert a["gen_ai.request.max_tokens"] == 64 and a["gen_ai.request.temperature"] == 0.25
        assert a["gen_ai.request.top_p"] == 0.9 and a["gen_ai.request.top_k"] == 7.0
        assert a["gen_ai.request.stop_sequences"] == ["\n\nHuman:"]
        assert a["gen_ai.response.id"] == message.id and a["gen_ai.response.model"] == message.model
        assert a["gen_ai.response.finish_reasons"] == [message.stop_reason]
        assert a["gen_ai.conversation.id"] == SESSION
        assert a["gen_ai.response.time_to_first_chunk"] > 0
        assert "error.type" not in a and span.status_code == "UNSET"
        check_usage(span, message.usage)
    assert upstream.attributes["server.address"] == "127.0.0.1"
    assert upstream.attributes["server.port"] == int(fake.base_url.rsplit(":", 1)[1])
    assert upstream.attributes["messages_gateway.provider"] == "c1"
    a = server.attributes
    assert a["http.request.method"] == "POST" and a["http.route"] == "/v1/messages"
    assert a["http.response.status_code"] == 200
    assert a["messages_gateway.outcome"] == "completed" and a["messages_gateway.attempts"] == 1
    assert a["messages_gateway.alias"] == "*" and a["messages_gateway.provider"] == "c1"
    assert server.resource["service.name"] == "messages-gateway" and server.resource["service.version"]
    assert server.resource["deployment.environment.name"] == "test"
    assert server.scope == "messages-gateway" and server.protocol == "http"
    assert server.headers["x-collector-key"] == "c-123"
    assert server.headers["content-encoding"] == "gzip"  # the default, as the Collector's own exporters send
    no_secrets(spans)


def test_an_uncompressed_export_when_asked(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    with run_gateway(config(collector, fake.base_url, extra="    compression: none")) as gw:
        client(gw).messages.create(model="fake-tools", **KW)
        spans = one_trace(collector, 2)
    assert {span.protocol for span in spans} == {"http"}
    assert all("content-encoding" not in span.headers for span in spans)


def test_a_json_answer_over_grpc(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    with run_gateway(config(collector, fake.base_url, protocol="grpc")) as gw:
        message = client(gw).messages.create(model="fake-tools", **KW)
        spans = one_trace(collector, 2)
    (server,) = by_kind(spans, "SERVER")
    (upstream,) = by_kind(spans, "CLIENT")
    assert server.protocol == "grpc" and server.headers["x-collector-key"] == "c-123"
    assert server.parent_span_id == "" and server.trace_id == upstream.trace_id  # a trace of its own
    assert upstream.parent_span_id == server.span_id
    for span in (server, upstream):
        assert span.attributes["gen_ai.request.stream"] is False
        assert span.attributes["gen_ai.response.id"] == message.id
        assert span.attributes["gen_ai.response.finish_reasons"] == ["tool_use"]
        check_usage(span, message.usage)
    no_secrets(spans)


def test_a_failover_is_two_client_spans_the_first_failed(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    models = """  failover: {targets: [{provider: c1, model: fake-status-529}, {provider: c2, model: fake-text}]}"""
    with run_gateway(config(collector, fake.base_url, models=models)) as gw:
        with client(gw).messages.stream(model="failover", **KW) as stream:
            message = stream.get_final_message()
        spans = one_trace(collector, 3)
    (server,) = by_kind(spans, "SERVER")
    failed, served = by_kind(spans, "CLIENT")
    assert failed.parent_span_id == served.parent_span_id == server.span_id
    assert failed.name == "chat fake-status-529" and served.name == "chat fake-text"
    assert failed.status_code == "ERROR" and failed.attributes["error.type"] == "overloaded_error"
    assert failed.attributes["http.response.status_code"] == 529
    assert failed.attributes["messages_gateway.provider"] == "c1" and failed.attributes["messages_gateway.attempt"] == 1
    assert "gen_ai.usage.input_tokens" not in failed.attributes
    assert failed.end_ns <= served.start_ns
    assert served.status_code == "UNSET" and "error.type" not in served.attributes
    assert served.attributes["messages_gateway.attempt"] == 2
    check_usage(served, message.usage)
    check_usage(server, message.usage)
    assert server.attributes["messages_gateway.attempts"] == 2 and "error.type" not in server.attributes
    assert server.attributes["gen_ai.request.model"] == "failover"
    # each attempt carried its own span upstream
    sent = [r.headers["traceparent"] for r in fake.requests if r.path == "/v1/messages"]
    assert sent == [f"00-{server.trace_id}-{failed.span_id}-01", f"00-{server.trace_id}-{served.span_id}-01"]


def test_a_stream_that_breaks_ends_its_spans_with_the_error(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    with run_gateway(config(collector, fake.base_url)) as gw:
        with (
            pytest.raises(anthropic.APIStatusError),
            client(gw).messages.stream(model="fake-error-midstream", **KW) as stream,
        ):
            stream.get_final_message()
        spans = one_trace(collector, 2)
    (server,) = by_kind(spans, "SERVER")
    (upstream,) = by_kind(spans, "CLIENT")
    for span in (server, upstream):
        assert span.status_code == "ERROR" and span.attributes["error.type"] == "upstream_error"
        assert span.attributes["gen_ai.usage.input_tokens"] == 14  # what was reported before it broke
    assert server.attributes["messages_gateway.outcome"] == "upstream_error"
    assert server.attributes["http.response.status_code"] == 200  # the stream had started


def test_a_client_that_leaves_ends_the_spans_with_its_outcome(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    with run_gateway(config(collector, fake.base_url)) as gw:
        with httpx.stream(
            "POST",
            f"{gw.url}/v1/messages",
            json={"max_tokens": 64, "messages": KW["messages"], "model": "fake-slow", "stream": True},
            headers={"anthropic-version": "2023-06-01"},
            timeout=10,
        ) as resp:
            for line in resp.iter_lines():
                if "content_block_delta" in line:
                    break  # gone after the first delta of a 20-second stream
        spans = one_trace(collector, 2)
    (server,) = by_kind(spans, "SERVER")
    (upstream,) = by_kind(spans, "CLIENT")
    assert server.attributes["messages_gateway.outcome"] == "client_cancelled"
    assert server.attributes["error.type"] == upstream.attributes["error.type"] == "client_cancelled"
    assert (server.end_ns - server.start_ns) / 1e9 < 10  # ended when the client left, not when the stream would have


def test_a_bedrock_target(collector: OtlpCollector) -> None:
    with FakeBedrock() as bedrock:
        yaml = f"""
auth: {{open: true}}
telemetry: {{otlp: {{endpoint: "{collector.http_endpoint}", schedule_delay_s: 0.2}}}}
providers:
  b: {{kind: bedrock, region: us-east-1, base_url: "{bedrock.base_url}", access_key_id: AKIDFAKEBEDROCK,
       secret_access_key: fake-secret}}
models: {{"*": {{targets: [{{provider: b, model: us.anthropic.fake-text-v1:0}}]}}}}
"""
        with run_gateway(yaml) as gw:
            with client(gw, **traced_headers()).messages.stream(model="claude-sonnet-4-6", **KW) as stream:
                message = stream.get_final_message()
            spans = one_trace(collector, 2)
        sent = [r for r in bedrock.requests if "invoke" in r.path]
    (server,) = by_kind(spans, "SERVER")
    (upstream,) = by_kind(spans, "CLIENT")
    assert upstream.name == "chat us.anthropic.fake-text-v1:0"
    assert upstream.attributes["gen_ai.provider.name"] == "aws.bedrock"
    assert upstream.attributes["gen_ai.request.model"] == "us.anthropic.fake-text-v1:0"
    assert server.attributes["gen_ai.request.model"] == "claude-sonnet-4-6"
    assert server.attributes["gen_ai.provider.name"] == "aws.bedrock"
    check_usage(upstream, message.usage)
    check_usage(server, message.usage)
    # the signed request took the traceparent beside its signature: the fake verified SigV4 and answered
    assert sent and sent[0].headers["traceparent"] == f"00-{CLIENT_TRACE}-{upstream.span_id}-01"


def test_genai_metrics_with_the_conventions_buckets(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    with run_gateway(config(collector, fake.base_url)) as gw:
        sdk = client(gw)
        usages = []
        for _ in range(3):
            with sdk.messages.stream(model="fake-text", **KW) as stream:
                usages.append(stream.get_final_message().usage)

        def complete(points: list[Any]) -> bool:
            return any(p.name == "gen_ai.client.token.usage" and p.count == 3 for p in points)

        points = collector.wait_metrics(complete)
    latest: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}
    for point in points:  # cumulative: the last point of a series is its total
        latest[(point.name, tuple(sorted(point.attributes.items())))] = point
    tokens = {
        p.attributes["gen_ai.token.type"]: p for (name, _), p in latest.items() if name == "gen_ai.client.token.usage"
    }
    inputs = sum(
        u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0) for u in usages
    )
    assert tokens["input"].sum == inputs and tokens["output"].sum == sum(u.output_tokens for u in usages)
    assert tokens["input"].count == 3 and tokens["input"].temporality == "CUMULATIVE"
    assert tokens["input"].unit == "{token}"
    assert tokens["input"].bounds == [
        1,
        4,
        16,
        64,
        256,
        1024,
        4096,
        16384,
        65536,
        262144,
        1048576,
        4194304,
        16777216,
        67108864,
    ]
    assert tokens["input"].attributes["gen_ai.provider.name"] == "anthropic"
    assert tokens["input"].attributes["server.address"] == "127.0.0.1"
    names = {name for name, _ in latest}
    assert {
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "gen_ai.server.request.duration",
        "gen_ai.server.time_to_first_token",
    } <= names
    (ttft,) = [p for (name, _), p in latest.items() if name == "gen_ai.server.time_to_first_token"]
    assert ttft.count == 3 and ttft.unit == "s"
    assert ttft.bounds == [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
    (duration,) = [p for (name, _), p in latest.items() if name == "gen_ai.server.request.duration"]
    assert duration.bounds[0] == 0.01 and duration.bounds[-1] == 81.92 and duration.count == 3


def test_an_unsampled_caller_gets_no_spans_but_its_context_goes_upstream(
    fake: FakeClaudeAPI, collector: OtlpCollector
) -> None:
    with run_gateway(config(collector, fake.base_url)) as gw:
        client(gw, traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00").messages.create(model="fake-text", **KW)
        client(gw).messages.create(model="fake-text", **KW)  # a sampled one after it: the export works
        spans = one_trace(collector, 2)
    assert {s.trace_id for s in spans} != {CLIENT_TRACE} and all(s.trace_id != CLIENT_TRACE for s in spans)
    first = next(r for r in fake.requests if r.path == "/v1/messages")
    assert first.headers["traceparent"].startswith(f"00-{CLIENT_TRACE}-") and first.headers["traceparent"].endswith(
        "-00"
    )


def test_an_export_that_fails_is_counted_and_never_felt(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    collector.fail(100, status=400)  # a collector that refuses everything, without retry
    with run_gateway(config(collector, fake.base_url)) as gw:
        message = client(gw).messages.create(model="fake-text", **KW)
        assert message.content
        deadline = time.monotonic() + 10
        while gw.sample("gateway_otlp_exports_total", signal="traces", outcome="failed") < 1:
            assert time.monotonic() < deadline, "the failed export was not counted"
            time.sleep(0.05)
        assert gw.sample("gateway_otlp_spans_total", outcome="failed") == 2
    assert collector.spans() == []


def test_off_without_configuration(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    yaml = f"""
auth: {{open: true}}
providers: {{c1: {{kind: anthropic, api_key: k, base_url: "{fake.base_url}"}}}}
models: {{"*": {{targets: [{{provider: c1}}]}}}}
"""
    with run_gateway(yaml) as gw:
        client(gw, **traced_headers()).messages.create(model="fake-text", **KW)
        assert gw.sample("gateway_otlp_exports_total", signal="traces", outcome="ok") == 0
    (sent,) = [r for r in fake.requests if r.path == "/v1/messages"]
    assert "traceparent" not in sent.headers  # untraced: the gateway adds nothing upstream
    time.sleep(0.3)
    assert collector.requests() == []


def test_spans_leave_while_a_long_stream_runs(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    """The queue is drained on its schedule, whatever else is in flight: a request's spans do not wait for other
    streams to end."""
    with run_gateway(config(collector, fake.base_url)) as gw:
        done = threading.Event()

        def long_stream() -> None:
            with client(gw).messages.stream(model="fake-slow", **KW) as stream:
                for _ in stream.text_stream:
                    if done.is_set():
                        break

        thread = threading.Thread(target=long_stream, daemon=True)
        thread.start()
        client(gw).messages.create(model="fake-text", **KW)
        spans = one_trace(collector, 2)
        assert all(s.attributes.get("gen_ai.request.model") == "fake-text" for s in spans)
        done.set()
        thread.join(30)


@pytest.mark.long
def test_a_78s_traced_stream_on_the_default_schedule(
    serve: Any, tmp_path: Path, fake: FakeClaudeAPI, collector: OtlpCollector
) -> None:
    """Every export timer at its default (``schedule_delay_s`` 5 s, ``timeout_s`` 10 s, ``metrics_interval_s``
    60 s), the gateway served as users run it: a 78 s stream outlives them all and is one SERVER and one CLIENT
    span as long as itself; a short request made meanwhile is exported on the 5 s schedule, not held for the long
    one; the GenAI metrics leave on their 60 s interval while the stream runs, and the stream's own at shutdown."""
    path = tmp_path / "gateway.yaml"
    path.write_text(
        f"""
auth: {{open: true}}
telemetry: {{otlp: {{endpoint: "{collector.http_endpoint}"}}}}
providers: {{c1: {{kind: anthropic, api_key: {PROVIDER_KEY}, base_url: "{fake.base_url}"}}}}
models: {{"*": {{targets: [{{provider: c1}}]}}}}
"""
    )
    served = serve(path)
    sdk = anthropic.Anthropic(base_url=served.url, api_key="k", max_retries=0, timeout=300)
    result: dict[str, Any] = {}

    def long_stream() -> None:
        with sdk.messages.stream(model="fake-slow-d26-i3000", **KW) as stream:  # 26 deltas 3 s apart: 78 s
            result["message"] = stream.get_final_message()

    thread = threading.Thread(target=long_stream, daemon=True)
    started = time.monotonic()
    thread.start()
    time.sleep(2)
    sdk.messages.create(model="fake-text", **KW)
    short = collector.wait_spans(lambda spans: len(spans) >= 2, timeout=15)  # within the 5 s schedule
    assert time.monotonic() - started < 20 and {s.attributes["gen_ai.request.model"] for s in short} == {"fake-text"}
    collector.wait_metrics(lambda points: any(p.name == "gen_ai.server.request.duration" for p in points), timeout=75)
    thread.join(120)
    assert time.monotonic() - started >= 78 and "message" in result
    spans = collector.wait_spans(lambda spans: len(spans) >= 4, timeout=15)
    long_ones = [s for s in spans if s.attributes["gen_ai.request.model"] == "fake-slow-d26-i3000"]
    assert sorted(s.kind for s in long_ones) == ["CLIENT", "SERVER"]
    for span in long_ones:
        assert (span.end_ns - span.start_ns) / 1e9 >= 75 and "error.type" not in span.attributes
        check_usage(span, result["message"].usage)
    served.proc.terminate()  # the shutdown sends the metrics as they stand: the long stream's duration among them
    served.proc.wait(20)
    durations = [
        p
        for p in collector.metrics()
        if p.name == "gen_ai.server.request.duration" and p.attributes["gen_ai.request.model"] == "fake-slow-d26-i3000"
    ]
    assert durations and durations[-1].count == 1 and durations[-1].max >= 75


@pytest.mark.parametrize("stream", [True, False])
def test_content_only_when_opted_in_and_never_a_key(
    fake: FakeClaudeAPI, collector: OtlpCollector, stream: bool
) -> None:
    """``capture_content: true``: the convention's opt-in attributes, in its message shapes, on the CLIENT span."""
    extra = "    capture_content: true"
    kw = {**KW, "system": "You are terse."}
    with run_gateway(config(collector, fake.base_url, extra=extra)) as gw:
        sdk = client(gw)
        if stream:
            with sdk.messages.stream(model="fake-tools", **kw) as answer:
                message = answer.get_final_message()
        else:
            message = sdk.messages.create(model="fake-tools", **kw)
        spans = one_trace(collector, 2)
    (server,) = by_kind(spans, "SERVER")
    (upstream,) = by_kind(spans, "CLIENT")
    a = upstream.attributes
    assert json.loads(a["gen_ai.system_instructions"]) == [{"type": "text", "content": "You are terse."}]
    assert json.loads(a["gen_ai.input.messages"]) == [{"role": "user", "parts": [{"type": "text", "content": PROMPT}]}]
    (output,) = json.loads(a["gen_ai.output.messages"])
    assert output["role"] == "assistant" and output["finish_reason"] == message.stop_reason == "tool_use"
    want: list[dict[str, Any]] = []
    for block in message.content:
        if block.type == "text":
            want.append({"type": "text", "content": block.text})
        elif block.type == "tool_use":
            want.append({"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.input})
    assert output["parts"] == want
    assert "gen_ai.input.messages" not in server.attributes  # the inference span carries it, once
    assert PROVIDER_KEY not in repr([(s.attributes, s.resource) for s in spans])


def test_a_bedrock_shaped_request_is_named_for_its_route(fake: FakeClaudeAPI, collector: OtlpCollector) -> None:
    """A surface's SERVER span carries its route's template (never the model id in the path)."""
    with run_gateway(config(collector, fake.base_url)) as gw:
        resp = httpx.post(
            f"{gw.url}/model/us.anthropic.fake-text-v1:0/invoke",
            json={"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64, "messages": KW["messages"]},
            timeout=10,
        )
        assert resp.status_code == 200, resp.text
        spans = one_trace(collector, 2)
    (server,) = by_kind(spans, "SERVER")
    (upstream,) = by_kind(spans, "CLIENT")
    assert server.name == "POST /model/{modelId}/invoke"
    assert server.attributes["http.route"] == "/model/{modelId}/invoke"
    assert server.attributes["url.path"] == "/model/us.anthropic.fake-text-v1:0/invoke"
    usage = resp.json()["usage"]
    assert upstream.attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    assert upstream.attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"] + usage.get(
        "cache_read_input_tokens", 0
    ) + usage.get("cache_creation_input_tokens", 0)
