"""The upstream HTTP client seam: cookies never cross requests; both clients speak the same protocol."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from gateway.wire.errors import UpstreamConnectionError
from gateway.wire.upstream import StreamInterrupted, Timeouts, make_client


async def _serve(handler: web.RequestHandler) -> tuple[web.AppRunner, str]:  # type: ignore[type-arg]
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("name", ["aiohttp", "httpx"])
def test_no_cookie_jar_and_streaming_reads(name: str) -> None:
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("cookie"))
        if request.path == "/cut":
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(b"partial")
            assert request.transport is not None
            request.transport.abort()
            return resp
        response = web.Response(body=b"event: ping\ndata: {}\n\n")
        response.set_cookie("session", "client-a-secret")
        return response

    async def run() -> None:
        runner, url = await _serve(handler)
        client = make_client(name)
        timeouts = Timeouts(5, 5)
        try:
            for _ in range(2):
                resp = await client.send("POST", url + "/x", headers={}, body=b"{}", timeouts=timeouts)
                assert resp.status == 200
                assert b"".join([c async for c in resp.chunks()]) == b"event: ping\ndata: {}\n\n"
            resp = await client.send("POST", url + "/cut", headers={}, body=b"{}", timeouts=timeouts)
            with pytest.raises(StreamInterrupted):
                async for _ in resp.chunks():
                    pass
            await resp.aclose()
            await runner.cleanup()
            with pytest.raises(UpstreamConnectionError):
                await client.send("POST", url + "/x", headers={}, body=b"{}", timeouts=timeouts)
        finally:
            await client.aclose()

    asyncio.run(run())
    assert seen[:2] == [None, None]  # the cookie the first answer set is not sent back


def test_at_eof_says_whether_the_body_has_all_arrived() -> None:
    """aiohttp: False while the provider still owes bytes, True once the body is read to its end, and a
    response closed there gives its connection back to the pool; httpx cannot tell, so always False."""
    peers: list[object] = []
    release: list[asyncio.Event] = []  # one per run: an Event belongs to its loop

    async def handler(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"event: ping\ndata: {}\n\n")
        if request.path == "/slow":
            await release[-1].wait()
        return resp

    async def run(name: str) -> None:
        runner, url = await _serve(handler)
        client = make_client(name)
        timeouts = Timeouts(5, 5)
        try:
            release.append(asyncio.Event())
            resp = await client.send("POST", url + "/slow", headers={}, body=b"{}", timeouts=timeouts)
            chunks = resp.chunks()
            assert await anext(chunks) == b"event: ping\ndata: {}\n\n"
            assert not resp.at_eof()
            release[-1].set()
            assert [c async for c in chunks] == []
            assert resp.at_eof() is (name == "aiohttp")
            await resp.aclose()
            resp = await client.send("POST", url + "/x", headers={}, body=b"{}", timeouts=timeouts)
            assert b"".join([c async for c in resp.chunks()]) == b"event: ping\ndata: {}\n\n"
            await resp.aclose()
            assert peers[-1] == peers[-2]  # one pooled connection for both
        finally:
            await client.aclose()
            await runner.cleanup()

    for name in ("aiohttp", "httpx"):
        asyncio.run(run(name))
