"""The gateway's request/response cycle (``gateway.http.server.GatewayCycle``): the same bytes as uvicorn's own cycle
for every message sequence, in fewer writes — the head goes out with the first body message, or alone at the end
of the loop turn when no body follows at once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.http.server import PROTOCOL, GatewayCycle
from tests.net import free_port


class Transport:
    """What a cycle writes to, recorded write by write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after the close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def _cycle(kind: type[RequestResponseCycle], method: str = "POST", keep_alive: bool = True) -> tuple[Any, Transport]:
    transport = Transport()
    done: list[bool] = []
    cycle = kind(
        scope={"type": "http", "method": method, "path": "/v1/messages", "http_version": "1.1"},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[(b"date", b"Tue, 01 Dec 2026 22:00:00 GMT"), (b"server", b"uvicorn")],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: done.append(True),
    )
    cycle.done = done
    return cycle, transport


JSON = b'{"type":"message","content":[]}'
SEQUENCES: dict[str, tuple[str, bool, list[dict[str, Any]]]] = {
    "json": (
        "POST",
        True,
        [
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(JSON))],
            },
            {"type": "http.response.body", "body": JSON},
        ],
    ),
    "stream": (
        "POST",
        True,
        [
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"Cache-Control", b"no-cache")],
            },
            {"type": "http.response.body", "body": b"event: message_start\ndata: {}\n\n", "more_body": True},
            {"type": "http.response.body", "body": b"", "more_body": True},
            {"type": "http.response.body", "body": b"event: ping\ndata: {}\n\n", "more_body": True},
            {"type": "http.response.body", "body": b"event: message_stop\ndata: {}\n\n", "more_body": False},
        ],
    ),
    "stream-empty-end": (
        "POST",
        True,
        [
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]},
            {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True},
            {"type": "http.response.body", "body": b"", "more_body": False},
        ],
    ),
    "json-in-parts": (
        "POST",
        True,
        [
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [(b"content-length", b"4"), (b"retry-after", b"1")],
            },
            {"type": "http.response.body", "body": b"ab", "more_body": True},
            {"type": "http.response.body", "body": b"cd"},
        ],
    ),
    "head": (
        "HEAD",
        True,
        [
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"12")]},
            {"type": "http.response.body", "body": b""},
        ],
    ),
    "no-content": ("GET", True, [{"type": "http.response.start", "status": 204}, {"type": "http.response.body"}]),
    "connection-close": (
        "POST",
        True,
        [
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [(b"Connection", b"keep-alive, Close"), (b"content-length", b"2")],
            },
            {"type": "http.response.body", "body": b"{}"},
        ],
    ),
    "not-keep-alive": (
        "POST",
        False,
        [
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2"), (b"x-tab", b"a\tb")]},
            {"type": "http.response.body", "body": b"{}"},
        ],
    ),
}


async def _play(
    kind: type[RequestResponseCycle], method: str, keep_alive: bool, messages: list[dict[str, Any]]
) -> tuple[Any, Transport]:
    cycle, transport = _cycle(kind, method, keep_alive)
    for message in messages:
        await cycle.send(message)
    await asyncio.sleep(0)  # a pending head, if any, goes out at the end of the turn
    return cycle, transport


@pytest.mark.parametrize("name", SEQUENCES)
def test_the_same_bytes_as_uvicorns_cycle_in_fewer_writes(name: str) -> None:
    method, keep_alive, messages = SEQUENCES[name]
    theirs, their_transport = asyncio.run(_play(RequestResponseCycle, method, keep_alive, messages))
    ours, our_transport = asyncio.run(_play(GatewayCycle, method, keep_alive, messages))
    assert b"".join(our_transport.writes) == b"".join(their_transport.writes)
    ours_written = [w for w in our_transport.writes if w]
    theirs_written = [w for w in their_transport.writes if w]
    if method != "HEAD" and messages[1].get("body"):  # the head went out with the first body: one write fewer
        assert len(ours_written) == len(theirs_written) - 1
    else:
        assert len(ours_written) == len(theirs_written)
    assert (ours.response_complete, ours.keep_alive, ours.done) == (
        theirs.response_complete,
        theirs.keep_alive,
        theirs.done,
    )
    assert our_transport.closed == their_transport.closed


def test_a_json_answer_is_one_write_and_a_streams_head_goes_out_with_its_first_events() -> None:
    _, transport = asyncio.run(_play(GatewayCycle, *SEQUENCES["json"][:2], SEQUENCES["json"][2]))
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and transport.writes[0].endswith(b"\r\n\r\n" + JSON)

    _, transport = asyncio.run(_play(GatewayCycle, *SEQUENCES["stream"][:2], SEQUENCES["stream"][2]))
    first = transport.writes[0]
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked\r\n\r\n" in first
    assert first.endswith(b"event: message_start\ndata: {}\n\n\r\n")
    assert len(transport.writes) == 3  # head + first events, the ping, the last events and the chunked end


def test_a_head_with_no_body_at_once_goes_out_at_the_end_of_the_loop_turn() -> None:
    async def scenario() -> list[list[bytes]]:
        cycle, transport = _cycle(GatewayCycle)
        seen = []
        await cycle.send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
        )
        seen.append(list(transport.writes))  # not yet: a body may follow in this turn
        await asyncio.sleep(0)
        seen.append(list(transport.writes))  # the turn ended: the head is out, the client sees the 200
        await cycle.send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})
        seen.append(list(transport.writes))
        return seen

    before, after_turn, after_body = asyncio.run(scenario())
    assert before == []
    assert len(after_turn) == 1 and after_turn[0].endswith(b"\r\n\r\n")
    assert after_body[1:] == [b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"]


def test_a_pending_head_is_dropped_when_the_client_is_gone() -> None:
    async def scenario() -> Transport:
        cycle, transport = _cycle(GatewayCycle)
        await cycle.send({"type": "http.response.start", "status": 200, "headers": []})
        cycle.disconnected = True
        await asyncio.sleep(0)
        await cycle.send({"type": "http.response.body", "body": b"x", "more_body": False})
        return transport

    assert asyncio.run(scenario()).writes == []


@pytest.mark.parametrize(
    ("header", "error"),
    [
        ((b"bad name", b"v"), "Invalid HTTP header name."),
        ((b"x-a:b", b"v"), "Invalid HTTP header name."),
        ((b"x-ok", b"a\r\nx-injected: 1"), "Invalid HTTP header value."),
        ((b"x-ok", b"a\x00"), "Invalid HTTP header value."),
    ],
)
def test_header_fields_are_checked_as_uvicorn_checks_them(header: tuple[bytes, bytes], error: str) -> None:
    async def scenario(kind: type[RequestResponseCycle]) -> str:
        cycle, transport = _cycle(kind)
        with pytest.raises(RuntimeError) as raised:
            await cycle.send({"type": "http.response.start", "status": 200, "headers": [(b"x-first", b"1"), header]})
        await asyncio.sleep(0)
        assert transport.writes == []
        return str(raised.value)

    assert asyncio.run(scenario(GatewayCycle)) == asyncio.run(scenario(RequestResponseCycle)) == error


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"abcdef", "Response content longer than Content-Length"),
        (b"ab", "Response content shorter than Content-Length"),
    ],
)
def test_a_body_that_does_not_match_its_length_is_refused_as_uvicorn_refuses_it(body: bytes, error: str) -> None:
    async def scenario() -> None:
        cycle, _ = _cycle(GatewayCycle)
        await cycle.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await cycle.send({"type": "http.response.body", "body": body})

    with pytest.raises(RuntimeError, match=error):
        asyncio.run(scenario())


def test_the_gateways_protocol_serves_every_request_with_this_cycle() -> None:
    kinds: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        kinds.append(type(send.__self__).__name__)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, loop="asyncio", http=PROTOCOL, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)

    async def scenario() -> bytes:
        serving = asyncio.create_task(server.serve())
        while not server.started:  # noqa: ASYNC110 (uvicorn offers a flag, not an event)
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
        writer.write(request + request)  # two on one connection (the second pipelined)
        answer = b""
        while answer.count(b"ok") < 2:
            answer += await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
        server.should_exit = True
        await serving
        return answer

    answer = asyncio.run(scenario())
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert kinds == ["GatewayCycle", "GatewayCycle"]
