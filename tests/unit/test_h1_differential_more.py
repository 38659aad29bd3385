"""The rest of the differential suite (issue 37): misbehaving servers on 127.0.0.1 (and ::1), each case run through
every client behind ``gateway.wire.upstream``'s seam (h1, aiohttp, httpx) and held to aiohttp's outcome, or to a
better one this file says and tests. Where aiohttp or httpx does not reach it, the case is a strict ``xfail``
naming what the library does instead (aiohttp 3.14, httpx 0.28 with httpcore 1.0 and h11 0.16).

- framing a client cannot trust: ``Content-Length`` with ``Transfer-Encoding: chunked`` (the request-smuggling
  shape), two ``Content-Length`` values (different, or the same twice);
- bodies that end with the connection (HTTP/1.0, or HTTP/1.1 without a length), ``Connection: close`` in the
  middle of a pooled sequence, ``204`` / ``304`` with a ``Content-Length``, chunk extensions;
- an IPv6 literal URL; TLS with a certificate for another name, or from a CA nobody trusts;
- a caller cancelled mid-body; a head that is slow (past the read timeout, or within it between bytes);
- the idle-close race: a request sent on a kept-alive connection just as the server closes it."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import re
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from gateway.wire.errors import UpstreamConnectionError, UpstreamTimeout
from gateway.wire.upstream import HttpClient, Timeouts, make_client
from tests.unit.test_h1_protocol_states import (
    CLIENTS,
    Respond,
    Upstream,
    answer,
    ask,
    known_failure,
    own_answer,
)

T = Timeouts(connect=2.0, read=2.0)


@pytest.fixture(autouse=True)
def _direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every client goes straight to the servers on 127.0.0.1 / ::1 here, whatever proxy the environment names
    (h1 and httpx read ``HTTP_PROXY`` and the rest when made, aiohttp with ``trust_env`` on each request)."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)


class Server(Upstream):
    """``Upstream`` (one thread, exact bytes) on ``host`` (``::1`` too), over TLS with ``tls``; an answer that
    closes the connection (``writer.close()`` in ``respond``) ends it. ``linger``: after each answer the server
    stops reading for that long and then closes the connection without a ``Connection: close`` (an idle timer
    firing while the next request is on the wire); ``dropped`` counts the requests that had arrived by then, never
    answered."""

    def __init__(
        self,
        respond: Respond,
        *,
        host: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
        linger: float | None = None,
    ) -> None:
        super().__init__(respond)
        self.host = host
        self.tls = tls
        self.linger = linger
        self.dropped = 0
        self.peers: list[str] = []  # the client's address of each connection
        self.heads: list[bytes] = []  # each request's head

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = self._loop.create_future()
        server = await asyncio.start_server(self._handle, self.host, 0, ssl=self.tls)
        port = server.sockets[0].getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{'https' if self.tls else 'http'}://{host}:{port}"
        self._ready.set()
        await self._stop
        server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.peers.append(str(writer.get_extra_info("peername")[0]))
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client.append(number)
                    return
                self.heads.append(head)
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                if length and int(length[1]):
                    await reader.readexactly(int(length[1]))
                match = re.search(rb"(?i)x-request: *(\d+)", head)
                assert match is not None
                self.seen.append((number, int(match[1])))
                await self.respond(int(match[1]), writer)
                if writer.is_closing():  # the answer closed the connection
                    return
                await writer.drain()
                if self.linger is not None:
                    await asyncio.sleep(self.linger)  # not reading: what comes meanwhile is never answered
                    try:
                        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.001)
                        self.dropped += 1
                    except (TimeoutError, asyncio.IncompleteReadError):
                        pass
                    return
        except ConnectionError:
            self.closed_by_client.append(number)
        finally:
            writer.close()


def serve(
    respond: Respond,
    test: Callable[[Server], Coroutine[Any, Any, None]],
    *,
    host: str = "127.0.0.1",
    tls: ssl.SSLContext | None = None,
    linger: float | None = None,
) -> Server:
    """Run ``test`` (given the server, its ``url`` among the rest) on a loop of its own against a ``Server``."""
    server = Server(respond, host=host, tls=tls, linger=linger)
    with server:
        asyncio.run(test(server))
    return server


async def post(client: HttpClient, url: str, n: int, timeouts: Timeouts = T) -> bytes:
    """Request ``n`` and its whole body (the status is not checked)."""
    resp = await client.send("POST", f"{url}/v1/messages", headers={"x-request": str(n)}, body=b"{}", timeouts=timeouts)
    return await resp.read()


async def eventually(check: Callable[[], bool], seconds: float = 2.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        await asyncio.sleep(0.02)


# --- framing a client cannot trust ---------------------------------------------------------------------------

SMUGGLED = {
    # a length shorter than the chunked body: read by the length, the rest ("lo\r\n0\r\n\r\n") would start the
    # connection's next answer
    "length-first-shorter": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nX-Answer: 1\r\n"
    b"\r\n5\r\nhello\r\n0\r\n\r\n",
    # a length longer than the chunked body: read by the length, the body would swallow the response after it
    "chunked-first-longer": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 60\r\nX-Answer: 1\r\n"
    b"\r\n5\r\nhello\r\n0\r\n\r\n",
    # a transfer coding list ending in chunked: chunked still, with a length beside it
    "coding-list": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity, chunked\r\nContent-Length: 3\r\nX-Answer: 1\r\n"
    b"\r\n5\r\nhello\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("shape", list(SMUGGLED))
@pytest.mark.parametrize("name", CLIENTS)
def test_a_length_beside_chunked_is_not_trusted(name: str, shape: str, request: pytest.FixtureRequest) -> None:
    """Response splitting / request smuggling: an answer framed both by ``Content-Length`` and by
    ``Transfer-Encoding: chunked``, followed in the same write by a complete response nobody asked for (what an
    intermediary that framed it the other way would see as the next answer). RFC 9112 §6.3: the transfer coding
    wins, and such a message "ought to be handled as an error". aiohttp (llhttp, strict) refuses it; h1 (llhttp) too.
    Either way no client may hand on a body holding bytes of the response after it, nor keep the connection whose
    framing was ambiguous: the next request goes on a new connection and gets its own answer."""
    if name == "httpx" and shape != "coding-list":
        known_failure(
            request,
            "h11 frames the answer by Transfer-Encoding alone (body 'hello', as RFC 9112 allows) but keeps the "
            "connection whose framing was ambiguous: the next request on it gets the smuggled response ('answer to "
            "99')",
        )

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(SMUGGLED[shape] + answer(99) if n == 1 else answer(n))

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            try:
                body = await post(client, server.url, 1)
            except UpstreamConnectionError:
                pass  # refused: the reference's outcome
            else:
                assert body == b"hello"  # the transfer coding's framing, nothing of the next response
            own_answer(await ask(client, server.url, 2), 2)
            own_answer(await ask(client, server.url, 3), 3)
        finally:
            await client.aclose()

    server = serve(respond, test)
    assert server.seen == [(1, 1), (2, 2), (2, 3)]  # the ambiguous connection retired, the new one kept


@pytest.mark.parametrize("name", CLIENTS)
def test_h1_refuses_a_length_beside_chunked_as_aiohttp_does(name: str) -> None:
    """What each client makes of the ambiguous framing itself: h1 refuses it as aiohttp does (an error that says
    the answer was not valid HTTP/1.1); httpx reads it by its transfer coding (RFC 9112 §6.3's other option)."""
    data = SMUGGLED["length-first-shorter"]

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(data if n == 1 else answer(n))

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            if name == "httpx":
                assert await post(client, server.url, 1) == b"hello"
            else:
                with pytest.raises(UpstreamConnectionError, match=r"not valid HTTP/1\.1"):
                    await post(client, server.url, 1)
        finally:
            await client.aclose()

    serve(respond, test)


DUPLICATE_LENGTHS = {
    "two-headers": b"Content-Length: 5\r\nContent-Length: 7\r\n",
    "two-headers-longer-first": b"Content-Length: 7\r\nContent-Length: 5\r\n",
    "one-list": b"Content-Length: 5, 7\r\n",
}


@pytest.mark.parametrize("lengths", list(DUPLICATE_LENGTHS))
@pytest.mark.parametrize("name", CLIENTS)
def test_two_different_content_lengths_are_an_error(name: str, lengths: str) -> None:
    """A buggy proxy that adds its own ``Content-Length`` beside the origin's (or a smuggling attempt): which of
    5 and 7 is meant cannot be known (RFC 9112 §6.3: an unrecoverable error). No client reads ``hello`` short or
    ``helloHT`` long (two bytes of the response that follows): each fails the request with
    ``UpstreamConnectionError``, and the next request goes on a new connection and gets its own answer."""
    head = b"HTTP/1.1 200 OK\r\n" + DUPLICATE_LENGTHS[lengths] + b"X-Answer: 1\r\n\r\n"

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(head + b"hello" + answer(99) if n == 1 else answer(n))

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            with pytest.raises(UpstreamConnectionError):
                await post(client, server.url, 1)
            own_answer(await ask(client, server.url, 2), 2)
        finally:
            await client.aclose()

    server = serve(respond, test)
    assert server.seen == [(1, 1), (2, 2)]


SAME_LENGTHS = {"two-headers": b"Content-Length: 5\r\nContent-Length: 5\r\n", "one-list": b"Content-Length: 5, 5\r\n"}
SAME_LENGTH_OUTCOME = {"h1": "refused", "aiohttp": "refused", "httpx": "read"}
"""RFC 9110 §8.6 lets a recipient take identical values as one, or refuse them: aiohttp (llhttp) refuses, h1 as
aiohttp, h11 reads the body."""


@pytest.mark.parametrize("lengths", list(SAME_LENGTHS))
@pytest.mark.parametrize("name", CLIENTS)
def test_the_same_content_length_twice_is_read_or_refused_never_misread(name: str, lengths: str) -> None:
    """The same value twice (a proxy that repeats the origin's header, or folds it into a list): either the body
    is exactly ``hello`` or the request fails with ``UpstreamConnectionError`` (each client always the same way,
    h1 as aiohttp); the next request gets its own answer, on a new connection after a refusal."""
    head = b"HTTP/1.1 200 OK\r\n" + SAME_LENGTHS[lengths] + b"X-Answer: 1\r\n\r\n"

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(head + b"hello" if n == 1 else answer(n))

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            if SAME_LENGTH_OUTCOME[name] == "read":
                assert await post(client, server.url, 1) == b"hello"
            else:
                with pytest.raises(UpstreamConnectionError):
                    await post(client, server.url, 1)
            own_answer(await ask(client, server.url, 2), 2)
        finally:
            await client.aclose()

    server = serve(respond, test)
    assert server.seen == ([(1, 1), (1, 2)] if SAME_LENGTH_OUTCOME[name] == "read" else [(1, 1), (2, 2)])


# --- bodies that end with the connection, Connection: close ---------------------------------------------------

UNTIL_CLOSE = {
    "http-1.0": b"HTTP/1.0 200 OK\r\nX-Answer: 1\r\n\r\n",
    "http-1.1-no-length": b"HTTP/1.1 200 OK\r\nX-Answer: 1\r\n\r\n",
}


@pytest.mark.parametrize("version", list(UNTIL_CLOSE))
@pytest.mark.parametrize("name", CLIENTS)
def test_a_body_that_ends_with_the_connection_is_read_whole(name: str, version: str) -> None:
    """An old server (or a CGI behind one) answers ``HTTP/1.0`` without ``Content-Length`` and without keep-alive,
    or ``HTTP/1.1`` with neither a length nor chunks: the body ends when the server closes (RFC 9112 §6.3, 8). It
    comes in two writes 50 ms apart; it is read whole, and the next request opens a new connection."""

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        if n != 1:
            writer.write(answer(n))
            return
        writer.write(UNTIL_CLOSE[version] + b"answer ")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"to 1")
        writer.close()

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            own_answer(await ask(client, server.url, 1), 1)
            own_answer(await ask(client, server.url, 2), 2)
            own_answer(await ask(client, server.url, 3), 3)
        finally:
            await client.aclose()

    server = serve(respond, test)
    assert server.seen == [(1, 1), (2, 2), (2, 3)]


@pytest.mark.parametrize("name", CLIENTS)
def test_an_http_1_0_answer_without_keep_alive_is_not_reused(name: str) -> None:
    """An ``HTTP/1.0`` answer with a ``Content-Length`` but no ``Connection: keep-alive``: the server will close
    (RFC 9112 §9.3), but has not yet. The connection is not reused even though it is still open: the next request
    goes on a new one (were it reused, this server would answer it on the first, which the test would see)."""

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(n).replace(b"HTTP/1.1", b"HTTP/1.0", 1) if n == 1 else answer(n))

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            own_answer(await ask(client, server.url, 1), 1)
            own_answer(await ask(client, server.url, 2), 2)
        finally:
            await client.aclose()

    server = serve(respond, test)
    assert server.seen == [(1, 1), (2, 2)]


@pytest.mark.parametrize("closes", [True, False], ids=["server-closes", "server-lingers"])
@pytest.mark.parametrize("name", CLIENTS)
def test_connection_close_in_a_pooled_sequence(name: str, closes: bool) -> None:
    """A provider's server drains (a deploy, its max requests per connection): request 2 of a pooled sequence is
    answered with ``Connection: close``, and the server closes the connection, or leaves it open a while (it would
    answer on it: the test would see it). Requests 1 and 2 share a connection; 3 and 4 share a new one, each with
    its own answer."""

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        if n != 2:
            writer.write(answer(n))
            return
        writer.write(answer(n).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1))
        if closes:
            writer.close()

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            for n in (1, 2, 3, 4):
                own_answer(await ask(client, server.url, n), n)
        finally:
            await client.aclose()

    server = serve(respond, test)
    assert server.seen == [(1, 1), (1, 2), (2, 3), (2, 4)]


# --- answers without a body, chunk extensions ----------------------------------------------------------------

NO_BODY = {
    "204": b"HTTP/1.1 204 No Content\r\nContent-Length: 11\r\nX-Answer: 1\r\n\r\n",
    "304": b'HTTP/1.1 304 Not Modified\r\nContent-Length: 11\r\nETag: "v1"\r\nX-Answer: 1\r\n\r\n',
}


@pytest.mark.parametrize("status", list(NO_BODY))
@pytest.mark.parametrize("name", CLIENTS)
def test_204_and_304_have_no_body_whatever_their_content_length(name: str, status: str) -> None:
    """A ``204`` (a DELETE's answer) or ``304`` (a conditional GET's) with the ``Content-Length`` the body would
    have had (servers send it wrongly): neither has a body (RFC 9110 §6.4.1). ``read()`` returns ``b""`` at once,
    not after the 3 s read timeout, and the next request on the same connection gets its own answer."""
    timeouts = Timeouts(connect=2.0, read=3.0)
    expected = int(status)

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(NO_BODY[status] if n == 1 else answer(n))

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            started = time.monotonic()
            resp = await client.send(
                "GET",
                f"{server.url}/x",
                headers={"x-request": "1", "if-none-match": '"v1"'},
                body=None,
                timeouts=timeouts,
            )
            assert (resp.status, await resp.read()) == (expected, b"")
            assert time.monotonic() - started < 1.0
            own_answer(await ask(client, server.url, 2), 2)
        finally:
            await client.aclose()

    server = serve(respond, test)
    assert server.seen == [(1, 1), (1, 2)]


EXTENDED_CHUNKS = {
    "token": b"5;name=value\r\nhello\r\n0\r\n\r\n",
    "quoted": b'3;name="a;b=c"\r\nhel\r\n2;x;y=1\r\nlo\r\n0;last=yes\r\n\r\n',
}


@pytest.mark.parametrize("ext", list(EXTENDED_CHUNKS))
@pytest.mark.parametrize("name", CLIENTS)
def test_chunk_extensions_are_skipped(name: str, ext: str) -> None:
    """Chunk extensions (RFC 9112 §7.1.1: ``5;name=value``, quoted values, on the last chunk too), which some
    servers and proxies send and no client must take for data: the body is ``hello``, the connection is kept."""

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Answer: 1\r\n\r\n"
        writer.write(head + EXTENDED_CHUNKS[ext] if n == 1 else answer(n))

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            assert await post(client, server.url, 1) == b"hello"
            own_answer(await ask(client, server.url, 2), 2)
        finally:
            await client.aclose()

    server = serve(respond, test)
    assert server.seen == [(1, 1), (1, 2)]


# --- IPv6 --------------------------------------------------------------------------------------------------


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
@pytest.mark.parametrize("name", CLIENTS)
def test_an_ipv6_literal_url(name: str) -> None:
    """A provider endpoint given as an IPv6 literal (``http://[::1]:port/``, a private endpoint in an IPv6-only
    cluster): the client connects to ``::1``, sends a ``Host`` with the brackets, and pools the connection."""

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(n))

    async def test(server: Server) -> None:
        assert server.url.startswith("http://[::1]:")
        client = make_client(name)
        try:
            own_answer(await ask(client, server.url, 1), 1)
            own_answer(await ask(client, server.url, 2), 2)
        finally:
            await client.aclose()

    server = serve(respond, test, host="::1")
    assert server.seen == [(1, 1), (1, 2)]
    assert server.peers == ["::1"]
    port = server.url.rsplit(":", 1)[1]
    assert all(f"host: [::1]:{port}\r\n".encode() in head.lower() for head in server.heads)


# --- TLS ---------------------------------------------------------------------------------------------------


def _pem(tmp_path: Path, stem: str, cert: object, key: object) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert isinstance(cert, x509.Certificate) and isinstance(key, ec.EllipticCurvePrivateKey)
    cert_pem, key_pem = tmp_path / f"{stem}.pem", tmp_path / f"{stem}.key"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_pem, key_pem


def _tls(tmp_path: Path, *, names: list[str]) -> tuple[ssl.SSLContext, Path]:
    """A CA (in a file of its own: trusted by nobody unless a test says so) and a server context whose leaf
    certificate, issued by it, is for ``names`` (IP addresses or DNS names)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "differential test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem, _ = _pem(tmp_path, "ca", ca, ca_key)
    leaf_pem, leaf_key = _pem(tmp_path, "leaf", leaf, key)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(leaf_pem, leaf_key)
    return server, ca_pem


def _trust(monkeypatch: pytest.MonkeyPatch, ca_pem: Path) -> None:
    """Each client's default verification trusts ``ca_pem`` (instead of the system's bundle file) for this test:
    ``SSL_CERT_FILE`` is read by OpenSSL when h1 builds its context, and by httpx when its client is made;
    aiohttp built its context when imported, so its module's verified context is replaced by one built now."""
    import aiohttp.connector

    monkeypatch.setenv("SSL_CERT_FILE", str(ca_pem))
    monkeypatch.setattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", aiohttp.connector._make_ssl_context(True))


TLS_CASES = {
    "right-name": (["127.0.0.1"], True),  # the control: the CA trusted, the name right, the request served
    "wrong-name": (["provider.invalid", "127.0.0.2"], True),  # the CA trusted, the name another's
    "unknown-ca": (["127.0.0.1"], False),  # the name right, the CA in no trust store
}


@pytest.mark.parametrize("case", list(TLS_CASES))
@pytest.mark.parametrize("name", CLIENTS)
def test_tls_with_a_wrong_name_or_an_unknown_ca_fails_at_once(
    name: str, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider endpoint misconfigured (a certificate for another host: a shared load balancer, a DNS entry
    pointing elsewhere) or intercepted (a CA the machine does not trust: a proxy, a man in the middle): the client
    refuses the connection, ``UpstreamConnectionError`` within a second — not a hang, never an answer. With the CA
    trusted and the right name (the control) the request is served, so the failures are the name's and the CA's."""
    names, trusted = TLS_CASES[case]
    server_ctx, ca_pem = _tls(tmp_path, names=names)
    if trusted:
        _trust(monkeypatch, ca_pem)

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(n))

    async def test(server: Server) -> None:
        assert server.url.startswith("https://127.0.0.1:")
        client = make_client(name)
        try:
            started = time.monotonic()
            if case == "right-name":
                own_answer(await ask(client, server.url, 1), 1)
            else:
                with pytest.raises(UpstreamConnectionError):
                    await ask(client, server.url, 1)
            assert time.monotonic() - started < 1.0
        finally:
            await client.aclose()

    server = serve(respond, test, tls=server_ctx)
    assert server.seen == ([(1, 1)] if case == "right-name" else [])


# --- cancellation mid-body ---------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["read", "chunks"])
@pytest.mark.parametrize("name", CLIENTS)
def test_a_caller_cancelled_mid_body_retires_the_connection(name: str, how: str) -> None:
    """The gateway's client goes away (its task is cancelled) while a streamed answer is still trickling in
    (chunked, a chunk every 50 ms, for seconds), during ``read()`` or ``async for ... in chunks()``: the
    cancellation propagates as such, the connection is closed (the server sees it), and the next request goes on
    a new connection and gets exactly its own answer — not a byte of the abandoned stream."""

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        if n != 1:
            writer.write(answer(n))
            return
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Answer: 1\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        for _ in range(100):  # 5 s: until the client goes away
            await asyncio.sleep(0.05)
            writer.write(b"6\r\nstream\r\n")
            await writer.drain()

    async def test(server: Server) -> None:
        client = make_client(name)
        got: list[bytes] = []
        try:
            resp = await client.send("POST", f"{server.url}/x", headers={"x-request": "1"}, body=b"{}", timeouts=T)

            async def consume() -> None:
                if how == "read":
                    got.append(await resp.read())
                    return
                async for chunk in resp.chunks():
                    got.append(chunk)

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.3)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            if how == "chunks":
                assert b"".join(got).startswith(b"firststream")
            await resp.aclose()  # what the caller's cleanup does anyway: nothing more to do
            own_answer(await ask(client, server.url, 2), 2)  # at once: the stream is still coming on the first
            own_answer(await ask(client, server.url, 3), 3)
            await eventually(lambda: 1 in server.closed_by_client)  # the abandoned connection was closed
        finally:
            await client.aclose()

    server = serve(respond, test)
    assert server.seen == [(1, 1), (2, 2), (2, 3)]


# --- a slow head -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CLIENTS)
def test_a_head_stalled_past_the_read_timeout_times_out(name: str) -> None:
    """A provider that sends its status line and then stalls (an overloaded backend behind a proxy that flushed
    early) for 2 s, past the 0.5 s read timeout: ``UpstreamTimeout`` for every client, at about the read timeout,
    not when the head completes."""
    timeouts = Timeouts(connect=2.0, read=0.5)

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        await writer.drain()
        await asyncio.sleep(2.0)
        writer.write(b"Content-Length: 2\r\n\r\n{}")

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            started = time.monotonic()
            with pytest.raises(UpstreamTimeout):
                await post(client, server.url, 1, timeouts)
            assert 0.4 < time.monotonic() - started < 1.5
        finally:
            await client.aclose()

    serve(respond, test)


@pytest.mark.parametrize("name", CLIENTS)
def test_a_slow_head_within_the_read_timeout_between_bytes_succeeds(name: str) -> None:
    """A head that dribbles in (a header line every 0.2 s for 2 s: a slow proxy, a congested link) with a 1 s read
    timeout: the timeout is the silence between bytes, not a deadline for the head, so a healthy exchange that
    outlives the read timeout twice is read whole."""
    timeouts = Timeouts(connect=2.0, read=1.0)

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(10):
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.write(b"X-Slow-%d: %d\r\n" % (i, i))
        writer.write(b"X-Answer: %d\r\nContent-Length: 11\r\n\r\nanswer to %d" % (n, n))

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            started = time.monotonic()
            resp = await client.send(
                "POST", f"{server.url}/x", headers={"x-request": "1"}, body=b"{}", timeouts=timeouts
            )
            assert resp.headers.get("x-slow-9") == "9"
            assert await resp.read() == b"answer to 1"
            assert time.monotonic() - started > 1.9
        finally:
            await client.aclose()

    serve(respond, test)


# --- the idle-close race -----------------------------------------------------------------------------------

ROUNDS = 20
LINGER = 0.05
RACE_FAILS = {
    "aiohttp": (
        "aiohttp sends the POST on the pooled connection the server is closing and, the request not being "
        "idempotent, does not send it again: ServerDisconnectedError (UpstreamConnectionError) in the rounds whose "
        "request reached the server before its close (about half)"
    ),
    "httpx": (
        "httpcore checks the pooled socket before reuse but cannot see a close that comes after the request was "
        "sent, and does not send it again: RemoteProtocolError 'Server disconnected without sending a response' "
        "(UpstreamConnectionError) in the rounds whose request reached the server before its close (about half)"
    ),
}


@pytest.mark.parametrize("name", CLIENTS)
def test_the_idle_close_race(name: str, request: pytest.FixtureRequest) -> None:
    """A keep-alive connection the server closes 50 ms after answering, without ``Connection: close`` (a load
    balancer's idle timeout firing while the gateway's next request is on the wire). Over 20 rounds, the next
    request is sent 30 to 70 ms after the answer: before the close it reaches a server that never answers it (the
    request is dropped, zero bytes come back), after it the client may see the close before sending. A request sent
    on a connection the peer closed with not one byte answered is sent once more on a new connection (RFC 9112
    §9.3.1: it cannot have been processed): h1 sees no failure. aiohttp and httpx fail about half the rounds (the
    project's earlier measurement, 40 rounds: h1 0, aiohttp 31, httpx 21); they are strict xfails on "no failure"."""
    if name in RACE_FAILS:
        known_failure(request, RACE_FAILS[name])

    async def respond(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(n))

    failures: list[str] = []

    async def test(server: Server) -> None:
        client = make_client(name)
        try:
            for i in range(ROUNDS):
                first, second = 2 * i + 1, 2 * i + 2
                own_answer(await ask(client, server.url, first), first)  # on a new connection: the last one closed
                await asyncio.sleep(LINGER - 0.02 + 0.04 * i / (ROUNDS - 1))
                try:
                    own_answer(await ask(client, server.url, second), second)
                except UpstreamConnectionError as exc:
                    failures.append(str(exc))
                await asyncio.sleep(LINGER + 0.03)  # the connection closed and seen closed: the next round starts fresh
        finally:
            await client.aclose()

    server = serve(respond, test, linger=LINGER)
    assert server.dropped >= 3  # the race was run: requests reached a server that closed without answering them
    assert failures == []
