"""The upstream seam writes only headers a server reads back as the same name and value (issue 31, item 1): every
client behind it (h1, aiohttp, httpx) refuses a name that is not a token or a value holding CR, LF, NUL, another
control character or a character outside latin-1, with ``UnsafeHeader`` (500 ``api_error``) before a byte leaves —
checked against a real server on 127.0.0.1 that counts what reaches it. ``_request_head``'s one-pass check is
fuzzed against two real parsers (httptools, the h1 client's own, and h11, httpx's): whatever it writes parses back
as one request with exactly the headers it was given; whatever it refuses, ``check_headers`` refuses too. A pooled
connection that receives bytes while idle, or more than its response, is closed, never reused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import h11
import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.wire.errors import GatewayError
from gateway.wire.upstream import H1Client, Timeouts, UnsafeHeader, _request_head, check_headers, make_client

T = Timeouts(connect=2.0, read=2.0)
CLIENTS = ["h1", "aiohttp", "httpx"]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

BAD_VALUES = {
    "lf": "a\nb",
    "cr": "a\rb",
    "crlf-smuggle": "x\r\nX-Injected-Header: yes\r\n\r\nGET /v1/smuggled-path HTTP/1.1\r\nHost: 127.0.0.1\r\nX: ",
    "nul": "a\x00b",
    "bell": "a\x07b",
    "del": "a\x7fb",
    "vertical-tab": "a\x0bb",
    "euro": "\u20ac",
    "emoji": "\U0001f600",
}
BAD_NAMES = {"space": "x y", "colon": "x:y", "lf": "x\ny", "empty": "", "euro": "x\u20ac", "nul": "x\x00"}


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    return head + (await reader.readexactly(length) if length else b"")


class Server:
    """A keep-alive HTTP/1.1 server that logs every connection and the raw bytes of every request."""

    def __init__(self, answer: Callable[[int, asyncio.StreamWriter], Awaitable[None]] | None = None) -> None:
        self.connections = 0
        self.received: list[bytes] = []
        self._answer = answer
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                self.received.append(await read_request(reader))
                if self._answer is None:
                    writer.write(OK)
                else:
                    await self._answer(len(self.received), writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def send(client_name: str, url: str, headers: dict[str, str]) -> bytes:
    client = make_client(client_name)
    try:
        resp = await client.send("POST", f"{url}/v1/messages", headers=headers, body=b"{}", timeouts=T)
        return await resp.read()
    finally:
        await client.aclose()


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("value", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_every_client_refuses_a_value_that_is_not_one_latin1_line(client: str, value: str) -> None:
    async def main() -> None:
        async with Server() as server:
            with pytest.raises(UnsafeHeader) as caught:
                await send(client, server.url, {"x-api-key": "provider-key", "anthropic-beta": value})
            assert server.connections == 0 and server.received == []  # not a byte sent
            assert caught.value.status_code == 500 and caught.value.error_type == "api_error"
            assert isinstance(caught.value, GatewayError) and "anthropic-beta" in str(caught.value)
            assert value not in str(caught.value)  # the value is never repeated (it may be a secret)
            assert await send(client, server.url, {"anthropic-beta": "context-1m-2025-08-07"}) == b"ok"

    asyncio.run(main())


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("name", list(BAD_NAMES.values()), ids=list(BAD_NAMES))
def test_every_client_refuses_a_name_that_is_not_a_token(client: str, name: str) -> None:
    async def main() -> None:
        async with Server() as server:
            with pytest.raises(UnsafeHeader):
                await send(client, server.url, {"x-api-key": "provider-key", name: "v"})
            assert server.connections == 0 and server.received == []

    asyncio.run(main())


@pytest.mark.parametrize("client", CLIENTS)
def test_what_may_be_sent_arrives_as_it_was_given(client: str) -> None:
    """HTAB, every printable ASCII character and (for h1, which writes latin-1) obs-text are a field value."""
    printable = "".join(chr(c) for c in range(0x21, 0x7F))
    headers = {"x-tabbed": "a\tb c", "x-printable": printable, "anthropic-beta": "a-2025-01-01,b-2025-02-02"}
    if client == "h1":
        headers["x-latin1"] = "caf\u00e9"

    async def main() -> None:
        async with Server() as server:
            assert await send(client, server.url, headers) == b"ok"
            (raw,) = server.received
            for name, value in headers.items():
                assert f"\r\n{name}: {value}\r\n".encode("latin-1") in raw.replace(b"\r\nX-", b"\r\nx-")

    asyncio.run(main())


def test_a_pooled_connection_that_speaks_while_idle_is_closed_never_reused() -> None:
    """The provider writes a second answer nobody asked for on the idle connection: the next request must not
    read it as its own (another key's stream got the answer to a smuggled request)."""

    async def answer(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n" + f"r{n}!".encode()[:3])
        await writer.drain()
        if n == 1:
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nBAD")

    async def main() -> None:
        async with Server(answer) as server:
            client = H1Client()
            try:
                first = await client.send("GET", f"{server.url}/a", headers={}, body=None, timeouts=T)
                assert await first.read() == b"r1!"
                await asyncio.sleep(0.3)  # the unsolicited answer arrives while the connection is idle
                second = await client.send("GET", f"{server.url}/b", headers={}, body=None, timeouts=T)
                assert await second.read() == b"r2!"
            finally:
                await client.aclose()
            assert server.connections == 2

    asyncio.run(main())


def test_a_connection_that_answers_more_than_was_asked_is_closed_never_reused() -> None:
    """Two answers in one write: the first is the response, whole; the connection is not pooled."""

    async def answer(n: int, writer: asyncio.StreamWriter) -> None:
        extra = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nBAD" if n == 1 else b""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n" + f"r{n}!".encode() + extra)

    async def main() -> None:
        async with Server(answer) as server:
            client = H1Client()
            try:
                for n in (1, 2):
                    resp = await client.send("GET", f"{server.url}/{n}", headers={}, body=None, timeouts=T)
                    assert resp.status == 200 and await resp.read() == f"r{n}!".encode()
            finally:
                await client.aclose()
            assert server.connections == 2

    asyncio.run(main())


# --- the fuzz: _request_head against two real parsers --------------------------------------------------------

_SKIPPED = {"host", "content-length", "transfer-encoding", "connection"}
names = st.one_of(
    st.sampled_from(["x-api-key", "anthropic-beta", "anthropic-version", "authorization", "Accept", "Host"]),
    st.text(st.characters(codec="utf-8"), min_size=0, max_size=12),
    st.text("abcxyz-_.!#$%&'*+^`|~0123456789", min_size=1, max_size=12),
)
values = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=40),
    st.text(st.sampled_from("ab \t\r\n\x00\x7f\x0b\u00e9\u20ac:,;=\"'"), max_size=20),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
)


def _httptools_parse(head: bytes) -> tuple[list[tuple[str, str]], int]:
    got: list[tuple[str, str]] = []
    done = [0]

    class Sink:
        def on_header(self, name: bytes, value: bytes) -> None:
            got.append((name.decode("latin-1").lower(), value.decode("latin-1")))

        def on_message_complete(self) -> None:
            done[0] += 1

    httptools.HttpRequestParser(Sink()).feed_data(head)
    return got, done[0]


def _h11_parse(head: bytes) -> list[tuple[str, str]]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(head)
    request = conn.next_event()
    assert isinstance(request, h11.Request)
    assert isinstance(conn.next_event(), h11.EndOfMessage)
    assert conn.next_event() is h11.NEED_DATA  # nothing after the one request
    return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in request.headers]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(names, values, max_size=6))
def test_request_head_writes_only_what_parses_back_as_given(headers: dict[str, str]) -> None:
    try:
        head = _request_head("POST", "/v1/messages", "127.0.0.1:9", headers, None)
    except UnsafeHeader:
        sent = {n: v for n, v in headers.items() if n.lower() not in _SKIPPED}
        with pytest.raises(UnsafeHeader):  # the slow path agrees: some header is not one line
            check_headers({**sent, **{n: "" for n in headers if n.lower() in _SKIPPED}})
        return
    check_headers({n: v for n, v in headers.items() if n.lower() not in _SKIPPED})  # nothing unsafe was let by
    want = [("host", "127.0.0.1:9")]
    want += [(n.lower(), v.strip(" \t")) for n, v in headers.items() if n.lower() not in _SKIPPED]
    lows = {n.lower() for n in headers}
    want += [("accept-encoding", "gzip, deflate")] * ("accept-encoding" not in lows)
    want += [("accept", "*/*")] * ("accept" not in lows)
    want += [("content-length", "0")]
    parsed, requests = _httptools_parse(head)  # llhttp keeps a value's trailing whitespace; RFC 9110 drops it
    assert requests == 1 and [(n, v.strip(" \t")) for n, v in parsed] == want
    assert _h11_parse(head) == want
