"""Fuzzers kept as tests (Hypothesis): whatever bytes a provider or a client sends, and whatever YAML an operator
writes, each layer answers with its own documented result or error and nothing else.

- provider bytes (the SSE framer, the AWS event-stream framer, each adapter's stream, the validator and the
  pipeline, end to end): the client's stream is a valid prefix ending in ``message_stop`` — only when every event
  the provider sent was forwarded unchanged up to its own ``message_stop`` — or ends in exactly one ``error``;
  no exception escapes;
- client bytes (the request parser): a ``MessagesHead`` or ``InvalidRequest``;
- config text (the loader): ``Settings`` or ``ConfigError``, with a line number.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters._bedrock_stream import BedrockEventStream
from adapters._eventstream import EventStreamDecoder, EventStreamError
from adapters.base import SseEventStream
from gateway.observability.metrics import Metrics
from gateway.observability.usage import UsageTally
from gateway.routing.pipeline import _DRAINS, OpenStream, stream_body
from gateway.settings import ConfigError, Settings, parse_settings
from gateway.wire.errors import InvalidRequest
from gateway.wire.events import decode_view
from gateway.wire.request import ProxyRequest, parse_count_tokens, parse_messages
from gateway.wire.sse import SseDecoder
from gateway.wire.upstream import StreamInterrupted
from gateway.wire.validate import KNOWN_EVENTS
from tests.edits import apply_edits, byte_edits
from tests.fakes.bedrock import chunk_frame
from tests.unit.test_pipeline import _Target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "claude"
STREAMS = {name: (FIXTURES / f"{name}.sse").read_bytes() for name in ("fake-text", "fake-tools", "fake-citations")}
# FUZZ_EXAMPLES=2000 for a longer campaign (the suite's 150 each keep CI quick)
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class _Resp:
    """An upstream response whose body arrives in the given reads (and may break off)."""

    def __init__(self, parts: list[bytes], *, broken: bool = False) -> None:
        self._parts = parts
        self._broken = broken
        self.headers: dict[str, str] = {}
        self.status = 200

    async def chunks(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part
        if self._broken:
            raise StreamInterrupted("connection reset by peer")

    async def read(self, limit: int | None = None) -> bytes:
        return b"".join(self._parts)

    def at_eof(self) -> bool:
        return not self._broken

    async def aclose(self) -> None:
        return None


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    parts, last = [], 0
    for p in [*points, len(data)]:
        if p > last:
            parts.append(data[last:p])
            last = p
    return parts or [data]


def client_side(stream: Any) -> list[dict[str, Any]]:
    """Everything the pipeline sends the client for ``stream``, as events (each a JSON object, named by its
    SSE event line: an event whose data lacks ``type`` is named after its provider's event line). Invalid UTF-8
    inside an event is replaced here: whether it may pass at all is the security issue's, not this fuzzer's."""

    async def go() -> bytes:
        batches = stream.batches()
        try:
            first = await anext(batches)
        except StopAsyncIteration:
            return b""  # the pipeline answers this with an HTTP error before any byte: nothing streamed
        except StreamInterrupted:
            return b""
        opened = OpenStream(_Target(), stream, batches, first)  # type: ignore[arg-type]
        tally = UsageTally(Metrics(), alias="a", provider="p", model="m")
        out = b"".join([chunk async for chunk in stream_body(opened, Metrics(), tally)])
        await asyncio.gather(*_DRAINS)
        return out

    body = asyncio.run(go())
    events = []
    for block in body.split(b"\n\n"):
        if not block:
            continue
        lines = block.split(b"\n")
        assert lines[0].startswith(b"event: ") and lines[1].startswith(b"data: ") and len(lines) == 2, block
        event = json.loads(lines[1][6:].decode("utf-8", "replace"))
        assert isinstance(event, dict)
        name = lines[0][7:].decode()
        assert event.get("type") in (None, "", name)  # a data without a type is named by its event line
        events.append({"type": name, "data": event})
    return events


def check_client_stream(events: list[dict[str, Any]], sent: list[tuple[str, bytes]]) -> None:
    """A valid prefix; ends in message_stop only if the provider's own events, unchanged, got there. ``sent``:
    each well-formed frame's event name and data (a data without a type is named by its event line, as the
    gateway names it)."""
    if not events:
        return
    all_types = [e["type"] for e in events]
    types = [t for t in all_types if t in KNOWN_EVENTS and t != "ping"]  # newer types and pings pass anywhere
    if not types:
        assert "message_stop" not in all_types
        return
    assert types[0] in ("message_start", "error")
    assert all_types[-1] == types[-1]
    assert types.count("message_stop") + types.count("error") <= 1
    if types[-1] == "message_stop":
        provider = [json.loads(d.decode("utf-8", "replace")) for _, d in sent]
        names = [e.get("type") or name for e, (name, _) in zip(provider, sent, strict=True)]
        stop = names.index("message_stop")
        kept = [e for e in provider[: stop + 1] if e.get("type") != "ping"]
        assert [e["data"] for e in events if e["type"] != "ping"] == kept
    else:
        assert types[-1] == "error" and "message_stop" not in types


def sse_datas(body: bytes) -> list[tuple[str, bytes]]:
    """The event name and data of each well-formed frame, in order (what the provider meant to send), pings left
    out by the name the gateway gives a frame, as the client's side is: its data's ``type``, else its event line
    (``event: ping`` with the data ``{"type": "ing"}`` is an ``ing`` event, which passes as a newer type would)."""
    out = []
    for frame in SseDecoder().feed(body):
        try:
            decode_view(frame.data)
            data = json.loads(frame.data.decode("utf-8", "replace"))
        except (msgspec.DecodeError, ValueError):
            continue
        event = frame.event.decode("utf-8", "replace") if frame.event else ""
        typed = data.get("type") if isinstance(data, dict) else None
        if (typed or event) != "ping":
            out.append((event, frame.data))
    return out


# --- provider bytes ----------------------------------------------------------------------------------------------


@FUZZ
@given(
    name=st.sampled_from(sorted(STREAMS)),
    edits=byte_edits(b'\n\r:{}[]",\\ae0\xff\xc3', reach=4000, most=4),
    cuts=st.lists(st.integers(0, 4000), max_size=12),
    broken=st.booleans(),
)
def test_any_damage_to_an_sse_stream_ends_in_error_or_the_providers_own_stop(
    name: str, edits: list[tuple[int, str, int]], cuts: list[int], broken: bool
) -> None:
    body = apply_edits(STREAMS[name], edits)
    events = client_side(SseEventStream(_Resp(cut(body, cuts), broken=broken)))  # type: ignore[arg-type]
    check_client_stream(events, sse_datas(body))
    if edits == [] and not broken:
        assert events[-1]["type"] == "message_stop"


@FUZZ
@given(st.lists(st.binary(max_size=300), max_size=8))
def test_random_bytes_never_crash_the_sse_framer(parts: list[bytes]) -> None:
    decoder = SseDecoder()
    for part in parts:
        block = decoder.feed_block(part)
        assert block == b"" or block.endswith(b"\n\n")
    decoder.close()
    events = client_side(SseEventStream(_Resp(parts)))  # type: ignore[arg-type]
    check_client_stream(events, sse_datas(b"".join(parts)))


def bedrock_body(sse: bytes) -> tuple[bytes, list[bytes]]:
    datas = [f.data for f in SseDecoder().feed(sse)]
    return b"".join(chunk_frame(json.loads(d), i) for i, d in enumerate(datas)), datas


BEDROCK = {name: bedrock_body(body) for name, body in STREAMS.items()}


@FUZZ
@given(
    name=st.sampled_from(sorted(BEDROCK)),
    edits=byte_edits(b"\x00\x01\xff:{}=Aa", reach=6000, most=3),
    cuts=st.lists(st.integers(0, 6000), max_size=12),
    broken=st.booleans(),
)
def test_any_damage_to_a_bedrock_event_stream_ends_in_error_or_the_providers_own_stop(
    name: str, edits: list[tuple[int, str, int]], cuts: list[int], broken: bool
) -> None:
    body, datas = BEDROCK[name]
    damaged = apply_edits(body, edits)
    stream = BedrockEventStream(_Resp(cut(damaged, cuts), broken=broken), "p", None)  # type: ignore[arg-type]
    sent = [("", d) for d in datas]
    check_client_stream(client_side(stream), sent)  # CRCs guard every frame: damage never reaches the client
    if edits == [] and not broken:
        assert client_side(BedrockEventStream(_Resp(cut(body, cuts)), "p", None))[-1]["type"] == "message_stop"  # type: ignore[arg-type]


@FUZZ
@given(st.lists(st.binary(max_size=200), max_size=8))
def test_random_bytes_never_crash_the_event_stream_framer(parts: list[bytes]) -> None:
    decoder = EventStreamDecoder()
    try:
        for part in parts:
            decoder.feed(part)
        decoder.close()
    except EventStreamError:
        pass
    events = client_side(BedrockEventStream(_Resp(parts), "p", None))  # type: ignore[arg-type]
    check_client_stream(events, [])


# --- client bytes ---------------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
FIELDS = st.sampled_from(["model", "max_tokens", "messages", "stream", "system", "role", "content", "x"])


@FUZZ
@given(
    st.dictionaries(FIELDS, JSON_VALUES, max_size=6),
    st.lists(st.dictionaries(st.sampled_from(["role", "content", "x"]), JSON_VALUES, max_size=3), max_size=3),
    byte_edits(b'{}[]",:\\0a\xff', reach=300, most=3),
)
def test_the_request_parser_answers_a_head_or_invalid_request(
    fields: dict[str, Any], messages: list[Any], edits: list[tuple[int, str, int]]
) -> None:
    body = {**fields}
    if "messages" not in body:
        body["messages"] = messages
    raw = apply_edits(json.dumps(body).encode(), edits)
    for parse in (parse_messages, parse_count_tokens):
        try:
            head = parse(raw)
        except InvalidRequest as exc:
            assert exc.status_code == 400 and exc.message
            continue
        request = ProxyRequest(body=raw, model=head.model, stream=False, request_id="r")
        request.body_with(set={"model": "other"}, drop=("stream",))  # a parsed body can always be rewritten


@pytest.mark.parametrize("depth", [10, 100, 50_000, 200_000])
def test_deep_nesting_anywhere_is_invalid_request(depth: int) -> None:
    """Shallow nesting parses; nesting past what msgspec recurses into is a 400, never a RecursionError."""
    nested = "[" * depth + "]" * depth
    for raw in (
        f'{{"model":"m","max_tokens":1,"messages":[{{"role":"user","content":[{nested}]}}]}}',
        f'{{"model":"m","max_tokens":1,"messages":[],"metadata":{nested}}}',
    ):
        if depth <= 100:
            assert parse_messages(raw.encode()).model == "m"
        else:
            with pytest.raises(InvalidRequest, match="nested too deeply"):
                parse_messages(raw.encode())


# --- config text ---------------------------------------------------------------------------------------------

KEYS = st.sampled_from(
    [
        "server",
        "auth",
        "keys",
        "providers",
        "models",
        "pricing",
        "resilience",
        "retry",
        "breaker",
        "timeouts",
        "kind",
        "targets",
        "provider",
        "model",
        "max_attempts",
        "port",
        "host",
        "api_key",
        "base_url",
        "name",
        "key",
        "weight",
        "strategy",
        "input",
        "output",
        "cooldown_s",
        "total_s",
        "workers",
        "m",
        "c1",
    ]
)
TAGGED = st.sampled_from(
    [
        "!!int abc",
        "!!float x",
        "!!bool maybe",
        "!!binary %%%",
        "!!timestamp yesterday",
        "!!null x",
        "!!str 5",
        "!!int 0x1F",
        "!!float .inf",
        "${NOPE}",
        "${HOME:-x}",
        "$$",
        "[1, 2",
        "{a: ",
        "&a x",
        "*a",
        "!!python/name:os",
    ]
)
SCALARS = st.one_of(
    st.integers(-5, 70000),
    st.booleans(),
    st.none(),
    st.text(max_size=10),
    TAGGED,
    st.sampled_from(["anthropic", "mock", "bedrock", "vertex", "foundry", "fallback", "weighted", "c1", "m"]),
)
YAML_TREES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=15,
)


def to_yaml(value: Any, indent: int = 0) -> str:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "\n" + "".join(f"{pad}{k}: {to_yaml(v, indent + 2)}\n" for k, v in value.items()).rstrip("\n")
    if isinstance(value, list):
        if not value:
            return "[]"
        return "\n" + "".join(f"{pad}- {to_yaml(v, indent + 2).lstrip()}\n" for v in value).rstrip("\n")
    if isinstance(value, str) and value in TAGGED_SET:
        return value
    return json.dumps(value)


TAGGED_SET = frozenset(TAGGED.elements)  # type: ignore[attr-defined]


@FUZZ
@given(st.dictionaries(KEYS, YAML_TREES, max_size=5), byte_edits(b":-{}[]\n '!&*#", reach=400, most=2))
def test_the_config_loader_answers_settings_or_a_config_error(tree: dict[str, Any], edits: list[Any]) -> None:
    text = apply_edits(to_yaml(tree).encode(), edits).decode("utf-8", "replace")
    try:
        result = parse_settings(text, source="fuzz.yaml", environ={"HOME": "/root"})
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.yaml"), exc
        return
    assert isinstance(result, Settings)


@pytest.mark.parametrize(
    "text",
    [
        "resilience: {retry: {max_attempts: !!int abc}}",
        "server: {port: !!float x}",
        "server: {ui: !!bool maybe}",
        "pricing: {m: {input: !!binary '%%%'}}",
        "server: {host: !!timestamp yesterday}",
        "providers: !!python/name:os.system",
    ],
)
def test_bad_tagged_values_are_config_errors_with_their_line(text: str) -> None:
    """Before: ``max_attempts: !!int abc`` raised an uncaught ValueError (a traceback from check-config, and
    the config watcher died for good)."""
    with pytest.raises(ConfigError, match=r"^fuzz.yaml:1: "):
        parse_settings(text, source="fuzz.yaml", environ={})
