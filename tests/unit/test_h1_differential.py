"""More of the differential suite (issue 37): misbehaving servers on 127.0.0.1, each case run through every client
behind ``gateway.wire.upstream``'s seam (h1, aiohttp, httpx) with the same expected outcome.

- back-pressure: 3 MiB at once, then a trickle, while the gateway's own client is stalled for longer than the read
  timeout — the silence is the gateway's (it stopped reading), not the provider's: the body is read whole;
- ``HEAD`` answered with a ``Content-Length``: the answer has no body (RFC 9110 §9.3.2), it does not wait for one,
  and the connection serves the next request;
- ``Content-Encoding: deflate`` zlib-wrapped (RFC 9110) and raw (as many servers send it): both decoded;
- an answer that is not HTTP/1.1: an error that says so, never "cannot reach the provider" (it was reached)."""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest

from gateway.wire.errors import UpstreamConnectionError
from gateway.wire.upstream import Timeouts, make_client
from tests.unit.test_h1_protocol_states import CLIENTS, exchange

BURST = 3 * 1024 * 1024
TRICKLE = 10


@pytest.mark.parametrize("name", CLIENTS)
def test_a_stalled_reader_does_not_time_the_provider_out(name: str) -> None:
    """The read timeout (0.5 s here) measures the provider's silence; while the gateway's client holds more than the
    high-water mark unread it stops reading, and that pause (1.5 s here) is not the provider's."""
    timeouts = Timeouts(connect=2.0, read=0.5)

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (BURST + TRICKLE))
        writer.write(b"b" * BURST)
        await writer.drain()  # returns once the client reads again (after its stall)
        for _ in range(TRICKLE):
            await asyncio.sleep(0.1)
            writer.write(b"t")
            await writer.drain()

    async def test(url: str) -> None:
        client = make_client(name)
        try:
            resp = await client.send("POST", f"{url}/x", headers={"x-request": "1"}, body=b"{}", timeouts=timeouts)
            chunks = resp.chunks()
            got = len(await anext(chunks))
            await asyncio.sleep(1.5)  # the gateway's client is slow: nothing is read for three read timeouts
            async for chunk in chunks:
                got += len(chunk)
            assert got == BURST + TRICKLE
        finally:
            await client.aclose()

    exchange(respond, test)


@pytest.mark.parametrize("name", CLIENTS)
def test_a_head_answer_with_a_content_length_has_no_body(name: str) -> None:
    timeouts = Timeouts(connect=2.0, read=3.0)

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        if n == 1:  # the HEAD: a length, no body
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nX-Answer: 1\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-Answer: 2\r\n\r\nanswer to 2")

    async def test(url: str) -> None:
        client = make_client(name)
        try:
            started = time.monotonic()
            resp = await client.send("HEAD", f"{url}/x", headers={"x-request": "1"}, body=None, timeouts=timeouts)
            assert (resp.status, await resp.read()) == (200, b"")
            assert time.monotonic() - started < 1.0  # not the read timeout's 3 s
            resp = await client.send("POST", f"{url}/x", headers={"x-request": "2"}, body=b"{}", timeouts=timeouts)
            assert await resp.read() == b"answer to 2"
        finally:
            await client.aclose()

    upstream = exchange(respond, test)
    assert [n for _, n in upstream.seen] == [1, 2]


TEXT = b"the answer, compressed " * 200


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize("body", [zlib.compress(TEXT), _raw_deflate(TEXT)], ids=["zlib-wrapped", "raw"])
@pytest.mark.parametrize("name", CLIENTS)
def test_deflate_is_decoded_wrapped_or_raw(name: str, body: bytes) -> None:
    timeouts = Timeouts(connect=2.0, read=2.0)

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )

    async def test(url: str) -> None:
        client = make_client(name)
        try:
            resp = await client.send("POST", f"{url}/x", headers={"x-request": "1"}, body=b"{}", timeouts=timeouts)
            assert await resp.read() == TEXT
            resp = await client.send("POST", f"{url}/x", headers={"x-request": "2"}, body=b"{}", timeouts=timeouts)
            assert b"".join([chunk async for chunk in resp.chunks()]) == TEXT
        finally:
            await client.aclose()

    exchange(respond, test)


@pytest.mark.parametrize("name", ["h1", "aiohttp"])
def test_an_answer_that_is_not_http_says_so(name: str) -> None:
    """(httpx's h11 reports a garbled answer and a provider that closed before answering as the same
    ``RemoteProtocolError``: it keeps "cannot reach", the two being indistinguishable there.)"""
    timeouts = Timeouts(connect=2.0, read=2.0)

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}")

    async def test(url: str) -> None:
        client = make_client(name)
        try:
            with pytest.raises(UpstreamConnectionError) as caught:
                await client.send("POST", f"{url}/x", headers={"x-request": "1"}, body=b"{}", timeouts=timeouts)
            assert "not valid HTTP/1.1" in str(caught.value) and "cannot reach" not in str(caught.value)
        finally:
            await client.aclose()

    upstream = exchange(respond, test)
    assert len(upstream.seen) == 1  # reached once, not sent again
