"""The built-in default config runs offline through the mock provider, and the SDK reads it."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx

from gateway.settings import default_config_path, load_settings
from tests.conftest import run_gateway

DOC = "The gateway is stateless. It scales out as replicas behind a Service. Usage is folded exactly."


def test_default_config_streams_a_labelled_mock_reply() -> None:
    with run_gateway(load_settings(default_config_path(), environ={})) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="anything", max_retries=0)
        with client.messages.stream(
            model="claude-sonnet-4-6", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            message = stream.get_final_message()
        assert message.model == "mock:claude-sonnet-4-6"
        assert message.stop_reason == "end_turn"
        assert message.content[0].type == "text" and "mock" in message.content[0].text
        raw = httpx.post(
            f"{gw.url}/v1/messages",
            json={"model": "claude-opus-4-1", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]},
        )
        assert raw.headers["x-gateway-mock"] == "true"
        assert raw.json()["model"] == "mock:claude-opus-4-1"
        count = client.messages.count_tokens(model="claude-sonnet-4-6", messages=[{"role": "user", "content": "Hi"}])
        assert count.input_tokens >= 1
        for mantle in ("anthropic.claude-sonnet-4-6", "us.anthropic.claude-opus-5-5"):  # Claude Code's mantle names
            reply = client.messages.create(model=mantle, max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
            assert reply.model == f"mock:{mantle}"
        bedrock = anthropic.AnthropicBedrock(api_key="anything", base_url=gw.url, aws_region="us-east-1", max_retries=0)
        reply = bedrock.messages.create(
            model="us.anthropic.claude-opus-5-5", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
        )
        assert reply.model == "mock:claude-opus-5-5"  # the id mapped onto the claude-* route


def test_mock_cites_the_documents_it_is_given() -> None:
    yaml = (
        "auth: {open: true}\nproviders: {demo: {kind: mock, deltas: 8}}\nmodels: {'*': {targets: [{provider: demo}]}}"
    )
    with run_gateway(yaml) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
        content: list[Any] = [
            {
                "type": "document",
                "title": "Ops guide",
                "citations": {"enabled": True},
                "source": {"type": "text", "media_type": "text/plain", "data": DOC},
            },
            {
                "type": "document",
                "title": "Custom",
                "citations": {"enabled": True},
                "source": {
                    "type": "content",
                    "content": [{"type": "text", "text": "First block."}, {"type": "text", "text": "Second block."}],
                },
            },
            {"type": "text", "text": "What do the documents say?"},
        ]
        with client.messages.stream(model="m", max_tokens=500, messages=[{"role": "user", "content": content}]) as s:
            events = list(s)
            message = s.get_final_message()
        citations = [c for b in message.content if b.type == "text" for c in (b.citations or [])]
        assert {c.type for c in citations} == {"char_location", "content_block_location"}
        for c in citations:
            if c.type == "char_location":
                assert DOC[c.start_char_index : c.end_char_index] == c.cited_text
                assert c.document_title == "Ops guide"
        deltas = [e for e in events if e.type == "content_block_delta" and e.delta.type == "citations_delta"]
        assert len(deltas) == len(citations)  # exactly one citation per citations_delta


def test_paced_mock_streams_event_by_event_and_models_page() -> None:
    config = """
auth: {open: true}
providers: {paced: {kind: mock, deltas: 3, event_delay_ms: 20, first_event_delay_ms: 10}}
models:
  one: {targets: [{provider: paced}]}
  two: {targets: [{provider: paced}]}
  three: {targets: [{provider: paced}]}
"""
    with run_gateway(config) as gw:
        body = {"model": "one", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
        with httpx.stream("POST", f"{gw.url}/v1/messages", json=body) as resp:
            chunks = [chunk for chunk in resp.iter_raw() if chunk]
        assert len(chunks) >= 5  # one write per event when the mock is paced, not one blob
        assert b"".join(chunks).count(b"event: content_block_delta\n") == 3
        page = httpx.get(f"{gw.url}/v1/models", params={"limit": 2}).json()
        assert [m["id"] for m in page["data"]] == ["one", "two"] and page["has_more"] is True
        assert page["first_id"] == "one" and page["last_id"] == "two"
        rest = httpx.get(f"{gw.url}/v1/models", params={"after_id": "two"}).json()
        assert [m["id"] for m in rest["data"]] == ["three"] and rest["has_more"] is False
        assert httpx.get(f"{gw.url}/v1/models", params={"limit": "x"}).status_code == 400
