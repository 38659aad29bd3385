"""The one seam between adapters and the HTTP client that talks to providers.

Adapters call ``HttpClient.send`` and get an ``UpstreamResponse`` once the status line and headers
are in; the body is then read whole (``read``) or as it arrives (``chunks``). The client library is
the largest per-stream cost of a gateway (docs/performance-model.md §1), so it is swappable here and nowhere
else: ``AiohttpClient`` (the default; it yields one chunk per socket read, coalescing events that
arrive together) and ``HttpxClient`` (httpx's default transport, kept for comparison and for
environments that prefer it). Foreign exceptions become gateway errors at this boundary.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Protocol

import aiohttp
import httpx

from gateway.errors import UpstreamConnectionError, UpstreamTimeout

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_ERROR_BYTES",
    "AiohttpClient",
    "BodyTooLarge",
    "HttpClient",
    "HttpxClient",
    "StreamInterrupted",
    "Timeouts",
    "UpstreamResponse",
    "make_client",
]


MAX_ANSWER_BYTES = 32 * 1024 * 1024
"""The largest JSON answer read from a provider, decompressed (the API's own request limit; a message is
far smaller). A gzip that inflates past it is refused as it inflates, never held whole."""
MAX_ERROR_BYTES = 1024 * 1024
"""The largest error body read from a provider, decompressed."""


class BodyTooLarge(Exception):
    """A provider's body passed the limit ``read`` was given."""


log = logging.getLogger("gateway")


class StreamInterrupted(Exception):
    """The provider's response body broke off after it started (reset, truncated, read timeout)."""

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class Timeouts:
    __slots__ = ("aiohttp", "connect", "read")

    def __init__(self, connect: float, read: float) -> None:
        self.connect = connect
        self.read = read
        self.aiohttp: aiohttp.ClientTimeout | None = None  # built once, on first use


class UpstreamResponse(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Case-insensitive response headers."""
        ...

    def chunks(self) -> AsyncGenerator[bytes]:
        """The body as it arrives, one item per socket read; close it (``aclose``) when done early."""
        ...

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body, decompressed; ``BodyTooLarge`` as soon as it passes ``limit`` bytes."""
        ...

    def at_eof(self) -> bool:
        """Whether the body has arrived to its end and been read: going on with ``chunks`` reads nothing more
        (False when unknown)."""
        ...

    async def aclose(self) -> None:
        """Drop the connection if the body was not read to the end (a client went away)."""
        ...


class HttpClient(Protocol):
    async def send(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None, timeouts: Timeouts
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


# --- aiohttp ----------------------------------------------------------------------------------------------


class _AiohttpResponse:
    __slots__ = ("_resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def chunks(self) -> AsyncGenerator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            timeout = isinstance(exc, asyncio.TimeoutError)
            raise StreamInterrupted(_describe(exc, "upstream stream broke off"), timeout=timeout) from exc
        finally:
            self._resp.release()

    async def read(self, limit: int | None = None) -> bytes:
        resp = self._resp
        try:
            length = resp.content_length
            if limit is None or (length is not None and length <= limit and "content-encoding" not in resp.headers):
                return await resp.read()  # its size is known and within the limit: read it in one go
            body = bytearray()
            async for chunk in self._resp.content.iter_any():  # decompressed as it arrives
                body += chunk
                if len(body) > limit:
                    self._resp.close()
                    raise BodyTooLarge(f"the body passed {limit} bytes")
            return bytes(body)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            if isinstance(exc, asyncio.TimeoutError):
                raise UpstreamTimeout("timed out reading the upstream response") from exc
            raise UpstreamConnectionError(_describe(exc, "upstream response broke off")) from exc
        finally:
            self._resp.release()

    def at_eof(self) -> bool:
        return self._resp.content.at_eof()

    async def aclose(self) -> None:
        if not self._resp.content.at_eof():
            self._resp.close()
        else:
            self._resp.release()


class AiohttpClient:
    """Default upstream client: aiohttp, one pooled session per process."""

    def __init__(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            # A gateway must never carry one client's provider cookies into another client's request
            # (and skipping the jar saves a filter pass per request).
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=True,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def send(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None, timeouts: Timeouts
    ) -> UpstreamResponse:
        timeout = timeouts.aiohttp
        if timeout is None:
            timeout = timeouts.aiohttp = aiohttp.ClientTimeout(
                total=None, sock_connect=timeouts.connect, sock_read=timeouts.read
            )
        try:
            # never follow a redirect: no provider redirects a Messages call, and following one would carry the
            # provider key to whatever host it names (a 3xx becomes an upstream error in adapters.base)
            resp = await self._session.request(
                method, url, headers=headers, data=body, timeout=timeout, allow_redirects=False
            )
        except TimeoutError as exc:
            log.warning("timed out connecting to or waiting for %s", _host(url))
            raise UpstreamTimeout("timed out connecting to or waiting for the provider") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise _unreachable(url, exc) from exc
        return _AiohttpResponse(resp)

    async def aclose(self) -> None:
        await self._session.close()


# --- httpx ------------------------------------------------------------------------------------------------


class _HttpxResponse:
    __slots__ = ("_resp",)

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def chunks(self) -> AsyncGenerator[bytes]:
        try:
            async for chunk in self._resp.aiter_raw():
                yield chunk
        except httpx.TransportError as exc:
            timeout = isinstance(exc, httpx.TimeoutException)
            raise StreamInterrupted(_describe(exc, "upstream stream broke off"), timeout=timeout) from exc
        finally:
            await self._resp.aclose()

    async def read(self, limit: int | None = None) -> bytes:
        try:
            if limit is None:
                return await self._resp.aread()
            body = bytearray()
            async for chunk in self._resp.aiter_bytes():  # decoded as it arrives
                body += chunk
                if len(body) > limit:
                    raise BodyTooLarge(f"the body passed {limit} bytes")
            return bytes(body)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("timed out reading the upstream response") from exc
        except httpx.TransportError as exc:
            raise UpstreamConnectionError(_describe(exc, "upstream response broke off")) from exc
        finally:
            await self._resp.aclose()

    def at_eof(self) -> bool:
        return False  # httpx does not say without reading: the stream is drained in the background

    async def aclose(self) -> None:
        await self._resp.aclose()


class HttpxClient:
    """httpx on its default transport (httpcore + h11), or on another httpx transport."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._client = httpx.AsyncClient(
            transport=transport,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),  # keep no cookies (see above)
        )

    async def send(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None, timeouts: Timeouts
    ) -> UpstreamResponse:
        timeout = httpx.Timeout(timeouts.read, connect=timeouts.connect)
        request = self._client.build_request(method, url, headers=dict(headers), content=body, timeout=timeout)
        try:
            resp = await self._client.send(request, stream=True, follow_redirects=False)  # never (see aiohttp's)
        except httpx.TimeoutException as exc:
            log.warning("timed out connecting to or waiting for %s", _host(url))
            raise UpstreamTimeout("timed out connecting to or waiting for the provider") from exc
        except httpx.TransportError as exc:
            raise _unreachable(url, exc) from exc
        return _HttpxResponse(resp)

    async def aclose(self) -> None:
        await self._client.aclose()


def make_client(name: str = "aiohttp") -> HttpClient:
    if name == "aiohttp":
        return AiohttpClient()
    if name == "httpx":
        return HttpxClient()
    if name == "httpx-aiohttp":  # measured in docs/benchmarks.md; needs `pip install httpx-aiohttp`
        from httpx_aiohttp import AiohttpTransport  # type: ignore[import-not-found,unused-ignore]

        return HttpxClient(AiohttpTransport())
    raise ValueError(f"unknown upstream client {name!r} (aiohttp, httpx or httpx-aiohttp)")


def _unreachable(url: str, exc: BaseException) -> UpstreamConnectionError:
    """A connect failure as the client sees it: its kind, not the provider's host and port (those are logged)."""
    log.warning("cannot reach %s: %s", _host(url), _describe(exc, type(exc).__name__))
    return UpstreamConnectionError(f"cannot reach the provider ({type(exc).__name__})")


def _host(url: str) -> str:
    return url.split("/", 3)[2] if "://" in url else url


def _describe(exc: BaseException, prefix: str) -> str:
    detail = type(exc).__name__
    text = str(exc)
    return f"{prefix}: {detail}" + (f" ({text})" if text and len(text) < 200 else "")
