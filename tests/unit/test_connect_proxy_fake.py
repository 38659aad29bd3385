"""The forward-proxy fake (``tests.fakes.connect_proxy.ConnectProxy``) against real clients, no mocks: aiohttp,
httpx and urllib through it to origins on 127.0.0.1 (plain HTTP forwarded in absolute-form, HTTPS tunnelled by
CONNECT with a self-signed certificate the client trusts), Basic proxy authentication (407 without), and its
refusals (403 for a refused port, 502 for an unreachable origin, 431 for a huge head, 408 for a slow one)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import httpx
import pytest
from aiohttp import web

from tests.fakes.connect_proxy import ConnectProxy

Seen = list[dict[str, str]]


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await coro()

    asyncio.run(main())


@asynccontextmanager
async def _origin(ssl_ctx: ssl.SSLContext | None = None) -> AsyncIterator[tuple[str, Seen]]:
    """An aiohttp.web origin: ``/echo`` answers the body with Content-Length, ``/chunked`` in chunks; what each
    request's headers were is recorded."""
    seen: Seen = []

    async def echo(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        body = await request.read()
        return web.Response(body=b"echo:" + body, headers={"X-Path": request.path_qs})

    async def chunked(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b"one,", b"two,", b"three"):
            await resp.write(part)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/chunked", chunked)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"{'https' if ssl_ctx else 'http'}://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def _certificates(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1: (server context, client context trusting it)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
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


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# -- aiohttp -------------------------------------------------------------------------------------------------------


def test_aiohttp_plain_http_is_forwarded_in_origin_form_with_via() -> None:
    async def go() -> None:
        async with ConnectProxy() as proxy, _origin() as (origin, seen), aiohttp.ClientSession() as session:
            async with session.post(f"{origin}/echo?x=1", data=b"hello", proxy=proxy.url) as resp:
                assert resp.status == 200
                assert await resp.read() == b"echo:hello"
                assert resp.headers["X-Path"] == "/echo?x=1"  # origin-form reached the origin
                assert resp.headers["Via"] == "1.1 connect-proxy"
                assert resp.headers["Connection"] == "close"
            async with session.get(f"{origin}/chunked", proxy=proxy.url) as resp:
                assert resp.status == 200
                assert resp.headers["Transfer-Encoding"] == "chunked"
                assert await resp.read() == b"one,two,three"
            assert proxy.requests == [("POST", f"{origin}/echo?x=1"), ("GET", f"{origin}/chunked")]
            assert proxy.connects == []
            assert seen[0]["Via"] == "1.1 connect-proxy"
            assert seen[0]["Host"] == origin.removeprefix("http://")
            assert "Proxy-Connection" not in seen[0] and "Proxy-Authorization" not in seen[0]

    _run(go)


def test_aiohttp_https_goes_through_a_connect_tunnel(tmp_path: Path) -> None:
    server_ctx, client_ctx = _certificates(tmp_path)

    async def go() -> None:
        async with (
            ConnectProxy() as proxy,
            _origin(server_ctx) as (origin, _),
            aiohttp.ClientSession() as session,
        ):
            async with session.post(f"{origin}/echo", data=b"secret", proxy=proxy.url, ssl=client_ctx) as resp:
                assert resp.status == 200
                assert await resp.read() == b"echo:secret"
                assert "Via" not in resp.headers  # end-to-end TLS: the proxy cannot touch the answer
            assert proxy.connects == [f"127.0.0.1:{_port(origin)}"]
            assert proxy.requests == []

    _run(go)


# -- httpx ---------------------------------------------------------------------------------------------------------


def test_httpx_plain_http_and_https_through_the_proxy(tmp_path: Path) -> None:
    server_ctx, client_ctx = _certificates(tmp_path)

    async def go() -> None:
        async with ConnectProxy() as proxy, _origin() as (plain, _), _origin(server_ctx) as (secure, _):
            async with httpx.AsyncClient(proxy=proxy.url, verify=client_ctx, trust_env=False) as client:
                resp = await client.post(f"{plain}/echo", content=b"abc")
                assert (resp.status_code, resp.content) == (200, b"echo:abc")
                resp = await client.get(f"{plain}/chunked")
                assert (resp.status_code, resp.content) == (200, b"one,two,three")
                resp = await client.post(f"{secure}/echo", content=b"xyz")
                assert (resp.status_code, resp.content) == (200, b"echo:xyz")
            assert proxy.requests == [("POST", f"{plain}/echo"), ("GET", f"{plain}/chunked")]
            assert proxy.connects == [f"127.0.0.1:{_port(secure)}"]

    _run(go)


# -- Basic proxy authentication ------------------------------------------------------------------------------------


def test_proxy_authentication_is_required_and_accepted(tmp_path: Path) -> None:
    server_ctx, client_ctx = _certificates(tmp_path)

    async def go() -> None:
        async with (
            ConnectProxy(auth=("user", "pass")) as proxy,
            _origin() as (plain, seen),
            _origin(server_ctx) as (secure, _),
            aiohttp.ClientSession() as session,
        ):
            async with session.get(f"{plain}/echo", proxy=proxy.url) as resp:
                assert resp.status == 407
                assert resp.headers["Proxy-Authenticate"] == 'Basic realm="proxy"'
            with pytest.raises(aiohttp.ClientHttpProxyError) as refused:
                await session.get(f"{secure}/echo", proxy=proxy.url, ssl=client_ctx)
            assert refused.value.status == 407
            wrong = f"http://user:nope@127.0.0.1:{proxy.port}"
            async with session.get(f"{plain}/echo", proxy=wrong) as resp:
                assert resp.status == 407
            assert proxy.auth_failures == 3
            assert proxy.requests == [] and proxy.connects == [] and seen == []

            with_auth = f"http://user:pass@127.0.0.1:{proxy.port}"
            assert with_auth == proxy.url_with_auth("user", "pass")
            async with session.post(f"{plain}/echo", data=b"in", proxy=with_auth) as resp:
                assert (resp.status, await resp.read()) == (200, b"echo:in")
            assert "Proxy-Authorization" not in seen[0]  # consumed by the proxy, not forwarded
            async with session.post(f"{secure}/echo", data=b"tls", proxy=with_auth, ssl=client_ctx) as resp:
                assert (resp.status, await resp.read()) == (200, b"echo:tls")

            async with httpx.AsyncClient(proxy=proxy.url, verify=client_ctx, trust_env=False) as client:
                assert (await client.get(f"{plain}/echo")).status_code == 407
                with pytest.raises(httpx.ProxyError):
                    await client.get(f"{secure}/echo")
            async with httpx.AsyncClient(proxy=with_auth, verify=client_ctx, trust_env=False) as client:
                assert (await client.get(f"{plain}/echo")).content == b"echo:"
                assert (await client.get(f"{secure}/echo")).content == b"echo:"

            assert proxy.auth_failures == 5
            assert proxy.requests == [("POST", f"{plain}/echo"), ("GET", f"{plain}/echo")]
            assert proxy.connects == [f"127.0.0.1:{_port(secure)}"] * 2
            assert {status for _, status in proxy.refused} == {407}

    _run(go)


# -- urllib, with the proxy on its own thread (a synchronous client) -------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Via")))
        body = b"plain origin"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def threaded_origin() -> Iterator[str]:
    _Handler.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.parametrize("auth", [None, ("user", "pass")])
def test_urllib_honours_http_proxy_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, threaded_origin: str, auth: tuple[str, str] | None
) -> None:
    for name in ("NO_PROXY", "no_proxy", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with ConnectProxy(auth=auth) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url_with_auth(*auth) if auth else proxy.url)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler())  # reads *_PROXY, as boto does
        with opener.open(f"{threaded_origin}/path?q=1", timeout=10) as resp:
            assert resp.status == 200
            assert resp.read() == b"plain origin"
        assert proxy.requests == [("GET", f"{threaded_origin}/path?q=1")]
        assert _Handler.seen == [("/path?q=1", "1.1 connect-proxy")]
        if auth:
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            no_credentials = urllib.request.build_opener(urllib.request.ProxyHandler())
            with pytest.raises(urllib.error.HTTPError) as refused:
                no_credentials.open(f"{threaded_origin}/again", timeout=10)
            assert refused.value.code == 407
            refused.value.close()
            assert proxy.auth_failures == 1


# -- refusals, on the wire -----------------------------------------------------------------------------------------


def _exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` to the proxy and read its answer until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_refusals_answer_and_close() -> None:
    closed = _free_port()
    with ConnectProxy(refuse_ports={25}, head_timeout_s=0.3) as proxy:
        answer = _exchange(proxy.port, b"CONNECT 127.0.0.1:25 HTTP/1.1\r\nHost: 127.0.0.1:25\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
        answer = _exchange(proxy.port, f"CONNECT 127.0.0.1:{closed} HTTP/1.1\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
        answer = _exchange(proxy.port, b"CONNECT no-such-host.invalid:443 HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
        answer = _exchange(proxy.port, f"GET http://127.0.0.1:{closed}/ HTTP/1.1\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
        answer = _exchange(proxy.port, b"GET /not-absolute HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        answer = _exchange(proxy.port, b"GET https://127.0.0.1/ HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 501 Not Implemented\r\n")
        answer = _exchange(proxy.port, b"GET http://127.0.0.1/ HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
        assert b"Connection: close\r\n" in answer
        answer = _exchange(proxy.port, b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n")  # never finished
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert _exchange(proxy.port, b"") == b""  # an idle connection is just closed
        assert [status for _, status in proxy.refused] == [403, 502, 502, 502, 400, 501, 431, 408]
        assert proxy.connects == [] and proxy.requests == []
        proxy.reset()
        assert proxy.refused == []


def test_expect_continue_and_a_chunked_request_body_are_relayed() -> None:
    async def go() -> None:
        async with ConnectProxy() as proxy, _origin() as (origin, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(
                f"POST {origin}/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                "Expect: 100-continue\r\n\r\n".encode()
            )
            await writer.drain()
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert answer.endswith(b"\r\n\r\necho:abcde")

    _run(go)


def test_a_client_that_goes_away_drops_the_origin_connection() -> None:
    async def go() -> None:
        origin_got_request, origin_saw_eof = asyncio.Event(), asyncio.Event()

        async def slow_origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            origin_got_request.set()
            await reader.read()  # no answer: wait until the proxy lets go
            origin_saw_eof.set()
            writer.close()

        server = await asyncio.start_server(slow_origin, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, ConnectProxy() as proxy:
            _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(f"GET http://127.0.0.1:{port}/slow HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            await writer.drain()
            await asyncio.wait_for(origin_got_request.wait(), 10)
            writer.close()
            await asyncio.wait_for(origin_saw_eof.wait(), 10)

    _run(go)


def test_a_tunnel_relays_both_ways_and_passes_a_half_close_on() -> None:
    async def go() -> None:
        async def echo_origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            data = await reader.read()  # until the client's half-close
            writer.write(b"got:" + data)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo_origin, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, ConnectProxy() as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            # the bytes after the head arrive before the proxy has answered: they belong to the tunnel
            writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\nearly,".encode())
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200 Connection established\r\n")
            writer.write(b"late")
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 10) == b"got:early,late"
            writer.close()
            assert proxy.connects == [f"127.0.0.1:{port}"]

    _run(go)
