"""The minimal HTTP/1.1 upstream client (``gateway.wire.upstream.H1Client``) against real servers on 127.0.0.1
(asyncio servers written here, byte by byte): keep-alive reuse, chunked and length-delimited and
close-delimited bodies, gzip inflated with a limit, the read timeout, a reset mid-body, a stale pooled
connection, TLS verified against a CA (and refused without it)."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gateway.wire.errors import UpstreamConnectionError, UpstreamTimeout
from gateway.wire.upstream import BodyTooLarge, H1Client, StreamInterrupted, Timeouts

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
T = Timeouts(connect=2.0, read=1.0)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    return head + (await reader.readexactly(length) if length else b"")


def serve(handler: Handler, test: Callable[[str], Awaitable[None]], ssl_ctx: ssl.SSLContext | None = None) -> None:
    async def main() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ssl_ctx)
        port = server.sockets[0].getsockname()[1]
        try:
            await test(f"{'https' if ssl_ctx else 'http'}://127.0.0.1:{port}")
        finally:
            server.close()

    asyncio.run(main())


def test_keep_alive_is_reused_and_bodies_of_every_framing_are_read() -> None:
    connections: list[int] = []
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Thing: A\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
        b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
    ]
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                seen.append(await read_request(reader))
                writer.write(answers[len(seen) - 1])
                await writer.drain()
        except (asyncio.IncompleteReadError, IndexError):
            writer.close()

    async def test(url: str) -> None:
        client = H1Client()
        first = await client.send(
            "POST", f"{url}/v1/messages?beta=true", headers={"x-api-key": "k"}, body=b"{}", timeouts=T
        )
        assert (first.status, first.headers["x-thing"], first.headers.get("X-THING")) == (200, "A", "A")
        assert await first.read() == b"hello"
        second = await client.send("POST", f"{url}/x", headers={}, body=b"[1]", timeouts=T)
        assert b"".join([c async for c in second.chunks()]) == b"abcdefg" and second.at_eof()
        third = await client.send("GET", f"{url}/y", headers={}, body=None, timeouts=T)
        assert third.status == 201 and await third.read() == b""
        await client.aclose()

    serve(handler, test)
    assert len(connections) == 1  # one connection for the three
    assert seen[0].startswith(b"POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"x-api-key: k\r\n" in seen[0] and seen[0].endswith(b"Content-Length: 2\r\n\r\n{}")


def test_gzip_is_inflated_and_a_bomb_refused_as_it_inflates() -> None:
    small, bomb = gzip.compress(b'{"ok":true}'), gzip.compress(b"0" * 5_000_000)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        body = bomb if b"/bomb" in request else small
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    async def test(url: str) -> None:
        client = H1Client()
        ok = await client.send("POST", f"{url}/ok", headers={}, body=b"", timeouts=T)
        assert await ok.read(1000) == b'{"ok":true}'
        big = await client.send("POST", f"{url}/bomb", headers={}, body=b"", timeouts=T)
        with pytest.raises(BodyTooLarge):
            await big.read(1_000_000)
        await client.aclose()

    serve(handler, test)


def test_a_silent_provider_times_out_and_a_reset_mid_body_is_an_interrupted_stream() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        if b"/silent" in request:
            await asyncio.sleep(3)
        elif b"/stall" in request:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
            await writer.drain()
            await asyncio.sleep(3)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
            await writer.drain()
            writer.transport.abort()

    async def test(url: str) -> None:
        client = H1Client()
        quick = Timeouts(connect=1.0, read=0.3)
        with pytest.raises(UpstreamTimeout):
            await client.send("POST", f"{url}/silent", headers={}, body=b"", timeouts=quick)
        stalled = await client.send("POST", f"{url}/stall", headers={}, body=b"", timeouts=quick)
        with pytest.raises(StreamInterrupted) as info:
            async for _ in stalled.chunks():
                pass
        assert info.value.timeout
        cut = await client.send("POST", f"{url}/cut", headers={}, body=b"", timeouts=quick)
        with pytest.raises(StreamInterrupted) as info:
            async for _ in cut.chunks():
                pass
        assert not info.value.timeout
        await client.aclose()

    serve(handler, test)


def test_a_body_that_ends_with_the_connection_and_a_stale_pooled_connection() -> None:
    count = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        request = await read_request(reader)
        if b"/close" in request:
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # the keep-alive connection is closed by the server after each answer

    async def test(url: str) -> None:
        client = H1Client()
        ended = await client.send("POST", f"{url}/close", headers={}, body=b"", timeouts=T)
        assert await ended.read() == b"until the end"
        first = await client.send("POST", f"{url}/a", headers={}, body=b"", timeouts=T)
        assert await first.read() == b"ok"  # pooled, then closed by the server
        await asyncio.sleep(0.1)
        again = await client.send("POST", f"{url}/b", headers={}, body=b"", timeouts=T)
        assert await again.read() == b"ok"
        await client.aclose()

    serve(handler, test)
    assert count == 3


def test_nobody_listening_is_a_connection_error() -> None:
    async def go() -> None:
        client = H1Client()
        with pytest.raises(UpstreamConnectionError):
            await client.send("POST", "http://127.0.0.1:1/v1/messages", headers={}, body=b"", timeouts=T)
        await client.aclose()

    asyncio.run(go())


def _certificates(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem, key_pem = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_pem, key_pem)
    client = ssl.create_default_context(cafile=str(cert_pem))
    return server, client


def test_tls_is_verified_against_the_trust_store(tmp_path: Path) -> None:
    server_ctx, client_ctx = _certificates(tmp_path)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecure")
            await writer.drain()
        except (ssl.SSLError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def test(url: str) -> None:
        trusted = H1Client(client_ctx)
        ok = await trusted.send("POST", f"{url}/v1/messages", headers={}, body=b"{}", timeouts=T)
        assert await ok.read() == b"secure"
        await trusted.aclose()
        system = H1Client()  # the system's trust store does not know this certificate
        with pytest.raises(UpstreamConnectionError):
            await system.send("POST", f"{url}/v1/messages", headers={}, body=b"{}", timeouts=T)
        await system.aclose()

    serve(handler, test, server_ctx)


def test_the_read_timeout_is_the_silence_since_the_last_read() -> None:
    """One timer per response: bytes that keep coming keep the response alive past the timeout, and the
    silence after the last of them is measured from it."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(6):  # 0.9 s of reads, each 0.15 s after the last: one and a half read timeouts
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.15)
        await asyncio.sleep(3)

    async def test(url: str) -> None:
        client = H1Client()
        loop = asyncio.get_running_loop()
        timeouts = Timeouts(connect=1.0, read=0.6)
        response = await client.send("POST", f"{url}/trickle", headers={}, body=b"", timeouts=timeouts)
        got = b""
        last = loop.time()
        with pytest.raises(StreamInterrupted) as info:
            async for chunk in response.chunks():
                got += chunk
                last = loop.time()
        silence = loop.time() - last
        assert info.value.timeout
        assert got == b"x" * 6  # nothing cut while bytes came
        assert 0.58 <= silence < 0.6 + 0.15 + 0.5  # the last read's silence (it came 0.15 s before the sleep)
        await client.aclose()

    serve(handler, test)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/v1/messages",
        "https://api.anthropic.com/v1/messages?beta=true",
        "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-sonnet-4-6/invoke-with-response-stream",
        "http://[::1]:9000",
        "https://user@Example.COM/p",
    ],
)
def test_a_url_is_parsed_once_into_what_urlsplit_gives(url: str) -> None:
    from urllib.parse import urlsplit

    from gateway.wire import upstream

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    want = (
        (parts.scheme, parts.hostname or "", port),
        (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
    )
    first = upstream.parsed_url(url)
    assert (first[0], first[1], first[2]) == (*want, parts.netloc)
    assert upstream.parsed_url(url) is first  # remembered


def test_the_parsed_urls_are_bounded_and_a_bad_one_raises_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.wire import upstream

    monkeypatch.setattr(upstream, "_PARSED", {})
    monkeypatch.setattr(upstream, "_MAX_PARSED", 3)
    for n in range(7):
        upstream.parsed_url(f"http://h{n}/")
        assert len(upstream._PARSED) <= 3
    for _ in range(2):
        with pytest.raises(ValueError):
            upstream.parsed_url("http://h:99999/")
    assert "http://h:99999/" not in upstream._PARSED


def test_the_response_headers_are_case_insensitive_and_their_items_the_stored_ones() -> None:
    from gateway.wire.upstream import _H1Headers

    headers = _H1Headers({"request-id": "req_1", "content-type": "text/event-stream"})
    assert headers["Request-Id"] == "req_1" and "CONTENT-TYPE" in headers and headers.get("X", "d") == "d"
    assert list(headers.items()) == [("request-id", "req_1"), ("content-type", "text/event-stream")]
    assert dict(headers) == dict(headers.items()) and len(headers) == 2
