"""The upstream HTTP client seam: cookies never cross requests; both clients speak the same protocol."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from gateway.errors import UpstreamConnectionError
from gateway.upstream import StreamInterrupted, Timeouts, make_client


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
